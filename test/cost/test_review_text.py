"""`overlord review` (text): the verdict's cost line, and the budget line when a budget
stopped the review, as `overlord agent` prints them."""
import os
import sys

import pytest

from conftest import REPO, require_backend

sys.path.insert(0, os.path.join(REPO, "test", "agent"))
from agentlib import AgentOvl, call, write_script  # noqa: E402


@pytest.fixture
def kovl(home):
    require_backend("kernel")
    return AgentOvl(home, "kernel")


def _agent(kovl, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [
        {"text": "writing", "tool_calls": [call("write_file", path="a.txt", content="a\n")],
         "usage": {"input_tokens": 100, "output_tokens": 0}},
        {"text": "done", "usage": {"input_tokens": 100, "output_tokens": 0}}])
    assert proc.returncode == 0, proc.err
    return sid


def _review(kovl, sid, tmp_path, turns, model, check):
    script = write_script(tmp_path, turns, model=model)
    return kovl("review", sid, "--provider", "scripted", "--script", script, check=check)


APPROVE = {"tool_calls": [{"name": "approve", "input": {"reason": "fine"}}],
           "usage": {"input_tokens": 50, "output_tokens": 5}}
READ = {"tool_calls": [{"name": "read_file", "input": {"path": "a.txt"}}],
        "usage": {"input_tokens": 400, "output_tokens": 0}}


def test_review_prints_its_cost(kovl, target, tmp_path):
    sid = _agent(kovl, target, tmp_path)
    kovl("cost", "set-price", "reviewer-t", "--input", "20", "--output", "20", check=0)
    proc = _review(kovl, sid, tmp_path, [APPROVE], "reviewer-t", check=0)
    lines = proc.out.splitlines()
    assert "cost: 55 tokens, $0.0011" in lines, proc.out
    assert not any(ln.startswith("budget:") for ln in lines)
    assert lines[-1].startswith("fingerprint: ")


def test_review_prints_the_budget_stop(kovl, target, tmp_path):
    sid = _agent(kovl, target, tmp_path)
    kovl("cost", "budget", "--session-tokens", "500", check=0)   # 200 spent, 600 after one read
    proc = _review(kovl, sid, tmp_path, [READ, APPROVE], "reviewer-u", check=1)
    lines = proc.out.splitlines()
    assert lines[0].startswith(f"review #1 of {sid}: no-verdict"), proc.out
    assert "cost: 400 tokens (unpriced: reviewer-u)" in lines, proc.out
    [stop] = [ln for ln in lines if ln.startswith("budget: stopped")]
    assert "session_tokens" in stop, stop
