"""Accounts' folders: OVERLORD_HOME/users/<name>/ (an account's ui.json, keys.json, memory.md).

The one rule for what an account's name is (a local name, or for single sign-on a lower-case
e-mail) and the only ways to reach its folder: made 0700 and refused when it is not a folder of
ours, read without following a link. Domain layer: trust/auth.py, agent/keys.py and
agent/memory.py use it; faces reach it through overlord.ops (ops/home.py).
"""
import errno
import os
import re
import stat

from overlord.errors import OverlordError, UsageError
from overlord.txn import store

LOCAL_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,31}")   # local accounts (fullmatch); never an "@"

# An account's name: a local name (LOCAL_NAME), or (single sign-on) a lower-cased e-mail.
# Either is one path component under users/ -- never "", ".", "..", a slash, a NUL or an
# upper-case letter.
_EMAIL = r"[a-z0-9!#$%&'*+=?^_`{|}~.-]{1,64}@[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"


def valid_user(name):
    """True when `name` is an account name users/<name>/ may be made of."""
    if not isinstance(name, str) or len(name) > 254 or name in (".", ".."):
        return False
    return LOCAL_NAME.fullmatch(name) is not None or re.fullmatch(_EMAIL, name) is not None


def user_dir(name):
    """OVERLORD_HOME/users/<name>/ for an account (not made). Any other name -- one with a
    slash, "..", upper case, a NUL, neither a local name nor a lower-case e-mail -- is refused
    (UsageError): no name leads outside users/."""
    if not valid_user(name):
        raise UsageError(f"not an account name: {name!r}")
    base = os.path.join(store.home(), "users")
    path = os.path.join(base, name)
    if os.path.dirname(path) != base:
        raise UsageError(f"not an account name: {name!r}")
    return path


def ensure_user_dir(name):
    """users/<name>/ (and users/), made mode 0700 when missing; returns its path. A name that is
    not an account name is refused (user_dir); a symlink, a non-directory or another user's
    directory there is refused (OverlordError) rather than written through."""
    where = user_dir(name)
    store.ensure_home()
    for d in (os.path.dirname(where), where):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OverlordError(f"refusing {d}: not a directory of yours")
    return where


def open_user_dir(name):
    """A descriptor of users/<name>/ for reading the account's files at it (os.open(file,
    ..., dir_fd=fd), O_NOFOLLOW), or None when the account has no folder yet. Neither users/
    nor users/<name> is followed through a symbolic link: a link, a non-directory or a folder
    another user owns there is refused (OverlordError, one line) -- users/bob -> alice never
    reads alice's keys or notes as bob's. The caller closes the descriptor."""
    where = user_dir(name)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = None
    for label, component in (("OVERLORD_HOME/users", None), (f"OVERLORD_HOME/users/{name}", name)):
        try:
            if component is None:
                nfd = os.open(os.path.dirname(where), flags)
            else:
                nfd = os.open(component, flags, dir_fd=fd)
        except FileNotFoundError:
            nfd = None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                if fd is not None:
                    os.close(fd)
                raise OverlordError(f"refusing {label}: not a directory of yours (a symbolic "
                                    "link or another file); nothing read through it") from None
            if fd is not None:
                os.close(fd)
            raise OverlordError(f"cannot read {label}: {exc.strerror}") from None
        if fd is not None:
            os.close(fd)
        fd = nfd
        if fd is None:
            return None
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise OverlordError(f"refusing {label}: not a directory of yours (owned by uid "
                                f"{st.st_uid}); nothing read through it")
    return fd
