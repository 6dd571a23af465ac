"""The red team's issue-17 harness: raw listeners that record every byte they get, a hostile
upstream, and netproxy served from a listener on 127.0.0.1 with an injected resolver.

Addresses: the allowed upstream listens on 127.0.0.2 (Linux routes all of 127/8 to lo) and is
reached by the name `up.test`, named exactly in the allowlist (a non-public address only a
named host may reach); the VICTIM listens on 127.0.0.1 and is in no allowlist: a single byte
or connection reaching it is an escape. Every raw listener counts connections and keeps what
each sent, so a smuggled second request shows as a second request line.
"""
import json
import os
import re
import socket
import threading
import time

UP_ADDR = "127.0.0.2"
REQ_LINE = re.compile(rb"(?:^|\r?\n)([A-Za-z]+) (\S+) HTTP/1\.[01]\r?\n")


def resolver(table, asked=None):
    """A getaddrinfo stand-in (name -> [addresses]); unknown names are gaierror."""
    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if asked is not None:
            asked.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for addr in table[host]:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sa = (addr, port, 0, 0) if fam == socket.AF_INET6 else (addr, port)
            out.append((fam, socket.SOCK_STREAM, 6, "", sa))
        return out
    return getaddrinfo


class Raw:
    """A TCP listener that records each connection's bytes. mode: "http" answers each request
    head it sees with `answer` (a 200 with a small body by default) and keeps reading (a
    keep-alive upstream: a smuggled request gets its own answer); "hang" reads and never
    answers; "echo" echoes."""

    def __init__(self, addr="127.0.0.1", port=0, mode="http", answer=None, family=socket.AF_INET):
        self.mode = mode
        self.answer = answer or (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                                 b"Content-Type: text/plain\r\n\r\nok")
        self.data, self.conns = [], []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.sock = socket.socket(family)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, port))
        self.sock.listen(128)
        self.addr, self.port = self.sock.getsockname()[:2]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.closing.is_set():
                conn.close()
                return
            with self.lock:
                self.conns.append(conn)
                self.data.append(b"")
                i = len(self.data) - 1
            threading.Thread(target=self._handle, args=(conn, i), daemon=True).start()

    def _handle(self, conn, i):
        answered = 0
        try:
            conn.settimeout(30)
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                with self.lock:
                    self.data[i] += chunk
                    seen = self.data[i]
                if self.mode == "echo":
                    conn.sendall(chunk)
                elif self.mode == "http":
                    heads = len(REQ_LINE.findall(seen))
                    while answered < heads:
                        conn.sendall(self.answer)
                        answered += 1
        except OSError:
            return

    @property
    def count(self):
        with self.lock:
            return len(self.conns)

    def got(self):
        with self.lock:
            return b"".join(self.data)

    def requests(self):
        """[(method, target)] of every request line received, on every connection."""
        return [(m.decode("latin-1"), t.decode("latin-1")) for m, t in REQ_LINE.findall(self.got())]

    def close(self):
        self.closing.set()
        try:
            socket.create_connection((self.addr, self.port), timeout=1).close()
        except OSError:
            pass
        self.thread.join(5)
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.close()
                except OSError:
                    pass


class Proxy:
    """netproxy.serve on a 127.0.0.1 listener in a thread; stop() ends it."""

    def __init__(self, record_dir, allow=(), hold_writes=False, table=None, timeout=3.0,
                 max_connections=256, **extra):
        from overlord.sandbox import netallow, netproxy
        self.netproxy = netproxy
        self.record_dir = str(record_dir)
        os.makedirs(self.record_dir, exist_ok=True)
        self.asked = []
        self.config = netproxy.Config(record_dir=self.record_dir, allow=netallow.parse(list(allow)),
                                      hold_writes=hold_writes, timeout=timeout,
                                      max_connections=max_connections,
                                      getaddrinfo=resolver(table or {}, self.asked), **extra)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.error = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            self.netproxy.serve(self.listener, self.config, stop=self.stopping)
        except Exception as exc:            # noqa: BLE001 -- reported by the test
            self.error.append(exc)

    def connect(self, timeout=10):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return s

    def exchange(self, data, timeout=10, half_close=False, until_eof=False):
        """Send raw bytes on a fresh connection; read one response (its head and a
        Content-Length body; or until the proxy closes, or timeout). Returns the bytes."""
        s = self.connect(timeout)
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            return read_all(s, timeout) if until_eof else read_response(s, timeout)
        finally:
            s.close()

    def log(self):
        return read_log(self.record_dir)

    def wait_lines(self, n, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.log()
            if len(lines) >= n:
                return lines
            time.sleep(0.02)
        return self.log()

    def stop(self):
        self.stopping.set()
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        self.thread.join(10)
        self.listener.close()


def read_all(s, timeout=10):
    s.settimeout(timeout)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


def read_response(s, timeout=10):
    """One response: the head, then Content-Length bytes of body (a head without one: until
    EOF, or a short quiet spell after a tunnel's 200)."""
    s.settimeout(timeout)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        end = out.find(b"\r\n\r\n")
        if end >= 0:
            m = re.search(rb"\r\ncontent-length: *(\d+)", out[:end], re.I)
            if m and len(out) >= end + 4 + int(m.group(1)):
                return out
            if not m and out.startswith(b"HTTP/1.1 200 Connection established"):
                s.settimeout(0.3)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


def status_of(reply):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", reply)
    return int(m.group(1)) if m else None


def statuses(reply):
    return [int(x) for x in re.findall(rb"HTTP/1\.[01] (\d{3})", reply)]


def read_log(record_dir):
    path = os.path.join(str(record_dir), "egress.jsonl")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        if line.strip():
            out.append(json.loads(line))
    return out


def held_files(record_dir):
    d = os.path.join(str(record_dir), "held")
    if not os.path.isdir(d):
        return []
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), encoding="utf-8") as f:
            out.append(json.load(f))
    return out
