"""`overlord mcp serve` on the wire, message by message: the JSON-RPC error codes, garbage,
batches, both protocol generations and their negotiation, ping and cancellation while a
command runs, and a clean stdout. Bad input changes nothing in the tree or the records."""
import json
import time

import pytest

from conftest import tree
from mcplib import Raw, admit, grants, meta_envelope, records

PARSE, INVALID, NO_METHOD, PARAMS = -32700, -32600, -32601, -32602
UNSUPPORTED = -32022


@pytest.fixture
def raw(home, target):
    peer = Raw(home, target)
    yield peer
    peer.kill()


def code(answer):
    assert "error" in answer, answer
    return answer["error"]["code"]


GARBAGE = [
    (b"this is not json", PARSE, None),
    (b"\xff\xfe not utf-8", PARSE, None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', PARSE, None),       # cut short
    (b"42", INVALID, None),
    (b'"ping"', INVALID, None),
    (b"null", INVALID, None),
    (b"[]", INVALID, None),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', INVALID, None),  # a batch
    (b'{"id": 7, "method": "ping"}', INVALID, 7),                         # no "jsonrpc"
    (b'{"jsonrpc": "1.0", "id": 7, "method": "ping"}', INVALID, 7),
    (b'{"jsonrpc": "2.0", "id": 7}', INVALID, 7),                         # no method
    (b'{"jsonrpc": "2.0", "id": 7, "method": 5}', INVALID, 7),
    (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', INVALID, None),
    (b'{"jsonrpc": "2.0", "id": [1], "method": "ping"}', INVALID, None),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', INVALID, None),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', INVALID, None),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "no/such/method"}', NO_METHOD, 7),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": [1]}', PARAMS, 7),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}}', PARAMS, 7),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": '
     b'{"protocolVersion": "2025-11-25", "clientInfo": "me"}}', PARAMS, 7),
    (b'{"jsonrpc": "2.0", "id": "s", "method": "tools/list"}', INVALID, "s"),   # before initialize
]


def test_garbage_gets_the_right_error_and_the_server_keeps_serving(raw, home, target):
    before = tree(target), records(home)
    for line, want, answer_id in GARBAGE:
        raw.send(line)
        answer = raw.recv()
        assert code(answer) == want, (line, answer)
        assert answer["id"] == answer_id, (line, answer)
    for line in (b"", b"   ", b'{"jsonrpc": "2.0", "method": "notifications/whatever"}',
                 b'{"jsonrpc": "2.0", "id": 99, "result": {}}'):         # nothing to answer
        raw.send(line)
    assert raw.request("ping")["result"] == {}       # still serving, and answered in order
    assert raw.initialize()["result"]["protocolVersion"] == "2025-11-25"
    assert raw.request("ping")["result"] == {}
    assert (tree(target), records(home)) == before
    code_, rest = raw.close()
    assert code_ == 0 and rest == b""


def test_a_message_over_the_line_cap_is_refused_and_the_next_one_served(raw, home, target):
    from overlord.mcp.stdio import LINE_MAX
    raw.initialize()
    before = tree(target), records(home)
    raw.send(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "' +
             b"x" * LINE_MAX + b'"}}')
    answer = raw.recv()
    assert code(answer) == INVALID and answer["id"] is None and "at most" in answer["error"]["message"]
    assert raw.request("ping")["result"] == {}
    assert (tree(target), records(home)) == before


def test_tool_call_errors_protocol_and_tool_level(raw, home, target):
    """Unknown tool or malformed params: protocol errors (-32602). Wrong arguments, a refused
    session id: results with isError, which the model reads. Nothing changes."""
    raw.initialize()
    before = tree(target), records(home)
    assert code(raw.request("tools/call", {"arguments": {}})) == PARAMS
    assert code(raw.request("tools/call", {"name": 5})) == PARAMS
    assert code(raw.request("tools/call", {"name": "commit", "arguments": {}})) == PARAMS
    assert code(raw.request("tools/call", {"name": "exec", "arguments": [1]})) == PARAMS
    assert code(raw.request("tools/list", {"cursor": "nope"})) == PARAMS
    for name, arguments, words in [
            ("exec", {"session": "x"}, "missing required argument 'command'"),
            ("exec", {"session": 1, "command": "true"}, "session must be a string"),
            ("exec", {"session": "x", "command": "true", "timeout": "9"}, "timeout must be a number"),
            ("exec", {"session": "x", "command": "true", "timeout": 0}, "timeout must be more than 0"),
            ("exec", {"session": "x", "command": "true", "shell": "zsh"}, "unknown argument 'shell'"),
            ("open_session", {"net": "lan"}, "net must be one of none, proxy, host"),
            ("open_session", {"jail": "no"}, "jail must be true or false"),
            ("rewind", {"session": "x", "to": 1.5}, "to must be an integer"),
            ("read_file", {"session": "x"}, "missing required argument 'path'"),
            ("diff", {"session": "../../etc"}, "overlord:"),
            ("savepoints", {"session": "a/b"}, "overlord:"),
            ("exec", {"session": "20990101-000000-abcdef", "command": "true"}, "overlord:"),
            ("rollback", {"session": ".."}, "overlord:")]:
        result = raw.call(name, arguments)
        assert result["isError"] is True, (name, arguments, result)
        assert words in result["content"][0]["text"], (name, arguments, result)
    assert (tree(target), records(home)) == before


def test_an_uncovered_folder_is_refused_and_nothing_is_recorded(raw, home, target):
    raw.initialize()
    before = tree(target), records(home)
    result = raw.call("open_session", {})
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert str(home / "policy.json") in text and '"targets"' in text, text
    assert (tree(target), records(home)) == before


def test_the_handshake_negotiates_and_refuses_the_other_generation(home, target):
    for asked, answered in [("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"),
                            ("2024-11-05", "2025-11-25"), ("1999-01-01", "2025-11-25"),
                            ("2026-07-28", "2025-11-25")]:
        peer = Raw(home, target)
        try:
            result = peer.initialize(asked)["result"]
            assert result["protocolVersion"] == answered, asked
            assert result["serverInfo"]["name"] == "overlord" and "tools" in result["capabilities"]
            assert code(peer.request("initialize", {"protocolVersion": asked,
                                                    "capabilities": {}})) == INVALID   # once only
            assert code(peer.request("tools/list", {"_meta": meta_envelope()})) == INVALID
            assert code(peer.request("server/discover")) == NO_METHOD
            assert len(peer.request("tools/list")["result"]["tools"]) == 12
        finally:
            peer.kill()


def test_the_stateless_revision_discovers_and_checks_every_envelope(raw, home, target):
    discover = raw.request("server/discover", {"_meta": meta_envelope()})["result"]
    assert discover["supportedVersions"] == ["2026-07-28"]
    assert discover["resultType"] == "complete" and discover["ttlMs"] == 0
    assert discover["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "overlord"
    listed = raw.request("tools/list", {"_meta": meta_envelope()})["result"]
    assert len(listed["tools"]) == 12 and listed["resultType"] == "complete"
    assert "cacheScope" in listed and "ttlMs" in listed

    wrong = raw.request("tools/list", {"_meta": meta_envelope(version="2027-01-01")})
    assert code(wrong) == UNSUPPORTED
    assert wrong["error"]["data"] == {"supported": ["2026-07-28"], "requested": "2027-01-01"}
    no_caps = meta_envelope()
    del no_caps["io.modelcontextprotocol/clientCapabilities"]
    assert code(raw.request("tools/list", {"_meta": no_caps})) == PARAMS
    assert code(raw.request("tools/list")) == PARAMS              # no envelope at all
    assert code(raw.request("server/discover", {"_meta": "x"})) == PARAMS
    assert code(raw.request("ping", {"_meta": meta_envelope()})) == NO_METHOD   # gone in 2026
    refused = raw.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
    assert code(refused) == UNSUPPORTED and refused["error"]["data"]["supported"] == ["2026-07-28"]
    result = raw.request("tools/call", {"name": "open_session", "arguments": {},
                                        "_meta": meta_envelope("stateless-client")})["result"]
    assert result["isError"] is True and result["resultType"] == "complete"


def test_ping_is_answered_and_a_cancel_kills_the_command_while_it_runs(raw, home, target, backend):
    """A long exec runs on its own thread: ping answers at once; notifications/cancelled kills
    the command tree (no answer is sent for it), the session stays pending and usable."""
    admit(home, target, backend)
    raw.initialize()
    sid = raw.call("open_session", grants(backend))["structuredContent"]["session"]
    raw.send({"jsonrpc": "2.0", "id": "long", "method": "tools/call", "params": {
        "name": "exec", "arguments": {"session": sid, "command": "touch started; sleep 300"}}})
    started = time.monotonic()
    assert raw.request("ping")["result"] == {}
    assert time.monotonic() - started < 30
    upper = home / "sessions" / sid / "upper" / "started"      # the command is running
    while not upper.exists():
        assert time.monotonic() - started < 60, raw.stderr()
        time.sleep(0.02)
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
              "params": {"requestId": "long", "reason": "the user pressed Esc"}})
    after = raw.call("exec", {"session": sid, "command": "echo after"})   # waits for the cancel
    assert after["structuredContent"]["stdout"] == "after\n"
    assert time.monotonic() - started < 60
    points = raw.call("savepoints", {"session": sid})["structuredContent"]["savepoints"]
    assert [p["caused_by"]["call"] for p in points] == ["long"]     # the cancelled call's layer
    assert json.loads((home / "sessions" / sid / "meta.json").read_text())["state"] == "pending"
    code_, rest = raw.close()
    assert code_ == 0 and rest == b""                 # never an answer for the cancelled call


def test_tool_calls_sent_together_each_keep_their_savepoint(raw, home, target, backend):
    """A client may send several calls without waiting: they run one after another in the
    session (each waits for the one before), and every one keeps its own savepoint."""
    admit(home, target, backend)
    raw.initialize()
    sid = raw.call("open_session", grants(backend))["structuredContent"]["session"]
    calls = {f"c{i}": f"sleep 0.{i}; echo {i} > f{i}.txt" for i in range(4)}
    for msg_id, command in calls.items():
        raw.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": {
            "name": "exec", "arguments": {"session": sid, "command": command}}})
    answers = {a["id"]: a["result"] for a in (raw.recv() for _ in calls)}
    assert set(answers) == set(calls) and not any(r["isError"] for r in answers.values())
    points = raw.call("savepoints", {"session": sid})["structuredContent"]["savepoints"]
    assert sorted(p["caused_by"]["call"] for p in points) == sorted(calls)
    assert sorted(answers[m]["structuredContent"]["savepoint"] for m in calls) == [0, 1, 2, 3]


def test_stdout_carries_only_protocol_even_when_a_command_writes_to_fd_1(raw, home, target, backend):
    admit(home, target, backend)
    raw.initialize()
    sid = raw.call("open_session", grants(backend))["structuredContent"]["session"]
    result = raw.call("exec", {"session": sid, "command": "echo to-stdout; echo to-fd2 >&2; "
                                                         "echo to-tty > /dev/stdout"})
    assert result["structuredContent"]["stdout"] == "to-stdout\nto-tty\n"
    code_, rest = raw.close()
    assert code_ == 0 and rest == b""
    assert "Traceback" not in raw.stderr()
