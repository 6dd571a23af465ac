"""The `daemon` fixture: `python3 -m overlord daemon --socket P` as a subprocess with the test's
OVERLORD_HOME (and, where the test also takes `backend`, that backend), ready once it answers
ping; a `DaemonConn` speaks the line protocol (docs/DAEMON.md) to it.

pytest imports every conftest.py outside a package as the module `conftest`, the last one
loaded replacing the others in sys.modules -- so a test module anywhere that says `from
conftest import tree` may get this file. It therefore carries test/conftest.py's names too
(loaded from that file, not copied).
"""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conftest.py")
_spec = importlib.util.spec_from_file_location("overlord_test_conftest", _ROOT)
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
globals().update({k: v for k, v in vars(_root).items() if not k.startswith("__")})
Ovl, REPO = _root.Ovl, _root.REPO

START_TIMEOUT = 60          # seconds for a daemon to answer ping (a loaded CI machine)
REPLY_TIMEOUT = 120


class DaemonConn:
    """One connection: send(obj or bytes), recv() -> one message, request(obj) -> reply."""

    def __init__(self, path, timeout=REPLY_TIMEOUT):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""
        self.ids = iter(range(1, 1 << 30))
        self.events = []          # the events of the last request()

    def send(self, obj):
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n"
        self.sock.sendall(data)

    def recv(self):
        """The next message (a dict); EOFError when the daemon closed the connection."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, obj, on_event=None):
        """Send obj (an id is added if it has none) and return its reply; the events that
        came before it are in self.events (and passed to on_event as they arrive)."""
        obj = dict(obj)
        obj.setdefault("id", next(self.ids))
        self.send(obj)
        self.events = []
        while True:
            msg = self.recv()
            if msg.get("id") != obj["id"]:
                continue
            if "event" in msg:
                self.events.append(msg["event"])
                if on_event:
                    on_event(msg["event"])
                continue
            return msg

    def output(self, stream="stdout"):
        """The bytes of the last request's output events on stream."""
        import base64
        return b"".join(e["text"].encode() if "text" in e else base64.b64decode(e["b64"])
                        for e in self.events if e.get("kind") == "output" and e["stream"] == stream)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Daemon:
    """A daemon subprocess: .socket, .proc, .home, .request(obj) -> reply, .connect(),
    .kill(sig), .stop(), .restart(), .allow(target, **rule) (a policy.json entry)."""

    def __init__(self, home, socket_path, backend=None, env=None):
        self.home, self.socket, self.backend = home, str(socket_path), backend
        self.extra = dict(env or {})
        self.proc = None
        self.log = []

    def env(self):
        return Ovl(self.home, self.backend).env(self.extra)

    def start(self):
        """Start it and wait until it answers ping (or exits: then fail with its log)."""
        self.log = []
        ready = threading.Event()
        self.proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "overlord",
                                      "daemon", "--socket",
                                      self.socket], env=self.env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def drain(proc=self.proc, log=self.log):
            for line in proc.stderr:
                log.append(line.decode("utf-8", "replace"))
                if " serving on " in log[-1]:
                    ready.set()
            ready.set()                     # exited: the wait below looks at why
        threading.Thread(target=drain, daemon=True).start()
        ready.wait(START_TIMEOUT)
        if self.proc.poll() is not None or not ready.is_set():
            self.kill()
            pytest.fail(f"the daemon did not start: {''.join(self.log)}")
        reply = self.request({"op": "ping"})
        assert reply["ok"] and reply["pid"] == self.proc.pid, reply
        return self

    def connect(self, timeout=REPLY_TIMEOUT):
        return DaemonConn(self.socket, timeout)

    def request(self, obj, on_event=None):
        with self.connect() as conn:
            reply = conn.request(obj, on_event)
            self.events = conn.events
            return reply

    def ok(self, obj, on_event=None):
        """request() that must succeed; the reply."""
        reply = self.request(obj, on_event)
        assert reply["ok"], reply
        return reply

    def kill(self, sig=signal.SIGKILL):
        """Send sig and wait for the exit; one that does not come is a failure, with every
        thread's stack (faulthandler, on SIGABRT) in the message."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=60)
            time.sleep(0.5)                     # the drain thread's last lines
            pytest.fail(f"the daemon did not exit on signal {sig}: {''.join(self.log)}")
        return self.proc.returncode

    def stop(self):
        """SIGTERM, as systemd stops it; the exit status."""
        return self.kill(signal.SIGTERM)

    def restart(self):
        self.stop()
        return self.start()

    def allow(self, target, **rule):
        """Add a policy.json `targets` entry covering target (mode 0600, as policy wants)."""
        path = os.path.join(self.home, "policy.json")
        try:
            with open(path, encoding="utf-8") as f:
                policy = json.load(f)
        except FileNotFoundError:
            policy = {}
        policy.setdefault("targets", {})[os.path.realpath(target)] = rule
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(policy, f)
        os.chmod(path + ".tmp", 0o600)
        os.rename(path + ".tmp", path)


def wait_for(condition, timeout=60, what="the condition"):
    """Wait until condition() is true (polled); its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def daemon(request, home):
    """A running daemon on HOME/overlordd.sock; on the test's backend if it takes `backend`."""
    backend = request.getfixturevalue("backend") if "backend" in request.fixturenames else None
    d = Daemon(home, os.path.join(home, "overlordd.sock"), backend)
    d.start()
    yield d
    d.stop()
