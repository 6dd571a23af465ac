"""Commit refuses to clobber what changed in the real tree while the session was pending.

Every external change here is made after `run` returned, i.e. after the session opened.
A refusal is exit 1 with exactly one stderr line `overlord: ...`, and leaves the real tree
exactly as the external change left it (compared as a full manifest with mtimes).
"""
import hashlib
import os
import shutil
import stat

import pytest

from conftest import state_of


def snapshot(root):
    """{relative path (bytes): (type, mode, content-or-link, mtime_ns)} of a whole tree."""
    root = os.fsencode(root)
    st = os.lstat(root)
    out = {b".": (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), None, st.st_mtime_ns)}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    data = hashlib.sha256(f.read()).hexdigest()
            else:
                data = None
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                            data, st.st_mtime_ns)
    return out


def refused(proc, *words):
    """A refusal: exit 1, one `overlord: ` line on stderr naming every one of words."""
    assert proc.returncode == 1, (proc.returncode, proc.out, proc.err)
    lines = proc.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def session(ovl, target, script, **kw):
    sid, proc = ovl.sh(target, script, **kw)
    assert sid, (proc.out, proc.err)
    return sid


def assert_commit_refused(ovl, sid, target, *words, force=False):
    """Commit (optionally --force) is refused and the real tree does not move."""
    before = snapshot(target)
    args = ["commit", "--force", sid] if force else ["commit", sid]
    line = refused(ovl(*args), *words)
    assert snapshot(target) == before
    assert state_of(ovl, sid) == "pending"
    return line


# -- ordinary drift: refused, and --force overrides -----------------------------------------

def test_modified_externally(ovl, target):
    sid = session(ovl, target, "echo session >> hello.txt")
    (target / "hello.txt").write_text("external edit\n")
    assert_commit_refused(ovl, sid, target, "hello.txt")
    assert (target / "hello.txt").read_text() == "external edit\n"


def test_modified_externally_same_size_and_mtime_restored(ovl, target):
    """Size + mtime are what a process can restore; the check must not stop there."""
    sid = session(ovl, target, "echo session >> hello.txt")
    p = target / "hello.txt"
    st = os.stat(p)
    p.write_bytes(b"HELLO\n")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(p)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert_commit_refused(ovl, sid, target, "hello.txt")
    assert p.read_bytes() == b"HELLO\n"


def test_chmodded_externally(ovl, target):
    sid = session(ovl, target, "echo session >> hello.txt")
    os.chmod(target / "hello.txt", 0o600)
    assert_commit_refused(ovl, sid, target, "hello.txt")
    assert oct(os.stat(target / "hello.txt").st_mode & 0o777) == "0o600"


def test_deleted_file_modified_externally(ovl, target):
    sid = session(ovl, target, "rm sub/a.txt")
    (target / "sub" / "a.txt").write_text("precious\n")
    assert_commit_refused(ovl, sid, target, "sub/a.txt")
    assert (target / "sub" / "a.txt").read_text() == "precious\n"


def test_file_created_externally(ovl, target):
    sid = session(ovl, target, "echo session > new.txt")
    (target / "new.txt").write_text("external\n")
    assert_commit_refused(ovl, sid, target, "created-externally", "new.txt")
    assert (target / "new.txt").read_text() == "external\n"


def test_dir_added_where_external_file_appeared(ovl, target):
    sid = session(ovl, target, "mkdir d && echo session > d/f.txt")
    (target / "d").write_text("external file\n")
    assert_commit_refused(ovl, sid, target, "created-externally", "d")
    assert (target / "d").read_text() == "external file\n"
    proc = ovl("commit", "--force", sid)       # ordinary drift: --force lets the session win
    assert proc.returncode == 0, (proc.out, proc.err)
    assert (target / "d" / "f.txt").read_text() == "session\n"


def test_force_overrides_and_session_wins(ovl, target):
    sid = session(ovl, target, "echo session > hello.txt; echo session > new.txt; rm sub/a.txt")
    (target / "hello.txt").write_text("external\n")
    (target / "new.txt").write_text("external\n")
    (target / "sub" / "a.txt").write_text("external\n")
    assert_commit_refused(ovl, sid, target)
    proc = ovl("commit", "--force", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert (target / "hello.txt").read_text() == "session\n"
    assert (target / "new.txt").read_text() == "session\n"
    assert not (target / "sub" / "a.txt").exists()
    assert state_of(ovl, sid) == "committed"


# -- descendants of a directory the session removes ---------------------------------------------

REMOVES_SUB = {
    "deleted": "rm -rf sub",
    "replaced": "rm -rf sub && mkdir sub && echo new > sub/new.txt",
}


@pytest.mark.parametrize("how", sorted(REMOVES_SUB))
def test_descendant_appeared_under_removed_dir(ovl, target, how):
    (target / "sub" / "deep").mkdir()
    (target / "sub" / "deep" / "d.txt").write_text("d\n")
    sid = session(ovl, target, REMOVES_SUB[how])
    (target / "sub" / "deep" / "late.txt").write_text("appeared later\n")
    assert_commit_refused(ovl, sid, target, "appeared-after-snapshot", "sub/deep")
    assert (target / "sub" / "deep" / "late.txt").read_text() == "appeared later\n"
    assert (target / "sub" / "a.txt").read_text() == "a\n"


@pytest.mark.parametrize("how", sorted(REMOVES_SUB))
def test_child_appeared_under_removed_dir(ovl, target, how):
    sid = session(ovl, target, REMOVES_SUB[how])
    (target / "sub" / "late.txt").write_text("appeared later\n")
    assert_commit_refused(ovl, sid, target, "sub")
    assert (target / "sub" / "late.txt").read_text() == "appeared later\n"


# -- a parent that became a symlink: never written through, not even with --force ---------------

@pytest.mark.parametrize("script", ["echo session >> sub/a.txt", "echo session > sub/new.txt",
                                    "mkdir sub/newdir && echo s > sub/newdir/f"])
def test_parent_became_symlink_out_of_target(ovl, target, tmp_path, script):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("outside\n")
    sid = session(ovl, target, script)
    for name in os.listdir(target / "sub"):
        os.unlink(target / "sub" / name)
    os.rmdir(target / "sub")
    os.symlink(outside, target / "sub")
    outside_before = snapshot(outside)
    assert_commit_refused(ovl, sid, target, "via a symlink")
    assert_commit_refused(ovl, sid, target, "via a symlink", force=True)
    assert snapshot(outside) == outside_before
    assert os.readlink(target / "sub") == str(outside)


# -- what must not block ------------------------------------------------------------------------

def test_unrelated_external_changes_do_not_block(ovl, target):
    (target / "other").mkdir()
    (target / "other" / "o.txt").write_text("o\n")
    (target / "sub" / "b.txt").write_text("b\n")
    sid = session(ovl, target, "echo session >> hello.txt; echo new > sub/new.txt; rm sub/b.txt")
    # beside the session's changes: same directories, other names
    (target / "unrelated.txt").write_text("external\n")
    (target / "sub" / "a.txt").write_text("external a\n")
    (target / "sub" / "ext.txt").write_text("external ext\n")
    (target / "other" / "o.txt").write_text("external o\n")
    (target / "brand").mkdir()
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert (target / "hello.txt").read_text() == "hello\nsession\n"
    assert (target / "sub" / "new.txt").read_text() == "new\n"
    assert not (target / "sub" / "b.txt").exists()
    assert (target / "unrelated.txt").read_text() == "external\n"
    assert (target / "sub" / "a.txt").read_text() == "external a\n"
    assert (target / "sub" / "ext.txt").read_text() == "external ext\n"
    assert (target / "other" / "o.txt").read_text() == "external o\n"
    assert (target / "brand").is_dir()


def test_external_file_beside_a_chmodded_dir_does_not_block(ovl, target):
    os.chmod(target / "sub", 0o755)
    sid = session(ovl, target, "chmod 700 sub")
    (target / "sub" / "ext.txt").write_text("external\n")
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert oct(os.stat(target / "sub").st_mode & 0o777) == "0o700"
    assert (target / "sub" / "ext.txt").read_text() == "external\n"
    assert (target / "sub" / "a.txt").read_text() == "a\n"


def test_external_change_before_session_opened_does_not_block(ovl, target):
    (target / "hello.txt").write_text("changed before the session\n")
    sid = session(ovl, target, "echo session >> hello.txt")
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert (target / "hello.txt").read_text() == "changed before the session\nsession\n"


# -- three-way merge ---------------------------------------------------------------------------

LINES = "".join(f"line {i}\n" for i in range(1, 21))


def test_merge_non_overlapping(ovl, target):
    (target / "lines.txt").write_text(LINES)
    sid = session(ovl, target, "sed -i 's/^line 2$/session 2/' lines.txt", flags=["--merge-base"])
    (target / "lines.txt").write_text(LINES.replace("line 19\n", "external 19\n"))
    assert_commit_refused(ovl, sid, target, "lines.txt")
    proc = ovl("commit", "--merge", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert (target / "lines.txt").read_text() == LINES.replace("line 2\n", "session 2\n").replace(
        "line 19\n", "external 19\n")
    assert state_of(ovl, sid) == "committed"


def test_merge_overlapping_refused(ovl, target):
    (target / "lines.txt").write_text(LINES)
    sid = session(ovl, target, "sed -i 's/^line 2$/session 2/' lines.txt; echo n > new.txt",
                  flags=["--merge-base"])
    (target / "lines.txt").write_text(LINES.replace("line 2\n", "external 2\n"))
    before = snapshot(target)
    refused(ovl("commit", "--merge", sid), "lines.txt")
    assert snapshot(target) == before
    assert not (target / "new.txt").exists()
    assert state_of(ovl, sid) == "pending"


def test_merge_without_merge_base_is_a_usage_error(ovl, target):
    (target / "lines.txt").write_text(LINES)
    sid = session(ovl, target, "sed -i 's/^line 2$/session 2/' lines.txt")
    (target / "lines.txt").write_text(LINES.replace("line 19\n", "external 19\n"))
    before = snapshot(target)
    proc = ovl("commit", "--merge", sid)
    assert proc.returncode == 2, (proc.returncode, proc.out, proc.err)
    lines = proc.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: ") and "--merge-base" in lines[0]
    assert snapshot(target) == before
    assert state_of(ovl, sid) == "pending"


def test_merge_without_git_is_refused_and_changes_nothing(ovl, target, tmp_path):
    """`commit --merge` on a host without git: one line, exit 1, the tree untouched."""
    sid, _ = ovl.sh(target, "echo session >> hello.txt", flags=["--merge-base"])
    (target / "hello.txt").write_text("external\n")
    nogit = tmp_path / "nogit"
    nogit.mkdir()
    for tool in ("python3",):
        os.symlink(shutil.which(tool), nogit / tool)
    proc = ovl("commit", "--merge", sid, env={"PATH": str(nogit)})
    assert proc.returncode == 1 and proc.err.startswith("overlord: ") and "git" in proc.err, proc.err
    assert "Traceback" not in proc.err
    assert (target / "hello.txt").read_text() == "external\n"
