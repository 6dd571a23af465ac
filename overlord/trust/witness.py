"""The witness: an off-box, append-only holder of the audit chain's signed head.

The client (OVERLORD_HOME/witness.json: {"url", "auto"}) POSTs {"seq", "hash", "mac"} (mac =
HMAC-SHA256(audit key, "witness\\n{seq}\\n{hash}")) and GETs the head the witness holds back,
so `overlord audit verify --witness` catches a truncation or a rewrite even by someone who
holds the key. With `auto`, every append hands the new head to a detached sender process
(the CLI exits right after its act), throttled to one POST a second across processes and
never failing or slowing the act.

The reference receiver (`overlord audit witness-serve`) keeps the highest head it was sent in
a store file (written atomically) and refuses (409) a lower seq or a different head at the
same seq. Protocol: docs/AUDIT.md.
"""
import fcntl
import hmac
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from overlord.errors import OverlordError, UsageError
from overlord.text import escape_path, escape_text
from overlord.trust import audit
from overlord.txn import store

CONFIG_NAME = "witness.json"
SENT_NAME = "witness.sent"          # {"ts", "seq", "error"}: the last send (the throttle)
LOCK_NAME = "witness.lock"          # held by the one running sender
INTERVAL = 1.0                      # at most one automatic POST a second
TIMEOUT = 5.0                       # each socket operation of a witness request
DEADLINE = 10.0                     # the whole request: connect, send, headers and body
MAX_BODY = 4096                     # a head is ~200 bytes


def config_path():
    return os.path.join(store.home(), CONFIG_NAME)


def _path(name):
    return os.path.join(store.home(), name)


def check_url(url):
    """An http(s) URL with a host, or UsageError."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        parts = None
    if not isinstance(url, str) or parts is None or parts.scheme not in ("http", "https") \
            or not parts.hostname:
        raise UsageError(f"witness URL must be http:// or https:// with a host: {escape_text(str(url))}")
    return url


_MISSING = object()                  # _load_json's answer for a file that is not there


def _load_json(path, what):
    """The JSON file's value, _MISSING when there is none; OverlordError "WHAT PATH: cannot be
    read (why)" when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return _MISSING
    except (ValueError, OSError, RecursionError) as exc:
        raise OverlordError(f"{what} {escape_path(path)}: cannot be read ({exc})") from None


def load_config():
    """{"url", "auto"} or None when no witness is configured."""
    path = config_path()
    data = _load_json(path, "witness config")
    if data is _MISSING:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str) \
            or not isinstance(data.get("auto", False), bool):
        raise OverlordError(f"witness config {escape_path(path)}: not {{\"url\": ..., \"auto\": bool}}")
    check_url(data["url"])
    return {"url": data["url"], "auto": data.get("auto", False)}


def configure(url, auto=False):
    """Write the witness config; returns it."""
    data = {"url": check_url(url), "auto": bool(auto)}
    store.ensure_home()
    store.write_json_atomic(config_path(), data)
    return data


def resolve_url(url=None):
    """url, checked, or the configured witness's; OverlordError when none is configured."""
    if url:
        return check_url(url)
    conf = load_config()
    if conf is None:
        raise OverlordError("no witness configured (`overlord audit witness URL` sets one)")
    return conf["url"]


def signed_head():
    """{"seq", "hash", "mac"} of the live log's head, its mac keyed by the audit key."""
    key = audit.load_key()
    head = audit.head()
    if key is None or not head["hash"]:
        raise OverlordError("the audit log has no signed head to send (no key, or no line yet)")
    return {"seq": head["seq"], "hash": head["hash"],
            "mac": audit.witness_mac(key, head["seq"], head["hash"])}


class _Deadline:
    """One request's whole time: each socket it opens is shut down when the time is up,
    whatever the request is blocked in (the headers, the body), so a witness that trickles its
    answer cannot hold the caller past DEADLINE. urllib's own timeout is per socket operation."""

    def __init__(self, seconds):
        self.seconds, self.end = seconds, time.monotonic() + seconds
        self.lock, self.socks, self.expired = threading.Lock(), [], False
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True
        self.timer.start()

    def left(self):
        return max(0.001, self.end - time.monotonic())

    def over(self):
        return self.expired or time.monotonic() >= self.end

    def watch(self, sock):
        with self.lock:
            self.socks.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def _expire(self):
        with self.lock:
            self.expired = True
            for sock in self.socks:
                _shut(sock)

    def cancel(self):
        self.timer.cancel()


def _shut(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass            # closed already, or detached (wrapped for TLS: its wrapper is watched)


def _opener(deadline):
    """A urllib opener (proxies and redirects as usual) whose connections are deadline's."""
    def bounded(base):
        class Connection(base):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                create = self._create_connection
                self._create_connection = lambda *a, **kw: deadline.watch(create(*a, **kw))

            def connect(self):        # (CPython bounds a TLS handshake by the socket timeout)
                self.timeout = min(TIMEOUT, deadline.left())
                super().connect()
                deadline.watch(self.sock)             # the TLS wrapper, once there is one
        return Connection

    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(bounded(http.client.HTTPConnection), req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(bounded(http.client.HTTPSConnection), req, context=self._context)

    return urllib.request.build_opener(HTTP, HTTPS)


def _read_body(resp, url, deadline):
    """The body, read in chunks against the deadline and never past MAX_BODY."""
    raw = b""
    while True:
        if deadline.over():
            raise _late(url, deadline)
        chunk = resp.read1(MAX_BODY + 1 - len(raw))
        if not chunk:
            if deadline.over():           # cut short by the deadline, not the end of the body
                raise _late(url, deadline)
            return raw
        raw += chunk
        if len(raw) > MAX_BODY:
            raise OverlordError(f"witness {escape_text(url)} answered with more than "
                                f"{MAX_BODY} bytes: not a head")


def _late(url, deadline):
    return OverlordError(f"witness {escape_text(url)} did not answer in time "
                         f"({deadline.seconds:g} s)")


def _request(url, data=None):
    """(status, parsed JSON body or None) of one request, all of it within DEADLINE;
    OverlordError when the witness does not answer (in time)."""
    body = None if data is None else json.dumps(data, sort_keys=True).encode("ascii")
    req = urllib.request.Request(url, data=body, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json"})
    deadline = _Deadline(DEADLINE)
    try:
        try:
            with _opener(deadline).open(req, timeout=min(TIMEOUT, DEADLINE)) as resp:
                status, raw = resp.status, _read_body(resp, url, deadline)
        except urllib.error.HTTPError as exc:
            with exc:
                status, raw = exc.code, _read_body(exc, url, deadline) if exc.fp else b""
    except OverlordError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        if deadline.over():
            raise _late(url, deadline) from None
        reason = getattr(exc, "reason", exc)
        raise OverlordError(f"witness {escape_text(url)} did not answer: "
                            f"{escape_text(str(reason))}") from None
    finally:
        deadline.cancel()
    return status, _json(raw)


def _json(raw):
    """Parsed JSON, or None for anything else (however deeply it nests)."""
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return None


def send(url=None, head=None):
    """POST the signed head (the live one unless given); returns it. A refusal (409) or any
    other non-2xx answer raises OverlordError."""
    url = resolve_url(url)
    head = head or signed_head()
    status, body = _request(url, head)
    if not 200 <= status < 300:
        why = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), str) else ""
        raise OverlordError(f"witness {escape_text(url)} refused the head seq {head['seq']} "
                            f"(HTTP {status}{': ' + escape_text(why) if why else ''})")
    _record_sent(head["seq"], None)
    return head


def check_head(value, where):
    """A {seq, hash, mac} head (as the witness serves it) or OverlordError."""
    if not isinstance(value, dict) or type(value.get("seq")) is not int or value["seq"] < 1 \
            or not audit.is_hex64(value.get("hash")) or not audit.is_hex64(value.get("mac")):
        raise OverlordError(f"{where} served no head {{\"seq\", \"hash\", \"mac\"}}")
    return {"seq": value["seq"], "hash": value["hash"], "mac": value["mac"]}


def fetch(url=None):
    """The head the witness holds (GET), shape-checked; its mac is checked by audit.verify."""
    url = resolve_url(url)
    status, body = _request(url)
    if status == 404:
        raise OverlordError(f"witness {escape_text(url)} holds no head yet "
                            "(`overlord audit checkpoint --send` sends one)")
    if status != 200:
        raise OverlordError(f"witness {escape_text(url)} answered HTTP {status}")
    return check_head(body, f"witness {escape_text(url)}")


# -- the automatic sender -----------------------------------------------------------------------

def _read_sent():
    try:
        with open(_path(SENT_NAME), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def _record_sent(seq, error):
    sent = _read_sent()
    data = {"ts": time.time(), "seq": seq if seq is not None else sent.get("seq", 0), "error": error}
    try:
        store.write_json_atomic(_path(SENT_NAME), data)
    except OSError:
        pass


def last_sent():
    """{"ts", "seq", "error"} of the last send, or {}."""
    return _read_sent()


def _lock_fd():
    return os.open(_path(LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def auto_send():
    """After an append: when the witness is configured with auto, make sure a sender will
    deliver the new head. Costs a stat when no witness is configured."""
    try:
        os.stat(config_path())
    except OSError:
        return
    conf = load_config()
    if not conf or not conf["auto"]:
        return
    fd = _lock_fd()
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return      # a sender is running; it re-reads the head after it lets go (below)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    from overlord import relaunch
    env = dict(os.environ, OVERLORD_HOME=store.home())
    subprocess.Popen(relaunch.module_argv("overlord.trust.witness", "--auto-send"),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, cwd="/", env=env, start_new_session=True)


def run_sender():
    """The detached sender: while the head is ahead of what was sent, wait out the throttle
    and POST the head as it is then. After letting go of the lock it looks once more, so an
    append that found the lock held is never left unsent."""
    fd = _lock_fd()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        while True:
            while True:
                sent = _read_sent()
                head = audit.head()
                if head["seq"] <= int(sent.get("seq") or 0) or not head["hash"]:
                    break
                wait = float(sent.get("ts") or 0) + INTERVAL - time.time()
                if wait > 0:
                    time.sleep(min(wait, INTERVAL))
                try:
                    send()
                except OverlordError as exc:
                    _record_sent(None, str(exc))
                    return 1        # the next act tries again
            fcntl.flock(fd, fcntl.LOCK_UN)
            head = audit.head()
            if head["seq"] <= int(_read_sent().get("seq") or 0):
                return 0
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0            # another sender took over
    finally:
        os.close(fd)


# -- the reference receiver ---------------------------------------------------------------------

class Receiver:
    """Keeps the highest head it was sent in `store_path`; with a key, refuses a head whose
    mac does not verify."""

    def __init__(self, store_path, key=None):
        self.store_path, self.key, self.lock = store_path, key, threading.Lock()
        self.head = self._load()

    def _load(self):
        data = _load_json(self.store_path, "witness store")
        if data is _MISSING:
            return None
        return check_head(data, f"witness store {escape_path(self.store_path)}")

    def post(self, data):
        """(status, body) for a POSTed head."""
        try:
            head = check_head(data, "the request")
        except OverlordError as exc:
            return 400, {"error": str(exc)}
        if self.key is not None and not hmac.compare_digest(
                audit.witness_mac(self.key, head["seq"], head["hash"]), head["mac"]):
            return 403, {"error": "the head's mac does not verify"}
        with self.lock:
            held = self.head
            if held is not None:
                if head["seq"] < held["seq"]:
                    return 409, {"error": f"seq {head['seq']} is below the held seq {held['seq']}",
                                 "head": held}
                if head["seq"] == held["seq"]:
                    if head != held:
                        return 409, {"error": f"a different head at the held seq {held['seq']}",
                                     "head": held}
                    return 200, {"ok": True, "head": held}
            store.write_json_atomic(self.store_path, head, mode=0o644, sync_dir=True)
            self.head = head
            return 200, {"ok": True, "head": head}

    def get(self):
        with self.lock:
            if self.head is None:
                return 404, {"error": "no head yet"}
            return 200, dict(self.head)


def _handler(receiver):
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "overlord-witness"

        def _answer(self, status, body):
            data = json.dumps(body, sort_keys=True).encode("ascii") + b"\n"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer(*receiver.get())

        def do_POST(self):
            try:
                length = int(self.headers.get("Content-Length") or "")
            except ValueError:
                return self._answer(411, {"error": "Content-Length required"})
            if not 0 < length <= MAX_BODY:
                return self._answer(413, {"error": f"a head is at most {MAX_BODY} bytes"})
            data = _json(self.rfile.read(length))
            if data is None:
                return self._answer(400, {"error": "not JSON"})
            self._answer(*receiver.post(data))

        def log_message(self, fmt, *args):
            sys.stderr.write("witness: " + escape_text(fmt % args) + "\n")

    return Handler


def parse_bind(bind):
    host, sep, port = (bind or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--bind must be HOST:PORT: {escape_text(str(bind))}")
    return host.strip("[]"), int(port)


def make_server(bind, store_path, key=None):
    """The receiver's HTTP server (not yet serving)."""
    host, port = parse_bind(bind)
    receiver = Receiver(os.path.abspath(store_path), key)
    try:
        server = http.server.ThreadingHTTPServer((host, port), _handler(receiver))
    except OSError as exc:
        raise OverlordError(f"witness-serve cannot listen on {escape_text(bind)}: {exc.strerror}") from None
    server.daemon_threads = True
    return server


if __name__ == "__main__" and sys.argv[1:] == ["--auto-send"]:
    try:
        sys.exit(run_sender())
    except Exception:       # noqa: BLE001 - a detached best-effort sender has no one to tell
        sys.exit(1)
