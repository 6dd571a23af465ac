"""Helpers for the egress proxy's tests (and anyone driving real clients through it): an HTTP
upstream that records every request it receives, a TCP echo server, a fake resolver, a proxy
served on 127.0.0.1 in the host namespace, raw-socket clients and the egress log.

    with Upstream() as up, Proxy(tmp, allow=["up.test"], names={"up.test": "127.0.0.1"}) as px:
        status, headers, body = px.get(f"http://up.test:{up.port}/bytes/10")
        line = px.wait_lines(1)[0]
"""
import http.server
import json
import os
import socket
import socketserver
import threading
import time

from overlord.sandbox import netproxy

BLOCK = b"x" * (1024 * 1024)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"       # keep-alive: a smuggled second request WOULD be served

    def log_message(self, *args):
        pass

    def _record(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        entry = {"method": self.command, "path": self.path,
                 "headers": [[k, v] for k, v in self.headers.items()], "body": body}
        with self.server.lock:
            self.server.requests.append(entry)
        self.server.seen.set()
        return entry

    def _send(self, status, body, headers=()):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _any(self):
        entry = self._record()
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        route = parts[0]
        if route == "bytes":                       # /bytes/N: N bytes, Content-Length framed
            n = int(parts[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            if self.command != "HEAD":
                view = memoryview(BLOCK)
                while n > 0:
                    k = min(n, len(BLOCK))
                    self.wfile.write(view[:k])
                    n -= k
            return
        if route == "chunked":                     # /chunked/N: N pieces of b"piece-i\n"
            n = int(parts[1])
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(n):
                piece = f"piece-{i}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        if route == "silent":                      # never answers (until the server stops)
            self.server.stopping.wait()
            self.close_connection = True
            return
        if route == "status":
            self._send(int(parts[1]), b"status\n")
            return
        body = json.dumps({"method": entry["method"], "path": entry["path"],
                           "headers": entry["headers"],
                           "body": entry["body"].decode("latin-1")}).encode()
        self._send(200, body, [("Content-Type", "application/json")])

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _any


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Upstream:
    """An HTTP/1.1 server on 127.0.0.1 recording each request it gets (`requests`):
    /bytes/N, /chunked/N, /silent, /status/N, anything else echoes the request as JSON."""

    def __init__(self, host="127.0.0.1"):
        self.server = _Server((host, 0), _Handler)
        self.server.requests = []
        self.server.lock = threading.Lock()
        self.server.seen = threading.Event()
        self.server.stopping = threading.Event()
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def requests(self):
        with self.server.lock:
            return list(self.server.requests)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.stopping.set()
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()


class Echo:
    """A TCP server on 127.0.0.1 that echoes every byte back, and counts connections."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        self.sock.settimeout(0.05)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn):
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join()
        self.sock.close()


class Silent:
    """A TCP server that accepts and never says a word (an upstream that never answers)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()


def resolver(names):
    """A getaddrinfo resolving the given names ({name: address or [addresses]}) only."""
    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        found = names.get(host.lower().rstrip("."))
        if found is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for addr in [found] if isinstance(found, str) else found:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sa = (addr, port, 0, 0) if fam == socket.AF_INET6 else (addr, port)
            out.append((fam, socket.SOCK_STREAM, 6, "", sa))
        return out
    return getaddrinfo


class Proxy:
    """netproxy.serve on a 127.0.0.1 listener in a thread, over record_dir."""

    def __init__(self, record_dir, allow=(), hold_writes=False, timeout=10.0,
                 max_connections=256, names=None, getaddrinfo=None):
        os.makedirs(record_dir, exist_ok=True)
        self.record_dir = record_dir
        self.config = netproxy.Config(record_dir=record_dir, allow=list(allow),
                                      hold_writes=hold_writes, timeout=timeout,
                                      max_connections=max_connections,
                                      getaddrinfo=getaddrinfo or resolver(names or {}))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        try:
            netproxy.serve(self.listener, self.config, self.stop)
        except BaseException as e:       # the test sees it in __exit__
            self.error = e

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        self.listener.close()
        assert not self.thread.is_alive(), "serve did not return after stop"
        if self.error is not None and exc[0] is None:
            raise self.error

    # clients

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def raw(self, data, timeout=30):
        """Send bytes on a fresh connection, return every byte the proxy answers until close."""
        with self.connect() as s:
            s.settimeout(timeout)
            if data:
                s.sendall(data)
            return read_all(s)

    def request(self, method, url, headers=(), body=b""):
        """(status, {lower name: value}, body) of one proxied request."""
        lines = [f"{method} {url} HTTP/1.1", f"Host: {url.split('/')[2]}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        return parse_response(self.raw(data))

    def get(self, url, headers=()):
        return self.request("GET", url, headers)

    def lines(self):
        return read_log(self.record_dir)

    def wait_lines(self, n, timeout=15):
        """The log once it holds at least n lines (fails after timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.lines()
            if len(got) >= n:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(got)} egress lines, expected {n}: {got}")
            time.sleep(0.005)


def read_all(sock):
    out = bytearray()
    while True:
        try:
            data = sock.recv(262144)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return bytes(out)


def parse_response(data):
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0]:
        return None, {}, b""
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def read_log(record_dir):
    try:
        with open(os.path.join(record_dir, "egress.jsonl"), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
