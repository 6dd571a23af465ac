"""Budgets stop a conversation before the call that would cross them: agent turns, compaction
notes and second-model reviews, each budget line from each source (the global config, the
folder's policy rule, the account), always through the real CLI (or ops in a process of its
own for an account's run). Every stop is a `budget` transcript (or review record) event, a
`budget.stop` act on the audit chain and the done reason `budget`; the work so far stays
pending and commits; the ledger has one line per call made, and no line for the call refused."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, require_backend, tree

sys.path.insert(0, os.path.join(REPO, "test", "agent"))
from agentlib import ENV, AgentOvl, call, of_type, read_jsonl, write_script  # noqa: E402
from fakes import AnthropicFake  # noqa: E402

MODEL = "scripted-test"        # agentlib.write_script's model id


@pytest.fixture
def kovl(home):
    require_backend("kernel")
    return AgentOvl(home, "kernel")


# -- helpers --------------------------------------------------------------------------------------

def write(path, tokens_in, tokens_out=0, **usage):
    """A turn that writes one file, billed tokens_in/tokens_out."""
    return {"text": f"writing {path}", "tool_calls": [call("write_file", path=path, content=f"{path}\n")],
            "usage": dict(input_tokens=tokens_in, output_tokens=tokens_out, **usage)}


def say(text, tokens_in=0, tokens_out=0):
    return {"text": text, "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out}}


def budget(kovl, *flags, check=0):
    """`overlord cost budget FLAGS` (the global config's lines)."""
    return kovl("cost", "budget", *flags, check=check)


def account(kovl, name, *budget_flags):
    """A local account (a password on stdin), with `overlord users budget NAME FLAGS`."""
    kovl("users", "add", name, "--role", "operator", input=b"a-long-enough-password-1\n", check=0)
    if budget_flags:
        kovl("users", "budget", name, *budget_flags, check=0)


def set_price(kovl, model, inp, out, *more):
    kovl("cost", "set-price", model, "--input", inp, "--output", out, *more, check=0)


def ledger(home, sid=None):
    lines = read_jsonl(home / "ledger.jsonl")
    return [ln for ln in lines if sid is None or ln["sid"] == sid]


def acts(kovl, action, sid=None):
    out = json.loads(kovl("audit", "show", "--action", action, "--json", check=0).out)
    return [a for a in out if sid is None or a.get("sid") == sid]


def done_of(kovl, sid):
    return of_type(kovl.events(sid), "done")[-1]


def agent_json(proc):
    """The --json line (the last line of stdout)."""
    return json.loads(proc.out.strip().splitlines()[-1])


def assert_stop(kovl, sid, key, kind, limit, source_has):
    """The stop is in the transcript, the done event and on the audit chain, saying the same."""
    events = kovl.events(sid)
    stops = of_type(events, "budget")
    assert len(stops) == 1, stops
    ev = stops[0]
    assert ev["key"] == key and ev["kind"] == kind and ev["limit"] == limit
    assert source_has in ev["source"] and ev["spent"] >= limit
    assert key in ev["message"] and source_has in ev["message"]
    done = events[-1]
    assert done["type"] == "done" and done["reason"] == "budget" and done["budget"]["key"] == key
    # nothing after the stop but the answers to calls that never ran, and done
    after = events[events.index(ev) + 1:]
    assert all(e["type"] in ("tool_result", "done") for e in after), [e["type"] for e in after]
    assert not of_type(after, "request") and not of_type(after, "assistant")
    chained = acts(kovl, "budget.stop", sid)
    assert len(chained) == 1
    a = chained[0]
    assert (a["key"], a["kind"], a["limit"], a["source"]) == (key, kind, limit, ev["source"])
    assert a["spent"] == ev["spent"] and a["target"] == kovl.meta(sid)["target"]
    return ev


# -- before a turn ----------------------------------------------------------------------------------

def test_session_tokens_stop_before_the_turn_that_would_cross_it(kovl, home, target, tmp_path):
    before = tree(target)
    budget(kovl, "--session-tokens", "250")
    sid, proc = kovl.scripted(target, tmp_path, [
        write("one.txt", 100, 20), write("two.txt", 100, 50), write("three.txt", 100), say("done")])
    assert proc.returncode == 1, (proc.out, proc.err)
    assert "done budget after 2 turns" in proc.out
    assert "cost: 270 tokens (unpriced: scripted-test)" in proc.out
    assert "budget: stopped \u2014 the session_tokens budget of 250 tokens (config) is reached: " \
           "270 tokens spent" in proc.out
    stop = assert_stop(kovl, sid, "session_tokens", "turn", 250, "config")
    assert stop["spent"] == 270
    # one ledger line per call made, none for the call refused
    lines = ledger(home, sid)
    assert [ln["kind"] for ln in lines] == ["turn", "turn"]
    assert [(ln["input_tokens"], ln["output_tokens"]) for ln in lines] == [(100, 20), (100, 50)]
    assert all(ln["provider"] == "scripted" and ln["model"] == MODEL and ln["account"] is None
               and ln["usd"] is None and ln["priced"] is False for ln in lines)
    # the done event's cost is the ledger's sum
    cost = done_of(kovl, sid)["cost"]
    assert cost["calls"] == 2 and cost["tokens"] == 270 and cost["unpriced"] == [MODEL]
    # the work so far stays pending, then commits
    assert tree(target) == before
    assert kovl.meta(sid)["state"] == "pending"
    assert kovl.diff(sid) == [("added", "one.txt"), ("added", "two.txt")]
    kovl("commit", sid, check=0)
    assert (target / "one.txt").read_text() == "one.txt\n" and not (target / "three.txt").exists()


def test_session_usd_stop_and_the_done_cost_is_the_sum_of_the_ledger(kovl, home, target, tmp_path):
    set_price(kovl, MODEL, "1", "10")           # $1 per million in, $10 per million out
    budget(kovl, "--session-usd", "1.5")
    each = [write(f"{n}.txt", 50_000, 65_000) for n in "abcd"]       # $0.70 a turn
    sid, proc = kovl.scripted(target, tmp_path, each + [say("x")], "--json")
    assert proc.returncode == 1, (proc.out, proc.err)
    out = agent_json(proc)
    sid = out["sid"]
    assert out["reason"] == "budget" and out["budget"]["key"] == "session_usd"
    assert out["budget"]["kind"] == "turn" and out["budget"]["source"] == "config"
    assert out["turns"] == 3                     # $1.40 < $1.50 before the third: it ran
    stop = assert_stop(kovl, sid, "session_usd", "turn", 1.5, "config")
    lines = ledger(home, sid)
    assert len(lines) == 3 and all(ln["priced"] for ln in lines)
    assert all(ln["usd"] == pytest.approx(0.05 + 0.65) for ln in lines)
    total = sum(ln["usd"] for ln in lines)
    assert stop["spent"] == pytest.approx(total) == pytest.approx(2.1)
    assert "$1.50" in stop["message"] and "$2.10" in stop["message"]
    assert out["cost"]["usd"] == pytest.approx(total) == done_of(kovl, sid)["cost"]["usd"]
    assert out["cost"]["tokens"] == sum(ln["input_tokens"] + ln["output_tokens"] for ln in lines)
    assert out["cost"]["calls"] == 3 and out["cost"]["unpriced"] == []
    assert kovl.diff(sid) == [("added", "a.txt"), ("added", "b.txt"), ("added", "c.txt")]


def test_a_session_already_over_its_line_makes_no_call_at_all(kovl, home, target, tmp_path):
    budget(kovl, "--session-tokens", "0")
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 5), say("x")])
    assert proc.returncode == 1, proc.err
    assert "done budget after 0 turns" in proc.out and "cost: 0 tokens" in proc.out
    assert_stop(kovl, sid, "session_tokens", "turn", 0, "config")
    assert ledger(home, sid) == []
    assert not of_type(kovl.events(sid), "request")
    # no changes: nobody is told that work waits
    assert acts(kovl, "session.needs_review", sid) == []


# -- a real wire protocol ----------------------------------------------------------------------------

def test_anthropic_wire_usage_is_charged_and_the_third_request_never_sent(kovl, home, target):
    fake = AnthropicFake()      # every turn bills 25 in, 12 out, 7 cache read, 3 cache write
    set_price(kovl, fake.MODEL, "3", "15", "--cache-read", "0.3", "--cache-write", "3.75")
    budget(kovl, "--session-tokens", "90")
    fake.queue(fake.turn(text="one", calls=[("write_file", {"path": "a.txt", "content": "a\n"})]),
               fake.turn(text="two", calls=[("write_file", {"path": "b.txt", "content": "b\n"})]),
               fake.turn(text="three", calls=[("write_file", {"path": "c.txt", "content": "c\n"})]))
    try:
        sid, proc = kovl.agent(target, "write three files", "--provider", "anthropic",
                               "--model", fake.MODEL, "--base-url", fake.url)
    finally:
        fake.close()
    assert fake.problems == []
    assert len(fake.requests) == 2, "the call the budget refused was never sent"
    assert proc.returncode == 1 and "done budget" in proc.out, (proc.out, proc.err)
    stop = assert_stop(kovl, sid, "session_tokens", "turn", 90, "config")
    assert stop["spent"] == 94
    lines = ledger(home, sid)
    assert [(ln["provider"], ln["model"], ln["kind"]) for ln in lines] == [("anthropic", fake.MODEL, "turn")] * 2
    assert all((ln["input_tokens"], ln["output_tokens"], ln["cache_read_tokens"],
                ln["cache_write_tokens"]) == (25, 12, 7, 3) for ln in lines)
    each = (25 * 3 + 12 * 15 + 7 * 0.3 + 3 * 3.75) / 1e6
    assert all(ln["usd"] == pytest.approx(each) and ln["priced"] for ln in lines)
    cost = done_of(kovl, sid)["cost"]
    assert cost["usd"] == pytest.approx(2 * each, abs=1e-6) and cost["tokens"] == 94 and cost["unpriced"] == []
    assert f"cost: 94 tokens, ${2 * each:.4f}" in proc.out
    assert kovl.diff(sid) == [("added", "a.txt"), ("added", "b.txt")]


# -- before a compaction call ------------------------------------------------------------------------

def three_small_then_full(note_tokens=5):
    """Three writing turns, the third filling 800 tokens of a 1000-token window (compaction is
    due after it), then the handover note and a last reply."""
    return [write("a.txt", 10), write("b.txt", 10), write("c.txt", 800),
            {"text": "NOTE: wrote a, b, c", "usage": {"input_tokens": note_tokens, "output_tokens": 5}},
            say("finished", 20, 2)]


def test_compaction_is_charged_as_its_own_kind(kovl, home, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, three_small_then_full(), "--context-window", "1000")
    assert proc.returncode == 0, (proc.out, proc.err)
    assert len(of_type(kovl.events(sid), "compaction")) == 1
    lines = ledger(home, sid)
    assert [ln["kind"] for ln in lines] == ["turn", "turn", "turn", "compaction", "turn"]
    assert (lines[3]["input_tokens"], lines[3]["output_tokens"]) == (5, 5)
    assert done_of(kovl, sid)["cost"]["tokens"] == sum(
        ln["input_tokens"] + ln["output_tokens"] for ln in lines) == 10 + 10 + 800 + 10 + 22
    assert done_of(kovl, sid)["cost"]["calls"] == 5


def test_budget_stops_before_the_compaction_call(kovl, home, target, tmp_path):
    budget(kovl, "--session-tokens", "500")      # 20 spent before turn 3: it runs; 820 after
    sid, proc = kovl.scripted(target, tmp_path, three_small_then_full(), "--context-window", "1000")
    assert proc.returncode == 1 and "done budget after 3 turns" in proc.out, (proc.out, proc.err)
    assert_stop(kovl, sid, "session_tokens", "compaction", 500, "config")
    events = kovl.events(sid)
    assert not of_type(events, "compaction")         # no note was asked for, no cut made
    assert [ln["kind"] for ln in ledger(home, sid)] == ["turn"] * 3
    assert kovl.diff(sid) == [("added", "a.txt"), ("added", "b.txt"), ("added", "c.txt")]


# -- day_usd from each source --------------------------------------------------------------------

def test_day_usd_from_the_config_counts_every_session_of_the_day(kovl, home, target, tmp_path):
    set_price(kovl, MODEL, "0", "1")            # $1 per million out (a small context)
    budget(kovl, "--day-usd", "1")
    first, proc = kovl.scripted(target, tmp_path, [write("a.txt", 1, 700_000),
                                                   write("b.txt", 1, 700_000), say("x")])
    assert proc.returncode == 1, proc.err
    assert_stop(kovl, first, "day_usd", "turn", 1, "config")
    # a second conversation the same day is refused before its first call
    other = tmp_path / "other"
    other.mkdir()
    second, proc = kovl.scripted(other, tmp_path, [write("z.txt", 1), say("x")])
    assert proc.returncode == 1 and "done budget after 0 turns" in proc.out, proc.err
    stop = assert_stop(kovl, second, "day_usd", "turn", 1, "config")
    assert stop["spent"] == pytest.approx(1.4)
    assert ledger(home, second) == []


def test_day_usd_from_the_folders_policy_rule(kovl, home, target, tmp_path):
    set_price(kovl, MODEL, "0", "1")
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"targets": {str(target): {"budget": {"day_usd": 0.5}}}}))
    kovl("policy", "set", policy, check=0)
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 1, 600_000), write("b.txt", 1), say("x")])
    assert proc.returncode == 1, proc.err
    stop = assert_stop(kovl, sid, "day_usd", "turn", 0.5, f"targets[{target}]")
    assert stop["source"].startswith("policy")
    # the folder's line: another folder is not held to it
    other = tmp_path / "other"
    other.mkdir()
    free, proc = kovl.scripted(other, tmp_path, [write("a.txt", 1, 600_000), say("x")])
    assert proc.returncode == 0, proc.err
    assert of_type(kovl.events(free), "budget") == []


def test_a_policy_session_tokens_line_wins_over_a_looser_config_line(kovl, home, target, tmp_path):
    budget(kovl, "--session-tokens", "10000")
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"targets": {str(target): {"budget": {"session_tokens": 100}}}}))
    kovl("policy", "set", policy, check=0)
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 150), write("b.txt", 1), say("x")])
    assert proc.returncode == 1, proc.err
    assert_stop(kovl, sid, "session_tokens", "turn", 100, "policy")


def owner_run(kovl, target, script, owner):
    """ops.agent for an account, in a process of its own (the CLI runs for nobody's account)."""
    code = ("import json, sys\nfrom overlord import ops\n"
            "r = ops.agent('do the task', sys.argv[1], provider='scripted', script=sys.argv[2], "
            "owner=sys.argv[3])\n"
            "print(json.dumps({'sid': r.sid, 'reason': r.reason, 'cost': r.cost, 'budget': r.budget}))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(target), str(script), owner],
                          env=kovl.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_day_usd_from_the_account_holds_that_account_only(kovl, home, target, tmp_path):
    set_price(kovl, MODEL, "0", "1")
    account(kovl, "alice", "--day-usd", "0.5")
    script = write_script(tmp_path, [write("a.txt", 1, 600_000), write("b.txt", 1), say("x")])
    got = owner_run(kovl, target, script, "alice")
    assert got["reason"] == "budget" and got["budget"]["key"] == "day_usd"
    assert got["budget"]["source"] == "account: alice"
    assert_stop(kovl, got["sid"], "day_usd", "turn", 0.5, "account: alice")
    lines = ledger(home, got["sid"])
    assert len(lines) == 1 and lines[0]["account"] == "alice"
    assert got["cost"]["usd"] == pytest.approx(0.6)
    # bob has no line, and alice's spend is not his
    other = tmp_path / "other"
    other.mkdir()
    got = owner_run(kovl, other, script, "bob")
    assert got["reason"] == "end_turn" and got["budget"] is None


# -- resume ---------------------------------------------------------------------------------------

def test_resume_stops_again_until_the_line_is_raised_then_continues(kovl, home, target, tmp_path):
    budget(kovl, "--session-tokens", "150")
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 100), write("b.txt", 100),
                                                 write("c.txt", 100), say("all done")])
    assert proc.returncode == 1 and "done budget after 2 turns" in proc.out, proc.err
    # still over the line: the resume refuses its first call
    proc = kovl("resume", sid, check=1)
    assert "done budget after 0 turns" in proc.out and "budget: stopped" in proc.out
    assert len(of_type(kovl.events(sid), "budget")) == 2
    assert len(acts(kovl, "budget.stop", sid)) == 2
    # raised: it continues where it stopped, with the conversation the model had
    budget(kovl, "--session-tokens", "100000")
    proc = kovl("resume", sid, check=0)
    assert "done end_turn after 2 turns" in proc.out, (proc.out, proc.err)
    assert "cost: 300 tokens" in proc.out
    assert [ln["kind"] for ln in ledger(home, sid)] == ["turn"] * 4
    assert kovl.diff(sid) == [("added", "a.txt"), ("added", "b.txt"), ("added", "c.txt")]
    assert done_of(kovl, sid)["cost"]["calls"] == 4


# -- before a review call ------------------------------------------------------------------------

def approve(reason="fine"):
    return {"tool_calls": [{"name": "approve", "input": {"reason": reason}}],
            "usage": {"input_tokens": 50, "output_tokens": 5}}


def read_file(path, tokens=400):
    return {"tool_calls": [{"name": "read_file", "input": {"path": path}}],
            "usage": {"input_tokens": tokens, "output_tokens": 0}}


def review(kovl, sid, tmp_path, turns, *flags, model="reviewer-1", check=None):
    script = write_script(tmp_path, turns, model=model)
    return kovl("review", sid, "--provider", "scripted", "--script", script, "--json", *flags,
                check=check)


def test_budget_stops_before_a_review_call(kovl, home, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 100), say("done", 100)])
    assert proc.returncode == 0, proc.err
    budget(kovl, "--session-tokens", "800")   # 200 spent by the agent; 600, then 1000, after reads
    proc = review(kovl, sid, tmp_path, [read_file("a.txt"), read_file("hello.txt"), approve()],
                  check=1)
    verdict = json.loads(proc.out)
    assert verdict["verdict"] == "no-verdict" and "budget" in verdict["reason"]
    assert "session_tokens" in verdict["reason"] and verdict["budget"]["kind"] == "review"
    assert verdict["cost"]["calls"] == 2 and verdict["cost"]["tokens"] == 800
    # the review record and the chain say so
    record = read_jsonl(home / "sessions" / sid / "review.jsonl")
    stops = of_type(record, "budget")
    assert len(stops) == 1 and stops[0]["key"] == "session_tokens" and stops[0]["limit"] == 800
    assert stops[0]["spent"] == 1000
    assert len(of_type(record, "request")) == 2
    chained = acts(kovl, "budget.stop", sid)
    assert len(chained) == 1 and chained[0]["kind"] == "review"
    # two review lines on the ledger, for the reviewed session, nobody's account (the CLI)
    lines = ledger(home, sid)
    assert [ln["kind"] for ln in lines] == ["turn", "turn", "review", "review"]
    assert all(ln["model"] == "reviewer-1" and ln["account"] is None for ln in lines[2:])
    # the verdict on record notes it; no verdict counts, the session is still pending
    meta = kovl.meta(sid)
    assert meta["reviews"][-1]["verdict"] == "no-verdict" and meta["reviews"][-1]["budget"]["key"] \
        == "session_tokens"
    assert meta["state"] == "pending"


def test_a_review_for_an_account_is_charged_to_it(kovl, home, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 10), say("done")])
    assert proc.returncode == 0, proc.err
    script = write_script(tmp_path, [approve()], model="reviewer-2")
    code = ("import json, sys\nfrom overlord import ops\n"
            "v = ops.review(sys.argv[1], provider='scripted', script=sys.argv[2], owner='carol')\n"
            "print(json.dumps(v))\n")
    run = subprocess.run([sys.executable, "-c", code, sid, str(script)], env=kovl.env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    verdict = json.loads(run.stdout)
    assert verdict["verdict"] == "approve" and "budget" not in verdict
    assert verdict["cost"] == {"calls": 1, "tokens": 55, "usd": 0.0, "unpriced": ["reviewer-2"]}
    lines = ledger(home, sid)
    assert [(ln["kind"], ln["account"]) for ln in lines] == [("turn", None), ("turn", None),
                                                              ("review", "carol")]


def test_an_account_line_stops_that_accounts_review(kovl, home, target, tmp_path):
    set_price(kovl, "reviewer-3", "1", "0")
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 10), say("done")])
    assert proc.returncode == 0, proc.err
    account(kovl, "dave", "--day-usd", "0")
    script = write_script(tmp_path, [approve()], model="reviewer-3")
    code = ("import json, sys\nfrom overlord import ops\n"
            "v = ops.review(sys.argv[1], provider='scripted', script=sys.argv[2], owner='dave')\n"
            "print(json.dumps(v))\n")
    run = subprocess.run([sys.executable, "-c", code, sid, str(script)], env=kovl.env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    verdict = json.loads(run.stdout)
    assert verdict["verdict"] == "no-verdict" and verdict["budget"]["source"] == "account: dave"
    assert [ln["kind"] for ln in ledger(home, sid)] == ["turn", "turn"]
    # the CLI (nobody's account) is not held to dave's line
    proc = review(kovl, sid, tmp_path, [approve()], model="reviewer-3", check=0)
    assert json.loads(proc.out)["verdict"] == "approve"


# -- session.needs_review --------------------------------------------------------------------------

def test_needs_review_once_per_run_that_leaves_changes_and_never_without(kovl, home, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [write("a.txt", 1), write("b.txt", 1), say("done")])
    assert proc.returncode == 0, proc.err
    told = acts(kovl, "session.needs_review", sid)
    assert len(told) == 1
    assert (told[0]["by"], told[0]["changes"], told[0]["reason"]) == ("agent", 2, "end_turn")
    assert told[0]["target"] == kovl.meta(sid)["target"]
    # nothing changed: nobody is told
    quiet, proc = kovl.scripted(target, tmp_path, [say("nothing to do")], "--stack")
    assert proc.returncode == 0, proc.err
    assert acts(kovl, "session.needs_review", quiet) == []
    # a budget stop with work done is a finished run with changes waiting
    budget(kovl, "--session-tokens", "1")
    stopped, proc = kovl.scripted(target, tmp_path, [write("c.txt", 5), write("d.txt", 5)], "--stack")
    assert proc.returncode == 1, proc.err
    told = acts(kovl, "session.needs_review", stopped)
    assert len(told) == 1 and (told[0]["changes"], told[0]["reason"]) == (1, "budget")
    assert len(acts(kovl, "session.needs_review")) == 2
