"""Commit replays the session's view exactly; rollback leaves the tree exactly as it was.

"The session's view" is captured from inside the session: the same manifest script runs as
the last step of the session's command (its output lands in proc.out) and, after commit, on
the real tree. A manifest records, per path: type, permission bits, symlink target or content
hash, and st_mtime_ns (for everything but the tree root, whose mtime commit may move).
"""
import json
import os
import subprocess
import sys

from conftest import Ovl, state_of

# One script, run inside the session and on the real tree: a JSON manifest of the tree at cwd.
MANIFEST_PY = r"""
import hashlib, json, os, stat
def entry(p, with_mtime):
    st = os.lstat(p)
    m = st.st_mode
    if stat.S_ISDIR(m):
        e = {"type": "dir", "mode": oct(stat.S_IMODE(m))}
    elif stat.S_ISREG(m):
        with open(p, "rb") as f:
            data = f.read()
        e = {"type": "file", "mode": oct(stat.S_IMODE(m)), "size": len(data),
             "sha256": hashlib.sha256(data).hexdigest()}
    elif stat.S_ISLNK(m):
        e = {"type": "symlink", "target": repr(os.readlink(p))}
    else:
        e = {"type": "other", "mode": oct(m), "rdev": st.st_rdev}
    if with_mtime:
        e["mtime_ns"] = st.st_mtime_ns
    return e
out = {".": entry(b".", False)}
todo = [b"."]
while todo:
    d = todo.pop()
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        out[repr(p[2:])] = entry(p, True)
        if os.path.isdir(p) and not os.path.islink(p):
            todo.append(p)
print("MANIFEST " + json.dumps(out, sort_keys=True))
"""

# Appended to a session's script: dump the view as the command leaves it.
DUMP = '\npython3 -c "$1"\n'


def parse_manifest(out):
    lines = [l for l in out.splitlines() if l.startswith("MANIFEST ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][len("MANIFEST "):])


def real_manifest(root, with_root_mtime=False):
    """The manifest of the real tree (same script, run outside any session)."""
    proc = subprocess.run([sys.executable, "-c", MANIFEST_PY], cwd=root, capture_output=True,
                          check=True, text=True)
    m = parse_manifest(proc.stdout)
    if with_root_mtime:
        m["."]["mtime_ns"] = os.stat(root).st_mtime_ns
    return m


def session_with_view(ovl, target, script, **kw):
    """Run `script` in a session, then dump the view it left; returns (sid, view manifest)."""
    sid, proc = ovl.run(target, "sh", "-c", "set -e\n" + script + DUMP, "sh", MANIFEST_PY, **kw)
    assert sid, (proc.out, proc.err)
    return sid, parse_manifest(proc.out)


def assert_manifests_equal(got, want):
    """Compare path by path, so a failure names the paths that differ."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = {p: (got[p], want[p]) for p in set(got) & set(want) if got[p] != want[p]}
    assert not (missing or extra or differ), (
        f"missing after commit: {missing}\nextra after commit: {extra}\n"
        f"differ (real, session): {differ}")


def commit_and_compare(ovl, target, view, sid):
    """Commit, then the real tree must equal the view (the root itself: see test_root_*)."""
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    real = real_manifest(target)
    del real["."], view["."]
    assert_manifests_equal(real, view)


def assert_refused(proc, code=1):
    assert proc.returncode == code, (proc.returncode, proc.out, proc.err)
    lines = proc.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err


def session_dir(home, sid):
    return home / "sessions" / sid


# -- commit replays the view exactly -----------------------------------------------------------

def test_commit_added_modified_and_empty_dirs(ovl, target):
    sid, view = session_with_view(ovl, target, r"""
        echo changed >> hello.txt
        printf 'brand new\n' > new.txt
        touch -d '2001-02-03 04:05:06.123456789' new.txt
        mkdir empty
        mkdir -p sub/e1/e2
        printf '#!/bin/sh\n' > run.sh && chmod 750 run.sh
        echo 1 > n1; echo 2 > n2; echo 3 > n3; echo 4 > sub/n4
    """)
    assert view["b'new.txt'"]["mtime_ns"] % 10**9 == 123456789
    commit_and_compare(ovl, target, view, sid)
    assert (target / "hello.txt").read_text() == "hello\nchanged\n"
    assert os.stat(target / "new.txt").st_mtime_ns % 10**9 == 123456789
    assert os.listdir(target / "empty") == [] and os.listdir(target / "sub" / "e1" / "e2") == []


def test_commit_deletions(ovl, target):
    (target / "tree" / "x" / "y").mkdir(parents=True)
    (target / "tree" / "x" / "y" / "z.txt").write_text("z\n")
    (target / "tree" / "top.txt").write_text("t\n")
    (target / "emptydir").mkdir()
    sid, view = session_with_view(ovl, target, "rm sub/a.txt; rm -rf tree; rmdir emptydir")
    assert ovl.diff(sid) == [("deleted", "emptydir"), ("deleted", "sub/a.txt"), ("deleted", "tree")]
    commit_and_compare(ovl, target, view, sid)
    assert not os.path.lexists(target / "tree") and not os.path.lexists(target / "emptydir")
    assert os.listdir(target / "sub") == []


def test_commit_file_to_dir(ovl, target):
    sid, view = session_with_view(ovl, target, "rm hello.txt; mkdir hello.txt; echo in > hello.txt/in.txt")
    assert view["b'hello.txt'"]["type"] == "dir"
    commit_and_compare(ovl, target, view, sid)
    assert (target / "hello.txt" / "in.txt").read_text() == "in\n"


def test_commit_file_to_empty_dir(ovl, target):
    sid, view = session_with_view(ovl, target, "rm hello.txt; mkdir hello.txt")
    commit_and_compare(ovl, target, view, sid)
    assert os.listdir(target / "hello.txt") == []


def test_commit_dir_to_file(ovl, target):
    (target / "sub" / "deeper").mkdir()
    (target / "sub" / "deeper" / "d.txt").write_text("d\n")
    sid, view = session_with_view(ovl, target, "rm -rf sub; printf 'now a file\\n' > sub")
    assert view["b'sub'"]["type"] == "file"
    commit_and_compare(ovl, target, view, sid)
    assert (target / "sub").read_text() == "now a file\n"


def test_commit_replaced_dir(ovl, target):
    """rm -rf d; mkdir d: the old contents go, the new ones come, nothing else survives."""
    (target / "sub" / "old.txt").write_text("old\n")
    sid, view = session_with_view(ovl, target, "rm -rf sub; mkdir sub; echo new > sub/a.txt")
    assert ("replaced-dir", "sub") in ovl.diff(sid)
    commit_and_compare(ovl, target, view, sid)
    assert sorted(os.listdir(target / "sub")) == ["a.txt"]


def test_commit_read_only_dir_with_new_files(ovl, target):
    """Directories the session filled and then made read-only (a new one and an existing one)."""
    sid, view = session_with_view(ovl, target, r"""
        mkdir ro && echo locked > ro/f.txt && mkdir ro/inner && echo i > ro/inner/g && chmod 555 ro/inner ro
        echo s > sub/new.txt && chmod 500 sub
    """)
    try:
        commit_and_compare(ovl, target, view, sid)
        assert (target / "ro" / "inner" / "g").read_text() == "i\n"
    finally:
        for d in ("ro/inner", "ro", "sub"):   # let pytest clean up as an ordinary user
            if os.path.isdir(target / d):
                os.chmod(target / d, 0o755)


def test_commit_chmod_only(ovl, target):
    (target / "d").mkdir()
    (target / "d" / "f.txt").write_text("f\n")
    os.chmod(target / "d", 0o755)
    os.chmod(target / "d" / "f.txt", 0o644)
    before = os.stat(target / "d" / "f.txt").st_mtime_ns
    sid, view = session_with_view(ovl, target, "chmod 700 d; chmod 604 d/f.txt; chmod 755 hello.txt")
    assert ovl.diff(sid) == [("modified", "d"), ("modified", "d/f.txt"), ("modified", "hello.txt")]
    commit_and_compare(ovl, target, view, sid)
    assert oct(os.stat(target / "d").st_mode & 0o7777) == "0o700"
    assert oct(os.stat(target / "d" / "f.txt").st_mode & 0o7777) == "0o604"
    assert os.stat(target / "d" / "f.txt").st_mtime_ns == before
    assert (target / "d" / "f.txt").read_text() == "f\n"


def test_commit_symlinks(ovl, target):
    os.symlink("hello.txt", target / "retarget")
    os.symlink("sub", target / "tofile")
    os.symlink("sub/a.txt", target / "gone")
    sid, view = session_with_view(ovl, target, r"""
        ln -s hello.txt added
        ln -s does/not/exist dangling
        ln -sfn sub/a.txt retarget
        rm tofile && echo plain > tofile
        rm gone
        rm sub/a.txt && ln -s ../hello.txt sub/a.txt
    """)
    assert view["b'retarget'"] == dict(view["b'retarget'"], type="symlink", target="b'sub/a.txt'")
    commit_and_compare(ovl, target, view, sid)
    assert os.readlink(target / "added") == "hello.txt"
    assert os.readlink(target / "dangling") == "does/not/exist"
    assert os.readlink(target / "retarget") == "sub/a.txt"
    assert not os.path.islink(target / "tofile") and (target / "tofile").read_text() == "plain\n"
    assert not os.path.lexists(target / "gone")
    assert os.readlink(target / "sub" / "a.txt") == "../hello.txt"


def test_commit_odd_names(ovl, target):
    pre = os.fsencode(target)
    for name in (b"old space.txt", b"old\nnl", b"old\xffbad", b"-olddash"):
        with open(os.path.join(pre, name), "wb") as f:
            f.write(b"before\n")
    sid, view = session_with_view(ovl, target, r"""
        echo x > 'with space.txt'
        echo x > "$(printf 'new\nline')"
        echo x > "$(printf 'bad\377name')"
        echo x > ./-dash
        mkdir -- '-dir with space' && echo y > "./-dir with space/$(printf 'in\376')"
        echo more >> 'old space.txt'
        rm "$(printf 'old\nnl')"
        chmod 600 "$(printf 'old\377bad')"
        rm ./-olddash && mkdir ./-olddash
    """)
    for key in ("b'with space.txt'", "b'new\\nline'", "b'bad\\xffname'", "b'-dash'",
                "b'-dir with space/in\\xfe'"):
        assert key in view, sorted(view)
    commit_and_compare(ovl, target, view, sid)
    assert open(os.path.join(pre, b"bad\xffname"), "rb").read() == b"x\n"
    assert open(os.path.join(pre, b"new\nline"), "rb").read() == b"x\n"
    assert not os.path.lexists(os.path.join(pre, b"old\nnl"))
    assert os.path.isdir(os.path.join(pre, b"-olddash"))


def test_commit_keeps_explicit_nanosecond_mtimes(ovl, target):
    """Mtimes set explicitly in the past survive replay to the nanosecond."""
    sid, view = session_with_view(ovl, target, r"""
        echo v1 > f.txt; echo v2 > f.txt
        touch -d '1999-12-31 23:59:59.000000001' f.txt
        mkdir -p old/dir && touch -d '2000-01-01 00:00:00.5' old/dir old
    """)
    assert view["b'f.txt'"]["mtime_ns"] % 10**9 == 1
    commit_and_compare(ovl, target, view, sid)
    assert os.lstat(target / "old").st_mtime_ns == view["b'old'"]["mtime_ns"]


def test_session_sees_the_root_with_its_real_mode(ovl, target):
    os.chmod(target, 0o751)
    sid, view = session_with_view(ovl, target, "echo x > x.txt")
    assert view["."]["mode"] == "0o751"
    ovl("commit", sid, check=0)
    assert oct(os.stat(target).st_mode & 0o7777) == "0o751"


def test_commit_chmod_of_the_root(ovl, target):
    os.chmod(target, 0o755)
    sid, view = session_with_view(ovl, target, "echo x > x.txt; chmod 750 .")
    assert view["."]["mode"] == "0o750"
    ovl("commit", sid, check=0)
    assert oct(os.stat(target).st_mode & 0o7777) == "0o750"


# -- rollback ---------------------------------------------------------------------------------

def test_rollback_byte_identical_and_cleans_up(ovl, home, target):
    os.symlink("hello.txt", target / "link")
    (target / "deep" / "er").mkdir(parents=True)
    (target / "deep" / "er" / "f").write_text("f\n")
    before = real_manifest(target, with_root_mtime=True)
    sid, proc = ovl.sh(target, r"""
        echo x >> hello.txt; rm -rf deep sub; ln -sfn sub link; chmod 700 .
        mkdir locked && echo s > locked/secret && chmod 000 locked
        echo n > nope && chmod 000 nope
        mkdir -p a/b && chmod 000 a/b a
    """)
    assert sid, (proc.out, proc.err)
    assert (session_dir(home, sid) / "layers").is_dir()
    proc = ovl("rollback", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert real_manifest(target, with_root_mtime=True) == before
    sdir = session_dir(home, sid)
    for name in ("layers", "upper", "work"):
        assert not os.path.lexists(sdir / name), sorted(os.listdir(sdir))
    meta = json.loads((sdir / "meta.json").read_text())
    assert meta["state"] == "rolled-back"
    assert state_of(ovl, sid) == "rolled-back"


# -- finality ---------------------------------------------------------------------------------

def test_commit_twice_refused(ovl, target):
    sid, _ = ovl.sh(target, "echo s > s.txt")
    ovl("commit", sid, check=0)
    before = real_manifest(target, with_root_mtime=True)
    assert_refused(ovl("commit", sid))
    assert_refused(ovl("rollback", sid))
    assert real_manifest(target, with_root_mtime=True) == before
    assert state_of(ovl, sid) == "committed"


def test_commit_after_rollback_refused(ovl, target):
    sid, _ = ovl.sh(target, "echo s > s.txt; echo x >> hello.txt")
    ovl("rollback", sid, check=0)
    before = real_manifest(target, with_root_mtime=True)
    assert_refused(ovl("commit", sid))
    assert_refused(ovl("commit", "--force", sid))
    assert real_manifest(target, with_root_mtime=True) == before
    assert not (target / "s.txt").exists()
    assert state_of(ovl, sid) == "rolled-back"


# -- backend-specific -------------------------------------------------------------------------

def test_kernel_wh_names_are_ordinary_files(home, target):
    ovl = Ovl(home, "kernel")
    sid, view = session_with_view(ovl, target, r"""
        echo data > .wh.x
        echo keep > .wh.hello.txt
        mkdir .wh.sub && echo inner > .wh.sub/.wh..wh..opq
    """)
    assert ("added", ".wh.x") in ovl.diff(sid)
    commit_and_compare(ovl, target, view, sid)
    assert (target / ".wh.x").read_text() == "data\n"
    assert (target / ".wh.hello.txt").read_text() == "keep\n"
    assert (target / "hello.txt").read_text() == "hello\n"
    assert (target / "sub" / "a.txt").read_text() == "a\n"
    assert (target / ".wh.sub" / ".wh..wh..opq").read_text() == "inner\n"


def test_kernel_absolute_path_writes_are_captured(home, target):
    ovl = Ovl(home, "kernel")
    real = os.path.realpath(target)
    sid, proc = ovl.run(target, "sh", "-c", 'echo x > "$1/abs.txt"; echo y >> "$1/hello.txt"',
                        "sh", real)
    assert sid, (proc.out, proc.err)
    assert not (target / "abs.txt").exists()
    assert (target / "hello.txt").read_text() == "hello\n"
    assert ovl.diff(sid) == [("added", "abs.txt"), ("modified", "hello.txt")]
    ovl("commit", sid, check=0)
    assert (target / "abs.txt").read_text() == "x\n"
    assert (target / "hello.txt").read_text() == "hello\ny\n"


def test_fuse_new_dir_is_added_and_no_markers_reach_tree(home, target):
    ovl = Ovl(home, "fuse")
    (target / "old").mkdir()
    (target / "old" / "o.txt").write_text("o\n")
    sid, view = session_with_view(ovl, target, r"""
        mkdir newdir && echo n > newdir/n.txt
        mkdir -p newer/deeper
        rm hello.txt
        rm -rf old && mkdir old && echo fresh > old/f.txt
        rm sub/a.txt
    """)
    diff = ovl.diff(sid)
    assert ("added", "newdir") in diff and ("added", "newer") in diff, diff
    assert not any(kind == "replaced-dir" and path.startswith("new") for kind, path in diff), diff
    commit_and_compare(ovl, target, view, sid)
    markers = [os.path.join(r, n) for r, ds, fs in os.walk(target) for n in ds + fs
               if n.startswith(".wh.")]
    assert markers == []
    assert not (target / "hello.txt").exists() and not (target / "old" / "o.txt").exists()
    assert (target / "old" / "f.txt").read_text() == "fresh\n"
