"""What the denial tests share: one agent run of a single tool call, on the scripted provider
or the fake Anthropic endpoint, jailed on the kernel backend, and what the model read back."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))

from agentlib import AgentOvl, call, kovl, of_type, require, results, write_script  # noqa: E402,F401
from fakes import AnthropicFake  # noqa: E402

PROVIDERS = ("scripted", "anthropic")


class Run:
    """One agent run: sid, proc, events, the tool results in call order, and (anthropic) the
    requests the fake endpoint received."""

    def __init__(self, ovl, sid, proc, requests):
        self.ovl, self.sid, self.proc, self.requests = ovl, sid, proc, requests
        self.events = ovl.events(sid) if sid else []
        by_call = results(self.events)
        self.results = [by_call[c["call"]] for c in of_type(self.events, "tool_call")]

    def content(self, i=0):
        return self.results[i]["result"]["content"]

    def denial(self, i=0):
        return self.results[i].get("denial")

    def told(self, i=0):
        """The tool_result content the model's NEXT request carried for call i (anthropic),
        or None when no further request was made."""
        if len(self.requests) < 2:
            return None
        call_id = self.results[i]["call"]
        for message in self.requests[-1]["body"]["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else ():
                if block.get("type") == "tool_result" and block.get("tool_use_id") == call_id:
                    return block["content"]
        raise AssertionError(f"call {call_id} is not in the next request")


def agent(ovl, target, tmp_path, provider, calls, *flags, task="probe the sandbox"):
    """Run the agent once: its first turn makes `calls` ([(tool, input)]), its second ends."""
    if provider == "scripted":
        script = write_script(tmp_path, [{"text": "Trying.", "tool_calls": [call(n, **a) for n, a in calls]},
                                         {"text": "Done."}])
        sid, proc = ovl.agent(target, task, "--provider", "scripted", "--script", script, *flags)
        return Run(ovl, sid, proc, [])
    fake = AnthropicFake()
    fake.queue(fake.turn(text="Trying.", calls=calls), fake.turn(text="Done."))
    try:
        sid, proc = ovl.agent(target, task, "--provider", "anthropic", "--model", fake.MODEL,
                              "--base-url", fake.url, *flags)
    finally:
        fake.close()
    assert fake.problems == [], fake.problems
    return Run(ovl, sid, proc, fake.requests)


def assert_told(run, line, cause, i=0, next_request=True, rc=0):
    """The call's result starts with the denial line, the tool_result event records it, and
    (anthropic) the next request carried that result to the model."""
    assert run.proc.returncode == rc, (run.proc.returncode, run.proc.out, run.proc.err)
    assert run.content(i).split("\n", 1)[0] == line, run.content(i)
    denial = run.denial(i)
    assert denial and denial["line"] == line and denial["cause"] == cause, denial
    if run.requests:
        if next_request:
            told = run.told(i)
            assert told is not None and told.split("\n", 1)[0] == line, told
        else:
            assert run.told(i) is None
    return denial


def assert_no_denial(run):
    assert run.proc.returncode == 0, (run.proc.out, run.proc.err)
    for r in run.results:
        assert "denial" not in r, r
        assert not r["result"]["content"].startswith("blocked"), r["result"]["content"]
    if run.requests:
        assert "blocked" not in json.dumps(run.requests[-1]["body"]["messages"][2:])
