"""The egress proxy of a `--net proxy` session: HTTP/1.1 forwarding and CONNECT tunnels, every
connection one line on the session's egress.jsonl.

The command runs in an empty network namespace; its only way out is the listener handed to
`serve` (bound inside that namespace, served from the host's). So this module is the one place
a proxied session's traffic passes, and it holds to a few rules:

  - one request per client connection: the proxy answers `Connection: close`, asks the
    upstream for the same, and never forwards a byte beyond the first request's body (a second
    request pipelined or smuggled behind it reaches no upstream; the line says it was seen);
  - the destination is checked by `netallow.resolve` (allowlist, then every address the name
    resolves to) and the connection goes to those checked addresses only, never a second lookup;
  - every connection, whatever becomes of it (garbage, refusal, timeout, a client that hangs
    up), writes exactly one line, appended with a single os.write on an O_APPEND fd;
  - request heads are read by the accept loop itself (non-blocking, one selector), so a client
    that opens a thousand idle connections costs file descriptors, not threads; a connection
    gets a thread only once its request head is complete, at most `max_connections` at a time;
  - with `hold_writes`, a plain-HTTP write to an allowed host (any method but the safe ones,
    and a safe one with a body) is not sent but kept as held/<id>.json (overlord.sandbox.egress releases or drops it at commit).

Every response the proxy makes itself is a small text/plain body of one line.
"""
import base64
import collections
import dataclasses
import json
import os
import re
import selectors
import select
import socket
import threading
import time

from overlord.sandbox import netallow

MAX_HEAD = 64 * 1024             # request (and response) head cap
MAX_LINE = 16 * 1024             # a request line longer than this is refused early
MAX_HELD_BODY = 16 * 1024 * 1024  # a held (or chunked, re-framed) body cap
MAX_PENDING = 8192               # connections still sending their head
BUF = 256 * 1024                 # relay buffer
LINGER = 2.0                     # seconds a finished connection is drained before close
PATH_CAP = 2048
HOST_CAP = 255
TEXT_CAP = 2048
# Under --hold-writes every request that may change the outside world is held: any method but
# the safe ones (RFC 9110 9.2.1), and a safe one that carries a body (an upstream that ignores
# a GET's body would read it as a second request, never held and on no line).
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")
MAX_HELD = 1000                       # held requests a session may keep waiting
MAX_HELD_BYTES = 64 * 1024 * 1024     # and their bodies together: OVERLORD_HOME is not the command's
MAX_INTERIM = 32                      # 1xx heads before the real answer
LOG_NAME = "egress.jsonl"
COMMAND_NAME = "egress-command.json"
HELD_DIR = "held"
HELD_RE = re.compile(r"\Ah(\d{4,9})\.json\Z")

# headers that concern one hop only (RFC 9110 7.6.1), never passed on; plus every Proxy-*
HOP = frozenset(("connection", "keep-alive", "proxy-connection", "te", "trailer",
                 "transfer-encoding", "upgrade", "expect"))

_TOKEN = re.compile(rb"\A[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_METHOD = re.compile(rb"\A[A-Z]{1,24}\Z")
_NAME = re.compile(r"\A[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})\Z")
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET_BAD = re.compile(rb"[\x00-\x20\x7f]")
_STATUS = re.compile(rb"\AHTTP/1\.[01] (\d{3})(?: (.*))?\Z", re.S)

REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 403: "Forbidden",
           408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout", 507: "Insufficient Storage"}


@dataclasses.dataclass
class Config:
    record_dir: str            # the session directory: egress.jsonl, held/, egress-command.json
    allow: list = ()           # normalised netallow entries; () = record only
    hold_writes: bool = False
    timeout: float = 30.0      # connect / first byte / idle; env OVERLORD_PROXY_TIMEOUT overrides
    max_connections: int = 256  # beyond: 503 + a line, the rest keep being served
    getaddrinfo: object = None  # tests inject a resolver (else socket.getaddrinfo)
    cap: list = None           # the policy's net_allow cap the session was opened under (net_cap)


class HTTPError(Exception):
    """A response the proxy gives itself: status and a one-line reason."""

    def __init__(self, status, reason):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class ClientGone(Exception):
    """The client hung up (or reset) before the exchange was over."""


def effective_timeout(config):
    raw = os.environ.get("OVERLORD_PROXY_TIMEOUT")
    if raw:
        try:
            value = float(raw)
            if value > 0:
                return value
        except ValueError:
            pass
    return float(config.timeout)


# ---------------------------------------------------------------------------------------------
# parsing

def _text(data):
    return data.decode("latin-1")


def _cap(text, n=TEXT_CAP):
    return text if text is None or len(text) <= n else text[:n]


def parse_authority(raw, default_port=None):
    """(host, port) of `host[:port]` / `[v6]:port` (str); raises HTTPError 400."""
    text = raw if isinstance(raw, str) else _text(raw)
    if not text or "@" in text:
        raise HTTPError(400, "not a host[:port] (no user information allowed)")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HTTPError(400, "an unterminated [address]")
        host, rest = text[:end + 1], text[end + 1:]
        if netallow.literal(host) is None or netallow.literal(host).version != 6:
            raise HTTPError(400, "not an IPv6 address in brackets")
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            host, rest = text, ""
        else:
            rest = ":" + port
        if ":" in host:
            raise HTTPError(400, "an IPv6 address must be in brackets")
    if rest:
        digits = rest[1:]
        if not digits.isdigit() or not digits.isascii() or len(digits) > 5 or not 0 < int(digits) < 65536:
            raise HTTPError(400, "not a port number")
        port = int(digits)
    elif default_port is None:
        raise HTTPError(400, "CONNECT needs host:port")
    else:
        port = default_port
    if netallow.literal(host) is None and not _NAME.match(host):
        raise HTTPError(400, "not a host name")
    return host, port


def split_request_line(line):
    """(method, target, version) bytes of a request line; raises HTTPError 400."""
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[1]:
        raise HTTPError(400, "not an HTTP request line")
    method, target, version = parts
    if not _METHOD.match(method):
        raise HTTPError(400, "not an HTTP request line (bad method)")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HTTPError(400, "not an HTTP/1.x request line")
    if _TARGET_BAD.search(target):
        raise HTTPError(400, "control characters in the request target")
    return method, target, version


def check_request_line(buf):
    """Validate a request line as soon as it is complete (garbage gets its 400 at once)."""
    end = buf.find(b"\n")
    if end < 0:
        if len(buf) > MAX_LINE:
            raise HTTPError(400, "request line too long (or not HTTP)")
        return
    if end == 0 or buf[end - 1:end] != b"\r":
        raise HTTPError(400, "not an HTTP request line (lines end in CRLF)")
    split_request_line(bytes(buf[:end - 1]))


def parse_headers(lines):
    """[(name, value)] str of header lines (bytes); raises HTTPError 400."""
    out = []
    for raw in lines:
        if not raw:
            continue
        if raw[:1] in (b" ", b"\t"):
            raise HTTPError(400, "obsolete header line folding")
        if b"\r" in raw or b"\n" in raw:
            raise HTTPError(400, "a bare CR or LF in the head")
        name, sep, value = raw.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise HTTPError(400, "a malformed header line")
        value = value.strip(b" \t")
        if _CTL.search(value):
            raise HTTPError(400, "control characters in a header value")
        out.append((_text(name), _text(value)))
    return out


@dataclasses.dataclass
class Request:
    method: str
    version: str
    host: str = ""
    port: int = 0
    path: str = None           # origin-form path + query (plain HTTP)
    headers: list = ()
    length: int = None         # Content-Length, or None
    chunked: bool = False


def parse_request(head):
    """A Request of a complete head (without the final CRLF CRLF); raises HTTPError."""
    lines = head.split(b"\r\n")
    method, target, version = split_request_line(lines[0])
    headers = parse_headers(lines[1:])
    req = Request(method=_text(method), version=_text(version), headers=headers)
    if req.method == "CONNECT":
        req.host, req.port = parse_authority(target)
        return req
    low = target[:8].lower()
    if low.startswith(b"http://"):
        rest = target[7:]
    elif low.startswith(b"https://"):
        raise HTTPError(400, "an https:// URL needs a CONNECT tunnel, not a plain request")
    elif target.startswith(b"/") or target == b"*":
        raise HTTPError(400, "this is a proxy: send absolute-form requests (GET http://host/path)")
    else:
        raise HTTPError(400, "not an http:// URL")
    cut = len(rest)
    for sep in (b"/", b"?", b"#"):
        i = rest.find(sep)
        if 0 <= i < cut:
            cut = i
    req.host, req.port = parse_authority(rest[:cut], default_port=80)
    path = rest[cut:].split(b"#", 1)[0]
    if not path.startswith(b"/"):
        path = b"/" + path
    req.path = _text(path)
    lengths = [v for n, v in headers if n.lower() == "content-length"]
    codings = [v for n, v in headers if n.lower() == "transfer-encoding"]
    if lengths and codings:
        raise HTTPError(400, "both Content-Length and Transfer-Encoding (a smuggling attempt)")
    if codings:
        if len(codings) != 1 or codings[0].strip().lower() != "chunked":
            raise HTTPError(501, "only Transfer-Encoding: chunked is supported")
        req.chunked = True
    if lengths:
        if len(set(lengths)) != 1 or not lengths[0].isdigit() or not lengths[0].isascii() \
                or len(lengths[0]) > 18:
            raise HTTPError(400, "a malformed or repeated Content-Length")
        req.length = int(lengths[0])
    return req


def forward_headers(headers):
    """The client's headers without hop-by-hop ones (and the names Connection lists), Proxy-*,
    Host and Content-Length (the proxy writes those itself)."""
    listed = set()
    for name, value in headers:
        if name.lower() in ("connection", "proxy-connection"):
            listed.update(t.strip().lower() for t in value.split(","))
    return [(n, v) for n, v in headers
            if n.lower() not in HOP and n.lower() not in listed
            and not n.lower().startswith("proxy-")]


def request_head(method, host, port, path, headers, body_length):
    """The bytes of a request head sent upstream: origin-form, Host from the URL, the given
    headers (already filtered), Content-Length when there is a body, Connection: close."""
    authority = f"[{host.strip('[]')}]" if ":" in host else host
    if port != 80:
        authority = f"{authority}:{port}"
    out = [f"{method} {path} HTTP/1.1", f"Host: {authority}"]
    out += [f"{n}: {v}" for n, v in headers if n.lower() not in ("host", "content-length")]
    if body_length is not None:
        out.append(f"Content-Length: {body_length}")
    out.append("Connection: close")
    return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")


def answer_bytes(status, text, extra=()):
    body = ("overlord: " + text.replace("\r", " ").replace("\n", " ") + "\n").encode("utf-8")
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
            "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}",
            "Connection: close"]
    head += [f"{n}: {v}" for n, v in extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class Chunks:
    """Finds where a chunked body ends in a stream fed piece by piece (the proxy relays the
    bytes as they are; it only needs to know when the message is over)."""

    def __init__(self):
        self.state = "size"
        self.line = bytearray()
        self.left = 0
        self.broken = False

    def feed(self, buf, start, end):
        """Offset in buf just past the message's end, or None if it goes on."""
        i = start
        while i < end:
            if self.state == "data":
                take = min(self.left, end - i)
                i += take
                self.left -= take
                if not self.left:
                    self.state, self.left = "crlf", 2
            elif self.state == "crlf":
                take = min(self.left, end - i)
                i += take
                self.left -= take
                if not self.left:
                    self.state = "size"
            else:
                j = buf.find(b"\n", i, end)
                stop = end if j < 0 else j + 1
                self.line += buf[i:stop]
                i = stop
                if len(self.line) > 8192:
                    self.broken = True
                    return None
                if j < 0:
                    continue
                line = bytes(self.line).strip()
                self.line.clear()
                if self.state == "size":
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        self.broken = True
                        return None
                    if size == 0:
                        self.state = "trailer"
                    else:
                        self.state, self.left = "data", size
                elif not line:           # the empty line after the trailers
                    return i
        return None


# ---------------------------------------------------------------------------------------------
# the server

class _Pending:
    __slots__ = ("sock", "line", "t0", "buf", "deadline")

    def __init__(self, sock, line, t0, deadline):
        self.sock, self.line, self.t0, self.deadline = sock, line, t0, deadline
        self.buf = bytearray()


def serve(listener, config, stop=None):
    """Serve the listener until `stop` (a threading.Event) is set or the listener is closed.
    Blocking; a thread per connection whose request head is complete."""
    if not os.path.isdir(config.record_dir):
        raise FileNotFoundError(f"no session directory {config.record_dir}")
    _raise_fd_limit()
    _Proxy(listener, config, stop).run()


def _raise_fd_limit():
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 65536
        want = min(want, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


class _Proxy:
    def __init__(self, listener, config, stop):
        self.listener = listener
        self.config = config
        self.stop = stop
        self.timeout = effective_timeout(config)
        self.allow = list(config.allow or ())
        self.log_path = os.path.join(config.record_dir, LOG_NAME)
        self.cmd_path = os.path.join(config.record_dir, COMMAND_NAME)
        self.held_dir = os.path.join(config.record_dir, HELD_DIR)
        self._cmd_key = None
        self._cmd = (None, None)
        self.lock = threading.Lock()
        self.hold_lock = threading.Lock()
        self.active = 0
        self.pending = {}              # fd -> _Pending (reading its head)
        self.lingering = {}            # fd -> (sock, deadline): answered, drained until closed
        self.handback = collections.deque()
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)

    # -- the egress line ------------------------------------------------------------------------

    def command(self):
        """(layer, cause) from egress-command.json, re-read only when the file changed."""
        try:
            st = os.stat(self.cmd_path)
        except OSError:
            self._cmd_key, self._cmd = None, (None, None)
            return self._cmd
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key != self._cmd_key:
            layer = cause = None
            try:
                with open(self.cmd_path, encoding="utf-8") as f:
                    data = json.load(f)
                if isinstance(data, dict):
                    if isinstance(data.get("layer"), int) and not isinstance(data["layer"], bool):
                        layer = data["layer"]
                    if isinstance(data.get("cause"), str):
                        cause = _cap(data["cause"])
            except (OSError, ValueError):
                pass
            self._cmd_key, self._cmd = key, (layer, cause)
        return self._cmd

    def new_line(self):
        layer, cause = self.command()
        return {"ts": time.time(), "host": "", "port": 0, "method": None, "path": None,
                "allowed": False, "status": None, "bytes_up": 0, "bytes_down": 0,
                "duration_ms": 0.0, "layer": layer, "cause": cause, "reason": None,
                "held": None}

    def write_line(self, line, t0):
        if not line.get("duration_ms"):
            line["duration_ms"] = round((time.monotonic() - t0) * 1000, 3)
        line["host"] = _cap(line["host"], HOST_CAP)
        line["path"] = _cap(line["path"], PATH_CAP)
        line["reason"] = _cap(line["reason"])
        data = (json.dumps(line, sort_keys=True) + "\n").encode("ascii")
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
        except OSError:
            return                      # the session directory is gone: nobody to tell
        try:
            os.write(fd, data)
        except OSError:
            pass
        finally:
            os.close(fd)

    # -- the loop -------------------------------------------------------------------------------

    def stopped(self):
        return self.stop is not None and self.stop.is_set()

    def run(self):
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self.stopped():
                try:
                    if self.listener.fileno() < 0:
                        return
                    events = self.sel.select(timeout=self._wait())
                    for key, _mask in events:
                        if key.data == "accept":
                            self._accept()
                        elif key.data == "wake":
                            self._woken()
                        elif key.data == "head":
                            self._read_head(key.fd)
                        else:
                            self._drain(key.fd)
                    self._expire()
                except (ValueError, OSError) as e:
                    if self.listener.fileno() < 0 or getattr(e, "errno", None) == 9:
                        return
                    time.sleep(0.01)
                except Exception:       # never let one connection's trouble stop the loop
                    time.sleep(0.001)
        finally:
            self._shutdown()

    def _wait(self):
        now = time.monotonic()
        soonest = now + 0.25
        for p in self.pending.values():
            soonest = min(soonest, p.deadline)
        for _sock, deadline in self.lingering.values():
            soonest = min(soonest, deadline)
        return max(0.0, soonest - now)

    def _shutdown(self):
        for fd, p in list(self.pending.items()):
            p.line["reason"] = "the proxy stopped before the request was complete"
            self._reject(p, None, close_now=True)
        for fd, (sock, _d) in list(self.lingering.items()):
            self._close_linger(fd)
        while self.handback:
            _close(self.handback.popleft())
        for s in (self.wake_r, self.wake_w):
            _close(s)
        try:
            self.sel.close()
        except Exception:
            pass

    def _accept(self):
        for _ in range(256):
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (24, 23):        # EMFILE, ENFILE: make room, oldest first
                    if not self._evict():
                        time.sleep(0.01)
                    return
                if e.errno in (103, 104, 71, 110):   # aborted before we got it
                    continue
                raise
            t0 = time.monotonic()
            line = self.new_line()
            p = _Pending(sock, line, t0, t0 + self.timeout)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if len(self.pending) >= MAX_PENDING:
                p.line["reason"] = "too many connections waiting to send a request"
                self._reject(p, 503)
                continue
            try:
                self.sel.register(sock, selectors.EVENT_READ, "head")
            except (ValueError, OSError):
                self.write_line(line, t0)
                _close(sock)
                continue
            self.pending[sock.fileno()] = p

    def _evict(self):
        if not self.pending:
            return False
        fd = min(self.pending, key=lambda f: self.pending[f].t0)
        p = self.pending.pop(fd)
        self._unregister(p.sock)
        p.line["reason"] = "closed to make room: the proxy ran out of file descriptors"
        self._reject(p, 503, close_now=True)
        return True

    def _unregister(self, sock):
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass

    def _read_head(self, fd):
        p = self.pending.get(fd)
        if p is None:
            return
        try:
            data = p.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = None
        if not data:
            del self.pending[fd]
            self._unregister(p.sock)
            p.line["reason"] = ("the client closed the connection before a complete request"
                                if p.buf or data is not None else
                                "the client reset the connection before a complete request")
            if not p.buf:
                p.line["reason"] = "the client closed the connection without sending a request"
            self.write_line(p.line, p.t0)
            _close(p.sock)
            return
        start = max(0, len(p.buf) - 3)
        p.buf += data
        try:
            check_request_line(p.buf)
        except HTTPError as e:
            self._head_error(fd, p, e)
            return
        end = p.buf.find(b"\r\n\r\n", start)
        if end < 0:
            if len(p.buf) > MAX_HEAD:
                self._head_error(fd, p, HTTPError(431, f"request head over {MAX_HEAD // 1024} KiB"))
            return
        if end + 4 > MAX_HEAD:
            self._head_error(fd, p, HTTPError(431, f"request head over {MAX_HEAD // 1024} KiB"))
            return
        del self.pending[fd]
        self._unregister(p.sock)
        head, rest = bytes(p.buf[:end]), bytes(p.buf[end + 4:])
        p.buf = None
        self._dispatch(p, head, rest)

    def _head_error(self, fd, p, err):
        del self.pending[fd]
        self._unregister(p.sock)
        p.line["reason"] = err.reason
        self._reject(p, err.status, err.reason)

    def _dispatch(self, p, head, rest):
        with self.lock:
            full = self.active >= self.config.max_connections
            if not full:
                self.active += 1
        if full:
            _note_request(p.line, head)
            p.line["reason"] = (f"too many connections at once (at most "
                                f"{self.config.max_connections})")
            self._reject(p, 503)
            return
        try:
            threading.Thread(target=self._work, args=(p, head, rest), daemon=True,
                             name="overlord-egress").start()
        except RuntimeError:
            with self.lock:
                self.active -= 1
            p.line["reason"] = "the proxy cannot start another connection thread"
            self._reject(p, 503)

    def _reject(self, p, status, text=None, close_now=False):
        """Answer a connection from the loop (non-blocking: the answer is small), write its
        line, and drain it until the client closes (so the answer is not lost to a reset)."""
        p.line["status"] = status
        if status is not None:
            try:
                p.sock.send(answer_bytes(status, text or p.line["reason"] or "refused"))
            except OSError:
                pass
        self.write_line(p.line, p.t0)
        if close_now or self.stopped():
            _close(p.sock)
            return
        self._linger(p.sock)

    def _linger(self, sock):
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
            self.sel.register(sock, selectors.EVENT_READ, "linger")
            self.lingering[sock.fileno()] = (sock, time.monotonic() + LINGER)
        except (OSError, ValueError, KeyError):
            _close(sock)

    def _drain(self, fd):
        entry = self.lingering.get(fd)
        if entry is None:
            return
        try:
            data = entry[0].recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_linger(fd)

    def _close_linger(self, fd):
        sock, _d = self.lingering.pop(fd, (None, None))
        if sock is not None:
            self._unregister(sock)
            _close(sock)

    def _woken(self):
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass
        while self.handback:
            sock = self.handback.popleft()
            if self.stopped():
                _close(sock)
            else:
                self._linger(sock)

    def _expire(self):
        now = time.monotonic()
        for fd in [fd for fd, p in self.pending.items() if p.deadline <= now]:
            p = self.pending.pop(fd)
            self._unregister(p.sock)
            p.line["reason"] = f"no complete request head within {self.timeout:g}s"
            if p.buf:
                _note_request(p.line, bytes(p.buf))
            self._reject(p, 408)
        for fd in [fd for fd, (_s, d) in self.lingering.items() if d <= now]:
            self._close_linger(fd)

    def give_back(self, sock):
        """A worker is done with its client: drain and close it in the loop."""
        if self.stopped():
            _close(sock)
            return
        self.handback.append(sock)
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    # -- one connection (its own thread) --------------------------------------------------------

    def _work(self, p, head, rest):
        conn = _Conn(self, p.sock, p.line, p.t0)
        try:
            conn.handle(head, rest)
        except Exception as e:   # a bug must still leave its line and close its sockets
            conn.fail(500, f"proxy error: {type(e).__name__}")
        finally:
            conn.finish()
            with self.lock:
                self.active -= 1

    # -- held requests ------------------------------------------------------------------------

    def new_hold(self):
        """Reserve the next id (h0001, ...): arrival order, O_EXCL so that two processes
        serving one session never share one."""
        with self.hold_lock:
            os.makedirs(self.held_dir, mode=0o700, exist_ok=True)
            n, count, size = 1, 0, 0
            for name in os.listdir(self.held_dir):
                m = HELD_RE.match(name)
                if m:
                    n = max(n, int(m.group(1)) + 1)
                    count += 1
                    try:
                        size += os.lstat(os.path.join(self.held_dir, name)).st_size
                    except OSError:
                        pass
            if count >= MAX_HELD or size >= MAX_HELD_BYTES:
                raise HTTPError(507, f"this session holds {count} requests ({size >> 20} MiB) "
                                     "already: commit or roll it back before holding more")
            while True:
                hid = f"h{n:04d}"
                path = os.path.join(self.held_dir, hid + ".json")
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600)
                except FileExistsError:
                    n += 1
                    continue
                os.close(fd)
                return hid, path


def _note_request(line, head):
    """Best effort: method/host/port/path of a head that was not served (for the line)."""
    try:
        first = head.split(b"\r\n", 1)[0]
        method, target, _v = split_request_line(first)
        line["method"] = _text(method)
        req = parse_request(head) if b"\r\n\r\n" not in head else None
    except HTTPError:
        return
    except Exception:
        return
    if req is None:
        return
    line["host"] = netallow.normal(req.host)
    line["port"] = req.port
    line["path"] = req.path


def _close(sock):
    if sock is None:
        return
    try:
        sock.close()
    except OSError:
        pass


class _Conn:
    """One client connection in its worker thread."""

    def __init__(self, proxy, client, line, t0):
        self.proxy = proxy
        self.client = client
        self.line = line
        self.t0 = t0
        self.upstream = None
        self.answered = False
        self.rest = b""
        self.timeout = proxy.timeout
        self.notes = []

    # -- helpers --

    def answer(self, status, text, extra=()):
        self.line["status"] = status
        if self.line["reason"] is None and status >= 400:
            self.line["reason"] = text
        self.answered = True
        try:
            self.client.sendall(answer_bytes(status, text, extra))
        except OSError:
            pass

    def fail(self, status, reason):
        if self.line["reason"] is None:
            self.line["reason"] = reason
        if not self.answered:
            self.answer(status, reason)

    def finish(self):
        _close(self.upstream)
        self.upstream = None
        if self.line["duration_ms"] == 0.0:
            self.line["duration_ms"] = round((time.monotonic() - self.t0) * 1000, 3)
        extra = len(self.rest)
        try:
            self.client.setblocking(False)     # (a timeout would make recv wait first)
            more = self.client.recv(65536)
            extra += len(more)
        except (BlockingIOError, InterruptedError, OSError):
            pass
        if extra and self.line["method"] != "CONNECT":
            self.notes.append(f"{extra} bytes after the request were not forwarded "
                              "(one request per connection)")
        if self.notes:
            said = "; ".join(self.notes)
            self.line["reason"] = f"{self.line['reason']}; {said}" if self.line["reason"] else said
        self.proxy.write_line(self.line, self.t0)
        self.proxy.give_back(self.client)

    def fill(self, reader_buf):
        try:
            data = self.client.recv(BUF)
        except socket.timeout:
            raise HTTPError(408, f"the client sent nothing for {self.timeout:g}s mid-request") from None
        except OSError:
            raise ClientGone("the client reset the connection mid-request") from None
        if not data:
            raise ClientGone("the client closed the connection mid-request")
        reader_buf += data

    def read_body(self, req, cap):
        """The whole request body (bytes), at most cap bytes (else 413)."""
        buf = bytearray(self.rest)
        self.rest = b""
        if req.chunked:
            body = bytearray()
            pos = 0
            while True:
                while True:
                    j = buf.find(b"\r\n", pos)
                    if j >= 0:
                        break
                    if len(buf) - pos > 4096:
                        raise HTTPError(400, "a malformed chunk size line")
                    self.fill(buf)
                size_text = bytes(buf[pos:j]).split(b";", 1)[0].strip()
                if not size_text or not re.fullmatch(rb"[0-9A-Fa-f]{1,15}", size_text):
                    raise HTTPError(400, "a malformed chunk size line")
                size = int(size_text, 16)
                pos = j + 2
                if size == 0:
                    while True:               # trailers, up to the empty line
                        j = buf.find(b"\r\n", pos)
                        if j < 0:
                            if len(buf) - pos > MAX_HEAD:
                                raise HTTPError(400, "trailers too long")
                            self.fill(buf)
                            continue
                        if j == pos:
                            self.rest = bytes(buf[j + 2:])
                            return bytes(body)
                        pos = j + 2
                if len(body) + size > cap:
                    raise HTTPError(413, f"request body over {cap // (1024 * 1024)} MiB")
                while len(buf) - pos < size + 2:
                    self.fill(buf)
                body += buf[pos:pos + size]
                if buf[pos + size:pos + size + 2] != b"\r\n":
                    raise HTTPError(400, "a malformed chunk (no CRLF after its data)")
                pos += size + 2
                if pos > BUF:
                    del buf[:pos]
                    pos = 0
        n = req.length or 0
        if n > cap:
            raise HTTPError(413, f"request body over {cap // (1024 * 1024)} MiB")
        while len(buf) < n:
            self.fill(buf)
        self.rest = bytes(buf[n:])
        return bytes(buf[:n])

    def continue_if_asked(self, req):
        if any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in req.headers) \
                and (req.chunked or req.length) and not self.rest:
            try:
                self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            except OSError:
                raise ClientGone("the client went away") from None

    # -- the exchange --

    def handle(self, head, rest):
        self.rest = rest
        self.client.settimeout(self.timeout)
        line = self.line
        try:
            try:
                line["method"] = _text(head.split(b" ", 1)[0])[:24]
                req = parse_request(head)
            except HTTPError:
                line["method"] = None
                _note_request(line, head)
                raise
            line["method"] = req.method
            line["host"] = netallow.normal(req.host)
            line["port"] = req.port
            line["path"] = req.path
            try:
                addresses = netallow.resolve(req.host, req.port, self.proxy.allow,
                                             self.proxy.config.getaddrinfo,
                                             cap=self.proxy.config.cap)
            except netallow.Refused as e:
                raise HTTPError(403, str(e)) from None
            except (OSError, UnicodeError) as e:
                line["allowed"] = True          # the list let it through; the name did not resolve
                raise HTTPError(502, f"cannot resolve {line['host']}: "
                                     f"{getattr(e, 'strerror', None) or e}") from None
            line["allowed"] = True
            if req.method == "CONNECT":
                self.connect(addresses, req.port)
                self.tunnel()
                return
            if self.proxy.config.hold_writes and (req.method not in SAFE_METHODS or req.chunked
                                                  or (req.length or 0) > 0):
                self.hold(req)
                return
            body = None
            if req.chunked:
                self.continue_if_asked(req)
                body = self.read_body(req, MAX_HELD_BODY)
            self.connect(addresses, req.port)
            self.forward(req, body)
        except HTTPError as e:
            self.fail(e.status, e.reason)
        except ClientGone as e:
            if line["reason"] is None:
                line["reason"] = str(e)

    def connect(self, addresses, port):
        last = None
        timed_out = False
        for family, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect((address, port))
            except socket.timeout:
                timed_out = True
                last = f"connecting to {address} port {port} timed out after {self.timeout:g}s"
                sock.close()
                continue
            except OSError as e:
                last = f"cannot connect to {address} port {port}: {e.strerror or e}"
                sock.close()
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self.upstream = sock
            return
        raise HTTPError(504 if timed_out and last and "timed out" in last else 502,
                        last or "no address to connect to")

    def tunnel(self):
        client, upstream, line = self.client, self.upstream, self.line
        try:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        except OSError:
            raise ClientGone("the client went away before the tunnel was up") from None
        self.answered = True
        line["status"] = 200
        if self.rest:
            try:
                upstream.sendall(self.rest)
            except OSError as e:
                line["reason"] = f"the upstream went away: {e.strerror or e}"
                return
            line["bytes_up"] += len(self.rest)
            self.rest = b""
        buf = bytearray(BUF)
        view = memoryview(buf)
        poller = select.poll()
        ends = {client.fileno(): (client, upstream, "bytes_up"),
                upstream.fileno(): (upstream, client, "bytes_down")}
        for fd in ends:
            poller.register(fd, select.POLLIN)
        ms = int(self.timeout * 1000)
        while ends:
            events = poller.poll(ms)
            if not events:
                line["reason"] = f"the tunnel was idle for {self.timeout:g}s"
                return
            for fd, _ev in events:
                if fd not in ends:
                    continue
                src, dst, key = ends[fd]
                try:
                    n = src.recv_into(buf)
                except (BlockingIOError, InterruptedError, socket.timeout):
                    continue
                except OSError:
                    return                # a reset ends the tunnel both ways
                if not n:
                    poller.unregister(fd)
                    del ends[fd]
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    continue
                try:
                    dst.sendall(view[:n])
                except OSError:
                    return
                line[key] += n

    def hold(self, req):
        line = self.line
        if req.length is not None and req.length > MAX_HELD_BODY:
            raise HTTPError(413, f"a held request body is at most {MAX_HELD_BODY // (1024 * 1024)} MiB")
        self.continue_if_asked(req)
        body = self.read_body(req, MAX_HELD_BODY)
        hid, path = self.proxy.new_hold()
        host = req.host
        authority = host if req.port == 80 else f"{host}:{req.port}"
        kept = [(n, v) for n, v in req.headers
                if n.lower() not in HOP and not n.lower().startswith("proxy-")]
        record = {"id": hid, "ts": line["ts"], "method": req.method,
                  "url": f"http://{authority}{req.path}", "host": netallow.normal(host),
                  "port": req.port, "path": req.path, "headers": [list(h) for h in kept],
                  "body_b64": base64.b64encode(body).decode("ascii"), "bytes": len(body),
                  "layer": line["layer"], "cause": line["cause"], "state": "held",
                  "status": None, "error": None, "released_at": None}
        from overlord.txn.store import write_json_atomic
        write_json_atomic(path, record)
        line["held"] = hid
        self.answer(202, f"held as {hid}: {req.method} {line['host']} is sent only if the "
                         "session is committed with it released", [("X-Overlord-Held", hid)])

    def forward(self, req, body):
        client, upstream, line = self.client, self.upstream, self.line
        has_body = req.chunked or req.length is not None
        length = len(body) if body is not None else req.length
        head = request_head(req.method, req.host, req.port, req.path,
                            forward_headers(req.headers), length if has_body else None)
        try:
            if body is not None:
                upstream.sendall(head + body)
                line["bytes_up"] += len(body)
            elif not length:
                upstream.sendall(head)
            else:
                upstream.sendall(head)
                self.continue_if_asked(req)
                self.stream_body(length)
        except ClientGone:
            raise
        except socket.timeout:
            raise HTTPError(504, f"the upstream accepted no data for {self.timeout:g}s") from None
        except OSError as e:
            raise HTTPError(502, f"the upstream went away while sending the request: "
                                 f"{e.strerror or e}") from None
        self.relay_response(req)

    def stream_body(self, length):
        upstream, line = self.upstream, self.line
        if self.rest:
            take = self.rest[:length]
            self.rest = self.rest[length:]
            upstream.sendall(take)
            line["bytes_up"] += len(take)
            length -= len(take)
        buf = bytearray(BUF)
        view = memoryview(buf)
        while length > 0:
            try:
                n = self.client.recv_into(buf, min(length, BUF))
            except socket.timeout:
                raise HTTPError(408, f"the client sent nothing for {self.timeout:g}s "
                                     "mid-body") from None
            except OSError:
                raise ClientGone("the client reset the connection mid-body") from None
            if not n:
                raise ClientGone("the client closed the connection mid-body")
            upstream.sendall(view[:n])
            line["bytes_up"] += n
            length -= n

    def read_response_head(self):
        buf = bytearray()
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                return bytes(buf[:end]), buf[end + 4:]
            if len(buf) > MAX_HEAD:
                raise HTTPError(502, "the upstream's response head is too large")
            try:
                data = self.upstream.recv(BUF)
            except socket.timeout:
                raise HTTPError(504, f"the upstream did not answer within {self.timeout:g}s") from None
            except OSError as e:
                raise HTTPError(502, f"the upstream went away: {e.strerror or e}") from None
            if not data:
                raise HTTPError(502, "the upstream closed the connection without a response")
            buf += data

    def relay_response(self, req):
        client, upstream, line = self.client, self.upstream, self.line
        interim = 0
        while True:
            head, body = self.read_response_head()
            lines = head.split(b"\r\n")
            m = _STATUS.match(lines[0])
            if not m:
                raise HTTPError(502, "the upstream's answer is not HTTP/1.x")
            status = int(m.group(1))
            if 100 <= status < 200:
                if status == 101:
                    raise HTTPError(502, "the upstream switched protocols (not asked for)")
                interim += 1
                if interim > MAX_INTERIM:
                    raise HTTPError(502, f"the upstream sent more than {MAX_INTERIM} interim (1xx) answers")
                if body and isinstance(upstream, _Prefixed):
                    upstream.prefix[:0] = body    # one wrapper, however many 1xx heads
                elif body:                    # the real head may already be here
                    self.upstream = upstream = _Prefixed(upstream, body)
                continue
            break
        reason = m.group(2) or b""
        try:
            headers = parse_headers(lines[1:])
        except HTTPError:
            raise HTTPError(502, "the upstream's response head is malformed") from None
        listed = set()
        for n, v in headers:
            if n.lower() in ("connection", "proxy-connection"):
                listed.update(t.strip().lower() for t in v.split(","))
        coding = [v for n, v in headers if n.lower() == "transfer-encoding"]
        chunked = bool(coding) and coding[-1].split(",")[-1].strip().lower() == "chunked"
        lengths = [v for n, v in headers if n.lower() == "content-length"]
        length = None
        if not coding and lengths and len(set(lengths)) == 1 and lengths[0].isdigit():
            length = int(lengths[0])
        keep = [(n, v) for n, v in headers
                if n.lower() not in ("connection", "keep-alive", "proxy-connection", "te",
                                     "trailer", "upgrade")
                and n.lower() not in listed - {"transfer-encoding", "content-length"}
                and not n.lower().startswith("proxy-")
                and not (coding and n.lower() == "content-length")]
        out = [f"HTTP/1.1 {status} {_text(reason)}"] + [f"{n}: {v}" for n, v in keep]
        out.append("Connection: close")
        out_head = ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")
        line["status"] = status
        self.answered = True
        no_body = req.method == "HEAD" or status in (204, 304)
        tracker = Chunks() if chunked and not no_body else None
        if no_body:
            body = bytearray()
            left = 0
        elif length is not None:
            left = length
            if len(body) > left:
                del body[left:]
        else:
            left = None
        if tracker is not None and body:
            end = tracker.feed(body, 0, len(body))
            if end is not None:
                del body[end:]
                left = 0
            elif tracker.broken:
                tracker = None
        try:
            client.sendall(out_head + body)
        except OSError:
            raise ClientGone("the client closed the connection during the response") from None
        line["bytes_down"] += len(body)
        if left is not None:
            left -= len(body)
        if tracker is None and not isinstance(upstream, _Prefixed) and hasattr(os, "splice") \
                and (left is None or left > 0):
            self.splice_body(left)
            left = 0
        buf = bytearray(BUF)
        view = memoryview(buf)
        while left is None or left > 0:
            try:
                n = upstream.recv_into(buf, BUF if left is None else min(left, BUF))
            except socket.timeout:
                line["reason"] = f"the upstream was idle for {self.timeout:g}s mid-response"
                return
            except OSError as e:
                line["reason"] = f"the upstream went away mid-response: {e.strerror or e}"
                return
            if not n:
                if left is not None or (tracker is not None and not tracker.broken):
                    line["reason"] = "the upstream closed the connection mid-response"
                return
            done = False
            if tracker is not None:
                end = tracker.feed(buf, 0, n)
                if end is not None:
                    n, done = end, True
                elif tracker.broken:
                    tracker = None
            try:
                client.sendall(view[:n])
            except OSError:
                line["reason"] = "the client closed the connection during the response"
                return
            line["bytes_down"] += n
            if left is not None:
                left -= n
            if done:
                break
        # The client's EOF comes from give_back, after finish() has written the line: a client
        # that has read to the end can count on its line being in egress.jsonl.


    def splice_body(self, left):
        """Relay the rest of a response body (left bytes, None: to EOF) upstream -> pipe ->
        client in the kernel (os.splice): no copy through the interpreter."""
        line, timeout = self.line, self.timeout
        src, dst = self.upstream.fileno(), self.client.fileno()
        r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            try:
                import fcntl
                fcntl.fcntl(w, 1031, 1 << 20)            # F_SETPIPE_SZ: 1 MiB when allowed
            except OSError:
                pass
            flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
            ms = int(timeout * 1000)
            pin, pout = select.poll(), select.poll()
            pin.register(src, select.POLLIN)
            pout.register(dst, select.POLLOUT)
            while left is None or left > 0:
                want = BUF * 4 if left is None else min(left, BUF * 4)
                try:
                    n = os.splice(src, w, want, flags=flags)
                except BlockingIOError:
                    if not pin.poll(ms):
                        line["reason"] = f"the upstream was idle for {timeout:g}s mid-response"
                        return
                    continue
                except OSError as e:
                    line["reason"] = f"the upstream went away mid-response: {e.strerror or e}"
                    return
                if not n:
                    if left is not None:
                        line["reason"] = "the upstream closed the connection mid-response"
                    return
                if left is not None:
                    left -= n
                while n:
                    try:
                        k = os.splice(r, dst, n, flags=flags)
                    except BlockingIOError:
                        if not pout.poll(ms):
                            line["reason"] = f"the client took nothing for {timeout:g}s"
                            return
                        continue
                    except OSError:
                        line["reason"] = "the client closed the connection during the response"
                        return
                    n -= k
                    line["bytes_down"] += k
        finally:
            os.close(r)
            os.close(w)


class _Prefixed:
    """A socket whose first reads return bytes already received (after a 1xx head)."""

    def __init__(self, sock, prefix):
        self.sock = sock
        self.prefix = bytearray(prefix)

    def recv(self, n):
        if self.prefix:
            out = bytes(self.prefix[:n])
            del self.prefix[:n]
            return out
        return self.sock.recv(n)

    def recv_into(self, buf, n=0):
        if self.prefix:
            n = min(n or len(buf), len(self.prefix))
            buf[:n] = self.prefix[:n]
            del self.prefix[:n]
            return n
        return self.sock.recv_into(buf, n)

    def close(self):
        self.sock.close()

    def __getattr__(self, name):
        return getattr(self.sock, name)
