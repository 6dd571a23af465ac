"""ctypes wrappers over the few syscalls OVERLORD needs.

This module is the only place that touches libc. Every wrapper checks the return value and
raises OSError(errno, "what failed", object). Constants keep the kernel's names.
"""
import ctypes
import ctypes.util
import os
import platform

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUTS = 0x04000000

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
            _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.syscall.restype = ctypes.c_long
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


def umount2(target, flags=0):
    _check(libc().umount2(_b(target), ctypes.c_int(flags)), "umount", target)


def prctl(option, arg2=0, arg3=0, arg4=0, arg5=0):
    return _check(libc().prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                               ctypes.c_ulong(arg4), ctypes.c_ulong(arg5)), "prctl")


SYS_clone = {"x86_64": 56, "aarch64": 220}.get(platform.machine())
SIGCHLD = 17
_pylibc = None


def clone_namespaces(flags):
    """fork() into new namespaces in one step: returns 0 in the child, its pid in the parent.

    Called through PyDLL so the GIL stays held across the syscall: no other thread can own it
    in the child's copy. Only call from a process that has a single thread at that moment.
    """
    global _pylibc
    if SYS_clone is None:
        raise OSError(38, "clone: unsupported architecture " + platform.machine())
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


SYS_capset = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def capset_zero():
    """Empty the effective, permitted and inheritable capability sets of this thread."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_syscall(SYS_capset, header, data), "capset")


def cap_last_cap():
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def machine():
    return platform.machine()
