"""The transaction in its simplest form: run, diff, log, commit, rollback."""
import os


def test_run_diff_commit(ovl, target):
    sid, proc = ovl.sh(target, "echo more >> hello.txt; echo new > new.txt; echo out")
    assert sid, proc.out
    assert proc.out.index("out") < proc.out.index("session ")
    assert (target / "hello.txt").read_text() == "hello\n"
    assert not (target / "new.txt").exists()
    assert ovl.diff(sid) == [("added", "new.txt"), ("modified", "hello.txt")]
    ovl("commit", sid, check=0)
    assert (target / "hello.txt").read_text() == "hello\nmore\n"
    assert (target / "new.txt").read_text() == "new\n"


def test_rollback_leaves_tree(ovl, target):
    before = sorted(os.listdir(target))
    sid, _ = ovl.sh(target, "rm -rf sub hello.txt; echo x > y")
    ovl("rollback", sid, check=0)
    assert sorted(os.listdir(target)) == before
    assert (target / "sub" / "a.txt").read_text() == "a\n"


def test_rollback_waits_for_no_command_it_would_pull_the_layers_from_under(ovl, target, tmp_path):
    """A rollback while a command runs in the session is refused (the target is busy); the
    command's savepoint lands, and the session stays pending."""
    import subprocess
    import sys
    import time
    sid, _ = ovl.run(target, "sh", "-c", "echo a > a.txt")
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    proc = subprocess.Popen([sys.executable, "-m", "overlord", "exec", sid, "--", "sh", "-c",
                             f"echo b > b.txt; cat {gate} >/dev/null"], env=ovl.env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:                        # the command is running once b.txt is in its upper
            if os.path.exists(ovl.home / "sessions" / sid / "upper" / "b.txt"):
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        r = ovl("rollback", sid, check=1)
        assert "busy" in r.err
    finally:
        with open(gate, "w"):
            pass
        proc.wait(30)
    assert proc.returncode == 0
    assert sorted(ovl.diff(sid)) == [("added", "a.txt"), ("added", "b.txt")]
    ovl("rollback", sid, check=0)
    assert not (target / "a.txt").exists()
