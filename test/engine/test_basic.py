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
