"""ops.usage_meter: the providers' own rate-limit readings (ratelimit.json, as agent/ratelimit
records them from a reply's headers) parsed into numbers, only real readings shown; and the
ledger's spend against the day and month lines."""
import json
import os

import pytest

from overlord import ops
from overlord.agent import ratelimit
from overlord.trust import cost
from overlord.txn import store


def test_no_reading_means_no_provider_and_no_line_means_no_limit(home):
    meter = ops.usage_meter(None)
    assert meter["rate"] == {}
    assert meter["spend"] == {"day": {"spent": 0.0, "limit": None, "source": None, "scope": "*"},
                              "month": {"spent": 0.0, "limit": None, "source": None, "scope": "*"}}


def test_anthropic_headers_every_group(home):
    headers = {}
    for group in ("requests", "tokens", "input-tokens", "output-tokens"):
        headers[f"anthropic-ratelimit-{group}-limit"] = "4000"
        headers[f"anthropic-ratelimit-{group}-remaining"] = "3999"
        headers[f"anthropic-ratelimit-{group}-reset"] = "2026-12-02T03:21:00Z"
    headers["Retry-After"] = "7"
    headers["content-type"] = "text/event-stream"          # not a rate-limit header: never kept
    ratelimit.record("anthropic", headers)
    reading = ops.usage_meter(None)["rate"]["anthropic"]
    assert set(reading) == {"at", "requests", "tokens", "input_tokens", "output_tokens",
                            "retry_after"}
    for group in ("requests", "tokens", "input_tokens", "output_tokens"):
        assert reading[group]["limit"] == 4000 and reading[group]["remaining"] == 3999
        assert reading[group]["reset"] == "2026-12-02T03:21:00Z"
        assert isinstance(reading[group]["reset_seconds"], float)
    assert reading["retry_after"] == 7
    assert reading["at"] == json.loads((home / "ratelimit.json").read_text())["anthropic"]["at"]


def test_openai_headers_and_their_durations(home):
    ratelimit.record("openai", {"x-ratelimit-limit-requests": "500",
                                "x-ratelimit-remaining-requests": "499",
                                "x-ratelimit-reset-requests": "120ms",
                                "x-ratelimit-limit-tokens": "30000",
                                "x-ratelimit-remaining-tokens": "29000.5",
                                "x-ratelimit-reset-tokens": "6m0s"})
    reading = ops.usage_meter(None)["rate"]["openai"]
    assert reading["requests"] == {"limit": 500, "remaining": 499, "reset": "120ms",
                                   "reset_seconds": 0.12}
    assert reading["tokens"] == {"limit": 30000, "remaining": 29000.5, "reset": "6m0s",
                                 "reset_seconds": 360.0}
    assert "input_tokens" not in reading and reading["retry_after"] is None


def test_odd_values_stay_text_and_unknown_headers_are_left_out(home):
    ratelimit.record("azure", {"x-ratelimit-remaining-requests": "lots",
                               "x-ratelimit-reset-tokens": "soon",
                               "x-ratelimit-remaining-bananas": "3", "retry-after-ms": "1500"})
    reading = ops.usage_meter(None)["rate"]["azure"]
    assert reading["requests"] == {"limit": None, "remaining": "lots", "reset": None}
    assert reading["tokens"] == {"limit": None, "remaining": None, "reset": "soon"}
    assert reading["retry_after"] == 1.5


def test_a_damaged_or_empty_ratelimit_file_shows_no_reading(home):
    (home / "ratelimit.json").write_text("{broken")
    assert ops.usage_meter(None)["rate"] == {}
    (home / "ratelimit.json").write_text(json.dumps({"openai": {"headers": {}}, "x": "y",
                                                     "gemini": {"headers": "no"}}))
    assert ops.usage_meter(None)["rate"] == {}


def test_spend_against_the_lines(home):
    cost.set_budget("config", day_usd=10, month_usd=40)
    sid = store.new_sid()
    os.makedirs(store.session_dir(sid))
    cost.Meter(sid, None, "ann").charge("turn", "anthropic", "claude-haiku-4-5",
                                        {"input_tokens": 3_000_000})
    spend = ops.usage_meter("ann")["spend"]
    assert spend["day"] == {"spent": pytest.approx(3), "limit": 10, "source": "config", "scope": "*"}
    assert spend["month"]["limit"] == 40
    ops.cost_budget("config", clear=("month_usd",))
    assert ops.usage_meter("ann")["spend"]["month"]["limit"] is None
