"""A seccomp filter in classic BPF, built in Python and loaded through ctypes.

The filter checks the architecture first (a foreign ABI is killed), refuses x32 syscall
numbers on x86_64, answers clone3 with ENOSYS so callers fall back to clone (whose flags a
classic filter can read), refuses namespace-creating clone flags, TIOCSTI/TIOCLINUX ioctls,
overlay whiteouts (mknod/mknodat of a 0/0 character device, renameat2 RENAME_WHITEOUT: any user
may make one, and in a layer it reads as a deletion) and the listed syscalls with EPERM, and
allows everything else.
"""
import ctypes
import errno
import os
import struct


# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
OFF_NR, OFF_ARCH, OFF_ARGS = 0, 4, 16

BPF_LD_W_ABS = 0x20        # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15           # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x35           # BPF_JMP | BPF_JGE | BPF_K
BPF_JSET_K = 0x45          # BPF_JMP | BPF_JSET | BPF_K
BPF_AND_K = 0x54           # BPF_ALU | BPF_AND | BPF_K
BPF_RET_K = 0x06           # BPF_RET | BPF_K

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_SET_MODE_FILTER = 1
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

X32_SYSCALL_BIT = 0x40000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
S_IFMT, S_IFCHR = 0o170000, 0o020000
RENAME_WHITEOUT = 1 << 2
NS_CLONE_FLAGS = (0x00020000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x08000000 |
                  0x04000000 | 0x02000000 | 0x00000080)   # NEWNS USER PID NET IPC UTS CGROUP TIME

ARCHES = {
    "x86_64": {"audit": 0xC000003E, "seccomp": 317, "numbers": {
        "ioctl": 16, "clone": 56, "ptrace": 101, "syslog": 103, "pivot_root": 155,
        "chroot": 161, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167,
        "swapoff": 168, "reboot": 169, "init_module": 175, "delete_module": 176,
        "quotactl": 179, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
        "unshare": 272, "perf_event_open": 298, "open_by_handle_at": 304, "setns": 308,
        "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
        "mknod": 133, "mknodat": 259, "renameat2": 316}},
    "aarch64": {"audit": 0xC00000B7, "seccomp": 277, "numbers": {
        "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51,
        "quotactl": 60, "acct": 89, "unshare": 97, "kexec_load": 104, "init_module": 105,
        "delete_module": 106, "syslog": 116, "ptrace": 117, "reboot": 142, "add_key": 217,
        "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225,
        "perf_event_open": 241, "open_by_handle_at": 265, "setns": 268, "finit_module": 273,
        "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294, "mknodat": 33,
        "renameat2": 276}},
}
# Numbers shared by every architecture (the syscall table was unified from 424 on).
COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
          "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
          "fspick": 433, "clone3": 435, "mount_setattr": 442, "quotactl_fd": 443}

DENIED = ("mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf", "keyctl",
          "add_key", "request_key", "init_module", "finit_module", "delete_module", "kexec_load",
          "kexec_file_load", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "open_by_handle_at", "perf_event_open", "userfaultfd", "reboot", "swapon", "swapoff",
          "acct", "quotactl", "quotactl_fd", "syslog", "open_tree", "move_mount", "fsopen",
          "fsconfig", "fsmount", "fspick", "mount_setattr")


def _stmt(code, k):
    return (code, 0, 0, k)


def _jump(code, k, jt, jf):
    """A conditional jump: jt and jf are offsets, or the names of labels placed later."""
    return (code, jt, jf, k)


def _arg(i):
    """Offset of the low 32 bits of syscall argument i (every supported ABI is little-endian).
    The kernel truncates int, unsigned and umode_t arguments to their low bits, so the low
    word is what it acts on; the high word of such an argument is never looked at."""
    return OFF_ARGS + 8 * i


def _mknod_whiteout(nr, mode_arg, dev_arg):
    """mknod/mknodat of a character device numbered 0 (an overlay whiteout): EPERM. FIFOs,
    sockets, regular files and other devices go on to the kernel's own checks."""
    return [_jump(BPF_JEQ_K, nr, 0, 5),
            _stmt(BPF_LD_W_ABS, _arg(mode_arg)),
            _stmt(BPF_AND_K, S_IFMT),
            _jump(BPF_JEQ_K, S_IFCHR, 0, "allow"),
            _stmt(BPF_LD_W_ABS, _arg(dev_arg)),       # dev is `unsigned int` to the kernel
            _jump(BPF_JEQ_K, 0, "eperm", "allow")]


def build(allow_ptrace=False, machine=None):
    """The filter program as a list of (code, jt, jf, k) instructions."""
    machine = machine or os.uname().machine       # platform.machine(), unimported
    if machine not in ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for architecture {machine}")
    arch = ARCHES[machine]
    nums = dict(arch["numbers"], **COMMON)
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    enosys = SECCOMP_RET_ERRNO | errno.ENOSYS
    denied = [nums[name] for name in DENIED] + ([] if allow_ptrace else [nums["ptrace"]])

    prog = [_stmt(BPF_LD_W_ABS, OFF_ARCH),
            _jump(BPF_JEQ_K, arch["audit"], 1, 0),
            _stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
            _stmt(BPF_LD_W_ABS, OFF_NR)]
    if machine == "x86_64":
        prog += [_jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1), _stmt(BPF_RET_K, eperm)]
    for nr in denied:
        prog += [_jump(BPF_JEQ_K, nr, 0, 1), _stmt(BPF_RET_K, eperm)]
    prog += [_jump(BPF_JEQ_K, nums["clone3"], 0, 1), _stmt(BPF_RET_K, enosys)]
    # Each block below matches one syscall number (else it skips to the next block, the
    # accumulator still holding the number); once matched it loads arguments, so it ends
    # in "eperm" or "allow".
    # clone: the flags are the first argument (its low 32 bits hold every CLONE_NEW* flag)
    prog += [_jump(BPF_JEQ_K, nums["clone"], 0, 2),
             _stmt(BPF_LD_W_ABS, _arg(0)),
             _jump(BPF_JSET_K, NS_CLONE_FLAGS, "eperm", "allow")]
    # ioctl: the request is the second argument, an unsigned int
    prog += [_jump(BPF_JEQ_K, nums["ioctl"], 0, 3),
             _stmt(BPF_LD_W_ABS, _arg(1)),
             _jump(BPF_JEQ_K, TIOCSTI, "eperm", 0),
             _jump(BPF_JEQ_K, TIOCLINUX, "eperm", "allow")]
    # whiteouts: mknod(path, mode, dev), mknodat(dirfd, path, mode, dev), and
    # renameat2(olddirfd, old, newdirfd, new, flags) with RENAME_WHITEOUT
    if "mknod" in nums:
        prog += _mknod_whiteout(nums["mknod"], 1, 2)
    prog += _mknod_whiteout(nums["mknodat"], 2, 3)
    prog += [_jump(BPF_JEQ_K, nums["renameat2"], 0, 2),
             _stmt(BPF_LD_W_ABS, _arg(4)),
             _jump(BPF_JSET_K, RENAME_WHITEOUT, "eperm", "allow")]
    prog += [_stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
             ("label", "eperm"), _stmt(BPF_RET_K, eperm),
             ("label", "allow"), _stmt(BPF_RET_K, SECCOMP_RET_ALLOW)]
    prog = _resolve(prog)
    _check_jumps(prog)
    return prog


def _resolve(prog):
    """Replace label names in jumps by offsets; drop the labels."""
    at, out = {}, []
    for ins in prog:
        if ins[0] == "label":
            at[ins[1]] = len(out)
        else:
            out.append(ins)
    for i, (code, jt, jf, k) in enumerate(out):
        jt, jf = (at[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise AssertionError(f"seccomp program jump out of range at {i}")
        out[i] = (code, jt, jf, k)
    return out


def _check_jumps(prog):
    for i, (code, jt, jf, _k) in enumerate(prog):
        if code & 0x07 == 0x05 and i + 1 + max(jt, jf) >= len(prog):   # BPF_JMP class
            raise AssertionError(f"seccomp program jumps past its end at {i}")


def encode(prog):
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
