"""The daemon's agent op with connectors: a harness gets one only where policy names it, an
action in ask mode is denied (nobody to ask a brokered run), and a wrong type is a clean 400."""
import json
import os
import sys

from conftest import REPO, require_backend

sys.path.insert(0, os.path.join(REPO, "test", "connectors"))
from servers import everything_argv  # noqa: E402


def test_a_harness_gets_connectors_only_where_policy_names_them(daemon, home, target, tmp_path):
    require_backend("kernel")
    argv = everything_argv()
    path = os.path.join(home, "mcp.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"approval": "ask", "servers": {"everything": {"command": argv[0], "args": argv[1:]}}}, f)
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"tool_calls": [{"name": "mcp__everything__toggle-simulated-logging",
                                                   "input": {}}]}, {"text": "done"}]))
    ask = {"id": 1, "op": "agent", "task": "toggle", "target": str(target), "provider": "scripted",
           "script": str(script), "connectors": ["everything"], "backend": "kernel"}
    daemon.allow(target)
    reply = daemon.request(ask)
    assert reply["ok"] is False and reply["code"] == 403 and "connectors" in reply["error"], reply
    bad = daemon.request(dict(ask, connectors="everything"))
    assert bad["ok"] is False and bad["code"] == 400 and "connectors" in bad["error"], bad
    daemon.allow(target, connectors=["everything"])
    done = daemon.request(ask)
    assert done["ok"] is True and done["reason"] == "end_turn", done
    events = [json.loads(line) for line in
              open(os.path.join(home, "sessions", done["sid"], "transcript.jsonl"))]
    (decision,) = [e for e in events if e["type"] == "approval"]
    assert decision["allow"] is False and decision["by"] == "nobody"
