"""Arbitration: one executing session per target (an flock), and the pending guard."""
import errno
import fcntl
import hashlib
import os

from overlord.errors import OverlordError
from overlord.txn import store


def _lock_path(target):
    digest = hashlib.sha256(os.fsencode(target)).hexdigest()[:24]
    return os.path.join(store.home(), "locks", f"{digest}.lock")


class TargetLock:
    """Held while a command executes on a target; released when the command ends."""

    def __init__(self, target, wait=False):
        self.target, self.wait, self.fd = target, wait, None

    def __enter__(self):
        store.ensure_home()
        path = _lock_path(self.target)
        while True:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            except OSError as exc:
                os.close(self.fd)
                self.fd = None
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise OverlordError(f"target is busy: another session is executing on "
                                        f"{self.target} (use --wait to queue)") from None
                raise
            # gc removes a lock file nobody holds (trust/retention.py): a lock taken on the
            # file it just unlinked would be held alone, so take the one at the path now
            try:
                same = os.path.samestat(os.fstat(self.fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                return self
            os.close(self.fd)
            self.fd = None

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def pending_on(target, exclude=None):
    """Sessions still open (pending, timed-out or running) on this target."""
    return [m for m in store.list_metas()
            if m.get("target") == target and m.get("state") in ("running",) + store.OPEN_STATES
            and m["sid"] != exclude]
