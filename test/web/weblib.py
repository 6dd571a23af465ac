"""What the web suites share: a real `overlord ui` process on 127.0.0.1 (port 0), an HTTP client
that can send anything (wrong Host, no token, foreign Origin), a server-sent-events reader, and
the fake model endpoints of test/agent/fakes.py.

The server runs as its own process, as `overlord ui` does (it forks its launcher before any
thread; the pytest process has threads of its own: the fake endpoints). Imported by the test
modules (`from weblib import ...`), like test/agent/agentlib.py.
"""
import http.client
import json
import os
import re
import select
import socket
import ssl
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "test", "agent"))

from conftest import require_backend, tree  # noqa: E402,F401 -- tree re-exported
from fakes import KEY, AnthropicFake, ChatFake, GeminiFake, ResponsesFake, sse_text  # noqa: E402,F401

URL_RE = re.compile(r"(http://127\.0\.0\.1:(\d+))/\?token=([0-9a-f]+)")
# any link `overlord ui` prints: https under TLS, a --host name, no token once accounts exist
LINK_RE = re.compile(r"overlord ui: ((https?)://(\[[0-9a-f:.]+\]|[^/:\s\[\]]+):(\d+))/(?:\?token=([0-9a-f]+))?")
ENV = {"OVERLORD_RETRY_SCALE": "0", "OVERLORD_PROVIDER_RETRIES": "1", "OVERLORD_PROVIDER_TIMEOUT": "30",
       "http_proxy": "", "https_proxy": "", "HTTP_PROXY": "", "HTTPS_PROXY": "", "no_proxy": "*",
       "ANTHROPIC_API_KEY": "", "OPENAI_API_KEY": "", "AZURE_OPENAI_API_KEY": "", "GEMINI_API_KEY": "",
       "OPENAI_COMPAT_API_KEY": "", "AZURE_OPENAI_ENDPOINT": ""}


def require_kernel():
    """The workspace's conversations run jailed: they need the kernel backend."""
    require_backend("kernel")


class Reply:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    @property
    def json(self):
        return json.loads(self.body)

    def header(self, name):
        return self.headers.get(name.lower())


class UI:
    """One `overlord ui` process and a client for it."""

    def __init__(self, home, folder, env=None, port=0, args=(), cafile=None):
        """args: more `overlord ui` arguments (--tls-cert F --tls-key F --host NAME ...);
        cafile: the certificate a TLS client trusts (default OVERLORD_HOME/tls/cert.pem)."""
        self.home, self.folder = str(home), str(folder)
        full = dict(os.environ, OVERLORD_HOME=self.home, PYTHONPATH=REPO, **ENV)
        full.update(env or {})
        self.log = os.path.join(self.home, f"ui-{time.monotonic_ns()}.log")
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "overlord", "ui", "--port", str(port),
                                          "--folder", self.folder, *map(str, args)], env=full, cwd=self.folder,
                                         stdout=subprocess.PIPE, stderr=err)
        line = self._first_line(30)
        m = LINK_RE.search(line)
        assert m, f"no launch link in {line!r}: {self.stderr()!r}"
        self.base, self.scheme, self.name, self.port = m.group(1), m.group(2), m.group(3), int(m.group(4))
        self.link = self.base + "/" + (f"?token={m.group(5)}" if m.group(5) else "")
        # the launch token (in the link only while there are no accounts)
        self.token = m.group(5) or open(os.path.join(self.home, "ui.token")).read().strip()
        self.host = f"{self.name}:{self.port}"
        self.tls = self.scheme == "https"
        self.cafile = str(cafile) if cafile else os.path.join(self.home, "tls", "cert.pem")
        bare = self.name.strip("[]")
        self.address = bare if re.fullmatch(r"[0-9.]+|[0-9a-f:.]*:[0-9a-f:.]*", bare) else "127.0.0.1"

    def _first_line(self, timeout):
        deadline = time.monotonic() + timeout
        data = b""
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                break
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                data += chunk
        return data.decode("utf-8", "replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        errors = self.stderr()
        assert "Traceback" not in errors, errors       # a server bug is a test failure

    def stderr(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    # -- requests ----------------------------------------------------------------------------

    def conn(self, timeout=30):
        if self.tls:
            return TLSConnection(self.address, self.name.strip("[]"), self.port, self.cafile, timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, auth=True, raw=None, conn=None):
        """Send exactly this; headers None-valued are left out (e.g. Host: None)."""
        own = conn is None
        conn = conn or self.conn()
        hdrs = {"Host": self.host}
        if auth:
            hdrs["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            raw = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in hdrs.items():
            if v is not None:
                conn.putheader(k, v)
        if raw is not None and "Content-Length" not in hdrs:
            conn.putheader("Content-Length", str(len(raw)))
        conn.endheaders(raw)
        res = conn.getresponse()
        reply = Reply(res.status, {k.lower(): v for k, v in res.getheaders()}, res.read())
        if own:
            conn.close()
        return reply

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body if body is not None else {}, **kw)

    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body=body, **kw)

    def ok(self, method, path, body=None, status=200):
        r = self.request(method, path, body=body)
        assert r.status == status, (method, path, r.status, r.body)
        return r.json

    # -- conversations -------------------------------------------------------------------------

    def use(self, fake, provider="anthropic", model=None, key=KEY, **profile):
        body = {"provider": provider, "profile": dict({"model": model or fake.MODEL, "base_url": fake.url},
                                                      **profile)}
        if key:
            body["api_key"] = key
        return self.ok("PUT", "/api/settings", body)

    def events(self, sid, timeout=60):
        return Events(self, sid, timeout)

    def stop(self, sid, ev):
        """Press Stop on the running conversation whose stream `ev` follows: the seconds until
        its run ended."""
        t = time.monotonic()
        assert self.ok("POST", f"/api/chats/{sid}/cancel", {}) == {"stopping": True}
        ev.until(lambda name, data: name == "state" and not data["running"])
        return time.monotonic() - t

    def wait_idle(self, sid, timeout=60):
        """Read the conversation's stream until its run has ended; return every event seen."""
        with self.events(sid, timeout) as ev:
            return ev.until(lambda name, data: name == "state" and not data["running"]
                            or name == "snapshot" and not data["running"] and data["records"]
                            and data["records"][-1]["type"] == "done")


class TLSConnection(http.client.HTTPSConnection):
    """HTTPS to `address` (127.0.0.1) verifying the certificate for `name` (the --host name the
    certificate is for, which need not resolve), trusting `cafile` only."""

    def __init__(self, address, name, port, cafile, timeout=30):
        super().__init__(name, port, timeout=timeout, context=ssl.create_default_context(cafile=cafile))
        self.address = address

    def connect(self):
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class Events:
    """A server-sent-events reader: [(name, data)] as they arrive."""

    def __init__(self, ui, sid, timeout):
        self.conn = ui.conn(timeout)
        self.conn.putrequest("GET", f"/api/chats/{sid}/events", skip_host=True)
        self.conn.putheader("Host", ui.host)
        self.conn.putheader("Authorization", f"Bearer {ui.token}")
        self.conn.putheader("Accept", "text/event-stream")
        self.conn.endheaders()
        self.res = self.conn.getresponse()
        assert self.res.status == 200, self.res.read()
        assert self.res.getheader("Content-Type").startswith("text/event-stream")
        self.deadline = time.monotonic() + timeout
        self.seen = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.conn.close()

    def next(self):
        name, data = None, []
        while True:
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"no end of run; events: {[n for n, _ in self.seen]}")
            line = self.res.fp.readline()
            if not line:
                raise EOFError("the stream ended")
            line = line.decode().rstrip("\n")
            if not line:
                if name or data:
                    event = (name or "message", json.loads("\n".join(data)) if data else None)
                    self.seen.append(event)
                    return event
                continue
            if line.startswith(":") or line.startswith("retry:"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)

    def until(self, done):
        while True:
            name, data = self.next()
            if done(name, data):
                return self.seen


def records(events, kind=None):
    """Every transcript record seen, from snapshots and live events (deduplicated by index)."""
    out = {}
    for name, data in events:
        if name == "snapshot":
            for r in data["records"]:
                out[r["i"]] = r
        elif name == "record":
            out[data["i"]] = data
    recs = [out[i] for i in sorted(out)]
    return [r for r in recs if kind is None or r["type"] == kind]


@pytest.fixture
def ui(home, target):
    server = UI(home, target)
    yield server
    server.close()
