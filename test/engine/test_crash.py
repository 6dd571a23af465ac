"""Commit is all or nothing even across a crash: kill it after every step, recover, compare."""
import hashlib
import os
import stat

import pytest

from overlord import ops
from overlord.txn import replay

SCRIPT = """
echo changed > keep.txt
rm -f gone.txt
echo new > added.txt
rm -rf tree; mkdir tree; echo fresh > tree/fresh.txt
rm -f file2dir; mkdir file2dir; echo inside > file2dir/inside.txt
rm -rf dir2file; echo now-a-file > dir2file
chmod 700 modedir
ln -s keep.txt link
mkdir -p deep/er && echo deep > deep/er/x.txt
"""


def make_target(path):
    path.mkdir()
    (path / "keep.txt").write_text("original\n")
    (path / "gone.txt").write_text("bye\n")
    (path / "tree").mkdir()
    (path / "tree" / "old.txt").write_text("old\n")
    (path / "file2dir").write_text("was a file\n")
    (path / "dir2file").mkdir()
    (path / "dir2file" / "sub.txt").write_text("sub\n")
    (path / "modedir").mkdir(mode=0o755)
    os.chmod(path / "modedir", 0o755)


def manifest(root):
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISREG(st.st_mode):
                body = hashlib.sha256(open(p, "rb").read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            else:
                body = None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), body)
    return out


def crash_commit_after(sid, steps):
    """Commit in a child that dies (as by kill -9) once `steps` replay steps are done."""
    pid = os.fork()
    if pid == 0:
        count = [0]
        real_apply = replay._apply

        def dying_apply(*args, **kw):
            if count[0] == steps:
                os._exit(9)
            count[0] += 1
            return real_apply(*args, **kw)
        replay._apply = dying_apply
        real_finish = replay.Journal.finish

        def dying_finish(self):
            if steps == -1:             # everything applied, the journal not yet marked done
                os._exit(9)
            real_finish(self)
            if steps == -2:             # marked done, the session record not yet updated
                os._exit(9)
        replay.Journal.finish = dying_finish
        try:
            ops.commit(sid)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def engine(home, backend, monkeypatch):
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", backend)
    return backend


def test_crash_at_every_step_recovers_to_before_or_after(engine, tmp_path):
    ref = tmp_path / "ref"
    make_target(ref)
    before = manifest(ref)
    result = ops.run(["sh", "-c", SCRIPT], target=str(ref))
    ops.commit(result.sid)
    after = manifest(ref)
    assert after != before
    steps = len([p for p in after]) + 20
    outcomes = set()
    for n in list(range(steps)) + [-1, -2]:
        target = tmp_path / f"t{n}"
        make_target(target)
        sid = ops.run(["sh", "-c", SCRIPT], target=str(target)).sid
        code = crash_commit_after(sid, n)
        if code == 0:           # the commit finished before step n: nothing to recover
            assert manifest(target) == after
            assert ops.get_session(sid).meta["state"] == "committed"
            continue
        ops.recover()
        got = manifest(target)
        assert got in (before, after), f"crash after {n} steps left a mixed tree"
        assert not any(name.startswith(".overlord-txn") for name in os.listdir(target))
        state = ops.get_session(sid).meta["state"]
        outcomes.add(state)
        if got == before:
            assert state == "pending"
            ops.commit(sid)          # the session survived intact: commit it now
            assert manifest(target) == after
        else:
            assert state == "committed"
    assert "pending" in outcomes and "committed" in outcomes


def test_recovery_never_clobbers_an_edit_made_after_the_crash(engine, tmp_path):
    target = tmp_path / "t"
    make_target(target)
    sid = ops.run(["sh", "-c", SCRIPT], target=str(target)).sid
    steps = len(ops.get_session(sid).view())
    assert crash_commit_after(sid, steps - 1) == 9          # nearly everything is in place
    (target / "added.txt").write_text("edited after the crash\n")   # someone keeps working
    (target / "deep" / "mine.txt").write_text("new beside the commit\n")
    ops.recover()
    assert (target / "added.txt").read_text() == "edited after the crash\n"
    assert (target / "deep" / "mine.txt").read_text() == "new beside the commit\n"
    assert (target / "keep.txt").read_text() == "original\n"       # the rest was undone
    assert ops.get_session(sid).meta["state"] == "pending"
