"""Webhooks: tell a channel when an audited act happens (issue 16). The one writer of
OVERLORD_HOME/webhooks.json and OVERLORD_HOME/notify/.

    webhooks.json (0600)  {"base_url": str|null,
                           "hooks": {NAME: {"url", "format": "slack"|"json", "on": [actions],
                                            "secret": str|null, "allow_private": bool,
                                            "created"}}}
    notify/queue.jsonl    the spool: one {"id", "hook", "entry", "queued"} line per delivery owed
    notify/state.json     {"offset"}: the queue bytes already delivered (or given up on)
    notify/deliveries.jsonl  outcomes, the last KEEP kept; never a secret, never a URL's path
    notify/queue.lock     held while a line is appended or the spool is emptied
    notify/sender.lock    held by the one running sender

audit.append calls after_append(entry) after every act. With no webhooks.json that is one
stat. When a hook subscribes to the act, a line goes on the spool and a detached sender
process is started unless one runs (flock on sender.lock; it looks again after letting go,
the pattern of trust/witness.py). The sender delivers each line -- three attempts, 1 s then
4 s apart (OVERLORD_NOTIFY_BACKOFF scales the base), a 4xx tried once, a 5xx, a timeout or a
refused connection tried again, OVERLORD_NOTIFY_TIMEOUT (10 s) for each whole attempt -- and
moves the offset past it. A sender that dies leaves the rest for the next one: delivery is at
least once (X-Overlord-Delivery names each delivery, so a receiver can drop a repeat).

At send time the host is resolved once and every address checked (loopback, link-local,
private, CGNAT, ULA, unspecified, multicast, reserved, IPv4-mapped/compatible/6to4/NAT64
forms of those are refused unless the hook allows private targets); the connection goes to
the checked address itself (no second lookup; Host and TLS SNI name the host). Redirects are
not followed. A secret (literal, or `secret://NAME` resolved by trust/vault.py at sign time)
signs the body: X-Overlord-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>.
docs/WEBHOOKS.md.

Nothing heavy at module level: this module is imported on every audit append.
"""
import json
import os

CONFIG_NAME = "webhooks.json"
DIR_NAME = "notify"
QUEUE_NAME = "queue.jsonl"
STATE_NAME = "state.json"
LOG_NAME = "deliveries.jsonl"
QUEUE_LOCK = "queue.lock"
SENDER_LOCK = "sender.lock"
LOG_LOCK = "deliveries.lock"

FORMATS = ("slack", "json")
DEFAULT_ON = ("session.needs_review", "connector.approval_requested")
ATTEMPTS = 3
BACKOFF = (1, 4)                 # seconds (times OVERLORD_NOTIFY_BACKOFF) before attempts 2, 3
TIMEOUT = 10.0                   # one whole attempt: resolve, connect, send, status line
KEEP = 500                       # delivery log lines kept
MAX_NAME = 64
MAX_URL = 2048
MAX_SECRET = 4096
SIGNATURE_HEADER = "X-Overlord-Signature"


def config_path():
    from overlord.txn import store
    return os.path.join(store.home(), CONFIG_NAME)


def notify_dir():
    from overlord.txn import store
    return os.path.join(store.home(), DIR_NAME)


def _path(name):
    return os.path.join(notify_dir(), name)


# -- the hook that runs after every audit append ------------------------------------------------

_sending = False            # set in the detached sender: what it appends is not spooled again


def after_append(entry):
    """Spool the act for every hook subscribed to it and make sure a sender runs. One stat
    when no webhook is configured; never raises into the act (audit.append catches too)."""
    if _sending:
        return None         # the sender's own acts (a secret it resolved) would feed it forever
    from overlord.txn import store
    try:
        os.stat(os.path.join(store.home(), CONFIG_NAME))
    except OSError:
        return None
    try:
        conf = load()
        action = entry.get("action")
        names = [n for n, h in sorted(conf["hooks"].items()) if subscribed(h, action)]
        if not names:
            return None
        enqueue(entry, names)
        ensure_sender()
    except Exception:       # noqa: BLE001 - a webhook never fails the act it tells of
        return None
    return None


def subscribed(hook, action):
    """Whether the hook is told of the act: named in its `on`, or "*" (every act but
    webhook.test, which `webhooks test` delivers itself; name it to be told of tests)."""
    return action in hook["on"] or ("*" in hook["on"] and action != "webhook.test")


# -- configuration ------------------------------------------------------------------------------

def _err(msg):
    from overlord.errors import OverlordError
    return OverlordError(msg)


def _usage(msg):
    from overlord.errors import UsageError
    return UsageError(msg)


def _show(text, cap=120):
    from overlord.text import escape_text
    text = str(text)
    return escape_text(text if len(text) <= cap else text[:cap] + "...")


def _empty():
    return {"base_url": None, "hooks": {}}


def load():
    """The configuration ({"base_url", "hooks"}); empty when there is none. A file that is not
    ours, readable by group/other, or damaged raises OverlordError naming it."""
    import stat
    path = config_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return _empty()
    except OSError as exc:
        raise _err(f"cannot read the webhook config {_show(path)}: {exc.strerror}") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _err(f"refusing the webhook config {_show(path)}: not a regular file")
        if st.st_uid != os.geteuid():
            raise _err(f"refusing the webhook config {_show(path)}: it belongs to uid "
                       f"{st.st_uid}, not you")
        if st.st_mode & 0o077:
            raise _err(f"refusing the webhook config {_show(path)}: mode "
                       f"{stat.S_IMODE(st.st_mode):04o} lets others read it; run: chmod 600 "
                       f"{_show(path)}")
        try:
            data = json.load(f)
        except (ValueError, RecursionError):
            raise _err(f"the webhook config {_show(path)} is damaged (not JSON)") from None
    if not isinstance(data, dict) or not isinstance(data.get("hooks", {}), dict):
        raise _err(f"the webhook config {_show(path)} is damaged (not an object with hooks)")
    base = data.get("base_url")
    hooks = {}
    for name, h in data.get("hooks", {}).items():
        if not isinstance(h, dict) or not isinstance(h.get("url"), str):
            raise _err(f"the webhook config {_show(path)} is damaged (hook {_show(name)})")
        on = h.get("on") or list(DEFAULT_ON)
        hooks[name] = {"url": h["url"], "format": h.get("format") if h.get("format") in FORMATS
                       else "slack",
                       "on": [a for a in on if isinstance(a, str)],
                       "secret": h.get("secret") if isinstance(h.get("secret"), str) else None,
                       "allow_private": h.get("allow_private") is True,
                       "created": h.get("created")}
    return {"base_url": base if isinstance(base, str) else None, "hooks": hooks}


def _save(conf):
    from overlord.txn import store
    store.ensure_home()
    store.write_json_atomic(config_path(), conf, mode=0o600)


class _Flock:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        import fcntl
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _config_lock():
    from overlord.txn import store
    store.ensure_home()
    return _Flock(os.path.join(store.home(), "webhooks.lock"))


def check_name(name):
    import re
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise _usage(f"not a webhook name: {_show(name)} (a letter or digit, then up to "
                     f"{MAX_NAME - 1} letters, digits, '_', '.', '-')")
    return name


def check_url(url, what="webhook URL"):
    """An http(s) URL with a host (no credentials, no whitespace or controls), or UsageError."""
    import urllib.parse
    bad = _usage(f"{what} must be http:// or https:// with a host: {_show(url)}")
    if not isinstance(url, str) or not url or len(url) > MAX_URL \
            or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise bad
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port                                   # noqa: B018 - raises on a bad port
    except ValueError:
        raise bad from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad
    if parts.username is not None or parts.password is not None:
        raise _usage(f"{what} must not carry a user or password (they would be kept and shown "
                     f"as part of the URL; sign with --secret-stdin instead): {_show(url.split('@')[-1])}")
    return url


def check_actions(on):
    from overlord.trust import audit
    out = []
    for action in on or ():
        if action != "*" and action not in audit.ACTIONS:
            raise _usage(f"--on {_show(action)}: not an audited act (one of: *, "
                         f"{', '.join(audit.ACTIONS)})")
        if action not in out:
            out.append(action)
    return out or list(DEFAULT_ON)


def check_secret(secret):
    if secret is None:
        return None
    if not isinstance(secret, str) or not secret.strip():
        raise _usage("the webhook secret is empty")
    if len(secret) > MAX_SECRET or any(ord(c) < 32 or ord(c) == 127 for c in secret):
        raise _usage(f"the webhook secret must be one line of at most {MAX_SECRET} characters")
    vault = _vault()
    if vault is not None and hasattr(vault, "looks_like_ref") and vault.looks_like_ref(secret) \
            and not vault.valid_name(secret[len("secret://"):]):
        raise _usage("the webhook secret starts with secret:// but is not a valid reference "
                     "(names: letters, digits and _ . / -, no '..' segment)")
    return secret


def secret_view(secret):
    """What a listing shows of a secret: None, "set", or the reference itself."""
    if secret is None:
        return None
    vault = _vault()
    if vault is not None and hasattr(vault, "is_ref"):
        if vault.is_ref(secret):
            return secret
    elif secret.startswith("secret://"):
        return secret
    return "set"


def _vault():
    try:
        from overlord.trust import vault
    except ImportError:
        return None
    return vault


def _host_of(url):
    import urllib.parse
    try:
        return urllib.parse.urlsplit(url).hostname or ""
    except ValueError:
        return ""


def add(name, url, fmt="slack", on=(), secret=None, allow_private=False):
    """Add a hook; returns its public view. Refuses a name in use. Audited webhook.add."""
    import time
    from overlord.trust import audit
    check_name(name)
    check_url(url)
    if fmt not in FORMATS:
        raise _usage(f"--format {_show(fmt)}: one of {', '.join(FORMATS)}")
    on = check_actions(on)
    secret = check_secret(secret)
    if not isinstance(allow_private, bool):
        raise _usage("allow_private is true or false")
    with _config_lock():
        conf = load()
        if name in conf["hooks"]:
            raise _err(f"a webhook named {name} exists (remove it first: overlord webhooks rm {name})")
        hook = {"url": url, "format": fmt, "on": on, "secret": secret,
                "allow_private": allow_private, "created": time.time()}
        conf["hooks"][name] = hook
        _save(conf)
    audit.append("webhook.add", name=name, host=_host_of(url), format=fmt, on=on,
                 signed=secret is not None, allow_private=allow_private)
    return public_hook(name, hook)


def remove(name):
    """Remove a hook (its spooled deliveries are dropped when their turn comes). Audited."""
    from overlord.errors import NotFound
    from overlord.trust import audit
    check_name(name)
    with _config_lock():
        conf = load()
        if name not in conf["hooks"]:
            raise NotFound(f"no webhook named {name} (overlord webhooks list)")
        del conf["hooks"][name]
        _save(conf)
    audit.append("webhook.remove", name=name)
    return {"name": name, "removed": True}


def set_base_url(url):
    """The workspace's address for links (`<base>/?sid=SID`); None clears it. Audited."""
    from overlord.trust import audit
    if url is not None:
        check_url(url, "the base URL")
        url = url.rstrip("/")
    with _config_lock():
        conf = load()
        conf["base_url"] = url
        _save(conf)
    audit.append("webhook.base_url", url=url)
    return {"base_url": url}


def public_hook(name, hook):
    return {"name": name, "url": hook["url"], "host": _host_of(hook["url"]),
            "format": hook["format"], "on": list(hook["on"]),
            "secret": secret_view(hook["secret"]), "allow_private": hook["allow_private"],
            "created": hook.get("created")}


def listing():
    """{"base_url", "hooks": [public views, by name], "queued": deliveries waiting}."""
    conf = load()
    return {"base_url": conf["base_url"],
            "hooks": [public_hook(n, h) for n, h in sorted(conf["hooks"].items())],
            "queued": pending()}


# -- the spool ----------------------------------------------------------------------------------

def _ensure_dir():
    from overlord.txn import store
    store.ensure_home()
    d = notify_dir()
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    import stat
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise _err(f"refusing {_show(d)}: not a directory of ours")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(d, 0o700)
    return d


def enqueue(entry, hooks):
    """Append one spool line per hook, whole lines under the queue lock."""
    import secrets
    import time
    _ensure_dir()
    lines = "".join(json.dumps({"id": secrets.token_hex(8), "hook": h, "entry": entry,
                                "queued": time.time()}, sort_keys=True,
                               ensure_ascii=True) + "\n" for h in hooks).encode("ascii")
    with _Flock(_path(QUEUE_LOCK)):
        fd = os.open(_path(QUEUE_NAME), os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                     | os.O_NOFOLLOW, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                lines = b"\n" + lines                # a torn line never swallows the next one
            from overlord.txn import store
            store.write_all(fd, lines)
            os.fsync(fd)
        finally:
            os.close(fd)


def _read_state():
    try:
        with open(_path(STATE_NAME), encoding="utf-8") as f:
            data = json.load(f)
        off = data.get("offset") if isinstance(data, dict) else None
        return off if type(off) is int and off >= 0 else 0
    except (OSError, ValueError, RecursionError):
        return 0


def _write_state(offset):
    from overlord.txn import store
    store.write_json_atomic(_path(STATE_NAME), {"offset": offset}, mode=0o600)


def _queue_size():
    try:
        return os.stat(_path(QUEUE_NAME)).st_size
    except OSError:
        return 0


def pending():
    """How many spooled deliveries wait (complete lines past the offset)."""
    try:
        with open(_path(QUEUE_NAME), "rb") as f:
            f.seek(_read_state())
            data = f.read()
    except OSError:
        return 0
    return sum(1 for line in data.split(b"\n")[:-1] if line.strip())


def _next_line(offset):
    """(line bytes, end offset) of the next complete spool line at offset, or None."""
    try:
        with open(_path(QUEUE_NAME), "rb") as f:
            f.seek(offset)
            line = f.readline()
    except OSError:
        return None
    if not line.endswith(b"\n"):
        return None
    return line, offset + len(line)


def _compact():
    """Empty the spool once everything in it is done (under the queue lock, so no append
    lands in between). The offset is reset first: a crash between the two re-sends (at least
    once), never skips."""
    with _Flock(_path(QUEUE_LOCK)):
        size = _queue_size()
        if size and _read_state() >= size:
            _write_state(0)
            fd = os.open(_path(QUEUE_NAME), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)


# -- the sender ---------------------------------------------------------------------------------

def _sender_fd():
    _ensure_dir()
    return os.open(_path(SENDER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def sender_running():
    import fcntl
    fd = _sender_fd()
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def ensure_sender():
    """Start a detached sender unless one runs (it looks at the spool again after it lets go
    of its lock, so a line appended while it finishes is never left behind)."""
    if sender_running():
        return False
    import subprocess
    from overlord import relaunch
    from overlord.txn import store
    env = dict(os.environ, OVERLORD_HOME=store.home())
    subprocess.Popen(relaunch.module_argv("overlord.trust.notify", "--send"),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, cwd="/", env=env, start_new_session=True,
                     close_fds=True)
    return True


def run_sender():
    """Drain the spool under the sender lock; after letting go, look once more."""
    import fcntl
    from overlord.trust import notify as imported   # run as __main__, audit sees this one
    imported._sending = True
    fd = _sender_fd()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        while True:
            drain()
            fcntl.flock(fd, fcntl.LOCK_UN)
            if _next_line(_read_state()) is None:
                return 0
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0            # another sender took over
    finally:
        imported._sending = False
        os.close(fd)


def drain():
    """Deliver every complete spool line past the offset, moving the offset past each as it
    is done (delivered, or given up on); empty the spool when all is done."""
    while True:
        offset = _read_state()
        size = _queue_size()
        if offset > size:           # the spool was emptied under a stale offset
            offset = 0
            _write_state(0)
        got = _next_line(offset)
        if got is None:
            break
        line, end = got
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            item = None
        if isinstance(item, dict) and isinstance(item.get("entry"), dict) \
                and isinstance(item.get("hook"), str):
            deliver_item(item)
        _write_state(end)
    _compact()


def deliver_item(item):
    """One spooled delivery with retries; logs and returns the outcome."""
    import time
    name, entry = item["hook"], item["entry"]
    try:
        conf = load()
    except Exception as exc:  # noqa: BLE001 - a damaged config: say so in the log
        return _log(_outcome(name, entry, item.get("id"), None, 0, False, None, str(exc)))
    hook = conf["hooks"].get(name)
    if hook is None:
        return _log(_outcome(name, entry, item.get("id"), None, 0, False, None,
                             "the webhook was removed before delivery"))
    base = _backoff_base()
    attempts, result = 0, None
    while attempts < ATTEMPTS:
        if attempts:
            time.sleep(BACKOFF[min(attempts - 1, len(BACKOFF) - 1)] * base)
        attempts += 1
        result = send(name, hook, entry, conf["base_url"], item.get("id"))
        if result["ok"] or not result["retry"]:
            break
    return _log(_outcome(name, entry, item.get("id"), _host_of(hook["url"]), attempts,
                         result["ok"], result["status"], result["error"]))


def _backoff_base():
    try:
        value = float(os.environ.get("OVERLORD_NOTIFY_BACKOFF", "1"))
    except ValueError:
        return 1.0
    return value if 0 <= value <= 60 else 1.0


def _timeout():
    try:
        value = float(os.environ.get("OVERLORD_NOTIFY_TIMEOUT", str(TIMEOUT)))
    except ValueError:
        return TIMEOUT
    return value if 0 < value <= TIMEOUT else TIMEOUT


def _outcome(name, entry, ident, host, attempts, ok, status, error, test=False):
    import time
    return {"ts": time.time(), "hook": name, "id": ident, "action": entry.get("action"),
            "seq": entry.get("seq"), "sid": entry.get("sid"), "host": host,
            "attempts": attempts, "ok": bool(ok), "status": status, "error": error,
            "test": test}


def _log(outcome):
    """Append an outcome to the delivery log, keeping the last KEEP lines."""
    try:
        _ensure_dir()
        path = _path(LOG_NAME)
        line = json.dumps(outcome, sort_keys=True, ensure_ascii=True) + "\n"
        with _Flock(_path(LOG_LOCK)):
            try:
                with open(path, encoding="utf-8") as f:
                    lines = f.readlines()
            except FileNotFoundError:
                lines = []
            if len(lines) + 1 > KEEP:
                from overlord.txn import store
                kept = [ln for ln in lines if ln.endswith("\n")][-(KEEP - 1):] + [line]
                tmp = path + f".tmp-{os.getpid()}"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                             | os.O_NOFOLLOW, 0o600)
                try:
                    store.write_all(fd, "".join(kept).encode("ascii"))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, path)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                             | os.O_NOFOLLOW, 0o600)
                try:
                    os.write(fd, line.encode("ascii"))
                finally:
                    os.close(fd)
    except OSError:
        pass
    return outcome


def deliveries(limit=50):
    """The last `limit` outcomes, newest first."""
    try:
        limit = int(limit)
    except (TypeError, ValueError):
        raise _usage(f"limit must be a number: {_show(limit)}") from None
    if not 1 <= limit <= KEEP:
        raise _usage(f"limit must be 1..{KEEP}")
    try:
        with open(_path(LOG_NAME), encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return []
    out = []
    for line in reversed(lines):
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
        if len(out) >= limit:
            break
    return out


def test(name):
    """Deliver a test message to one hook now, one attempt, synchronously; returns the
    outcome (also in the delivery log). Audited webhook.test with the outcome."""
    import secrets
    import time
    from overlord.errors import NotFound
    from overlord.trust import audit
    check_name(name)
    conf = load()
    hook = conf["hooks"].get(name)
    if hook is None:
        raise NotFound(f"no webhook named {name} (overlord webhooks list)")
    entry = {"action": "webhook.test", "actor": audit.current_actor(), "ts": time.time(),
             "name": name, "test": True}
    ident = secrets.token_hex(8)
    result = send(name, hook, entry, conf["base_url"], ident)
    outcome = _log(_outcome(name, entry, ident, _host_of(hook["url"]), 1, result["ok"],
                            result["status"], result["error"], test=True))
    audit.append("webhook.test", name=name, ok=outcome["ok"], status=outcome["status"],
                 error=outcome["error"])
    return outcome


# -- the message --------------------------------------------------------------------------------

def _who(actor):
    if not isinstance(actor, str) or not actor:
        return "someone"
    for prefix in ("account:", "cli:", "web:"):
        if actor.startswith(prefix):
            return actor[len(prefix):] or "someone"
    head, sep, rest = actor.partition(":")
    if sep and head.isdigit() and rest:
        return rest
    return actor


def text_of(entry, base_url=None):
    """The readable one-liner for an act, with a link when a base URL is set and the act
    names a session."""
    action = entry.get("action") or "?"
    who = _who(entry.get("actor"))
    sid = entry.get("sid") if isinstance(entry.get("sid"), str) else None
    target = entry.get("target") if isinstance(entry.get("target"), str) else None
    where = f" in {target}" if target else ""
    if action == "session.needs_review":
        n = entry.get("changes")
        if entry.get("by") == "agent":
            what = (f"{who}'s agent finished with {n} change{'s' if n != 1 else ''} waiting for "
                    f"review" if isinstance(n, int) else f"{who}'s agent finished with changes "
                    f"waiting for review")
        else:
            what = f"{who} asked for a review of session {sid}"
        text = what + where
    elif action == "connector.approval_requested":
        text = (f"{who}'s agent asks to run {entry.get('server')}.{entry.get('tool')} "
                f"(waiting for approval){where}")
    elif action == "budget.stop":
        text = f"{who}'s session stopped at its {entry.get('key')} budget{where}"
    elif action == "session.commit":
        text = f"{who} committed session {sid}{where}"
    elif action == "review.verdict":
        text = f"review of session {sid}: {entry.get('verdict') or entry.get('outcome') or 'verdict'}"
    elif action == "webhook.test":
        text = f"OVERLORD test message for webhook {entry.get('name')} (sent by {who})"
    else:
        text = f"{who}: {action}" + (f" (session {sid})" if sid else "") + where
    text = " ".join(str(text).split())               # one line
    if base_url and sid:
        import urllib.parse
        text += f" — {base_url.rstrip('/')}/?sid={urllib.parse.quote(sid, safe='')}"
    return text


def body_of(fmt, entry, base_url=None):
    """The request body (bytes) for a hook's format."""
    text = text_of(entry, base_url)
    if fmt == "json":
        data = dict(entry, text=text)
    else:
        data = {"text": text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")}
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signature(secret, t, body):
    import hashlib
    import hmac
    mac = hmac.new(secret.encode("utf-8"), f"{t}.".encode("ascii") + body, hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


# -- the guard and the request ------------------------------------------------------------------

def blocked(address):
    """Why an address is refused without allow_private, or None (the one guard every
    outbound path shares: overlord/sandbox/netallow.py)."""
    from overlord.sandbox import netallow
    return netallow.blocked(address)


def _resolve(host, port, allow_private):
    """[(family, address)] of host, every one checked; raises _Refused."""
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise _Fail(f"cannot resolve {host}: {getattr(exc, 'strerror', None) or exc}", retry=True) from None
    out = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        addr = sockaddr[0]
        if not allow_private:
            why = blocked(addr)
            if why:
                raise _Fail(f"refused: {host} resolves to {addr} ({why}); a private target "
                            f"needs --allow-private", retry=False)
        if (family, addr) not in out:
            out.append((family, addr))
    if not out:
        raise _Fail(f"cannot resolve {host}: no address", retry=True)
    return out


class _Fail(Exception):
    def __init__(self, message, retry):
        super().__init__(message)
        self.retry = retry


def send(name, hook, entry, base_url, ident=None):
    """One attempt: {"ok", "status", "error", "retry"}. Never raises."""
    import time
    try:
        body = body_of(hook["format"], entry, base_url)
        headers = {"Content-Type": "application/json; charset=utf-8",
                   "User-Agent": "overlord-notify", "X-Overlord-Event": str(entry.get("action")),
                   "X-Overlord-Hook": name}
        if ident:
            headers["X-Overlord-Delivery"] = ident
        if hook.get("secret"):
            secret = hook["secret"]
            vault = _vault()
            if vault is not None and hasattr(vault, "resolve"):
                try:
                    secret = vault.resolve(secret, f"webhook {name}")
                except Exception as exc:  # noqa: BLE001 - an unresolved secret: no delivery
                    return {"ok": False, "status": None, "retry": True,
                            "error": "the signing secret could not be resolved: "
                             f"{getattr(exc, 'short', None) or exc}"}   # never the resolver's stderr
            headers[SIGNATURE_HEADER] = signature(secret, int(time.time()), body)
        status = _post(hook["url"], body, headers, hook.get("allow_private", False))
    except _Fail as exc:
        return {"ok": False, "status": None, "error": str(exc), "retry": exc.retry}
    except Exception as exc:  # noqa: BLE001 - whatever it was, the act is not failed by it
        return {"ok": False, "status": None, "error": f"{type(exc).__name__}: {exc}",
                "retry": True}
    if 200 <= status < 300:
        return {"ok": True, "status": status, "error": None, "retry": False}
    if 300 <= status < 400:
        return {"ok": False, "status": status, "retry": False,
                "error": f"HTTP {status}: redirects are not followed"}
    if 400 <= status < 500:
        return {"ok": False, "status": status, "retry": False, "error": f"HTTP {status}"}
    return {"ok": False, "status": status, "retry": True, "error": f"HTTP {status}"}


def _post(url, body, headers, allow_private):
    """POST body to url over a socket opened to the checked address; returns the status.
    The whole attempt is bounded by the timeout (a timer shuts the socket down)."""
    import http.client
    import socket
    import ssl
    import threading
    import time
    import urllib.parse
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    try:
        host = host.encode("idna").decode("ascii")     # an international name, as DNS and TLS see it
    except UnicodeError:
        raise _Fail(f"not a host name: {_show(host)}", retry=False) from None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    limit = _timeout()
    end = time.monotonic() + limit
    addrs = _resolve(host, port, allow_private)
    socks, lock, expired = [], threading.Lock(), []

    def expire():
        with lock:
            expired.append(True)
            for s in socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    try:
        last = None
        for family, addr in addrs:
            left = end - time.monotonic()
            if left <= 0 or expired:
                break
            sock = socket.socket(family, socket.SOCK_STREAM)
            with lock:
                socks.append(sock)
            sock.settimeout(left)
            try:
                sock.connect((addr, port) if family == socket.AF_INET else (addr, port, 0, 0))
            except OSError as exc:
                sock.close()
                last = exc
                continue
            break
        else:
            sock = None
        if sock is None or expired:
            if expired or isinstance(last, (socket.timeout, TimeoutError)):
                raise _Fail(f"no answer from {host} in {limit:g} s", retry=True)
            why = getattr(last, "strerror", None) or str(last)
            raise _Fail(f"cannot connect to {host}: {why}", retry=True)
        if parts.scheme == "https":
            ctx = ssl.create_default_context()
            tls = ctx.wrap_socket(sock, server_hostname=host)
            with lock:
                socks.append(tls)
            sock = tls
        sock.settimeout(max(0.001, end - time.monotonic()))
        conn = http.client.HTTPConnection(host, port, timeout=max(0.001, end - time.monotonic()))
        conn.sock = sock                              # already connected: no lookup of its own
        if parts.scheme == "https" and port != 443 or parts.scheme == "http" and port != 80:
            host_header = f"{_bracket(host)}:{port}"
        else:
            host_header = _bracket(host)
        conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host_header)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body)))
        conn.putheader("Connection", "close")
        conn.endheaders(body)
        resp = conn.getresponse()
        status = resp.status
        try:
            resp.read(4096)
        except (OSError, http.client.HTTPException):
            pass
        conn.close()
        return status
    except _Fail:
        raise
    except ssl.SSLError as exc:
        raise _Fail(f"TLS with {host} failed: {exc.reason or exc}", retry=True) from None
    except (OSError, http.client.HTTPException) as exc:
        if expired or isinstance(exc, (socket.timeout, TimeoutError)):
            raise _Fail(f"no answer from {host} in {limit:g} s", retry=True) from None
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise _Fail(f"the request to {host} failed: {why}", retry=True) from None
    finally:
        timer.cancel()
        for s in socks:
            try:
                s.close()
            except OSError:
                pass


def _bracket(host):
    return f"[{host}]" if ":" in host else host


if __name__ == "__main__" and __import__("sys").argv[1:] == ["--send"]:
    import sys
    try:
        sys.exit(run_sender())
    except Exception:       # noqa: BLE001 - a detached best-effort sender has no one to tell
        sys.exit(1)
