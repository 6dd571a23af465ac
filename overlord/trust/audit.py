"""The keyed audit chain: OVERLORD_HOME/audit.jsonl, the one reader and writer of it.

One JSON line per consequential act. A line is the act's canonical text (the entry without
its mac: json.dumps with sorted keys, separators (",", ":"), ensure_ascii=False) with
`,"mac":"<hex>"` spliced in before its closing brace, where

    mac = HMAC-SHA256(key, previous line's mac (hex; "" for seq 1) + "\\n" + canonical)

keyed by OVERLORD_HOME/audit.key (32 random bytes, 0600, made on first use, never replaced).
So a line's bytes up to `,"mac":` plus "}" are exactly what its mac covers, and every mac
covers the one before it: an edit, a deletion, a reordering or an insertion breaks the chain
at the first line it touches. docs/AUDIT.md is the full construction.

Appends are serialized across processes by flock on the log; the previous seq and mac are
read from the log's tail under the lock (O(1) in the log's size); each line is one write(2),
fsynced. A torn last line (a crash mid-write) is never continued from: append refuses and
verify names it.
"""
import contextlib
import contextvars
import errno
import fcntl
import hmac
import json
import os
import pwd
import re
import secrets
import stat
import time

from overlord.errors import OverlordError
from overlord.text import escape_path, jsonable
from overlord.txn import store

KEY_SIZE = 32
LOG_NAME = "audit.jsonl"
KEY_NAME = "audit.key"
MAC_SUFFIX = b',"mac":"'            # a signed line ends ,"mac":"<64 hex>"}
SUFFIX_LEN = len(MAC_SUFFIX) + 64 + 2
RESERVED = ("seq", "ts", "actor", "action", "sid", "target", "mac")

# The known acts (noun.verb). Later issues add theirs here.
ACTIONS = (
    "session.open", "session.exec", "session.commit", "session.commit_refused",
    "session.rollback", "session.rewind", "session.fork", "session.revert",
    "session.timeout", "session.limit", "session.needs_review",
    "review.verdict", "policy.change", "audit.checkpoint",
    "connector.call", "connector.approval_requested", "connector.decision", "connector.result",
    "connector.config",
    "memory.accept", "memory.edit", "skill.add", "skill.remove",
    # accounts and sign-in (trust/auth.py, trust/oidc.py; issue 15)
    "auth.login", "auth.login_failed", "auth.lockout", "auth.logout",
    "user.add", "user.remove", "user.role", "user.passwd", "user.token_mint", "user.token_revoke",
    "sso.config", "sso.provision", "sso.refused",
    # running it for real (issue 16): cost.py, notify.py, vault.py, retention.py, bundle.py
    "budget.stop", "cost.price", "cost.budget",
    "webhook.add", "webhook.remove", "webhook.base_url", "webhook.test",
    "secret.config", "secret.resolve",
    "gc.run",
    "bundle.export", "bundle.import", "bundle.key",
    # recorded egress (issue 17): a held request released (sent) or dropped at commit/rollback
    "egress.release", "egress.drop",
)
ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")


def log_path():
    return os.path.join(store.home(), LOG_NAME)


def key_path():
    return os.path.join(store.home(), KEY_NAME)


def current_actor():
    """Who acts now: the account a face is acting for (acting_as), else the OS user as
    "uid:name" (the uid alone when it has no name)."""
    return _acting.get() or _os_user()


_acting = contextvars.ContextVar("overlord_audit_actor", default=None)


@contextlib.contextmanager
def acting_as(who):
    """Within the block (this thread, and what it hands its context to), appends without an
    explicit actor record `who` -- "account:<name>" for a signed-in person (auth.Principal.
    actor); None keeps the OS user. The launcher carries it across to its worker."""
    token = _acting.set(who or None)
    try:
        yield
    finally:
        _acting.reset(token)


actor = current_actor


def _os_user():
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return f"{uid}:{name}"


# -- the key ------------------------------------------------------------------------------------

def _key_error(path, what):
    return OverlordError(f"audit key {escape_path(path)}: {what} (never replaced: a new key "
                         f"would make a forged log verify; restore it from your off-box copy)")


def load_key(path=None):
    """The key's bytes, or None when there is no key file. A key that is not a regular file,
    not the caller's, readable or writable by group/other, or not 32 bytes raises
    OverlordError naming the file."""
    path = path or key_path()
    opened = open_owned(path, os.O_RDONLY, _key_error, 0o077, "reach")
    if opened is None:
        return None
    fd, st = opened
    try:
        if st.st_size != KEY_SIZE:
            raise _key_error(path, f"is {st.st_size} bytes, not {KEY_SIZE}")
        data = os.read(fd, KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_SIZE:
        raise _key_error(path, f"is {len(data)} bytes, not {KEY_SIZE}")
    return data


def _make_key(path):
    """Create the key: 32 random bytes in a 0600 temp file (O_EXCL), fsynced, then hard-linked
    to its name, which never replaces an existing key: when two first users race, the loser's
    link fails with EEXIST and it reads the winner's key."""
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            data = secrets.token_bytes(KEY_SIZE)
            if os.write(fd, data) != KEY_SIZE:
                raise OverlordError(f"audit key {escape_path(path)}: short write")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass                                    # another process made it first
        store.fsync_dir(os.path.dirname(path))
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    key = load_key(path)
    if key is None:
        raise _key_error(path, "vanished while it was being made")
    return key


def mac_of(key, prev, canonical):
    """HMAC-SHA256(key, prev_hex + "\\n" + canonical) as hex; canonical is bytes."""
    return hmac.digest(key, prev.encode("ascii") + b"\n" + canonical, "sha256").hex()


def witness_mac(key, seq, digest):
    """The mac of a witnessed head: HMAC-SHA256(key, "witness\\n{seq}\\n{hash}") hex."""
    return hmac.digest(key, f"witness\n{int(seq)}\n{digest}".encode("ascii"), "sha256").hex()


# -- the log ------------------------------------------------------------------------------------

def _log_error(path, what):
    return OverlordError(f"audit log {escape_path(path)}: {what}")


def _open_log(path, create):
    flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    opened = open_owned(path, flags, _log_error, 0o022, "write")
    return None if opened is None else opened[0]


def open_owned(path, flags, error, mask, verb, fix="it must be 0600", root_ok=False):
    """(fd, stat) of a regular file of the caller's (root_ok: or root's) with no `mask` mode
    bits, never through a symlink, opened non-blocking (a FIFO planted there cannot hang the
    caller); None when it does not exist; else error(path, what) is raised, `fix` saying
    what to do about a mode."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(path, "is a symlink") from None
        raise error(path, f"cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(path, "not a regular file")
        if st.st_uid != os.geteuid() and not (root_ok and st.st_uid == 0):
            raise error(path, f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
                        + (" or root" if root_ok else ""))
        if st.st_mode & mask:
            raise error(path, f"is mode {stat.S_IMODE(st.st_mode):04o}: group/other may "
                        f"{verb} it ({fix})")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _tail(fd, path):
    """(seq, mac) of the log's last line, read backwards from the end; (0, None) for an empty
    log. A torn or unreadable last line raises OverlordError."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, None
    chunk = 4096
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start)
        if not data.endswith(b"\n"):
            raise _log_error(path, f"the last line is torn (no newline at byte {size}: a crash "
                             "mid-write?); nothing is appended after it. `overlord audit "
                             "verify` names it; see docs/AUDIT.md")
        cut = data.rfind(b"\n", 0, len(data) - 1)
        if cut >= 0 or start == 0:
            line = data[cut + 1:-1]
            break
        chunk *= 4
    try:
        last = json.loads(line)
        seq = last["seq"]
        if type(seq) is not int or seq < 1:
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise _log_error(path, "the last line is not an audit record; nothing is appended "
                         "after it (`overlord audit verify` names it)") from None
    mac = last.get("mac")
    if mac is not None and not is_hex64(mac):
        raise _log_error(path, f"the last line (seq {seq}) carries a malformed mac")
    return seq, mac


def is_hex64(value):
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _check_key_for(seq, mac, kpath, key):
    """The key an append continues with, given the log's last (seq, mac)."""
    if key is None and seq:
        raise _key_error(kpath, f"is missing while {LOG_NAME} holds {seq} line(s)")
    if key is not None and seq and mac is None:
        raise _log_error(log_path(), f"the last line (seq {seq}) carries no mac while the key "
                         "exists (stripped: a downgrade); nothing is appended after it")


def ready():
    """Raise the OverlordError an append would raise (a bad key, a log that cannot be
    appended to, a torn last line); return None when the chain can take a line. Called by the
    service layer before an irreversible act, so a broken chain refuses the act."""
    kpath = key_path()
    key = load_key(kpath)
    fd = _open_log(log_path(), create=False)
    if fd is None:                                  # no log yet: the first append makes it
        home = store.home()
        if os.path.isdir(home) and not os.access(home, os.W_OK | os.X_OK):
            raise _log_error(log_path(), "cannot be created (its directory is not writable)")
        return None
    try:
        seq, mac = _tail(fd, log_path())
    finally:
        os.close(fd)
    _check_key_for(seq, mac, kpath, key)
    return None


def _clean(value):
    """details as exactly what a JSON parser reads back: jsonable-safe (invalid UTF-8 becomes
    escaped text plus *_b64), tuples as lists, sets sorted, anything else as its str."""
    def fallback(obj):
        if isinstance(obj, (set, frozenset)):
            return sorted(obj, key=str)
        if isinstance(obj, bytes):
            return obj.decode("utf-8", "surrogateescape")
        if isinstance(obj, os.PathLike):
            return os.fspath(obj)
        return str(obj)
    text = json.dumps(value, default=fallback, allow_nan=False, ensure_ascii=False)
    return jsonable(json.loads(text))


def append(action, *, sid=None, target=None, actor=None, **details):
    """Write one line for `action` and return it (with its seq and mac)."""
    return append_located(action, sid=sid, target=target, actor=actor, **details)[0]


def append_located(action, *, sid=None, target=None, actor=None, **details):
    """append(), and the byte offset its line starts at: a record that must later prove an
    act is on the chain (a verdict that countersigns) keeps {seq, offset} and attested()
    reads that one line back in O(1)."""
    if action not in ACTIONS or not ACTION_RE.match(action):
        raise ValueError(f"unknown audit action {action!r} (add it to overlord.trust.audit.ACTIONS)")
    for k in details:
        if k in RESERVED:
            raise ValueError(f"audit detail {k!r} is a reserved field")
    entry = _clean(details) if details else {}
    entry.update(action=action, actor=actor if actor is not None else current_actor(),
                 ts=round(time.time(), 6))
    if sid is not None:
        entry["sid"] = _clean(sid)
    if target is not None:
        entry["target"] = os.fspath(target)       # jsonable: invalid UTF-8 -> target_b64
    entry = jsonable(entry)
    home = store.ensure_home()
    path, kpath = os.path.join(home, LOG_NAME), os.path.join(home, KEY_NAME)
    existed = os.path.exists(path)
    if not existed:
        load_key(kpath)                 # a bad key refuses before the log is even created
    fd = _open_log(path, create=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        key = load_key(kpath)           # under the lock: another first user may just have made it
        seq, prev = _tail(fd, path)
        if key is None and seq == 0:
            key = _make_key(kpath)                  # first use: under the log's lock
        _check_key_for(seq, prev, kpath, key)
        entry["seq"] = seq + 1
        canonical = json.dumps(entry, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False).encode("utf-8")
        mac = mac_of(key, prev or "", canonical)
        data = canonical[:-1] + MAC_SUFFIX + mac.encode("ascii") + b'"}\n'
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
        except OSError as exc:
            written, err = -1, exc.strerror
        else:
            err = "short write"
        if written != len(data):
            try:
                os.ftruncate(fd, size)              # never leave a torn line behind
            except OSError:
                pass
            raise _log_error(path, f"could not append ({err})")
        os.fsync(fd)
        if not existed:
            store.fsync_dir(home)
    finally:
        os.close(fd)                                # releases the lock
    entry["mac"] = mac
    _after_append(entry)
    return entry, size


def attested(seq, offset):
    """The entry at `offset` when it is the signed line `seq` of the chain: its mac verifies
    under the key over the line before it. Else OverlordError saying why. Reads two lines."""
    path, where = log_path(), f"the audit chain has no signed line {seq} at byte {offset}"
    key = load_key()
    if key is None or type(seq) is not int or type(offset) is not int or offset < 0:
        raise OverlordError(where)
    opened = open_owned(path, os.O_RDONLY, _log_error, 0o022, "write")
    if opened is None:
        raise OverlordError(where)
    fd = opened[0]
    try:
        raw = _line_at(fd, offset)
        prev = b""
        if offset > 0:
            before = os.pread(fd, min(offset, 1 << 16), max(0, offset - (1 << 16)))
            if not before.endswith(b"\n"):
                raise OverlordError(where)
            start = before.rfind(b"\n", 0, len(before) - 1) + 1
            prev = _mac_field(before[start:-1])
    finally:
        os.close(fd)
    mac = _mac_field(raw)
    canonical = raw[:-SUFFIX_LEN] + b"}"
    if not mac or (offset > 0 and not prev) or \
            not hmac.compare_digest(mac_of(key, prev.decode("ascii"), canonical), mac.decode("ascii")):
        raise OverlordError(where)
    entry = json.loads(raw)
    if entry.get("seq") != seq:
        raise OverlordError(where)
    return entry


def _line_at(fd, offset, cap=1 << 20):
    data = os.pread(fd, cap, offset)
    end = data.find(b"\n")
    if end < 0:
        raise OverlordError(f"the audit chain has no complete line at byte {offset}")
    return data[:end]


def _mac_field(line):
    """The hex mac a signed line ends with, as bytes; b"" when it has none."""
    tail = line[-SUFFIX_LEN:]
    if not (tail.startswith(MAC_SUFFIX) and tail.endswith(b'"}')):
        return b""
    mac = tail[len(MAC_SUFFIX):-2]
    return mac if is_hex64(mac.decode("ascii", "replace")) else b""


def _after_append(entry):
    """With `overlord audit witness URL --auto`, hand the new head to a sender off the
    caller's path; never fails the act."""
    try:
        from overlord.trust import witness
        witness.auto_send()
    except Exception:       # noqa: BLE001 - the act already happened; the witness is best-effort
        pass
    try:
        from overlord.trust import notify
        notify.after_append(entry)
    except Exception:       # noqa: BLE001 - a webhook never fails the act it tells of
        pass


# -- reading and verifying ----------------------------------------------------------------------

def _read_log():
    try:
        with open(log_path(), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def _split(data):
    """(complete lines, torn tail or None)."""
    if not data:
        return [], None
    lines = data.split(b"\n")
    tail = lines.pop()
    return lines, (tail if tail else None)


def entries(since=None, action=None):
    """The parsed lines, oldest first: seq >= since; action exact, or a noun ("session")
    for all its verbs. Lines that do not parse are left out (verify names them)."""
    lines, _ = _split(_read_log())
    out = []
    for raw in lines:
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if since is not None and not (isinstance(entry.get("seq"), int) and entry["seq"] >= since):
            continue
        if action is not None:
            act = entry.get("action")
            if not isinstance(act, str) or not (act == action or
                                                ("." not in action and act.startswith(action + "."))):
                continue
        out.append(entry)
    return out


def head():
    """{"seq", "hash"} of the log's last line (hash: its mac; None when unsigned), read from
    the tail; {"seq": 0, "hash": None} for an empty log."""
    fd = _open_log(log_path(), create=False)
    if fd is None:
        return {"seq": 0, "hash": None}
    try:
        seq, mac = _tail(fd, log_path())
    finally:
        os.close(fd)
    return {"seq": seq, "hash": mac}


def checkpoint():
    """Append an audit.checkpoint act and return the head that includes it."""
    entry = append("audit.checkpoint")
    return {"seq": entry["seq"], "hash": entry["mac"]}


def check_head(value, what):
    """A {seq, hash} (pin) as (seq, hash), or OverlordError naming `what`."""
    if not isinstance(value, dict) or type(value.get("seq")) is not int or value["seq"] < 1 \
            or not is_hex64(value.get("hash")):
        raise OverlordError(f"{what} is not {{\"seq\": N, \"hash\": \"<64 hex>\"}}")
    return value["seq"], value["hash"]


def verify(pin=None, witness=None):
    """Walk the whole chain. pin: a {seq, hash} the log must still carry; witness: a {seq,
    hash, mac} head from the witness (its mac is checked with the key). Returns
    {"signed", "lines", "head": {"seq", "hash"}, "ok", "bad": {"seq", "line", "why"} | None,
    "pin": {"seq","hash","ok"} | None, "witness": {"seq","hash","ok"} | None}."""
    kpath = key_path()
    key = load_key(kpath)
    lines, torn = _split(_read_log())
    signed = key is not None
    bad = None
    prev = ""
    last_seq, last_hash = 0, None
    want = {}                                   # seq -> the hash a pin / the witness expects
    if pin is not None:
        want[pin["seq"]] = None
    if witness is not None:
        want[witness["seq"]] = None
    loads, digest, compare = json.loads, hmac.digest, hmac.compare_digest
    for n, raw in enumerate(lines, 1):
        try:
            entry = loads(raw)
            seq = entry["seq"]
        except (ValueError, KeyError, TypeError):
            bad = {"seq": None, "line": n, "why": "not an audit record (not JSON or no seq)"}
            break
        if type(seq) is not int:
            bad = {"seq": None, "line": n, "why": "seq is not a number"}
            break
        if seq != n:
            why = (f"seq {seq} where {n} belongs: a line before it was deleted" if seq > n else
                   f"seq {seq} where {n} belongs: lines reordered, repeated or inserted")
            bad = {"seq": seq, "line": n, "why": why}
            break
        mac = entry.get("mac")
        if mac is not None and not isinstance(mac, str):
            bad = {"seq": seq, "line": n, "why": "the mac is not a string"}
            break
        if signed:
            if mac is None:
                bad = {"seq": seq, "line": n, "why": f"no mac while the key {kpath} exists "
                       "(MACs stripped: a downgrade)"}
                break
            if raw[-SUFFIX_LEN:-66] != MAC_SUFFIX or raw[-2:] != b'"}' or \
                    raw[-66:-2] != mac.encode("ascii", "replace"):
                bad = {"seq": seq, "line": n, "why": "the mac is not the line's last field "
                       "(the line was rewritten)"}
                break
            expect = digest(key, prev.encode("ascii") + b"\n" + raw[:-SUFFIX_LEN] + b"}",
                            "sha256").hex()
            if not compare(expect, mac):
                bad = {"seq": seq, "line": n, "why": "the mac does not verify: this line was "
                       "edited, or a line before it was removed, inserted or reordered"}
                break
            prev = mac
        elif mac is not None:
            bad = {"seq": seq, "line": n, "why": f"carries a mac but the key {kpath} is missing: "
                   "the chain cannot be checked"}
            break
        if seq in want:
            want[seq] = mac
        last_seq, last_hash = seq, mac
    if bad is None and torn is not None:
        bad = {"seq": last_seq + 1, "line": len(lines) + 1,
               "why": f"torn: the last line is incomplete ({len(torn)} bytes, no newline; a "
               "crash mid-write?)"}
    report = {"signed": signed, "lines": len(lines) + (1 if torn is not None else 0),
              "head": {"seq": last_seq, "hash": last_hash}, "ok": bad is None, "bad": bad,
              "pin": None, "witness": None}
    if pin is not None:
        report["pin"] = _carried(pin, want, last_seq, bad)
    if witness is not None:
        if not signed:
            report["witness"] = dict(seq=witness["seq"], hash=witness["hash"], ok=False,
                                     why=f"the key {kpath} is missing: the witnessed head's mac "
                                     "cannot be checked")
        elif not compare(witness_mac(key, witness["seq"], witness["hash"]),
                         str(witness.get("mac", ""))):
            report["witness"] = dict(seq=witness["seq"], hash=witness["hash"], ok=False,
                                     why="the witnessed head's mac does not verify (refused: "
                                     "not a head this key signed)")
        else:
            report["witness"] = _carried(witness, want, last_seq, bad)
    for part in ("pin", "witness"):
        if report[part] is not None and not report[part]["ok"]:
            report["ok"] = False
    return report


def _carried(head_, want, last_seq, bad):
    seq, digest = head_["seq"], head_["hash"]
    out = {"seq": seq, "hash": digest, "ok": False, "why": None}
    if seq > last_seq:
        out["why"] = (f"the log stops at seq {last_seq}, below seq {seq}: truncated" if bad is None
                      else f"seq {seq} lies beyond the first bad line")
    elif want.get(seq) is None or not hmac.compare_digest(want[seq], digest):
        out["why"] = f"the line at seq {seq} is not the one recorded (rewritten)"
    else:
        out["ok"] = True
    return out
