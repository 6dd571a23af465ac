"""Red team, issue 16: cost and budgets. The numbers a budget line is checked against come
from a provider's reply (its usage block, its model id) and from caches on disk. Can either
make a conversation cross a line, or lower what was spent?

These drive the real Meter (overlord.trust.cost, what the agent loop calls before and after
every provider call) in a fresh OVERLORD_HOME, with budget lines set through the CLI.
"""
import hashlib
import json
import os

import pytest

from conftest import Ovl

SID = "20261202-000000-aaaaaa"
MODEL = "claude-sonnet-4-5"


@pytest.fixture
def o(home):
    return Ovl(home)


@pytest.fixture
def meter(o, home, tmp_path):
    from overlord.trust import cost
    from overlord.txn import store
    store.ensure_home()
    os.makedirs(store.session_dir(SID), exist_ok=True)

    def make(sid=SID, owner=None):
        os.makedirs(store.session_dir(sid), exist_ok=True)
        return cost.Meter(sid, str(tmp_path), owner)
    assert cost.price(MODEL) is not None, "the test's model must be priced by default"
    return make


def strict_json(line):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(line, parse_constant=refuse)


def test_an_absurd_usage_block_does_not_slip_under_a_dollar_line(o, meter):
    """Was a hole (fixed in 7fea58b): output_tokens 1e308 priced usd=inf, written as a bare
    `Infinity`, then counted as $0 by the running totals."""
    o("cost", "budget", "--session-usd", "1", "--day-usd", "5", check=0)
    m = meter()
    assert m.check("turn") is None
    m.charge("turn", "anthropic", MODEL, {"input_tokens": 10, "output_tokens": 1e308})
    assert m.check("turn") is not None, "a call priced at $inf left every dollar line open"
    for line in open(o.home / "ledger.jsonl"):
        strict_json(line)


@pytest.mark.parametrize("usage", [
    {"input_tokens": -10**9, "output_tokens": -5},
    {"input_tokens": float("nan"), "output_tokens": float("-inf")},
    {"input_tokens": True, "output_tokens": "1000000"},
    {"input_tokens": [1], "output_tokens": {"n": 1}},
    "not a dict", None])
def test_hostile_usage_never_lowers_the_total(o, meter, usage):
    m = meter()
    m.charge("turn", "anthropic", MODEL, {"input_tokens": 1000, "output_tokens": 1000})
    before = m.total()
    m.charge("turn", "anthropic", MODEL, usage)
    after = m.total()
    assert after["tokens"] >= before["tokens"] and after["usd"] >= before["usd"]
    for line in open(o.home / "ledger.jsonl"):
        rec = strict_json(line)
        assert all(isinstance(rec[k], int) and rec[k] >= 0 for k in
                   ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"))


def test_a_line_reached_stops_the_next_call(o, meter):
    o("cost", "budget", "--session-tokens", "1500", check=0)
    m = meter()
    assert m.check("turn") is None
    m.charge("turn", "anthropic", MODEL, {"input_tokens": 1000, "output_tokens": 600})
    stop = m.check("compaction")
    assert stop is not None and stop.key == "session_tokens"
    assert m.check("review") is not None


def test_day_line_is_shared_across_sessions(o, meter):
    o("cost", "budget", "--day-usd", "0.01", check=0)
    a, b = meter(), meter("20261202-000000-bbbbbb")
    a.charge("turn", "anthropic", MODEL, {"input_tokens": 10000, "output_tokens": 1000})
    stop = b.check("turn")
    assert stop is not None and stop.key == "day_usd"


def test_a_provider_chosen_model_id_is_escaped_in_the_report(o, meter):
    m = meter()
    evil = "claude-x\x1b]0;owned\x07\x1b[2J\r\nfake row"
    m.charge("turn", "anthropic", evil, {"input_tokens": 1, "output_tokens": 1})
    for by in ("model", "session", "account", "day"):
        out = o("cost", "--by", by, check=0).out
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out, by
    assert "fake row" not in [ln.strip() for ln in o("cost", check=0).out.splitlines()]


def test_a_damaged_spend_cache_is_rebuilt_from_the_ledger(o, meter):
    o("cost", "budget", "--day-usd", "0.01", check=0)
    m = meter()
    m.charge("turn", "anthropic", MODEL, {"input_tokens": 10000, "output_tokens": 1000})
    path = o.home / "spend.json"
    data = path.read_bytes().replace(b'"*":', b'"*":-1000+')     # torn / edited by hand
    path.write_bytes(data)
    assert m.check("turn") is not None


def test_a_resealed_spend_cache_with_negative_totals_is_not_trusted(o, meter):
    """Was a hole (low; fixed in 7fea58b): a writer of OVERLORD_HOME re-sealed spend.json
    (an unkeyed digest) with a negative day total and the day line opened again."""
    from overlord.trust import cost
    o("cost", "budget", "--day-usd", "0.01", check=0)
    m = meter()
    m.charge("turn", "anthropic", MODEL, {"input_tokens": 10000, "output_tokens": 1000})
    assert m.check("turn") is not None
    path = o.home / "spend.json"
    doc = json.loads(path.read_bytes())
    for period in ("day", "month"):
        for scopes in doc[period].values():
            for k in scopes:
                scopes[k] = -1e6
    doc.pop("sha256", None)                     # re-seal as the cache does (an unkeyed digest)
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(b'{"sha256":"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'",'
                     + body[1:] + b"\n")
    assert cost.session_total(SID)["calls"] == 1
    assert m.check("turn") is not None, "a negative day total in the cache opened the line again"


@pytest.mark.parametrize("reply_model", [None, "free-as-in-beer-9"])
def test_the_reply_cannot_choose_an_unpriced_model_to_slip_a_dollar_line(home, target, reply_model):
    """None: the reply names the model asked for (the control: the line stops the 2nd call)."""
    import sys
    from conftest import REPO, require_backend
    sys.path.insert(0, os.path.join(REPO, "test", "agent"))
    from agentlib import AgentOvl
    from fakes import AnthropicFake
    require_backend("kernel")
    kovl = AgentOvl(home, "kernel")
    fake = AnthropicFake()
    kovl("cost", "set-price", fake.MODEL, "--input", "1000", "--output", "1000", check=0)
    kovl("cost", "budget", "--session-usd", "0.01", check=0)
    big = {"input_tokens": 10000, "output_tokens": 10000, "cache_read_input_tokens": 0,
           "cache_creation_input_tokens": 0}
    fake.queue(*[fake.turn(text=f"turn {i}", model=reply_model,
                           calls=[("write_file", {"path": f"f{i}.txt", "content": "x\n"})], usage=big)
                 for i in range(3)])
    try:
        sid, proc = kovl.agent(target, "write files", "--provider", "anthropic",
                               "--model", fake.MODEL, "--base-url", fake.url)
    finally:
        fake.close()
    assert len(fake.requests) == 1, f"{len(fake.requests)} calls past a $0.01 line (each ~$20)"
