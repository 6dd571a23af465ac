"""Hardening applied to the process that starts a command, so the command inherits it:
ambient capabilities cleared, the bounding set dropped, no_new_privs, a seccomp filter, and
every capability set emptied. After this no exec — not even of a setuid binary or as uid 0
in the namespace — can gain a capability.

Everything is prepared in the caller, before it forks: the child only makes the syscalls
(the per-command path must cost microseconds here, not a Python warm-up).
"""
import ctypes
import errno

from overlord.linux import libc, seccomp

_cache = {}


class Hardening:
    def __init__(self, allow_ptrace):
        code = seccomp.encode(seccomp.build(allow_ptrace=allow_ptrace))
        self.last_cap = libc.cap_last_cap()
        self.filter = ctypes.create_string_buffer(code, len(code))
        self.fprog = seccomp.SockFprog(len(code) // 8, ctypes.cast(self.filter, ctypes.c_void_p))
        self.fprog_addr = ctypes.addressof(self.fprog)
        self.capset_args = libc.capset_zero_args()
        self.scrub_blocks = libc.own_environ_and_argv_blocks()

    def apply(self):
        """Run in the starter process after its mounts. Raises OSError on failure."""
        prctl = libc.prctl
        prctl(libc.PR_CAP_AMBIENT, libc.PR_CAP_AMBIENT_CLEAR_ALL)
        for cap in range(self.last_cap + 1):
            try:
                prctl(libc.PR_CAPBSET_DROP, cap)
            except OSError as exc:
                if exc.errno != errno.EPERM:   # EPERM: no CAP_SETPCAP here (fuse, unprivileged)
                    raise
                break
        prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
        prctl(seccomp.PR_SET_SECCOMP, seccomp.SECCOMP_MODE_FILTER, self.fprog_addr)
        libc.capset_zero(self.capset_args)

    def scrub(self):
        """We are a copy of the caller: zero our copy of its environment and command line,
        so /proc/<pid>/environ and cmdline show nothing of them. (Callers also make the
        process non-dumpable, which closes environ to processes of the same uid.)"""
        for start, size in self.scrub_blocks:
            ctypes.memset(start, 0, size)


def prepare(allow_ptrace=False):
    """The hardening for a command (cached per process: the filter is built once)."""
    if allow_ptrace not in _cache:
        _cache[allow_ptrace] = Hardening(allow_ptrace)
    return _cache[allow_ptrace]
