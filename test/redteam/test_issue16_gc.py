"""Red team, issue 16: retention. gc deletes: what may it be made to delete?

A real OVERLORD_HOME is built with real sessions (committed, rolled back, pending, an
imported record); gc runs as the CLI. What must never go is snapshotted before and compared
after; what lies outside OVERLORD_HOME (reached by a symlink someone put in the store) must
stay too.
"""
import fcntl
import hashlib
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SESSION_RE, Ovl, state_of, tree

ALL = ("--keep-days", "0", "--keep-last", "0")


def snap(root, skip=()):
    """{rel: (mode, mtime_ns, sha256 | link)} of everything under root."""
    out = {}
    for base, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(base, n)
            rel = os.path.relpath(p, root)
            if any(rel == s or rel.startswith(s + "/") for s in skip):
                continue
            st = os.lstat(p)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[rel] = (st.st_mode, st.st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
            else:
                out[rel] = (st.st_mode, None, None)
    return out


def commit_one(ovl, target, script):
    sid, _ = ovl.sh(target, script)
    ovl("commit", sid, check=0)
    return sid


@pytest.fixture
def busy(ovl, target, tmp_path):
    """A home with a committed, a rolled-back and a pending session, a cost ledger, a bundle
    key, a resolver config, a webhook config, a memory note and the audit chain."""
    c = commit_one(ovl, target, "echo one > hello.txt")
    c2 = commit_one(ovl, target, "echo two >> hello.txt")
    r, _ = ovl.sh(target, "echo r > r.txt")
    ovl("rollback", r, check=0)
    p, _ = ovl.sh(target, "echo p > p.txt")
    ovl("cost", "set-price", "m-x", "--input", "1", "--output", "2", check=0)
    ovl("bundle", "key", check=0)
    ovl("webhooks", "add", "h", "https://example.com/hook", check=0)
    res = tmp_path / "res.sh"
    res.write_text("#!/bin/sh\necho v\n")
    res.chmod(0o755)
    ovl("secrets", "set-command", f"{res} {{name}}", check=0)
    return {"committed": [c, c2], "rolled": r, "pending": p}


NEVER = ("audit.jsonl", "ledger.jsonl", "cost.json", "bundle.key", "secrets.json",
         "webhooks.json", "keys.json", "policy.json")


def test_gc_everything_spares_what_it_must(ovl, target, busy):
    home = ovl.home
    keep = {n: snap(home)[n] for n in NEVER if (home / n).exists()}
    pend = snap(home / "sessions" / busy["pending"])
    before_tree = tree(target)
    blame = ovl("blame", target / "hello.txt", "--json", check=0).out
    ovl("gc", *ALL, check=0)
    now = snap(home)
    for n, v in keep.items():
        if n == "audit.jsonl":
            assert open(home / n, "rb").read().startswith(b"")      # appended to, not cut
            continue
        assert now.get(n) == v, n
    assert snap(home / "sessions" / busy["pending"]) == pend
    assert state_of(ovl, busy["pending"]) == "pending"
    assert tree(target) == before_tree
    # the pending session still diffs and commits
    assert ovl.diff(busy["pending"]) == [("added", "p.txt")]
    ovl("commit", busy["pending"], check=0)
    assert (target / "p.txt").read_text() == "p\n"


def test_audit_log_only_grows(ovl, target, busy):
    before = open(ovl.home / "audit.jsonl", "rb").read()
    ovl("gc", *ALL, check=0)
    after = open(ovl.home / "audit.jsonl", "rb").read()
    assert after.startswith(before) and b'"gc.run"' in after[len(before):]
    ovl("audit", "verify", check=0)


def test_dry_run_changes_nothing(ovl, target, busy):
    before = snap(ovl.home)
    proc = ovl("gc", "--dry-run", *ALL, "--json", check=0)
    assert json.loads(proc.out)
    assert snap(ovl.home) == before


def test_blame_of_a_kept_session_survives_gc(ovl, target, busy):
    """keep-last 1: the newest commit stays, so blame of the file it wrote still rebuilds
    (the objects it names are kept even though the older session went)."""
    c, c2 = busy["committed"]
    ovl("gc", "--keep-days", "0", "--keep-last", "1", check=0)
    assert state_of(ovl, c) is None and state_of(ovl, c2) == "committed"
    lines = json.loads(ovl("blame", target / "hello.txt", "--json", check=0).out)["lines"]
    owners = [ln["owner"] for ln in lines]
    assert any(isinstance(o, dict) and o.get("sid") == c2 for o in owners), owners
    assert "unknown" not in owners, owners
    ovl("revert", c2, "--stack", check=0)


def test_a_held_session_is_kept(ovl, target, busy):
    """A hold (what a bundle import takes) keeps its sid while its flock lives."""
    c, _ = busy["committed"]
    code = ("import sys, time; from overlord.trust.retention import holding\n"
            "with holding([sys.argv[1]], 'red team'):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, c], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=ovl.env())
    try:
        assert holder.stdout.readline() == b"held\n"
        ovl("gc", *ALL, check=0)
        assert state_of(ovl, c) == "committed"
    finally:
        holder.stdin.close()
        holder.wait(10)
    ovl("gc", *ALL, check=0)
    assert state_of(ovl, c) is None


def test_a_lock_someone_holds_is_kept(ovl, target, busy, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    code = ("import sys; from overlord.txn.locks import TargetLock\n"
            "with TargetLock(sys.argv[1]):\n"
            "    print('locked', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(other)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=ovl.env())
    try:
        assert holder.stdout.readline() == b"locked\n"
        locks = set(os.listdir(ovl.home / "locks"))
        ovl("gc", *ALL, check=0)
        from overlord.txn import locks as L
        mine = os.path.basename(L._lock_path(str(other)))
        assert mine in locks and mine in os.listdir(ovl.home / "locks")
    finally:
        holder.stdin.close()
        holder.wait(10)


def test_imported_record_keeps_its_objects_and_blame(tmp_path, backend, target):
    a, b = Ovl(tmp_path / "A", backend), Ovl(tmp_path / "B", backend)
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    sid = commit_one(a, target, "echo imported line > hello.txt")
    a("export", sid, "-o", tmp_path / "x.ovl", check=0)
    b("import", tmp_path / "x.ovl", check=0)
    before = b("blame", target / "hello.txt", "--json", check=0).out
    b("gc", check=0)                                 # defaults: the import is young, kept
    assert b("blame", target / "hello.txt", "--json", check=0).out == before
    assert sid in before


def test_a_symlinked_session_dir_is_unlinked_not_followed(ovl, target, busy, tmp_path):
    """sessions/<sid> -> a directory outside (someone who can write sessions/ put it there):
    gc removes the link, never what it points at."""
    outside = tmp_path / "outside-session"
    outside.mkdir()
    fake = "20200101-000000-abcdef"
    (outside / "meta.json").write_text(json.dumps({"sid": fake, "state": "committed",
                                                   "target": str(target), "committed": 1.0,
                                                   "layers": []}))
    (outside / "precious.txt").write_text("not OVERLORD's\n")
    os.symlink(outside, ovl.home / "sessions" / fake)
    ovl("gc", *ALL)
    assert (outside / "precious.txt").read_text() == "not OVERLORD's\n"
    assert (outside / "meta.json").exists()


def _plant(ovl, tmp_path, sub, names):
    """objects/<sub> (or locks, objects/tmp, objects/packs) made a symlink to a directory
    outside OVERLORD_HOME holding files with names gc would prune."""
    outside = tmp_path / ("outside-" + sub.replace("/", "-"))
    outside.mkdir()
    for n in names:
        (outside / n).write_text("a file outside OVERLORD_HOME\n")
    dest = ovl.home / sub
    if dest.is_dir() and not dest.is_symlink():
        for n in os.listdir(dest):                  # keep what was there (move it out of the way)
            os.rename(dest / n, tmp_path / f"moved-{sub.replace('/', '-')}-{n}")
        dest.rmdir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, dest)
    return outside


def test_gc_deletes_nothing_through_a_symlinked_objects_dir(ovl, target, busy, tmp_path):
    name = "ee" * 31
    outside = _plant(ovl, tmp_path, "objects/ee", [name])
    ovl("gc", *ALL)
    assert (outside / name).exists(), "gc deleted a file outside OVERLORD_HOME"


def test_gc_deletes_nothing_through_a_symlinked_locks_dir(ovl, target, busy, tmp_path):
    name = "ab" * 12 + ".lock"
    outside = _plant(ovl, tmp_path, "locks", [name])
    ovl("gc", *ALL)
    assert (outside / name).exists(), "gc deleted a file outside OVERLORD_HOME"


def test_gc_deletes_nothing_through_a_symlinked_packs_dir(ovl, target, busy, tmp_path):
    name = "20200101-000000-abcdef.pack"
    outside = _plant(ovl, tmp_path, "objects/packs", [name])
    ovl("gc", *ALL)
    assert (outside / name).exists(), "gc deleted a file outside OVERLORD_HOME"
