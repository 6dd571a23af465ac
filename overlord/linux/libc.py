"""ctypes wrappers over the few syscalls OVERLORD needs.

This module is the only place that touches libc. Every wrapper checks the return value and
raises OSError(errno, "what failed", object). Constants keep the kernel's names.
"""
import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUTS = 0x04000000
CLONE_PARENT = 0x00008000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19

MNT_DETACH = 2

FSOPEN_CLOEXEC = 1
FSMOUNT_CLOEXEC = 1
FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
MOVE_MOUNT_F_EMPTY_PATH = 0x00000004
AT_FDCWD = -100

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# The new mount API has one syscall number on every architecture.
SYS_fsopen = 430
SYS_fsconfig = 431
SYS_fsmount = 432
SYS_move_mount = 429

_libc = None


def libc():
    global _libc
    if _libc is None:
        # find_library() may spawn ldconfig: never on the per-command path
        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            from ctypes.util import find_library
            _libc = ctypes.CDLL(find_library("c"), use_errno=True)
        _libc.syscall.restype = ctypes.c_long
        _libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return _libc


def _check(ret, what, obj=None):
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", obj)
    return ret


def _b(s):
    return None if s is None else os.fsencode(s)


def unshare(flags):
    _check(libc().unshare(ctypes.c_int(flags)), "unshare")


def mount(source, target, fstype, flags=0, data=None):
    _check(libc().mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
           "mount", target)


def setns(fd, nstype):
    """Join the namespaces nstype names of the process a pidfd refers to (or one namespace
    through an nsfs fd). Joining a user namespace needs a single-threaded caller."""
    _check(libc().setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def set_name(name):
    """The thread's comm (what ps and /proc/<pid>/comm show), at most 15 bytes."""
    buf = ctypes.create_string_buffer(os.fsencode(name)[:15])
    _check(libc().prctl(PR_SET_NAME, ctypes.cast(buf, ctypes.c_void_p).value or 0, 0, 0, 0),
           "prctl")


def umount2(target, flags=0):
    _check(libc().umount2(_b(target), ctypes.c_int(flags)), "umount", target)


def prctl(option, arg2=0, arg3=0, arg4=0, arg5=0):
    return _check(libc().prctl(option, arg2, arg3, arg4, arg5), "prctl")


MACHINE = os.uname().machine     # what platform.machine() says, without importing platform
SYS_clone = {"x86_64": 56, "aarch64": 220}.get(MACHINE)
SIGCHLD = 17
_pylibc = None


def clone_namespaces(flags):
    """fork() into new namespaces in one step: returns 0 in the child, its pid in the parent.

    Called through PyDLL so the GIL stays held across the syscall: no other thread can own it
    in the child's copy. Only call from a process that has a single thread at that moment.
    """
    global _pylibc
    if SYS_clone is None:
        raise OSError(38, "clone: unsupported architecture " + MACHINE)
    if _pylibc is None:
        _pylibc = ctypes.PyDLL("libc.so.6", use_errno=True)
        _pylibc.syscall.restype = ctypes.c_long
    zero = ctypes.c_ulong(0)
    return _check(_pylibc.syscall(ctypes.c_long(SYS_clone), ctypes.c_ulong(flags | SIGCHLD),
                                  zero, zero, zero, zero), "clone")


def _syscall(nr, *args):
    return libc().syscall(ctypes.c_long(nr), *args)


def fsopen(fstype):
    return _check(_syscall(SYS_fsopen, _b(fstype), ctypes.c_uint(FSOPEN_CLOEXEC)), "fsopen", fstype)


def fsconfig(fd, cmd, key=None, value=None, aux=0):
    _check(_syscall(SYS_fsconfig, ctypes.c_int(fd), ctypes.c_uint(cmd), _b(key), _b(value),
                    ctypes.c_int(aux)), f"fsconfig {key}", value)


def fsmount(fd, attr_flags=0):
    return _check(_syscall(SYS_fsmount, ctypes.c_int(fd), ctypes.c_uint(FSMOUNT_CLOEXEC),
                           ctypes.c_uint(attr_flags)), "fsmount")


def move_mount_fd(mfd, target):
    _check(_syscall(SYS_move_mount, ctypes.c_int(mfd), b"", ctypes.c_int(AT_FDCWD), _b(target),
                    ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)), "move_mount", target)


SYS_capset = {"x86_64": 126, "aarch64": 91}.get(MACHINE)
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def capset_zero_args():
    """The arguments for capset_zero, built ahead of time."""
    return (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0), (ctypes.c_uint32 * 6)()


def capset_zero(args=None):
    """Empty the effective, permitted and inheritable capability sets of this thread."""
    header, data = args or capset_zero_args()
    _check(_syscall(SYS_capset, header, data), "capset")


def cap_last_cap():
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


SYS_pivot_root = {"x86_64": 155, "aarch64": 41}.get(MACHINE)
SYS_mount_setattr = 442
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x00000001
MOUNT_ATTR_NOSUID = 0x00000002
MOUNT_ATTR_NODEV = 0x00000004


def pivot_root(new_root, put_old):
    _check(_syscall(SYS_pivot_root, _b(new_root), _b(put_old)), "pivot_root", new_root)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mount_setattr_recursive(path, attr_set):
    """Set mount attributes on a mount and every mount below it, keeping all others (so
    flags the kernel locked stay as they are)."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    _check(_syscall(SYS_mount_setattr, ctypes.c_int(AT_FDCWD), _b(path), ctypes.c_uint(AT_RECURSIVE),
                    ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), "mount_setattr", path)


SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up():
    """Bring up 'lo' in this (new, empty) network namespace."""
    import fcntl
    import socket
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def own_environ_and_argv_blocks():
    """[(address, size)] of this process's environment and argument blocks (a forked copy
    has them at the same addresses)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    # after the comm field: arg_start is field 48, arg_end 49, env_start 50, env_end 51
    arg_start, arg_end, env_start, env_end = (int(fields[i - 3]) for i in (48, 49, 50, 51))
    return [(s, e - s) for s, e in ((env_start, env_end), (arg_start, arg_end)) if 0 < s < e]


def machine():
    return MACHINE


def syncfs(path):
    """Flush the whole filesystem holding path: one call per commit phase instead of an
    fsync per file."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if libc().syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
