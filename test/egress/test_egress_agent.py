"""The agent's faces of recorded egress: the conditions block, the grants as ops.agent, the
daemon's agent op and the MCP open_session schema take them, denials under net=proxy, the
dossier's EGRESS and HELD REQUESTS sections, doctor's line."""
import base64
import json
import os
import types

import pytest

from overlord.agent import denials, dossier, prompt
from overlord.daemon import handlers
from overlord.errors import UsageError
from overlord.mcp import tools as mcp_tools
from overlord.sandbox import netns


def _situation(**kw):
    base = dict(provider="scripted", model="m", base_url=None, target="/srv/app", jailed=True,
                backend="kernel", net="proxy", call_timeout=600, limits={}, operator="me")
    return prompt.Situation(**dict(base, **kw))


def test_conditions_block_states_the_proxy_allowlist_and_hold():
    text = prompt.conditions(_situation(net_allow=("pypi.org", "*.github.com"), hold_writes=True))
    assert f"http://127.0.0.1:{netns.PROXY_PORT}" in text and "HTTP_PROXY is set" in text
    assert "Every connection is logged" in text
    assert "Allowed hosts: `pypi.org`, `*.github.com`" in text
    assert "over plain HTTP" in text and "POST, PUT, PATCH, DELETE" in text
    assert "held for the person's review and answered 202" in text
    assert "HTTPS tunnels cannot be held" in text
    open_ = prompt.conditions(_situation())
    assert "any public host, recorded" in open_ and "Writes are held" not in open_
    assert "Network: none" in prompt.conditions(_situation(net="none"))
    assert "unrecorded" in prompt.conditions(_situation(net="host"))


@pytest.mark.parametrize("kw, words", [
    ({"net_allow": ["pypi.org"]}, "--net-allow needs --net proxy"),
    ({"net": "host", "hold_writes": True}, "--hold-writes needs --net proxy"),
    ({"net": "proxy", "net_allow": [""]}, "empty allowlist entry"),
    ({"net": "proxy", "net_allow": ["http://x/"]}, "not a host name"),
])
def test_agent_refuses_proxy_keys_without_proxy_before_anything_opens(home, target, kw, words):
    from overlord import ops
    script = target.parent / "script.json"
    script.write_text(json.dumps({"model": "s", "turns": []}))
    before = sorted(os.listdir(home / "sessions")) if (home / "sessions").exists() else []
    with pytest.raises(UsageError, match=words):
        ops.agent("task", str(target), provider="scripted", script=str(script), **kw)
    after = sorted(os.listdir(home / "sessions")) if (home / "sessions").exists() else []
    assert after == before


def test_daemon_agent_op_takes_the_new_fields():
    found, args = handlers.parse({"op": "agent", "task": "t", "net": "proxy",
                                  "net_allow": ["pypi.org"], "hold_writes": True})
    assert args["net_allow"] == ["pypi.org"] and args["hold_writes"] is True
    for bad in ({"net_allow": "pypi.org"}, {"hold_writes": "yes"}, {"net_allow": [1]}):
        with pytest.raises(UsageError):
            handlers.parse(dict({"op": "agent", "task": "t"}, **bad))


def test_mcp_open_session_schema():
    schema = mcp_tools.OWN["open_session"]["inputSchema"]
    assert schema["properties"]["net"]["enum"] == ["none", "proxy", "host"]
    assert mcp_tools.check(schema, {"net": "proxy", "net_allow": ["a.org"], "hold_writes": True}) is None
    assert "list of strings" in mcp_tools.check(schema, {"net_allow": "a.org"})
    assert "true or false" in mcp_tools.check(schema, {"hold_writes": 1})
    assert "one of" in mcp_tools.check(schema, {"net": "lan"})


def _cap(stderr, code=7):
    return types.SimpleNamespace(exit_code=code, timed_out=False, stderr=stderr, layer=None)


def test_denials_under_proxy():
    meta = {"grants": {"net": "proxy", "jail": True}, "attestation": {"net_namespace": True},
            "target": "/srv/app"}
    d = denials.classify(meta, [_cap(b"curl: (7) Failed to connect to 1.2.3.4 port 80: Network is unreachable")])
    assert d.cause == "network" and "direct connections are blocked" in d.line and "HTTP_PROXY" in d.line
    d = denials.classify(meta, [_cap(b"curl: (6) Could not resolve host: example.org")])
    assert "use the proxy" in d.line
    # the proxy on loopback refusing a connection is not the sandbox's
    assert denials.classify(meta, [_cap(b"curl: (7) Failed to connect to 127.0.0.1 port 3128: Couldn't connect to server")]) is None
    # a 403 is said from the egress log's line, not from words a server chose
    assert denials.classify(meta, [_cap(b"403 Forbidden", 22)]) is None
    line = {"host": "evil.example\x1b[2J", "port": 80, "allowed": False, "status": 403,
            "reason": "evil.example is not in this session's allowlist"}
    d = denials.classify(meta, [_cap(b"", 0)], egress=[line])
    assert d.evidence == "egress" and d.line.startswith("blocked by the proxy:") and "\x1b" not in d.line
    assert denials.classify(dict(meta, grants={"net": "host"}), [_cap(b"", 0)], egress=[line]) is None


def _proxy_session(tmp_path):
    sdir = tmp_path / "s"
    (sdir / "held").mkdir(parents=True)
    lines = [{"ts": 1.0, "host": "pypi.org", "port": 443, "method": "CONNECT", "path": None,
              "allowed": True, "status": 200, "bytes_up": 10, "bytes_down": 900, "duration_ms": 5.0,
              "layer": 1, "cause": "shell(pip download x)", "reason": None, "held": None},
             {"ts": 2.0, "host": "bad\x1b]0;t\x07.org", "port": 80, "method": "GET", "path": "/\x1b[31m",
              "allowed": False, "status": 403, "bytes_up": 0, "bytes_down": 0, "duration_ms": 1.0,
              "layer": 1, "cause": None, "reason": "not in this session's allowlist", "held": None},
             {"ts": 3.0, "host": "api.example", "port": 80, "method": "POST", "path": "/hook",
              "allowed": True, "status": 202, "bytes_up": 5, "bytes_down": 0, "duration_ms": 1.0,
              "layer": 2, "cause": None, "reason": None, "held": "h0001"}]
    (sdir / "egress.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"torn')
    held = {"id": "h0001", "ts": 3.0, "method": "POST", "url": "http://api.example/hook",
            "host": "api.example", "port": 80, "path": "/hook",
            "headers": [["Authorization", "Bearer s3cr3t-value"], ["X-Note", "hi\x1b[2J"]],
            "body_b64": base64.b64encode(b"hello").decode(), "bytes": 5, "layer": 2, "cause": None,
            "state": "held", "status": None, "error": None, "released_at": None}
    (sdir / "held" / "h0001.json").write_text(json.dumps(held))
    return sdir


def test_dossier_sections_from_a_session_directory(tmp_path):
    sdir = _proxy_session(tmp_path)
    fence = dossier._Fence("n0nce")
    connections, held = dossier._egress_records(types.SimpleNamespace(dir=str(sdir)))
    meta = {"grants": {"net": "proxy", "net_allow": ["pypi.org", "api.example"], "hold_writes": True}}
    text = dossier._egress(meta, connections, fence) + dossier._held(held, fence)
    assert "3 connections, 1 refused, 1 held; 15 bytes up, 900 bytes down" in text
    assert "pypi.org  1 connection, 910 bytes" in text and "REFUSED" in text
    assert "h0001 [held] POST http://api.example/hook  body 5 bytes" in text
    assert "s3cr3t" not in text and "Authorization: ***" in text
    assert "\x1b" not in text and "\x07" not in text
    assert "1 of 1 still held" in text
    assert "none: the proxy held no request" in dossier._held([], fence)


def test_doctor_line():
    import importlib
    doctor = importlib.import_module("overlord.ops.doctor")
    ok, words = doctor.proxy_status(True)
    assert ok and "CONNECT tunnels are recorded by host, port and bytes; they cannot be held" in words
    ok, words = doctor.proxy_status(False)
    assert not ok and "kernel backend" in words and "cannot be held" in words
