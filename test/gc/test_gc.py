"""`overlord gc`: the keep rules, what it must never touch, blame and revert after a prune, the
leftovers it clears (index-less packs, stale locks and holds, an interrupted prune), dry runs,
the audit line, bad input and JSON.

Sessions are made for real through the CLI (run, commit, rollback). Their age is set by
`age()`, which rewrites the close times in meta.json (created, finished, committed,
rolled_back) to DAYS ago: the record as if it had finished then. Nothing else of the record
changes, so blame, revert and the references gc counts are the real ones.
"""
import fcntl
import hashlib
import json
import os
import time

import pytest

from conftest import Ovl

DAY = 86400


@pytest.fixture
def ovl(home):
    return Ovl(home)                # the default backend: gc works on records, not on mounts


@pytest.fixture
def t(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / "a.txt").write_text("one\n")
    return d


def age(home, sid, days):
    """Make session sid look as if it finished `days` ago (see the module docstring)."""
    path = home / "sessions" / sid / "meta.json"
    meta = json.loads(path.read_text())
    when = time.time() - days * DAY
    for k in ("created", "finished", "committed", "rolled_back"):
        if k in meta:
            meta[k] = when
    path.write_text(json.dumps(meta))


def meta(home, sid):
    return json.loads((home / "sessions" / sid / "meta.json").read_text())


def set_meta(home, sid, **fields):
    m = meta(home, sid)
    m.update(fields)
    (home / "sessions" / sid / "meta.json").write_text(json.dumps(m))


def committed(ovl, t, script):
    sid, _ = ovl.sh(t, script)
    ovl("commit", sid, check=0)
    return sid


def rolled_back(ovl, t, script):
    sid, _ = ovl.sh(t, script)
    ovl("rollback", sid, check=0)
    return sid


def gc(ovl, *flags, check=0):
    proc = ovl("gc", "--json", *flags, check=check)
    return json.loads(proc.out) if check == 0 else proc


def sids(report):
    return sorted(s["sid"] for s in report["sessions"])


def snapshot(home):
    """{path: (bytes sha256, mode, mtime_ns)} of everything under OVERLORD_HOME."""
    out = {}
    for base, dirs, files in os.walk(home):
        for n in dirs + files:
            p = os.path.join(base, n)
            st = os.lstat(p)
            digest = None
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, home)] = (digest, st.st_mode, st.st_mtime_ns)
    return out


def audit_lines(home):
    p = home / "audit.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


# -- bad input first ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [("--keep-days", "-1"), ("--keep-days", "x"),
                                   ("--keep-days", "1.5"), ("--keep-last", "-2"),
                                   ("--keep-days", ""), ("--keep-last", "ten"),
                                   ("--keep-days", "٣")])
def test_bad_keep_values_are_a_usage_error_changing_nothing(ovl, home, t, flags):
    sid = committed(ovl, t, "echo two > a.txt")
    age(home, sid, 400)
    before = snapshot(home)
    proc = ovl("gc", *flags, "--keep-last", "0") if flags[0] == "--keep-days" else \
        ovl("gc", "--keep-days", "0", *flags)
    assert proc.returncode == 2, (proc.out, proc.err)
    assert proc.out == ""
    lines = proc.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err
    assert snapshot(home) == before


def test_ops_gc_refuses_bad_values_before_reading(home):
    from overlord import ops
    from overlord.errors import UsageError
    for kw in ({"keep_days": -1}, {"keep_last": -1}, {"keep_days": 1.5}, {"keep_days": True},
               {"keep_last": "3"[:0] + "x"}):
        with pytest.raises(UsageError):
            ops.gc(dry_run=True, **kw)


# -- keep rules ----------------------------------------------------------------------------------

def test_keep_days_and_keep_last(ovl, home, t):
    c1 = committed(ovl, t, "echo two > a.txt")
    c2 = committed(ovl, t, "echo three > a.txt")
    c3 = committed(ovl, t, "echo four > a.txt")
    rb = rolled_back(ovl, t, "echo nope > a.txt")
    un, _ = ovl.sh(t, "true")                       # changed nothing: unchanged
    assert meta(home, un)["state"] == "unchanged"
    for sid, days in ((c1, 40), (c2, 35), (c3, 1), (rb, 50), (un, 31)):
        age(home, sid, days)
    r = gc(ovl, "--dry-run", "--keep-last", "0")
    assert sids(r) == sorted([c1, c2, rb, un])                 # keep-days 30 by default
    assert {s["sid"]: s["state"] for s in r["sessions"]} == {
        c1: "committed", c2: "committed", rb: "rolled-back", un: "unchanged"}
    assert all(s["bytes"] > 0 and s["age_days"] > 30 for s in r["sessions"])
    assert sids(gc(ovl, "--dry-run", "--keep-last", "2")) == sorted([c1, rb, un])  # c2, c3 newest
    assert sids(gc(ovl, "--dry-run", "--keep-last", "0", "--keep-days", "36")) == sorted([c1, rb])
    assert sids(gc(ovl, "--dry-run", "--keep-last", "0", "--keep-days", "0")) == \
        sorted([c1, c2, c3, rb, un])
    assert sids(gc(ovl, "--dry-run")) == sorted([rb, un])       # keep-last 10 by default
    r = gc(ovl, "--keep-last", "1")
    assert sids(r) == sorted([c1, c2, rb, un])
    left = sorted(os.listdir(home / "sessions"))
    assert left == [c3]
    assert f"{c3}  committed" in ovl("sessions", check=0).out


def test_age_is_measured_from_when_the_record_finished(ovl, home, t):
    sid = committed(ovl, t, "echo two > a.txt")
    age(home, sid, 40)
    set_meta(home, sid, committed=time.time() - 2 * DAY)      # created long ago, finished lately
    assert sids(gc(ovl, "--dry-run", "--keep-last", "0")) == []
    # a record with no close time at all: the newest mtime in its directory (just now)
    m = meta(home, sid)
    for k in ("created", "finished", "committed", "rolled_back"):
        m.pop(k, None)
    (home / "sessions" / sid / "meta.json").write_text(json.dumps(m))
    assert sids(gc(ovl, "--dry-run", "--keep-last", "0")) == []
    old = time.time() - 60 * DAY
    for base, dirs, files in os.walk(home / "sessions" / sid):
        for n in files + dirs + ["."]:
            os.utime(os.path.join(base, n), (old, old))
    assert sids(gc(ovl, "--dry-run", "--keep-last", "0")) == [sid]


def test_an_imported_record_ages_from_its_import(ovl, home, t):
    sid = committed(ovl, t, "echo two > a.txt")
    age(home, sid, 90)
    set_meta(home, sid, state="imported", imported={"at": time.time() - DAY, "from": "elsewhere"})
    assert sids(gc(ovl, "--dry-run", "--keep-days", "7", "--keep-last", "0")) == []
    set_meta(home, sid, imported={"at": time.time() - 8 * DAY, "from": "elsewhere"})
    r = gc(ovl, "--dry-run", "--keep-days", "7", "--keep-last", "0")
    assert [(s["sid"], s["state"]) for s in r["sessions"]] == [(sid, "imported")]


# -- never ----------------------------------------------------------------------------------------

def test_never_pending_running_held_audit_ledger_or_keys(ovl, home, t, tmp_path):
    from overlord.trust import retention
    timed = committed(ovl, t, "echo two > a.txt")        # made 'running' below
    held = committed(ovl, t, "echo three > a.txt")
    old = committed(ovl, t, "echo four > a.txt")
    pending, _ = ovl.sh(t, "echo wip > b.txt")
    for sid in (pending, timed, held, old):
        age(home, sid, 400)
    set_meta(home, timed, state="running")
    (home / "ledger.jsonl").write_text('{"sid": "%s", "usd": 1.0}\n' % old)
    (home / "bundle.key").write_text("ab" * 32 + "\n")
    keep = {n: (home / n).read_bytes() for n in ("ledger.jsonl", "bundle.key", "audit.key")}
    audit_before = (home / "audit.jsonl").read_bytes()
    with retention.holding([held], reason="test"):
        r = gc(ovl, "--dry-run", "--keep-days", "0", "--keep-last", "0")
        assert sids(r) == [old]
        assert r["kept"].get("held") == 1 and r["kept"].get("open") == 2
        assert r["objects_deferred"]                 # a live hold: no object is pruned
        assert r["objects"] == [] and r["packs"] == []
        r = gc(ovl, "--keep-days", "0", "--keep-last", "0")
        assert sids(r) == [old]
    assert sorted(os.listdir(home / "sessions")) == sorted([pending, timed, held])
    assert ovl("diff", pending, check=0).out.strip()
    for n, data in keep.items():
        assert (home / n).read_bytes() == data
    assert (home / "audit.jsonl").read_bytes().startswith(audit_before)
    ovl("audit", "verify", check=0)
    # the hold is gone with its block: now the held session may go too
    assert sids(gc(ovl, "--dry-run", "--keep-days", "0", "--keep-last", "0")) == [held]


def test_a_timed_out_session_goes_but_a_fork_or_revert_source_of_an_open_one_stays(ovl, home, t):
    a = committed(ovl, t, "echo two > a.txt")
    b = committed(ovl, t, "echo three > a.txt")
    rev = ovl("revert", b, check=0).out
    rsid = next(s for s in os.listdir(home / "sessions") if s not in (a, b))
    assert meta(home, rsid)["reverts"] == b and "pending" in meta(home, rsid)["state"], rev
    for sid in (a, b, rsid):
        age(home, sid, 100)
    r = gc(ovl, "--dry-run", "--keep-days", "0", "--keep-last", "0")
    assert sids(r) == [a]
    assert r["kept"].get("named by an open session") == 1
    set_meta(home, rsid, state="timed-out")        # reviewable, but finished: it may go
    r = gc(ovl, "--dry-run", "--keep-days", "0", "--keep-last", "0")
    assert sids(r) == sorted([a, b, rsid])


def test_a_session_with_a_commit_journal_stays(ovl, home, t):
    # every CLI command settles journals first (ops.recover), so this is the plan's own rule,
    # for a journal written between that and the plan: read in process
    from overlord.trust import retention
    sid = committed(ovl, t, "echo two > a.txt")
    age(home, sid, 100)
    (home / "journal").mkdir(exist_ok=True)
    (home / "journal" / f"{sid}.json").write_text("{}")
    p = retention.plan(keep_days=0, keep_last=0)
    assert p.sessions == [] and p.kept.get("commit journal") == 1
    os.unlink(home / "journal" / f"{sid}.json")
    assert [s["sid"] for s in retention.plan(keep_days=0, keep_last=0).sessions] == [sid]


# -- objects, blame and revert ----------------------------------------------------------------------

def packs(home):
    d = home / "objects" / "packs"
    return sorted(os.listdir(d)) if d.exists() else []


def loose(home):
    root = home / "objects"
    return sorted(d + n for d in os.listdir(root) if len(d) == 2
                  for n in os.listdir(root / d))


def test_objects_a_kept_session_names_stay_and_blame_and_revert_still_work(ovl, home, t):
    a = committed(ovl, t, "printf 'one\\ntwo\\n' > a.txt; echo same > s.txt")
    b = committed(ovl, t, "echo three >> a.txt; echo same > s2.txt")
    age(home, a, 100)
    blame_before = ovl("blame", t / "a.txt", check=0).out
    assert b in blame_before and a in blame_before
    assert f"{a}.pack" in packs(home) and f"{a}.idx" in packs(home)
    r = gc(ovl, "--keep-days", "30", "--keep-last", "0")
    assert sids(r) == [a]
    # b's record names a's "after" of a.txt (its "before"), kept in a's pack: the pack stays
    assert f"{a}.pack" in packs(home) and f"{a}.idx" in packs(home)
    out = ovl("blame", t / "a.txt", check=0).out.splitlines()
    assert [line.split()[0] for line in out] == ["origin", "origin", b]   # a's lines: before
    assert out[-1].rstrip().endswith("three")
    # revert still has the bytes b replaced
    ovl("revert", b, check=0)
    rsid = next(s for s in os.listdir(home / "sessions") if s not in (a, b))
    ovl("commit", rsid, check=0)
    assert (t / "a.txt").read_text() == "one\ntwo\n"
    assert not (t / "s2.txt").exists()
    # once nothing kept names them, a's pack and the loose versions go
    for sid in (b, rsid):
        age(home, sid, 100)
    r = gc(ovl, "--keep-days", "30", "--keep-last", "0")
    assert sids(r) == sorted([b, rsid])
    assert packs(home) == [] and loose(home) == []
    assert r["counts"]["packs"] >= 1 and r["bytes"]["packs"] > 0


def test_a_pack_stays_while_any_object_in_its_index_is_named(ovl, home, t):
    a = committed(ovl, t, "echo x1 > x.txt; echo y1 > y.txt")
    b = committed(ovl, t, "echo x2 > x.txt")          # names x1 (its before) only
    age(home, a, 100)
    r = gc(ovl, "--keep-days", "30", "--keep-last", "0")
    assert sids(r) == [a] and r["packs"] == []
    assert f"{a}.pack" in packs(home)
    from overlord.txn import objects
    idx = json.loads((home / "objects" / "packs" / f"{a}.idx").read_text())
    x1 = hashlib.sha256(b"x1\n").hexdigest()
    assert x1 in idx and objects.read(x1) == b"x1\n"
    assert b in ovl("blame", t / "x.txt", check=0).out


def test_index_less_packs_go_unless_their_session_is_open(ovl, home, t):
    a = committed(ovl, t, "echo two > a.txt")
    pend, _ = ovl.sh(t, "echo wip > b.txt")
    d = home / "objects" / "packs"
    (d / "20200101-000000-abcdef.pack").write_bytes(b"torn")        # no session, no index
    (d / f"{pend}.pack").write_bytes(b"a commit in progress")       # its session is open
    (d / "20200101-000000-fedcba.pack").write_bytes(b"x")           # a crash in finish()
    (d / "20200101-000000-fedcba.idx.tmp").write_bytes(b"{")
    r = gc(ovl, "--dry-run")
    assert sorted((k["name"], k["why"]) for k in r["packs"]) == [
        ("20200101-000000-abcdef", "no index"), ("20200101-000000-fedcba", "no index")]
    gc(ovl)
    assert packs(home) == sorted([f"{a}.idx", f"{a}.pack", f"{pend}.pack"])


# -- locks, holds, temp files, an interrupted prune -------------------------------------------------

def test_stale_locks_go_a_held_one_and_a_kept_targets_stay(ovl, home, t):
    a = committed(ovl, t, "echo two > a.txt")
    locks = home / "locks"
    mine = sorted(n for n in os.listdir(locks) if n.endswith(".lock"))
    stale, held = "0" * 24 + ".lock", "1" * 24 + ".lock"
    for n in (stale, held, "memory.lock"):
        (locks / n).write_bytes(b"")
    fd = os.open(locks / held, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = gc(ovl, "--dry-run")
        assert [k["name"] for k in r["locks"]] == [stale]
        r = gc(ovl)
        assert [k["name"] for k in r["locks"]] == [stale]
        assert not (locks / stale).exists()
        assert (locks / held).exists() and (locks / "memory.lock").exists()
        assert all((locks / n).exists() for n in mine)         # a's target is still known
    finally:
        os.close(fd)
    age(home, a, 100)
    r = gc(ovl, "--keep-last", "0")
    assert sids(r) == [a]
    # the held lock, now free, and a's target's lock (no session on it remains) go
    assert sorted(k["name"] for k in r["locks"]) == sorted(
        [held] + [n for n in mine if n != "gc.lock"])


def test_stale_holds_go_live_ones_stay(ovl, home, t):
    from overlord.trust import retention
    (home / "holds").mkdir(mode=0o700)
    (home / "holds" / "dead.json").write_text('{"pid": 1, "sids": [], "reason": "x"}')
    with retention.holding([], reason="live") as path:
        r = gc(ovl, "--dry-run")
        assert [h["name"] for h in r["holds"]] == ["dead.json"]
        gc(ovl)
        assert os.path.exists(path)
        assert not (home / "holds" / "dead.json").exists()
    assert os.listdir(home / "holds") == []


def test_an_interrupted_prune_is_put_back_then_finished(ovl, home, t):
    a = committed(ovl, t, "echo two > a.txt")
    b = committed(ovl, t, "echo three > a.txt")
    age(home, a, 100)
    # as a crash would leave it: a's record renamed out of sight, b's objects set aside
    os.rename(home / "sessions" / a, home / "sessions" / f".gc-{a}")
    trash = home / "objects" / ".gc-trash"
    trash.mkdir()
    for n in packs(home):
        if n.startswith(b):
            os.rename(home / "objects" / "packs" / n, trash / f"pack-{n}")
    moved = loose(home)
    for sha in moved:
        os.rename(home / "objects" / sha[:2] / sha[2:], trash / sha)
    r = gc(ovl, "--dry-run")
    assert any(".gc-trash" in n for n in r["notes"])
    assert [(s["sid"], s["state"]) for s in r["sessions"]] == [(a, "removing")]
    r = gc(ovl)
    assert not trash.exists() and not (home / "sessions" / f".gc-{a}").exists()
    assert f"{b}.pack" in packs(home) and f"{b}.idx" in packs(home)
    assert set(loose(home)) >= {s for s in moved
                                if s in json.dumps(json.loads(
                                    (home / "sessions" / b / "committed.json").read_text()))}
    assert b in ovl("blame", t / "a.txt", check=0).out


def test_temp_files_of_dead_processes_go(ovl, home, t):
    committed(ovl, t, "echo two > a.txt")
    tmp = home / "objects" / "tmp"
    tmp.mkdir(exist_ok=True)
    (tmp / "999999999-20200101-000000-abcdef-1").write_bytes(b"half")
    (tmp / f"{os.getpid()}-20200101-000000-abcdef-2").write_bytes(b"alive")
    r = gc(ovl)
    assert [f["name"] for f in r["tmp"]] == ["tmp/999999999-20200101-000000-abcdef-1"]
    assert os.listdir(tmp) == [f"{os.getpid()}-20200101-000000-abcdef-2"]


# -- dry run, audit, JSON, text ----------------------------------------------------------------------

def test_a_dry_run_changes_nothing_and_lists_exactly_what_a_run_removes(ovl, home, t):
    a = committed(ovl, t, "printf 'one\\ntwo\\n' > a.txt; echo n > n.txt")
    b = rolled_back(ovl, t, "echo x > a.txt")
    c = committed(ovl, t, "echo three >> a.txt")
    d = committed(ovl, t, "rm n.txt")
    for sid in (a, b, c):
        age(home, sid, 45)
    (home / "locks" / ("2" * 24 + ".lock")).write_bytes(b"")
    (home / "objects" / "packs" / "20200101-000000-abcdef.pack").write_bytes(b"torn")
    before = snapshot(home)
    lines = len(audit_lines(home))
    dry = gc(ovl, "--dry-run", "--keep-last", "1")
    text = ovl("gc", "--dry-run", "--keep-last", "1", check=0).out
    assert snapshot(home) == before
    assert len(audit_lines(home)) == lines                    # a dry run is not audited
    assert dry["dry_run"] is True and sids(dry) == sorted([a, b, c])
    assert dry["packs"] and dry["locks"] and dry["counts"]["sessions"] == 3
    for sid in (a, b, c):
        assert sid in text
    assert "would remove 3 sessions" in text
    real = gc(ovl, "--keep-last", "1")
    assert real["dry_run"] is False
    for kind in ("sessions", "objects", "packs", "locks", "holds", "tmp", "cgroups"):
        key = {"sessions": "sid", "objects": "sha"}.get(kind, "name" if kind != "cgroups" else "path")
        assert sorted(i[key] for i in real[kind]) == sorted(i[key] for i in dry[kind]), kind
    assert real["counts"] == dry["counts"] and real["bytes"] == dry["bytes"]
    assert real["skipped"] == []
    entry = audit_lines(home)[-1]
    assert entry["action"] == "gc.run"
    assert entry["counts"] == real["counts"] and entry["bytes"] == real["bytes"]["total"]
    assert entry["keep_days"] == 30 and entry["keep_last"] == 1
    assert sorted(entry["sessions"]) == sorted([a, b, c])
    ovl("audit", "verify", check=0)
    assert sorted(os.listdir(home / "sessions")) == [d]
    assert ovl("blame", t / "a.txt", check=0).out.split()[0] == "origin"   # d: never a.txt


def test_json_shape_and_text_with_nothing_to_do(ovl, home, t):
    committed(ovl, t, "echo two > a.txt")
    r = gc(ovl)
    for k in ("dry_run", "keep_days", "keep_last", "sessions", "objects", "packs", "locks",
              "holds", "tmp", "cgroups", "counts", "bytes", "kept", "notes", "skipped"):
        assert k in r, k
    assert r["counts"]["sessions"] == 0 and r["bytes"]["total"] == 0
    assert r["kept"] == {"keep-last": 1}
    out = ovl("gc", check=0).out
    assert "removed nothing" in out and "keep-days 30, keep-last 10" in out
    assert audit_lines(home)[-1]["action"] == "gc.run"


def test_gc_help_names_where_state_lives(ovl, home):
    out = ovl("gc", "--help", check=0).out
    for word in ("--dry-run", "--keep-days", "--keep-last", "--json", "OVERLORD_HOME",
                 "docs/RETENTION.md"):
        assert word in out


def test_one_gc_at_a_time(ovl, home, t):
    committed(ovl, t, "echo two > a.txt")
    (home / "locks").mkdir(exist_ok=True)
    fd = os.open(home / "locks" / "gc.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        proc = ovl("gc")
        assert proc.returncode == 1 and "another `overlord gc` is running" in proc.err
    finally:
        os.close(fd)


# -- packaging ------------------------------------------------------------------------------------

PACKAGING = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "packaging")


def _directives(name):
    out = {}
    for line in open(os.path.join(PACKAGING, name), encoding="utf-8"):
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


def test_the_units_run_gc_nightly_as_a_oneshot():
    svc, timer = _directives("overlord-gc.service"), _directives("overlord-gc.timer")
    assert svc["Type"] == ["oneshot"]
    assert svc["ExecStart"][0].split() == ["/usr/local/bin/overlord", "gc"]   # the launcher
    assert svc["NoNewPrivileges"] == ["yes"] and svc["KillMode"] == ["process"]
    assert timer["Unit"] == ["overlord-gc.service"] and timer["Persistent"] == ["true"]
    assert timer["OnCalendar"] and timer["WantedBy"] == ["timers.target"]


def test_what_a_commit_names_after_the_plan_is_kept(ovl, home, t):
    """Plan, then a commit lands before the prune: the prune counts references again and
    keeps the pack the new commit's record names (its "before" lives there)."""
    from overlord.trust import retention
    a = committed(ovl, t, "printf 'one\\ntwo\\n' > a.txt")
    age(home, a, 100)
    p = retention.plan(keep_days=30, keep_last=0)
    assert [s["sid"] for s in p.sessions] == [a] and [k["name"] for k in p.packs] == [a]
    b = committed(ovl, t, "echo three >> a.txt")            # names a's version of a.txt
    removed, skipped = retention.prune(p)
    assert [s["sid"] for s in removed["sessions"]] == [a]
    assert removed["packs"] == []
    assert {"kind": "pack", "name": a, "why": "named again"} in skipped
    assert f"{a}.pack" in packs(home) and f"{a}.idx" in packs(home)
    assert not (home / "objects" / ".gc-trash").exists()
    out = ovl("blame", t / "a.txt", check=0).out.splitlines()
    assert [line.split()[0] for line in out] == ["origin", "origin", b]


def test_a_session_reopened_or_held_after_the_plan_is_kept(ovl, home, t):
    from overlord.trust import retention
    a = committed(ovl, t, "echo two > a.txt")
    b = committed(ovl, t, "echo three > a.txt")
    for sid in (a, b):
        age(home, sid, 100)
    p = retention.plan(keep_days=30, keep_last=0)
    assert sorted(s["sid"] for s in p.sessions) == sorted([a, b])
    set_meta(home, a, state="pending")
    with retention.holding([b], reason="test"):
        removed, skipped = retention.prune(p)
    assert removed["sessions"] == [] and removed["objects"] == [] and removed["packs"] == []
    assert {"kind": "session", "name": a, "why": "it is pending now"} in skipped
    assert {"kind": "session", "name": b, "why": "held"} in skipped
    assert sorted(os.listdir(home / "sessions")) == sorted([a, b])


@pytest.mark.parametrize("where", ["objects/ee", "objects/packs", "objects/tmp", "locks",
                                   "holds", "objects/.gc-trash", "sessions"])
def test_nothing_is_removed_through_a_symlinked_directory(ovl, home, t, tmp_path, where):
    a = committed(ovl, t, "echo two > a.txt")
    age(home, a, 100)
    outside = tmp_path / "outside"
    outside.mkdir()
    names = {"objects/ee": ["ee" * 31], "objects/packs": ["20200101-000000-abcdef.pack"],
             "objects/tmp": ["999999999-20200101-000000-abcdef-1"],
             "locks": ["ab" * 12 + ".lock"], "holds": ["x.json"],
             "objects/.gc-trash": ["ee" * 32, "pack-20200101-000000-abcdef.pack"],
             "sessions": []}[where]
    for n in names:
        (outside / n).write_bytes(b"")
    link = home / where
    if where == "sessions":
        os.rename(link, tmp_path / "sessions-real")
        os.symlink(tmp_path / "sessions-real", link)
    else:
        if link.exists() and link.is_dir():
            for n in os.listdir(link):
                os.rename(link / n, outside / n)
            link.rmdir()
        os.symlink(outside, link)
    before = sorted(os.listdir(outside))
    gc(ovl, "--keep-days", "0", "--keep-last", "0")
    assert set(before) <= set(os.listdir(outside))      # (a lock may be made there: not removed)
    if where == "sessions":
        assert os.listdir(tmp_path / "sessions-real") == [a]
