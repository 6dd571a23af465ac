"""What the webhook tests share: a real HTTP receiver on 127.0.0.1 (answers scripted per
request, or hanging), readers for the delivery log, and waiting on conditions.

Imported by the test modules (`from notifylib import ...`) rather than living in a second
conftest.py that would compete for the module name `conftest`."""
import hashlib
import hmac
import json
import os
import socket
import threading
import time

import pytest

from conftest import Ovl

FAST = {"OVERLORD_NOTIFY_BACKOFF": "0.01"}


class Receiver:
    """A threaded HTTP server recording every request: (path, headers, body bytes, when).
    `answers` is a list of statuses used in turn (the last repeats); `hang` makes it read the
    request and never answer (until closed)."""

    def __init__(self, answers=(200,), hang=False, tls=None):
        self.answers, self.hang, self.tls = list(answers), hang, tls
        self.requests, self.lock, self.closing = [], threading.Lock(), threading.Event()
        self.active, self.most_active = 0, 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.conns = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_request(self, conn):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return method, path, headers, body

    def _handle(self, conn):
        with conn:
            try:
                if self.tls is not None:
                    conn.settimeout(10)
                    conn = self.tls.wrap_socket(conn, server_side=True)
                got = self._read_request(conn)
            except OSError:
                return
            if got is None:
                return
            method, path, headers, body = got
            with self.lock:
                self.active += 1
                self.most_active = max(self.most_active, self.active)
                n = len(self.requests)
                self.requests.append({"method": method, "path": path, "headers": headers,
                                      "body": body, "at": time.monotonic()})
                status = self.answers[min(n, len(self.answers) - 1)]
            if self.hang:
                self.closing.wait(60)
                return
            with self.lock:
                self.active -= 1              # before the answer: a sender waits for it
            try:
                payload = b"ok"
                conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Length: {len(payload)}\r\n"
                             f"Connection: close\r\n\r\n".encode() + payload)
            except OSError:
                pass

    def bodies(self):
        return [json.loads(r["body"]) for r in self.requests]

    def close(self):
        """Stop accepting: shutdown wakes the accept thread, which is joined before the fd is
        closed (closing it under a blocked accept would let that thread accept on whatever
        socket reuses the fd number -- a later test's receiver)."""
        self.closing.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(10)
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


@pytest.fixture
def receiver():
    made = []

    def make(*answers, hang=False, tls=None):
        r = Receiver(answers or (200,), hang=hang, tls=tls)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def dead_url():
    """A loopback port nobody listens on (bound, then closed: connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/hook"


def await_(condition, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s"
        time.sleep(0.02)


def deliveries(home):
    path = os.path.join(home, "notify", "deliveries.jsonl")
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def outcomes_for(home, action=None, hook=None):
    return [d for d in deliveries(home)
            if (action is None or d["action"] == action) and (hook is None or d["hook"] == hook)]


def audit_entries(home):
    path = os.path.join(home, "audit.jsonl")
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def sender_idle(home):
    """True when no sender holds the lock (it has finished)."""
    import fcntl
    path = os.path.join(home, "notify", "sender.lock")
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def queued(home):
    """Complete spool lines past the sender's offset (what is still owed)."""
    d = os.path.join(home, "notify")
    try:
        with open(os.path.join(d, "state.json")) as f:
            offset = json.load(f)["offset"]
    except (OSError, ValueError, KeyError):
        offset = 0
    try:
        with open(os.path.join(d, "queue.jsonl"), "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return 0
    return data.count(b"\n")


def wait_idle(home, timeout=60):
    """Until nothing is owed and no sender holds the lock (a sender just spawned may not have
    taken it yet: what is owed says it will)."""
    await_(lambda: queued(home) == 0 and sender_idle(home), timeout, "the sender finishing")


# The receiver's check, as docs/WEBHOOKS.md gives it to people who write receivers.
def verify(secret, header, body, now=None, tolerance=300):
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    t, sig = int(fields["t"]), fields["v1"]
    if abs((now or time.time()) - t) > tolerance:
        return False
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, sig)


class Cli(Ovl):
    """The CLI with instant backoff unless told."""

    def env(self, extra=None):
        return super().env(dict(FAST, **(extra or {})))


@pytest.fixture
def cli(home):
    c = Cli(home)
    yield c
    wait_idle(home)        # no sender outlives its test's OVERLORD_HOME


def docs_verify():
    """The receiver's check exactly as docs/WEBHOOKS.md prints it (its python block)."""
    import re
    from conftest import REPO
    with open(os.path.join(REPO, "docs", "WEBHOOKS.md"), encoding="utf-8") as f:
        text = f.read()
    [code] = [c for c in re.findall(r"```python\n(.*?)```", text, re.S) if "def verify" in c]
    space = {}
    exec(compile(code, "docs/WEBHOOKS.md", "exec"), space)      # noqa: S102 - our own doc
    return space["verify"]
