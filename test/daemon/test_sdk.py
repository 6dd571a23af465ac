"""The SDK, overlord_client.py: standalone, every method against a real daemon, every failure an
OverlordError with its code, thread-safe.

The first part needs no daemon: the file's isolation, the socket it picks, and the protocol edge
cases (a silent, garbage-sending or vanishing peer) against a tiny fake server on a unix socket.
"""
import ast
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from conftest import REPO

import overlord_client as oc

SDK = os.path.join(REPO, "overlord_client.py")


# -- standalone -------------------------------------------------------------------------------

def test_the_file_imports_nothing_from_overlord(tmp_path):
    tree = ast.parse(open(SDK, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) \
                in ("__import__", "import_module"):
            pytest.fail("a dynamic import")
    top = {n.split(".")[0] for n in names}
    assert not top & {"overlord", "mcp"}, top
    assert top <= set(sys.stdlib_module_names), top - set(sys.stdlib_module_names)
    # vendored alone, in an isolated interpreter whose path holds only the file's directory
    # (and the standard library): it imports and fails cleanly with no daemon
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "overlord_client.py").write_bytes(open(SDK, "rb").read())
    script = (
        "import sys\n"
        "sys.path = [sys.argv[1]] + [p for p in sys.path if 'site-packages' not in p "
        "and 'dist-packages' not in p and p]\n"
        "import overlord_client as oc\n"
        "try:\n"
        "    oc.Client(sys.argv[2]).ping()\n"
        "except oc.OverlordError as e:\n"
        "    print(e.code, e)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('overlord', 'mcp'))\n"
        "print('modules', bad)\n")
    proc = subprocess.run([sys.executable, "-I", "-c", script, str(vendor),
                           str(tmp_path / "none.sock")], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"503 no daemon on {tmp_path / 'none.sock'}: start it with `overlord daemon`"
    assert lines[1] == "modules []"


def test_the_socket_it_picks(monkeypatch, tmp_path):
    monkeypatch.delenv("OVERLORD_SOCKET", raising=False)
    monkeypatch.delenv("OVERLORD_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert oc.default_socket() == str(tmp_path / ".overlord" / "overlordd.sock")
    monkeypatch.setenv("OVERLORD_HOME", str(tmp_path / "h"))
    assert oc.Client().socket == str(tmp_path / "h" / "overlordd.sock")
    monkeypatch.setenv("OVERLORD_SOCKET", str(tmp_path / "s.sock"))
    assert oc.Client().socket == str(tmp_path / "s.sock")
    assert oc.Client(tmp_path / "x.sock").socket == str(tmp_path / "x.sock")


def test_no_daemon_is_the_documented_error(tmp_path):
    path = tmp_path / "overlordd.sock"
    client = oc.Client(path)
    with pytest.raises(oc.OverlordError) as e:
        client.sessions()
    assert e.value.code == oc.NO_DAEMON == 503
    assert str(e.value) == f"no daemon on {path}: start it with `overlord daemon`"
    # a socket file nobody listens on, and a path that is not a socket, are the same case
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    with pytest.raises(oc.OverlordError) as e:
        client.ping()
    assert e.value.code == 503 and "start it with `overlord daemon`" in str(e.value)
    client.close()
    with pytest.raises(oc.OverlordError) as e:
        client.ping()
    assert e.value.code == 503 and "closed" in str(e.value)


# -- the protocol's edges, against a fake peer ------------------------------------------------

class FakeDaemon:
    """Accepts connections on a unix socket; `behave(conn_file, request)` answers each line."""

    def __init__(self, path, behave):
        self.path, self.behave = str(path), behave
        self.sock = socket.socket(socket.AF_UNIX)
        _bind(self.sock, self.path)
        self.sock.listen(8)
        self.requests, self.connections = [], 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        with conn, conn.makefile("rwb") as f:
            for line in f:
                request = json.loads(line)
                self.requests.append(request)
                if self.behave(f, request) == "hang up":
                    return

    def close(self):
        self.sock.close()


def _bind(sock, path):
    """bind() a path of any length (through its directory's fd, as the SDK connects)."""
    if len(path) <= 100:
        sock.bind(path)
        return
    fd = os.open(os.path.dirname(path), os.O_PATH)
    try:
        sock.bind(f"/proc/self/fd/{fd}/{os.path.basename(path)}")
    finally:
        os.close(fd)


def send(f, obj):
    f.write(json.dumps(obj).encode() + b"\n" if not isinstance(obj, bytes) else obj)
    f.flush()


@pytest.fixture
def fake(tmp_path):
    made = []

    def make(behave, path=None):
        d = FakeDaemon(path or tmp_path / "fake.sock", behave)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


def test_replies_events_and_errors_by_id(fake):
    def behave(f, r):
        if r["op"] == "exec":
            send(f, {"id": r["id"], "event": {"kind": "output", "stream": "stdout", "text": "hé\n"}})
            send(f, {"id": r["id"], "event": {"kind": "output", "stream": "stderr", "b64": "/w=="}})
            send(f, {"id": r["id"], "ok": True, "sid": r["sid"], "exit_code": 3,
                     "timed_out": False, "layer": None, "state": "pending"})
        elif r["op"] == "diff":
            send(f, {"id": r["id"], "ok": False, "error": "no session 'nope'", "code": 404})
        else:
            send(f, {"id": r["id"], "ok": True, "pong": True})
    d = fake(behave)
    seen = []
    with oc.Client(d.path) as client:
        assert client.ping() == {"pong": True}
        r = client.exec("20260101-000000-abcdef", ["sh", "-c", "x"], stdin=b"\xff\x00",
                        on_output=lambda s, data: seen.append((s, data)))
        assert (r.exit_code, r.stdout, r.stdout_bytes) == (3, "hé\n", "hé\n".encode())
        assert (r.stderr_bytes, r.stderr) == (b"\xff", "\ufffd")
        assert seen == [("stdout", "hé\n".encode()), ("stderr", b"\xff")]
        with pytest.raises(oc.OverlordError) as e:
            client.diff("nope")
        assert (e.value.code, str(e.value)) == (404, "no session 'nope'")
    sent = d.requests[1]
    assert sent["argv"] == ["sh", "-c", "x"] and sent["stdin_b64"] == "/wA=" and "stdin" not in sent
    assert [r["id"] for r in d.requests] == sorted({r["id"] for r in d.requests})


def test_a_silent_daemon_times_out_and_a_late_reply_is_dropped(fake):
    release = threading.Event()

    def behave(f, r):
        if r["op"] == "slow":
            release.wait(30)
        send(f, {"id": r["id"], "ok": True, "op": r["op"]})
    d = fake(behave)
    with oc.Client(d.path, timeout=0.3) as client:
        with pytest.raises(oc.OverlordError) as e:
            client.call("slow")
        assert e.value.code == oc.NO_REPLY == 504
        release.set()
        assert client.call("ping") == {"op": "ping"}       # the slow reply went nowhere


def test_garbage_from_the_daemon_is_502_and_the_next_call_reconnects(fake):
    def behave(f, r):
        if r["op"] == "garbage":
            send(f, b"this is not json\n")
            return "hang up"
        if r["op"] == "list":
            send(f, b"[1, 2]\n")
            return "hang up"
        send(f, {"id": r["id"], "ok": True})
    d = fake(behave)
    with oc.Client(d.path) as client:
        for op in ("garbage", "list"):
            with pytest.raises(oc.OverlordError) as e:
                client.call(op)
            assert e.value.code == oc.BAD_REPLY == 502
            assert client.call("ping") == {}
    assert d.connections == 3


def test_a_connection_error_line_and_a_hang_up(fake):
    def behave(f, r):
        if r["op"] == "refused":
            send(f, {"id": None, "ok": False, "error": "request line over 1048576 bytes",
                     "code": 413})
            return "hang up"
        if r["op"] == "vanish":
            return "hang up"
        send(f, {"id": r["id"], "ok": True})
    d = fake(behave)
    with oc.Client(d.path) as client:
        with pytest.raises(oc.OverlordError) as e:
            client.call("refused")
        assert (e.value.code, str(e.value)) == (413, "request line over 1048576 bytes")
        with pytest.raises(oc.OverlordError) as e:
            client.call("vanish")
        assert e.value.code == 503 and "closed the connection" in str(e.value)
        assert client.call("ping") == {}


def test_a_request_over_the_cap_is_refused_before_it_is_sent(fake):
    d = fake(lambda f, r: send(f, {"id": r["id"], "ok": True}))
    with oc.Client(d.path) as client:
        with pytest.raises(oc.OverlordError) as e:
            client.exec("20260101-000000-abcdef", ["cat"], stdin="x" * oc.MAX_LINE)
        assert e.value.code == 413
        assert client.ping() == {}
    assert [r["op"] for r in d.requests] == ["ping"]


def test_bad_arguments_are_400_before_anything_is_sent(fake):
    d = fake(lambda f, r: send(f, {"id": r["id"], "ok": True}))
    with oc.Client(d.path) as client:
        for argv in ("ls -l", [], ["ls", 3], None):
            with pytest.raises(oc.OverlordError) as e:
                client.exec("20260101-000000-abcdef", argv)
            assert e.value.code == 400
        with pytest.raises(oc.OverlordError) as e:
            client.exec("20260101-000000-abcdef", ["cat"], stdin=3)
        assert e.value.code == 400
        with pytest.raises(oc.OverlordError) as e:
            client.run("/tmp", ["true"], jial=True)
        assert e.value.code == 400 and "jial" in str(e.value)
        with pytest.raises(oc.OverlordError) as e:
            client.call("ping", x=object())
        assert e.value.code == 400
    assert d.requests == []


def test_a_socket_path_longer_than_sun_path(fake, tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    d = fake(lambda f, r: send(f, {"id": r["id"], "ok": True, "n": 1}), deep / "overlordd.sock")
    assert len(d.path) > 108
    with oc.Client(d.path) as client:
        assert client.ping() == {"n": 1}


def test_replies_out_of_order_reach_their_callers(fake):
    second_answered = threading.Event()
    lock = threading.Lock()

    def answer_first(f, r):
        second_answered.wait(30)
        with lock:
            send(f, {"id": r["id"], "ok": True, "was": "first"})

    def behave(f, r):
        if r["op"] == "first":          # held until "second" was answered
            threading.Thread(target=answer_first, args=(f, r), daemon=True).start()
            return None
        with lock:
            send(f, {"id": r["id"], "ok": True, "was": r["op"]})
        second_answered.set()
    d = fake(behave)
    got = {}
    with oc.Client(d.path, timeout=30) as client:
        t = threading.Thread(target=lambda: got.update(a=client.call("first")))
        t.start()
        assert _await(lambda: [r["op"] for r in d.requests] == ["first"])
        got["b"] = client.call("second")
        t.join(30)
    assert got == {"a": {"was": "first"}, "b": {"was": "second"}}
    assert d.connections == 1


def test_calls_from_many_threads_share_one_connection(fake):
    d = fake(lambda f, r: send(f, {"id": r["id"], "ok": True, "echo": r["n"]}))
    out, errors = {}, []
    with oc.Client(d.path) as client:
        def work(k):
            try:
                for i in range(25):
                    n = k * 100 + i
                    out[n] = client.call("echo", n=n)["echo"]
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and len(out) == 200 and all(k == v for k, v in out.items())
    assert d.connections == 1


def _await(condition, timeout=30):
    """Poll a condition until it holds (True) or the timeout passes (False)."""
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False
