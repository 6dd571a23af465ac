"""What a commit keeps (objects, committed.json), blame, revert, and the fuse pinned mount."""
import hashlib
import json
import os
import subprocess
import threading
import time

import pytest

from conftest import SESSION_RE, require_backend, state_of


def tree_digest(root):
    """Every entry's path, type, mode and content (or link text), as one hash."""
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            h.update(f"{os.path.relpath(p, root)}|{st.st_mode:o}|".encode())
            if os.path.islink(p):
                h.update(os.readlink(p).encode())
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def blame(ovl, path):
    return json.loads(ovl("blame", path, "--json", check=0).out)


def owners(ovl, path):
    out = []
    for line in blame(ovl, path)["lines"]:
        o = line["owner"]
        out.append(o if isinstance(o, str) else (o["sid"], o["layer"]))
    return out


# -- objects ------------------------------------------------------------------------------------

def test_commit_keeps_what_it_wrote_and_what_it_replaced(ovl, target):
    from overlord.txn import objects
    sid, _ = ovl.sh(target, "echo new > hello.txt; rm -r sub; echo added > n.txt")
    ovl("commit", sid, check=0)
    record = json.loads((ovl.home / "sessions" / sid / "committed.json").read_text())
    paths = record["paths"]
    os.environ["OVERLORD_HOME"] = str(ovl.home)
    assert objects.read(paths["hello.txt"]["before"]["sha"]) == b"hello\n"
    assert objects.read(paths["hello.txt"]["after"]["sha"]) == b"new\n"
    assert objects.read(paths["sub/a.txt"]["before"]["sha"]) == b"a\n"
    assert paths["sub"]["after"] is None and paths["n.txt"]["before"] is None
    # objects never share an inode with the tree
    tree_inodes = {os.lstat(os.path.join(d, f)).st_ino for d, _, fs in os.walk(target) for f in fs}
    obj_inodes = {os.lstat(os.path.join(d, f)).st_ino
                  for d, _, fs in os.walk(ovl.home / "objects") for f in fs}
    assert not tree_inodes & obj_inodes


def test_object_max_caps_what_is_kept(ovl, target):
    sid, _ = ovl.sh(target, "head -c 5000 /dev/zero | tr '\\0' x > big.txt; echo s > small.txt")
    ovl("commit", sid, check=0, env={"OVERLORD_OBJECT_MAX": "100"})
    record = json.loads((ovl.home / "sessions" / sid / "committed.json").read_text())
    from overlord.txn import objects
    os.environ["OVERLORD_HOME"] = str(ovl.home)
    assert objects.read(record["paths"]["small.txt"]["after"]["sha"]) == b"s\n"
    assert record["paths"]["big.txt"]["after"]["sha"]          # recorded, though not kept
    assert objects.read(record["paths"]["big.txt"]["after"]["sha"]) is None
    bad = ovl("commit", ovl.sh(target, "echo x > y", flags=("--stack",))[0],
              env={"OVERLORD_OBJECT_MAX": "lots"})
    assert bad.returncode == 2 and "OVERLORD_OBJECT_MAX" in bad.err


# -- blame --------------------------------------------------------------------------------------

def test_blame_names_the_savepoint_of_each_line_origin_and_drift(ovl, target):
    f = target / "code.txt"
    f.write_text("one\ntwo\nthree\n")
    s1, _ = ovl.sh(target, "printf 'one\\nTWO\\nthree\\n' > code.txt")
    ovl("exec", s1, "--", "sh", "-c", "echo four >> code.txt", check=0)
    ovl("commit", s1, check=0)
    with open(f, "a") as fh:
        fh.write("outside\n")                                # drift between commits
    s2, _ = ovl.run(target, "sed", "-i", "s/one/ONE/", "code.txt")
    ovl("commit", s2, check=0)
    assert owners(ovl, f) == [(s2, 0), (s1, 0), "origin", (s1, 1), "drift"]
    with open(f, "a") as fh:
        fh.write("since\n")                                  # drift since the last commit
    assert owners(ovl, f)[-1] == "drift"
    human = ovl("blame", f, check=0).out.splitlines()
    assert human[0].startswith(f"{s2} @0 sed -i s/one/ONE/ code.txt") and human[0].endswith("  ONE")
    assert human[2].startswith("origin") and human[2].endswith("three")


def test_blame_after_delete_and_recreate_and_commit_by_cause(ovl, target):
    sid, _ = ovl.sh(target, "echo keep > k.txt")
    ovl("exec", sid, "--", "sh", "-c", "echo dropped >> k.txt", check=0)
    ovl("commit", sid, "--only", "layer:0", check=0)
    assert owners(ovl, target / "k.txt") == [(sid, 0)]
    s2, _ = ovl.sh(target, "rm k.txt")
    ovl("commit", s2, check=0)
    s3, _ = ovl.sh(target, "echo back > k.txt")
    ovl("commit", s3, check=0)
    assert owners(ovl, target / "k.txt") == [(s3, 0)]


def test_blame_of_an_untouched_file_is_all_origin(ovl, target):
    sid, _ = ovl.sh(target, "echo x > other")
    ovl("commit", sid, check=0)
    assert owners(ovl, target / "hello.txt") == ["origin"]


@pytest.mark.parametrize("case", ["outside", "missing", "dir", "binary", "symlink"])
def test_blame_bad_input(ovl, target, tmp_path, case):
    sid, _ = ovl.sh(target, "echo x > other")
    ovl("commit", sid, check=0)
    (target / "bin").write_bytes(b"a\0b")
    os.symlink("hello.txt", target / "ln")
    path = {"outside": tmp_path / "elsewhere", "missing": target / "nope", "dir": target / "sub",
            "binary": target / "bin", "symlink": target / "ln"}[case]
    if case == "outside":
        path.write_text("x\n")
    proc = ovl("blame", path)
    assert proc.returncode in (1, 2) and proc.err.startswith("overlord: ")
    assert len(proc.err.splitlines()) == 1 and "Traceback" not in proc.err


# -- revert -------------------------------------------------------------------------------------

def test_revert_stages_the_inverse_for_review(ovl, target):
    os.chmod(target / "hello.txt", 0o640)
    os.symlink("hello.txt", target / "ln")
    before = tree_digest(target)
    sid, _ = ovl.sh(target, "echo changed > hello.txt; chmod 600 hello.txt; rm -r sub; "
                    "mkdir -p n/m; echo z > n/m/z; ln -sf n ln; echo q > sub2")
    ovl("commit", sid, check=0)
    after = tree_digest(target)
    proc = ovl("revert", sid, check=0)
    rev = SESSION_RE.search(proc.out).group(1)
    assert state_of(ovl, rev) == "pending" and tree_digest(target) == after   # staged, not applied
    assert ("deleted", "n") in ovl.diff(rev) and ("added", "sub") in ovl.diff(rev)
    pts = json.loads(ovl("savepoints", rev, "--json", check=0).out)
    assert pts[0]["caused_by"]["kind"] == "revert" and pts[0]["caused_by"]["of"] == sid
    ovl("commit", rev, check=0)
    assert tree_digest(target) == before
    # the revert of the revert brings the change back
    again = SESSION_RE.search(ovl("revert", rev, check=0).out).group(1)
    ovl("commit", again, check=0)
    assert tree_digest(target) == after


def test_revert_replaces_a_file_with_the_directory_it_was(ovl, target):
    before = tree_digest(target)
    sid, _ = ovl.sh(target, "rm -r sub; echo file > sub")
    ovl("commit", sid, check=0)
    rev = SESSION_RE.search(ovl("revert", sid, check=0).out).group(1)
    ovl("commit", rev, check=0)
    assert tree_digest(target) == before


def test_revert_refuses_a_path_changed_since(ovl, target):
    sid, _ = ovl.sh(target, "echo mine > hello.txt; echo new > new.txt")
    ovl("commit", sid, check=0)
    (target / "hello.txt").write_text("edited since\n")
    digest = tree_digest(target)
    sessions = ovl("sessions", check=0).out
    proc = ovl("revert", sid)
    assert proc.returncode == 1 and "hello.txt: it was modified since" in proc.err
    assert "nothing was staged" in proc.err and len(proc.err.splitlines()) == 1
    assert tree_digest(target) == digest and ovl("sessions", check=0).out == sessions


def test_revert_refuses_new_entries_in_a_directory_it_would_remove(ovl, target):
    sid, _ = ovl.sh(target, "mkdir made; echo a > made/a")
    ovl("commit", sid, check=0)
    (target / "made" / "theirs").write_text("keep me\n")
    proc = ovl("revert", sid)
    assert proc.returncode == 1 and "made: it holds new entries since (theirs)" in proc.err
    assert (target / "made" / "theirs").read_text() == "keep me\n"


@pytest.mark.parametrize("state", ["pending", "rolled-back"])
def test_revert_of_a_session_that_is_not_committed(ovl, target, state):
    sid, _ = ovl.sh(target, "echo x > x")
    if state == "rolled-back":
        ovl("rollback", sid, check=0)
    proc = ovl("revert", sid)
    assert proc.returncode == 1 and f"it is {state}" in proc.err and "Traceback" not in proc.err
    assert state_of(ovl, sid) == state


def test_revert_obeys_the_pending_guard(ovl, target):
    sid, _ = ovl.sh(target, "echo x > x")
    ovl("commit", sid, check=0)
    ovl.sh(target, "echo y > y")
    proc = ovl("revert", sid)
    assert proc.returncode == 1 and "--stack" in proc.err
    assert SESSION_RE.search(ovl("revert", sid, "--stack", check=0).out)


# -- the fuse backend's pinned mount ------------------------------------------------------------

def test_a_pinned_fuse_mount_is_recorded_on_the_savepoint(home, target, monkeypatch):
    require_backend("fuse")
    from overlord import ops
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", "fuse")
    sid = ops.run(["true"], target=str(target), backend="fuse", close_if_unchanged=False).sid
    merged = os.path.join(str(home), "sessions", sid, "merged")
    held = {}

    def pin():      # a process outside the command opens the mount while the command runs
        deadline = time.time() + 10
        while time.time() < deadline and "fd" not in held:
            if os.path.exists(os.path.join(merged, "w.txt")):      # seen through the mount
                held["fd"] = os.open(os.path.join(merged, "late.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
            time.sleep(0.01)
    t = threading.Thread(target=pin)
    t.start()
    res = ops.exec_in(sid, ["sh", "-c", "echo w > w.txt; sleep 1"])
    t.join()
    assert "fd" in held
    os.write(held["fd"], b"written after the command ended\n")
    os.close(held["fd"])
    pts = ops.savepoints(sid)
    assert res.layer == 0 and pts[0]["pinned"]
    assert ops.get_session(sid).meta["pinned"][0]["layer"] == 0
    doctor = subprocess.run(["python3", "-m", "overlord", "doctor"], capture_output=True, text=True,
                            env=dict(os.environ, OVERLORD_HOME=str(home)))
    assert f"coarser savepoints in {sid}" in doctor.stdout


def test_blame_after_a_merged_commit_marks_the_outside_lines_drift(ovl, target):
    f = target / "m.txt"
    f.write_text("a\nb\nc\nd\ne\n")
    sid, _ = ovl.run(target, "sed", "-i", "s/^a$/A/", "m.txt", flags=("--merge-base",))
    f.write_text("a\nb\nc\nd\nE\n")                       # an outside edit, far from ours
    ovl("commit", sid, "--merge", check=0)
    assert f.read_text() == "A\nb\nc\nd\nE\n"
    assert owners(ovl, f) == [(sid, 0), "origin", "origin", "origin", "drift"]
