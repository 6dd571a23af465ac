"""The usage meter in the workspace rail, in a real browser (Playwright + Debian's Chromium)
against `overlord ui`: the provider's own rate-limit headroom (OVERLORD_HOME/ratelimit.json, as
agent/ratelimit.py records a reply's headers) and the ledger's spend against the day_usd and
month_usd lines (`overlord cost budget`), priced by `overlord cost set-price`.

States: no reading yet and no budget line (the rows say so, no bar invents a number); a real
conversation with a fake Anthropic endpoint whose reply states its limits: the meter refreshes
when the chat's run ends, tokens plenty (ok), requests under a tenth (red), the day's spend
under a quarter left (amber) with the line's source on hover; lines lowered past the spend
turn red; OpenAI-shaped readings seeded through the real recorder: amber, red, a duration
reset and a 429's retry-after. Every state is in words too (not only colour)."""
import json
import time

import pytest

from conftest import Ovl
from weblib import AnthropicFake, require_kernel, ui  # noqa: F401
from test_browser import Pages, browser, fake, no_overflow, pages  # noqa: F401 -- fixtures

try:
    from playwright.sync_api import expect
except ImportError:                     # pragma: no cover - test_browser's fixture skips then
    expect = None

MODEL = AnthropicFake.MODEL


@pytest.fixture
def cli(home):
    return Ovl(home)


def row(page, key):
    return page.locator(f'#meter [data-meter="{key}"]')


def open_workspace(page, ui):
    page.goto(ui.link)
    expect(page.locator("#welcome")).to_be_visible()
    expect(page.locator('#meter[data-loaded="1"]')).to_be_attached()


def iso_in(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


def test_no_reading_yet_and_no_budget_line(ui, pages):
    """A fresh machine: no provider has replied, no line is set. The rows say so; no bar."""
    usage = ui.ok("GET", "/api/usage")
    assert usage["rate"] == {}
    assert usage["spend"]["day"]["limit"] is None and usage["spend"]["month"]["limit"] is None
    page = pages()
    open_workspace(page, ui)
    for key in (":tokens", ":requests"):
        expect(row(page, key)).to_contain_text("no reading yet")
        expect(row(page, key)).to_have_class("meter-row meter-none")
    for key in ("day", "month"):
        expect(row(page, key)).to_contain_text("$0.00 spent")
        expect(row(page, key)).to_contain_text("no budget line")
    expect(page.locator("#meter progress")).to_have_count(0)
    expect(page.locator("#meter")).to_contain_text("A provider states its limits on its first reply")


def test_a_conversations_reading_and_spend_fill_the_meter(ui, fake, cli, pages, target):
    """One real turn: the fake endpoint charges 500,000 input tokens at $1.60/MTok ($0.80)
    against a $1.00 day line and a $10.00 month line, and states 90,000 of 100,000 tokens and
    4 of 50 requests left. The open page's meter changes when the run ends, unreloaded."""
    require_kernel()
    cli("cost", "set-price", MODEL, "--input", "1.6", "--output", "0", "--cache-read", "0",
        "--cache-write", "0", check=0)
    cli("cost", "budget", "--day-usd", "1", "--month-usd", "10", check=0)
    answer = fake.turn(text="Nothing to change here.", usage={"input_tokens": 500000, "output_tokens": 0})
    answer.headers = {"anthropic-ratelimit-tokens-limit": "100000",
                      "anthropic-ratelimit-tokens-remaining": "90000",
                      "anthropic-ratelimit-tokens-reset": iso_in(40),
                      "anthropic-ratelimit-requests-limit": "50",
                      "anthropic-ratelimit-requests-remaining": "4",
                      "anthropic-ratelimit-requests-reset": iso_in(20)}
    fake.queue(answer)
    ui.use(fake)
    page = pages()
    open_workspace(page, ui)
    expect(row(page, ":tokens")).to_contain_text("no reading yet")
    expect(row(page, "day")).to_contain_text("$1.00 of $1.00 left")
    expect(row(page, "day").locator(".meter-note")).to_contain_text("$0.00 spent")
    expect(row(page, "day")).to_have_class("meter-row meter-spend meter-ok")
    page.fill("#prompt", "Look around")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible()
    # the meter refreshed when the run ended: the provider's own reading, the ledger's spend
    tokens, requests = row(page, "anthropic:tokens"), row(page, "anthropic:requests")
    expect(tokens).to_contain_text("90,000 of 100,000 left")
    expect(tokens).to_have_class("meter-row meter-ok")
    expect(tokens.locator(".meter-reset")).to_contain_text("resets at")
    expect(requests).to_contain_text("4 of 50 left")
    expect(requests.locator(".meter-words")).to_have_text("under a tenth left")
    expect(requests).to_have_class("meter-row meter-red")
    assert requests.locator("progress").get_attribute("value") == "4"
    assert requests.locator("progress").get_attribute("max") == "50"
    day, month = row(page, "day"), row(page, "month")
    expect(day).to_contain_text("$0.20 of $1.00 left")
    expect(day.locator(".meter-note")).to_contain_text("under a quarter left \u00b7 $0.80 spent")
    expect(day).to_have_class("meter-row meter-spend meter-amber")
    assert day.get_attribute("title") == "the day_usd line of $1.00 is set by the machine's budget (overlord cost budget)"
    expect(month).to_contain_text("$9.20 of $10.00 left")
    expect(month.locator(".meter-words")).to_have_count(0)
    expect(month).to_have_class("meter-row meter-spend meter-ok")
    usage = ui.ok("GET", "/api/usage")
    assert usage["rate"]["anthropic"]["requests"]["remaining"] == 4
    assert usage["spend"]["day"]["limit"] == 1 and round(usage["spend"]["day"]["spent"], 6) == 0.8
    # lines lowered past the spend: red, in words too
    cli("cost", "budget", "--day-usd", "0.85", "--month-usd", "0.5", check=0)
    page.reload()
    expect(row(page, "day").locator(".meter-words")).to_have_text("under a tenth left")
    expect(row(page, "day")).to_have_class("meter-row meter-spend meter-red")
    expect(row(page, "month")).to_contain_text("$0.00 of $0.50 left")
    expect(row(page, "month").locator(".meter-note")).to_contain_text("none left \u00b7 $0.80 spent")
    expect(row(page, "month")).to_have_class("meter-row meter-spend meter-red")


def test_openai_readings_amber_red_a_duration_reset_and_retry_after(ui, home, pages):
    """Readings as OpenAI states them (x-ratelimit-*, resets as durations, a 429's
    retry-after), recorded by the agent's own recorder: 30,000 of 150,000 tokens (amber),
    9 of 100 requests (red)."""
    from overlord.agent import ratelimit
    ratelimit.record("openai", {"x-ratelimit-limit-tokens": "150000", "x-ratelimit-remaining-tokens": "30000",
                                "x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-limit-requests": "100",
                                "x-ratelimit-remaining-requests": "9", "x-ratelimit-reset-requests": "1s",
                                "retry-after": "20"})
    ratelimit.record("anthropic", {"anthropic-ratelimit-requests-remaining": "49"})     # no limit stated
    saved = json.loads((home / "ratelimit.json").read_text())
    assert saved["openai"]["headers"]["x-ratelimit-remaining-tokens"] == "30000"
    page = pages()
    open_workspace(page, ui)
    tokens, requests = row(page, "openai:tokens"), row(page, "openai:requests")
    expect(tokens).to_contain_text("30,000 of 150,000 left")
    expect(tokens.locator(".meter-words")).to_have_text("under a quarter left")
    expect(tokens).to_have_class("meter-row meter-amber")
    expect(tokens.locator(".meter-reset")).to_have_text("resets in 6m0s")
    expect(requests).to_contain_text("9 of 100 left")
    expect(requests.locator(".meter-words")).to_have_text("under a tenth left")
    expect(requests).to_have_class("meter-row meter-red")
    assert "under a tenth left" in requests.locator("progress").get_attribute("aria-label")
    expect(page.locator('#meter [data-provider="openai"] .meter-retry')).to_have_text("Told to wait: retry after 20 s")
    expect(page.locator('#meter [data-provider="openai"] .meter-when')).to_contain_text("read just now")
    # on a phone the meter is in the rail's drawer, whole, without a horizontal scroll
    phone = pages(390, 844)
    open_workspace(phone, ui)
    phone.click("#rail-open")
    expect(row(phone, "openai:requests")).to_be_in_viewport()
    no_overflow(phone)
    # a remaining count without its limit: the count, no bar, and the words say so
    partial = row(page, "anthropic:requests")
    expect(partial).to_contain_text("49 left")
    expect(partial).to_contain_text("the provider did not state the limit")
    expect(partial.locator("progress")).to_have_count(0)
    expect(row(page, "anthropic:tokens")).to_contain_text("no reading yet")
