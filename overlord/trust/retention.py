"""Retention: what `overlord gc` may prune, and the holds that keep a session from it.

A hold is OVERLORD_HOME/holds/<random>.json `{pid, sids, reason, ts}` with an exclusive flock
on it for as long as the `holding()` block runs (the file is locked before it is renamed to
its name, so no reader ever sees it unlocked while its holder lives). gc keeps every session a
live hold names, and prunes no object or pack while any live hold exists (the holder may be
adding objects whose record is not written yet: a bundle import). A hold whose flock is free
is stale (its process died): gc removes it. Layout and rules: docs/RETENTION.md.
"""
import contextlib
import errno
import fcntl
import json
import os
import secrets
import time

from overlord.errors import UsageError
from overlord.txn import store

HOLDS = "holds"


def holds_dir():
    return os.path.join(store.home(), HOLDS)


@contextlib.contextmanager
def holding(sids=(), reason=""):
    """Keep the sessions `sids` (and every object) from gc while the block runs."""
    sids = [store.check_sid(s) for s in ([sids] if isinstance(sids, str) else list(sids))]
    if not isinstance(reason, str):
        raise UsageError("a hold's reason must be text")
    store.ensure_home()
    d = holds_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    name = secrets.token_hex(8)
    path = os.path.join(d, name + ".json")
    tmp = os.path.join(d, f".{name}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        store.write_all(fd, (json.dumps({"pid": os.getpid(), "sids": sids, "reason": reason,
                                         "ts": time.time()}, sort_keys=True) + "\n").encode())
        os.fsync(fd)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _probe(path):
    """(live, record): live when another process holds the file's flock. record: its JSON
    (None when unreadable). A free flock: the file is stale."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            live = True
        else:
            live = False
            fcntl.flock(fd, fcntl.LOCK_UN)
        try:
            record = json.loads(os.read(fd, 1 << 16) or b"null")
        except ValueError:
            record = None
        return live, record if isinstance(record, dict) else None
    finally:
        os.close(fd)


def live_holds():
    """[(path, record)] of the holds whose holder is alive."""
    out = []
    try:
        names = sorted(os.listdir(holds_dir()))
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".json") and not n.startswith("."):
            path = os.path.join(holds_dir(), n)
            live, record = _probe(path)
            if live:
                out.append((path, record or {}))
    return out


def held_sids():
    """The sids live holds name, and whether any hold is live."""
    holds = live_holds()
    sids = set()
    for _, rec in holds:
        for s in rec.get("sids") or ():
            if isinstance(s, str):
                sids.add(s)
    return sids, bool(holds)
