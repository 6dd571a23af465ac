"""`overlord mcp serve --http 127.0.0.1:PORT`: the streamable HTTP transport behind the UI's
launch token. The official SDK drives a session over it in both generations; a request
without the token, from another origin or naming another host is refused with a JSON-RPC
error body; the handshake's Mcp-Session-Id and DELETE, the stateless revision's header
checks, and bad input that changes nothing."""
import json

import pytest

from conftest import Ovl, tree
from mcplib import (MODES, Http, admit, attributed, drive, http_transport, meta_envelope,
                    records, require_mcp, sdk)

require_mcp()

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


@pytest.fixture
def server(home, target):
    running = Http(home, target)
    yield running
    assert "Traceback" not in running.stop()


def stateless(method, params=None, msg_id=7, **headers):
    """A 2026-07-28 request and the headers that must repeat it."""
    body = {"jsonrpc": "2.0", "id": msg_id, "method": method,
            "params": dict(params or {}, _meta=meta_envelope("raw-http"))}
    sent = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if method == "tools/call":
        sent["Mcp-Name"] = body["params"]["name"]
    sent.update(headers)
    return body, sent


@pytest.mark.parametrize("mode, version", MODES)
def test_the_sdk_drives_a_session_over_http_with_the_token(home, target, backend, mode, version):
    admit(home, target, backend)
    before = tree(target)
    running = Http(home, target, backend)
    try:
        name = f"http-{mode}"
        sid = sdk(http_transport(running), mode, name, lambda client: drive(client, backend, version))
    finally:
        err = running.stop()
    assert "Traceback" not in err, err
    assert tree(target) == before
    attributed(home, backend, sid, name)


def leaves(error):
    """The exceptions inside (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


@pytest.mark.parametrize("token, origin, words", [
    ("0" * 48, None, "unauthorized"), (None, "http://evil.example", "are refused")])
def test_the_sdk_is_refused_without_the_token_and_from_another_origin(server, home, target,
                                                                      token, origin, words):
    from mcp.shared.exceptions import MCPError

    async def body(client):
        return await client.list_tools()
    before = tree(target), records(home)
    server.token = token or server.token
    with pytest.raises(BaseException) as refused:
        sdk(http_transport(server, origin), "legacy", "refused-client", body)
    errors = [e for e in leaves(refused.value) if isinstance(e, MCPError)]
    assert errors and words in str(errors[0]), leaves(refused.value)
    with pytest.raises(BaseException):
        sdk(http_transport(server, origin), "auto", "refused-client", body)
    assert (tree(target), records(home)) == before


def test_refusals_carry_a_json_rpc_error_body_and_change_nothing(server, home, target):
    before = tree(target), records(home)
    for kw, status in [
            ({"token": False}, 401),
            ({"headers": {"Authorization": "Bearer " + "0" * 48}}, 401),
            ({"headers": {"Authorization": "Basic abc"}}, 401),
            ({"headers": {"Origin": "http://evil.example"}}, 403),
            ({"headers": {"Origin": f"http://127.0.0.1:{server.port + 1}"}}, 403),
            ({"headers": {"Host": "evil.example"}}, 421),                     # DNS rebinding
            ({"headers": {"Host": f"localhost:{server.port}"}}, 421),
            ({"path": "/other"}, 404),
            ({"headers": {"Content-Type": "text/plain"}}, 415),
            ({"headers": {"Accept": "text/html"}}, 406),
            ({"method": "GET", "body": None}, 405),
            ({"method": "PUT"}, 405),
            ({"headers": {"Content-Length": str(64 << 20)}, "body": b"{}"}, 413),
            ({"headers": {"Content-Length": "many"}, "body": b"{}"}, 411)]:
        body = kw.pop("body", INIT)
        got, headers, answer = server.rpc(body, **kw)
        assert got == status, (kw, got, answer)
        assert answer["jsonrpc"] == "2.0" and answer["id"] is None and answer["error"]["code"], answer
        if status == 401:
            assert headers["www-authenticate"].startswith("Bearer")
        assert "mcp-session-id" not in headers
    got, _, answer = server.rpc(INIT, headers={"Origin": server.url.rsplit("/", 1)[0]})
    assert got == 200 and answer["result"]["protocolVersion"] == "2025-06-18"   # its own origin
    assert (tree(target), records(home)) == before


def test_the_handshake_holds_a_session_by_its_id_until_delete(server, home, target):
    before = tree(target), records(home)
    status, headers, answer = server.rpc(INIT)
    assert status == 200 and answer["result"]["protocolVersion"] == "2025-06-18"
    sid = headers["mcp-session-id"]
    assert len(sid) >= 32 and sid.isalnum()
    session = {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-06-18"}
    status, _, data = server.post({"jsonrpc": "2.0", "method": "notifications/initialized"},
                                  session)
    assert (status, data) == (202, b"")
    listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    status, _, answer = server.rpc(listed, session)
    assert status == 200 and len(answer["result"]["tools"]) == 12
    assert server.rpc({"jsonrpc": "2.0", "id": 3, "method": "ping"}, session)[2]["result"] == {}
    assert server.rpc(listed)[0] == 400                                    # no session id
    assert server.rpc(listed, {"Mcp-Session-Id": "f" * 32})[0] == 404      # not one of ours
    status, _, answer = server.rpc(listed, dict(session, **{"MCP-Protocol-Version": "2025-11-25"}))
    assert status == 400 and "2025-06-18" in answer["error"]["message"]
    status, _, answer = server.rpc(INIT, session)
    assert status == 400 and answer["error"]["code"] == -32600          # initialized once
    status, _, answer = server.rpc({"jsonrpc": "2.0", "id": 4, "method": "nope"}, session)
    assert status == 404 and answer["error"]["code"] == -32601
    status, _, data = server.post(None, session, method="DELETE")
    assert status == 200
    assert server.rpc(listed, session)[0] == 404                           # ended
    assert server.post(None, session, method="DELETE")[0] == 404
    assert (tree(target), records(home)) == before


def test_the_stateless_revision_checks_its_headers_against_the_body(server, home, target):
    before = tree(target), records(home)
    body, headers = stateless("server/discover")
    status, got, answer = server.rpc(body, headers)
    assert status == 200 and answer["result"]["supportedVersions"] == ["2026-07-28"]
    assert "mcp-session-id" not in got
    body, headers = stateless("tools/list")
    listing = headers
    assert len(server.rpc(body, headers)[2]["result"]["tools"]) == 12
    for change, code in [({"Mcp-Method": "tools/call"}, -32020),
                         ({"Mcp-Method": None}, -32020),
                         ({"MCP-Protocol-Version": None}, -32020)]:     # an enveloped body alone
        status, _, answer = server.rpc(body, dict(headers, **change))
        assert (status, answer["error"]["code"]) == (400, code), change
    call, headers = stateless("tools/call", {"name": "diff", "arguments": {"session": "x"}})
    status, _, answer = server.rpc(call, dict(headers, **{"Mcp-Name": "exec"}))
    assert (status, answer["error"]["code"]) == (400, -32020)
    status, _, answer = server.rpc(call, headers)
    assert status == 200 and answer["result"]["isError"] is True              # a tool error
    newer = json.loads(json.dumps(body))
    newer["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2027-01-01"
    status, _, answer = server.rpc(newer, dict(listing, **{"MCP-Protocol-Version": "2027-01-01"}))
    assert (status, answer["error"]["code"]) == (400, -32022)
    assert answer["error"]["data"] == {"supported": ["2026-07-28"], "requested": "2027-01-01"}
    for raw, code in [(b"not json", -32700), (b"[]", -32600), (b"[1, 2]", -32600), (b"3", -32600)]:
        status, _, answer = server.rpc(raw, listing)
        assert (status, answer["error"]["code"]) == (400, code), raw
    status, _, data = server.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                   "params": {"requestId": 1}}, listing)
    assert (status, data) == (202, b"")
    status, got, data = server.post(body, dict(listing, Accept="text/event-stream"))
    assert status == 200 and got["content-type"] == "text/event-stream"
    event = dict(line.split(": ", 1) for line in data.decode().splitlines() if line)
    assert event["event"] == "message" and len(json.loads(event["data"])["result"]["tools"]) == 12
    assert (tree(target), records(home)) == before


@pytest.mark.parametrize("bind", ["0.0.0.0:0", "192.168.1.1:8000", "::1:0", "localhost:0",
                                  "127.0.0.1", "127.0.0.1:99999", "nonsense"])
def test_http_binds_loopback_only(home, target, bind):
    proc = Ovl(home)("mcp", "serve", "-t", target, "--http", bind)
    assert proc.returncode == 2, (proc.out, proc.err)
    assert proc.err.startswith("overlord: --http") and proc.out == "", proc.err
