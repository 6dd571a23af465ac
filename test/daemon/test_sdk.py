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

from conftest import REPO, tree

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
        """shutdown wakes the accept thread, which is joined before the fd is closed (closing
        it under a blocked accept would let that thread accept on whatever socket reuses the
        fd number -- a later test's listener)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(10)
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


# -- against a real daemon, on both backends --------------------------------------------------

def loose(backend):
    """What a harness asks for on this backend: the fuse backend cannot jail (nor go offline)."""
    return {"jail": False, "net": "host"} if backend == "fuse" else {}


@pytest.fixture
def sdk(daemon, target, backend):
    """(a Client of the test's daemon, the target policy covers, its grants)."""
    daemon.allow(target)
    with oc.Client(daemon.socket, timeout=120, name="sdk-test") as client:
        yield client, str(target), loose(backend)


def test_run_returns_a_session_and_its_methods_work(sdk, daemon, ovl):
    client, target, grants = sdk
    before = tree(target)
    s = client.run(target, ["sh", "-c", "echo out; echo err >&2; echo new > new.txt; exit 3"],
                   **grants)
    assert isinstance(s, oc.Session) and s.sid and s.state == "pending"
    assert (s.exit_code, s.timed_out, s.layer) == (3, False, 0)
    assert (s.stdout, s.stderr) == ("out\n", "err\n") and s.stdout_bytes == b"out\n"
    assert [(c["kind"], c["path"]) for c in s.changes] == [("added", "new.txt")]
    assert tree(target) == before                       # nothing reached the tree yet
    assert [(c["kind"], c["path"]) for c in s.diff()] == [("added", "new.txt")]
    assert ovl.diff(s.sid) == [("added", "new.txt")]    # the person's CLI sees the same session
    cause = s.log()["changes"][0]["caused_by"]
    assert cause["via"] == "daemon" and "new.txt" in cause["command"]
    assert [p["layer"] for p in s.savepoints()] == [0]
    assert s.check()["blocks"] is False
    listed = {x["sid"]: x for x in client.sessions()}[s.sid]
    assert listed["state"] == "pending" and listed["broker"]["client"] == "sdk-test"
    head = client.audit_head()["seq"]
    assert client.request_review(s.sid)["needs_review"]["client"] == "sdk-test"
    assert client.audit_head()["seq"] == head + 1
    done = s.commit()
    assert done["state"] == "committed" and done["counts"]["added"] == 1
    assert open(os.path.join(target, "new.txt")).read() == "new\n"
    # blame names the daemon's command; revert undoes the commit in a new pending session
    owner = client.blame(os.path.join(target, "new.txt"))["lines"][0]["owner"]
    assert owner["sid"] == s.sid
    undo = client.revert(s.sid, **grants)
    assert undo.state == "pending" and undo.reverts == s.sid
    assert [(c["kind"], c["path"]) for c in undo.diff()] == [("deleted", "new.txt")]
    assert undo.rollback()["state"] == "rolled-back"
    assert os.path.exists(os.path.join(target, "new.txt"))


def test_a_live_session_exec_shell_history_and_fork(sdk):
    client, target, grants = sdk
    with client.open(target, **grants) as live:
        assert isinstance(live, oc.LiveSession) and live.state == "pending"
        r = live.exec(["sh", "-c", "printf 'a\\377'; cat; echo oops >&2"], stdin=b"in\x00put")
        assert isinstance(r, oc.ExecResult)
        assert (r.exit_code, r.timed_out, r.layer, r.state) == (0, False, None, "pending")
        assert (r.stdout_bytes, r.stdout) == (b"a\xffin\x00put", "a\ufffdin\x00put")
        assert r.stderr == "oops\n"
        assert live.exec(["cat"], stdin="text é").stdout == "text é"
        assert live.shell("echo 1 > one.txt").layer == 0
        assert live.shell("echo 2 > two.txt; rm -f hello.txt").layer == 1
        assert [p["layer"] for p in live.savepoints()] == [0, 1]
        fork = live.fork(0)
        assert fork.forked_from == {"sid": live.sid, "layer": 0}
        assert [(c["kind"], c["path"]) for c in fork.diff()] == [("added", "one.txt")]
        rows = {r["path"]: r["status"] for r in client.compare(live.sid, fork.sid)["rows"]}
        assert rows["one.txt"] == "same" and rows["two.txt"] == "only-in-a"
        fork.rollback()
        assert live.rewind(0) == {"sid": live.sid, "to": 0, "dropped": 1}
        assert sorted((c["kind"], c["path"]) for c in live.diff()) == [("added", "one.txt")]
        t = live.exec(["sleep", "30"], timeout=0.3)
        assert t.timed_out and t.exit_code == 124
        with pytest.raises(oc.OverlordError) as e:
            live.exec(["/no/such/program"])
        assert e.value.code in (409, 500) and "/no/such/program" in str(e.value)
    assert live.closed
    assert sorted((c["kind"], c["path"]) for c in client.diff(live.sid)) == [("added", "one.txt")]
    live.rollback()


def test_the_context_manager_closes_and_leaves_the_session_pending(sdk, ovl):
    client, target, grants = sdk
    before = tree(target)
    with client.open(target, **grants) as live:
        live.shell("echo kept > kept.txt")
    assert live.closed and live.close() is None                 # idempotent
    assert {x["sid"]: x["state"] for x in client.sessions()}[live.sid] == "pending"
    assert tree(target) == before
    assert ovl.diff(live.sid) == [("added", "kept.txt")]
    # an exception inside the block comes out unchanged; still closed, still pending
    client.rollback(live.sid)
    with pytest.raises(KeyError):
        with client.open(target, **grants) as second:
            second.shell("echo x > x.txt")
            raise KeyError("the harness's own error")
    assert second.closed
    assert {x["sid"]: x["state"] for x in client.sessions()}[second.sid] == "pending"
    assert tree(target) == before
    second.rollback()


def test_output_is_live_and_a_callback_may_call_the_client(sdk):
    client, target, grants = sdk
    live = client.open(target, **grants)
    seen = []

    def on_output(stream, data):
        seen.append((stream, data))
        live.close()        # from inside the callback: cancels the command still running
    r = live.exec(["sh", "-c", "echo first; exec sleep 600"], on_output=on_output)
    assert seen == [("stdout", b"first\n")] and r.stdout == "first\n"
    assert r.cancelled is True and r.exit_code != 0
    assert {x["sid"]: x["state"] for x in client.sessions()}[live.sid] == "pending"
    client.rollback(live.sid)


def test_every_failure_is_an_overlord_error_with_the_daemons_code(sdk, daemon, tmp_path):
    client, target, grants = sdk
    elsewhere = tmp_path / "uncovered"
    elsewhere.mkdir()
    before = tree(target)
    cases = []

    def refused(fn, *args, **kw):
        with pytest.raises(oc.OverlordError) as e:
            fn(*args, **kw)
        cases.append((e.value.code, str(e.value)))
        return e.value
    e = refused(client.open, str(elsewhere), **grants)
    assert e.code == 403 and "policy.json" in str(e) and '"targets"' in str(e)
    assert refused(client.run, str(elsewhere), ["true"], **grants).code == 403
    daemon.allow(target, net="none")
    e = refused(client.open, target, jail=False, net="host")
    assert e.code == 403 and "net" in str(e)
    daemon.allow(target)
    assert refused(client.diff, "20200101-000000-abcdef").code == 404
    assert refused(client.diff, "../../etc").code == 400
    assert refused(client.call, "no_such_op").code == 404
    assert refused(client.call, "open", target=target, grants={"jial": True}).code == 400
    assert refused(client.rewind, "20200101-000000-abcdef", "one").code == 400
    s = client.open(target, **grants)
    assert refused(client.open, target, **grants).code == 409        # one pending per target
    s.rollback()
    assert refused(s.commit).code == 409                             # rolled back: nothing to commit
    assert refused(client.models, provider="no-such-provider").code == 400
    assert all(msg and "\n" not in msg for _, msg in cases), cases
    assert tree(target) == before


def test_no_daemon_then_a_restart_the_same_client_reconnects(sdk, daemon):
    client, target, grants = sdk
    assert client.ping()["pid"] == daemon.proc.pid
    daemon.stop()
    with pytest.raises(oc.OverlordError) as e:
        client.ping()
    assert e.value.code == 503
    assert str(e.value) == f"no daemon on {daemon.socket}: start it with `overlord daemon`"
    daemon.start()
    assert client.ping()["pid"] == daemon.proc.pid


def cut_off_mid_exec(live, script, cut):
    """Run script in the session on a thread; once it printed, cut() the connection under it.
    The OverlordError the exec call failed with."""
    started, failure = threading.Event(), []

    def run():
        try:
            live.exec(["sh", "-c", script], on_output=lambda s, d: started.set())
        except oc.OverlordError as exc:
            failure.append(exc)
    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60)
    cut()
    t.join(60)
    assert not t.is_alive() and len(failure) == 1, failure
    return failure[0]


def test_a_daemon_killed_mid_exec_is_503_and_the_session_survives(sdk, daemon):
    client, target, grants = sdk
    live = client.open(target, **grants)
    e = cut_off_mid_exec(live, "echo x > k.txt; echo started; exec sleep 300", daemon.kill)
    assert e.code == 503 and "closed the connection" in str(e)
    daemon.start()                             # reconciles what the killed daemon left
    assert {x["sid"]: x["state"] for x in client.sessions()}[live.sid] == "pending"
    assert [(c["kind"], c["path"]) for c in client.diff(live.sid)] == [("added", "k.txt")]
    client.rollback(live.sid)


def test_closing_the_client_mid_exec_fails_that_call_and_leaves_the_session(sdk, daemon):
    client, target, grants = sdk
    live = client.open(target, **grants)
    e = cut_off_mid_exec(live, "echo started; exec sleep 300", client.close)
    assert e.code == 503 and "closed" in str(e)
    with oc.Client(daemon.socket) as other:
        assert {x["sid"]: x["state"] for x in other.sessions()}[live.sid] == "pending"
        assert other.exec(live.sid, ["true"]).exit_code == 0    # queued behind the cancelled one
        other.rollback(live.sid)


def write_script(tmp_path, name, turns, model="scripted-test"):
    path = tmp_path / name
    path.write_text(json.dumps({"model": model, "turns": turns}))
    return str(path)


def test_agent_in_one_thread_agent_cancel_from_another(sdk, tmp_path, ovl):
    client, target, grants = sdk
    script = write_script(tmp_path, "agent.json", [
        {"text": "Working.", "tool_calls": [{"name": "write_file",
                                             "input": {"path": "made.txt", "content": "made\n"}},
                                            {"name": "shell", "input": {"command": "sleep 600"}}]},
        {"text": "Done."}])
    assert client.models(provider="scripted", script=script) == [
        {"id": "scripted-test", "name": "scripted-test"}]
    sids, events, out = [], [], {}
    slow_call = threading.Event()

    def on_event(event):
        events.append(event)
        if event.get("type") == "tool_call" and event.get("tool") == "shell":
            slow_call.set()

    def run():
        try:
            out["session"] = client.agent("make a file, then wait", target, on_event=on_event,
                                          on_session=sids.append, provider="scripted",
                                          script=script, **grants)
        except oc.OverlordError as exc:
            out["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    assert slow_call.wait(120), events
    assert client.agent_cancel(sids[0]) == {"sid": sids[0], "stopping": True}
    t.join(120)
    assert not t.is_alive() and "error" not in out, out
    s = out["session"]
    assert s.sid == sids[0] and s.reason == "cancelled" and s.state == "pending"
    assert {e["type"] for e in events} >= {"task", "tool_call", "tool_result"}
    assert [(c["kind"], c["path"]) for c in s.diff()] == [("added", "made.txt")]
    assert client.agent_cancel(s.sid)["stopping"] is False          # nothing runs any more
    deltas = []
    resumed = client.resume(s.sid, note="finish up", on_delta=lambda k, text: deltas.append(text))
    assert resumed.reason == "end_turn" and "".join(deltas) == "Done."
    # the reviewer is a person's choice: a brokered caller cannot script it ...
    review = write_script(tmp_path, "review.json", [
        {"tool_calls": [{"name": "approve", "input": {"reason": "fine"}}]}], model="reviewer-1")
    with pytest.raises(oc.OverlordError) as e:
        client.review(s.sid, provider="scripted", script=review)
    assert e.value.code == 403 and "script" in str(e.value)
    # ... a person reviews at the terminal; the harness's commit then holds the countersignature
    ovl("review", s.sid, "--provider", "scripted", "--script", review, check=0)
    assert s.commit(countersigned=True)["state"] == "committed"
    assert open(os.path.join(target, "made.txt")).read() == "made\n"


def test_the_integration_docs_ten_lines_run(sdk, daemon, ovl):
    client, target, grants = sdk
    doc = open(os.path.join(REPO, "docs", "INTEGRATION.md"), encoding="utf-8").read()
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in block.splitlines() if line.strip()]) <= 10
    assert 'client.open("/home/me/project")' in block
    daemon.allow(target, timeout=600)
    scope = {"TARGET": target, "GRANTS": grants}
    exec(block.replace('client.open("/home/me/project")', "client.open(TARGET, **GRANTS)"), scope)
    shell_tool, live = scope["shell_tool"], scope["live"]
    assert shell_tool("echo hi > hi.txt; echo out; echo err >&2") == "exit 0\nout\nerr\n"
    said = shell_tool("true", timeout=601)
    assert said.startswith("refused (403): ") and "timeout" in said
    live.request_review()
    live.close()
    scope["client"].close()
    assert ovl.diff(live.sid) == [("added", "hi.txt")]
    assert {x["sid"]: x["state"] for x in client.sessions()}[live.sid] == "pending"
