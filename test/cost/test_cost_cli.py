"""`overlord cost`, `cost prices`, `cost set-price`, `cost budget` and `overlord users budget`
through the real CLI: tables, --json, and bad input refused in one `overlord: ...` line with
nothing written."""
import json
import os

import pytest

from conftest import Ovl
from overlord.trust import cost
from overlord.txn import store


@pytest.fixture
def cli(home):
    return Ovl(home)


def new_session():
    sid = store.new_sid()
    os.makedirs(store.session_dir(sid))
    return sid


def refused(proc, code, says):
    assert proc.returncode == code, (proc.returncode, proc.out, proc.err)
    assert proc.out == ""
    assert proc.err.startswith("overlord: ") and proc.err.count("\n") == 1, proc.err
    assert says in proc.err, proc.err


def untouched(home):
    assert not (home / "cost.json").exists()
    assert not (home / "audit.jsonl").exists()


def test_an_empty_ledger_says_so(cli):
    assert cli("cost", check=0).out == "no model calls on the ledger\n"
    rep = json.loads(cli("cost", "--json", check=0).out)
    assert rep["rows"] == [] and rep["total"]["calls"] == 0 and rep["by"] == "model"


def test_the_report_table_and_json(cli, home):
    a, b = new_session(), new_session()
    cost.Meter(a, None, "ann").charge("turn", "anthropic", "claude-haiku-4-5",
                                      {"input_tokens": 1_000_000, "output_tokens": 200_000})
    cost.Meter(b, None, "ben").charge("review", "openai-compatible", "local-7b",
                                      {"input_tokens": 500, "output_tokens": 20})
    out = cli("cost", check=0).out.splitlines()
    assert out[0].split() == ["MODEL", "CALLS", "INPUT", "OUTPUT", "CACHE-READ", "CACHE-WRITE",
                              "TOKENS", "USD"]
    assert out[1].split() == ["claude-haiku-4-5", "1", "1,000,000", "200,000", "0", "0",
                              "1,200,000", "$2.00"]
    assert out[2].split() == ["local-7b", "1", "500", "20", "0", "0", "520", "unpriced"]
    assert out[3].split() == ["total", "2", "1,000,500", "200,020", "0", "0", "1,200,520", "$2.00",
                              "(1", "unpriced)"]
    rep = json.loads(cli("cost", "--by", "account", "--json", check=0).out)
    assert {r["key"]: r["usd"] for r in rep["rows"]} == {"ann": 2.0, "ben": 0.0}
    assert rep["total"]["unpriced_calls"] == 1
    sessions = json.loads(cli("cost", "--by", "session", "--json", check=0).out)["rows"]
    assert {r["key"] for r in sessions} == {a, b}
    day = cli("cost", "--by", "day", check=0).out.splitlines()
    assert day[0].startswith("DAY") and len(day) == 3
    assert "no model calls on the ledger since 2999-01-01" in cli("cost", "--since", "2999-01-01",
                                                                  check=0).out


def test_bad_report_flags(cli, home):
    refused(cli("cost", "--by", "colour"), 2, "invalid choice")
    refused(cli("cost", "--since", "last tuesday"), 2, "not a date")


def test_prices_table_and_json(cli, home):
    out = cli("cost", "prices", check=0).out
    assert out.splitlines()[0].split() == ["MODEL", "INPUT", "OUTPUT", "CACHE-READ", "CACHE-WRITE",
                                           "SOURCE"]
    line = next(x for x in out.splitlines() if x.startswith("claude-sonnet-4-5 "))
    assert line.split() == ["claude-sonnet-4-5", "3", "15", "0.3", "3.75", "default"]
    rows = json.loads(cli("cost", "prices", "--json", check=0).out)
    assert {"model": "gpt-4.1", "input": 2.0, "output": 8.0, "cache_read": 0.5, "cache_write": 0.0,
            "source": "default"} in rows


def test_set_price_then_prices_and_pricing(cli, home):
    proc = cli("cost", "set-price", "my-model", "--input", "$3", "--output", "15/MTok",
               "--cache-read", "0.3", check=0)
    assert proc.out == "my-model: input 3, output 15, cache read 0.3 (USD per million tokens, " \
                       "in cost.json)\n"
    row = next(r for r in json.loads(cli("cost", "prices", "--json", check=0).out)
               if r["model"] == "my-model")
    assert row == {"model": "my-model", "input": 3.0, "output": 15.0, "cache_read": 0.3,
                   "cache_write": None, "source": "cost.json"}
    line = next(x for x in cli("cost", "prices", check=0).out.splitlines()
                if x.startswith("my-model "))
    assert line.split() == ["my-model", "3", "15", "0.3", "-", "cost.json"]
    got = json.loads(cli("cost", "set-price", "my-model", "--input", "1", "--output", "2",
                         "--json", check=0).out)
    assert got == {"model": "my-model", "input": 1.0, "output": 2.0}
    line = cost.Meter(new_session(), None, None).charge("turn", "anthropic", "my-model-v2",
                                                        {"input_tokens": 1_000_000})
    assert line["usd"] == pytest.approx(1.0)
    assert [e["action"] for e in map(json.loads, (home / "audit.jsonl").read_text().splitlines())
            if e["action"].startswith("cost.")] == ["cost.price", "cost.price"]


@pytest.mark.parametrize("flags,says", [
    (["--input", "3usd/ktok", "--output", "1"], "not a price in USD per million tokens"),
    (["--input", "3/ktok", "--output", "1"], "not a price"),
    (["--input", "-1", "--output", "1"], "not a price"),
    (["--input", "nan", "--output", "1"], "not a price"),
    (["--input", "inf", "--output", "1"], "not a price"),
    (["--input", "1e400", "--output", "1"], "not a price"),
    (["--input", "three", "--output", "1"], "not a price"),
    (["--input", "1", "--output", "1", "--cache-read", "-0.1"], "not a price"),
    (["--input", "1"], "the following arguments are required: --output"),
])
def test_set_price_refuses_bad_input_and_writes_nothing(cli, home, flags, says):
    refused(cli("cost", "set-price", "m", *flags), 2, says)
    untouched(home)


def test_set_price_refuses_a_bad_model_id(cli, home):
    refused(cli("cost", "set-price", "has space", "--input", "1", "--output", "1"), 2,
            "not a model id")
    untouched(home)


def test_budget_show_set_clear_and_json(cli, home):
    out = cli("cost", "budget", check=0).out
    assert out == ("budget lines of the machine:\n  session-tokens  no line\n  session-usd     "
                   "no line\n  day-usd         no line\n  month-usd       no line\n")
    assert not (home / "cost.json").exists()                     # showing writes nothing
    out = cli("cost", "budget", "--session-tokens", "200,000", "--day-usd", "$5",
              "--month-usd", "0", check=0).out
    assert out.splitlines() == ["budget lines of the machine now:",
                                "  session-tokens  200,000 tokens", "  session-usd     no line",
                                "  day-usd         $5.00", "  month-usd       $0.0000"]
    got = json.loads(cli("cost", "budget", "--clear", "day-usd", "session_tokens", "--json",
                         check=0).out)
    assert got == {"scope": "config", "lines": {"month_usd": 0.0}, "changed": True}
    assert json.loads((home / "cost.json").read_text())["budget"] == {"month_usd": 0.0}
    assert json.loads(cli("cost", "budget", "--json", check=0).out)["changed"] is False


@pytest.mark.parametrize("flags,says", [
    (["--day-usd", "-1"], "not an amount of USD >= 0"),
    (["--session-usd", "nan"], "not an amount"),
    (["--month-usd", "inf"], "not an amount"),
    (["--day-usd", "5 EUR"], "not an amount"),
    (["--session-tokens", "1.5"], "not a whole number of tokens"),
    (["--session-tokens", "-10"], "not a whole number of tokens"),
    (["--clear", "weekly-usd"], "unknown budget line"),
    (["--day-usd", "3", "--clear", "day-usd"], "both set and cleared"),
])
def test_budget_refuses_bad_input_and_writes_nothing(cli, home, flags, says):
    refused(cli("cost", "budget", *flags), 2, says)
    untouched(home)


def add_account(cli, name):
    cli("users", "add", name, "--role", "operator", input=b"correct horse battery\n", check=0)


def test_users_budget_for_an_account(cli, home):
    add_account(cli, "ann")
    out = cli("users", "budget", "ann", "--day-usd", "3", "--session-usd", "0.5", check=0).out
    assert out.splitlines()[0] == "budget lines of ann now:"
    assert "  session-usd     $0.5000" in out and "  day-usd         $3.00" in out
    doc = json.loads((home / "cost.json").read_text())
    assert doc["accounts"] == {"ann": {"day_usd": 3.0, "session_usd": 0.5}} and doc["budget"] == {}
    got = json.loads(cli("users", "budget", "ann", "--json", check=0).out)
    assert got == {"scope": "account:ann", "lines": {"day_usd": 3.0, "session_usd": 0.5},
                   "changed": False}
    acts = [e for e in map(json.loads, (home / "audit.jsonl").read_text().splitlines())
            if e["action"] == "cost.budget"]
    assert len(acts) == 1 and acts[0]["scope"] == "account:ann"
    stop = cost.Meter(new_session(), None, "ann")
    stop.charge("turn", "anthropic", "claude-haiku-4-5", {"input_tokens": 600_000})
    assert stop.check("turn").source == "account: ann"


def test_users_budget_refuses_an_unknown_or_bad_account(cli, home):
    refused(cli("users", "budget", "nobody", "--day-usd", "3"), 1, "no account nobody")
    refused(cli("users", "budget", "Not A Name", "--day-usd", "3"), 2, "not an account name")
    refused(cli("users", "budget", "nobody"), 1, "no account nobody")
    assert not (home / "cost.json").exists()
    add_account(cli, "ann")
    refused(cli("users", "budget", "ann", "--month-usd", "-5"), 2, "not an amount")
    assert not (home / "cost.json").exists()


def test_help_says_where_state_lives(cli):
    for args in (["cost", "--help"], ["cost", "budget", "--help"], ["users", "budget", "--help"]):
        out = " ".join(cli(*args, check=0).out.split())
        assert "cost.json" in out and "docs/COST.md" in out, args
