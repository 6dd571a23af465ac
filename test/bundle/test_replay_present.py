"""import -t when the bundle's sid is already on this machine: the bundle's own session
replayed onto another folder on the same machine, or one bundle imported twice with -t. The
record here is left exactly as it is; the replay reads the staged bundle. Without -t the sid
stays refused (test/redteam/test_issue16_bundle.py::test_sid_collision_replaces_nothing)."""
import json
import os

from bundlelib import audit_lines, export, machine, session, snapshot


def _tree(root, files):
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_replay_the_machines_own_pending_session(tmp_path):
    a = machine(tmp_path, "a")
    ta = _tree(tmp_path / "ta", {"hello.txt": "hello\n"})
    tb = _tree(tmp_path / "tb", {"hello.txt": "hello\n"})
    sid = session(a, ta, "echo more >> hello.txt; echo new > new.txt")
    events = [{"type": "task", "at": 1.0, "text": "do x",
               "message": {"role": "user", "content": "do x"}}]
    tpath = os.path.join(a.home, "sessions", sid, "transcript.jsonl")
    with open(tpath, "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    path = tmp_path / "s.ovl"
    export(a, sid, path)
    sdir = os.path.join(a.home, "sessions", sid)
    before = {n: open(os.path.join(sdir, n), "rb").read() for n in ("meta.json", "transcript.jsonl")}
    before_tb = snapshot(tb)

    proc = a("import", path, "-t", tb)
    assert proc.returncode == 0, proc.err
    assert proc.err == ""                                   # no note from the internal open
    assert "already here" in proc.out and "replayed from the bundle" in proc.out, proc.out
    # the record here is untouched; its working state too
    assert {n: open(os.path.join(sdir, n), "rb").read() for n in before} == before
    assert not os.path.exists(os.path.join(sdir, "imported"))
    assert snapshot(tb) == before_tb                        # pending, not committed
    new = next(line.split()[1] for line in proc.out.splitlines() if line.startswith("session "))
    assert a.diff(new) == a.diff(sid)
    with open(os.path.join(a.home, "sessions", new, "transcript.jsonl")) as f:
        got = [json.loads(x) for x in f]
    assert got[:-1] == events and got[-1]["type"] == "import" and got[-1]["from"] == sid
    [entry] = audit_lines(a, "bundle.import")
    assert entry["new_sid"] == new and entry.get("record") == "present"

    a("commit", new, check=0)
    assert (tb / "new.txt").read_text() == "new\n"
    assert (tb / "hello.txt").read_text() == "hello\nmore\n"
    # the original session is still pending and still its own
    assert json.loads(before["meta.json"])["state"] == "pending"
    assert json.loads(open(os.path.join(sdir, "meta.json")).read())["state"] == "pending"


def test_same_bundle_imported_twice_with_t(tmp_path):
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    ta = _tree(tmp_path / "ta", {"f.txt": "f\n"})
    t1 = _tree(tmp_path / "t1", {"f.txt": "f\n"})
    t2 = _tree(tmp_path / "t2", {"f.txt": "f\n"})
    sid = session(a, ta, "echo x > x.txt")
    path = tmp_path / "s.ovl"
    export(a, sid, path)

    first = json.loads(b("import", path, "-t", t1, "--json", check=0).out)
    assert first["record"] == "kept" and first["state"] == "imported"
    kept = os.path.join(b.home, "sessions", sid, "meta.json")
    meta_before = open(kept, "rb").read()
    proc = b("import", path, "-t", t2, "--json")
    assert proc.returncode == 0 and proc.err == "", proc.err
    second = json.loads(proc.out)
    assert second["record"] == "present" and second["state"] == "imported"
    assert second["original_state"] == "pending" and second["changes"] == "1 file"
    assert second["new_sid"] not in (None, first["new_sid"])
    assert open(kept, "rb").read() == meta_before
    b("commit", second["new_sid"], check=0)
    assert (t2 / "x.txt").read_text() == "x\n"

    # without -t the sid stays refused, nothing changed
    proc = b("import", path)
    assert proc.returncode == 1 and "already exists" in proc.err, proc.err
    assert open(kept, "rb").read() == meta_before
    assert len(audit_lines(b, "bundle.import")) == 2


def test_present_sid_still_strict(tmp_path):
    """An altered bundle is refused before anything, even when its sid is already here."""
    a = machine(tmp_path, "a")
    ta = _tree(tmp_path / "ta", {"f.txt": "f\n"})
    tb = _tree(tmp_path / "tb", {"f.txt": "f\n"})
    sid = session(a, ta, "echo x > x.txt")
    path = tmp_path / "s.ovl"
    export(a, sid, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.ovl"
    bad.write_bytes(bytes(data))
    sessions = sorted(os.listdir(os.path.join(a.home, "sessions")))
    before_tb = snapshot(tb)
    proc = a("import", bad, "-t", tb)
    assert proc.returncode == 1 and proc.err.startswith("overlord: "), proc.err
    assert sorted(os.listdir(os.path.join(a.home, "sessions"))) == sessions
    assert snapshot(tb) == before_tb
