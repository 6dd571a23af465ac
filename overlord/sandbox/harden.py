"""Hardening applied to the process that starts a command, so the command inherits it:
ambient capabilities cleared, the bounding set dropped, no_new_privs, a seccomp filter, and
every capability set emptied. After this no exec — not even of a setuid binary or as uid 0
in the namespace — can gain a capability."""
import errno

from overlord.linux import libc, seccomp

_filters = {}


def filter_bytes(allow_ptrace):
    """The encoded seccomp program (built once per process, before any fork)."""
    if allow_ptrace not in _filters:
        _filters[allow_ptrace] = seccomp.encode(seccomp.build(allow_ptrace=allow_ptrace))
    return _filters[allow_ptrace]


def apply(filter_code):
    """Run in the starter process after its mounts. Raises OSError on failure."""
    libc.prctl(libc.PR_CAP_AMBIENT, libc.PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in range(libc.cap_last_cap() + 1):
        try:
            libc.prctl(libc.PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != errno.EPERM:     # EPERM: no CAP_SETPCAP here (fuse, unprivileged)
                raise
            break
    libc.prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
    seccomp.install(filter_code)
    libc.capset_zero()
