"""The pivot_root jail, described as data and applied by one executor.

`plan()` builds the list of setup operations in the caller (and validates all of it before
the first mount); `build()` runs inside the command's new mount namespace, after the overlay
is mounted over the target, and ends with pivot_root into a fresh tmpfs root that holds:

  /usr /bin /sbin /lib* /etc /opt    the host's, read-only (every submount too, locked
                                     flags kept), /etc/shadow and friends masked empty
  /tmp /dev/shm                      private tmpfs
  /proc                              a private proc for the command's PID namespace, its
                                     kernel knobs (/proc/sys, sysrq-trigger, ...) read-only
  /dev                               null zero full random urandom tty, a private pts
  <target>                           the overlay, read-write, at its real path
  <the target's external git dirs>   a linked worktree's or submodule's git directory
                                     outside the target, read-only (txn/gitdir.py)
  /tmp/.gitconfig                    the operator's git user.name/email and safe.directory
                                     for the target (gitdir.jail_config)

Nothing else exists: not $HOME, /root, /mnt, /media, /srv, /run, the host's /tmp (so no
host unix socket), nor OVERLORD_HOME with its records and layers.
"""
import dataclasses
import os

from overlord.errors import OverlordError
from overlord.linux import libc
from overlord.txn import gitdir

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
MASKED = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
          "/etc/security/opasswd")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
RESERVED = SYSTEM_DIRS + ("/proc", "/dev", "/sys")
CONSOLE = "/dev/console"     # where a shell's pty appears inside the jail
# what host uid 0 could write (or read) in /proc without any capability; the rest is
# capability-checked, and the command has none
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
PROC_MASKED = ("timer_list", "sched_debug")
RO = libc.MOUNT_ATTR_RDONLY | libc.MOUNT_ATTR_NOSUID | libc.MOUNT_ATTR_NODEV


@dataclasses.dataclass
class Op:
    kind: str         # ro-bind | symlink | mask | tmpfs | proc | dev | bind | ro-bind-file | file
    dest: str
    src: str = None   # (file: its text)


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan(target, net="host", tty=None):
    """The jail's setup operations for a target; refuses what it could not honour."""
    if any(_inside(target, d) for d in RESERVED):
        raise OverlordError(f"cannot jail a target inside a system directory: {target}")
    ops = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            ops.append(Op("symlink", d, os.readlink(d)))
        elif os.path.isdir(d):
            ops.append(Op("ro-bind", d, d))
    ops += [Op("mask", m) for m in MASKED if os.path.isfile(m) and not os.path.islink(m)]
    ops += [Op("tmpfs", "/tmp"), Op("proc", "/proc"), Op("dev", "/dev", tty)]
    if net == "host":         # none and proxy need no resolver: a proxy resolves in its back
        resolver = _resolver_outside_etc()
        if resolver:
            ops.append(Op("ro-bind-file", resolver, resolver))
    ops.append(Op("bind", target, target))
    ops += _git_ops(target)
    for op in ops:
        if not os.path.isabs(op.dest) or os.path.normpath(op.dest) != op.dest:
            raise OverlordError(f"jail: not a clean absolute path: {op.dest}")
    return ops


def _git_ops(target):
    """The git directories a target keeps outside itself (a linked worktree's git dir and
    common dir, a submodule's git dir), read-only at their real paths, so git status/log/diff
    work and a write fails (EROFS) -- never the host's git dir written from the session; and
    the jail's global git config ($HOME=/tmp), see gitdir.jail_config."""
    out = []
    for d in gitdir.binds(target):
        if any(_inside(d, s) for s in SYSTEM_DIRS):
            continue                  # the system trees are read-only in the jail already
        if d == "/" or any(_inside(d, r) for r in RESERVED):
            raise OverlordError(f"cannot jail a target whose git directory is {d}")
        out.append(Op("ro-bind", d, d))
    out.append(Op("file", "/tmp/.gitconfig", gitdir.jail_config(target)))
    return out


def _resolver_outside_etc():
    """/etc/resolv.conf as a symlink out of /etc (systemd-resolved, WSL2): its real file."""
    link = "/etc/resolv.conf"
    if not os.path.islink(link):
        return None
    real = os.path.realpath(link)
    if any(_inside(real, d) for d in SYSTEM_DIRS) or not os.path.isfile(real):
        return None
    return real


def _mkdirs(path):
    os.makedirs(path, mode=0o755, exist_ok=True)


def _touch(path):
    _mkdirs(os.path.dirname(path))
    if not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def build(ops, newroot):
    """Inside the command's mount namespace: assemble the jail and pivot_root into it."""
    libc.mount("tmpfs", newroot, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, "mode=0755,size=1m")
    root = lambda p: newroot + p  # noqa: E731
    empty = root("/.ovl-empty")
    _touch(empty)
    for op in ops:
        dest = root(op.dest)
        if op.kind == "symlink":
            os.symlink(op.src, dest)
        elif op.kind == "ro-bind":
            _mkdirs(dest)
            libc.mount(op.src, dest, None, libc.MS_BIND | libc.MS_REC)
            _readonly(dest)
        elif op.kind == "ro-bind-file":
            _touch(dest)
            libc.mount(op.src, dest, None, libc.MS_BIND)
            _readonly(dest)
        elif op.kind == "mask":
            libc.mount(empty, dest, None, libc.MS_BIND)
            _readonly(dest)
        elif op.kind == "tmpfs":
            _mkdirs(dest)
            libc.mount("tmpfs", dest, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, "mode=1777")
        elif op.kind == "proc":
            _build_proc(dest, empty)
        elif op.kind == "dev":
            _build_dev(dest, op.src)
        elif op.kind == "bind":
            _mkdirs(dest)
            libc.mount(op.src, dest, None, libc.MS_BIND | libc.MS_REC)
        elif op.kind == "file":         # a small file of the jail's own (on its /tmp)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, op.src.encode("utf-8", "surrogateescape"))
            finally:
                os.close(fd)
    os.unlink(empty)
    # the root itself is read-only too: nothing can be created beside the jail's mounts
    libc.mount(None, newroot, None, libc.MS_REMOUNT | libc.MS_BIND | libc.MS_RDONLY |
               libc.MS_NOSUID | libc.MS_NODEV)
    os.chdir(newroot)
    libc.pivot_root(".", ".")
    libc.umount2(".", libc.MNT_DETACH)      # the old root, stacked under the new one
    os.chdir("/")


def _readonly(path):
    """Read-only (and nosuid, nodev), recursively, keeping every flag the kernel locked."""
    try:
        libc.mount_setattr_recursive(path, RO)
    except OSError as exc:
        if exc.errno != 38:     # ENOSYS: a kernel before 5.12
            raise
        _readonly_by_remount(path)


def _readonly_by_remount(path):
    """Remount each mount at or under path read-only, repeating the flags it already has."""
    flag_names = {"nosuid": libc.MS_NOSUID, "nodev": libc.MS_NODEV, "noexec": libc.MS_NOEXEC}
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        rows = [line.split() for line in f]
    for row in rows:
        point = row[4].encode().decode("unicode_escape")
        if not _inside(point, path):
            continue
        flags = libc.MS_REMOUNT | libc.MS_BIND | libc.MS_RDONLY
        for opt in row[5].split(","):
            flags |= flag_names.get(opt, 0)
        libc.mount(None, point, None, flags | libc.MS_NOSUID | libc.MS_NODEV)


def _build_proc(proc, empty):
    """A private /proc whose kernel knobs are read-only. As root the command is host uid 0
    (without capabilities): files like /proc/sys/kernel/core_pattern or /proc/sysrq-trigger
    check only that uid, so they must not be writable at all."""
    _mkdirs(proc)
    libc.mount("proc", proc, "proc", libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC)
    for name in PROC_READONLY:
        path = f"{proc}/{name}"
        if os.path.lexists(path):
            libc.mount(path, path, None, libc.MS_BIND | libc.MS_REC)
            _readonly(path)
    for name in PROC_MASKED:
        path = f"{proc}/{name}"
        if os.path.isfile(path):
            libc.mount(empty, path, None, libc.MS_BIND)
            _readonly(path)


def _build_dev(dev, tty):
    _mkdirs(dev)
    libc.mount("tmpfs", dev, "tmpfs", libc.MS_NOSUID | libc.MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        _touch(f"{dev}/{name}")
        libc.mount(f"/dev/{name}", f"{dev}/{name}", None, libc.MS_BIND)
    if tty:
        _touch(dev + "/console")
        libc.mount(tty, dev + "/console", None, libc.MS_BIND)
    _mkdirs(dev + "/pts")
    libc.mount("devpts", dev + "/pts", "devpts", libc.MS_NOSUID | libc.MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=0620")
    os.symlink("pts/ptmx", dev + "/ptmx")
    _mkdirs(dev + "/shm")
    libc.mount("tmpfs", dev + "/shm", "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, "mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    libc.mount(None, dev, None, libc.MS_REMOUNT | libc.MS_RDONLY | libc.MS_NOSUID | libc.MS_NOEXEC,
               "mode=0755,size=64k")
