"""Budget lines from each source (the machine's config, the folder's policy rule, the account),
the most restrictive winning with its source named, each measured in its own scope; the policy
key's validation; set_budget's validation and audit."""
import json
import os

import pytest

from overlord.errors import OverlordError, UsageError
from overlord.trust import cost
from overlord.trust import policy as P
from overlord.txn import store

HAIKU = "claude-haiku-4-5"
DOLLAR = {"input_tokens": 1_000_000, "output_tokens": 0}        # $1.00 a call


def new_session():
    sid = store.new_sid()
    os.makedirs(store.session_dir(sid))
    return sid


def put_policy(home, tmp_path, doc):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc))
    P.install(str(path))


def spend(meter, n=1, usage=DOLLAR):
    for _ in range(n):
        meter.charge("turn", "anthropic", HAIKU, usage)


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "srv" / "app"
    d.mkdir(parents=True)
    return str(d)


def audit(home, action):
    return [e for e in map(json.loads, (home / "audit.jsonl").read_text().splitlines())
            if e["action"] == action]


# -- each source ------------------------------------------------------------------------------

@pytest.mark.parametrize("key,limit,n", [("session_usd", 2, 2), ("day_usd", 3, 3),
                                         ("month_usd", 1.5, 2)])
def test_a_config_line_stops_the_session_once_reached(home, folder, key, limit, n):
    cost.set_budget("config", **{key: limit})
    meter = cost.Meter(new_session(), folder, None)
    for _ in range(n):
        assert meter.check("turn") is None
        spend(meter)
    stop = meter.check("turn")
    assert (stop.key, stop.limit, stop.source) == (key, limit, "config")
    assert stop.spent == pytest.approx(n)
    assert stop.message == f"the {key} budget of {cost.money(limit)} (config) is reached: " \
                           f"{cost.money(float(n))} spent"


def test_session_tokens_count_every_kind_of_token(home):
    cost.set_budget("config", session_tokens=1000)
    meter = cost.Meter(new_session(), None, None)
    spend(meter, usage={"input_tokens": 400, "output_tokens": 300, "cache_read_tokens": 200,
                        "cache_write_tokens": 99})
    assert meter.check("turn") is None                    # 999 < 1000
    spend(meter, usage={"input_tokens": 1, "output_tokens": 0})
    stop = meter.check("compaction")
    assert (stop.key, stop.spent, stop.limit) == ("session_tokens", 1000, 1000)
    assert stop.message == "the session_tokens budget of 1,000 tokens (config) is reached: " \
                           "1,000 tokens spent"


def test_an_unpriced_model_still_counts_against_session_tokens(home):
    cost.set_budget("config", session_tokens=10, session_usd=0.01)
    meter = cost.Meter(new_session(), None, None)
    meter.charge("turn", "openai-compatible", "unpriced-local", {"input_tokens": 50})
    stop = meter.check("turn")
    assert stop.key == "session_tokens"


def test_a_zero_line_stops_before_anything_is_spent(home):
    cost.set_budget("config", day_usd=0)
    stop = cost.Meter(new_session(), None, None).check("turn")
    assert (stop.key, stop.limit, stop.spent) == ("day_usd", 0, 0)


def test_session_lines_count_only_the_session(home):
    cost.set_budget("config", session_usd=1)
    first = cost.Meter(new_session(), None, None)
    spend(first)
    assert first.check("turn").key == "session_usd"
    assert cost.Meter(new_session(), None, None).check("turn") is None


def test_a_policy_line_names_the_rule_and_counts_the_folder(home, tmp_path, folder):
    other = tmp_path / "elsewhere"
    other.mkdir()
    put_policy(home, tmp_path, {"default": {"budget": {"session_usd": 5}},
                                "targets": {folder: {"budget": {"day_usd": 2}}}})
    here = cost.Meter(new_session(), folder, None)
    there = cost.Meter(new_session(), str(other), None)
    spend(there, 3)                                  # another folder's spend is not this rule's
    assert here.check("turn") is None
    assert there.check("turn") is None               # no day line there; session_usd 5 not reached
    spend(here, 2)
    stop = here.check("turn")
    assert (stop.key, stop.source, stop.scope) == ("day_usd", f"policy: targets[{folder}]",
                                                   cost.target_scope(folder))
    assert f"(policy: targets[{folder}])" in stop.message
    spend(there, 2)
    stop = there.check("turn")
    assert (stop.key, stop.source) == ("session_usd", "policy: default")


def test_a_policy_line_is_seen_through_a_subfolder_and_a_symlink(home, tmp_path, folder):
    sub = os.path.join(folder, "pkg")
    os.mkdir(sub)
    link = tmp_path / "link"
    os.symlink(folder, link)
    put_policy(home, tmp_path, {"targets": {folder: {"budget": {"session_usd": 1}}}})
    for where in (sub, str(link)):
        meter = cost.Meter(new_session(), where, None)
        spend(meter)
        assert meter.check("turn").source == f"policy: targets[{folder}]"


def test_an_account_line_counts_the_accounts_spend_only(home):
    cost.set_budget("account:ann", day_usd=2)
    ann = cost.Meter(new_session(), None, "ann")
    ben = cost.Meter(new_session(), None, "ben")
    spend(ben, 5)
    assert ann.check("turn") is None
    spend(ann)
    spend(cost.Meter(new_session(), None, "ann"))      # another session of hers
    stop = ann.check("review")
    assert (stop.key, stop.source, stop.scope) == ("day_usd", "account: ann", "account:ann")
    assert ben.check("turn") is None


# -- the most restrictive ---------------------------------------------------------------------

def test_of_each_key_the_tightest_line_wins_and_is_named(home, tmp_path, folder):
    cost.set_budget("config", session_usd=10)
    cost.set_budget("account:ann", session_usd=5)
    put_policy(home, tmp_path, {"targets": {folder: {"budget": {"session_usd": 3}}}})
    meter = cost.Meter(new_session(), folder, "ann")
    lines = cost.budget_lines(folder, "ann")
    assert sorted((x["limit"], x["source"]) for x in lines["session_usd"]) == \
        [(3, f"policy: targets[{folder}]"), (5, "account: ann"), (10, "config")]
    assert all(x["scope"] == "session" for x in lines["session_usd"])
    spend(meter, 3)
    stop = meter.check("turn")
    assert (stop.limit, stop.source) == (3, f"policy: targets[{folder}]")


def test_lines_in_different_scopes_compare_by_their_own_headroom(home):
    """config day_usd 10 against the machine's $6 (room 4); the account's day_usd 3 against
    her own $3 (room 0): the account's line is the one reached."""
    cost.set_budget("config", day_usd=10)
    cost.set_budget("account:ann", day_usd=3)
    spend(cost.Meter(new_session(), None, "ben"), 3)
    ann = cost.Meter(new_session(), None, "ann")
    spend(ann, 3)
    stop = ann.check("turn")
    assert (stop.source, stop.spent) == ("account: ann", 3)
    spend(cost.Meter(new_session(), None, "ben"), 5)   # the machine is now at $11: over too
    stop = ann.check("turn")
    assert stop.source == "config" and stop.spent == pytest.approx(11)


def test_with_no_line_nothing_stops(home, folder):
    meter = cost.Meter(new_session(), folder, "ann")
    spend(meter, 3)
    assert cost.budget_lines(folder, "ann") == {}
    assert meter.check("turn") is None


# -- the usage meter's spend ------------------------------------------------------------------

def test_meter_view_names_the_tightest_day_and_month_line(home):
    assert cost.meter_view("ann") == {
        "day": {"spent": 0.0, "limit": None, "source": None, "scope": "account:ann"},
        "month": {"spent": 0.0, "limit": None, "source": None, "scope": "account:ann"}}
    cost.set_budget("config", day_usd=10, month_usd=100)
    cost.set_budget("account:ann", day_usd=4)
    spend(cost.Meter(new_session(), None, "ann"), 2)
    spend(cost.Meter(new_session(), None, "ben"), 5)
    view = cost.meter_view("ann")       # her line has $2 left, the machine's $3
    assert view["day"] == {"spent": 2, "limit": 4, "source": "account: ann", "scope": "account:ann"}
    assert view["month"] == {"spent": 7, "limit": 100, "source": "config", "scope": "*"}
    assert cost.meter_view(None)["day"] == {"spent": 7, "limit": 10, "source": "config", "scope": "*"}
    spend(cost.Meter(new_session(), None, "ben"), 2)
    assert cost.meter_view("ann")["day"]["source"] == "config"      # now $1 left: the tighter


# -- setting lines ----------------------------------------------------------------------------

def test_set_budget_keeps_replaces_and_clears_and_is_audited(home):
    assert cost.set_budget("config", session_usd=2, day_usd=5) == {"session_usd": 2, "day_usd": 5}
    assert cost.set_budget("config", day_usd=0) == {"session_usd": 2, "day_usd": 0}
    assert cost.set_budget("config", session_usd=None, clear=("day_usd",)) == {"session_usd": 2}
    assert cost.budget("config") == {"session_usd": 2}
    cost.set_budget("account:ann", month_usd=50)
    assert cost.budget("account:ann") == {"month_usd": 50}
    cost.set_budget("account:ann", clear=("month_usd",))
    assert json.loads((home / "cost.json").read_text())["accounts"] == {}
    acts = audit(home, "cost.budget")
    assert [a["scope"] for a in acts] == ["config"] * 3 + ["account:ann"] * 2
    assert acts[2]["cleared"] == ["day_usd"] and acts[0]["set"] == {"session_usd": 2, "day_usd": 5}


@pytest.mark.parametrize("lines", [{"day_usd": -1}, {"session_usd": float("nan")},
                                   {"month_usd": float("inf")}, {"day_usd": True},
                                   {"session_tokens": 1.5}, {"session_tokens": -3},
                                   {"session_tokens": "100"}, {"weekly_usd": 3}])
def test_a_bad_line_is_refused_and_nothing_is_written(home, lines):
    with pytest.raises(UsageError):
        cost.set_budget("config", **lines)
    assert not (home / "cost.json").exists() and not (home / "audit.jsonl").exists()


def test_bad_scopes_and_clears_are_refused(home):
    for scope in ("global", "account:", "user:ann", None):
        with pytest.raises(UsageError):
            cost.set_budget(scope, day_usd=1)
    with pytest.raises(UsageError):
        cost.set_budget("config", clear=("hourly",))
    with pytest.raises(UsageError):
        cost.set_budget("config", day_usd=1, clear=("day_usd",))
    assert not (home / "cost.json").exists()


# -- the policy key ---------------------------------------------------------------------------

BAD_POLICY = [
    ({"budget": 5}, "default.budget must be an object of session_tokens"),
    ({"budget": {"weekly_usd": 1}}, "default.budget: unknown budget line 'weekly_usd'"),
    ({"budget": {"day_usd": -1}}, "default.budget.day_usd must be a finite number of USD >= 0"),
    ({"budget": {"day_usd": "5"}}, "default.budget.day_usd must be a finite number"),
    ({"budget": {"month_usd": True}}, "default.budget.month_usd must be a finite number"),
    ({"budget": {"session_tokens": 2.5}}, "default.budget.session_tokens must be a whole number"),
    ({"budget": {"session_tokens": -1}}, "default.budget.session_tokens must be a whole number"),
]


@pytest.mark.parametrize("rule,says", BAD_POLICY, ids=[s for _, s in BAD_POLICY])
def test_the_policy_budget_key_is_validated(home, rule, says):
    with pytest.raises(OverlordError, match=says.replace("[", r"\[")):
        P.parse(json.dumps({"default": rule}).encode(), "/p.json")


@pytest.mark.parametrize("text", ['{"default": {"budget": {"day_usd": NaN}}}',
                                  '{"default": {"budget": {"day_usd": Infinity}}}',
                                  '{"default": {"budget": {"session_usd": 1e999}}}'])
def test_the_policy_budget_key_refuses_non_finite_numbers(home, text):
    with pytest.raises(OverlordError, match="must be a finite number"):
        P.parse(text.encode(), "/p.json")


def test_a_policy_rule_without_budget_is_empty_and_a_budget_merges_per_line(home, tmp_path, folder):
    assert P.rule(folder)["budget"] == {}
    put_policy(home, tmp_path, {"default": {"budget": {"day_usd": 9, "session_usd": 2}},
                                "targets": {folder: {"budget": {"session_usd": 1}}}})
    rule = P.rule(folder)
    assert rule["budget"] == {"day_usd": 9, "session_usd": 1}
    assert rule.source("budget.session_usd") == f"targets[{folder}]"
    assert rule.source("budget.day_usd") == "default"


def test_a_broken_live_policy_fails_the_check_closed(home, folder):
    (home / "policy.json").write_text('{"default": {"budget": {"day_usd": -1}}}')
    os.chmod(home / "policy.json", 0o600)
    with pytest.raises(OverlordError, match="budget.day_usd"):
        cost.Meter(new_session(), folder, None).check("turn")
