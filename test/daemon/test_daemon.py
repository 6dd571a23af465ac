"""`overlord daemon` through its socket: start and stop, framing and bad input, concurrency and
slow clients, every op, a disconnect and a SIGKILL mid-command, doctor's rows.

Sessions are brokered, so each test that opens one writes a policy.json entry covering its
target (daemon.allow). Nothing here needs root (test_daemon_peer.py holds the two that do).
"""
import base64
import json
import os
import signal
import socket
import stat
import sys
import threading
import time

import pytest

from conftest import REPO, Daemon, tree, wait_for
from overlord.daemon import handlers, server

SID0 = "20260101-000000-abcdef"       # well-formed, and no such session


def records(home, target):
    """What a refused request must not change: the tree, the sessions, the audit chain."""
    sessions = os.path.join(home, "sessions")
    audit = os.path.join(home, "audit.jsonl")
    return (tree(target), sorted(os.listdir(sessions)) if os.path.isdir(sessions) else [],
            open(audit, "rb").read() if os.path.exists(audit) else None)


def meta(home, sid):
    with open(os.path.join(home, "sessions", sid, "meta.json"), encoding="utf-8") as f:
        return json.load(f)


def grants(daemon):
    """What a brokered session must ask for on the daemon's backend: unasked it is jailed and
    offline, which the fuse backend cannot give (it refuses rather than run with less)."""
    return {"jail": False, "net": "host"} if daemon.backend == "fuse" else {}


def opened(daemon, target, **args):
    """A pending session on target through the daemon: its sid."""
    daemon.allow(target)
    reply = daemon.ok({"op": "open", "target": str(target), "grants": grants(daemon), **args})
    assert reply["state"] == "pending", reply
    return reply["sid"]


def until_output(conn, rid, text):
    """Read conn until request rid has written `text` on stdout (events kept in conn.events)."""
    seen = b""
    conn.events = []
    while text.encode() not in seen:
        msg = conn.recv()
        assert msg.get("id") == rid and "event" in msg, msg
        conn.events.append(msg["event"])
        if msg["event"].get("kind") == "output":
            seen += msg["event"].get("text", "").encode()


def started(daemon, sid, script, rid=1):
    """A connection on which request rid runs `sh -c SCRIPT` in session sid, then prints
    started and sleeps on (as `sleep 987654`): returned once it has said started."""
    conn = daemon.connect()
    conn.send({"id": rid, "op": "exec", "sid": sid,
               "argv": ["sh", "-c", f"{script}; echo started; exec sleep 987654"]})
    until_output(conn, rid, "started")
    return conn


def reply_to(conn, rid):
    while True:
        msg = conn.recv()
        if msg.get("id") == rid and "event" not in msg:
            return msg


# -- start and stop ---------------------------------------------------------------------------

def test_socket_is_private_and_ping_names_the_daemon(daemon, home):
    st = os.lstat(daemon.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    reply = daemon.ok({"op": "ping"})
    assert reply["pid"] == daemon.proc.pid and reply["uid"] == os.geteuid()
    assert reply["socket"] == daemon.socket and reply["version"]
    assert not [n for n in os.listdir(home) if n.startswith(".overlordd-")]   # no bind dir left


def test_a_second_daemon_on_the_socket_refuses_and_the_first_serves_on(daemon, home):
    from conftest import Ovl
    proc = Ovl(home)("daemon", "--socket", daemon.socket, timeout=60)
    assert proc.returncode == 1, (proc.out, proc.err)
    assert proc.err.startswith("overlord: a daemon already answers on ") and proc.err.count("\n") == 1
    assert f"(pid {daemon.proc.pid})" in proc.err
    assert daemon.ok({"op": "ping"})["pid"] == daemon.proc.pid


def test_only_a_stale_socket_of_ours_is_replaced(home, tmp_path):
    from conftest import Ovl
    path = tmp_path / "d.sock"
    path.write_text("not a socket\n")
    proc = Ovl(home)("daemon", "--socket", path, timeout=60)
    assert proc.returncode == 1 and "is not a socket of yours" in proc.err, proc.err
    assert path.read_text() == "not a socket\n"
    path.unlink()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))                     # a socket file nobody listens on any more
    stale.close()
    d = Daemon(home, path).start()
    try:
        assert d.ok({"op": "ping"})["pid"] == d.proc.pid
    finally:
        d.stop()


def test_sigterm_stops_cleanly_and_removes_the_socket(daemon):
    assert daemon.stop() == 0
    assert not os.path.lexists(daemon.socket)
    assert any("stopped" in line for line in daemon.log), daemon.log
    assert not any("Traceback" in line for line in daemon.log), daemon.log


# -- bad input --------------------------------------------------------------------------------

def test_bad_lines_get_an_error_and_the_connection_keeps_working(daemon, home, target):
    before = records(home, target)
    t = json.dumps(str(target))
    cases = [
        (b"garbage", 400, None),
        (b"\xff\xfe{}", 400, None),                              # not UTF-8
        (b"[1, 2]", 400, None),
        (b'"a string"', 400, None),
        (b"[" * 200000, 400, None),                              # nested past the parser
        (b'{"op": "ping"}', 400, None),                          # no id
        (b'{"id": true, "op": "ping"}', 400, None),
        (b'{"id": [1], "op": "ping"}', 400, None),
        (b'{"id": ""}', 400, None),
        (b'{"id": 1}', 400, 1),                                  # no op
        (b'{"id": 2, "op": 5}', 400, 2),
        (b'{"id": 3, "op": "format_disk"}', 404, 3),
        (b'{"id": 4, "op": "diff"}', 400, 4),                    # missing argument
        (b'{"id": 5, "op": "diff", "sid": 5}', 400, 5),
        (b'{"id": 6, "op": "diff", "sid": "../../etc"}', 400, 6),
        (b'{"id": 7, "op": "diff", "sid": "20260101-000000-abcdef/.."}', 400, 7),
        (b'{"id": "x", "op": "savepoints", "sid": ".."}', 400, "x"),
        (b'{"id": 8, "op": "ping", "bogus": 1}', 400, 8),       # unknown argument
        (b'{"id": 9, "op": "open", "target": ' + t.encode() + b', "grants": "loose"}', 400, 9),
        (b'{"id": 10, "op": "exec", "sid": "' + SID0.encode() + b'", "argv": "ls"}', 400, 10),
        (b'{"id": 11, "op": "exec", "sid": "' + SID0.encode() + b'", "argv": ["ls"], '
         b'"timeout": -1}', 400, 11),
        (b'{"id": 12, "op": "exec", "sid": "' + SID0.encode() + b'", "argv": ["ls"], '
         b'"stdin_b64": "%%%"}', 400, 12),
        (b'{"id": 13, "op": "rewind", "sid": "' + SID0.encode() + b'", "to": "1"}', 400, 13),
        (b'{"id": 14, "op": "commit", "sid": "' + SID0.encode() + b'", "force": "yes"}', 400, 14),
        (b'{"id": 15, "op": "diff", "sid": "' + SID0.encode() + b'"}', 404, 15),   # no such session
        (b'{"id": 16, "op": "open", "target": ' + t.encode() + b'}', 403, 16),    # no policy
        (b'{"id": 17, "op": "ping", "client": 7}', 400, 17),
    ]
    with daemon.connect() as conn:
        for line, code, rid in cases:
            conn.send(line + b"\n")
            reply = conn.recv()
            assert reply["ok"] is False and reply["code"] == code, (line[:80], reply)
            assert reply["id"] == rid, (line[:80], reply)
            assert isinstance(reply["error"], str) and "\n" not in reply["error"]
            assert conn.request({"op": "ping"})["ok"], line[:80]       # the connection lives
        conn.send(b"\n   \n")                     # blank lines are nothing at all
        assert conn.request({"op": "ping"})["ok"]
    assert records(home, target) == before
    assert daemon.proc.poll() is None


def test_a_denied_open_names_the_policy_file_and_records_nothing(daemon, home, target):
    before = records(home, target)
    reply = daemon.request({"op": "open", "target": str(target)})
    assert reply["code"] == 403
    assert os.path.join(str(home), "policy.json") in reply["error"] and '"targets"' in reply["error"]
    assert records(home, target) == before


def test_a_line_over_the_cap_gets_413_and_closes_and_the_daemon_lives(daemon):
    head = b'{"id": 1, "op": "ping", "pad": "'
    exact = head + b"x" * (server.MAX_LINE - len(head) - 2) + b'"}'
    assert len(exact) == server.MAX_LINE
    with daemon.connect() as conn:
        conn.send(exact + b"\n")                    # at the cap: read and answered
        reply = conn.recv()
        assert reply["code"] == 400 and "unknown argument" in reply["error"], reply
        conn.send(head + b"x" * server.MAX_LINE + b'"}\n')
        reply = conn.recv()
        assert reply == {"id": None, "ok": False, "code": 413, "error": reply["error"]}
        with pytest.raises((EOFError, ConnectionResetError, BrokenPipeError)):
            conn.recv()
    with daemon.connect() as conn:                   # no newline at all: refused as it grows
        with pytest.raises((EOFError, ConnectionResetError, BrokenPipeError)):
            conn.send(b"y" * (3 * server.MAX_LINE))
            conn.recv()
    assert daemon.ok({"op": "ping"})["pid"] == daemon.proc.pid


def test_output_events_keep_characters_whole_and_carry_other_bytes_exactly():
    sent = []

    class Ctx:
        class conn:
            alive = True

        def emit(self, event):
            sent.append(event)
    out = handlers.Output(Ctx())
    e = "é€😀".encode()
    for i in range(len(e)):                        # every split point of a multi-byte text
        sent.clear()
        out("stdout", e[:i])
        out("stdout", e[i:])
        assert "".join(s["text"] for s in sent) == "é€😀" and all("text" in s for s in sent)
    sent.clear()
    out("stderr", b"ok \xff\xfe")
    out("stderr", b"\xe2\x82")                     # an unfinished character at the end
    out.flush()
    data = b"".join(s["text"].encode() if "text" in s else base64.b64decode(s["b64"]) for s in sent)
    assert data == b"ok \xff\xfe\xe2\x82" and any("b64" in s for s in sent)


# -- concurrency and slow clients ---------------------------------------------------------------

def test_silent_half_line_and_garbage_clients_never_stall_another(daemon, target, backend):
    sid = opened(daemon, target)
    silent = daemon.connect()
    half = daemon.connect()
    half.send(b'{"id": 1, "op": "ping", "pad": "' + b"z" * (512 << 10))     # never finished
    garbage = daemon.connect()
    stop = threading.Event()

    def spew():
        try:
            while not stop.is_set():
                garbage.send(b"garbage \x00\xff\n" * 64)     # and never reads a reply
        except OSError:
            pass
    thread = threading.Thread(target=spew, daemon=True)
    thread.start()
    try:
        with daemon.connect(timeout=30) as conn:
            t0 = time.monotonic()
            assert conn.request({"op": "ping"})["ok"]
            reply = conn.request({"op": "exec", "sid": sid, "argv": ["sh", "-c", "echo still here"]})
            assert reply["ok"] and reply["exit_code"] == 0, reply
            assert conn.output() == b"still here\n"
            assert time.monotonic() - t0 < 30
    finally:
        stop.set()
        for c in (silent, half, garbage):
            c.close()
        thread.join(30)


def test_a_client_that_stops_reading_is_dropped_and_never_stalls_another(home, target, tmp_path,
                                                                          backend):
    other = tmp_path / "other"
    other.mkdir()
    d = Daemon(home, os.path.join(home, "overlordd.sock"), backend,
               env={"OVERLORD_DAEMON_SEND_TIMEOUT": "1"}).start()
    try:
        slow_sid = opened(d, target)
        sid = opened(d, other)
        slow = d.connect()
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.send({"id": 1, "op": "exec", "sid": slow_sid, "argv": ["yes", "overlord"]})
        with d.connect(timeout=60) as conn:          # meanwhile: served at once
            assert conn.request({"op": "ping"})["ok"]
            assert conn.request({"op": "exec", "sid": sid, "argv": ["echo", "hi"]})["exit_code"] == 0
            assert conn.output() == b"hi\n"
            # the reader that never reads is dropped after the send timeout and its endless
            # command cancelled: an exec queued behind it in its session runs
            reply = conn.request({"op": "exec", "sid": slow_sid, "argv": ["true"], "wait": True})
            assert reply["ok"] and reply["exit_code"] == 0 and reply["state"] == "pending", reply
        slow.close()
        assert meta(home, slow_sid)["state"] == "pending"
    finally:
        d.stop()


def test_disconnect_mid_exec_cancels_the_command_and_leaves_the_session_pending(
        daemon, home, target, backend, ovl):
    sid = opened(daemon, target)
    conn = started(daemon, sid, "echo one > made.txt")
    conn.close()                                    # the client goes away mid-command
    with daemon.connect(timeout=60) as other:       # queued behind it: runs once it is killed
        reply = other.request({"op": "exec", "sid": sid, "argv": ["cat", "made.txt"], "wait": True})
        assert reply["ok"] and other.output() == b"one\n", reply
    assert meta(home, sid)["state"] == "pending"
    assert ovl.diff(sid) == [("added", "made.txt")]
    points = daemon.ok({"op": "savepoints", "sid": sid})["savepoints"]
    assert [p["paths"] for p in points] == [1]             # its layer sealed, as it was
    assert not (target / "made.txt").exists()


def test_a_half_closed_client_still_gets_its_reply(daemon, target, backend):
    sid = opened(daemon, target)
    with daemon.connect() as conn:
        conn.send({"id": 1, "op": "exec", "sid": sid, "argv": ["sh", "-c", "sleep 1; echo done"]})
        conn.sock.shutdown(socket.SHUT_WR)           # nothing more to say; still listening
        reply = reply_to(conn, 1)
        assert reply["ok"] and reply["exit_code"] == 0 and not reply["cancelled"], reply


def test_requests_on_one_connection_run_together_and_close_cancels(daemon, home, target, backend):
    sid = opened(daemon, target)
    with started(daemon, sid, "echo x > kept.txt") as conn:
        conn.send({"id": 2, "op": "ping"})
        assert reply_to(conn, 2)["ok"]               # answered while 1 runs
        conn.send({"id": 1, "op": "ping"})          # an id still in flight is refused
        dup = reply_to(conn, 1)
        assert dup["ok"] is False and dup["code"] == 400 and "in flight" in dup["error"]
        conn.send({"id": 3, "op": "close", "sid": sid})
        closing = reply_to(conn, 3)
        assert closing["ok"] and closing["cancelled"] == 1 and closing["state"] == "pending"
        ended = reply_to(conn, 1)
        assert ended["ok"] and ended["cancelled"] is True and ended["exit_code"] != 0, ended
    assert meta(home, sid)["state"] == "pending"
    assert [c["path"] for c in daemon.ok({"op": "diff", "sid": sid})["changes"]] == ["kept.txt"]


def test_requests_over_the_in_flight_cap_are_refused_with_429(daemon, target, backend):
    sid = opened(daemon, target)
    with daemon.connect() as conn:
        for i in range(server.MAX_INFLIGHT):
            conn.send({"id": i, "op": "exec", "sid": sid, "argv": ["sleep", "600"], "wait": True})
        conn.send({"id": "over", "op": "exec", "sid": sid, "argv": ["true"]})
        reply = reply_to(conn, "over")
        assert reply["code"] == 429 and str(server.MAX_INFLIGHT) in reply["error"], reply
        assert conn.request({"id": "p", "op": "ping"})["ok"]    # inline ops still answer
    with daemon.connect(timeout=120) as conn:              # the closed one's are cancelled
        reply = conn.request({"op": "exec", "sid": sid, "argv": ["true"], "wait": True})
        assert reply["ok"] and reply["exit_code"] == 0, reply


def test_connections_over_the_cap_are_refused_with_429(daemon):
    conns = [daemon.connect() for _ in range(server.MAX_CONNECTIONS)]
    try:
        assert conns[-1].request({"op": "ping"})["ok"]     # every one of them admitted
        with daemon.connect() as extra:
            reply = extra.recv()
            assert reply["code"] == 429 and reply["id"] is None, reply
            with pytest.raises(EOFError):
                extra.recv()
        conns.pop().close()               # one place freed: a new connection is served
        assert wait_for(lambda: _pings(daemon), what="a connection to be served again")
    finally:
        for c in conns:
            c.close()


def _pings(daemon):
    try:
        return daemon.request({"op": "ping"}).get("ok")
    except (OSError, EOFError, ValueError):
        return False


# -- the ops ----------------------------------------------------------------------------------

def test_open_exec_close_and_what_a_session_shows(daemon, home, target, backend, ovl):
    daemon.allow(target)
    reply = daemon.ok({"op": "open", "target": str(target), "client": "harness \x1b[31mx",
                       "grants": grants(daemon)})
    sid = reply["sid"]
    assert reply["exit_code"] == 0 and reply["changes"] == [] and reply["layer"] is None
    assert meta(home, sid)["broker"] == {"face": "daemon", "client": "harness \x1b[31mx"}
    with daemon.connect() as conn:
        r = conn.request({"op": "exec", "sid": sid, "argv": ["sh", "-c", "cat > in.txt; echo é"],
                          "stdin": "from stdin\n"})
        assert r["ok"] and r["exit_code"] == 0 and r["layer"] == 0 and r["state"] == "pending", r
        assert conn.output() == "é\n".encode()
        r = conn.request({"op": "exec", "sid": sid, "argv": ["sh", "-c", "cat > raw.bin; printf '\\377' >&2"],
                          "stdin_b64": base64.b64encode(b"\x00\xff").decode()})
        assert r["exit_code"] == 0 and conn.output("stderr") == b"\xff"
        assert any("b64" in e for e in conn.events)
        r = conn.request({"op": "exec", "sid": sid, "argv": ["sh", "-c", "exit 3"]})
        assert r["exit_code"] == 3 and r["layer"] is None
        r = conn.request({"op": "exec", "sid": sid, "argv": ["sleep", "60"], "timeout": 0.5})
        assert r["timed_out"] is True and r["exit_code"] == 124, r
        closed = conn.request({"op": "close", "sid": sid})
        assert closed["ok"] and closed["state"] == "pending" and closed["cancelled"] == 0
    assert (target / "in.txt").exists() is False
    diff = daemon.ok({"op": "diff", "sid": sid})
    assert sorted((c["kind"], c["path"]) for c in diff["changes"]) == ovl.diff(sid) == [
        ("added", "in.txt"), ("added", "raw.bin")]
    log = daemon.ok({"op": "log", "sid": sid})
    cause = {c["path"]: c["caused_by"] for c in log["changes"]}["in.txt"]
    assert cause == {"kind": "command", "command": "sh -c 'cat > in.txt; echo é'", "via": "daemon"}
    assert log["dropped"] == []
    points = daemon.ok({"op": "savepoints", "sid": sid})["savepoints"]
    assert [p["layer"] for p in points] == [0, 1] and points[0]["caused_by"] == cause
    listed = {s["sid"]: s for s in daemon.ok({"op": "sessions"})["sessions"]}
    assert listed[sid]["state"] == "pending" and listed[sid]["layers"] == 2
    assert listed[sid]["broker"]["face"] == "daemon"
    assert sid in ovl("sessions", check=0).out                    # the CLI sees it too


def test_run_streams_the_command_and_leaves_the_session_pending(daemon, home, target, backend):
    daemon.allow(target)
    with daemon.connect() as conn:
        r = conn.request({"op": "run", "target": str(target), "client": "sdk",
                          "grants": grants(daemon),
                          "argv": ["sh", "-c", "echo new > n.txt; echo out; echo err >&2; exit 4"]})
        assert r["ok"] and r["exit_code"] == 4 and r["state"] == "pending", r
        assert conn.output() == b"out\n" and conn.output("stderr") == b"err\n"
    assert [(c["kind"], c["path"]) for c in r["changes"]] == [("added", "n.txt")]
    assert r["counts"]["added"] == 1
    assert meta(home, r["sid"])["broker"] == {"face": "daemon", "client": "sdk"}
    assert not (target / "n.txt").exists()


def test_history_commit_blame_revert_rollback_and_check(daemon, home, target, backend):
    sid = opened(daemon, target)
    for script in ("echo one > a.txt", "echo two > b.txt"):
        assert daemon.ok({"op": "exec", "sid": sid, "argv": ["sh", "-c", script]})["exit_code"] == 0
    fork = daemon.ok({"op": "fork", "sid": sid, "at": 0})
    assert fork["forked_from"] == {"sid": sid, "layer": 0} and fork["state"] == "pending"
    assert [c["path"] for c in fork["changes"]] == ["a.txt"]
    rows = daemon.ok({"op": "compare", "a": sid, "b": fork["sid"]})["rows"]
    assert {r["path"]: r["status"] for r in rows} == {"a.txt": "same", "b.txt": "only-in-a"}
    assert daemon.ok({"op": "rewind", "sid": sid, "to": 0})["dropped"] == 1
    assert daemon.request({"op": "rewind", "sid": sid, "to": 5})["code"] == 400
    report = daemon.ok({"op": "check", "sid": sid})
    assert report["blocks"] is False and report["sid"] == sid
    assert daemon.ok({"op": "rollback", "sid": fork["sid"]})["state"] == "rolled-back"
    done = daemon.ok({"op": "commit", "sid": sid})
    assert done["state"] == "committed" and [c["path"] for c in done["changes"]] == ["a.txt"]
    assert (target / "a.txt").read_text() == "one\n" and not (target / "b.txt").exists()
    assert daemon.request({"op": "commit", "sid": sid})["code"] == 409       # only once
    blame = daemon.ok({"op": "blame", "path": str(target / "a.txt")})
    assert blame["lines"][0]["owner"]["sid"] == sid
    back = daemon.ok({"op": "revert", "sid": sid, "grants": grants(daemon)})
    assert back["reverts"] == sid and back["layer"] == 0
    assert [(c["kind"], c["path"]) for c in back["changes"]] == [("deleted", "a.txt")]
    assert meta(home, back["sid"])["state"] == "pending"
    assert daemon.ok({"op": "rollback", "sid": back["sid"]})["state"] == "rolled-back"
    assert (target / "a.txt").read_text() == "one\n"


def test_request_review_and_the_audit_head(daemon, home, target, backend):
    sid = opened(daemon, target, client="bot")
    head = daemon.ok({"op": "audit_head"})
    asked = daemon.ok({"op": "request_review", "sid": sid, "client": "bot"})
    assert asked["needs_review"]["face"] == "daemon" and asked["needs_review"]["client"] == "bot"
    assert meta(home, sid)["needs_review"]["client"] == "bot"
    after = daemon.ok({"op": "audit_head"})
    assert after["seq"] == head["seq"] + 1 and after["mac"] != head["mac"]
    lines = open(os.path.join(home, "audit.jsonl"), encoding="utf-8").read().splitlines()
    assert json.loads(lines[-1])["action"] == "session.needs_review"


def test_review_streams_the_reviewer_and_returns_its_verdict(home, target, backend, tmp_path):
    sys.path.insert(0, os.path.join(REPO, "test", "agent"))
    from agentlib import ENV
    from fakes import KEY, ChatFake
    fake = ChatFake(path="/openai/deployments/my-dep/chat/completions", auth="api-key",
                    query={"api-version": "2024-10-21"})
    # a brokered review may not name its reviewer's endpoint (script, base_url): the daemon's
    # own environment does, as a person set it up
    d = Daemon(home, os.path.join(home, "overlordd.sock"), backend,
               env=dict(ENV, AZURE_OPENAI_ENDPOINT=fake.url, AZURE_OPENAI_API_KEY=KEY)).start()
    try:
        sid = opened(d, target)
        d.ok({"op": "exec", "sid": sid, "argv": ["sh", "-c", "echo fixed > hello.txt"]})
        script = tmp_path / "review.json"
        script.write_text(json.dumps({"turns": [{"tool_calls": [
            {"name": "approve", "input": {"reason": "I wrote this verdict myself"}}]}]}))
        refused = d.request({"op": "review", "sid": sid, "provider": "scripted",
                             "script": str(script)})
        assert refused["code"] == 403 and "script" in refused["error"], refused
        fake.queue(fake.turn(calls=[("approve", {"reason": "the change does what was asked"})]))
        r = d.ok({"op": "review", "sid": sid, "provider": "azure", "model": "my-dep",
                  "azure_api_version": "2024-10-21"})
        assert r["verdict"]["verdict"] == "approve" and r["verdict"]["reviewer"] == "azure:my-dep"
        assert any(e["kind"] == "review" for e in d.events)
        assert fake.problems == [] and len(fake.requests) == 1
        assert meta(home, sid)["reviews"][0]["verdict"] == "approve"
    finally:
        fake.close()
        d.stop()


def test_models_lists_what_the_endpoint_serves(daemon, tmp_path):
    script = tmp_path / "m.json"
    script.write_text(json.dumps({"model": "m-one", "turns": []}))
    r = daemon.ok({"op": "models", "provider": "scripted", "script": str(script)})
    assert r["models"] == [{"id": "m-one", "name": "m-one"}]
    assert daemon.request({"op": "models", "provider": 3})["code"] == 400


def _agent_script(tmp_path, turns):
    path = tmp_path / f"agent-{len(list(tmp_path.glob('agent-*.json')))}.json"
    path.write_text(json.dumps({"model": "scripted-agent", "turns": turns}))
    return str(path)


def test_agent_streams_its_events_agent_cancel_stops_it_and_resume_goes_on(
        daemon, home, target, backend, tmp_path):
    daemon.allow(target)
    script = _agent_script(tmp_path, [
        {"text": "writing", "tool_calls": [{"name": "write_file",
                                            "input": {"path": "w.txt", "content": "w\n"}}]},
        {"tool_calls": [{"name": "shell", "input": {"command": "echo waiting; exec sleep 600"}}]},
        {"text": "all done"}])
    ask = {"id": 1, "op": "agent", "task": "write w.txt", "target": str(target),
           "provider": "scripted", "script": script, "deltas": True}
    if backend == "fuse":          # a brokered agent is jailed, and the fuse backend cannot jail
        reply = daemon.request(ask)
        assert reply["ok"] is False and reply["code"] in (403, 409) and "jail" in reply["error"]
        return
    with daemon.connect() as conn:
        conn.send(ask)
        sid = None
        while True:                                  # until the agent's shell call runs
            msg = conn.recv()
            assert msg["id"] == 1 and "event" in msg, msg
            ev = msg["event"]
            if ev["kind"] == "session":
                sid = ev["sid"]
            if ev["kind"] == "agent" and ev["event"].get("type") == "tool_call" \
                    and ev["event"].get("tool") == "shell":
                break
        assert sid
        conn.send({"id": 2, "op": "agent_cancel", "sid": sid})
        assert reply_to(conn, 2) == {"id": 2, "ok": True, "sid": sid, "stopping": True}
        done = reply_to(conn, 1)
    assert done["ok"] and done["reason"] == "cancelled" and done["sid"] == sid, done
    assert [c["path"] for c in done["changes"]] == ["w.txt"]
    assert meta(home, sid)["state"] == "pending"
    assert daemon.ok({"op": "agent_cancel", "sid": sid})["stopping"] is False   # nothing runs
    again = daemon.ok({"op": "resume", "sid": sid, "note": "carry on", "deltas": True})
    assert again["reason"] == "end_turn" and again["sid"] == sid, again
    kinds = {e["kind"] for e in daemon.events}
    assert {"session", "agent", "delta"} <= kinds
    assert not (target / "w.txt").exists()


# -- killed mid-command -----------------------------------------------------------------------

def _descendants(pid):
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                kids.setdefault(int(fields[1]), []).append(int(name))
            except (OSError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _running(marker):
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker in f.read() and _alive(name):
                        return True
            except OSError:
                continue
    return False


def test_sigkill_mid_command_kills_the_family_and_the_next_start_reconciles(
        daemon, home, target, backend, ovl):
    sid = opened(daemon, target)
    conn = started(daemon, sid, "echo one > made.txt")
    # `started` is printed just before the shell execs the sleep: wait for the exec
    wait_for(lambda: _running(b"987654"), what="the command's sleep")
    family = _descendants(daemon.proc.pid)
    assert family
    daemon.kill(signal.SIGKILL)
    wait_for(lambda: not any(_alive(p) for p in family), what="the helper and workers to die")
    wait_for(lambda: not _running(b"987654"), what="the command to die")
    with pytest.raises((EOFError, ConnectionResetError)):
        conn.recv()
    conn.close()
    daemon.start()                                   # reconciles while it starts
    assert any("settled" in line and sid in line for line in daemon.log), daemon.log
    record = meta(home, sid)
    assert record["state"] == "pending" and record.get("interrupted") is True
    assert not os.path.exists(os.path.join(home, "sessions", sid, "upper"))
    assert ovl.diff(sid) == [("added", "made.txt")]
    log = ovl("log", sid, check=0).out
    assert "made.txt" in log
    r = daemon.ok({"op": "exec", "sid": sid, "argv": ["cat", "made.txt"]})
    assert r["exit_code"] == 0 and daemon.events[0]["text"] == "one\n"


# -- doctor -----------------------------------------------------------------------------------

def test_doctor_says_whether_a_daemon_answers_and_where(daemon, home):
    from conftest import Ovl
    cli = Ovl(home)
    data = json.loads(cli("doctor", "--json").out)
    assert data["daemon"] == {"socket": daemon.socket, "running": True, "pid": daemon.proc.pid,
                              "detail": data["daemon"]["detail"]}
    assert f"daemon: running on {daemon.socket} (pid {daemon.proc.pid})" in cli("doctor").out
    daemon.stop()
    data = json.loads(cli("doctor", "--json").out)
    assert data["daemon"]["running"] is False and data["daemon"]["pid"] is None
    assert f"daemon: not running ({daemon.socket}: no socket)" in cli("doctor").out


# -- systemd ----------------------------------------------------------------------------------

def test_the_daemon_tells_systemd_when_it_is_ready_and_stopping(home, target, tmp_path, backend):
    path = str(tmp_path / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(path)
    notify.settimeout(60)
    d = Daemon(home, os.path.join(home, "overlordd.sock"), backend,
               env={"NOTIFY_SOCKET": path}).start()
    try:
        assert notify.recv(4096).decode().split("\n") == ["READY=1", f"MAINPID={d.proc.pid}"]
        sid = opened(d, target)             # systemd's socket is the daemon's, not a command's
        d.ok({"op": "exec", "sid": sid, "argv": ["sh", "-c", "echo ${NOTIFY_SOCKET-unset}"]})
        assert d.events == [{"kind": "output", "stream": "stdout", "text": "unset\n"}]
    finally:
        assert d.stop() == 0
    assert notify.recv(4096) == b"STOPPING=1"
    notify.close()


def test_the_user_unit_runs_the_daemon_without_what_would_break_it():
    import configparser
    import shutil
    import subprocess
    unit = os.path.join(REPO, "packaging", "overlordd.service")
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str
    parser.read(unit, encoding="utf-8")
    service = parser["Service"]
    assert service["ExecStart"].split() == ["/usr/local/bin/overlord", "daemon"]   # the launcher
    assert service["Type"] == "notify" and service["KillMode"] == "mixed"
    assert service["UMask"] == "0077" and parser["Install"]["WantedBy"] == "default.target"
    # each of these breaks the daemon in a user unit (the file's comment says how)
    breaking = {"NoNewPrivileges", "SystemCallFilter", "SystemCallArchitectures",
                "MemoryDenyWriteExecute", "RestrictNamespaces", "RestrictSUIDSGID",
                "LockPersonality", "RestrictRealtime", "RestrictAddressFamilies",
                "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules",
                "ProtectKernelLogs", "ProtectClock", "ProtectHostname", "ProtectSystem",
                "ProtectHome", "PrivateTmp", "PrivateUsers", "ReadOnlyPaths",
                "InaccessiblePaths", "PrivateNetwork", "IPAddressDeny", "User", "DynamicUser"}
    assert breaking.isdisjoint(service), breaking & set(service)
    comments = [line for line in open(unit, encoding="utf-8") if line.startswith("#")]
    for name in ("NoNewPrivileges", "MemoryDenyWriteExecute", "ProtectSystem", "PrivateUsers"):
        assert any(f"{name}=" in line for line in comments), name       # and says why not
    if shutil.which("systemd-analyze"):       # its own reading of the file, where it is here
        proc = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
        assert "Unknown key" not in proc.stderr and "Invalid" not in proc.stderr, proc.stderr


def test_docs_daemon_md_lists_every_op_with_exactly_its_arguments():
    import re
    rows = {}
    with open(os.path.join(REPO, "docs", "DAEMON.md"), encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) == 4 and re.fullmatch(r"`[a-z_]+`", cells[0]):
                rows[cells[0].strip("`")] = set(re.findall(r"`([a-z_0-9]+)\??`", cells[1]))
    assert rows == {name: set(op.schema) for name, op in handlers.OPS.items()}
