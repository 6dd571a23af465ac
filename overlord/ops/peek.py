"""Cheap looks at OVERLORD_HOME, for a face's hot path.

`overlord hook claude-code` answers every tool call Claude Code makes, so finding that the
session it remembered is still the one to use must not load the engine: each of these reads
one record or one inode with the standard library, nothing more. They decide nothing: the
operation that follows (`overlord exec`, a Broker call) checks everything again.
"""
import os

from overlord.errors import OverlordError
from overlord.txn import store

OPEN_STATES = store.OPEN_STATES         # a session that may still run commands and be reviewed


def session_record(sid):
    """The session's record (its meta.json, as stored), or None when there is no such
    session or its record cannot be read."""
    try:
        return store.load_meta(sid)
    except (OverlordError, OSError):
        return None


def policy_stamp():
    """[inode, size, mtime_ns, ctime_ns] of the live policy file (None when there is none):
    it differs whenever the file was written or replaced since it was taken (ctime, which no
    user can set back), so a face that remembers it knows when to ask the broker again."""
    try:
        st = os.stat(store.policy_path())
    except FileNotFoundError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
