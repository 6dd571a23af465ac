"""Connector secrets from the vault: a stdio server's env value and an HTTP server's header
value that are `secret://NAME` resolved as the server starts (the real server-everything shows
the env it got; a small HTTP MCP server checks the Authorization header it is sent), listings
still masked and never running the resolver, a failing reference one clean line."""
import json
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vaultlib import VALUES, assert_nowhere, audit_lines, resolver  # noqa: F401 (paths first)
from conftest import Ovl  # noqa: E402
from servers import everything_argv  # noqa: E402
from overlord.agent.connectors import client  # noqa: E402
from overlord.agent.connectors.client import ConnectorError  # noqa: E402
from overlord.trust import vault  # noqa: E402


@pytest.fixture(autouse=True)
def clean(home):
    vault.forget()
    yield
    vault.forget()
    assert_nowhere(home)


@pytest.fixture
def ready(resolver):
    vault.set_command(resolver.command)
    return resolver


def stdio(name, argv, env):
    return types.SimpleNamespace(name=name, transport="stdio", command=argv[0],
                                 args=list(argv[1:]), env=env, url=None, headers={})


def test_a_stdio_servers_env_value_from_a_reference(ready, tmp_path):
    argv = everything_argv()
    c = client.open(stdio("envsrv", argv, {"CONNECTOR_PROBE": "secret://conn/probe",
                                           "PLAIN": "secret-ish but plain",
                                           "LONGER": "Bearer secret://conn/probe"}),
                    log=str(tmp_path / "log"))
    try:
        got = json.loads(c.call_tool("get-env", {}).text)
    finally:
        c.close()
    assert got["CONNECTOR_PROBE"] == VALUES["conn/probe"]
    assert got["PLAIN"] == "secret-ish but plain"
    assert got["LONGER"] == "Bearer secret://conn/probe"           # whole values only
    assert ready.calls() == [["conn/probe"]]


def test_a_failing_env_reference_refuses_to_start_the_server(ready, home, tmp_path):
    with pytest.raises(ConnectorError) as e:
        client.open(stdio("envsrv", ["/bin/true"], {"TOKEN": "secret://conn/missing"}),
                    log=str(tmp_path / "log"))
    assert str(e.value) == ("connector envsrv: env TOKEN: secret://conn/missing: the resolver "
                            "exited 3")                          # stderr left out
    assert not (tmp_path / "log").exists() or "started" not in (tmp_path / "log").read_text()
    line = audit_lines(home, "secret.resolve")[-1]
    assert (line["name"], line["what"], line["ok"]) == \
        ("conn/missing", "connector envsrv env TOKEN", False)


class McpHttp:
    """A small streamable-HTTP MCP server (the 2026-07-28 stateless revision) that answers only
    a request carrying `Authorization: <want>` and records every Authorization it was sent."""

    def __init__(self, want):
        self.want, self.seen = want, []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def reply(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                outer.seen.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != outer.want:
                    return self.reply(401, {"error": "unauthorized"})
                if "id" not in body:
                    self.send_response(202)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                result = {"server/discover": {
                    "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
                    "serverInfo": {"name": "vault-http", "version": "1"}},
                    "tools/list": {"tools": [{"name": "whoami", "inputSchema": {"type": "object"},
                                              "annotations": {"readOnlyHint": True}}]},
                    "tools/call": {"content": [{"type": "text", "text": "authorized"}]},
                }.get(body.get("method"))
                if result is None:
                    return self.reply(200, {"jsonrpc": "2.0", "id": body["id"],
                                            "error": {"code": -32601, "message": "no"}})
                return self.reply(200, {"jsonrpc": "2.0", "id": body["id"], "result": result})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mcp"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mcp_http():
    srv = McpHttp(VALUES["conn/bearer"])
    yield srv
    srv.close()


def http_server(url, headers):
    return types.SimpleNamespace(name="web", transport="http", url=url, headers=headers,
                                 command=None, args=[], env={})


def test_an_http_servers_header_value_from_a_reference(ready, mcp_http):
    c = client.open(http_server(mcp_http.url, {"Authorization": "secret://conn/bearer"}))
    try:
        assert c.era == "stateless" and c.server_info["name"] == "vault-http"
        assert c.call_tool("whoami", {}).text == "authorized"
    finally:
        c.close()
    assert mcp_http.seen and set(mcp_http.seen) == {VALUES["conn/bearer"]}
    assert ready.calls() == [["conn/bearer"]]                    # once, at connect


def test_a_reference_inside_a_header_value_is_sent_as_it_is(ready, mcp_http):
    with pytest.raises(ConnectorError):
        client.open(http_server(mcp_http.url, {"Authorization": "Bearer secret://conn/bearer"}))
    assert mcp_http.seen and set(mcp_http.seen) == {"Bearer secret://conn/bearer"}
    assert ready.calls() == []


def test_a_failing_header_reference_connects_to_nothing(ready, mcp_http):
    with pytest.raises(ConnectorError, match=r"^connector web: header Authorization: "
                                             r"secret://conn/nope: the resolver exited 3$"):
        client.open(http_server(mcp_http.url, {"Authorization": "secret://conn/nope"}))
    assert mcp_http.seen == []


def test_the_cli_lists_masked_without_resolving_and_mcp_test_resolves(home, resolver):
    cli = Ovl(home)
    cli("secrets", "set-command", resolver.command, check=0)
    argv = everything_argv()
    cli("mcp", "add", "envsrv", "--command", argv[0], *[f"--arg={a}" for a in argv[1:]],
        "--env", "CONNECTOR_PROBE=secret://conn/probe", check=0)
    cli("mcp", "add", "broken", "--command", argv[0], *[f"--arg={a}" for a in argv[1:]],
        "--env", "CONNECTOR_PROBE=secret://conn/absent", check=0)
    listed = json.loads(cli("mcp", "list", "--json", check=0).out)
    envs = {s["name"]: s["env"] for s in listed["servers"]}
    assert envs["envsrv"]["CONNECTOR_PROBE"] != "secret://conn/probe"       # masked, as ever
    assert resolver.calls() == []
    proc = cli("mcp", "test", "envsrv", check=0)
    assert "get-env" in proc.out and resolver.calls() == [["conn/probe"]]
    proc = cli("mcp", "test", "broken", "--timeout", "5")
    assert proc.returncode == 1 and proc.err.count("\n") == 1
    assert "secret://conn/absent: the resolver exited 3" in proc.err and "Traceback" not in proc.err
    assert VALUES["conn/probe"] not in proc.out + proc.err
