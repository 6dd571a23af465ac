"""What the connector suites share: mcp.json written for a test, fake MCP servers for the
failure cases, the audit acts of a session, and the agent test helpers (test/agent's
agentlib and fakes, on the path here). Imported as `from connlib import ...`."""
import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))

from agentlib import ENV, AgentOvl, kovl, of_type, read_jsonl, results, write_script  # noqa: E402,F401
from servers import everything_argv, filesystem_argv  # noqa: E402,F401

AUDIT_ACTS = ("connector.call", "connector.approval_requested", "connector.decision", "connector.result")


def configure(home, servers, approval="ask"):
    """Write OVERLORD_HOME/mcp.json: servers {name: argv list (stdio) or {"url": ...}}."""
    data = {"approval": approval, "servers": {}}
    for name, spec in servers.items():
        if isinstance(spec, (list, tuple)):
            spec = {"command": spec[0], "args": list(spec[1:])}
        data["servers"][name] = spec
    home.mkdir(parents=True, exist_ok=True)
    path = home / "mcp.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.chmod(path, 0o600)
    return path


def acts(home, sid=None):
    """The connector acts on the audit chain (of one session), oldest first."""
    path = home / "audit.jsonl"
    lines = read_jsonl(path) if path.exists() else []
    return [e for e in lines if e.get("action", "").startswith("connector.")
            and (sid is None or e.get("sid") == sid)]


FAKE_SERVER = textwrap.dedent('''\
    import json, sys, time
    TOOLS = json.loads(sys.argv[1])
    MODE = sys.argv[2] if len(sys.argv) > 2 else ""
    if MODE == "die-at-start":
        sys.exit(3)
    if MODE == "hang-at-start":
        time.sleep(3600)
    def send(obj):
        sys.stdout.write(json.dumps(obj) + "\\n"); sys.stdout.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        mid, method = msg.get("id"), msg.get("method")
        if mid is None:
            continue
        if method == "server/discover":
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})
        elif method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-11-25",
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            if MODE == "crash-on-call":
                sys.exit(5)
            if MODE == "garbage-on-call":
                sys.stdout.write("this is not json\\n"); sys.stdout.flush(); continue
            if MODE == "error-on-call":
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32000, "message": "the fake refuses"}})
                continue
            if MODE == "big-result":
                send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "x" * 200000}]}})
                continue
            args = msg["params"].get("arguments") or {}
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": [
                {"type": "text", "text": "ran " + msg["params"]["name"] + " " + json.dumps(args, sort_keys=True)}]}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
''')


def fake_server(tmp_path, tools, mode=""):
    """argv of a fake stdio MCP server offering `tools` (dicts), misbehaving as `mode` says."""
    script = tmp_path / "fake_mcp_server.py"
    script.write_text(FAKE_SERVER)
    return [sys.executable, str(script), json.dumps(tools)] + ([mode] if mode else [])


def tool(name, description="", props=None, readonly=None):
    t = {"name": name, "description": description,
         "inputSchema": {"type": "object", "properties": props or {}}}
    if readonly is not None:
        t["annotations"] = {"readOnlyHint": readonly}
    return t
