"""What the MCP server's tests share: the policy that admits the test's target, the grants a
backend needs, a raw newline-JSON peer of `overlord mcp serve`, and the official SDK's client.

test/mcp runs as root only (the ordinary-user pass has no `mcp` package). Imported by the
test modules (`from mcplib import ...`), not a second conftest.py.
"""
import asyncio
import json
import os
import select
import subprocess
import sys
import time

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
