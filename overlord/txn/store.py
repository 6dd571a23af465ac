"""OVERLORD_HOME and the session record: the one reader/writer of meta.json.

Layout of a session directory (OVERLORD_HOME/sessions/<sid>/):
    meta.json          the record (state, target, grants, layers and their causes)
    layers/NNNN/       sealed overlay layers, bottom (0000) to top
    upper/ work/       the layer being written while a command runs
    base.json          fingerprints of every touched path as the real tree had it
    provenance.jsonl   one line per change a layer made, with its cause
"""
import json
import os
import re
import threading
import time

from overlord.errors import NotFound, UsageError

SID_RE = re.compile(r"\A\d{8}-\d{6}-[0-9a-f]{6}\Z")      # \Z: `$` matches before a newline
STATES = ("running", "pending", "timed-out", "unchanged", "committed", "rolled-back", "imported")
# unchanged: a run whose command changed nothing, closed at once (it blocks no later run)
# imported: the record of a session that was open on another machine, brought here by
#   `overlord import` (trust/bundle.py): kept, never reviewable or committable here
OPEN_STATES = ("pending", "timed-out")   # reviewable: may be diffed, committed, rolled back


def home():
    if os.environ.get("OVERLORD_HOME"):
        return os.path.abspath(os.environ["OVERLORD_HOME"])
    if os.environ.get("OVERLORD_JAIL") == "1":
        return "/tmp/.overlord"   # inside a jail, state lives on the jail's private /tmp
    return os.path.join(os.path.expanduser("~"), ".overlord")


def sessions_dir():
    return os.path.join(home(), "sessions")


def journal_dir():
    """Where commit keeps the journal of a replay in progress (txn/replay.py)."""
    return os.path.join(home(), "journal")


POLICY_FILE = "policy.json"


def policy_path():
    """The live policy file (trust/policy.py reads it)."""
    return os.path.join(home(), POLICY_FILE)


def ensure_home():
    root = home()
    for sub in ("", "sessions", "locks"):
        os.makedirs(os.path.join(root, sub), mode=0o700, exist_ok=True)
    return root


def new_sid():
    import secrets           # (and hmac, hashlib, random): only a command that opens one
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def check_sid(sid):
    """Refuse anything but a well-formed id before it is joined to any path."""
    if not isinstance(sid, str) or not SID_RE.match(sid):
        raise UsageError(f"not a session id: {sid!r} (expected YYYYMMDD-HHMMSS-xxxxxx)")
    return sid


def session_dir(sid):
    return os.path.join(sessions_dir(), check_sid(sid))


def write_json_atomic(path, data, mode=0o600, sort_keys=True, indent=None, sync_dir=False):
    """Write JSON by temp file + fsync + rename, the file holding `mode` from the moment it
    exists (whatever the umask). sync_dir: also make the rename itself durable."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        os.unlink(tmp)                  # a stale temp file may carry a wider mode
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # dumps, not dump: dump streams through the slow pure-Python encoder
            f.write(json.dumps(data, sort_keys=sort_keys, indent=indent,
                               separators=None if indent else (",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path):
    """Make the entries just made or renamed in the directory at path durable."""
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def append_jsonl(path, records):
    """Append whole lines in one write, fsynced."""
    if not records:
        return
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd, data):
    """os.write until every byte of data is written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def parse_jsonl(data):
    """The JSON objects of data's lines (bytes); a damaged line, or one not an object, skipped."""
    out = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def read_jsonl(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def load_meta(sid):
    path = os.path.join(session_dir(sid), "meta.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise NotFound(f"no such session: {sid}") from None
    except ValueError:
        raise NotFound(f"session {sid} has a damaged record ({path})") from None


def save_meta(meta):
    write_json_atomic(os.path.join(session_dir(meta["sid"]), "meta.json"), meta)


def list_metas():
    """Every session's record, oldest first: in creation order (ids made in the same second
    do not sort by their text)."""
    try:
        names = os.listdir(sessions_dir())
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if SID_RE.match(name):
            try:
                out.append(load_meta(name))
            except NotFound:
                continue
    out.sort(key=_creation_order)
    return out


def _creation_order(meta):
    created = meta.get("created")
    return (created if isinstance(created, (int, float)) else 0, meta.get("sid", ""))


LAST = "last"


def resolve_sid(sid):
    """A session id as a person may give it: `last` names the newest session (by creation
    time, on any target); anything else must be a well-formed id."""
    if sid == LAST:
        metas = list_metas()
        if not metas:
            raise NotFound("no sessions yet: `last` names none")
        return metas[-1]["sid"]
    return check_sid(sid)
