"""The meter in the agent's loop and in the reviewer, piece by piece: a real trust/cost.Meter on
a fresh OVERLORD_HOME, the scripted provider, a toolbox without a sandbox -- and then the CLI's
lines. What a budget line or a broken cost record does to a run: the call is never made, the
transcript stays one a provider accepts (every call answered) and a resume rebuilds it; a
ledger that cannot be written or a cost.json that cannot be trusted stops the run with one
clear line instead of spending uncounted money."""
import json
import os

import pytest

from agentlib import call, kovl, of_type, write_script  # noqa: F401 -- kovl is a fixture
from overlord.agent import reviewer as RV
from overlord.agent import tools
from overlord.agent import transcript as T
from overlord.agent.cancel import Cancel
from overlord.agent.loop import DONE_REASONS, Loop
from overlord.agent.providers import scripted
from overlord.agent.providers.base import Endpoint
from overlord.cli.agent_cmds import _transcript_line, budget_line, cost_line
from overlord.errors import NotFound
from overlord.trust import audit, cost

SID = "20261202-030000-c0ffee"


class Box:
    """Answers every tool call without a sandbox (each write its own savepoint)."""

    def __init__(self):
        self.calls, self.layers = [], 0

    def call(self, name, args, cause):
        self.calls.append(name)
        layer = None
        if name not in tools.READING:
            layer, self.layers = self.layers, self.layers + 1
        return tools.Outcome(f"did {name}", exit_code=0, layer=layer)

    def check_input(self, name, args):
        return tools.check_input(name, args)

    def summary(self, name, args):
        return tools.summary(name, args)


def session_dir(home, sid=SID):
    d = home / "sessions" / sid
    d.mkdir(parents=True, exist_ok=True)
    return d


def run(home, tmp_path, turns, sid=SID, target="/srv/proj", owner=None, meter=True, **kw):
    """The loop on a session directory of its own, with a Meter for it (or none)."""
    sdir = session_dir(home, sid)
    record = T.Transcript(str(sdir))
    if not T.read(str(sdir)):
        record.record("system", prompt="be good", tools=tools.SPECS)
        record.record("task", text="task", message={"role": "user", "content": "task"})
    ep = Endpoint("scripted", script=str(write_script(tmp_path, turns)))
    m = cost.Meter(sid, target, owner) if meter else None
    box = Box()
    done = Loop(scripted, ep, box, record, Cancel(), meter=m, **kw).run()
    return done, T.read(str(sdir)), box


def turn(tokens, *calls, out=0):
    return {"text": "t", "tool_calls": list(calls), "usage": {"input_tokens": tokens, "output_tokens": out}}


def ledger(home):
    path = home / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def stops(sid=SID):
    return [e for e in audit.entries(action="budget.stop") if e.get("sid") == sid]


# -- the loop -----------------------------------------------------------------------------------

def test_budget_is_a_done_reason():
    assert "budget" in DONE_REASONS


def test_every_call_is_charged_and_the_done_event_carries_the_total(home, tmp_path):
    cost.set_price("scripted-test", 2.0, 8.0)
    done, events, box = run(home, tmp_path, [
        turn(1000, call("write_file", path="a", content="x"), out=100),
        turn(2000, call("read_file", path="a"), out=200), turn(500, out=50)])
    assert done.reason == "end_turn" and box.calls == ["write_file", "read_file"]
    lines = ledger(home)
    assert [(ln["kind"], ln["sid"], ln["target"], ln["input_tokens"]) for ln in lines] == \
        [("turn", SID, "/srv/proj", 1000), ("turn", SID, "/srv/proj", 2000), ("turn", SID, "/srv/proj", 500)]
    total = cost.session_total(SID)
    assert done.cost == total == events[-1]["cost"]
    assert total["calls"] == 3 and total["tokens"] == 3850
    assert total["usd"] == pytest.approx(sum(ln["usd"] for ln in lines), abs=1e-6)
    assert total["usd"] == pytest.approx((3500 * 2 + 350 * 8) / 1e6, abs=1e-6)
    assert done.budget is None and "budget" not in events[-1]


def test_no_meter_no_ledger(home, tmp_path):
    done, events, _ = run(home, tmp_path, [turn(10)], meter=False)
    assert done.reason == "end_turn" and done.cost is None and events[-1]["cost"] is None
    assert not (home / "ledger.jsonl").exists()


def test_the_line_reached_exactly_stops_before_the_next_call(home, tmp_path):
    cost.set_budget("config", session_tokens=300)
    done, events, box = run(home, tmp_path, [
        turn(100, call("write_file", path="a", content="x")),
        turn(200, call("write_file", path="b", content="y")),      # 300: headroom 0 after it
        turn(1, call("write_file", path="c", content="z")), turn(1)])
    assert done.reason == "budget" and done.turns == 2 and box.calls == ["write_file"] * 2
    assert done.budget == {"key": "session_tokens", "limit": 300, "spent": 300, "source": "config",
                           "kind": "turn", "message": done.message}
    assert done.message == "the session_tokens budget of 300 tokens (config) is reached: 300 tokens spent"
    ev = of_type(events, "budget")[0]
    assert {k: ev[k] for k in done.budget} == done.budget
    assert events[-1]["type"] == "done" and events[-1]["reason"] == "budget"
    assert events[-1]["budget"] == done.budget and events[-1]["cost"]["tokens"] == 300
    assert len(of_type(events, "request")) == 2 and len(ledger(home)) == 2
    (act,) = stops()
    assert (act["key"], act["limit"], act["spent"], act["source"], act["kind"], act["target"]) == \
        ("session_tokens", 300, 300, "config", "turn", "/srv/proj")


def test_after_a_stop_the_transcript_replays_and_a_raised_line_lets_it_go_on(home, tmp_path):
    cost.set_budget("config", session_tokens=100)
    turns = [turn(100, call("write_file", path="a", content="x"), call("shell", command="ls")),
             turn(5, call("write_file", path="b", content="y")), turn(5)]
    done, events, _ = run(home, tmp_path, turns)
    assert done.reason == "budget"
    conv = T.replay(events)
    assert T.unanswered(conv.messages) == []           # every call has its result
    assert conv.messages[-1]["role"] == "tool"            # the last reply's results
    cost.set_budget("config", session_tokens=1000)
    done, events, box = run(home, tmp_path, turns)     # the same record, continued
    assert done.reason == "end_turn" and box.calls == ["write_file"]
    assert [e["reason"] for e in of_type(events, "done")] == ["budget", "end_turn"]
    assert [ln["input_tokens"] for ln in ledger(home)] == [100, 5, 5]
    assert events[-1]["cost"]["calls"] == 3


def test_a_compaction_the_budget_refuses_is_never_asked_for(home, tmp_path):
    cost.set_budget("config", session_tokens=500)
    w = [turn(10, call("write_file", path=p, content=p)) for p in "ab"]
    done, events, _ = run(home, tmp_path, w + [turn(800, call("write_file", path="c", content="c")),
                                               {"text": "NOTE"}, turn(1)], context_window=1000)
    assert done.reason == "budget" and done.budget["kind"] == "compaction"
    assert not of_type(events, "compaction") and len(of_type(events, "request")) == 3
    assert [ln["kind"] for ln in ledger(home)] == ["turn"] * 3
    assert stops()[0]["kind"] == "compaction"


def test_a_compaction_call_is_on_the_ledger(home, tmp_path):
    w = [turn(10, call("write_file", path=p, content=p)) for p in "ab"]
    done, events, _ = run(home, tmp_path, w + [turn(800, call("write_file", path="c", content="c")),
                                               {"text": "NOTE", "usage": {"input_tokens": 7}}, turn(1)],
                          context_window=1000)
    assert done.reason == "end_turn" and len(of_type(events, "compaction")) == 1
    assert [ln["kind"] for ln in ledger(home)] == ["turn", "turn", "turn", "compaction", "turn"]
    assert ledger(home)[3]["input_tokens"] == 7


def test_an_accounts_line_holds_its_runs_and_the_ledger_names_it(home, tmp_path):
    cost.set_price("scripted-test", 0.0, 1.0)
    cost.set_budget("account:erin", day_usd=0.25)
    done, _, _ = run(home, tmp_path, [turn(1, call("read_file", path="x"), out=300_000), turn(1)],
                     owner="erin")
    assert done.reason == "budget" and done.budget["source"] == "account: erin"
    assert [ln["account"] for ln in ledger(home)] == ["erin"]
    # another session for nobody's account is not held to erin's line
    done, _, _ = run(home, tmp_path, [turn(1, call("read_file", path="x"), out=300_000), turn(1)],
                     sid="20261202-030001-beef00")
    assert done.reason == "end_turn"


# -- what cannot be counted stops the run ---------------------------------------------------------

def test_a_ledger_that_cannot_be_written_stops_the_run_and_answers_the_calls(home, tmp_path):
    (home / "ledger.jsonl").mkdir()            # no line can be appended (root or not)
    done, events, box = run(home, tmp_path, [
        turn(10, call("write_file", path="a", content="x"), call("read_file", path="a")), turn(1)])
    assert done.reason == "error" and "cost ledger could not record the turn call" in done.message
    assert box.calls == []                     # the reply's calls never ran
    results = of_type(events, "tool_result")
    assert len(results) == 2 and all(r["not_run"] for r in results)
    assert T.unanswered(T.replay(events).messages) == []
    assert of_type(events, "error")[0]["message"] == done.message


@pytest.mark.parametrize("damage", ["not json", "group-writable"])
def test_a_cost_json_that_cannot_be_trusted_refuses_before_any_call(home, tmp_path, damage):
    path = home / "cost.json"
    if damage == "not json":
        path.write_text("{not json")
        os.chmod(path, 0o600)
    else:
        path.write_text(json.dumps({"budget": {"session_tokens": 10 ** 9}}))
        os.chmod(path, 0o666)
    done, events, box = run(home, tmp_path, [turn(10, call("write_file", path="a", content="x")), turn(1)])
    assert done.reason == "error" and "cost budget could not be checked" in done.message
    assert "cost.json" in done.message
    assert not of_type(events, "request") and box.calls == [] and ledger(home) == []


# -- the reviewer ----------------------------------------------------------------------------------

class Dossier:
    nonce, text = "n0nce", "the dossier"


def review(home, tmp_path, turns, owner=None):
    sdir = session_dir(home)
    record = RV.Record(str(sdir / "review.jsonl"), 1)
    ep = Endpoint("scripted", script=str(write_script(tmp_path, turns, model="reviewer-x")))
    outcome = RV.Review(scripted, ep, RV.View(str(tmp_path), {}), Dossier(), record,
                        meter=cost.Meter(SID, "/srv/proj", owner)).run()
    events = [json.loads(line) for line in (sdir / "review.jsonl").read_text().splitlines()]
    return outcome, events


def approve():
    return {"tool_calls": [{"name": "approve", "input": {"reason": "fine"}}],
            "usage": {"input_tokens": 40, "output_tokens": 2}}


def test_a_review_call_is_charged_to_the_account_asking(home, tmp_path):
    outcome, events = review(home, tmp_path, [{"text": "hmm", "usage": {"input_tokens": 30}}, approve()],
                             owner="frank")
    assert outcome.verdict == "approve" and outcome.budget is None
    assert outcome.cost == {"calls": 2, "tokens": 72, "usd": 0.0, "unpriced": ["reviewer-x"]}
    lines = ledger(home)
    assert [(ln["kind"], ln["sid"], ln["account"], ln["model"]) for ln in lines] == \
        [("review", SID, "frank", "reviewer-x")] * 2
    assert cost.session_total(SID)["tokens"] == 72


def test_a_review_the_budget_stops_is_no_verdict_naming_the_line(home, tmp_path):
    cost.set_budget("config", session_tokens=50)
    outcome, events = review(home, tmp_path, [{"text": "reading", "usage": {"input_tokens": 60}},
                                              approve()])
    assert outcome.verdict == "no-verdict" and outcome.turns == 1
    assert "budget" in outcome.reason and "session_tokens budget of 50 tokens (config)" in outcome.reason
    assert outcome.budget["kind"] == "review" and outcome.budget["spent"] == 60
    (ev,) = of_type(events, "budget")
    assert (ev["key"], ev["kind"], ev["limit"], ev["review"]) == ("session_tokens", "review", 50, 1)
    assert len(of_type(events, "request")) == 1 and len(ledger(home)) == 1
    assert stops()[0]["kind"] == "review"


# -- the faces' words ------------------------------------------------------------------------------

def test_the_cost_line():
    assert cost_line({"tokens": 12345, "usd": 0.0421, "unpriced": []}) == "cost: 12,345 tokens, $0.0421"
    assert cost_line({"tokens": 900, "usd": 0.0, "unpriced": ["model-x"]}) == \
        "cost: 900 tokens (unpriced: model-x)"
    assert cost_line({"tokens": 2_000_000, "usd": 12.5, "unpriced": ["m\x1b[2J"]}) == \
        "cost: 2,000,000 tokens, $12.50 (unpriced: m\\x1b[2J)"
    assert cost_line({"tokens": 1, "usd": 0.0, "unpriced": []}) == "cost: 1 token, $0.0000"
    assert budget_line({"message": "the day_usd budget of $1.00 (config) is reached: $1.20 spent"}) \
        == "budget: stopped \u2014 the day_usd budget of $1.00 (config) is reached: $1.20 spent"


def test_the_transcript_shows_the_stop_and_the_total():
    line = _transcript_line({"type": "budget", "kind": "compaction", "message": "the line"})
    assert line == "budget: stopped before a compaction call \u2014 the line"
    line = _transcript_line({"type": "done", "reason": "budget", "turns": 2, "message": "the line",
                             "usage": {"input_tokens": 5, "output_tokens": 1},
                             "cost": {"tokens": 6, "usd": 0.0, "unpriced": ["m"]}})
    assert line == "done budget: 2 turns, 5 input / 1 output tokens; session cost: 6 tokens (unpriced: m)"


def test_session_cost_via_ops(home, tmp_path):
    from overlord import ops
    with pytest.raises(NotFound):
        ops.session_cost("20261202-030000-000000")


def test_the_cli_prints_the_cost_and_the_stop_and_the_transcript_keeps_them(kovl, target, tmp_path):
    kovl("cost", "budget", "--session-tokens", "15", check=0)
    sid, proc = kovl.scripted(target, tmp_path, [turn(10, call("write_file", path="a.txt", content="a")),
                                                 turn(10, call("write_file", path="b.txt", content="b")),
                                                 turn(1)])
    assert proc.returncode == 1, proc.err
    lines = proc.out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(f"session {sid}  pending"))
    assert "done budget after 2 turns" in lines[at]
    assert lines[at + 1] == "cost: 20 tokens (unpriced: scripted-test)"
    assert lines[at + 2] == ("budget: stopped \u2014 the session_tokens budget of 15 tokens (config) "
                             "is reached: 20 tokens spent")
    shown = kovl("transcript", sid, check=0).out
    assert "budget: stopped before a turn call \u2014 the session_tokens budget" in shown
    assert "; session cost: 20 tokens (unpriced: scripted-test)" in shown
    from overlord import ops
    assert ops.session_cost(sid)["tokens"] == 20
