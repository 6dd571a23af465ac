"""A selection (--only/--drop) that keeps a savepoint written on top of one it drops is refused
(txn/history.require_consistent) by diff, check, review and commit alike; the selections
that land a tree made only of what commands wrote are still allowed, and `diff --only/--drop`
shows what such a commit would change before it lands."""
import json

from conftest import tree


def refused(proc):
    lines = proc.err.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("overlord: "), (
        proc.returncode, proc.out, proc.err)
    return lines[0]


def three(ovl, target, first, second, third):
    sid, proc = ovl.sh(target, first)
    assert sid, (proc.out, proc.err)
    ovl("exec", sid, "--", "sh", "-c", second, check=0)
    ovl("exec", sid, "--", "sh", "-c", third, check=0)
    return sid


def test_sibling_files_in_one_directory_drop_cleanly(ovl, target):
    """Every savepoint copies sub/ up to write its own file: a copy of a directory that was
    there all along depends on nothing, so @1 can go."""
    sid = three(ovl, target, "echo 0 > sub/zero", "echo 1 > sub/one", "echo 2 > sub/two")
    assert ovl.diff(sid) == [("added", "sub/one"), ("added", "sub/two"), ("added", "sub/zero")]
    rows = json.loads(ovl("diff", "--json", "--drop", "layer:1", sid, check=0).out)
    assert sorted(r["path"] for r in rows) == ["sub/two", "sub/zero"]
    ovl("commit", "--drop", "layer:1", sid, check=0)
    assert sorted(p.name for p in (target / "sub").iterdir()) == ["a.txt", "two", "zero"]


def test_a_new_directory_filled_by_two_savepoints(ovl, target):
    """@1 makes new/ (nothing was there: a new directory hides nothing, opaque or not, on
    either backend) and @2 adds to it: dropping @1 lands new/ with @2's file alone."""
    sid = three(ovl, target, "echo 0 > zero", "mkdir new; echo b > new/b", "echo c > new/c")
    ovl("commit", "--drop", "layer:1", sid, check=0)
    assert sorted(p.name for p in (target / "new").iterdir()) == ["c"]
    assert (target / "zero").exists()


def test_a_file_rewritten_by_a_later_savepoint(ovl, target):
    """A file is whole in the layer that wrote it: @2's hello.txt lands as @2 left it."""
    sid = three(ovl, target, "echo 0 > zero", "echo one > hello.txt", "echo two >> hello.txt")
    ovl("commit", "--only", "layer:0,layer:2", sid, check=0)
    assert (target / "hello.txt").read_text() == "one\ntwo\n"
    assert (target / "zero").exists()


def test_dropping_the_top_savepoints_is_a_rewind(ovl, target):
    sid = three(ovl, target, "rm -r sub; mkdir sub; echo x > sub/x", "echo y > sub/y",
                "rm -r sub")
    ovl("commit", "--drop", "layer:2", sid, check=0)
    assert sorted(p.name for p in (target / "sub").iterdir()) == ["x", "y"]


def test_a_file_written_into_a_directory_a_dropped_savepoint_replaced(ovl, target):
    """@1 replaces sub/ (its a.txt gone); @2 writes sub/new. Without @1, commit would
    bring back a.txt beside new: sub = {a.txt, new}, which no command saw. Refused by every
    verb that takes a selection, naming both savepoints and the path; nothing changes."""
    sid = three(ovl, target, "echo 0 > zero", "rm -r sub; mkdir sub", "echo n > sub/new")
    before = tree(target)
    for verb in ("diff", "check", "review", "commit"):
        line = refused(ovl(verb, "--drop", "layer:1", sid))
        assert "keeps savepoint @2 but drops @1" in line and "sub/" in line, (verb, line)
        assert "keep @1 too, or drop @2" in line, line
    assert tree(target) == before
    ovl("commit", "--drop", "layer:1-2", sid, check=0)       # both: @0 alone
    assert (target / "zero").exists() and (target / "sub" / "a.txt").exists()
    assert not (target / "sub" / "new").exists()


def test_a_kept_savepoint_in_between_is_the_base(ovl, target):
    """@0 replaces sub/, @1 replaces it again, @2 writes into it: @2 was made on @1's sub/,
    so dropping @0 (whose sub/ @1 replaced) is allowed and dropping @1 is not."""
    sid, proc = ovl.sh(target, "rm -r sub; mkdir sub; echo z > sub/z")
    assert sid, (proc.out, proc.err)
    ovl("exec", sid, "--", "sh", "-c", "rm -r sub; mkdir sub; echo o > sub/o", check=0)
    ovl("exec", sid, "--", "sh", "-c", "echo t > sub/t", check=0)
    assert "drops @1" in refused(ovl("diff", "--drop", "layer:1", sid))
    ovl("commit", "--drop", "layer:0", sid, check=0)
    assert sorted(p.name for p in (target / "sub").iterdir()) == ["o", "t"]


def test_escaped_path_in_the_refusal(ovl, target):
    """The path in the refusal is the command's choice: escaped, one line."""
    (target / "d\x1b[2Je").mkdir()
    sid = three(ovl, target, "echo 0 > zero", "rm -r 'd\033[2Je'; mkdir 'd\033[2Je'",
                "echo x > 'd\033[2Je/x'")
    line = refused(ovl("commit", "--drop", "layer:1", sid))
    assert "\x1b" not in line and "drops @1" in line, line
