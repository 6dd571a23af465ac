"""The connector client (overlord.agent.connectors.client) against a streamable-HTTP server built
with the official MCP SDK (mcp 2.3.0, served by uvicorn on 127.0.0.1): the stateless 2026-07-28
revision the SDK serves, the handshake when discover is refused (Mcp-Session-Id kept, DELETE on
close), JSON and SSE answers (json_response on and off), a server's requests inside an SSE
stream answered by a POST of their own, a configured header on every request, cancel and
timeout; and our own `overlord mcp serve --http` with its launch token as a configured header.

test/mcp is root-only (the ordinary-user pass has no `mcp` package)."""
import json
import os
import select
import subprocess
import sys
import threading
import time
import types

import pytest

from mcplib import Http, admit, require_mcp
from overlord.agent.cancel import Cancel, Cancelled
from overlord.agent.connectors import client
from overlord.agent.connectors.client import ConnectorError

require_mcp()

WAIT = 30.0

SERVER = r'''"""An MCP server built with the official SDK (2.3.0), served over streamable HTTP by uvicorn on
127.0.0.1 (a port of its own choosing, printed on stdout). argv: json|sse RECORD.

A middleware writes one JSON line per HTTP request to RECORD (verb, the MCP headers, the
JSON-RPC method, the answer's status and content type) and, for a client sending the
`X-Legacy: 1` header, refuses server/discover with 400 -32601 (an SDK server that predates
the 2026-07-28 revision, so the client must fall back to the handshake)."""
import json
import socket
import sys
import warnings

import mcp_types as types
import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.shared.message import ServerMessageMetadata

mode, record = sys.argv[1], sys.argv[2]
server = MCPServer("sdk-test", version="2.3.0-test")


@server.tool(annotations=types.ToolAnnotations(readOnlyHint=True))
def shout(text: str) -> str:
    """Upper-cases text."""
    return text.upper()


@server.tool()
def whoami(ctx: Context) -> str:
    """Says which X-Probe header and protocol version the request came with."""
    headers = ctx.headers or {}
    return f"probe={headers.get('x-probe')} version={ctx.protocol_version}"


@server.tool()
async def ask(ctx: Context) -> str:
    """Sends the client a ping and a roots/list on this request's stream; says what came back."""
    session, meta = ctx.request_context.session, ServerMessageMetadata(related_request_id=ctx.request_id)
    out = []
    for request, result in ((types.PingRequest(), types.EmptyResult),
                            (types.ListRootsRequest(), types.ListRootsResult)):
        try:
            await session.send_request(request, result, metadata=meta)
            out.append(f"{request.method}: answered")
        except Exception as exc:
            out.append(f"{request.method}: {type(exc).__name__}: {exc}")
    return "\n".join(out)


@server.tool()
async def chatty(ctx: Context) -> str:
    """Logs twice and reports progress on this request's stream (an SSE answer), then answers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await ctx.log("info", "working")
        await ctx.log("info", "still working")
    await ctx.report_progress(1, 2, "half way")
    return "chatted"


@server.tool(annotations=types.ToolAnnotations(readOnlyHint=True))
async def sleepy(seconds: float) -> str:
    """Sleeps (for cancellation)."""
    import anyio
    await anyio.sleep(seconds)
    return "slept"


app = server.streamable_http_app(json_response=(mode == "json"))


async def recording(scope, receive, send):
    if scope["type"] != "http":
        return await app(scope, receive, send)
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    try:
        rpc = json.loads(body) if body else {}
    except ValueError:
        rpc = {}
    entry = {"verb": scope["method"], "rpc": rpc.get("method") if isinstance(rpc, dict) else None,
             "headers": {k: v for k, v in headers.items() if k.startswith("mcp") or k in (
                 "x-probe", "accept", "content-type")}}

    def log():
        with open(record, "a") as f:
            f.write(json.dumps(entry) + "\n")

    with open(record + ".arrived", "a") as f:          # before any answer starts
        f.write(json.dumps(entry["rpc"]) + "\n")

    if headers.get("x-legacy") == "1" and entry["rpc"] == "server/discover":
        entry["status"] = 400
        log()
        data = json.dumps({"jsonrpc": "2.0", "id": rpc.get("id"), "error": {
            "code": -32601, "message": "Method not found"}}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json")]})
        return await send({"type": "http.response.body", "body": data})

    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    async def watch(message):
        if message["type"] == "http.response.start":
            entry["status"] = message["status"]
            entry["ctype"] = dict(message.get("headers", [])).get(b"content-type", b"").decode()
            log()
        await send(message)
    await app(scope, replay, watch)


sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)                # connections wait in the backlog until uvicorn accepts
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(recording, log_level="warning", lifespan="on")).run(sockets=[sock])
'''


def start(path, mode, record):
    proc = subprocess.Popen([sys.executable, str(path), mode, str(record)],
                            stdout=subprocess.PIPE, stderr=open(str(record) + ".err", "wb"))
    return proc


def port_of(proc, record):
    ready, _, _ = select.select([proc.stdout], [], [], WAIT)
    line = proc.stdout.readline() if ready else b""
    assert line.strip().isdigit(), (line, open(str(record) + ".err").read())
    return int(line)


@pytest.fixture(scope="module")
def sdk_servers(tmp_path_factory):
    """{"json": (url, record), "sse": (url, record)}: one SDK server per answer mode."""
    base = tmp_path_factory.mktemp("sdk")
    path = base / "sdk_server.py"
    path.write_text(SERVER)
    procs = {mode: (start(path, mode, base / f"{mode}.jsonl"), base / f"{mode}.jsonl")
             for mode in ("json", "sse")}
    try:
        yield {mode: (f"http://127.0.0.1:{port_of(proc, record)}/mcp", record)
               for mode, (proc, record) in procs.items()}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(WAIT)


def seen(record, since=0):
    """What the server's middleware recorded: one dict per HTTP request."""
    if not os.path.exists(record):
        return []
    with open(record) as f:
        return [json.loads(line) for line in f][since:]


def count(record):
    return len(seen(record))


def until(predicate, what, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def http_server(url, **headers):
    return types.SimpleNamespace(name="sdk", transport="http", url=url, headers=headers,
                                 command=None, args=[], env={})


@pytest.mark.parametrize("mode", ["json", "sse"])
def test_the_sdk_is_spoken_to_statelessly(sdk_servers, mode, tmp_path):
    url, record = sdk_servers[mode]
    since = count(record)
    log = tmp_path / "log"
    c = client.open(http_server(url, **{"X-Probe": "probe-value-1"}), log=str(log))
    try:
        assert (c.era, c.version) == ("stateless", "2026-07-28")
        assert c.server_info == {"name": "sdk-test", "version": "2.3.0-test"}
        tools = {t["name"]: t for t in c.list_tools()}
        assert tools["shout"]["annotations"]["readOnlyHint"] is True
        assert not (tools["whoami"].get("annotations") or {}).get("readOnlyHint")
        result = c.call_tool("shout", {"text": "quiet"})
        assert (result.text, result.is_error) == ("QUIET", False)
        assert c.call_tool("whoami", {}).text == "probe=probe-value-1 version=2026-07-28"
        missing = c.call_tool("no-such-tool", {})
        assert missing.is_error and "no-such-tool" in missing.text
    finally:
        c.close()
    got = seen(record, since)
    assert [g["rpc"] for g in got] == ["server/discover", "tools/list", "tools/call",
                                       "tools/call", "tools/call"]
    for g in got:
        h = g["headers"]
        assert g["verb"] == "POST" and g["status"] == 200, g
        assert h["accept"] == "application/json, text/event-stream"
        assert h["content-type"] == "application/json"
        assert h["x-probe"] == "probe-value-1"                     # configured, every request
        assert h["mcp-protocol-version"] == "2026-07-28" and h["mcp-method"] == g["rpc"]
        assert "mcp-session-id" not in h
    assert [g["headers"].get("mcp-name") for g in got[2:]] == ["shout", "whoami", "no-such-tool"]
    assert "connected: stateless 2026-07-28" in log.read_text()


@pytest.mark.parametrize("mode", ["json", "sse"])
def test_a_refused_discover_gets_the_handshake_with_its_session(sdk_servers, mode, tmp_path):
    url, record = sdk_servers[mode]
    since = count(record)
    log = tmp_path / "log"
    c = client.open(http_server(url, **{"X-Legacy": "1", "X-Probe": "probe-value-2"}),
                    log=str(log))
    try:
        assert (c.era, c.version) == ("handshake", "2025-11-25")
        assert [t["name"] for t in c.list_tools()][:2] == ["shout", "whoami"]
        assert c.call_tool("whoami", {}).text == "probe=probe-value-2 version=2025-11-25"
    finally:
        c.close()
    got = seen(record, since)
    assert [(g["verb"], g["rpc"], g["status"]) for g in got] == [
        ("POST", "server/discover", 400), ("POST", "initialize", 200),
        ("POST", "notifications/initialized", 202), ("POST", "tools/list", 200),
        ("POST", "tools/call", 200), ("DELETE", None, 200)]
    answer = "application/json" if mode == "json" else "text/event-stream"
    assert [g["ctype"] for g in got[3:5]] == [answer, answer]
    assert "mcp-session-id" not in got[1]["headers"]
    assert "mcp-protocol-version" not in got[1]["headers"]      # not known before initialize
    sessions = {g["headers"].get("mcp-session-id") for g in got[2:]}
    assert len(sessions) == 1 and None not in sessions           # kept, sent back, DELETEd
    assert all(g["headers"]["mcp-protocol-version"] == "2025-11-25" for g in got[2:])
    assert all(g["headers"]["x-probe"] == "probe-value-2" for g in got)
    assert all("mcp-method" not in g["headers"] for g in got[1:])
    text = log.read_text()
    assert "server/discover refused (400): falling back to the handshake" in text
    assert "connected: handshake 2025-11-25" in text and "closed the HTTP session" in text


def test_server_requests_inside_an_sse_stream_are_answered_by_a_post(sdk_servers):
    url, record = sdk_servers["sse"]
    since = count(record)
    c = client.open(http_server(url, **{"X-Legacy": "1"}))
    try:
        text = c.call_tool("ask", {}).text
    finally:
        c.close()
    assert text.splitlines() == [
        "ping: answered",
        "roots/list: MCPError: Method not found: this client does not support roots/list"]
    answers = [g for g in seen(record, since) if g["verb"] == "POST" and g["rpc"] is None]
    assert [g["status"] for g in answers] == [202, 202]        # our two answers, each a POST


def test_a_stateless_sse_answer_with_notifications_before_it(sdk_servers):
    url, record = sdk_servers["sse"]
    since = count(record)
    c = client.open(http_server(url))
    try:
        assert c.era == "stateless"
        # a progress token makes the SDK stream notifications/progress before the answer
        result = c._request("tools/call", {"name": "chatty", "arguments": {},
                                           "_meta": {"progressToken": "tok-1"}})
    finally:
        c.close()
    assert result["content"] == [{"type": "text", "text": "chatted"}]
    call = [g for g in seen(record, since) if g["rpc"] == "tools/call"]
    assert [g["ctype"].split(";")[0] for g in call] == ["text/event-stream"]


@pytest.mark.parametrize("era", ["stateless", "handshake"])
def test_cancel_and_timeout_over_http(sdk_servers, era):
    url, record = sdk_servers["sse"]
    headers = {"X-Legacy": "1"} if era == "handshake" else {}
    c = client.open(http_server(url, **headers))
    try:
        assert c.era == era
        since = count(record)
        cancel, box = Cancel(), {}

        def run():
            try:
                c.call_tool("sleepy", {"seconds": 30}, cancel=cancel)
            except BaseException as exc:
                box["error"] = exc
        arrived = str(record) + ".arrived"
        calls = open(arrived).read().count('"tools/call"')
        thread = threading.Thread(target=run)
        thread.start()
        until(lambda: open(arrived).read().count('"tools/call"') > calls,
              "the tools/call to arrive")
        set_at = time.monotonic()
        cancel.set()
        thread.join(WAIT)
        assert isinstance(box.get("error"), Cancelled), box
        assert time.monotonic() - set_at < 1.0
        until(lambda: any(g["rpc"] == "notifications/cancelled" for g in seen(record, since)),
              "notifications/cancelled")
        start = time.monotonic()
        with pytest.raises(ConnectorError) as err:
            c.call_tool("sleepy", {"seconds": 30}, timeout=0.5)
        assert time.monotonic() - start < 2.0
        assert str(err.value) == "connector sdk: did not answer tools/call within 0.5 s (timed out)"
        until(lambda: sum(g["rpc"] == "notifications/cancelled" for g in seen(record, since)) == 2,
              "the second notifications/cancelled")
        assert c.call_tool("shout", {"text": "after"}).text == "AFTER"
    finally:
        c.close()


# -- our own server over HTTP ------------------------------------------------------------------

@pytest.fixture
def overlord_http(home, target):
    admit(home, target, None)
    running = Http(home, target)
    yield running
    assert "Traceback" not in running.stop()


def test_overlord_mcp_serve_over_http_statelessly_with_its_token(overlord_http):
    token = overlord_http.token
    c = client.open(http_server(overlord_http.url, Authorization=f"Bearer {token}"))
    try:
        assert (c.era, c.version) == ("stateless", "2026-07-28")
        assert c.server_info["name"] == "overlord"
        assert "open_session" in [t["name"] for t in c.list_tools()]
        result = c.call_tool("savepoints", {"session": "20260101-000000-abcdef"})
        assert result.is_error and "no such session" in result.text
    finally:
        c.close()


def test_a_refused_token_is_a_clean_line_without_the_secret(overlord_http):
    with pytest.raises(ConnectorError) as err:
        client.open(http_server(overlord_http.url, Authorization="Bearer wrong-secret-123"))
    message = str(err.value)
    assert message.startswith("connector sdk: initialize failed: HTTP 401: unauthorized")
    assert "wrong-secret" not in message and "\n" not in message


# -- the agent, end to end, with the SDK server as a connector -----------------------------------

@pytest.mark.parametrize("mode,allowed", [("ask", False), ("auto", True), ("readonly", False)])
def test_the_agent_calls_the_sdk_server_through_the_gate_in_each_mode(sdk_servers, home, target,
                                                                      tmp_path, mode, allowed):
    from conftest import Ovl, require_backend
    require_backend("kernel")
    url, _ = sdk_servers["sse"]
    path = home / "mcp.json"
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"approval": mode, "servers": {"sdk": {"url": url, "headers": {"X-Probe": "agent"}}}}, f)
    script = tmp_path / "turns.json"
    script.write_text(json.dumps([
        {"tool_calls": [{"name": "mcp__sdk__shout", "input": {"text": "quiet"}}]},   # read-only
        {"tool_calls": [{"name": "mcp__sdk__whoami", "input": {}}]},                 # acts: the gate
        {"text": "done"}]))
    ovl = Ovl(home, "kernel")
    proc = ovl("agent", "-t", target, "--provider", "scripted", "--script", script,
               "--connector", "sdk", "go", check=0)
    sid = proc.out.split("session ")[-1].split()[0]
    events = [json.loads(line) for line in (home / "sessions" / sid / "transcript.jsonl").read_text().splitlines()]
    (started,) = [e for e in events if e["type"] == "connectors"]
    assert started["servers"]["sdk"]["era"] == "stateless" and started["servers"]["sdk"]["version"] == "2026-07-28"
    out = {e["call"]: e["result"] for e in events if e["type"] == "tool_result"}
    assert out["call_0_0"]["content"] == "QUIET" and not out["call_0_0"]["is_error"]
    if allowed:
        assert out["call_1_0"]["content"] == "probe=agent version=2026-07-28"
    else:
        assert out["call_1_0"]["is_error"] and "not sent" in out["call_1_0"]["content"]
    acts = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    acts = [a["action"] for a in acts if a.get("sid") == sid and a["action"].startswith("connector.")]
    assert acts == ["connector.call", "connector.decision", "connector.result",
                    "connector.call", "connector.decision"] + (["connector.result"] if allowed else [])
