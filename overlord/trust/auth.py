"""Accounts, passwords, script tokens, durable logins, lockout and roles: the one reader and
writer of OVERLORD_HOME/users.json and OVERLORD_HOME/logins/.

users.json (0600, written atomically under a flock on users.json.lock; a file that is not the
caller's, is group/other readable, is a symlink or is not an object of the shape below is
refused, never used):

    {"version": 1,
     "users":  {NAME: {"name", "role", "created", "id", "gen",
                       "password": {"alg": "scrypt", "n", "r", "p", "dklen", "salt", "hash"} | null,
                       "sso": {"issuer", "sub", "email"} | null}},
     "tokens": {ID: {"user", "account", "sha256", "label", "created", "used"}}}

- A password is a scrypt hash with its own parameters (at least SCRYPT) and a 16-byte salt of
  its own, so the parameters can be raised later. Hashing runs at most two at once (each costs
  about 128 MiB). An unknown name costs one hash like a known one, and is told the same words.
- `id` is drawn at add: a name removed and added again is another account, and no token or
  login of the old one works for the new. `gen` grows at each password or role change: a login
  made under another generation is over (what keeps "ends the other logins" true even for a
  login being made while the change happened).
- A script token is "ovl_<12 hex id>_<43 urlsafe secret>", shown once; the tokens table keeps
  its SHA-256 under its id (found in O(1), compared in constant time).
- A login is OVERLORD_HOME/logins/<sha256 of the cookie, hex>.json (0600) -- never the cookie:
  {"name", "account", "gen", "created", "seen", "via"}; over after LOGIN_IDLE seconds without
  use ("seen" is touched at most once a minute), at sign-out, when the account is removed and,
  for all but the login that made it, at a password or role change.
- Lockout (in this process): 5 failed sign-ins within 300 s lock the name and, separately, the
  address for 60 s; the table is pruned as it goes and bounded. It is read before the hash and
  again after it, so a burst of guesses queued for a hash slot is refused once a lock starts.
- check_password's principal carries the account id and generation it checked (its .name is a
  CheckedName, a str that remembers them): login_create refuses a login for an account that
  changed, or was removed and given again, during the check.
- A new account starts with an empty users/<name>/ (whatever was there is set aside as
  users/.stale-<name>-<stamp>), and a name that still owns sessions of a removed account is
  refused (sessions record their owner by name).

Every change is an audited act (user.*, auth.*); the actor of the line is whoever the caller
acts as (audit.acting_as) -- this module never invents one. Details never carry a password,
token or cookie: names, ids, digests' prefixes, addresses, reasons.
"""
import base64
import contextlib
import copy
import fcntl
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field

from overlord.errors import Conflict, NotFound, OverlordError, UsageError
from overlord.text import escape_path
from overlord.trust import audit
from overlord.trust.userdirs import LOCAL_NAME     # local accounts (fullmatch); never an "@"
from overlord.txn import store

ROLES = ("admin", "operator", "viewer")
# SSO accounts are named by their lower-cased e-mail (always contain "@"): no collision possible.
SCRYPT = {"n": 1 << 17, "r": 8, "p": 1}                # minimum; stored per hash
LOGIN_IDLE = 7 * 86400

USERS_NAME = "users.json"
LOGINS_NAME = "logins"
SALT_SIZE = 16
DKLEN = 32
PASSWORD_MIN, PASSWORD_MAX = 8, 1024          # characters, for a password being set
CHECK_MAX = 4096                              # characters, for a password being checked
LABEL_MAX = 64
TOKENS_MAX = 100                              # per account
TOUCH_EVERY = 60                              # seconds between two writes of "seen" / "used"
TOKEN_RE = re.compile(r"^ovl_([0-9a-f]{12})_([A-Za-z0-9_-]{43})\Z")
COOKIE_RE = re.compile(r"^[A-Za-z0-9_-]{43}\Z")          # secrets.token_urlsafe(32)
LOGIN_FILE_RE = re.compile(r"^[0-9a-f]{64}\.json\Z")
FILE_CAP = 64 << 20                           # users.json bytes read at most
MAXMEM = 1 << 30                              # scrypt parameters stored beyond this are refused

_HASHING = threading.BoundedSemaphore(2)      # at most two hashes at once in a process
_DUMMY_SALT = secrets.token_bytes(SALT_SIZE)  # what an unknown name is hashed with


class AuthError(OverlordError):
    """A sign-in refused: 401, or 429 with .retry_after (seconds) while a lock holds."""

    http_status = 401

    def __init__(self, message, *, http_status=None, retry_after=None):
        if retry_after is not None and http_status is None:
            http_status = 429
        super().__init__(message, http_status=http_status)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Principal:
    """Who a request speaks for. via: "launch" (accounts off: the launch token's holder),
    "cookie" (a login) or "bearer" (a script token); login: the login's sha256 hex (cookie);
    token_id: the token's id (bearer). account and gen: the account's id and generation the
    principal was established against (check_password, login_lookup, bearer): login_create
    handed such a principal refuses when the account changed since (a password changed, or
    the name removed and given again, during the sign-in's hash)."""

    name: object
    role: str
    via: str
    login: object = None
    token_id: object = None
    account: object = field(default=None, compare=False, repr=False)   # the account's id ...
    gen: object = field(default=None, compare=False, repr=False)       # ... and generation

    @property
    def actor(self):
        """The audit actor: "account:<name>" (None for the launch token's holder: the OS user)."""
        return None if self.via == "launch" or self.name is None else f"account:{self.name}"

    @property
    def is_admin(self):
        return self.role == "admin"

    @property
    def may_change(self):
        return self.role != "viewer"


class CheckedName(str):
    """The name check_password vouches for: a str like any other, which also remembers the
    account id and generation the password was checked against, so login_create(p.name)
    refuses a login for an account changed (or removed and given again) since the check."""

    def __new__(cls, name, account, gen):
        self = super().__new__(cls, name)
        self.account, self.gen = account, gen
        return self


LAUNCH = Principal(name=None, role="admin", via="launch")   # accounts off: the launch token holder


# -- where things are --------------------------------------------------------------------------

def path():
    return os.path.join(store.home(), USERS_NAME)


def logins_dir():
    return os.path.join(store.home(), LOGINS_NAME)


def user_dir(name):
    """OVERLORD_HOME/users/<name>/ (not made; a name that is no account name is refused)."""
    from overlord.trust.userdirs import user_dir as where
    return where(name)


def _file_error(p, what):
    return OverlordError(f"refusing the accounts file {escape_path(p)}: {what}")


# -- reading users.json ------------------------------------------------------------------------

_cache_lock = threading.Lock()
_cache = {"key": None, "data": None, "error": None}


def _stat_key(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode,
            st.st_uid)


def _empty():
    return {"version": 1, "users": {}, "tokens": {}}


def _load():
    """users.json as data (shared: never mutate it), re-read only when its stat changed;
    the empty table when there is none. A file refused raises OverlordError (every time)."""
    p = path()
    try:
        st = os.stat(p, follow_symlinks=False)
    except FileNotFoundError:
        return _empty()
    except OSError as exc:
        raise _file_error(p, f"cannot be read ({exc.strerror})") from None
    key = (p,) + _stat_key(st)
    with _cache_lock:
        if _cache["key"] == key:
            if _cache["error"] is not None:
                raise OverlordError(_cache["error"])
            return _cache["data"]
    error = None
    try:
        key, data = _read(p)
    except OverlordError as exc:
        data, error = None, str(exc)
    with _cache_lock:
        _cache.update(key=key, data=data, error=error)
    if error is not None:
        raise OverlordError(error)
    return data


def _read(p):
    """(stat key, data) of the file at p, checked: ours, 0600-ish, a regular file, the shape."""
    opened = audit.open_owned(p, os.O_RDONLY, _file_error, 0o077, "read",
                              fix=f"run: chmod 600 {escape_path(p)}")
    if opened is None:
        return None, _empty()
    fd, st = opened
    key = (p,) + _stat_key(st)
    try:
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > FILE_CAP:
                raise _file_error(p, f"is over {FILE_CAP} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        data = json.loads(b"".join(chunks).decode("utf-8"))
    except ValueError:
        raise _file_error(p, "it is damaged (not JSON)") from None
    why = _shape(data)
    if why:
        raise _file_error(p, f"it is damaged ({why})")
    return key, data


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _shape(data):
    """What is wrong with the table's shape, or None."""
    if not isinstance(data, dict) or data.get("version") != 1:
        return "not a version-1 accounts table"
    users, tokens = data.get("users"), data.get("tokens")
    if not isinstance(users, dict) or not isinstance(tokens, dict):
        return "no users/tokens objects"
    for name, rec in users.items():
        if not isinstance(rec, dict) or rec.get("name") != name:
            return f"the record of {name!r} is not an account"
        if rec.get("role") not in ROLES:
            return f"{name!r} has no known role"
        if not isinstance(rec.get("id"), str) or type(rec.get("gen")) is not int \
                or not _num(rec.get("created")):
            return f"{name!r} has no id, gen or created"
        sso = rec.get("sso")
        if sso is None:
            if not LOCAL_NAME.fullmatch(name) or _hash_params(rec.get("password")) is None:
                return f"{name!r} is a local account without a valid password hash"
        elif not isinstance(sso, dict) or "@" not in name or rec.get("password") is not None \
                or not all(isinstance(sso.get(k), str) for k in ("issuer", "sub", "email")):
            return f"{name!r} is a single sign-on account without its identity"
    for tid, t in tokens.items():
        if not isinstance(t, dict) or not re.fullmatch(r"[0-9a-f]{12}", tid) \
                or not isinstance(t.get("user"), str) or not isinstance(t.get("account"), str) \
                or not audit.is_hex64(t.get("sha256")) or not _num(t.get("created")):
            return f"token {tid!r} is not a token record"
    return None


@contextlib.contextmanager
def _changing():
    """The table for a read-modify-write under the flock; written (atomically, 0600, durably)
    when the block ends without an exception."""
    store.ensure_home()
    p = path()
    fd = os.open(p + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = copy.deepcopy(_load())
        yield data
        store.write_json_atomic(p, data, 0o600, indent=1, sync_dir=True)
    finally:
        os.close(fd)


# -- passwords ---------------------------------------------------------------------------------

def _b64(raw):
    return base64.b64encode(raw).decode("ascii")


def _unb64(text):
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, AttributeError, UnicodeEncodeError):
        return None


def _memory(n, r, p):
    return 128 * r * (n + 2) + 128 * r * p + (1 << 16)


def _hash_params(stored):
    """(n, r, p, dklen, salt, hash) of a stored hash when it is one we would verify: scrypt,
    at least SCRYPT, at most MAXMEM of memory; else None."""
    if not isinstance(stored, dict) or stored.get("alg") != "scrypt":
        return None
    n, r, p, dklen = (stored.get(k) for k in ("n", "r", "p", "dklen"))
    if not all(type(v) is int for v in (n, r, p, dklen)):
        return None
    if n < SCRYPT["n"] or n & (n - 1) or r < SCRYPT["r"] or p < SCRYPT["p"] or p > 16 \
            or not 16 <= dklen <= 64 or _memory(n, r, p) > MAXMEM:
        return None
    salt, digest = _unb64(stored.get("salt")), _unb64(stored.get("hash"))
    if salt is None or len(salt) < SALT_SIZE or digest is None or len(digest) != dklen:
        return None
    return n, r, p, dklen, salt, digest


def _scrypt(secret, salt, n, r, p, dklen):
    with _HASHING:
        return hashlib.scrypt(secret, salt=salt, n=n, r=r, p=p, dklen=dklen,
                              maxmem=_memory(n, r, p))


def _encode(password):
    """The password's bytes, or None for what can never be one (not text, too long, lone
    surrogates)."""
    if not isinstance(password, str) or len(password) > CHECK_MAX:
        return None
    try:
        return password.encode("utf-8")
    except UnicodeEncodeError:
        return None


def check_new_password(password):
    """Refuse (UsageError) a password that may not be set; return it."""
    if not isinstance(password, str):
        raise UsageError("a password must be text")
    if len(password) < PASSWORD_MIN:
        raise UsageError(f"a password needs at least {PASSWORD_MIN} characters")
    if len(password) > PASSWORD_MAX:
        raise UsageError(f"a password has at most {PASSWORD_MAX} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in password):
        raise UsageError("a password cannot contain control characters (a line break, a tab)")
    if _encode(password) is None:
        raise UsageError("a password must be valid text (UTF-8)")
    return password


def hash_password(password):
    """The stored form of a new password: scrypt at SCRYPT with a fresh salt."""
    salt = secrets.token_bytes(SALT_SIZE)
    n, r, p = SCRYPT["n"], SCRYPT["r"], SCRYPT["p"]
    digest = _scrypt(_encode(check_new_password(password)), salt, n, r, p, DKLEN)
    return {"alg": "scrypt", "n": n, "r": r, "p": p, "dklen": DKLEN, "salt": _b64(salt),
            "hash": _b64(digest)}


def _verify(stored, password):
    """True when password matches the stored hash. Costs one hash whatever happens (an
    unknown name, a damaged hash, an impossible password are hashed with the dummy salt)."""
    params = _hash_params(stored)
    secret = _encode(password)
    if params is None or secret is None:
        _scrypt(secret or b"", _DUMMY_SALT, SCRYPT["n"], SCRYPT["r"], SCRYPT["p"], DKLEN)
        return False
    n, r, p, dklen, salt, digest = params
    return hmac.compare_digest(_scrypt(secret, salt, n, r, p, dklen), digest)


# -- names and roles ---------------------------------------------------------------------------

LOCAL_RULE = ("a local account name is 1 to 32 characters: a lower-case letter, then lower-case "
              "letters, digits, '_', '.' or '-'")


def _check_role(role):
    if role not in ROLES:
        raise UsageError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return role


def check_local_name(name):
    """A local account's name (LOCAL_NAME); else UsageError saying the rule."""
    if not isinstance(name, str) or not LOCAL_NAME.fullmatch(name):
        raise UsageError(f"not a local account name: {name!r} ({LOCAL_RULE})")
    return name


def _check_sso_name(name):
    from overlord.trust.userdirs import valid_user
    if not isinstance(name, str) or "@" not in name or not valid_user(name):
        raise UsageError(f"not a single sign-on account name: {name!r} (a lower-case e-mail)")
    return name


def check_name(name):
    """A local name or a single sign-on account's (a lower-case e-mail); else UsageError."""
    from overlord.trust.userdirs import valid_user
    if not isinstance(name, str) or not (LOCAL_NAME.fullmatch(name)
                                         or ("@" in name and valid_user(name))):
        raise UsageError(f"not an account name: {name!r}")
    return name


def _account(data, name):
    rec = data["users"].get(check_name(name))
    if rec is None:
        raise NotFound(f"no account {name}")
    return rec


def _details(by, **details):
    if by is not None:
        details["by"] = by
    return details


# -- accounts ----------------------------------------------------------------------------------

def enabled():
    """True when sign-in is on: at least one account -- or an accounts file that cannot be
    used (a damaged or foreign file fails closed: nobody signs in, the launch token no longer
    suffices). Cheap: a stat, and a read only when it changed."""
    try:
        return bool(_load()["users"])
    except OverlordError:
        return True


def _row(data, rec):
    n = sum(1 for t in data["tokens"].values() if t["user"] == rec["name"])
    return {"name": rec["name"], "role": rec["role"], "sso": rec.get("sso") is not None,
            "created": rec["created"], "tokens": n}


def listing():
    """[{"name", "role", "sso": bool, "created", "tokens": n}] sorted by name."""
    data = _load()
    return [_row(data, data["users"][n]) for n in sorted(data["users"])]


def get(name):
    """The stored record (a copy, the password hash included: never hand it to a face --
    public() is what a face shows), or None."""
    if not isinstance(name, str):
        return None
    rec = _load()["users"].get(name)
    return copy.deepcopy(rec) if rec is not None else None


def public(name):
    """What a face may show of an account: the listing's row, with "email" for an SSO one;
    None when there is no such account."""
    if not isinstance(name, str):
        return None
    data = _load()
    rec = data["users"].get(name)
    if rec is None:
        return None
    row = _row(data, rec)
    if rec.get("sso"):
        row["email"] = rec["sso"]["email"]
    return row


def find_sso(issuer, sub):
    """The name of the account provisioned for this (issuer, subject), or None."""
    return _sso_holder(_load(), issuer, sub)


def _sso_holder(data, issuer, sub):
    for rec in data["users"].values():
        sso = rec.get("sso")
        if sso and sso["issuer"] == issuer and sso["sub"] == sub:
            return rec["name"]
    return None


def add(name, role, password=None, sso=None, by=None):
    """Make an account: a local one (a LOCAL_NAME and a password) or, with sso={"issuer",
    "sub", "email"}, a single sign-on one named by the lower-cased e-mail (no password).
    Makes users/<name>/ (0700). Audited user.add. Returns public(name)."""
    _check_role(role)
    if sso is None:
        check_local_name(name)
        if password is None:
            raise UsageError(f"a local account needs a password: {name}")
        stored = hash_password(password)
        identity = None
    else:
        _check_sso_name(name)
        if password is not None:
            raise UsageError("a single sign-on account has no password")
        if not isinstance(sso, dict) or not all(isinstance(sso.get(k), str) and sso.get(k)
                                                and len(sso[k]) <= 1024
                                                for k in ("issuer", "sub", "email")):
            raise UsageError("a single sign-on account needs its issuer, subject and e-mail")
        identity = {k: sso[k] for k in ("issuer", "sub", "email")}
        stored = None
    audit.ready()
    from overlord.ops.home import ensure_user_dir
    with _changing() as data:
        if name in data["users"]:
            raise Conflict(f"account {name} exists")
        owned = _sessions_owned(name)
        if owned:
            raise Conflict(f"{name} is the owner of {owned} session(s) of a removed account: a "
                           "new account cannot take its name (they would be its); choose "
                           "another name")
        if identity is not None:
            holder = _sso_holder(data, identity["issuer"], identity["sub"])
            if holder is not None:
                raise Conflict(f"that identity already has the account {holder}")
        _set_aside(name, "stale")             # a new account starts with an empty folder
        ensure_user_dir(name)
        data["users"][name] = {"name": name, "role": role, "created": round(time.time(), 3),
                               "id": secrets.token_hex(8), "gen": 1, "password": stored,
                               "sso": identity}
    audit.append("user.add", **_details(by, name=name, role=role, sso=identity is not None))
    return public(name)


def _sessions_owned(name):
    """How many session records name `name` as their owner (sessions record the owner by
    name: a name once given keeps its sessions)."""
    return sum(1 for meta in store.list_metas() if meta.get("owner") == name)


def passwd(name, password, by=None, keep_login=None):
    """Set a local account's password; ends the account's other logins (all but keep_login,
    a login's sha256 hex). Audited user.passwd. Returns {"name", "ended": n}."""
    rec = _account(_load(), name)
    if rec.get("sso") is not None:
        raise UsageError(f"{name} signs in with single sign-on: it has no password")
    stored = hash_password(password)
    audit.ready()
    with _changing() as data:
        rec = _account(data, name)
        if rec.get("sso") is not None:
            raise UsageError(f"{name} signs in with single sign-on: it has no password")
        rec["password"] = stored
        rec["gen"] += 1
    ended = end_logins(name, keep=keep_login)
    audit.append("user.passwd", **_details(by, name=name, logins_ended=ended))
    return {"name": name, "ended": ended}


def set_role(name, role, by=None, keep_login=None):
    """Change an account's role; ends the account's other logins (all but keep_login).
    The same role again changes nothing. Audited user.role. Returns {"name", "role",
    "was", "ended": n}."""
    _check_role(role)
    was = _account(_load(), name)["role"]
    if was == role:
        return {"name": name, "role": role, "was": was, "ended": 0}
    audit.ready()
    with _changing() as data:
        rec = _account(data, name)
        was = rec["role"]
        if was == "admin" and not any(r["role"] == "admin" for r in data["users"].values()
                                      if r is not rec):
            raise OverlordError(f"{name} is the last administrator: make another account admin "
                                "first (or nobody could manage the accounts)", http_status=409)
        rec["role"] = role
        rec["gen"] += 1
    ended = end_logins(name, keep=keep_login)
    audit.append("user.role", **_details(by, name=name, role=role, was=was, logins_ended=ended))
    return {"name": name, "role": role, "was": was, "ended": ended}


def remove(name, by=None):
    """Remove an account: its tokens and logins go, users/<name>/ is renamed aside to
    users/.removed-<name>-<UTC stamp> (kept, never deleted). Audited user.remove.
    Returns {"name", "tokens": n, "logins": n, "kept": path or None}."""
    _account(_load(), name)
    audit.ready()
    with _changing() as data:
        _account(data, name)
        del data["users"][name]
        gone = [tid for tid, t in data["tokens"].items() if t["user"] == name]
        for tid in gone:
            del data["tokens"][tid]
    ended = end_logins(name)
    kept = _set_aside(name)
    audit.append("user.remove", **_details(by, name=name, tokens=len(gone), logins_ended=ended,
                                           kept=kept))
    return {"name": name, "tokens": len(gone), "logins": ended, "kept": kept}


def _set_aside(name, why="removed"):
    """Rename users/<name>/ (whatever it is: a folder, a link) to users/.<why>-<name>-<UTC
    stamp>; its new path, or None when there was nothing."""
    where = user_dir(name)
    if not os.path.lexists(where):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = os.path.join(os.path.dirname(where), f".{why}-{name}-{stamp}")
    aside, i = base, 1
    while os.path.lexists(aside):
        i += 1
        aside = f"{base}-{i}"
    os.rename(where, aside)
    return aside


# -- script tokens -----------------------------------------------------------------------------

def _sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_label(label):
    if label is None:
        return None
    if not isinstance(label, str):
        raise UsageError("a token label must be text")
    label = label.strip()
    if not label:
        return None
    if len(label) > LABEL_MAX or any(ord(c) < 32 or ord(c) == 127 or c in "\u2028\u2029"
                                     for c in label):
        raise UsageError(f"a token label is at most {LABEL_MAX} characters, with no control "
                         "characters")
    return label


def mint_token(name, label=None, by=None):
    """A new script token for the account: (token_id, token) -- the token is shown once and
    kept only as its SHA-256. Audited user.token_mint (the id and label)."""
    label = _check_label(label)
    audit.ready()
    with _changing() as data:
        rec = _account(data, name)
        if sum(1 for t in data["tokens"].values() if t["user"] == name) >= TOKENS_MAX:
            raise Conflict(f"{name} has {TOKENS_MAX} tokens: revoke one first")
        tid = secrets.token_hex(6)
        while tid in data["tokens"]:
            tid = secrets.token_hex(6)
        token = f"ovl_{tid}_{secrets.token_urlsafe(32)}"
        data["tokens"][tid] = {"user": name, "account": rec["id"], "sha256": _sha(token),
                               "label": label, "created": round(time.time(), 3), "used": None}
    audit.append("user.token_mint", **_details(by, name=name, id=tid, label=label))
    return tid, token


def tokens(name):
    """[{"id", "label", "created", "used"}] of the account's tokens, oldest first."""
    data = _load()
    _account(data, name)
    rows = [{"id": tid, "label": t.get("label"), "created": t["created"], "used": t.get("used")}
            for tid, t in data["tokens"].items() if t["user"] == name]
    return sorted(rows, key=lambda r: (r["created"], r["id"]))


def revoke(name, token_id, by=None):
    """Revoke one of the account's tokens. Audited user.token_revoke."""
    audit.ready()
    with _changing() as data:
        _account(data, name)
        t = data["tokens"].get(token_id) if isinstance(token_id, str) else None
        if t is None or t["user"] != name:
            raise NotFound(f"{name} has no token {token_id}")
        del data["tokens"][token_id]
    audit.append("user.token_revoke", **_details(by, name=name, id=token_id))


def bearer(token):
    """The principal an `Authorization: Bearer ovl_...` token speaks for, or None (malformed,
    unknown, revoked, of a removed account)."""
    m = TOKEN_RE.match(token) if isinstance(token, str) else None
    if m is None:
        return None
    data = _load()
    t = data["tokens"].get(m.group(1))
    if t is None or not hmac.compare_digest(_sha(token), t["sha256"]):
        return None
    rec = data["users"].get(t["user"])
    if rec is None or rec["id"] != t["account"]:
        return None
    used = t.get("used")
    if not _num(used) or time.time() - used >= TOUCH_EVERY:
        _touch_token(m.group(1))
    return Principal(name=rec["name"], role=rec["role"], via="bearer", token_id=m.group(1),
                     account=rec["id"], gen=rec["gen"])


def _touch_token(tid):
    try:
        with _changing() as data:
            t = data["tokens"].get(tid)
            if t is None:
                return
            t["used"] = round(time.time(), 3)
    except (OSError, OverlordError):
        pass                           # "used" is a courtesy; a full disk refuses no request


# -- durable logins ----------------------------------------------------------------------------

def _login_path(digest):
    return os.path.join(logins_dir(), digest + ".json")


def _cookie_digest(cookie_value):
    """The sha256 hex a login cookie's file is named by, or None for what is no cookie of ours."""
    if not isinstance(cookie_value, str) or not COOKIE_RE.match(cookie_value):
        return None
    return _sha(cookie_value)


@contextlib.contextmanager
def _logins_locked():
    root = store.ensure_home()
    os.makedirs(os.path.join(root, LOGINS_NAME), mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(root, LOGINS_NAME + ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_login(p):
    """The login file's record, or None when there is none or it cannot be trusted (not
    ours, readable by others, a link, damaged): such a file is removed."""
    try:
        opened = audit.open_owned(p, os.O_RDONLY, _file_error, 0o077, "read")
    except OverlordError:
        _drop(p)
        return None
    if opened is None:
        return None
    fd, _ = opened
    try:
        raw = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    try:
        rec = json.loads(raw.decode("utf-8"))
    except ValueError:
        rec = None
    if not isinstance(rec, dict) or not isinstance(rec.get("name"), str) \
            or not isinstance(rec.get("account"), str) or type(rec.get("gen")) is not int \
            or not _num(rec.get("seen")) or not _num(rec.get("created")):
        _drop(p)
        return None
    return rec


def _drop(p):
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


def login_create(name, via=None):
    """Start a login for the account: the cookie's value (shown to the browser once, never
    stored); the file is keyed by its sha256. Audited auth.login (name, via: "password" for a
    local account, "sso" for a single sign-on one, unless told).

    `name` may be the Principal check_password returned, or its .name (a CheckedName): then
    the login is refused (AuthError 401) when the account is no longer the one checked -- its
    password or role changed, or it was removed and the name given again, meanwhile."""
    if isinstance(name, Principal):
        stamp, name = (name.account, name.gen), name.name
    else:
        stamp = (getattr(name, "account", None), getattr(name, "gen", None))
    rec = _account(_load(), name)
    if (stamp[0] is not None and stamp[0] != rec["id"]) or \
            (stamp[1] is not None and stamp[1] != rec["gen"]):
        raise AuthError("the account changed while signing in: sign in again")
    name = str(name)
    via = via or ("sso" if rec.get("sso") else "password")
    audit.ready()
    cookie = secrets.token_urlsafe(32)
    digest = _sha(cookie)
    now = round(time.time(), 3)
    with _logins_locked():
        _sweep(now)
        store.write_json_atomic(_login_path(digest),
                                {"name": name, "account": rec["id"], "gen": rec["gen"],
                                 "created": now, "seen": now, "via": via},
                                0o600, sync_dir=True)
    audit.append("auth.login", name=name, via=via, login=digest[:12])
    return cookie


def _sweep(now):
    """Remove the login files idle past LOGIN_IDLE (their mtime says so first: a file is
    rewritten when it is touched)."""
    try:
        names = os.listdir(logins_dir())
    except FileNotFoundError:
        return
    for entry in names:
        if not LOGIN_FILE_RE.match(entry):
            continue
        p = os.path.join(logins_dir(), entry)
        try:
            if os.lstat(p).st_mtime > now - LOGIN_IDLE:
                continue
        except FileNotFoundError:
            continue
        rec = _read_login(p)
        if rec is not None and now - rec["seen"] > LOGIN_IDLE:
            _drop(p)


def login_lookup(cookie_value):
    """The principal of a login cookie, or None: malformed, unknown, idle past LOGIN_IDLE,
    of a removed account or of an account changed since (those files are removed). The role
    is the account's current one. "seen" is written at most once a minute."""
    digest = _cookie_digest(cookie_value)
    if digest is None:
        return None
    p = _login_path(digest)
    rec = _read_login(p)
    if rec is None:
        return None
    acct = _load()["users"].get(rec["name"])
    now = time.time()
    if acct is None or acct["id"] != rec["account"] or acct["gen"] != rec["gen"] \
            or now - rec["seen"] > LOGIN_IDLE:
        _drop(p)
        return None
    if now - rec["seen"] >= TOUCH_EVERY:
        _touch_login(p, rec, now)
    return Principal(name=acct["name"], role=acct["role"], via="cookie", login=digest,
                     account=acct["id"], gen=acct["gen"])


def _touch_login(p, seen_rec, now):
    """Write "seen" -- under the logins lock, and only while the file is still the login
    read (a login ended meanwhile is not brought back)."""
    with _logins_locked():
        rec = _read_login(p)
        if rec is None or rec["account"] != seen_rec["account"] or rec["gen"] != seen_rec["gen"]:
            return
        rec["seen"] = round(now, 3)
        store.write_json_atomic(p, rec, 0o600)


def login_end(cookie_value):
    """Sign-out: the login's file is removed. Audited auth.logout. True when there was one."""
    digest = _cookie_digest(cookie_value)
    if digest is None:
        return False
    p = _login_path(digest)
    with _logins_locked():
        rec = _read_login(p)
        if rec is None:
            return False
        _drop(p)
    audit.append("auth.logout", name=rec["name"], login=digest[:12])
    return True


def end_logins(name, keep=None):
    """End every login of the account but `keep` (a login's sha256 hex), which is carried
    over to the account's current generation. Returns how many ended."""
    acct = _load()["users"].get(name) if isinstance(name, str) else None
    ended = 0
    with _logins_locked():
        for entry in os.listdir(logins_dir()):
            if not LOGIN_FILE_RE.match(entry):
                continue
            p = os.path.join(logins_dir(), entry)
            rec = _read_login(p)
            if rec is None or rec["name"] != name:
                continue
            if keep is not None and entry == f"{keep}.json" and acct is not None \
                    and rec["account"] == acct["id"]:
                if rec["gen"] != acct["gen"]:
                    rec["gen"] = acct["gen"]
                    store.write_json_atomic(p, rec, 0o600, sync_dir=True)
                continue
            _drop(p)
            ended += 1
    return ended


# -- lockout -----------------------------------------------------------------------------------

def address_key(address):
    """What a per-address count (the lockout, the rate limit, pending sign-ins) counts by: the
    address; an IPv6 one by its /64 (one host's share: a client rotating inside it is one
    client), an IPv4-mapped one as the IPv4 address."""
    import ipaddress
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class Lockout:
    """Failed sign-ins per name and per address: `limit` within `window` seconds lock that
    key for `lock` seconds. In-process, thread-safe, pruned as it goes and bounded (`cap`
    keys: past it the stalest go first). A failure while locked is not counted again; the
    failures of the window stay after a lock ends, so one more failure locks again."""

    def __init__(self, limit=5, window=300, lock=60, cap=10000, clock=time.monotonic):
        self.limit, self.window, self.lock, self.cap, self.clock = limit, window, lock, cap, clock
        self._fails = {}           # (kind, key) -> [monotonic times], oldest first
        self._locks = {}           # (kind, key) -> until (monotonic)
        self._mutex = threading.Lock()
        self._pruned = clock()

    @staticmethod
    def _keys(name, address):
        keys = [("name", name)]
        if address:
            keys.append(("address", address_key(str(address))))
        return keys

    def locked(self, name, address=None):
        """(kind, key, seconds left) of the first lock holding, or None."""
        now = self.clock()
        with self._mutex:
            self._maybe_prune(now)
            for k in self._keys(name, address):
                until = self._locks.get(k)
                if until is not None and until > now:
                    return k[0], k[1], until - now
        return None

    def failed(self, name, address=None):
        """Count a failure; [(kind, key, seconds)] of the locks it starts."""
        now = self.clock()
        new = []
        with self._mutex:
            self._maybe_prune(now)
            for k in self._keys(name, address):
                if self._locks.get(k, 0) > now:
                    continue
                times = [t for t in self._fails.get(k, ()) if t > now - self.window]
                times.append(now)
                self._fails[k] = times[-self.limit:]
                if len(times) >= self.limit:
                    self._locks[k] = now + self.lock
                    new.append((k[0], k[1], self.lock))
            if len(self._fails) > self.cap or len(self._locks) > self.cap:
                self._prune(now)
        return new

    def succeeded(self, name):
        """A right password clears the name's failures (never the address's)."""
        with self._mutex:
            self._fails.pop(("name", name), None)

    def _maybe_prune(self, now):
        if now - self._pruned >= 30:
            self._prune(now)

    def _prune(self, now):
        self._pruned = now
        for k in [k for k, until in self._locks.items() if until <= now]:
            del self._locks[k]
        for k in [k for k, ts in self._fails.items() if not ts or ts[-1] <= now - self.window]:
            del self._fails[k]
        for table in (self._fails, self._locks):
            if len(table) > self.cap:           # the stalest first
                order = sorted(table, key=lambda k: table[k][-1] if isinstance(table[k], list)
                               else table[k])
                for k in order[:len(table) - self.cap]:
                    del table[k]

    def __len__(self):
        with self._mutex:
            return len(set(self._fails) | set(self._locks))

    def clear(self):
        with self._mutex:
            self._fails.clear()
            self._locks.clear()


lockout = Lockout()

WRONG = "wrong name or password"


def _refuse_while_locked(key, address):
    """AuthError 429 (with .retry_after) while the name or the address is locked."""
    held = lockout.locked(key, address)
    if held is not None:
        raise AuthError(f"too many failed sign-ins: try again in {math.ceil(held[2])} s",
                        retry_after=max(1, math.ceil(held[2])))


def check_password(name, password, address):
    """The principal (via="cookie") of a right name and password; else AuthError: 401 with
    the same words for an unknown name and a wrong password (each costing one scrypt), 429
    with .retry_after while the name or the address is locked. A name with "@" is a single
    sign-on account: refused without a lookup. Audited: auth.login_failed, auth.lockout."""
    name = name.strip().lower() if isinstance(name, str) else ""
    key = name[:254]
    _refuse_while_locked(key, address)
    if "@" in name:
        raise AuthError("sign in with single sign-on: this name is a single sign-on account")
    rec = _load()["users"].get(name) if LOCAL_NAME.fullmatch(name) else None
    right = _verify(rec.get("password") if rec else None, password) and rec is not None
    # again: a lock may have come while hashing (a burst of guesses waiting for a hash slot)
    _refuse_while_locked(key, address)
    if right:
        lockout.succeeded(key)
        return Principal(name=CheckedName(rec["name"], rec["id"], rec["gen"]), role=rec["role"],
                         via="cookie", account=rec["id"], gen=rec["gen"])
    new = lockout.failed(key, address)
    audit.append("auth.login_failed", name=key[:64], address=address)
    for kind, k, seconds in new:
        audit.append("auth.lockout", kind=kind, key=k[:64],
                     until=round(time.time() + seconds, 3))
    raise AuthError(WRONG)


# -- roles -------------------------------------------------------------------------------------

def _owner(meta):
    if meta is None:
        return None
    getter = getattr(meta, "get", None)
    return getter("owner") if getter else getattr(meta, "owner", None)


def _operator_owns(principal, meta):
    return principal.role == "operator" and principal.name is not None \
        and _owner(meta) == principal.name


def can_see(principal, meta):
    """admin and the launch token: everything; viewer: everything; operator: its own
    (meta["owner"] == its name; a CLI session, owner None, is the admin's)."""
    if not isinstance(principal, Principal):
        return False
    if principal.via == "launch" or principal.role in ("admin", "viewer"):
        return True
    return _operator_owns(principal, meta)


def can_change(principal, meta):
    """admin and the launch token: everything; viewer: nothing; operator: its own."""
    if not isinstance(principal, Principal):
        return False
    if principal.via == "launch" or principal.role == "admin":
        return True
    return _operator_owns(principal, meta)
