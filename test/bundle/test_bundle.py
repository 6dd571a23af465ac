"""Bundles across two machines (two OVERLORD_HOMEs): export, verified and unverified import,
replay as a new pending session then commit, blame after import, the CLI and the audit."""
import json
import os
import shutil
import stat
import tarfile

import pytest

from conftest import require_backend
from bundlelib import (audit_lines, export, fingerprint, key_of, machine, session, share_key,
                       snapshot, untouched_store)

# what the session on machine a does: every kind of change a bundle carries
SCRIPT = r"""
set -e
echo changed >> hello.txt
printf 'new file\n' > new.txt
printf '#!/bin/sh\necho hi\n' > run.sh; chmod 755 run.sh
: > empty
printf '\000\001\002binary\377' > blob.bin
mkdir -p deep/er/est; echo leaf > deep/er/est/leaf.txt; chmod 700 deep/er
chmod 600 sub/a.txt
ln -s sub/a.txt link-to-a
ln -s ../hello.txt sub/up-link
rm keep/gone.txt
rm -r olddir
rm -r swap; mkdir swap; echo fresh > swap/only.txt
rm flip; mkdir flip; echo inside > flip/x
rm -r flop; echo now-a-file > flop
rm tolink; ln -s hello.txt tolink
mkdir ro; echo r > ro/r.txt; chmod 555 ro
echo spaced > 'with space é.txt'
echo odd > "$(printf 'bad\377byte')"
long=$(printf 'n%.0s' $(seq 1 150)); mkdir -p "deep/$long"; echo far > "deep/$long/$long.txt"
ln -s "$long/$long.txt" deep/longlink
"""


def prepare(root):
    """The tree both machines start from."""
    root.mkdir(exist_ok=True)
    (root / "hello.txt").write_text("hello\n")
    (root / "sub").mkdir()
    (root / "sub" / "a.txt").write_text("a\n")
    (root / "keep").mkdir()
    (root / "keep" / "gone.txt").write_text("bye\n")
    (root / "keep" / "stays.txt").write_text("stays\n")
    (root / "olddir" / "inner").mkdir(parents=True)
    (root / "olddir" / "inner" / "f").write_text("f\n")
    (root / "swap").mkdir()
    (root / "swap" / "old.txt").write_text("old\n")
    (root / "flip").write_text("was a file\n")
    (root / "flop").mkdir()
    (root / "flop" / "y").write_text("y\n")
    (root / "tolink").write_text("was a file\n")
    return root


@pytest.mark.parametrize("backend", ["kernel", "fuse"])
def test_replay_then_commit_lands_exactly(tmp_path, backend):
    """Pending on a, exported, replayed on b as a new pending session (both backends), then
    diffed and committed: b's tree ends byte-for-byte as a's does when a commits."""
    require_backend(backend)
    a, b = machine(tmp_path, "a", backend), machine(tmp_path, "b", backend)
    ta, tb = prepare(tmp_path / "ta"), prepare(tmp_path / "tb")
    sid = session(a, ta, SCRIPT)
    want_diff = a.diff(sid)
    path = tmp_path / "s.ovl"
    info = export(a, sid, path)
    assert info["state"] == "pending" and info["changes"]["deleted"] == 2
    share_key(a, b, tmp_path)

    res = json.loads(b("import", path, "-t", tb, "--json", check=0).out)
    assert res["verified"] is True and res["sid"] == sid and res["state"] == "imported"
    new = res["new_sid"]
    assert new and new != sid
    assert snapshot(tb) == snapshot(prepare(tmp_path / "fresh"))   # nothing reached b's folder
    assert b.diff(new) == want_diff
    meta = json.loads(open(os.path.join(b.home, "sessions", new, "meta.json")).read())
    assert meta["state"] == "pending" and meta["backend"] == backend
    [layer] = meta["layers"]
    cause = layer["cause"]
    assert cause["kind"] == "import" and cause["from"] == sid
    assert cause["bundle"] == res["bundle_sha256"]
    # every write of the replay carries the import cause
    with open(os.path.join(b.home, "sessions", new, "provenance.jsonl")) as f:
        assert {json.loads(x)["caused_by"]["kind"] for x in f} == {"import"}

    a("commit", sid, check=0)
    b("commit", new, check=0)
    assert snapshot(tb) == snapshot(ta)
    assert os.readlink(tb / "link-to-a") == "sub/a.txt"
    assert stat.S_IMODE(os.lstat(tb / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(tb / "deep" / "er").st_mode) == 0o700
    assert not os.path.lexists(tb / "keep" / "gone.txt") and not os.path.lexists(tb / "olddir")
    assert not os.path.lexists(tb / "swap" / "old.txt")
    assert (tb / "blob.bin").read_bytes() == b"\x00\x01\x02binary\xff"


def test_transcript_carried_with_a_note(tmp_path):
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    ta, tb = prepare(tmp_path / "ta"), prepare(tmp_path / "tb")
    sid = session(a, ta, "echo x > x.txt")
    events = [{"type": "task", "at": 1.0, "text": "do x", "message": {"role": "user", "content": "do x"}}]
    with open(os.path.join(a.home, "sessions", sid, "transcript.jsonl"), "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    export(a, sid, tmp_path / "s.ovl")
    res = json.loads(b("import", tmp_path / "s.ovl", "-t", tb, "--json", check=0).out)
    with open(os.path.join(b.home, "sessions", res["new_sid"], "transcript.jsonl")) as f:
        got = [json.loads(x) for x in f]
    assert got[:-1] == events
    note = got[-1]
    assert note["type"] == "import" and note["from"] == sid and note["verified"] is False
    assert note["bundle_sha256"] == res["bundle_sha256"] and note["host"]
    # the kept record has the transcript as it was
    with open(os.path.join(b.home, "sessions", sid, "transcript.jsonl")) as f:
        assert [json.loads(x) for x in f] == events
    proc = b("transcript", res["new_sid"])
    assert proc.returncode == 0, proc.err


def test_signed_verified_unverified_and_required(tmp_path, target):
    a, b, c = machine(tmp_path, "a"), machine(tmp_path, "b"), machine(tmp_path, "c")
    sid = session(a, target, "echo changed > hello.txt")
    path = tmp_path / "s.ovl"
    info = export(a, sid, path)
    assert info["key_id"] == fingerprint(key_of(a))
    # c has no key: unverified, and --require-signature refuses
    proc = c("import", path, "--require-signature")
    assert proc.returncode == 1 and "unverified" in proc.err and "--require-signature" in proc.err
    untouched_store(c)
    out = c("import", path, check=0).out
    assert "UNVERIFIED" in out
    meta = json.loads(open(os.path.join(c.home, "sessions", sid, "meta.json")).read())
    assert meta["imported"]["verified"] is False
    assert meta["imported"]["original_state"] == "pending" and meta["state"] == "imported"
    assert meta["imported"]["bundle_sha256"] == info["sha256"]
    assert meta["imported"]["from"] and meta["layers"] == []
    # b has its own key (another machine's): unverified too
    b("bundle", "key", check=0)
    res = json.loads(b("import", path, "--json", check=0).out)
    assert res["verified"] is False and "another key" in res["why"]
    # once a's key is shared, the same bundle verifies (on a fresh machine d)
    d = machine(tmp_path, "d")
    share_key(a, d, tmp_path)
    res = json.loads(d("import", path, "--require-signature", "--json", check=0).out)
    assert res["verified"] is True


def test_imported_state_listed_and_not_committable(tmp_path, target):
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    sid = session(a, target, "echo changed > hello.txt")
    export(a, sid, tmp_path / "s.ovl")
    b("import", tmp_path / "s.ovl", check=0)
    line = [ln for ln in b("sessions", check=0).out.splitlines() if ln.startswith(sid)]
    assert line and line[0].split()[1] == "imported"
    proc = b("commit", sid)
    assert proc.returncode == 1 and "it is imported" in proc.err
    proc = b("rollback", sid)
    assert proc.returncode == 1 and "Traceback" not in proc.err
    proc = b("exec", sid, "--", "true")
    assert proc.returncode != 0 and "Traceback" not in proc.err
    # imported twice: refused, the first record untouched
    before = open(os.path.join(b.home, "sessions", sid, "meta.json")).read()
    proc = b("import", tmp_path / "s.ovl")
    assert proc.returncode == 1 and "already exists" in proc.err
    assert open(os.path.join(b.home, "sessions", sid, "meta.json")).read() == before
    # ... and it does not travel on: b's key would vouch for a's word (laundering)
    proc = b("export", sid, "-o", tmp_path / "again.ovl")
    assert proc.returncode == 1 and "imported" in proc.err and not (tmp_path / "again.ovl").exists()


def test_replay_refused_for_a_committed_bundle(tmp_path, target):
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    sid = session(a, target, "echo changed > hello.txt")
    a("commit", sid, check=0)
    export(a, sid, tmp_path / "s.ovl")
    other = tmp_path / "other"
    other.mkdir()
    proc = b("import", tmp_path / "s.ovl", "-t", other)
    assert proc.returncode == 1 and "no changes to replay" in proc.err, proc.err
    untouched_store(b)


def test_replay_never_writes_through_a_symlink(tmp_path):
    """On b, `sub` is a symlink to a folder outside the target: the replay's writer refuses
    to go through it; nothing is imported and the outside folder is untouched."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    ta = prepare(tmp_path / "ta")
    sid = session(a, ta, "echo planted > sub/new.txt")
    export(a, sid, tmp_path / "s.ovl")
    tb = tmp_path / "tb"
    tb.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, tb / "sub")
    proc = b("import", tmp_path / "s.ovl", "-t", tb)
    assert proc.returncode == 1 and "failed" in proc.err and "Traceback" not in proc.err, proc.err
    assert os.listdir(outside) == []
    assert not os.path.exists(os.path.join(b.home, "sessions", sid))
    assert audit_lines(b, "bundle.import") == []
    states = [ln.split()[1] for ln in b("sessions", check=0).out.splitlines() if ln.strip()]
    assert "pending" not in states          # the replay session was rolled back


def test_blame_after_import(tmp_path):
    """A committed record imported where its folder exists (same path: one host, two homes):
    blame names the session and cause from the imported provenance and objects."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    t = prepare(tmp_path / "t")
    sid = session(a, t, "printf 'hello\\nfrom a\\n' > hello.txt; printf 'one\\ntwo\\n' > b.txt")
    a("commit", sid, check=0)
    before = json.loads(a("blame", t / "hello.txt", "--json", check=0).out)
    proc = b("blame", t / "hello.txt")
    assert proc.returncode != 0                      # b knows no session on that folder yet
    path = tmp_path / "s.ovl"
    info = export(a, sid, path)
    assert info["members"] > 4
    names = [m for m in tarfile.open(path).getnames() if m.startswith("objects/")]
    assert names                                     # the versions blame walks travel along
    b("import", path, check=0)
    got = json.loads(b("blame", t / "hello.txt", "--json", check=0).out)
    owners = [ln["owner"] for ln in got["lines"]]
    assert owners[0] == "origin" and owners[1]["sid"] == sid
    # the same attribution, marked as another machine's word (unverified: b lacks a's key)
    host = json.load(open(os.path.join(b.home, "sessions", sid, "meta.json")))["imported"]["from"]
    assert host and owners[1].pop("imported") == {"from": host, "verified": False}
    assert [ln["text"] for ln in got["lines"]] == [ln["text"] for ln in before["lines"]]
    assert owners[1] == before["lines"][1]["owner"]
    got = json.loads(b("blame", t / "b.txt", "--json", check=0).out)
    assert all(isinstance(ln["owner"], dict) and ln["owner"]["sid"] == sid for ln in got["lines"])
    # with a's objects gone from b, blame would say unknown: the objects are what carried it
    shutil.rmtree(os.path.join(b.home, "objects"))
    got = json.loads(b("blame", t / "b.txt", "--json", check=0).out)
    assert [ln["owner"] for ln in got["lines"]] == ["unknown", "unknown"]


def test_cli_output_and_audit(tmp_path, target):
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    sid = session(a, target, "echo changed > hello.txt; rm sub/a.txt")
    out = a("export", "last", "-o", tmp_path / "s.ovl", check=0).out
    assert f"exported session {sid}" in out and "signed with bundle key" in out
    assert oct(os.stat(tmp_path / "s.ovl").st_mode & 0o777) == "0o600"
    assert stat.S_IMODE(os.stat(os.path.join(a.home, "bundle.key")).st_mode) == 0o600
    fp = a("bundle", "key", check=0).out.strip()
    assert fp == fingerprint(key_of(a))
    assert a("bundle", "key", "--show-path", check=0).out.strip() == os.path.join(a.home, "bundle.key")
    keyinfo = json.loads(a("bundle", "key", "--json", check=0).out)
    assert keyinfo["fingerprint"] == fp and keyinfo["made"] is False
    [made] = audit_lines(a, "bundle.key")            # the first export made the key
    assert made["op"] == "create" and made["fingerprint"] == fp
    [line] = audit_lines(a, "bundle.export")
    assert line["sid"] == sid and line["members"] >= 5 and line["bytes"] == os.path.getsize(tmp_path / "s.ovl")
    import hashlib
    assert line["bundle_sha256"] == hashlib.sha256((tmp_path / "s.ovl").read_bytes()).hexdigest()

    share_key(a, b, tmp_path)
    [kline] = audit_lines(b, "bundle.key")
    assert kline["fingerprint"] == fp
    out = b("import", tmp_path / "s.ovl", check=0).out
    assert f"imported session {sid}" in out and "verified" in out and "state imported (was pending)" in out
    assert "overlord import FILE -t DIR" in out
    [iline] = audit_lines(b, "bundle.import")
    assert iline["sid"] == sid and iline["verified"] is True and iline["new_sid"] is None
    assert iline["bundle_sha256"] == line["bundle_sha256"]
    # never the key, in any audit line of either machine
    for ovl in (a, b):
        text = open(os.path.join(ovl.home, "audit.jsonl")).read()
        assert key_of(a).hex() not in text

    # usage errors: exit 2, one line
    for args in (("export", sid), ("export", "nonsense", "-o", tmp_path / "x.ovl"),
                 ("export", sid, "-o", tmp_path / "no" / "such" / "x.ovl"),
                 ("bundle",), ("bundle", "key", "--show-path", "--import", "x")):
        proc = a(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.err, (args, proc.err)


def test_export_refusals(tmp_path, target):
    a = machine(tmp_path, "a")
    sid = session(a, target, "mkfifo pipe")
    proc = a("export", sid, "-o", tmp_path / "x.ovl")
    assert proc.returncode == 1 and "fifo" in proc.err and not os.path.exists(tmp_path / "x.ovl")
    a("rollback", sid, check=0)
    sid = session(a, target, "ln -s /etc/passwd pw")
    proc = a("export", sid, "-o", tmp_path / "x.ovl")
    assert proc.returncode == 1 and "points outside" in proc.err
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    # a rolled-back session travels as its record alone
    a("rollback", sid, check=0)
    info = export(a, sid, tmp_path / "rb.ovl")
    assert info["state"] == "rolled-back" and info["changes"] is None
    assert not [m for m in tarfile.open(tmp_path / "rb.ovl").getnames() if m.startswith("changes/")]


def test_record_members_carry_no_keys(tmp_path, target):
    a = machine(tmp_path, "a")
    sid = session(a, target, "echo x > x")
    export(a, sid, tmp_path / "s.ovl")
    names = tarfile.open(tmp_path / "s.ovl").getnames()
    assert names[:2] == ["manifest.json", "manifest.sig"]
    assert all(n.split("/")[0] in ("manifest.json", "manifest.sig", "record", "objects", "changes")
               for n in names)
    blob = b"".join(tarfile.open(tmp_path / "s.ovl").extractfile(n).read()
                    for n in names if tarfile.open(tmp_path / "s.ovl").getmember(n).isreg())
    for keyfile in ("bundle.key", "audit.key"):
        data = open(os.path.join(a.home, keyfile), "rb").read()
        assert data not in blob and data.strip() not in blob


def test_web_can_stream_an_export(tmp_path, target, monkeypatch):
    """ops.export_session writes to a file object as well as to a path (the web's download)."""
    import io
    a = machine(tmp_path, "a")
    sid = session(a, target, "echo x > x")
    monkeypatch.setenv("OVERLORD_HOME", str(a.home))
    from overlord import ops
    buf = io.BytesIO()
    info = ops.export_session(sid, buf)
    import hashlib
    assert info["path"] is None and info["bytes"] == len(buf.getvalue())
    assert info["sha256"] == hashlib.sha256(buf.getvalue()).hexdigest()
    (tmp_path / "w.ovl").write_bytes(buf.getvalue())
    b = machine(tmp_path, "b")
    share_key(a, b, tmp_path)
    assert json.loads(b("import", tmp_path / "w.ovl", "--json", check=0).out)["verified"] is True


def test_replay_under_a_policy_that_forces_the_jail(tmp_path):
    """The replay runs as `overlord run` would on that folder: a policy forcing the jail makes
    it a jailed session, and the writer still lands the changes (a Python the jail shows)."""
    require_backend("kernel")
    a, b = machine(tmp_path, "a", "kernel"), machine(tmp_path, "b", "kernel")
    ta, tb = prepare(tmp_path / "ta"), prepare(tmp_path / "tb")
    sid = session(a, ta, "echo jailed > j.txt; rm -r olddir; ln -s j.txt jl")
    export(a, sid, tmp_path / "s.ovl")
    policy = os.path.join(b.home, "policy.json")
    with open(policy, "w") as f:
        json.dump({"default": {"jail": True}}, f)
    os.chmod(policy, 0o600)
    res = json.loads(b("import", tmp_path / "s.ovl", "-t", tb, "--json", check=0).out)
    meta = json.loads(open(os.path.join(b.home, "sessions", res["new_sid"], "meta.json")).read())
    assert meta["grants"].get("jail") is True
    assert b.diff(res["new_sid"]) == a.diff(sid)
    a("commit", sid, check=0)
    b("commit", res["new_sid"], check=0)
    assert snapshot(tb) == snapshot(ta)
