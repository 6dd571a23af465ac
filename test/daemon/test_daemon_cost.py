"""The daemon's agent result carries `cost` and `budget` as `overlord agent --json` does."""
import json

import pytest

from conftest import Ovl, require_backend


def _script(tmp_path, turns):
    path = tmp_path / f"agent-{len(list(tmp_path.glob('agent-*.json')))}.json"
    path.write_text(json.dumps({"model": "scripted-agent", "turns": turns}))
    return str(path)


def _write(name, tokens):
    return {"text": "w", "tool_calls": [{"name": "write_file", "input": {"path": name,
                                                                      "content": "x\n"}}],
            "usage": {"input_tokens": tokens, "output_tokens": 0}}


@pytest.fixture
def kdaemon(request, home):
    require_backend("kernel")           # a brokered agent is jailed: the kernel backend
    return request.getfixturevalue("daemon")


def test_agent_reply_has_cost_and_no_budget(kdaemon, target, tmp_path):
    kdaemon.allow(target)
    script = _script(tmp_path, [_write("a.txt", 100), {"text": "done",
                                                       "usage": {"input_tokens": 20}}])
    r = kdaemon.ok({"op": "agent", "task": "t", "target": str(target), "provider": "scripted",
                    "script": script})
    assert r["reason"] == "end_turn", r
    assert r["cost"]["calls"] == 2 and r["cost"]["tokens"] == 120, r["cost"]
    assert r["cost"]["unpriced"] == ["scripted-agent"]
    assert r["budget"] is None


def test_agent_reply_has_the_budget_stop(kdaemon, home, target, tmp_path):
    Ovl(home, "kernel")("cost", "budget", "--session-tokens", "150", check=0)
    kdaemon.allow(target)
    script = _script(tmp_path, [_write("a.txt", 100), _write("b.txt", 100),
                                {"text": "done"}])
    r = kdaemon.ok({"op": "agent", "task": "t", "target": str(target), "provider": "scripted",
                    "script": script})
    assert r["reason"] == "budget", r
    assert r["budget"]["key"] == "session_tokens" and r["budget"]["limit"] == 150
    assert r["budget"]["spent"] == 200 and "session_tokens" in r["budget"]["message"]
    assert r["cost"]["tokens"] == 200 and r["cost"]["calls"] == 2
