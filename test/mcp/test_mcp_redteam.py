"""Red team of `overlord mcp serve` (issue 12 item 4): a hostile MCP client on stdio, and a
hostile local process or web page on the HTTP transport. A hole found is a test that failed
before its fix; an attack that held stays as a cheap test. (The daemon, the hook and the SDK:
test/redteam/test_redteam_faces.py.)"""
import http.client
import json
import socket
import threading
import time

import pytest

from conftest import Ovl, tree
from mcplib import Http, Raw, admit, grants, meta_envelope, records

LONE = "ev\ud800il"          # a lone surrogate: JSON can say it, UTF-8 cannot carry it


@pytest.fixture
def raw(home, target):
    peer = Raw(home, target)
    yield peer
    peer.kill()


@pytest.fixture
def server(home, target):
    running = Http(home, target)
    yield running
    assert "Traceback" not in running.stop()


# -- stdio ---------------------------------------------------------------------------------------

def test_a_client_name_with_a_lone_surrogate_opens_a_whole_session(raw, home, target, backend):
    """The name reached the audit chain's rendering, which could not encode it: open_session
    failed half-way and left a session `running` on the target, blocking every later one."""
    admit(home, target, backend)
    raw.initialize(name=LONE)
    opened = raw.call("open_session", grants(backend))
    assert not opened["isError"], opened
    sid = opened["structuredContent"]["session"]
    ran = raw.call("exec", {"session": sid, "command": "echo x > x.txt"})
    assert not ran["isError"], ran
    meta = json.loads((home / "sessions" / sid / "meta.json").read_text())
    assert meta["state"] == "pending" and meta["broker"]["client"] == LONE
    for args in (("sessions",), ("log", sid), ("savepoints", sid), ("audit", "show")):
        proc = Ovl(home, backend)(*args, check=0)
        assert proc.returncode == 0 and "Traceback" not in proc.err, (args, proc.err)
        assert "\x1b" not in proc.out


def test_a_cancel_then_a_new_call_with_the_same_id_gets_only_its_own_answer(raw, home, target,
                                                                            backend):
    admit(home, target, backend)
    raw.initialize()
    sid = raw.call("open_session", grants(backend))["structuredContent"]["session"]
    raw.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "exec", "arguments": {"session": sid, "command": "touch started; sleep 300"}}})
    upper = home / "sessions" / sid / "upper" / "started"
    deadline = time.monotonic() + 60
    while not upper.exists() and not (home / "sessions" / sid / "merged" / "started").exists():
        assert time.monotonic() < deadline, raw.stderr()
        time.sleep(0.02)
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}})
    again = None
    for _ in range(200):                      # the same id at once: refused while it winds down
        answer = raw.request("tools/call", {"name": "exec", "arguments": {
            "session": sid, "command": "echo again"}}, msg_id=5)
        if "result" in answer:
            again = answer["result"]
            break
        assert answer["error"]["code"] == -32600 and "in use" in answer["error"]["message"]
        time.sleep(0.05)
    assert again and again["structuredContent"]["stdout"] == "again\n", again
    code, rest = raw.close()
    assert code == 0 and rest == b""          # nothing for the cancelled call, ever


@pytest.mark.parametrize("arguments", [
    {"session": 5, "command": "true"}, {"session": ["x"], "command": "true"},
    {"session": "../../etc", "command": "true"}, {"session": "20260101-000000-abcdef/..",
                                                  "command": "true"},
    {"session": "20260101-000000-abcdef", "command": ["ls"]},
    {"session": "20260101-000000-abcdef", "command": "true", "timeout": "5"},
    {"session": "20260101-000000-abcdef", "command": "true", "timeout": True},
    {"session": "20260101-000000-abcdef", "command": "true", "extra": 1},
    {"session": "\ud800", "command": "true"},
    {"session": "20260101-000000-abcdef", "command": "echo \ud800"},
])
def test_tool_arguments_of_the_wrong_shape_are_tool_errors_and_change_nothing(
        raw, home, target, arguments):
    before = tree(target), records(home)
    raw.initialize()
    result = raw.call("exec", arguments)
    assert result["isError"] is True and "Traceback" not in json.dumps(result), result
    assert raw.request("ping")["result"] == {}
    assert (tree(target), records(home)) == before


def test_a_huge_tool_call_is_answered_and_the_server_serves_on(raw, home, target):
    raw.initialize()
    big = "x" * (8 << 20)
    result = raw.call("exec", {"session": "20260101-000000-abcdef", "command": big})
    assert result["isError"] is True
    assert raw.request("ping")["result"] == {}


# -- http ----------------------------------------------------------------------------------------

def test_host_origin_and_token_shapes_are_refused(server, home, target):
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x"}}}
    port, token = server.port, server.token
    before = tree(target), records(home)
    for headers, status in [
            ({"Host": "127.0.0.1"}, 421), ({"Host": f"127.0.0.1:{port + 1}"}, 421),
            ({"Host": f"127.0.0.1:0{port}"}, 421), ({"Host": f"127.0.0.1.:{port}"}, 421),
            ({"Host": f"[::1]:{port}"}, 421), ({"Host": f"localhost.:{port}"}, 421),
            ({"Host": f"attacker.example:{port}"}, 421), ({"Host": ""}, 421),
            ({"Origin": "null"}, 403), ({"Origin": f"http://127.0.0.1:{port}.evil.example"}, 403),
            ({"Origin": f"https://127.0.0.1:{port}"}, 403), ({"Origin": f"http://localhost:{port}"}, 403),
            ({"Origin": f"http://[::1]:{port}"}, 403), ({"Origin": ""}, 403),
            ({"Authorization": f"bearer {token}"}, 401), ({"Authorization": f"Bearer {token.upper()}"}, 401),
            ({"Authorization": f"Bearer {token}0"}, 401), ({"Authorization": f"Bearer {token[:-1]}"}, 401),
            ({"Authorization": "Bearer "}, 401), ({"Authorization": f"Basic {token}"}, 401)]:
        got, _, answer = server.rpc(init, headers)
        assert got == status, (headers, got, answer)
        assert answer["error"]["code"] and answer["id"] is None
    # two Host headers, the first one foreign: the first is the one checked
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps(init).encode()
    conn.putrequest("POST", "/mcp", skip_host=True, skip_accept_encoding=True)
    for key, value in (("Host", "attacker.example"), ("Host", server.host),
                       ("Authorization", f"Bearer {token}"), ("Content-Type", "application/json"),
                       ("Accept", "application/json"), ("Content-Length", str(len(body)))):
        conn.putheader(key, value)
    conn.endheaders(body)
    assert conn.getresponse().status == 421
    conn.close()
    assert (tree(target), records(home)) == before


def test_a_tool_result_cannot_inject_an_sse_event(server, home, target, backend):
    admit(home, target, backend)

    def call(name, arguments):
        body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": name, "arguments": arguments, "_meta": meta_envelope("sse")}}
        headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
                   "Mcp-Name": name, "Accept": "text/event-stream"}
        status, got, data = server.post(body, headers)
        assert status == 200 and got["content-type"] == "text/event-stream", data
        return data
    opened = call("open_session", grants(backend))
    sid = json.loads(opened.split(b"data: ", 1)[1])["result"]["structuredContent"]["session"]
    data = call("exec", {"session": sid, "command": r"printf 'a\n\nevent: evil\ndata: {}\r\n\r\nid: 7\rretry: 1\n'"})
    assert data.startswith(b"event: message\ndata: ") and data.endswith(b"\n\n")
    lines = data[:-2].split(b"\n")
    assert len(lines) == 2 and b"\r" not in data, data           # one event, one data line
    result = json.loads(lines[1][len(b"data: "):])["result"]
    assert "event: evil" in result["structuredContent"]["stdout"]


def test_a_silent_or_slow_connection_is_let_go(home, target, monkeypatch):
    """Any local user -- no token needed, the checks read the headers first -- could hold as
    many connections as descriptors allow, each a thread of the server waiting for ever."""
    from overlord.mcp import http as mcp_http
    from overlord.mcp import tools
    assert mcp_http.Handler.timeout and 0 < mcp_http.Handler.timeout <= 120
    monkeypatch.setattr(mcp_http.Handler, "timeout", 1)
    httpd = mcp_http.Server(("127.0.0.1", 0), mcp_http.Handler)
    httpd.configure(tools.Table(str(target)), "t" * 48, "127.0.0.1")
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    port = httpd.server_address[1]
    try:
        silent = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port)   # never finished
        for sock in (silent, half):
            sock.settimeout(30)
            try:
                assert sock.recv(1 << 16) == b""             # closed by the server
            except ConnectionResetError:
                pass
            sock.close()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_content_length_of_other_digits_is_411(server):
    got, _, answer = server.rpc(b"{}", {"Content-Length": "\u00b2"})
    assert got == 411 and answer["error"]["code"] == -32600, answer
    got, _, answer = server.rpc(b"{}", {"Content-Length": "1\u00b9"})
    assert got == 411, answer
