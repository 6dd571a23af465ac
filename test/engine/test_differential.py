"""The differential proof (issue 10, item 4): what commit produces is exactly what the session saw.

A seeded random driver (STEP_PY, run as the command of each savepoint) applies 20-40 random
operations over 3-5 savepoints to a session on a fresh tree: files, directories, renames,
hard links, symlinks (to outside, dangling), chmod with setuid/setgid/sticky, user.* and
overlay xattrs, ACLs, FIFOs, unix sockets, directory<->file swaps, `.wh.` names of every
type, and names with spaces, newlines, escape bytes and invalid UTF-8. The operations are
chosen from what the command itself sees, so a seed replays the same session on a backend.

After the last savepoint one more command in the session dumps the tree it sees (DUMP_PY:
type, mode, owner, link text, sha256, every xattr it can list). Then commit: without
--allow-privileged-modes it must refuse exactly when the session added a setuid/setgid bit,
a file capability or an ACL for another principal, and otherwise succeed; with the flag it
must succeed unless the session holds names the backend cannot replay (`.wh.` names on
fuse). A successful commit must leave the real tree equal to the session's last view (the
same script run on it, as root without capabilities, like the command); a refused one a
single `overlord: ...` line naming a path and a reason, and the tree exactly as it was.
No refusal may claim the tree was changed externally: nothing outside touched it.

Reproduce one failure: OVERLORD_DIFF_SEEDS=<seed> python3 -m pytest \
    test/engine/test_differential.py -k '<backend> and seed<seed>' -q
(OVERLORD_DIFF_SEEDS, comma-separated, adds seeds to the default ones.)
"""
import ast
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import Ovl, SESSION_RE, tree

ROOT = os.geteuid() == 0
FLAG = "--allow-privileged-modes"
DEFAULT_SEEDS = [11, 23, 37, 41, 59, 73]


def seeds():
    extra = [int(s) for s in re.split(r"[,\s]+", os.environ.get("OVERLORD_DIFF_SEEDS", "")) if s]
    return DEFAULT_SEEDS + [s for s in extra if s not in DEFAULT_SEEDS]


# -- the command that dumps the tree it sees ---------------------------------------------------

DUMP_PY = r'''
import errno, hashlib, json, os, stat, sys

ROOT = os.geteuid() == 0


def err(e):
    return "error " + errno.errorcode.get(e.errno, str(e.errno))


def kind(m):
    for test, name in ((stat.S_ISDIR, "dir"), (stat.S_ISREG, "file"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "char-device"), (stat.S_ISBLK, "block-device")):
        if test(m):
            return name
    return "unknown"


def xattrs(p, is_link):
    try:
        names = os.listxattr(p, follow_symlinks=False)
    except OSError as e:
        return {} if is_link else err(e)
    out = {}
    for name in sorted(names):
        try:
            out[name] = os.getxattr(p, name, follow_symlinks=False).hex()
        except OSError as e:
            out[name] = err(e)
    return out


def entry(p):
    try:
        st = os.lstat(p)
    except OSError as ex:
        return {"type": "lstat " + err(ex)}
    m = st.st_mode
    e = {"type": kind(m), "mode": "%04o" % stat.S_IMODE(m)}
    if ROOT:
        e["owner"] = [st.st_uid, st.st_gid]
    if stat.S_ISREG(m):
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            h = hashlib.sha256()
            with os.fdopen(fd, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 16), b""):
                    h.update(chunk)
            e["sha256"] = h.hexdigest()
        except OSError as ex:
            e["sha256"] = err(ex)
    elif stat.S_ISLNK(m):
        e["link"] = repr(os.readlink(p))
        del e["mode"]
    elif stat.S_ISCHR(m) or stat.S_ISBLK(m):
        e["rdev"] = [os.major(st.st_rdev), os.minor(st.st_rdev)]
    e["xattrs"] = xattrs(p, stat.S_ISLNK(m))
    return e


out = {repr(b"."): entry(b".")}
todo = [b"."]
while todo:
    d = todo.pop()
    try:
        names = sorted(os.listdir(d))
    except OSError as ex:
        out[repr(d[2:] if d != b"." else d)]["listing"] = err(ex)
        continue
    for name in names:
        p = d + b"/" + name
        e = out[repr(p[2:])] = entry(p)
        if e["type"] == "dir":
            todo.append(p)
print("DUMP " + json.dumps(out, sort_keys=True))
'''

# -- the random driver: one savepoint's operations ---------------------------------------------

STEP_PY = r'''
import errno, json, os, random, shutil, socket, stat, subprocess, sys

seed, sp, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
BENIGN = sys.argv[4:] == ["benign"]
rng = random.Random("%s/%d" % (seed, sp))
UID, GID = os.getuid(), os.getgid()
NAMES = [b"sp ace", b"base_dir", b"inner.txt", b"new\nline", b"esc\x1b[7m", b"bad\xff\xfe",
         b"caf\xc3\xa9", b"tab\tname", b"-dash", b"f", b"g", b"h", b"d", b"e", b"hello.txt",
         b".hidden", b"a b c"]
OUTSIDE = [b"/etc/passwd", b"../outside", b"../../../../../etc/hostname", b"dangling-nowhere",
           b"/nonexistent/x", b"sub/../../escape"]
FILE_MODES = [0o644, 0o755, 0o600, 0o640, 0o444, 0o1644, 0o1755] + (
    [] if BENIGN else [0o4755, 0o2755, 0o6755, 0o4644, 0o2644, 0o7755])
DIR_MODES = [0o755, 0o700, 0o1777, 0o711, 0o1755] + ([] if BENIGN else [0o2755, 0o3775])
OVERLAY_XATTRS = ["user.overlay.opaque", "trusted.overlay.opaque", "user.overlay.redirect",
                  "user.overlay.whiteout", "user.overlay.origin", "user.fuseoverlayfs.opaque",
                  "trusted.overlay.redirect", "user.containers.override_stat", "trusted.t"]
ACLS = [[b"-m", b"u:65534:rw"], [b"-m", b"g:65534:r"], [b"-m", b"u:%d:rw" % UID],
        [b"-m", b"g:%d:r" % GID], [b"-b"], [b"-x", b"u:65534"], [b"-m", b"o::r"]]
DIR_ACLS = [[b"-d", b"-m", b"u:65534:rx"], [b"-k"]]
log = []


def inventory():
    files, dirs, links, others = [], [b"."], [], []
    todo = [b"."]
    while todo:
        d = todo.pop()
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            p = name if d == b"." else d + b"/" + name
            try:
                m = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(m):
                dirs.append(p)
                todo.append(p)
            elif stat.S_ISREG(m):
                files.append(p)
            elif stat.S_ISLNK(m):
                links.append(p)
            else:
                others.append(p)
    return files, dirs, links, others


def join(parent, name):
    return name if parent == b"." else parent + b"/" + name


def fresh(dirs, prefix=b""):
    name = rng.choice(NAMES + [b"n%d" % rng.randrange(40) for _ in range(6)])
    return join(rng.choice(dirs), prefix + name)


def pick(seq):
    if not seq:
        raise LookupError("nothing to pick")
    return rng.choice(seq)


def data():
    if rng.random() < 0.5:
        return ("line %d\n" % rng.randrange(1000)).encode() * rng.randrange(1, 5)
    return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))


def write(p, content, flags=os.O_TRUNC):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | flags, 0o644)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


def op_create(f, d, l, o):
    p = fresh(d)
    write(p, data())
    return "create %r" % p


def op_modify(f, d, l, o):
    p = pick(f)
    how = rng.choice(["append", "truncate", "overwrite"])
    if how == "append":
        write(p, data(), os.O_APPEND)
    elif how == "truncate":
        os.truncate(p, rng.randrange(0, 4))
    else:
        write(p, data())
    return "%s %r" % (how, p)


def op_delete(f, d, l, o):
    p = pick(f + l + o)
    os.unlink(p)
    return "unlink %r" % p


def op_mkdir(f, d, l, o):
    p = fresh(d)
    os.mkdir(p)
    if rng.random() < 0.5:
        write(join(p, b"in.txt"), data())
    return "mkdir %r" % p


def op_rmdir(f, d, l, o):
    p = pick(d[1:])
    shutil.rmtree(p)
    return "rmtree %r" % p


def op_rename_file(f, d, l, o):
    src = pick(f + l + o)
    dst = pick(f) if f and rng.random() < 0.3 else fresh(d)
    os.rename(src, dst)
    return "rename %r -> %r" % (src, dst)


def op_rename_dir(f, d, l, o):
    src = pick(d[1:])
    dst = fresh([x for x in d if x != src and not x.startswith(src + b"/")])
    try:
        os.rename(src, dst)
        return "rename-dir %r -> %r" % (src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    # overlay without redirect_dir: do what mv does
    r = subprocess.run([b"mv", b"--", src, dst], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return "mv-dir %r -> %r: exit %d" % (src, dst, r.returncode)


def op_hardlink(f, d, l, o):
    src = pick(f)
    dst = fresh(d)
    os.link(src, dst)
    return "link %r -> %r" % (src, dst)


def op_symlink(f, d, l, o):
    dst = fresh(d)
    to = rng.choice(OUTSIDE + [pick(f + d[1:] + l) if len(f + d + l) > 1 else b"x",
                               b"new\nline-target", b"bad\xfftarget"])
    os.symlink(to, dst)
    return "symlink %r -> %r" % (dst, to)


def op_chmod(f, d, l, o):
    if rng.random() < 0.7 and f:
        p, mode = pick(f), rng.choice(FILE_MODES)
    else:
        p, mode = pick(d[1:] or f), rng.choice(DIR_MODES)
        if stat.S_ISREG(os.lstat(p).st_mode):
            mode = rng.choice(FILE_MODES)
    os.chmod(p, mode)
    return "chmod %04o %r" % (mode, p)


def op_setxattr(f, d, l, o):
    p = pick(f + d)
    name = "user.k%d" % rng.randrange(4)
    value = data()[:40] or b"v"
    os.setxattr(p, name, value, follow_symlinks=False)
    return "setxattr %s %r" % (name, p)


def op_rmxattr(f, d, l, o):
    candidates = []
    for p in f + d:
        try:
            names = os.listxattr(p, follow_symlinks=False)
        except OSError:
            continue
        candidates += [(p, n) for n in sorted(names) if n.startswith("user.")]
    p, name = pick(candidates)
    os.removexattr(p, name, follow_symlinks=False)
    return "removexattr %s %r" % (name, p)


def op_overlay_xattr(f, d, l, o):
    p = pick(d + f)
    name = rng.choice(OVERLAY_XATTRS)
    value = rng.choice([b"y", b"/base_dir", b"x"])
    os.setxattr(p, name, value, follow_symlinks=False)
    return "setxattr %s=%r %r" % (name, value, p)


def op_acl(f, d, l, o):
    p = pick(f + d)
    args = rng.choice(ACLS + (DIR_ACLS if p in d else []))
    r = subprocess.run([b"setfacl"] + args + [b"--", p], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return "setfacl %s %r: exit %d" % (b" ".join(args).decode(), p, r.returncode)


def op_fifo(f, d, l, o):
    p = fresh(d)
    os.mkfifo(p)
    return "mkfifo %r" % p


def op_socket(f, d, l, o):
    p = fresh(d)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(p)
    finally:
        s.close()
    return "socket %r" % p


def op_swap(f, d, l, o):
    p = pick(f + l + o + d[1:])
    if p in d:
        shutil.rmtree(p)
        write(p, data())
        return "swap dir->file %r" % p
    os.unlink(p)
    os.mkdir(p)
    write(join(p, b"inner.txt"), data())
    return "swap file->dir %r" % p


def op_wh(f, d, l, o):
    parent = rng.choice(d)
    siblings = [x.rpartition(b"/")[2] for x in f + d[1:] + l + o
                if (x.rpartition(b"/")[0] or b".") == parent]
    name = rng.choice([b".wh..wh..opq", b".wh..opq", b".wh." + rng.choice(siblings or [b"x"]),
                       b".wh." + rng.choice(NAMES)])
    p = join(parent, name)
    how = rng.choice(["file", "dir", "symlink", "fifo", "socket", "rename", "link"])
    if how == "file":
        write(p, data())
    elif how == "dir":
        os.mkdir(p)
    elif how == "symlink":
        os.symlink(b"x", p)
    elif how == "fifo":
        os.mkfifo(p)
    elif how == "socket":
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(p)
        finally:
            s.close()
    elif how == "rename":
        src = join(parent, b"wh-src")
        write(src, b"x")
        os.rename(src, p)
    else:
        os.link(pick(f), p)
    return "wh %s %r" % (how, p)


OPS = [(op_create, 6), (op_modify, 5), (op_delete, 3), (op_mkdir, 3), (op_rmdir, 1),
       (op_rename_file, 4), (op_rename_dir, 2), (op_hardlink, 3), (op_symlink, 3),
       (op_chmod, 5), (op_setxattr, 4), (op_rmxattr, 3), (op_overlay_xattr, 2), (op_acl, 2),
       (op_fifo, 2), (op_socket, 1), (op_swap, 3), (op_wh, 3)]
if BENIGN:
    # what the reviewer's benign sequences did: no privilege, no marker-like names
    OPS = [(o, w) for o, w in OPS if o not in (op_overlay_xattr, op_acl, op_wh)]
    OPS += [(op_rename_file, 4), (op_hardlink, 3), (op_chmod, 3), (op_setxattr, 2),
            (op_rmxattr, 3)]

for i in range(count):
    inv = inventory()
    op = op_create if (sp == 0 and i == 0) else rng.choices(
        [o for o, _ in OPS], [w for _, w in OPS])[0]
    try:
        log.append("@%d %s" % (sp, op(*inv)))
    except LookupError:
        log.append("@%d %s: nothing to act on" % (sp, op.__name__))
    except OSError as e:
        log.append("@%d %s: %s %s" % (sp, op.__name__, errno.errorcode.get(e.errno, e.errno),
                                      e.filename))
print("STEPLOG " + json.dumps(log))
'''


# -- helpers ---------------------------------------------------------------------------------

def base_tree(root, benign=False):
    """A fresh target with the ordinary and the odd: xattrs, an ACL, setuid, a FIFO, names
    with spaces, newlines and invalid UTF-8 (and, as root, a file capability). benign: none
    of what carries privilege (no setuid/setgid, ACL or capability to carry around)."""
    root.mkdir()
    b = os.fsencode(root)
    files = {b"hello.txt": b"hello\n", b"sp ace": b"space\n", b"base_dir/inner.txt": b"inner\n",
             b"base_dir/sub/deep.txt": b"deep\n", b"d/f": b"f\n", b"ex.sh": b"#!/bin/sh\n",
             b"su.bin": b"not really a binary\n", b"acl.txt": b"acl\n",
             b"base\nnl.txt": b"newline\n", b"base\xff.bin": b"\xff\xfe\n",
             b"sg.dir/x": b"x\n", b"sticky/y": b"y\n"}
    for rel, content in files.items():
        p = os.path.join(b, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(content)
    os.chmod(os.path.join(b, b"ex.sh"), 0o755)
    if not benign:
        os.chmod(os.path.join(b, b"su.bin"), 0o4755)
        os.chmod(os.path.join(b, b"sg.dir"), 0o2775)
    os.chmod(os.path.join(b, b"sticky"), 0o1777)
    os.symlink(b"hello.txt", os.path.join(b, b"link"))
    os.symlink(b"/etc/hostname", os.path.join(b, b"abs"))
    os.mkfifo(os.path.join(b, b"fifo0"))
    os.setxattr(os.path.join(b, b"hello.txt"), "user.base", b"1")
    os.setxattr(os.path.join(b, b"base_dir"), "user.dir", b"2")
    os.setxattr(os.path.join(b, b"sp ace"), "user.k0", b"zero")
    if benign:
        return root
    subprocess.run(["setfacl", "-m", "u:65534:r", os.path.join(root, "acl.txt")], check=True)
    if ROOT and shutil.which("setcap"):
        shutil.copyfile("/bin/true", root / "capped")
        os.chmod(root / "capped", 0o755)
        subprocess.run(["setcap", "cap_net_raw+ep", str(root / "capped")], check=True)
    return root


def parse_tagged(out, tag):
    lines = [line for line in out.splitlines() if line.startswith(tag + " ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][len(tag) + 1:])


def dump_real(root, dump_py):
    """The same dump, run on the real tree; as root without capabilities, as the command ran."""
    cmd = [sys.executable, dump_py]
    if ROOT:
        cmd = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all",
               "--"] + cmd
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return parse_tagged(proc.stdout, "DUMP")


def stat_snapshot(root):
    """Everything a replay could disturb, of every path (the root included)."""
    out = {}
    for base, dirs, files in os.walk(os.fsencode(root)):
        for p in [base] + [os.path.join(base, n) for n in files + dirs]:
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_ino, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
                      st.st_mtime_ns, st.st_ctime_ns)
    return out


def unmapped_acl_ids(dump):
    """As an ordinary user the command runs in a user namespace where only its own ids are
    mapped: an ACL entry naming any other id reads there as -1. Read both sides that way."""
    if ROOT:
        return dump
    own = {2: os.getuid(), 8: os.getgid()}
    out = {}
    for key, e in dump.items():
        x = e.get("xattrs")
        if isinstance(x, dict) and any(n.startswith("system.posix_acl_") for n in x):
            x = dict(x)
            for name in [n for n in x if n.startswith("system.posix_acl_")]:
                raw = bytearray(bytes.fromhex(x[name])) if not x[name].startswith("error") else None
                for i in range(4, len(raw or b"") - 7, 8):
                    tag = int.from_bytes(raw[i:i + 2], "little")
                    if tag in own and int.from_bytes(raw[i + 4:i + 8], "little") != own[tag]:
                        raw[i + 4:i + 8] = b"\xff\xff\xff\xff"
                if raw is not None:
                    x[name] = raw.hex()
            e = dict(e, xattrs=x)
        out[key] = e
    return out


def compare(got, want):
    """The paths whose dumps differ, readably."""
    got, want = unmapped_acl_ids(got), unmapped_acl_ids(want)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = {p: {"real": got[p], "session": want[p]} for p in sorted(set(got) & set(want))
              if got[p] != want[p]}
    return missing, extra, differ


ACL_TAGS = {2: "u", 8: "g"}


def named_acl(hexvalue):
    """{(tag, id): perm} of the named user/group entries of a POSIX ACL xattr value."""
    out = {}
    if not isinstance(hexvalue, str) or hexvalue.startswith("error"):
        return out
    raw = bytes.fromhex(hexvalue)
    for i in range(4, len(raw) - 7, 8):
        tag, perm, ident = int.from_bytes(raw[i:i + 2], "little"), \
            int.from_bytes(raw[i + 2:i + 4], "little"), int.from_bytes(raw[i + 4:i + 8], "little")
        if tag in ACL_TAGS:
            out[(ACL_TAGS[tag], ident)] = perm
    return out


def privileged_additions(before, view):
    """(must, may): what the session's view adds over the tree before, per path, that commit
    must refuse without --allow-privileged-modes, and what it may reasonably refuse."""
    must, may = [], []
    own = {("u", os.getuid()), ("g", os.getgid())}
    for key, e in view.items():
        b = before.get(key)
        same_type = b is not None and b["type"] == e["type"]
        same_content = same_type and b.get("sha256") == e.get("sha256")
        if "mode" in e and e["type"] != "symlink":
            mode = int(e["mode"], 8)
            bmode = int(b["mode"], 8) if same_type and "mode" in b else 0
            for bit, why in ((0o4000, "setuid"), (0o2000, "setgid")):
                if mode & bit:
                    if e["type"] != "file":
                        may.append((key, why))
                    elif not bmode & bit:
                        must.append((key, why))
                    elif not same_content:
                        may.append((key, why))
        x = e.get("xattrs") if isinstance(e.get("xattrs"), dict) else {}
        bx = b.get("xattrs") if b is not None and isinstance(b.get("xattrs"), dict) else {}
        if "security.capability" in x:
            if not same_type or bx.get("security.capability") != x["security.capability"]:
                must.append((key, "file capability"))
            elif not same_content:
                may.append((key, "file capability"))
        for name in ("system.posix_acl_access", "system.posix_acl_default"):
            if x.get(name) == bx.get(name) and same_type:
                if name in x and not same_content:
                    may.append((key, "acl"))
                continue
            if name not in x:
                if name in bx:
                    may.append((key, "acl"))
                continue
            now, was = named_acl(x[name]), named_acl(bx.get(name) if same_type else None)
            grows = [k for k, perm in now.items() if k not in was or perm & ~was[k]]
            foreign = [k for k in grows if k not in own]
            if foreign and name == "system.posix_acl_access":
                must.append((key, "acl"))
            else:
                may.append((key, "acl"))
    return must, may


def entries_named(line, before, view):
    """The before/view entries of the paths a refusal line names, for the message."""
    out = []
    for key in sorted(set(before) | set(view)):
        text = ast.literal_eval(key).decode("utf-8", "backslashreplace")
        if len(text) > 2 and f" {text}" in line:
            out.append(f"{key}: before {before.get(key)}\n  view {view.get(key)}")
    return "\n".join(out)


def keys_named(view, pred):
    return [k for k in view if pred(ast.literal_eval(k))]


def is_wh(path):
    return path.rpartition(b"/")[2].startswith(b".wh.")


def assert_one_refusal(proc, what):
    lines = proc.err.splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("overlord: "), (
        f"{what}: expected one `overlord: ...` refusal line, exit 1; got exit "
        f"{proc.returncode}\nstderr: {proc.err}\nstdout: {proc.out}")
    assert "Traceback" not in proc.err
    assert "externally" not in proc.err, (
        f"{what}: FALSE DRIFT: nothing outside touched the tree, yet commit said: {proc.err}")
    return lines[0]


# -- the test ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    d = tmp_path_factory.mktemp("diffscripts")
    (d / "step.py").write_text(STEP_PY)
    (d / "dump.py").write_text(DUMP_PY)
    return str(d / "step.py"), str(d / "dump.py")


def drive(ovl, target, scripts, seed, benign=False):
    """The seeded session: 20-40 random steps over 3-5 savepoints, then the view's dump.
    Returns (sid, view, who): `who` says what to rerun and what happened, for messages."""
    step_py, dump_py = scripts
    rng = random.Random(seed)
    steps = rng.randint(20, 40)
    savepoints = rng.randint(3, 5)
    cuts = sorted(rng.sample(range(1, steps), savepoints - 1))
    counts = [b - a for a, b in zip([0] + cuts, cuts + [steps])]
    who = (f"seed {seed}{' (benign)' if benign else ''}, backend {ovl.backend}, "
           f"{'root' if ROOT else 'uid %d' % os.getuid()}")
    log, sid = [], None
    for sp, count in enumerate(counts):
        cmd = [sys.executable, step_py, str(seed), str(sp), str(count)] + (
            ["benign"] if benign else [])
        if sid is None:
            proc = ovl("run", "-t", target, "--", *cmd, cwd=target)
            m = SESSION_RE.search(proc.out)
            assert m, f"{who}\nexit {proc.returncode}\n{proc.out}\n{proc.err}"
            sid = m.group(1)
        else:
            proc = ovl("exec", sid, "--", *cmd, cwd=target)
        assert proc.returncode == 0, f"{who}\nsavepoint {sp}\n{proc.out}\n{proc.err}\n{log}"
        log += parse_tagged(proc.out, "STEPLOG")
    history = "\n  ".join(log)
    who += f", session {sid}\nsteps:\n  {history}"
    proc = ovl("exec", sid, "--", sys.executable, dump_py, cwd=target)
    assert proc.returncode == 0, f"{who}\n{proc.out}\n{proc.err}"
    view = parse_tagged(proc.out, "DUMP")
    for args in (("diff", sid), ("diff", "--json", sid), ("log", sid)):
        p = ovl(*args)
        assert p.returncode == 0 and "Traceback" not in p.err, f"{who}\n{args}\n{p.out}\n{p.err}"
    p = ovl("diff", sid)
    assert p.returncode == 0, f"{who}\ndiff, a second time:\n{p.out}\n{p.err}"
    who += f"\ndiff:\n{p.out}"
    return sid, view, log, who


def assert_real_equals_view(target, dump_py, view, who):
    real = dump_real(target, dump_py)
    missing, extra, differ = compare(real, view)
    assert not (missing or extra or differ), (
        f"{who}\nthe real tree after commit differs from the session's last view\n"
        f"missing after commit: {json.dumps({k: view[k] for k in missing})}\n"
        f"extra after commit: {extra}\n"
        f"differ: {json.dumps(differ, indent=1)}\n"
        f"(`.wh.` names in view: {keys_named(view, is_wh)})")


@pytest.mark.parametrize("seed", seeds(), ids=lambda s: f"seed{s}")
def test_commit_equals_last_view(home, backend, tmp_path, scripts, seed):
    dump_py = scripts[1]
    ovl = Ovl(home, backend)
    target = base_tree(tmp_path / "tree")
    before = dump_real(target, dump_py)
    sid, view, log, who = drive(ovl, target, scripts, seed)
    diff = who.rpartition("\ndiff:\n")[2]

    # (as an ordinary user an ACL id the user namespace cannot map reads as -1 in the view)
    must, may = privileged_additions(unmapped_acl_ids(before), unmapped_acl_ids(view))
    # on fuse a `.wh.` name the command made cannot be replayed faithfully: commit may refuse
    wh_made = backend == "fuse" and any(line.split(" ", 2)[1] == "wh" for line in log)
    # fuse-overlayfs shows a hard link split across savepoints as either copy: commit may
    # refuse it (naming a hard link) rather than guess
    split_links = backend == "fuse" and any(
        line.split(" ")[1] == "link" or line.split(" ")[1:3] == ["wh", "link"] for line in log)
    # an overlay-reserved xattr name the command set (user.overlay.*) would mean something to
    # the next overlay that meets it: commit may refuse it, naming it
    overlay_x = any(line.split(" ")[1:2] == ["setxattr"] and
                    line.split(" ")[2].startswith("user.overlay.") for line in log)
    if backend == "kernel":
        assert "invalid-whiteout" not in diff, (
            f"{who}\non the kernel backend a `.wh.` name is an ordinary entry")

    snap, real_before = stat_snapshot(target), dump_real(target, dump_py)
    assert real_before == before, f"{who}\nthe real tree changed before commit"
    plain = ovl("commit", sid)
    if plain.returncode != 0:
        line = assert_one_refusal(plain, who)
        assert stat_snapshot(target) == snap and dump_real(target, dump_py) == before, (
            f"{who}\na refused commit changed the real tree: {line}")
        assert must or may or wh_made or split_links or overlay_x, (
            f"{who}\ncommit refused a session that adds nothing privileged and holds no "
            f"`.wh.` name: {line}")
        if FLAG in line:
            # (a `.wh.` name on fuse can hide from the view what the layers still hold)
            assert must or may or wh_made, (
                f"{who}\nrefused as privileged, but nothing is: {line}\n"
                f"{entries_named(line, before, view)}")
        elif not (wh_made or split_links and "hard link" in line or
                  overlay_x and "overlay xattr" in line):
            pytest.fail(f"{who}\nrefusal names neither {FLAG} nor a `.wh.` name: {line}")
        if must and not (wh_made or split_links):
            # the line names the first privileged addition (of those that must or may be)
            reasons = {why for _, why in must + may}
            assert FLAG in line and any(r in line for r in reasons), (
                f"{who}\nthe refusal must name why ({sorted(reasons)}): {line}")
        flagged = ovl("commit", sid, FLAG)
        if flagged.returncode != 0:
            line2 = assert_one_refusal(flagged, who)
            assert stat_snapshot(target) == snap and dump_real(target, dump_py) == before, (
                f"{who}\na refused commit changed the real tree: {line2}")
            if split_links and "hard link" in line2 or overlay_x and "overlay xattr" in line2:
                return
            assert wh_made, f"{who}\ncommit {FLAG} refused: {line2}"
            assert "wh" in line2 or "whiteout" in line2, (
                f"{who}\nthe refusal must name the `.wh.` name and why: {line2}")
            return
    else:
        assert not must, (
            f"{who}\ncommit landed privileged additions without {FLAG}: {must}")
    assert_real_equals_view(target, dump_py, view, who)


BENIGN_SEEDS = [5, 8, 13, 21]


@pytest.mark.parametrize("seed", BENIGN_SEEDS, ids=lambda s: f"seed{s}")
def test_benign_sequences_commit_without_refusal(home, backend, tmp_path, scripts, seed):
    """Renames, hard links, chmod, xattr set/remove, FIFOs, file<->dir swaps over 3-5
    savepoints, nothing privileged, nothing outside touching the tree: commit (without any
    flag) must succeed and land exactly the last view."""
    dump_py = scripts[1]
    ovl = Ovl(home, backend)
    target = base_tree(tmp_path / "tree", benign=True)
    sid, view, log, who = drive(ovl, target, scripts, seed, benign=True)
    snap = stat_snapshot(target)
    proc = ovl("commit", sid)
    if proc.returncode != 0:
        line = assert_one_refusal(proc, who)
        assert stat_snapshot(target) == snap, f"{who}\na refused commit changed the tree"
        if backend == "fuse" and "hard link" in line:
            return      # fuse-overlayfs showed either copy of a split hard link: refused
        pytest.fail(f"{who}\ncommit refused a benign session: {line}")
    assert_real_equals_view(target, dump_py, view, who)


# -- minimal reproductions of what the random driver found ------------------------------------

def commit_two_savepoints(ovl, target, first, second):
    """`run` the first script, `exec` the second, then commit: each step must succeed."""
    sid, proc = ovl.sh(target, first)
    assert sid, (proc.out, proc.err)
    proc = ovl("exec", sid, "--", "sh", "-c", second)
    assert proc.returncode == 0, (proc.out, proc.err)
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)


@pytest.mark.parametrize("was", ["file", "fifo", "symlink"])
def test_dir_replacing_a_non_dir_then_written_again_is_not_drift(ovl, target, was):
    """A path that was a file/FIFO/symlink becomes a directory in one savepoint, and a later
    savepoint writes inside it: nothing outside moved, so commit must go through. (Found by
    seed 11: `modified-externally: fifo0`; seeds 23 and 41: `via a symlink: link/...`.)"""
    x = target / "x"
    if was == "file":
        x.write_text("x\n")
    elif was == "fifo":
        os.mkfifo(x)
    else:
        os.symlink("sub", x)
    commit_two_savepoints(ovl, target, "rm x && mkdir x && echo i > x/i",
                          "echo j > x/j && rm x/i && echo k > x/k")
    assert os.path.isdir(x) and not os.path.islink(x)
    assert sorted(os.listdir(x)) == ["j", "k"]
    assert (target / "sub" / "a.txt").read_text() == "a\n"


def test_removal_under_a_dir_that_replaced_a_symlink_is_not_refused(ovl, target):
    """A no-op whiteout under a directory that replaced a symlink names a real path only
    through that symlink: it is not a change, so commit must not refuse `via a symlink`."""
    os.symlink("sub", target / "link")
    commit_two_savepoints(ovl, target, "rm link && mkdir link && echo f > link/f && echo g > link/g",
                          "mv link/f moved")
    assert os.listdir(target / "link") == ["g"] and not os.path.islink(target / "link")
    assert (target / "moved").read_text() == "f\n"
    assert sorted(os.listdir(target / "sub")) == ["a.txt"]


VIEW_PY = r"""
import os
out = {}
for name in sorted(os.listdir(".")):
    if os.path.isfile(name):
        out[name] = (open(name).read(), sorted((n, os.getxattr(name, n)) for n in os.listxattr(name)
                                              if n.startswith("user.")))
print("VIEW", out)
"""


def test_hard_links_across_savepoints_commit_what_the_command_saw(ovl, tmp_path):
    """Hard links made in one savepoint, one name written in the next: the names the last
    command sees are what commit lands. (Found by benign seeds 5 and 13 on fuse, where
    fuse-overlayfs copies up a hard-linked file under whichever name it met first.)"""
    t = tmp_path / "hl"
    t.mkdir()
    sid, proc = ovl.sh(t, "echo one > a")
    assert sid, (proc.out, proc.err)
    for script in ('ln a b && ln a "c c" && setfattr -n user.k -v 1 a',
                   "echo two >> a && setfattr -x user.k b"):
        proc = ovl("exec", sid, "--", "sh", "-c", script)
        assert proc.returncode == 0, (script, proc.out, proc.err)
    proc = ovl("exec", sid, "--", sys.executable, "-c", VIEW_PY, cwd=t)
    assert proc.returncode == 0, (proc.out, proc.err)
    seen = proc.out.split("VIEW ", 1)[1].splitlines()[0]
    before = tree(t)
    proc = ovl("commit", sid)
    if proc.returncode != 0 and ovl.backend == "fuse":
        # refusing is honest where fuse-overlayfs shows either copy; landing one is not
        line = proc.err.strip()
        assert proc.returncode == 1 and line.count("\n") == 0 and "hard link" in line, proc.err
        assert tree(t) == before
        return
    assert proc.returncode == 0, (proc.out, proc.err)
    real = subprocess.run([sys.executable, "-c", VIEW_PY], cwd=t, capture_output=True,
                          text=True, check=True).stdout.split("VIEW ", 1)[1].splitlines()[0]
    assert real == seen, f"the command saw {seen}\ncommit left  {real}"


@pytest.mark.parametrize("mode", [0o444, 0o000, 0o500], ids=lambda m: f"{m:04o}")
def test_commit_of_a_chmod_that_takes_away_write(ovl, target, mode):
    """chmod of a real-tree file to a mode without owner write: commit must land it (as an
    ordinary user, removing overlay's own xattrs from the layer copy needs write access)."""
    sid, proc = ovl.sh(target, f"chmod {mode:o} hello.txt sub/a.txt")
    assert sid, (proc.out, proc.err)
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    for p in (target / "hello.txt", target / "sub" / "a.txt"):
        assert stat.S_IMODE(os.lstat(p).st_mode) == mode
        assert os.listxattr(p) == []
    os.chmod(target / "hello.txt", 0o644)
    assert (target / "hello.txt").read_text() == "hello\n"


def test_an_entry_removed_in_a_new_dir_stays_gone_for_later_commands(ovl, target):
    """A directory made in one savepoint, an entry of it removed in the next: every later
    command sees it gone (found by seeds 101 and 107 on the kernel backend, where the
    flattened lower showed the whiteout as a `c?????????` entry that cannot be opened)."""
    sid, proc = ovl.sh(target, "mkdir n && echo x > n/f && echo y > n/g")
    assert sid, (proc.out, proc.err)
    proc = ovl("exec", sid, "--", "rm", "n/f")
    assert proc.returncode == 0, (proc.out, proc.err)
    for _ in range(2):
        proc = ovl("exec", sid, "--", sys.executable, "-c",
                   "import os; print('LIST', sorted(os.listdir('n')))", cwd=target)
        assert proc.returncode == 0, (proc.out, proc.err)
        assert "LIST ['g']" in proc.out, proc.out
    proc = ovl("exec", sid, "--", "sh", "-c", "rm -r n && mkdir n && echo z > n/z")
    assert proc.returncode == 0, (proc.out, proc.err)
    proc = ovl("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert os.listdir(target / "n") == ["z"]
