"""Where OVERLORD finds the programs it runs itself on the host, outside any session:
fuse-overlayfs and fusermount3, git for a merge, openssl, bpftrace. Under the installed
launcher (which starts the engine isolated, -I -S) only in the system's own directories: a
program of the caller's earlier on PATH would otherwise run inside the launcher's AppArmor
profile (docs/INSTALL.md). From a checkout or a pip install, the caller's PATH, as any tool.
Commands in a session are the caller's own and are looked up on the session's PATH."""
import shutil
import sys

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def launched():
    """True when the installed launcher started this interpreter (-I -S)."""
    return bool(sys.flags.isolated and sys.flags.no_site)


def find(name):
    """The absolute path of `name`, or None."""
    return shutil.which(name, path=SYSTEM_PATH if launched() else None)
