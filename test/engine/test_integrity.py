"""What commit produces is exactly what the session saw (issue 10, items 1-3), reproduced.

1a. A sealed layer changed after its seal (by any process of the same user: a new file, other
    bytes, a chmod, another link target, a deleted entry, an added whiteout, an xattr) makes
    diff, log and commit refuse, naming the session, the savepoint and the path, and the real
    tree stays exactly as it was.
2.  On the fuse backend a `.wh.` name or an overlay xattr the command made is never read as a
    deletion or an opaque directory: such names are `invalid-whiteout` and commit refuses them;
    `user.overlay.opaque` is an ordinary xattr there. On the kernel backend `.wh.` names of
    every file type are ordinary entries. A command's `mknod c 0 0` on fuse neither breaks the
    mount nor reads as a deletion.
3.  setuid/setgid bits, file capabilities, ACLs and xattrs are changes: diff, log and --json
    show them; commit refuses added setuid/setgid/capabilities/ACLs for other principals
    without --allow-privileged-modes, and with it lands them exactly.
"""
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import Ovl, require_backend, tree

ROOT = os.geteuid() == 0
FLAG = "--allow-privileged-modes"


# -- helpers ----------------------------------------------------------------------------------

def snapshot(root):
    """Everything about every path of a tree (the root included): type, mode, owner, size,
    times, inode, content or link text, xattrs. Equal snapshots: nothing was touched."""
    out = {}
    broot = os.fsencode(root)
    for base, dirs, files in os.walk(broot):
        for p in [base] + [os.path.join(base, n) for n in sorted(dirs + files)]:
            st = os.lstat(p)
            rel = os.path.relpath(p, broot)
            e = [st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                 st.st_ino]
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    e.append(hashlib.sha256(f.read()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                e.append(os.readlink(p))
            try:
                e.append(sorted((n, os.getxattr(p, n, follow_symlinks=False))
                                for n in os.listxattr(p, follow_symlinks=False)))
            except OSError:
                pass
            out[rel] = e
    return out


def one_line(proc, code=1):
    """The single `overlord: ...` line of a refusal."""
    lines = proc.err.splitlines()
    assert proc.returncode == code and len(lines) == 1 and lines[0].startswith("overlord: "), (
        f"expected one `overlord: ...` line and exit {code}; got exit {proc.returncode}\n"
        f"stderr: {proc.err}\nstdout: {proc.out}")
    assert "Traceback" not in proc.err
    return lines[0]


def diff_lines(ovl, sid):
    proc = ovl("diff", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    return proc.out.splitlines()


def line_for(lines, path):
    """The diff/log line about exactly this path (`<kind>  <path>[  ...]`)."""
    found = [l for l in lines if l.split("  ")[1:2] == [path]]
    assert len(found) == 1, f"no single line for {path!r} in:\n" + "\n".join(lines)
    return found[0]


def json_changes(ovl, sid):
    proc = ovl("diff", "--json", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    data = json.loads(proc.out)
    changes = data if isinstance(data, list) else data.get("changes", [])
    return {c["path"]: c for c in changes}


def run_cmd(ovl, target, script, jail=False, check=0):
    """`overlord run` a shell script (jailed on the kernel backend when asked); the sid."""
    flags = ("--jail",) if jail and ovl.backend == "kernel" else ()
    sid, proc = ovl.run(target, "sh", "-c", script, flags=flags, check=check)
    assert sid, (proc.out, proc.err)
    return sid, proc


def exec_cmd(ovl, sid, script, check=0):
    proc = ovl("exec", sid, "--", "sh", "-c", script, check=check)
    return proc


# -- 1a: a sealed layer changed after its seal ------------------------------------------------

def _whiteout(path):
    os.unlink(path) if os.path.lexists(path) else None
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def _rewrite_keep_times(path, data):
    st = os.lstat(path)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _relink(path, to):
    os.unlink(path)
    os.symlink(to, path)


# (name, savepoint, path in the tree, what another process does to the layer dir)
TAMPERS = [
    ("new-file", 0, "backdoor.py",
     lambda L: open(os.path.join(L, "backdoor.py"), "w").write("import os\n")),
    ("bytes", 0, "one.txt", lambda L: _rewrite_keep_times(os.path.join(L, "one.txt"), b"ONE")),
    ("chmod", 1, "three.txt", lambda L: os.chmod(os.path.join(L, "three.txt"), 0o4755)),
    ("symlink", 1, "ln1", lambda L: _relink(os.path.join(L, "ln1"), "/etc/passwd")),
    ("delete", 0, "dd/x", lambda L: os.unlink(os.path.join(L, "dd", "x"))),
    ("whiteout", 1, "one.txt", lambda L: _whiteout(os.path.join(L, "one.txt"))),
    ("xattr", 0, "two.txt",
     lambda L: os.setxattr(os.path.join(L, "two.txt"), "user.evil", b"1")),
]


@pytest.mark.parametrize("name,sp,path,tamper", TAMPERS, ids=[t[0] for t in TAMPERS])
def test_layer_changed_after_seal_is_refused(ovl, home, target, name, sp, path, tamper):
    sid, _ = run_cmd(ovl, target, "echo one > one.txt; echo two > two.txt; ln -s one.txt ln0;"
                                  "mkdir dd; echo x > dd/x")
    exec_cmd(ovl, sid, "echo three > three.txt; ln -s hello.txt ln1; echo more >> hello.txt",
             check=0)
    layer = home / "sessions" / sid / "layers" / f"{sp:04d}"
    assert layer.is_dir(), sorted(os.listdir(layer.parent))
    # untampered, every reader works
    for args in (("diff", sid), ("log", sid)):
        proc = ovl(*args)
        assert proc.returncode == 0 and proc.err == "", (args, proc.out, proc.err)
    before = snapshot(target)
    tamper(str(layer))
    want = re.compile(rf"^overlord: session {sid} savepoint @{sp} was changed after it was "
                      rf"sealed: {re.escape(path)} \(.+\)$")
    for args in (("diff", sid), ("log", sid), ("commit", sid), ("commit", "--force", sid)):
        line = one_line(ovl(*args))
        assert want.match(line), f"{args}: {line!r} does not match {want.pattern!r}"
    assert snapshot(target) == before
    assert not (target / "backdoor.py").exists()


# -- 2: names and xattrs a command makes are never markers ------------------------------------

def fuse_ovl(home):
    require_backend("fuse")
    return Ovl(home, "fuse")


def kernel_ovl(home):
    require_backend("kernel")
    return Ovl(home, "kernel")


WH_SCRIPT = r"""
import os
open("t", "w").write("x"); os.rename("t", ".wh.important")
os.mkdir(".wh.dir"); os.symlink("x", ".wh.sym"); os.mkfifo(".wh.fifo")
os.setxattr("d", "user.overlay.opaque", b"y")
open("u", "w").write("u")
os.rename("u", "d/.wh..wh..opq")
print("SEEN", sorted(os.listdir(".")), sorted(os.listdir("d")))
"""


def wh_target(tmp_path):
    t = tmp_path / "wh"
    (t / "d").mkdir(parents=True)
    (t / "important").write_text("important\n")
    (t / "dir").mkdir()
    (t / "dir" / "f").write_text("f\n")
    (t / "sym").write_text("sym\n")
    (t / "fifo").write_text("fifo\n")
    (t / "d" / "inner").write_text("inner\n")
    (t / "d" / "keep").write_text("keep\n")
    return t


def test_fuse_wh_names_never_delete(home, tmp_path):
    ovl = fuse_ovl(home)
    t = wh_target(tmp_path)
    sid, proc = ovl.run(t, sys.executable, "-c", WH_SCRIPT)
    assert sid, (proc.out, proc.err)
    seen = proc.out
    assert "'important'" in seen and "'inner'" in seen, seen
    lines = diff_lines(ovl, sid)
    assert not [l for l in lines if l.startswith(("deleted", "replaced-dir"))], lines
    for name in (".wh.important", ".wh.dir", ".wh.sym", ".wh.fifo", "d/.wh..wh..opq"):
        assert line_for(lines, name).startswith("invalid-whiteout  "), lines
    before = tree(t), snapshot(t)
    for args in (("commit", sid), ("commit", "--force", sid), ("commit", FLAG, sid)):
        line = one_line(ovl(*args))
        assert ".wh." in line and re.search(r"invalid.whiteout|\.wh\. name", line), line
        assert (tree(t), snapshot(t)) == before
    assert (t / "important").read_text() == "important\n"
    assert sorted(os.listdir(t / "d")) == ["inner", "keep"]


def test_fuse_link_group_split_by_a_copy_up_of_a_name_renamed_away_is_refused(home, tmp_path):
    """(Red before the fix: found with differential seed 1211 as an ordinary user.) @0 links
    x to f, @1 links x to n32 and sets an xattr through x -- fuse-overlayfs copies the group up
    under the name f -- and @2 renames f away. x lives on in @0 without the xattr, the copy in
    @1 has it, and which one fuse shows for x is not fixed by the layers: commit must refuse,
    never land one of them as what the command saw."""
    ovl = fuse_ovl(home)
    t = tmp_path / "t"
    (t / "d").mkdir(parents=True)
    (t / "d" / "x").write_text("line\n")
    sid, proc = ovl.run(t, sys.executable, "-c", "import os; os.link('d/x', 'd/f')")
    assert sid, (proc.out, proc.err)
    ovl("exec", sid, "--", sys.executable, "-c", "import os; os.link('d/x', 'n32'); "
        "os.setxattr('d/x', 'user.k', b'v')", check=0)
    ovl("exec", sid, "--", sys.executable, "-c", "import os; os.rename('d/f', 'tab')", check=0)
    before = tree(t), snapshot(t)
    for args in (("commit", sid), ("commit", "--force", sid)):
        line = one_line(ovl(*args))
        assert "hard link split across savepoints" in line and "d/" in line, line
        assert (tree(t), snapshot(t)) == before


def test_fuse_overlay_xattrs_a_command_sets_are_never_markers(home, tmp_path):
    """On fuse, user.overlay.opaque set by a command must never make commit delete what is
    under the directory, and what a later command sees there is what commit lands (or commit
    refuses, naming the xattr). fuse-overlayfs hides user.overlay.* from the command's
    listxattr and reads user.overlay.opaque as its own marker on the next mount."""
    ovl = fuse_ovl(home)
    t = wh_target(tmp_path)
    script = r"""
import os
os.setxattr("d", "user.overlay.opaque", b"y")
open("new.txt", "w").write("new\n")     # a change besides: the session stays open
for name in ("user.fuseoverlayfs.opaque", "trusted.overlay.opaque"):
    try:
        os.setxattr("dir", name, b"y")
        print("SET", name)
    except OSError as e:
        print("REFUSED", name, e.errno)
print("SEEN", sorted(os.listdir("d")), sorted(os.listdir("dir")))
"""
    sid, proc = ovl.run(t, sys.executable, "-c", script)
    assert sid, (proc.out, proc.err)
    assert "SEEN ['inner', 'keep'] ['f']" in proc.out, proc.out
    lines = diff_lines(ovl, sid)
    assert not [l for l in lines if l.startswith(("deleted", "replaced-dir"))], lines
    later = ovl("exec", sid, "--", sys.executable, "-c", VIEW_D, cwd=t)
    assert later.returncode == 0, (later.out, later.err)
    before = tree(t), snapshot(t)
    proc = ovl("commit", sid)
    if proc.returncode != 0:
        line = one_line(proc)
        assert "overlay" in line, line
        assert (tree(t), snapshot(t)) == before
    else:
        real = subprocess.run([sys.executable, "-c", VIEW_D], cwd=t, capture_output=True,
                              text=True, check=True).stdout
        assert real == later.out.split("session ")[0], (
            f"a later command saw {later.out!r}, commit left {real!r}")
    assert sorted(os.listdir(t / "d")) == ["inner", "keep"]
    assert sorted(os.listdir(t / "dir")) == ["f"]
    assert (t / "important").read_text() == "important\n"


VIEW_D = r"""
import os
for p in ("d", "dir"):
    print(p, sorted(os.listdir(p)), sorted(n for n in os.listxattr(p) if n.startswith("user.")))
"""


def test_kernel_overlay_xattrs_a_command_sets_are_kept_or_refused(home, tmp_path):
    """The kernel overlay lets a command set user.overlay.* names (it escapes them in the
    layer as user.overlay.overlay.*). What the command then sees must be what commit lands —
    or the commit must be refused; never silently dropped, never read as a marker."""
    ovl = kernel_ovl(home)
    t = wh_target(tmp_path)
    script = r"""
import os
for p, name in (("d", "user.overlay.opaque"), ("important", "user.overlay.whiteout"),
                ("dir", "user.overlay.redirect")):
    try:
        os.setxattr(p, name, b"y")
    except OSError as e:
        print("REFUSED", p, name, e.errno)
open("new.txt", "w").write("new\n")
print("SEEN", {p: sorted(os.listxattr(p)) for p in ("d", "important", "dir")})
"""
    sid, proc = ovl.run(t, sys.executable, "-c", script)
    assert sid, (proc.out, proc.err)
    seen = eval(proc.out.split("SEEN ", 1)[1].splitlines()[0])
    # a second command sees the same and does not trip the seal check
    again = ovl("exec", sid, "--", sys.executable, "-c",
                "import os; print('SEEN', {p: sorted(os.listxattr(p)) for p in "
                "('d', 'important', 'dir')}, sorted(os.listdir('d')))")
    assert again.returncode == 0, (again.out, again.err)
    assert f"SEEN {seen!r} ['inner', 'keep']" in again.out, (seen, again.out)
    lines = diff_lines(ovl, sid)
    assert not [l for l in lines if l.startswith(("deleted", "replaced-dir"))], lines
    before = snapshot(t)
    proc = ovl("commit", sid)
    if proc.returncode != 0:
        line = one_line(proc)
        assert "overlay" in line, line
        assert snapshot(t) == before
        return
    for p, names in seen.items():
        got = sorted(n for n in os.listxattr(t / p) if n.startswith("user."))
        assert got == names, f"{p}: the command saw {names}, commit left {got}"
    assert sorted(os.listdir(t / "d")) == ["inner", "keep"]
    assert (t / "important").read_text() == "important\n"


KERNEL_WH_SCRIPT = r"""
import os, socket
os.mkdir(".wh.dir"); open(".wh.dir/f", "w").write("in\n")
os.symlink("hello.txt", ".wh.sym")
os.mkfifo(".wh.fifo")
s = socket.socket(socket.AF_UNIX); s.bind(".wh.sock"); s.close()
open("t", "w").write("renamed\n"); os.rename("t", ".wh.hello.txt")
os.mkdir(".wh..wh..opq")
os.mkfifo("sub/.wh..wh..opq")
os.symlink("/etc/passwd", "sub/.wh.a.txt")
os.link("hello.txt", ".wh.hard")
"""


def test_kernel_wh_names_of_every_type_are_ordinary(home, target, tmp_path):
    ovl = kernel_ovl(home)
    from test_differential import DUMP_PY, dump_real, parse_tagged
    dump_py = tmp_path / "dump.py"
    dump_py.write_text(DUMP_PY)
    sid, proc = ovl.run(target, sys.executable, "-c", KERNEL_WH_SCRIPT)
    assert sid, (proc.out, proc.err)
    proc = ovl("exec", sid, "--", sys.executable, dump_py, cwd=target)
    assert proc.returncode == 0, (proc.out, proc.err)
    view = parse_tagged(proc.out, "DUMP")
    lines = diff_lines(ovl, sid)
    assert not [l for l in lines if not l.startswith("added  ")], lines
    for name in (".wh.dir", ".wh.sym", ".wh.fifo", ".wh.sock", ".wh.hello.txt",
                 ".wh..wh..opq", "sub/.wh..wh..opq", "sub/.wh.a.txt", ".wh.hard"):
        line_for(lines, name)
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert dump_real(target, str(dump_py)) == view
    assert (target / "hello.txt").read_text() == "hello\n"
    assert (target / "sub" / "a.txt").read_text() == "a\n"
    assert stat.S_ISFIFO(os.lstat(target / ".wh.fifo").st_mode)
    assert stat.S_ISSOCK(os.lstat(target / ".wh.sock").st_mode)
    assert os.readlink(target / "sub" / ".wh.a.txt") == "/etc/passwd"


MKNOD_SCRIPT = r"""
import os, stat
for name in ("newdev", "important"):
    try:
        os.mknod(name, stat.S_IFCHR | 0o644, os.makedev(0, 0))
        print("MADE", name)
    except OSError as e:
        print("REFUSED", name, e.errno)
print("LIST", sorted(os.listdir(".")))
print("READ", open("important").read().strip())
open("after.txt", "w").write("after\n")
print("LIST2", sorted(os.listdir(".")))
"""


def test_fuse_mknod_whiteout_device_neither_breaks_the_mount_nor_deletes(home, tmp_path):
    ovl = fuse_ovl(home)
    t = tmp_path / "mk"
    t.mkdir()
    (t / "important").write_text("important\n")
    (t / "other").write_text("other\n")
    sid, proc = ovl.run(t, sys.executable, "-c", MKNOD_SCRIPT)
    assert sid, (proc.out, proc.err)
    assert "LIST ['important', 'other']" in proc.out or "LIST ['important', 'newdev', 'other']" \
        in proc.out, proc.out
    assert "READ important" in proc.out, proc.out
    assert "LIST2 ['after.txt', 'important'" in proc.out, proc.out
    # the mount still serves the next command
    again = ovl("exec", sid, "--", "cat", "important", "other")
    assert again.returncode == 0 and again.out.startswith("important\nother\n"), (again.out,
                                                                                   again.err)
    lines = diff_lines(ovl, sid)
    assert not [l for l in lines if l.startswith("deleted")], lines
    assert line_for(lines, "after.txt").startswith("added")
    proc = ovl("commit", sid)
    if proc.returncode != 0:          # a 0/0 device a command made is not ours to replay
        one_line(proc)
        assert not (t / "after.txt").exists()
    assert (t / "important").read_text() == "important\n"
    assert (t / "other").read_text() == "other\n"


# -- 3: privileged modes, capabilities, ACLs and xattrs ---------------------------------------

@pytest.fixture
def ptarget(tmp_path):
    t = tmp_path / "priv"
    t.mkdir()
    (t / "a.txt").write_text("a\n")
    os.chmod(t / "a.txt", 0o644)
    (t / "sub").mkdir()
    os.chmod(t / "sub", 0o755)
    (t / "sub" / "b.txt").write_text("b\n")
    os.chmod(t / "sub" / "b.txt", 0o644)
    return t


def assert_refused_privileged(ovl, sid, target, *words):
    before = tree(target), snapshot(target)
    line = one_line(ovl("commit", sid))
    assert FLAG in line, line
    for w in words:
        assert w.lower() in line.lower(), f"{w!r} not named in: {line}"
    assert "--force" not in line, line
    # --force is about drift, not about privilege
    line = one_line(ovl("commit", "--force", sid))
    assert FLAG in line, line
    assert (tree(target), snapshot(target)) == before


def test_setuid_shell_and_setuid_bit_are_shown_and_refused(ovl, ptarget):
    t = ptarget
    sid, _ = run_cmd(ovl, t, "cp /bin/sh rootsh; chmod 6755 rootsh; chmod u+s a.txt", jail=True)
    lines = diff_lines(ovl, sid)
    assert "modified  a.txt  (mode 0644 -> 4644, setuid" in line_for(lines, "a.txt"), lines
    sh = line_for(lines, "rootsh")
    assert sh.startswith("added  rootsh  (") and "6755" in sh, lines
    assert "setuid" in sh and "setgid" in sh, sh
    log = ovl("log", sid)
    assert log.returncode == 0, log.err
    assert "0644 -> 4644" in line_for(log.out.splitlines(), "a.txt"), log.out
    js = json_changes(ovl, sid)
    a, r = js["a.txt"]["details"], js["rootsh"]["details"]
    assert a["mode"] == [0o644, 0o4644] and a["privileged"] == ["setuid"], a
    assert a.get("metadata_only") is True, a
    assert r["type"] == "file" and r["mode"] == [None, 0o6755], r
    assert sorted(r["privileged"]) == ["setgid", "setuid"], r
    assert_refused_privileged(ovl, sid, t, "setuid")
    proc = ovl("commit", FLAG, sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    try:
        assert stat.S_IMODE(os.lstat(t / "a.txt").st_mode) == 0o4644
        assert stat.S_IMODE(os.lstat(t / "rootsh").st_mode) == 0o6755
        assert (t / "rootsh").read_bytes() == open("/bin/sh", "rb").read()
        assert (t / "a.txt").read_text() == "a\n"
    finally:
        os.chmod(t / "rootsh", 0o755)


def test_setgid_bit_is_shown_and_refused(ovl, ptarget):
    t = ptarget
    sid, _ = run_cmd(ovl, t, "chmod g+s a.txt; chmod 2755 sub/b.txt", jail=True)
    lines = diff_lines(ovl, sid)
    assert "modified  a.txt  (mode 0644 -> 2644, setgid" in line_for(lines, "a.txt"), lines
    assert "mode 0644 -> 2755, setgid" in line_for(lines, "sub/b.txt"), lines
    js = json_changes(ovl, sid)
    assert js["a.txt"]["details"]["privileged"] == ["setgid"], js["a.txt"]
    assert_refused_privileged(ovl, sid, t, "setgid")
    proc = ovl("commit", FLAG, sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert stat.S_IMODE(os.lstat(t / "a.txt").st_mode) == 0o2644
    assert stat.S_IMODE(os.lstat(t / "sub" / "b.txt").st_mode) == 0o2755


def test_file_capability(ovl, ptarget):
    """A capability-free command cannot set a file capability (the kernel refuses it
    CAP_SETFCAP); as root, one it carries over from the real tree by a rename or a hard link
    lands at a new path: that is an added capability, shown and refused."""
    t = ptarget
    setcap = shutil.which("setcap")
    assert setcap, "setcap (libcap2-bin) is needed on this host"
    script = ("cp /bin/true mine; setcap cap_net_raw+ep mine 2>/dev/null; echo setcap=$?;"
              "python3 -c 'import os; os.setxattr(\"a.txt\", \"security.capability\", "
              "bytes.fromhex(\"01000002\" + \"00200000\" + \"00\" * 12))' 2>/dev/null;"
              "echo setxattr=$?")
    if ROOT:
        shutil.copyfile("/bin/true", t / "capped")
        os.chmod(t / "capped", 0o755)
        subprocess.run([setcap, "cap_net_raw+ep", str(t / "capped")], check=True)
        want = os.getxattr(t / "capped", "security.capability")
        script += "; mv capped moved; ln moved linked"
    sid, proc = run_cmd(ovl, t, script, jail=True)
    assert "setcap=0" not in proc.out and "setxattr=0" not in proc.out, proc.out
    lines = diff_lines(ovl, sid)
    assert "capability" not in line_for(lines, "mine"), lines
    assert not [l for l in lines if l.split("  ")[1:2] == ["a.txt"]], lines
    if not ROOT:
        proc = ovl("commit", sid)
        assert proc.returncode == 0, (proc.out, proc.err)
        assert "security.capability" not in os.listxattr(t / "mine")
        return
    for name in ("moved", "linked"):
        assert "capability" in line_for(lines, name), lines
        d = json_changes(ovl, sid)[name]["details"]
        assert "file capability" in d["privileged"], d
        assert "security.capability" in d["xattrs"]["added"], d
    assert_refused_privileged(ovl, sid, t, "capability")
    proc = ovl("commit", FLAG, sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    for name in ("moved", "linked"):
        assert os.getxattr(t / name, "security.capability") == want
    assert not (t / "capped").exists()


def getfacl(path):
    return subprocess.run(["getfacl", "-cn", "--", str(path)], capture_output=True, text=True,
                          check=True).stdout


def test_acl_granting_another_user(ovl, ptarget):
    t = ptarget
    sid, proc = run_cmd(ovl, t, "setfacl -m u:nobody:rw a.txt; echo setfacl=$?;"
                                "setfacl -d -m u:nobody:rx sub; echo setfacl_d=$?;"
                                "getfacl -cn a.txt sub", jail=True)
    lines = diff_lines(ovl, sid)
    if "setfacl=0" not in proc.out:
        # the kernel refused it (nobody is unmapped in an ordinary user's namespace)
        assert not ROOT, proc.out
        assert not [l for l in lines if l.split("  ")[1:2] == ["a.txt"]], lines
        return
    assert "ACL" in line_for(lines, "a.txt"), lines
    d = json_changes(ovl, sid)["a.txt"]["details"]
    assert d["privileged"] == ["acl"], d
    assert "system.posix_acl_access" in d["xattrs"]["added"], d
    assert_refused_privileged(ovl, sid, t, "acl")
    view = ovl("exec", sid, "--", "python3", "-c", ACL_DUMP, cwd=t)
    assert view.returncode == 0, view.err
    seen = view.out.splitlines()[0]
    proc = ovl("commit", FLAG, sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    real = subprocess.run([sys.executable, "-c", ACL_DUMP], cwd=t, capture_output=True,
                          text=True, check=True).stdout.splitlines()[0]
    assert real == seen
    assert "user:65534:rw-" in getfacl(t / "a.txt"), getfacl(t / "a.txt")


ACL_DUMP = r"""
import os
out = {}
for p, n in (("a.txt", "system.posix_acl_access"), ("sub", "system.posix_acl_default"),
             ("sub", "system.posix_acl_access")):
    try:
        out[p + " " + n] = os.getxattr(p, n).hex()
    except OSError as e:
        out[p + " " + n] = e.errno
print(sorted(out.items()), oct(os.lstat("a.txt").st_mode))
"""


XATTR_SCRIPT = r"""
import os
os.setxattr("a.txt", "user.new", b"2")
os.removexattr("a.txt", "user.old")
os.removexattr("sub", "user.dirx")
os.setxattr("sub", "user.d2", b"z")
os.setxattr("sub/b.txt", "user.tmp", b"t")
"""


def test_user_xattrs_set_and_removed_land_exactly(ovl, ptarget):
    t = ptarget
    os.setxattr(t / "a.txt", "user.old", b"1")
    os.setxattr(t / "a.txt", "user.keep", b"k")
    os.setxattr(t / "sub", "user.dirx", b"1")
    sid, proc = ovl.run(t, sys.executable, "-c", XATTR_SCRIPT)
    assert sid, (proc.out, proc.err)
    # a later savepoint removes what an earlier one set, and one more of the real tree's
    proc = ovl("exec", sid, "--", sys.executable, "-c",
               "import os; os.removexattr('sub/b.txt', 'user.tmp');"
               "os.removexattr('a.txt', 'user.keep')", cwd=t)
    assert proc.returncode == 0, (proc.out, proc.err)
    lines = diff_lines(ovl, sid)
    a = line_for(lines, "a.txt")
    assert a.startswith("modified  a.txt  (") and "user.new added" in a, lines
    assert "user.old removed" in a and "user.keep removed" in a, lines
    s = line_for(lines, "sub")
    assert "user.d2 added" in s and "user.dirx removed" in s, lines
    assert not [l for l in lines if l.split("  ")[1:2] == ["sub/b.txt"]], lines
    d = json_changes(ovl, sid)["a.txt"]["details"]
    assert d["xattrs"] == {"added": ["user.new"], "removed": ["user.keep", "user.old"],
                           "changed": []}, d
    assert d.get("metadata_only") is True and "privileged" not in d, d
    log = ovl("log", sid)
    assert "user.new" in line_for(log.out.splitlines(), "a.txt"), log.out
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)

    def user_xattrs(p):
        return {n: os.getxattr(p, n) for n in os.listxattr(p) if n.startswith("user.")}
    assert user_xattrs(t / "a.txt") == {"user.new": b"2"}
    assert user_xattrs(t / "sub") == {"user.d2": b"z"}
    assert user_xattrs(t / "sub" / "b.txt") == {}
    assert (t / "a.txt").read_text() == "a\n"
    assert os.listdir(t / "sub") == ["b.txt"]
