"""The MCP client against real servers -- @modelcontextprotocol/server-everything (stdio, the
handshake generation) and our own `overlord mcp serve` (stdio, the stateless 2026-07-28
revision) -- and against small fake servers for what a real one will not do on purpose:
crash mid-call, hang at start, send garbage, answer with an error, send requests to the
client, page its tools, negotiate a revision we do not speak, return too much."""
import json
import os
import sys
import threading
import time
import types

import pytest

from conftest import REPO
from servers import everything_argv
from overlord.agent.cancel import Cancel, Cancelled
from overlord.agent.connectors import client
from overlord.agent.connectors.client import CAP, ConnectorError

WAIT = 30.0


def server(name, argv, env=None):
    return types.SimpleNamespace(name=name, transport="stdio", command=argv[0],
                                 args=list(argv[1:]), env=env or {}, url=None, headers={})


def until(predicate, what, timeout=WAIT):
    """Wait for a condition (a file filling, a process leaving), failing at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def gone(wire):
    """Whether a stdio server's whole process group (and its supervisor's) has left and the
    supervisor was reaped (an orphan's zombie is its reaper's to collect: this machine's init
    may never do it)."""
    try:
        os.waitpid(wire.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    else:
        return False                                 # still our child, unreaped
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in (wire.pid, wire.server_pid) and fields[0] not in "ZX":
            return False
    return True


# Copies what the client writes to the real server into a file, so a test can read exactly
# what was sent (notifications/cancelled included); the server's stdout and stderr pass
# straight through.
TEE = r"""
import subprocess, sys
record, argv = sys.argv[1], sys.argv[2:]
child = subprocess.Popen(argv, stdin=subprocess.PIPE)
with open(record, "ab", buffering=0) as out:
    for line in sys.stdin.buffer:
        out.write(line)
        child.stdin.write(line)
        child.stdin.flush()
child.stdin.close()
sys.exit(child.wait())
"""


def sent(record):
    with open(record, "rb") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    """One server-everything for the module, behind the tee; (client, log path, record path)."""
    argv = everything_argv()
    base = tmp_path_factory.mktemp("everything")
    tee = base / "tee.py"
    tee.write_text(TEE)
    record, log = base / "sent.jsonl", base / "connector.log"
    record.write_bytes(b"")
    c = client.open(server("everything", [sys.executable, str(tee), str(record), *argv]),
                    log=str(log))
    yield c, log, record
    c.close()
    assert gone(c._wire)


def test_the_envelope_is_the_servers():
    from overlord.mcp import protocol
    assert client.VERSION_KEY == protocol.VERSION_KEY
    assert client.CAPABILITIES_KEY == protocol.CAPABILITIES_KEY
    assert client.CLIENT_INFO_KEY == protocol.CLIENT_INFO_KEY
    assert client.SERVER_INFO_KEY == protocol.SERVER_INFO_KEY
    assert client.NAMED == protocol.NAMED
    assert (client.STATELESS,) == protocol.STATELESS_VERSIONS
    assert client.HANDSHAKE == protocol.HANDSHAKE_VERSIONS[0]
    assert set(protocol.HANDSHAKE_VERSIONS) <= set(client.ACCEPTED)


# -- server-everything ------------------------------------------------------------------------

def test_everything_refuses_discover_and_gets_the_handshake(everything):
    c, log, record = everything
    assert (c.era, c.version) == ("handshake", "2025-11-25")
    assert c.server_info["name"] == "mcp-servers/everything"
    assert c.instructions and "Everything" in c.instructions
    until(lambda: len(sent(record)) >= 3, "the first three messages")
    first = sent(record)[:3]
    assert first[0]["method"] == "server/discover"
    assert first[0]["params"]["_meta"] == {
        client.VERSION_KEY: "2026-07-28", client.CAPABILITIES_KEY: {},
        client.CLIENT_INFO_KEY: {"name": "overlord", "version": client.__version__}}
    assert first[1]["method"] == "initialize"
    assert first[1]["params"]["protocolVersion"] == "2025-11-25"
    assert "_meta" not in first[1]["params"]
    assert first[2] == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    text = log.read_text()
    assert "server/discover refused (-32601): falling back to the handshake" in text
    assert "connected: handshake 2025-11-25" in text
    until(lambda: "Starting default (STDIO) server" in log.read_text(),   # its own stderr,
          "the server's stderr in the log")                              # drained by a thread


def test_everything_lists_its_tools_with_their_annotations(everything):
    tools = {t["name"]: t for t in everything[0].list_tools()}
    assert {"echo", "get-sum", "get-env", "get-tiny-image", "get-resource-reference",
            "get-resource-links", "get-structured-content", "trigger-long-running-operation",
            "toggle-simulated-logging"} <= set(tools)
    assert tools["echo"]["annotations"]["readOnlyHint"] is True
    assert tools["toggle-simulated-logging"]["annotations"]["readOnlyHint"] is False
    assert tools["get-sum"]["inputSchema"]["type"] == "object"


def test_everything_echo_and_sum(everything):
    c = everything[0]
    result = c.call_tool("echo", {"message": "hi there"})
    assert (result.text, result.is_error, result.truncated) == ("Echo: hi there", False, False)
    assert len(result.sha256) == 64 and result.size > len(result.text)
    assert c.call_tool("get-sum", {"a": 2, "b": 40}).text == "The sum of 2 and 40 is 42."
    again = c.call_tool("echo", {"message": "hi there"})
    assert (again.sha256, again.size) == (result.sha256, result.size)   # canonical, stable
    assert c.call_tool("echo", {"message": "other"}).sha256 != result.sha256


def test_everything_image_and_resources_are_summarized_not_dropped(everything):
    c = everything[0]
    image = c.call_tool("get-tiny-image", {})
    lines = image.text.splitlines()
    assert any(line.startswith("[image: image/png, ") and line.endswith(" KiB]") for line in lines), lines
    assert "iVBOR" not in image.text                     # no base64 for the model
    assert image.size > 4096                             # the hash covers the whole result
    ref = c.call_tool("get-resource-reference", {"resourceId": 2})
    assert "[resource: demo://resource/dynamic/text/2, text/plain, " in ref.text, ref.text
    links = c.call_tool("get-resource-links", {"count": 3}).text
    assert links.count("[resource link: ") == 3, links
    assert "demo://resource/dynamic/" in links


def test_everything_structured_content_is_shown_as_json(everything):
    result = everything[0].call_tool("get-structured-content", {"location": "Chicago"})
    assert set(json.loads(result.text)) >= {"temperature", "conditions"}


def test_a_stdio_server_gets_only_its_env_and_path_home_lang(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-must-not-leak")
    monkeypatch.setenv("OVERLORD_SOME_SECRET", "also-not-for-connectors")
    c = client.open(server("env", everything_argv(), {"CONNECTOR_PROBE": "configured-42"}),
                    log=str(tmp_path / "log"))
    try:
        text = c.call_tool("get-env", {}).text
    finally:
        c.close()
    got = json.loads(text)
    assert "sk-ant-fake" not in text and "also-not-for" not in text
    assert got["CONNECTOR_PROBE"] == "configured-42"
    inherited = {k for k in ("PATH", "HOME", "LANG") if k in os.environ}
    assert set(got) == inherited | {"CONNECTOR_PROBE"}
    assert all(got[k] == os.environ[k] for k in inherited)


def _long_call(c, record, **kw):
    """Start trigger-long-running-operation {duration: 30} on a thread; returns (thread, box,
    the request's id once it reached the server)."""
    before = len(sent(record))
    box = {}

    def run():
        start = time.monotonic()
        try:
            box["result"] = c.call_tool("trigger-long-running-operation",
                                        {"duration": 30, "steps": 30}, **kw)
        except BaseException as exc:                  # Cancelled is a BaseException
            box["error"] = exc
        box["elapsed"] = time.monotonic() - start
    thread = threading.Thread(target=run)
    thread.start()
    until(lambda: any(m.get("method") == "tools/call" for m in sent(record)[before:]),
          "the tools/call to reach the server")
    call = [m for m in sent(record)[before:] if m.get("method") == "tools/call"][0]
    return thread, box, call["id"]


def _cancelled_notice(record, request_id):
    def notices():
        return [m["params"] for m in sent(record) if m.get("method") ==
                "notifications/cancelled" and m["params"]["requestId"] == request_id]
    until(notices, f"notifications/cancelled for request {request_id}")
    return notices()


def test_everything_long_call_cancelled_from_another_thread(everything):
    c, log, record = everything
    cancel = Cancel()
    thread, box, request_id = _long_call(c, record, cancel=cancel)
    set_at = time.monotonic()
    cancel.set()
    thread.join(WAIT)
    assert isinstance(box.get("error"), Cancelled), box
    assert time.monotonic() - set_at < 1.0
    assert _cancelled_notice(record, request_id) == [{"requestId": request_id,
                                                      "reason": "cancelled"}]
    assert c.call_tool("echo", {"message": "after"}).text == "Echo: after"   # still serving


def test_everything_long_call_times_out(everything):
    c, log, record = everything
    thread, box, request_id = _long_call(c, record, timeout=0.5)
    thread.join(WAIT)
    error = box.get("error")
    assert isinstance(error, ConnectorError), box
    assert str(error) == ("connector everything: did not answer tools/call within 0.5 s "
                          "(timed out)")
    assert box["elapsed"] < 2.0
    assert _cancelled_notice(record, request_id) == [{"requestId": request_id,
                                                      "reason": "timed out"}]
    assert f"tools/call (request {request_id}) timed out" in log.read_text()


# -- our own server: the stateless revision ---------------------------------------------------

def test_overlord_mcp_serve_is_spoken_to_statelessly(tmp_path, monkeypatch):
    from overlord import ops
    home, target = tmp_path / "home", tmp_path / "target"
    home.mkdir()
    target.mkdir()
    monkeypatch.setenv("OVERLORD_HOME", str(home))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"targets": {str(target): {}}}))
    ops.policy_set(str(policy))
    log = tmp_path / "log"
    c = client.open(server("overlord", [sys.executable, "-m", "overlord", "mcp", "serve",
                                        "-t", str(target)],
                           {"OVERLORD_HOME": str(home), "PYTHONPATH": REPO}), log=str(log))
    try:
        assert (c.era, c.version) == ("stateless", "2026-07-28")
        assert c.server_info["name"] == "overlord"
        assert c.instructions.startswith("OVERLORD runs your shell commands")
        assert c.capabilities == {"tools": {}}
        names = [t["name"] for t in c.list_tools()]
        assert names[0] == "open_session" and "commit" not in names
        result = c.call_tool("savepoints", {"session": "20260101-000000-abcdef"})
        assert result.is_error and "no such session" in result.text
    finally:
        c.close()
    assert gone(c._wire)
    text = log.read_text()
    assert "connected: stateless 2026-07-28" in text and "falling back" not in text
    assert "overlord mcp: serving on stdio" in text                 # its stderr


# -- fakes: what a real server will not do on purpose ----------------------------------------

FAKE = r"""
import json, os, sys, time
mode = sys.argv[1]
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n"); sys.stdout.flush()
def result(i, value):
    send({"jsonrpc": "2.0", "id": i, "result": value})
def lines():
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)
if mode == "hang":
    for _ in lines():
        pass
    sys.exit(0)
print("fake starting", mode, file=sys.stderr, flush=True)
incoming = lines()
for msg in incoming:
    i, method = msg.get("id"), msg.get("method")
    if i is None:
        continue
    if method == "server/discover":
        send({"jsonrpc": "2.0", "id": i, "error": {"code": -32601, "message": "Method not found"}})
    elif method == "initialize":
        result(i, {"protocolVersion": "1999-01-01" if mode == "version" else "2025-06-18",
                   "capabilities": {"tools": {}}, "serverInfo": {"name": "fake-" + mode}})
    elif method == "tools/list":
        cursor = (msg.get("params") or {}).get("cursor")
        if mode == "loop":
            result(i, {"tools": [{"name": "t", "inputSchema": {}}], "nextCursor": "c" + str(i)})
        elif mode == "shape":
            result(i, {"tools": "not a list"})
        else:
            page = {None: 1, "two": 2, "three": 3}[cursor]
            listed = {"tools": [{"name": f"p{page}-{k}", "inputSchema": {"type": "object"}}
                                for k in range(2)]}
            if page < 3:
                listed["nextCursor"] = {1: "two", 2: "three"}[page]
            result(i, listed)
    elif method == "tools/call":
        if mode == "crash":
            os._exit(3)
        elif mode == "garbage":
            sys.stdout.write("this is not json\n"); sys.stdout.flush()
        elif mode == "error":
            send({"jsonrpc": "2.0", "id": i, "error": {"code": -32602, "message": "Unknown tool: nope\nsecond line"}})
        elif mode == "huge-line":
            sys.stdout.write('{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", "text": "' % i)
            sys.stdout.write("x" * (17 << 20) + '"}]}}\n'); sys.stdout.flush()
        elif mode == "big":
            text = "HEAD" + "x" * (100 << 10) + "TAIL"
            result(i, {"content": [{"type": "text", "text": text}], "isError": True})
        elif mode == "requests":
            asks = {"s1": "sampling/createMessage", "r1": "roots/list", "e1": "elicitation/create",
                    "p1": "ping"}
            send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}})
            for ask_id, ask in asks.items():
                send({"jsonrpc": "2.0", "id": ask_id, "method": ask, "params": {}})
            answers = {}
            while len(answers) < len(asks):
                got = next(incoming)
                if got.get("id") in asks:
                    answers[got["id"]] = got
            result(i, {"content": [{"type": "text", "text": json.dumps(answers)}]})
"""


@pytest.fixture(scope="module")
def fake_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("fake") / "fake_server.py"
    path.write_text(FAKE)
    return path


@pytest.fixture
def fake(fake_script, tmp_path):
    """open_fake(mode, **open kw) -> (client, log path); every client is closed and proved
    gone at the end."""
    opened = []

    def open_fake(mode, **kw):
        log = tmp_path / f"{mode}.log"
        c = client.open(server("fake", [sys.executable, str(fake_script), mode]),
                        log=str(log), **kw)
        opened.append(c)
        return c, log
    yield open_fake
    for c in opened:
        c.close()
        assert gone(c._wire)


def test_a_server_that_crashes_mid_call(fake):
    c, log = fake("crash")
    assert (c.era, c.version) == ("handshake", "2025-06-18")     # an older revision accepted
    start = time.monotonic()
    with pytest.raises(ConnectorError) as err:
        c.call_tool("anything", {}, timeout=WAIT)
    assert time.monotonic() - start < 5                        # seen at once, not timed out
    assert str(err.value) == "connector fake: the server exited with status 3 (no answer)"
    assert "the server exited with status 3" in log.read_text()
    with pytest.raises(ConnectorError, match="^connector fake: the server exited"):
        c.call_tool("anything", {})


def test_a_server_that_hangs_at_start(fake_script, tmp_path):
    start = time.monotonic()
    with pytest.raises(ConnectorError) as err:
        client.open(server("fake", [sys.executable, str(fake_script), "hang"]),
                    log=str(tmp_path / "log"), start_timeout=0.5)
    assert time.monotonic() - start < 3.0
    assert str(err.value) == "connector fake: did not answer server/discover within 0.5 s of starting"


def test_a_start_cancelled_leaves_nothing_running(fake_script, tmp_path):
    cancel = Cancel()
    threading.Timer(0.2, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(Cancelled):
        client.open(server("fake", [sys.executable, str(fake_script), "hang"]),
                    start_timeout=WAIT, cancel=cancel)
    assert time.monotonic() - start < 3.0


def test_a_command_that_does_not_exist(tmp_path):
    with pytest.raises(ConnectorError, match="^connector nope: cannot start /no/such/server: "):
        client.open(server("nope", ["/no/such/server", "--token=SECRET"]))


def test_a_garbage_line_ends_the_call(fake):
    c, log = fake("garbage")
    with pytest.raises(ConnectorError) as err:
        c.call_tool("anything", {})
    assert str(err.value) == ("connector fake: sent garbage on stdout (not a JSON-RPC message): "
                              "this is not json")
    assert "garbage" in log.read_text()


def test_a_line_over_the_cap_is_garbage(fake):
    c, _ = fake("huge-line")
    with pytest.raises(ConnectorError, match="^connector fake: sent a line over 16 MiB$"):
        c.call_tool("anything", {})
    assert c.list_tools()                                       # the connection still works


def test_a_json_rpc_error_answer(fake):
    c, _ = fake("error")
    with pytest.raises(ConnectorError) as err:
        c.call_tool("nope", {})
    assert str(err.value) == "connector fake: tools/call failed: Unknown tool: nope second line (-32602)"
    assert err.value.code == -32602


def test_server_requests_are_refused_and_ping_answered(fake):
    c, log = fake("requests")
    answers = json.loads(c.call_tool("ask-me", {}).text)
    assert answers["p1"] == {"jsonrpc": "2.0", "id": "p1", "result": {}}
    for ask_id, method in (("s1", "sampling/createMessage"), ("r1", "roots/list"),
                           ("e1", "elicitation/create")):
        error = answers[ask_id]["error"]
        assert error["code"] == -32601 and method in error["message"], answers[ask_id]
        assert "result" not in answers[ask_id]
    assert "refused the server's request sampling/createMessage" in log.read_text()


def test_tools_are_listed_over_three_pages(fake):
    c, _ = fake("paging")
    assert [t["name"] for t in c.list_tools()] == ["p1-0", "p1-1", "p2-0", "p2-1", "p3-0", "p3-1"]


def test_a_server_that_pages_forever_is_cut_off(fake):
    c, _ = fake("loop")
    with pytest.raises(ConnectorError, match=r"^connector fake: lists more than 100 pages of tools$"):
        c.list_tools()


def test_a_tool_list_of_the_wrong_shape(fake):
    c, _ = fake("shape")
    with pytest.raises(ConnectorError, match="^connector fake: answered tools/list with a malformed tool list$"):
        c.list_tools()


def test_an_unsupported_negotiated_version_is_a_clean_error(fake_script, tmp_path):
    with pytest.raises(ConnectorError) as err:
        client.open(server("fake", [sys.executable, str(fake_script), "version"]))
    assert str(err.value).startswith("connector fake: negotiated protocol version '1999-01-01', "
                                     "which this client does not speak")


def test_an_oversized_result_is_capped_head_and_tail(fake):
    c, _ = fake("big")
    result = c.call_tool("big", {})
    assert result.truncated and result.is_error
    assert len(result.text.encode()) <= CAP
    assert result.text.startswith("HEAD") and result.text.endswith("TAIL")
    assert "bytes of this result left out" in result.text
    assert result.size > 100 << 10                     # the record sees the whole result


def test_flatten_summarizes_every_part():
    text = client.flatten([
        {"type": "text", "text": "one"},
        {"type": "audio", "mimeType": "audio/wav", "data": "AAAA"},
        {"type": "resource", "resource": {"uri": "file:///x", "mimeType": "application/octet-stream", "blob": "AAAA"}},
        {"type": "resource_link", "uri": "file:///y\n[fake]", "name": "y"},
        {"type": "hologram"},
        "not a part",
    ], structured={"ignored": "there is text"})
    assert text.splitlines() == ["one", "[audio: audio/wav, 3 B]",
                                 "[resource: file:///x, application/octet-stream, 3 B]",
                                 "[resource link: y file:///y [fake] (?)]",
                                 "[hologram content part]", "[malformed content part]"]
    assert client.flatten([], {"a": 1}) == '{"a":1}'


def test_mcp_name_header_values_round_trip_through_the_servers_decoder():
    from overlord.agent.connectors.http import header_value
    from overlord.mcp.protocol import _header_value
    assert header_value("get-sum") == "get-sum"
    for name in ("naïve", " padded", "line\nbreak", "=?base64?eA==?="):
        sent = header_value(name)
        assert sent.startswith("=?base64?") and sent.isascii() and "\n" not in sent
        assert _header_value(sent) == name
