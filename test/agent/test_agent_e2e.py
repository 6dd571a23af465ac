"""`overlord agent` end to end against every provider's fake endpoint: the model's tool calls
write files inside the session, diff and provenance attribute each path to the call that wrote
it, and nothing reaches the real tree before commit (then commit delivers exactly that)."""
import json

import pytest

from agentlib import call, kovl, of_type, tree  # noqa: F401
from fakes import AnthropicFake, ChatFake, GeminiFake, ResponsesFake

CALLS = [("write_file", {"path": "notes/a.txt", "content": "alpha\n"}),
         ("shell", {"command": "printf 'beta\\n' > b.txt && echo wrote b"})]


def _anthropic():
    f = AnthropicFake()
    return f, ["--provider", "anthropic", "--model", f.MODEL, "--base-url", f.url]


def _responses():
    f = ResponsesFake()
    return f, ["--provider", "openai", "--model", f.MODEL, "--base-url", f.url]


def _chat():
    f = ChatFake()
    return f, ["--provider", "openai", "--api", "chat", "--model", "gpt-test", "--base-url", f.url]


def _azure():
    f = ChatFake(path="/openai/deployments/my-dep/chat/completions", auth="api-key",
                 query={"api-version": "2024-10-21"})
    return f, ["--provider", "azure", "--model", "my-dep", "--base-url", f.url,
               "--azure-api-version", "2024-10-21"]


def _compatible():
    f = ChatFake(key=None, path="/v1/chat/completions", auth=None, tokens_field="max_tokens")
    return f, ["--provider", "openai-compatible", "--model", "qwen-test", "--base-url", f.url + "/v1"]


def _gemini():
    f = GeminiFake()
    return f, ["--provider", "gemini", "--model", f.MODEL, "--base-url", f.url]


FAKES = {"anthropic": _anthropic, "openai": _responses, "openai-chat": _chat, "azure": _azure,
         "openai-compatible": _compatible, "gemini": _gemini}


@pytest.mark.parametrize("name", list(FAKES) + ["scripted"])
def test_agent_writes_through_tool_calls_attributed_and_staged(kovl, target, tmp_path, name):
    before = tree(target)
    if name == "scripted":
        fake = None
        from agentlib import write_script
        script = write_script(tmp_path, [
            {"text": "Writing.", "tool_calls": [call(n, **a) for n, a in CALLS]},
            {"text": "Done."}])
        flags = ["--provider", "scripted", "--script", script]
    else:
        fake, flags = FAKES[name]()
        fake.queue(fake.turn(text="Writing the two files.", calls=CALLS), fake.turn(text="Done."))
    try:
        sid, proc = kovl.agent(target, "write a.txt and b.txt", *flags)
    finally:
        if fake:
            fake.close()
    assert proc.returncode == 0, (proc.out, proc.err)
    if fake:
        assert fake.problems == []
        assert len(fake.requests) == 2
    assert "Writing" in proc.out and "Done." in proc.out           # the replies, streamed
    assert f"session {sid}  pending  " in proc.out and "done end_turn" in proc.out

    # staged, not written: the real tree is untouched
    assert tree(target) == before
    assert ("added", "notes/a.txt") in kovl.diff(sid) and ("added", "b.txt") in kovl.diff(sid)

    # each path is attributed to the tool call that wrote it, by the engine
    events = kovl.events(sid)
    ids = {e["tool"]: e["call"] for e in of_type(events, "tool_call")}
    causes = kovl.caused_by(sid)
    for path, tool in (("notes/a.txt", "write_file"), ("b.txt", "shell")):
        assert causes[path]["kind"] == "agent" and causes[path]["turn"] == 1
        assert causes[path]["tool"] == tool and causes[path]["call"] == ids[tool]
    if fake and name != "gemini":   # the provider's own call ids went back with the results
        assert ids["write_file"] in json.dumps(fake.requests[1]["body"])
    res = {e["tool"]: e for e in of_type(events, "tool_result")}
    assert res["write_file"]["layer"] == 0 and "notes/a.txt" in res["write_file"]["paths"]
    assert res["shell"]["exit_code"] == 0 and res["shell"]["layer"] == 1
    assert "wrote b" in res["shell"]["result"]["content"]
    assert [e["type"] for e in events][:2] == ["system", "task"]
    assert events[-1]["type"] == "done" and events[-1]["reason"] == "end_turn"

    # commit delivers exactly the staged change
    kovl("commit", sid, check=0)
    after = tree(target)
    assert after["notes/a.txt"] == b"alpha\n" and after["b.txt"] == b"beta\n"


def test_commit_by_call_takes_one_tool_call(kovl, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [
        {"tool_calls": [call("write_file", path="one.txt", content="1\n"),
                        call("write_file", path="two.txt", content="2\n")]},
        {"text": "ok"}])
    assert proc.returncode == 0, proc.err
    call_two = kovl.caused_by(sid)["two.txt"]["call"]
    kovl("commit", sid, "--only", f"call:{call_two}", check=0)
    assert (target / "two.txt").exists() and not (target / "one.txt").exists()
