"""Long conversations: resume (the first request after it is the last recorded one plus the
note, on the wire), rewind + resume and fork (the transcript cut with the stack), compaction
(and its exact replay), and Ctrl-C (the tool's process tree killed within 2 s, `done
cancelled`, the session still resumable)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agentlib import call, kovl, of_type, write_script  # noqa: F401
from fakes import KEY, AnthropicFake
from conftest import SESSION_RE, REPO


@pytest.fixture
def claude():
    fake = AnthropicFake()
    fake.allowed.add("output_config")
    yield fake
    fake.close()
    assert fake.problems == []


def flags(fake):
    return ["--provider", "anthropic", "--model", fake.MODEL, "--base-url", fake.url,
            "--max-tokens", "2000", "--effort", "high"]


def bare(value):
    """A request without its cache breakpoints (they move to the newest block each call)."""
    if isinstance(value, dict):
        return {k: bare(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [bare(v) for v in value]
    return value


def write(path, content):
    return ("write_file", {"path": path, "content": content})


def test_resume_sends_the_last_request_plus_the_note(kovl, target, claude):
    claude.queue(claude.turn(text="Writing a.", thinking="Plan: write a.", calls=[write("a.txt", "1\n")]),
                 claude.turn(text="Done."),
                 claude.turn(text="Added b.", calls=[write("b.txt", "2\n")]),
                 claude.turn(text="All done."))
    sid, proc = kovl.agent(target, "write a.txt", *flags(claude))
    assert proc.returncode == 0, proc.err
    proc = kovl("resume", sid, "--note", "now also b.txt")
    assert proc.returncode == 0, proc.err
    assert f"session {sid}  pending  2 changes" in proc.out and "done end_turn" in proc.out
    last, first = (claude.requests[i]["body"] for i in (1, 2))
    n = len(last["messages"])
    assert bare(first["messages"][:n]) == bare(last["messages"])
    assert bare(first["messages"][n:]) == [
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        {"role": "user", "content": [{"type": "text", "text": "now also b.txt"}]}]
    for key in ("system", "tools", "model", "max_tokens", "output_config"):   # the same model, the same way
        assert first[key] == last[key], key
    assert first["output_config"] == {"effort": "high"} and first["max_tokens"] == 2000
    # the key is never recorded
    sdir = kovl.home / "sessions" / sid
    for name in ("meta.json", "transcript.jsonl"):
        assert KEY not in (sdir / name).read_text()
    events = kovl.events(sid)
    assert [e["type"] for e in events].count("resume") == 1
    assert of_type(events, "resume")[0]["note"] == "now also b.txt"
    assert kovl.caused_by(sid)["b.txt"]["turn"] == 3


def test_rewind_then_resume_continues_from_the_cut(kovl, target, claude):
    claude.queue(claude.turn(text="a first.", calls=[write("a.txt", "1\n")]),
                 claude.turn(text="then b.", calls=[write("b.txt", "2\n")]),
                 claude.turn(text="Done."),
                 claude.turn(text="Understood, no b."))
    sid, proc = kovl.agent(target, "write a and b", *flags(claude))
    assert proc.returncode == 0, proc.err
    full = kovl.events(sid)
    proc = kovl("rewind", sid, "--to", "0", check=0)
    assert "1 savepoint dropped" in proc.out
    events = kovl.events(sid)
    rewind = events[-1]
    assert rewind["type"] == "rewind" and rewind["to"] == 0 and rewind["results"] == []
    assert max(e.get("turn") or 0 for e in events) == 1          # turn 2 (which made @1) is gone
    archived = [json.loads(l) for l in (kovl.home / "sessions" / sid / rewind["archive"]).open()]
    assert events[:-1] + archived == full
    assert "rewind to @0" in kovl("transcript", sid, check=0).out

    proc = kovl("resume", sid, "--note", "skip b")
    assert proc.returncode == 0, proc.err
    turn2, resumed = claude.requests[1]["body"], claude.requests[3]["body"]
    # the first request after the resume is the recorded request of turn 2 plus the note
    assert bare(resumed["messages"][:-1]) == bare(turn2["messages"][:-1])
    assert bare(resumed["messages"][-1]["content"]) == bare(turn2["messages"][-1]["content"]) + \
        [{"type": "text", "text": "skip b"}]
    assert kovl.diff(sid) == [("added", "a.txt")]


def test_rewind_inside_a_turn_and_fork(kovl, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [
        {"tool_calls": [call("write_file", path="a.txt", content="a"),
                        call("write_file", path="b.txt", content="b")]},
        {"text": "done"},
        {"text": "resumed"}], "--max-turns", "5")
    assert proc.returncode == 0, proc.err
    fork = SESSION_RE.search(kovl("fork", sid, "--at", "0", check=0).out).group(1)
    kovl("rewind", sid, "--to", "0", check=0)
    for s in (sid, fork):
        events = kovl.events(s)
        undone = [r for e in events if e["type"] == "rewind" for r in e["results"]]
        assert len(undone) == 1 and undone[0]["name"] == "write_file"
        assert "undid this call" in undone[0]["content"]
    assert kovl.events(fork)[-1]["type"] == "fork" and kovl.events(fork)[-1]["from"] == sid
    assert kovl.meta(fork)["agent"] == kovl.meta(sid)["agent"]          # same model, same way
    for s in (sid, fork):
        proc = kovl("resume", s, "--note", "only a")
        assert proc.returncode == 0 and "done end_turn" in proc.out, proc.err
        assert kovl.diff(s) == [("added", "a.txt")]


def test_compaction_replaces_old_turns_and_a_resume_replays_it(kovl, target, claude):
    big = {"input_tokens": 800, "output_tokens": 5, "cache_read_input_tokens": 0,
           "cache_creation_input_tokens": 0}
    claude.queue(claude.turn(text="1", calls=[write("a.txt", "a")]),
                 claude.turn(text="2", calls=[write("b.txt", "b")]),
                 claude.turn(text="3", calls=[write("c.txt", "c")], usage=big),
                 claude.turn(text="HANDOVER: wrote a, b, c; nothing remains."),
                 claude.turn(text="Done."),
                 claude.turn(text="Still here."))
    sid, proc = kovl.agent(target, "write three files", *flags(claude), "--context-window", "1000")
    assert proc.returncode == 0, proc.err
    assert "context compacted at 800 tokens" in proc.out
    bodies = [r["body"] for r in claude.requests]
    ask, after = bodies[3], bodies[4]
    assert "handover note" in ask["messages"][-1]["content"][-1]["text"]
    first = after["messages"][0]
    assert first["role"] == "user"
    text = first["content"][0]["text"]
    assert "write three files" in text and "HANDOVER: wrote a, b, c" in text
    # the note plus the last exchanges, kept exactly as they were sent before
    assert len(after["messages"]) == 5
    assert bare(after["messages"][1:4]) == bare(ask["messages"][3:6])
    assert bare(after["messages"][4]["content"]) == bare(ask["messages"][6]["content"][:-1])
    (event,) = of_type(kovl.events(sid), "compaction")
    assert event["tokens"] == 800 and event["kept"] == 4 and event["dropped"] == 3
    assert event["note"].startswith("HANDOVER")
    proc = kovl("resume", sid, "--note", "anything else?")
    assert proc.returncode == 0, proc.err
    resumed = claude.requests[5]["body"]
    n = len(after["messages"])
    assert bare(resumed["messages"][:n]) == bare(after["messages"])          # the compacted view
    assert "compaction at 800 tokens" in kovl("transcript", sid, check=0).out


def test_scripted_compaction_keeps_its_place(kovl, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [
        {"tool_calls": [call("write_file", path="a", content="a")]},
        {"tool_calls": [call("write_file", path="b", content="b")]},
        {"tool_calls": [call("write_file", path="c", content="c")], "usage": {"input_tokens": 5000}},
        {"text": "the handover note"},
        {"text": "finished after compaction"}], "--context-window", "6000")
    assert proc.returncode == 0, proc.err
    assert "finished after compaction" in proc.out
    assert of_type(kovl.events(sid), "compaction")[0]["note"] == "the handover note"


def _sleeps_under(pid):
    from overlord.sandbox.executor import descendants
    found = []
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", b"60"]:
                    found.append(p)
        except OSError:
            pass
    return found


def test_ctrl_c_kills_the_running_tool_and_leaves_the_session_resumable(kovl, target, tmp_path):
    script = write_script(tmp_path, [
        {"text": "Starting a long job.", "tool_calls": [call(
            "shell", command="trap '' INT TERM HUP; echo started > started.txt; sleep 60; echo late > late.txt"),
            call("write_file", path="never.txt", content="x")]},
        {"text": "Picked up after the cancel."}])
    proc = subprocess.Popen([sys.executable, "-m", "overlord", "agent", "-t", str(target),
                             "--provider", "scripted", "--script", str(script), "long job"],
                            env=kovl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not _sleeps_under(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while _sleeps_under(proc.pid):
            time.sleep(0.01)
        killed_in = time.monotonic() - sent
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"tool tree killed {killed_in * 1000:.0f} ms after SIGINT")
    assert killed_in < 2.0, killed_in
    out = out.decode()
    assert proc.returncode == 130, (out, err)
    sid = SESSION_RE.search(out).group(1)
    assert "done cancelled" in out
    events = kovl.events(sid)
    res = of_type(events, "tool_result")
    assert res[0]["cancelled"] and "Cancelled" in res[0]["result"]["content"]
    assert "cancelled" in res[1]["result"]["content"] and res[1]["not_run"]
    assert events[-1]["type"] == "done" and events[-1]["reason"] == "cancelled"
    assert kovl.meta(sid)["state"] == "pending"
    assert kovl.diff(sid) == [("added", "started.txt")]         # what it wrote before is kept
    proc = kovl("resume", sid, "--note", "go on")
    assert proc.returncode == 0 and "Picked up after the cancel." in proc.out, proc.err
    assert not os.path.exists(target / "late.txt")


def test_resume_refuses_what_it_cannot_continue(kovl, target, tmp_path):
    sid, _ = kovl.sh(target, "echo x > x")
    proc = kovl("resume", sid)
    assert proc.returncode == 1 and "not opened by the agent" in proc.err
    kovl("rollback", sid, check=0)
    sid, _ = kovl.scripted(target, tmp_path, [{"text": "hi"}])
    kovl("rollback", sid, check=0)
    proc = kovl("resume", sid, "--note", "more")
    assert proc.returncode == 1 and "it is rolled-back" in proc.err
    proc = kovl("transcript", sid, "--json", check=0)
    assert [e["type"] for e in json.loads(proc.out)][-1] == "done"


def test_ctrl_c_during_a_model_call_stops_at_once(kovl, target, claude):
    stalled = claude.turn(text="too late")
    stalled.stall = 30
    claude.queue(stalled, claude.turn(text="Back."))
    proc = subprocess.Popen([sys.executable, "-m", "overlord", "agent", "-t", str(target), *flags(claude),
                             "wait for the model"], env=kovl.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not claude.requests:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 2.0 and proc.returncode == 130, (took, out, err)
    sid = SESSION_RE.search(out.decode()).group(1)
    events = kovl.events(sid)
    assert [e["type"] for e in events][-2:] == ["request", "done"] and events[-1]["reason"] == "cancelled"
    assert len(claude.requests) == 1        # the broken call was not retried
    proc = kovl("resume", sid, "--note", "try again")
    assert proc.returncode == 0 and "Back." in proc.out, proc.err
