"""Prices (defaults, cost.json overrides, longest-prefix match, unpriced and priced-in-part
calls), the ledger line one call writes, and the running totals it folds into."""
import json
import math
import os
import stat

import pytest

from overlord.errors import OverlordError, UsageError
from overlord.trust import cost
from overlord.txn import store


def new_session():
    sid = store.new_sid()
    os.makedirs(store.session_dir(sid))
    return sid


def ledger(home):
    path = home / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def usage(i=0, o=0, cr=0, cw=0):
    return {"input_tokens": i, "output_tokens": o, "cache_read_tokens": cr, "cache_write_tokens": cw,
            "context_tokens": i + cr + cw}


# -- prices -----------------------------------------------------------------------------------

def test_defaults_cover_the_three_families_and_name_their_source(home):
    table = cost.prices()
    for model in ("claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5", "gpt-4.1", "gpt-4o",
                  "o3", "o4-mini", "gemini-2.5-pro", "gemini-2.5-flash"):
        assert table[model]["source"] == "default"
        assert table[model]["input"] > 0 and table[model]["output"] > table[model]["input"]


def test_a_dated_id_matches_its_family_by_the_longest_prefix(home):
    assert cost.price("claude-sonnet-4-5-20250929")["match"] == "claude-sonnet-4-5"
    assert cost.price("claude-opus-4-5-20251101")["input"] == 5.0          # not claude-opus-4's 15
    assert cost.price("claude-opus-4-20250514")["match"] == "claude-opus-4"
    assert cost.price("gpt-4o-mini-2024-07-18")["match"] == "gpt-4o-mini"  # not gpt-4o
    assert cost.price("gpt-4o-2024-08-06")["match"] == "gpt-4o"
    assert cost.price("gemini-2.5-flash-lite-preview")["match"] == "gemini-2.5-flash-lite"
    assert cost.price("o3")["match"] == "o3"
    assert cost.price("llama-3-70b") is None and cost.price("") is None and cost.price(None) is None


def test_cost_json_overrides_a_default_and_adds_a_model(home):
    cost.set_price("gpt-4o", 1, 2, cache_read=0.5)
    cost.set_price("local-llm", 0.1, 0.2)
    table = cost.prices()
    assert table["gpt-4o"] == {"input": 1, "output": 2, "cache_read": 0.5, "cache_write": None,
                               "source": "cost.json"}
    assert table["local-llm"]["source"] == "cost.json"
    assert cost.price("gpt-4o-2024-08-06")["input"] == 1        # the override, by prefix too
    assert cost.price("local-llm-q4")["match"] == "local-llm"
    assert stat.S_IMODE(os.stat(home / "cost.json").st_mode) == 0o600
    doc = json.loads((home / "cost.json").read_text())
    assert doc["prices"]["gpt-4o"] == {"input": 1, "output": 2, "cache_read": 0.5}


def test_set_price_is_an_audited_act(home):
    cost.set_price("m-1", 3, 15)
    entries = [json.loads(x) for x in (home / "audit.jsonl").read_text().splitlines()]
    act = [e for e in entries if e["action"] == "cost.price"]
    assert len(act) == 1 and act[0]["model"] == "m-1" and act[0]["input"] == 3


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, -0.01, "3", None, True, [1]])
def test_a_bad_price_is_refused_and_nothing_is_written(home, bad):
    with pytest.raises(UsageError):
        cost.set_price("m", bad, 1)
    with pytest.raises(UsageError):
        cost.set_price("m", 1, 1, cache_write=bad if bad is not None else -5)
    assert not (home / "cost.json").exists()
    assert not (home / "audit.jsonl").exists()


@pytest.mark.parametrize("model", ["", "has space", "a\nb", "x" * 201, None, 7])
def test_a_bad_model_id_is_refused(home, model):
    with pytest.raises(UsageError):
        cost.set_price(model, 1, 1)
    assert not (home / "cost.json").exists()


def test_a_damaged_cost_json_refuses_prices_and_budgets_but_a_charge_still_lands(home):
    sid = new_session()
    (home / "cost.json").write_text("{not json")
    os.chmod(home / "cost.json", 0o600)
    with pytest.raises(OverlordError, match="cost.json"):
        cost.prices()
    meter = cost.Meter(sid, str(home), None)
    with pytest.raises(OverlordError, match="cost.json"):
        meter.check("turn")              # fail closed: its lines are not guessed at
    line = meter.charge("turn", "anthropic", "claude-haiku-4-5", usage(1000, 1000))
    assert line["usd"] == pytest.approx(0.006) and line["priced"]   # the defaults


def test_a_cost_json_others_may_write_is_refused(home):
    (home / "cost.json").write_text('{"budget": {"day_usd": 1}}')
    os.chmod(home / "cost.json", 0o666)
    with pytest.raises(OverlordError, match="group/other"):
        cost.budget()


def test_a_cost_json_with_a_bad_entry_is_refused_naming_it(home):
    (home / "cost.json").write_text(json.dumps({"prices": {"m": {"input": -1, "output": 1}}}))
    os.chmod(home / "cost.json", 0o600)
    with pytest.raises(OverlordError, match=r"prices\[m\]"):
        cost.prices()
    (home / "cost.json").write_text(json.dumps({"prices": {"m": {"inptu": 1, "output": 1}}}))
    with pytest.raises(OverlordError, match="unknown price"):
        cost.prices()


# -- the ledger line --------------------------------------------------------------------------

def test_one_call_is_one_ledger_line_with_every_field(home, tmp_path):
    sid = new_session()
    meter = cost.Meter(sid, str(tmp_path), "alice")
    line = meter.charge("turn", "anthropic", "claude-sonnet-4-5-20250929", usage(1000, 500, 2000, 100))
    assert ledger(home) == [line]
    assert set(line) == {"ts", "sid", "account", "kind", "provider", "model", "input_tokens",
                         "output_tokens", "cache_read_tokens", "cache_write_tokens", "usd",
                         "priced", "target"}
    assert (line["sid"], line["account"], line["kind"], line["provider"]) == \
        (sid, "alice", "turn", "anthropic")
    assert line["target"] == os.path.realpath(tmp_path)
    # 1000 x $3 + 500 x $15 + 2000 x $0.30 + 100 x $3.75, per million
    assert line["usd"] == pytest.approx(0.011475) and line["priced"] is True
    assert stat.S_IMODE(os.stat(home / "ledger.jsonl").st_mode) == 0o600


def test_kinds_are_turn_compaction_review(home):
    meter = cost.Meter(new_session(), None, None)
    for kind in cost.KINDS:
        meter.charge(kind, "scripted", "scripted", usage(1, 1))
    assert [x["kind"] for x in ledger(home)] == ["turn", "compaction", "review"]
    with pytest.raises(ValueError):
        meter.charge("chat", "scripted", "scripted", usage(1, 1))
    assert len(ledger(home)) == 3


def test_an_unpriced_model_is_counted_in_tokens_and_said_to_be_unpriced(home):
    sid = new_session()
    meter = cost.Meter(sid, None, None)
    line = meter.charge("turn", "openai-compatible", "qwen-local", usage(100, 50))
    assert line["usd"] is None and line["priced"] is False
    total = meter.total()
    assert total["tokens"] == 150 and total["usd"] == 0 and total["unpriced"] == ["qwen-local"]
    row, = cost.report("model")
    assert row["unpriced_calls"] == 1 and row["tokens"] == 150


def test_cache_tokens_without_a_rate_leave_the_call_priced_in_part(home):
    cost.set_price("part-model", 2, 4)                    # no cache rates
    meter = cost.Meter(new_session(), None, None)
    clean = meter.charge("turn", "anthropic", "part-model", usage(1_000_000, 0))
    assert clean["priced"] is True and clean["usd"] == pytest.approx(2.0)
    line = meter.charge("turn", "anthropic", "part-model", usage(1_000_000, 1_000_000, cr=500))
    assert line["priced"] is False and line["unpriced_parts"] == ["cache_read"]
    assert line["usd"] == pytest.approx(6.0)              # what could be priced: a lower bound
    assert meter.total()["unpriced"] == ["part-model"]
    assert meter.total()["usd"] == pytest.approx(8.0)


def test_cache_reads_and_writes_are_priced_by_their_own_rates(home):
    cost.set_price("c", 10, 20, cache_read=1, cache_write=100)
    meter = cost.Meter(new_session(), None, None)
    assert meter.charge("turn", "anthropic", "c", usage(cr=1_000_000))["usd"] == pytest.approx(1)
    assert meter.charge("turn", "anthropic", "c", usage(cw=1_000_000))["usd"] == pytest.approx(100)


def test_an_absurd_token_count_is_held_at_the_ceiling_never_inf_never_zero(home):
    cost.set_budget("config", session_usd=1)
    meter = cost.Meter(new_session(), None, None)
    for claim in (1e308, float("inf"), 10 ** 400):
        line = meter.charge("turn", "anthropic", "claude-haiku-4-5", {"output_tokens": claim})
        assert line["output_tokens"] == cost.MAX_CALL_TOKENS
        assert line["usd"] == pytest.approx(cost.MAX_CALL_TOKENS * 5 / 1e6)
    for raw in (home / "ledger.jsonl").read_text().splitlines():
        json.loads(raw, parse_constant=lambda name: pytest.fail(f"not JSON: {name}"))
    assert meter.check("turn").key == "session_usd"


def test_a_price_past_the_ceiling_is_refused(home):
    with pytest.raises(UsageError, match="from 0 to"):
        cost.set_price("m", cost.MAX_PRICE * 10, 1)
    cost.set_price("m", cost.MAX_PRICE, cost.MAX_PRICE)
    assert not math.isinf(cost.Meter(new_session(), None, None).charge(
        "turn", "anthropic", "m", {"input_tokens": 1e308, "output_tokens": 1e308})["usd"])


def test_the_reply_cannot_name_a_cheaper_or_unpriced_model(home):
    """The model id a reply names is the provider's string: the call is never priced below the
    model it asked for."""
    meter = cost.Meter(new_session(), None, None)
    u = {"input_tokens": 1_000_000}
    line = meter.charge("turn", "anthropic", "free-as-in-beer", u, requested="claude-opus-4-1")
    assert line["usd"] == pytest.approx(15) and line["priced"] is True
    assert line["model"] == "free-as-in-beer" and line["priced_as"] == "claude-opus-4-1"
    cheaper = meter.charge("turn", "anthropic", "claude-haiku-4-5", u, requested="claude-opus-4-1")
    assert cheaper["usd"] == pytest.approx(15) and cheaper["priced_as"] == "claude-opus-4-1"
    dearer = meter.charge("turn", "anthropic", "claude-opus-4-1", u, requested="claude-haiku-4-5")
    assert dearer["usd"] == pytest.approx(15) and "priced_as" not in dearer   # a fallback up
    dated = meter.charge("turn", "anthropic", "claude-haiku-4-5-20251001", u,
                         requested="claude-haiku-4-5")
    assert dated["usd"] == pytest.approx(1) and "priced_as" not in dated
    both = meter.charge("turn", "anthropic", "nope-1", u, requested="nope-2")
    assert both["usd"] is None and both["priced"] is False


def test_odd_usage_values_count_as_zero_never_as_a_crash(home):
    meter = cost.Meter(new_session(), None, None)
    line = meter.charge("turn", "anthropic", "claude-haiku-4-5",
                        {"input_tokens": "12", "output_tokens": float("nan"), "cache_read_tokens": -4,
                         "cache_write_tokens": True})
    assert [line[k] for k in cost.TOKEN_KEYS] == [0, 0, 0, 0]
    line = meter.charge("turn", "anthropic", "claude-haiku-4-5",
                        {"input_tokens": float("-inf"), "output_tokens": [1], "cache_read_tokens": {}})
    assert [line[k] for k in cost.TOKEN_KEYS] == [0, 0, 0, 0]
    assert cost.Meter(new_session(), None, None).charge("turn", "x", "y", None)["input_tokens"] == 0


# -- running totals ---------------------------------------------------------------------------

def test_the_session_file_and_spend_json_keep_the_running_total(home):
    sid = new_session()
    meter = cost.Meter(sid, "/srv", "bob")
    assert meter.total()["calls"] == 0 and cost.session_total(sid)["tokens"] == 0
    for _ in range(3):
        meter.charge("turn", "anthropic", "claude-haiku-4-5", usage(1000, 100, 10, 1))
    doc = json.loads((home / "sessions" / sid / "cost.json").read_text())
    assert len(doc.pop("sha256")) == 32                 # a torn write never reads as whole
    assert doc["calls"] == 3 and doc["tokens"] == 3 * 1111
    assert doc["offset"] == os.path.getsize(home / "ledger.jsonl")
    assert stat.S_IMODE(os.stat(home / "sessions" / sid / "cost.json").st_mode) == 0o600
    per = 1000 * 1 + 100 * 5 + 10 * 0.1 + 1 * 1.25
    assert doc["usd"] == pytest.approx(3 * per / 1e6)
    assert cost.session_total(sid) == meter.total() == \
        {k: v for k, v in doc.items() if k != "offset"}
    spend = json.loads((home / "spend.json").read_text())
    day = ledger(home)[0]["ts"][:10]
    scopes = spend["day"][day]
    assert set(scopes) == {"*", "account:bob", cost.target_scope("/srv")}
    assert scopes["*"] == pytest.approx(3 * per / 1e6)
    assert spend["month"][day[:7]]["account:bob"] == pytest.approx(3 * per / 1e6)
    assert spend["offset"] == os.path.getsize(home / "ledger.jsonl")


def test_sessions_are_kept_apart(home):
    a, b = new_session(), new_session()
    cost.Meter(a, None, None).charge("turn", "anthropic", "claude-haiku-4-5", usage(10, 0))
    cost.Meter(b, None, None).charge("turn", "anthropic", "claude-haiku-4-5", usage(20, 0))
    cost.Meter(a, None, None).charge("turn", "anthropic", "claude-haiku-4-5", usage(30, 0))
    assert cost.session_total(a)["input_tokens"] == 40
    assert cost.session_total(b)["input_tokens"] == 20


def test_a_report_groups_the_whole_ledger(home):
    a, b = new_session(), new_session()
    cost.Meter(a, None, "ann").charge("turn", "anthropic", "claude-haiku-4-5", usage(1_000_000, 0))
    cost.Meter(b, None, "ben").charge("review", "openai", "gpt-4.1", usage(1_000_000, 0))
    cost.Meter(b, None, "ben").charge("turn", "openai", "gpt-4.1", usage(1_000_000, 0))
    by_model = {r["key"]: r for r in cost.report("model")}
    assert by_model["gpt-4.1"]["calls"] == 2 and by_model["gpt-4.1"]["usd"] == pytest.approx(4.0)
    assert [r["key"] for r in cost.report("model")] == ["gpt-4.1", "claude-haiku-4-5"]  # costliest first
    assert {r["key"]: r["usd"] for r in cost.report("account")} == {"ben": 4.0, "ann": 1.0}
    assert {r["key"] for r in cost.report("session")} == {a, b}
    assert {r["key"]: r["calls"] for r in cost.report("kind")} == {"turn": 2, "review": 1}
    today = ledger(home)[0]["ts"][:10]
    assert [r["key"] for r in cost.report("day")] == [today]
    assert cost.report("model", since="2999-01-01") == []
    assert len(cost.report("model", since="1d")) == 2
    for bad in ("yesterday", "2026-13-01", "-1d"):
        with pytest.raises(UsageError):
            cost.report("model", since=bad)
    with pytest.raises(UsageError):
        cost.report("colour")
