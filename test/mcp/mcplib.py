"""What the MCP server's tests share: the policy that admits the test's target, the grants a
backend needs, a raw newline-JSON peer of `overlord mcp serve`, and the official SDK's client.

test/mcp runs as root only (the ordinary-user pass has no `mcp` package). Imported by the
test modules (`from mcplib import ...`), not a second conftest.py.
"""
import asyncio
import http.client
import json
import os
import re
import select
import subprocess
import sys
import time

import pytest

from conftest import REPO, Ovl
from overlord import ops

WAIT = 60.0                 # seconds a test waits for an answer before it fails


def admit(home, target, backend, **rule):
    """A policy whose `targets` entry covers target (the fuse backend cannot jail: its rule
    allows the host's network, and its calls ask for jail false / net host)."""
    if backend == "fuse":
        rule.setdefault("net", "host")
    write_policy(home, {"targets": {str(target): rule}})


def write_policy(home, data):
    """Install data as the live policy, as `overlord policy set` does (on the audit chain now,
    so no later act of the test records the change)."""
    path = home.parent / "policy-to-install.json"
    path.write_text(json.dumps(data))
    ops.policy_set(str(path))


def grants(backend):
    """The open_session arguments a backend needs: the fuse backend refuses --jail and --net none."""
    return {"jail": False, "net": "host"} if backend == "fuse" else {}


def records(home):
    """A snapshot of the records bad input must not change: the sessions and the audit chain."""
    sessions = home / "sessions"
    audit = home / "audit.jsonl"
    return (sorted(os.listdir(sessions)) if sessions.exists() else [],
            audit.read_text() if audit.exists() else "")


def serve_argv(target, *more):
    return [sys.executable, "-m", "overlord", "mcp", "serve", "-t", str(target), *more]


class Raw:
    """`overlord mcp serve` driven line by line: send(), recv() with a deadline (never a
    sleep), and every stdout line checked to be one JSON-RPC message."""

    def __init__(self, home, target, backend=None, env=None):
        self.errlog = open(home.parent / f"mcp-stderr-{time.monotonic_ns()}.log", "w+b")
        self.proc = subprocess.Popen(serve_argv(target), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errlog, cwd=REPO,
                                     env=Ovl(home, backend).env(env))
        self.buffer = b""
        self.next_id = 100

    def send(self, message):
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout=WAIT):
        """The next message the server writes (a dict), or AssertionError at the deadline."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"no message from the server in {timeout} s; stderr: {self.stderr()}"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                assert chunk, f"the server closed stdout; stderr: {self.stderr()}"
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0" and ("result" in message or "error" in message), line
        return message

    def request(self, method, params=None, msg_id=None):
        if msg_id is None:
            self.next_id += 1
            msg_id = self.next_id
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        answer = self.recv()
        assert answer["id"] == msg_id, answer
        return answer

    def initialize(self, version="2025-11-25", name="raw-client"):
        answer = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                             "clientInfo": {"name": name, "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def call(self, name, arguments, msg_id=None):
        """A tools/call's result (the answer must be a result, not an error)."""
        answer = self.request("tools/call", {"name": name, "arguments": arguments}, msg_id)
        assert "result" in answer, answer
        return answer["result"]

    def stderr(self):
        self.errlog.seek(0)
        return self.errlog.read().decode("utf-8", "replace")

    def close(self):
        """End the input; the server must exit 0 with nothing more on stdout."""
        self.proc.stdin.close()
        rest = self.proc.stdout.read()
        return self.proc.wait(timeout=WAIT), self.buffer + rest

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.errlog.close()


class Http:
    """`overlord mcp serve --http 127.0.0.1:0`: started, its URL and token read from what it
    prints on stderr (awaited, never slept for); post() speaks raw HTTP to it."""

    def __init__(self, home, target, backend=None):
        self.errpath = home.parent / f"mcp-http-{time.monotonic_ns()}.log"
        self.errlog = open(self.errpath, "wb")
        self.proc = subprocess.Popen(serve_argv(target, "--http", "127.0.0.1:0"),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.errlog, cwd=REPO, env=Ovl(home, backend).env())
        deadline = time.monotonic() + WAIT
        while True:
            text = self.errpath.read_text()
            m = re.search(r"serving (http://127\.0\.0\.1:(\d+)/mcp)\n.*Bearer (\w+)`", text)
            if m:
                break
            assert self.proc.poll() is None, text
            assert time.monotonic() < deadline, text
            time.sleep(0.02)
        self.url, self.port, self.token = m.group(1), int(m.group(2)), m.group(3)
        self.host = f"127.0.0.1:{self.port}"

    def post(self, body, headers=None, method="POST", path="/mcp", token=True):
        """(status, response headers, body bytes) of one request; body: a dict, or bytes."""
        sent = {"Host": self.host, "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream"}
        if token:
            sent["Authorization"] = f"Bearer {self.token}"
        sent.update(headers or {})
        sent = {k: v for k, v in sent.items() if v is not None}
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for key, value in sent.items():
                conn.putheader(key, value)
            if data is not None and "Content-Length" not in sent:
                conn.putheader("Content-Length", str(len(data)))
            conn.endheaders(data)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def rpc(self, body, headers=None, **kw):
        """(status, response headers, the JSON body) of a POST that answers with JSON."""
        status, got, data = self.post(body, headers, **kw)
        return status, got, json.loads(data) if data else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=WAIT)
        self.errlog.close()
        return self.errpath.read_text()


def http_transport(server, origin=None):
    """The SDK's streamable HTTP client, sending the launch token (and an Origin, if given)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    headers = {"Authorization": f"Bearer {server.token}"}
    if origin:
        headers["Origin"] = origin
    return streamable_http_client(server.url, http_client=httpx2.AsyncClient(
        headers=headers, timeout=WAIT))


TOOLS = ["open_session", "exec", "read_file", "write_file", "edit_file", "list_dir", "search",
         "diff", "savepoints", "rewind", "request_review", "rollback"]
MODES = [("auto", "2026-07-28"), ("legacy", "2025-11-25")]


async def drive(client, backend, version):
    """open_session -> exec -> write_file -> edit_file -> read_file -> diff -> savepoints ->
    rewind -> request_review, each step's answer checked; returns the session id."""
    assert client.protocol_version == version
    assert client.server_info.name == "overlord"
    listed = await client.list_tools()
    assert [t.name for t in listed.tools] == TOOLS          # and deliberately no commit tool
    assert all("session" in t.input_schema["required"] for t in listed.tools[1:])

    async def call(name, **arguments):
        result = await client.call_tool(name, arguments)
        assert not result.is_error, (name, result.content)
        return result.structured_content, result.content[0].text

    opened, text = await call("open_session", **grants(backend))
    sid = opened["session"]
    assert sid in text and "request_review" in text
    ran, text = await call("exec", session=sid,
                           command="echo made > made.txt; echo out; echo err >&2; exit 3")
    assert (ran["exit_code"], ran["stdout"], ran["stderr"], ran["savepoint"]) == (3, "out\n", "err\n", 0)
    assert "exit code: 3" in text
    wrote, _ = await call("write_file", session=sid, path="notes/n.txt", content="one\ntwo\n")
    assert wrote["savepoint"] == 1
    edited, _ = await call("edit_file", session=sid, path="notes/n.txt", old="two", new="three")
    assert edited["savepoint"] == 2
    _, text = await call("read_file", session=sid, path="notes/n.txt")
    assert text == "one\nthree\n"
    _, text = await call("search", session=sid, pattern="thr+ee")
    assert "notes/n.txt:2:three" in text
    changed, text = await call("diff", session=sid)
    assert {c["path"] for c in changed["changes"]} >= {"made.txt", "notes/n.txt"}
    assert "added  made.txt" in text.splitlines()
    points, _ = await call("savepoints", session=sid)
    assert [(p["layer"], p["caused_by"]["tool"]) for p in points["savepoints"]] == \
        [(0, "exec"), (1, "write_file"), (2, "edit_file")]
    rewound, _ = await call("rewind", session=sid, to=1)
    assert rewound["dropped"] == 1
    _, text = await call("read_file", session=sid, path="notes/n.txt")
    assert text == "one\ntwo\n"                      # as write_file left it
    asked, text = await call("request_review", session=sid)
    assert asked["needs_review"]["face"] == "mcp"
    return sid

def attributed(home, backend, sid, name):
    """`overlord log` attributes the drive's changes to the client's tool calls; the session
    is pending, marked for review (also on the audit chain), brokered as the client."""
    log = json.loads(Ovl(home, backend)("log", sid, "--json", check=0).out)
    causes = {c["path"]: c["caused_by"] for c in log["changes"]}
    made, notes = causes["made.txt"], causes["notes/n.txt"]
    assert {k: made[k] for k in ("kind", "tool", "client", "summary")} == {
        "kind": "mcp", "tool": "exec", "client": name,
        "summary": "exec(echo made > made.txt; echo out; echo err >&2; exit 3)"}
    assert {k: notes[k] for k in ("kind", "tool", "client", "summary")} == {
        "kind": "mcp", "tool": "write_file", "client": name, "summary": "write_file(notes/n.txt)"}
    assert made["call"] and notes["call"] and made["call"] != notes["call"]
    meta = json.loads((home / "sessions" / sid / "meta.json").read_text())
    assert meta["state"] == "pending"
    assert meta["broker"] == {"face": "mcp", "client": name}
    assert {k: meta["needs_review"][k] for k in ("face", "client")} == {"face": "mcp", "client": name}
    if backend == "kernel":                          # unasked: jailed and offline
        assert (meta["grants"]["jail"], meta["grants"]["net"]) == (True, "none")
    acts = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    assert any(a["action"] == "session.needs_review" and a.get("sid") == sid for a in acts)


def meta_envelope(name="raw-client", version="2026-07-28"):
    return {"io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": name, "version": "1"}}


def sdk(transport, mode, name, body):
    """Run `await body(client)` with the official SDK's Client over transport in mode ('auto'
    or 'legacy'), client_info naming it name; returns body's result."""
    from mcp import Client
    from mcp_types import Implementation

    async def main():
        async with Client(transport, mode=mode, read_timeout_seconds=WAIT,
                          client_info=Implementation(name=name, version="1.0")) as client:
            return await body(client)
    return asyncio.run(main())


def stdio_transport(home, target, backend, errlog):
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client
    argv = serve_argv(target)
    params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=REPO,
                                   env=Ovl(home, backend).env())
    return stdio_client(params, errlog=errlog)


def require_mcp():
    """Skip where the official MCP SDK is not installed; on CI (OVERLORD_REQUIRE_BACKENDS,
    .ci/run installs mcp==2.3.0) that is a failure instead, as for a missing backend."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        if os.environ.get("OVERLORD_REQUIRE_BACKENDS"):
            pytest.fail("the mcp SDK is not installed on a host that must have it", pytrace=False)
        pytest.skip("the mcp SDK is not installed (pip install mcp==2.3.0)", allow_module_level=True)
