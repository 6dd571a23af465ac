"""Blame to the prompt: lines an agent wrote name the session, turn, tool call and task."""
import json

from agentlib import call, kovl  # noqa: F401 -- kovl is a fixture


def test_blame_names_turn_tool_call_and_task(kovl, target, tmp_path):
    (target / "notes.txt").write_text("kept\nold\n")
    sid, proc = kovl.scripted(target, tmp_path, [
        {"tool_calls": [call("edit_file", path="notes.txt", old="old\n", new="new\nadded\n")]},
        {"tool_calls": [call("write_file", path="other.txt", content="x\n")]},
        {"text": "done"}], task="rewrite the old line")
    assert proc.returncode == 0, proc.err
    kovl("commit", sid, check=0)
    lines = json.loads(kovl("blame", target / "notes.txt", "--json", check=0).out)["lines"]
    assert [ln["text"] for ln in lines] == ["kept", "new", "added"]
    assert lines[0]["owner"] == "origin"
    owner = lines[1]["owner"]
    assert owner["sid"] == sid and owner["tool"] == "edit_file" and owner["turn"] == 1
    assert owner["call"] and owner["task"] == "rewrite the old line"
    assert lines[2]["owner"] == owner
    human = kovl("blame", target / "notes.txt", check=0).out.splitlines()
    assert "turn 1 edit_file" in human[1]
