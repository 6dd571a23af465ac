"""Red team, issue 16: bundles. A .ovl comes from somewhere else: every record in it was
written by whoever made the file, and an unverified one by anyone at all. What may such a
record make this machine do?

Each hostile bundle here is built with tarfile from a real export (so the record has every
field the store expects) and then edited; the manifest is rewritten to match and the
signature dropped (key_id null): what any outsider can make. Defences that hold are plain
tests; holes are strict xfails naming the fix.
"""
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile

import pytest

from conftest import SESSION_RE, Ovl, state_of, tree


# -- helpers -------------------------------------------------------------------------------------

def _sid(proc):
    m = SESSION_RE.search(proc.out)
    assert m, (proc.out, proc.err)
    return m.group(1)


def members_of(path):
    """{name: [TarInfo, bytes or None]} of a bundle, in order (dict keeps it)."""
    out = {}
    with tarfile.open(path, "r:gz") as tar:
        for ti in tar:
            out[ti.name] = [ti, tar.extractfile(ti).read() if ti.isreg() else None]
    return out


def rewrite(src, dst, edit=None, manifest_edit=None):
    """Re-pack bundle src as dst: edit(members) may change/add/remove members
    ({name: [TarInfo, bytes|None]}); the manifest is rebuilt to list them exactly, with
    key_id null and no manifest.sig (an outsider's bundle: unverified, never forged)."""
    ms = members_of(src)
    manifest = json.loads(ms.pop("manifest.json")[1])
    ms.pop("manifest.sig", None)
    if edit:
        edit(ms)
    listing = {}
    for name, (ti, data) in ms.items():
        if ti.issym():
            listing[name] = {"type": "symlink", "mode": 0o777, "size": 0, "link": ti.linkname,
                             "sha256": hashlib.sha256(os.fsencode(ti.linkname)).hexdigest()}
        elif ti.isdir():
            listing[name] = {"type": "dir", "mode": ti.mode & 0o7777, "size": 0, "sha256": None}
        else:
            listing[name] = {"type": "file", "mode": ti.mode & 0o7777, "size": len(data),
                             "sha256": hashlib.sha256(data).hexdigest()}
    manifest["members"] = listing
    manifest["key_id"] = None
    manifest["host"] = "outsider"
    if manifest_edit:
        manifest_edit(manifest)
    mbytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        ti = tarfile.TarInfo("manifest.json")
        ti.mode, ti.size = 0o600, len(mbytes)
        tar.addfile(ti, io.BytesIO(mbytes))
        for name, (ti, data) in ms.items():
            if data is not None:
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
            else:
                tar.addfile(ti)
    with open(dst, "wb") as f:
        f.write(gzip.compress(buf.getvalue()))
    return manifest


def jedit(ms, name, fn):
    ti, data = ms[name]
    doc = json.loads(data)
    doc = fn(doc) or doc
    ms[name][1] = json.dumps(doc).encode()


def add_file(ms, name, data, mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.mode, ti.size = mode, len(data)
    ms[name] = [ti, data]


def add_object(ms, data):
    sha = hashlib.sha256(data).hexdigest()
    add_file(ms, f"objects/{sha}", data, 0o400)
    return sha


@pytest.fixture
def two(tmp_path, backend):
    """Machine A (where sessions are made and exported) and machine B (the importer)."""
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    return Ovl(a, backend), Ovl(b, backend)


def committed_bundle(a, target, tmp_path, script="echo changed > hello.txt; echo new > new.txt"):
    sid, _ = a.sh(target, script)
    a("commit", sid, check=0)
    out = tmp_path / "committed.ovl"
    a("export", sid, "-o", out, check=0)
    return sid, out


def pending_bundle(a, target, tmp_path, script):
    sid, _ = a.sh(target, script)
    out = tmp_path / "pending.ovl"
    a("export", sid, "-o", out, check=0)
    return sid, out


# -- holes ---------------------------------------------------------------------------------------

def test_revert_refuses_an_imported_record(two, target, tmp_path):
    a, b = two
    sid, path = committed_bundle(a, target, tmp_path)
    b("import", path, check=0)
    before = tree(target)
    proc = b("revert", sid)
    staged = SESSION_RE.search(proc.out)
    if staged:                                   # clean up what it staged, whatever the verdict
        b("rollback", staged.group(1))
    assert tree(target) == before
    assert proc.returncode == 1 and "import" in proc.err, (proc.out, proc.err)


def test_crafted_committed_record_plants_a_file_through_revert(two, target, tmp_path):
    a, b = two
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("the importer's own file\n")
    sid, path = committed_bundle(a, target, tmp_path)
    evil = tmp_path / "evil.ovl"
    payload = b"#!/bin/sh\necho the outsider's code runs here\n"

    def edit(ms):
        sha = add_object(ms, payload)
        jedit(ms, "record/meta.json", lambda m: m.update(target=str(victim)))
        st = os.stat(victim)

        def paths(rec):
            rec["paths"] = {"planted.sh": {"before": {"type": "file", "sha": sha, "mode": 0o755,
                                                      "uid": st.st_uid, "gid": st.st_gid},
                                           "after": None}}
        jedit(ms, "record/committed.json", paths)
    rewrite(path, evil, edit, lambda m: m.update(target=str(victim)))
    b("import", evil, check=0)
    proc = b("revert", sid)
    if proc.returncode == 0:
        b("commit", _sid(proc))
    assert not (victim / "planted.sh").exists(), "the outsider's file landed in the folder"


def test_blame_does_not_take_an_outsiders_word(two, target, tmp_path):
    a, b = two
    sid, path = committed_bundle(a, target, tmp_path, "echo hi > x.txt")
    evil = tmp_path / "evil.ovl"
    local = tmp_path / "local"
    local.mkdir()
    (local / "app.py").write_bytes(b"print('written by the importer')\n")
    data = (local / "app.py").read_bytes()

    def edit(ms):
        sha = add_object(ms, data)
        jedit(ms, "record/meta.json", lambda m: m.update(target=str(local)))
        rec = {"path": "app.py", "kind": "added", "before": None, "after": sha, "layer": 0,
               "base": None, "caused_by": {"kind": "command", "command": "reviewed and approved by alice"}}
        ms["record/provenance.jsonl"][1] = (json.dumps(rec) + "\n").encode()
    rewrite(path, evil, edit, lambda m: m.update(target=str(local)))
    assert "UNVERIFIED" in b("import", evil, check=0).out
    proc = b("blame", local / "app.py", "--json", check=0)
    lines = json.loads(proc.out)["lines"]
    owner = lines[0]["owner"]
    assert not (isinstance(owner, dict) and owner.get("sid") == sid and "import" not in
                json.dumps(owner)), owner


# -- defences that hold --------------------------------------------------------------------------

def test_imported_pending_record_cannot_be_committed_resumed_forked_or_rewound(two, target, tmp_path):
    """A record claiming state pending lands as `imported`; every act that would write from it
    to the folder it names (or to its own stack) refuses."""
    a, b = two
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine\n")
    sid, path = pending_bundle(a, target, tmp_path, "echo x > planted.txt")
    evil = tmp_path / "evil.ovl"
    rewrite(path, evil, lambda ms: jedit(ms, "record/meta.json",
                                         lambda m: m.update(target=str(victim), state="pending")),
            lambda m: m.update(target=str(victim)))
    b("import", evil, check=0)
    assert state_of(b, sid) == "imported"
    snap = tree(victim)
    for args in (("commit", sid), ("commit", sid, "--force"), ("rewind", sid, "0"),
                 ("fork", sid, "--at", "0"), ("resume", sid, "go on"),
                 ("exec", sid, "--", "sh", "-c", "echo y > planted2.txt")):
        proc = b(*args)
        assert proc.returncode != 0, (args, proc.out, proc.err)
        assert "Traceback" not in proc.err, proc.err
    assert tree(victim) == snap
    assert state_of(b, sid) == "imported"


def test_owner_claimed_by_the_bundle_is_not_taken(two, target, tmp_path):
    a, b = two
    sid, path = committed_bundle(a, target, tmp_path)
    evil = tmp_path / "evil.ovl"
    rewrite(path, evil, lambda ms: jedit(ms, "record/meta.json",
                                         lambda m: m.update(owner="admin", uid=0)))
    b("import", evil, check=0)
    meta = json.load(open(b.home / "sessions" / sid / "meta.json"))
    assert meta["owner"] is None and meta["uid"] == os.getuid()
    assert meta["imported"]["original_owner"] == "admin"
    assert meta["imported"]["verified"] is False


NEWLINE_SID = "20261201-000000-abcdef\n"     # store.SID_RE matches the whole string (\Z)


@pytest.mark.parametrize("bad", ["../../../etc", "20261201-000000-abcdef/../../x",
                                 "20261201-000000-ABCDEF", NEWLINE_SID])
def test_malformed_sid_refused(two, target, tmp_path, bad):
    a, b = two
    sid, path = committed_bundle(a, target, tmp_path)
    evil = tmp_path / "evil.ovl"
    rewrite(path, evil, lambda ms: jedit(ms, "record/meta.json", lambda m: m.update(sid=bad)),
            lambda m: m.update(sid=bad))
    proc = b("import", evil)
    assert proc.returncode == 1 and "Traceback" not in proc.err, proc.err
    assert not os.path.isdir(b.home / "sessions") or os.listdir(b.home / "sessions") == []


def test_sid_plus_newline_does_not_twin_an_existing_session(two, target, tmp_path):
    a, b = two
    sid, path = committed_bundle(a, target, tmp_path)
    evil = tmp_path / "evil.ovl"
    twin = sid + "\n"
    rewrite(path, evil, lambda ms: jedit(ms, "record/meta.json", lambda m: m.update(sid=twin)),
            lambda m: m.update(sid=twin))
    proc = a("import", evil)
    assert proc.returncode == 1, (proc.out, proc.err)
    assert sorted(os.listdir(a.home / "sessions")) == [sid]


def test_sid_collision_replaces_nothing(two, target, tmp_path):
    a, b = two
    sid, path = committed_bundle(a, target, tmp_path)
    own = a.home / "sessions" / sid / "meta.json"
    before = own.read_bytes()
    proc = a("import", path)                     # A's own session, brought back to A
    assert proc.returncode == 1 and "already exists" in proc.err, proc.err
    assert own.read_bytes() == before


def test_object_not_matching_its_name_refused(two, target, tmp_path):
    a, b = two
    sid, path = committed_bundle(a, target, tmp_path)
    evil = tmp_path / "evil.ovl"

    def edit(ms):
        name = next(n for n in ms if n.startswith("objects/"))
        ms[name][1] = b"not the content this name promises\n"
    rewrite(path, evil, edit)
    proc = b("import", evil)
    assert proc.returncode == 1 and "not named by its content" in proc.err, proc.err


@pytest.mark.parametrize("name", ["changes/tree/../../escape.txt", "/changes/tree/abs.txt",
                                  "changes/tree/./a.txt", "changes/tree//a.txt", "record/../x"])
def test_traversal_names_refused(two, target, tmp_path, name):
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo x > a.txt")
    evil = tmp_path / "evil.ovl"
    rewrite(path, evil, lambda ms: add_file(ms, name, b"escaped\n"))
    t2 = tmp_path / "t2"
    t2.mkdir()
    proc = b("import", evil, "-t", t2)
    assert proc.returncode == 1, (proc.out, proc.err)
    assert not (tmp_path / "escape.txt").exists() and os.listdir(t2) == []


def test_setuid_mode_in_a_replayed_bundle_does_not_reach_the_folder(two, target, tmp_path):
    """A tree member with mode 4755/2755: the replay session may hold it, but commit refuses
    privileged bits without --allow-privileged-modes."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo '#!/bin/sh' > run.sh; chmod 755 run.sh")
    evil = tmp_path / "evil.ovl"

    def edit(ms):
        ms["changes/tree/run.sh"][0].mode = 0o6755
    rewrite(path, evil, edit)
    t2 = tmp_path / "t2"
    t2.mkdir()
    proc = b("import", evil, "-t", t2)
    said = proc.err
    if proc.returncode == 0:
        pend = [ln.split()[0] for ln in b("sessions").out.splitlines() if " pending " in ln]
        assert len(pend) == 1
        done = b("commit", pend[0])
        said = done.err
        assert done.returncode == 1, (done.out, done.err)
    assert "setuid" in said or "setgid" in said, said
    assert not (t2 / "run.sh").exists()


def test_replay_does_not_follow_a_symlink_already_in_the_folder(two, target, tmp_path):
    """The importer's folder has `sub` -> a directory outside; the bundle writes sub/a.txt.
    The writer walks with O_NOFOLLOW: the replay fails, nothing lands outside."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path, "echo owned > sub/a.txt")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("outside, untouched\n")
    t2 = tmp_path / "t2"
    t2.mkdir()
    os.symlink(outside, t2 / "sub")
    proc = b("import", path, "-t", t2)
    m = SESSION_RE.search(proc.out)
    if m:
        b("commit", m.group(1))
    assert (outside / "a.txt").read_text() == "outside, untouched\n"
    assert os.path.islink(t2 / "sub")


def test_replay_writes_only_what_the_bundle_lists(two, target, tmp_path):
    """import -t: the new pending session's diff is exactly the bundle's changes."""
    a, b = two
    sid, path = pending_bundle(a, target, tmp_path,
                               "echo x > a.txt; rm hello.txt; ln -s a.txt l; mkdir d")
    t2 = tmp_path / "t2"
    t2.mkdir()
    (t2 / "hello.txt").write_text("hello\n")
    (t2 / "sub").mkdir()
    (t2 / "sub" / "a.txt").write_text("a\n")
    b("import", path, "-t", t2, check=0)
    pend = [ln.split()[0] for ln in b("sessions").out.splitlines() if " pending " in ln]
    assert len(pend) == 1, b("sessions").out
    assert b.diff(pend[0]) == a.diff(sid)


def test_an_unverified_import_cannot_be_laundered_into_a_verified_one(tmp_path, backend, target):
    a, b, c = (Ovl(tmp_path / n, backend) for n in "ABC")
    for n in "ABC":
        (tmp_path / n).mkdir()
    sid, path = committed_bundle(a, target, tmp_path)
    evil = tmp_path / "evil.ovl"
    rewrite(path, evil, lambda ms: jedit(ms, "record/meta.json",
                                         lambda m: m.update(task="trust me")))
    assert "UNVERIFIED" in b("import", evil, check=0).out
    again = tmp_path / "again.ovl"
    proc = b("export", sid, "-o", again)
    if proc.returncode != 0:
        return                                   # refusing to re-export is a fix
    key = b.home / "bundle.key"
    copy = tmp_path / "b.key"
    copy.write_bytes(key.read_bytes())
    c("bundle", "key", "--import", copy, check=0)
    out = c("import", again, check=0).out
    meta = json.load(open(c.home / "sessions" / sid / "meta.json"))
    assert meta["imported"]["verified"] is False, (out, meta["imported"])
