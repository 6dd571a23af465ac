"""Explainable denials in the workspace: a tool result the sandbox refused (its `denial`:
{cause, line}) is drawn as its own card -- class tool-denied, a "blocked" status, the line in
view without opening the card -- and an ordinary failed tool result is not.

A jailed conversation on the kernel backend (the scripted provider plays the model) runs one
call per cause the jail can show without a grant (a seccomp refusal, a path outside the jail,
the read-only system tree, no network) and one ordinary failure; then the browser shows the
cards, over the live stream and again after a reload (from the transcript).
"""
import json
import os

import pytest

from weblib import REPO, UI, records, require_kernel  # noqa: F401
from test_browser import browser, no_overflow, open_workspace, pages, shot  # noqa: E402,F401

try:                                    # the browser tests skip without Playwright (pages)
    from playwright.sync_api import expect
except ImportError:                     # pragma: no cover - depends on the host
    expect = None

from overlord.web import chats as C

PY = "/usr/bin/python3"      # inside the jail: the system's python
SITE = """import os
if os.environ.get("OVERLORD_TEST_SCRIPT"):
    from overlord.web import settings
    settings.DEMO_SCRIPT = os.environ["OVERLORD_TEST_SCRIPT"]
"""
CALLS = [
    ("seccomp", "unshare -U true", "blocked by the sandbox: unshare(2) is refused by the seccomp filter"),
    ("outside", "ls /sys/kernel", "blocked: /sys does not exist inside the jail"),
    ("readonly", "touch /usr/overlord-denial-probe", "blocked: /usr is read-only inside the jail"),
    ("network", f"{PY} -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=5)'",
     "blocked: no network in this session (net=none)"),
    (None, "ls no-such-file-here", None),                      # an ordinary failure: no line
]
WORDS = {"seccomp": "seccomp filter", "outside": "outside the jail", "readonly": "read-only system",
         "network": "no network"}


def turns():
    calls = [{"name": "shell", "input": {"command": cmd}} for _, cmd, _ in CALLS]
    return {"model": "overlord-test", "turns": [
        {"text": "Probing the sandbox.", "tool_calls": calls, "usage": {"input_tokens": 1, "output_tokens": 1}},
        {"text": "Four were blocked by the sandbox, one failed on its own.",
         "usage": {"input_tokens": 1, "output_tokens": 1}}]}


@pytest.fixture
def jailed(home, target, tmp_path):
    require_kernel()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    (tmp_path / "script.json").write_text(json.dumps(turns()))
    server = UI(home, target, env={"PYTHONPATH": f"{site}{os.pathsep}{REPO}",
                                   "OVERLORD_TEST_SCRIPT": str(tmp_path / "script.json")})
    server.ok("PUT", "/api/settings", {"provider": "scripted", "sandbox": {"jail": True, "net": "none"}})
    yield server
    server.close()


def test_a_denied_result_carries_its_denial_to_the_page_and_a_failure_does_not(jailed):
    ui = jailed
    sid = ui.ok("POST", "/api/chats", {"message": "probe the sandbox"})["sid"]
    with ui.events(sid, timeout=120) as ev:
        ev.until(lambda n, d: n == "state" and not d["running"])
        live = records(ev.seen, "tool_result")
    snap = ui.ok("GET", f"/api/chats/{sid}")["records"]
    for results in (live, [r for r in snap if r["type"] == "tool_result"]):
        assert len(results) == len(CALLS)
        for r, (cause, _, line) in zip(results, CALLS):
            if cause is None:
                assert r["denial"] is None and r["exit_code"] == 2, r
            else:
                assert r["denial"] == {"cause": cause, "line": line}, r
                assert r["output"].startswith(line + "\n"), r["output"]
    assert not os.path.exists("/usr/overlord-denial-probe")


def test_the_view_of_a_denial_keeps_only_a_cause_and_a_line():
    def view(denial):
        event = {"type": "tool_result", "call": "c", "tool": "shell", "result": {"content": "x"}}
        if denial is not ...:
            event["denial"] = denial
        return C.view_of(event, 0)["denial"]
    assert view(...) is None
    assert view({"cause": "seccomp", "line": "blocked by the sandbox: x", "syscall": "mount",
                 "evidence": "stderr"}) == {"cause": "seccomp", "line": "blocked by the sandbox: x"}
    assert view({"cause": "<script>", "line": "blocked: y"}) == {"cause": "other", "line": "blocked: y"}
    for bad in (None, "blocked", ["seccomp"], {"cause": "disk"}, {"cause": "disk", "line": 5}):
        assert view(bad) is None, bad
    assert len(view({"cause": "disk", "line": "b" * 5000})["line"]) == 2000


def test_a_denial_is_its_own_card_style_in_the_browser(jailed, tmp_path, pages):
    ui = jailed
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "probe the sandbox")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible(timeout=120000)
    cards = page.locator("details.tool")
    denied = page.locator("details.tool.tool-denied")

    def check():
        expect(cards).to_have_count(len(CALLS))
        expect(denied).to_have_count(4)
        for i, (cause, _, line) in enumerate(CALLS):
            card = cards.nth(i)
            if cause is None:
                expect(card).not_to_have_class("tool tool-denied")
                expect(card.locator(".tool-status")).to_have_text("exit 2")
                expect(card.locator(".tool-status")).to_have_class("tool-status fail")
                expect(card.locator(".denial-line")).to_have_count(0)
                continue
            expect(card).to_have_class("tool tool-denied")
            expect(card.locator(".tool-status")).to_have_text("blocked")
            expect(card.locator(".tool-status")).to_have_class("tool-status blocked")
            # the line in view while the card is closed, with its cause in words
            expect(card.locator(".denial-line")).to_be_visible()
            expect(card.locator(".denial-text")).to_have_text(line)
            expect(card.locator(".denial-cause")).to_have_text(WORDS[cause])
            assert card.get_attribute("open") is None
        # distinct from an ordinary failure, not only by its class: its look differs
        style = "el => { const s = getComputedStyle(el); return [s.borderLeftColor, s.borderLeftWidth, s.backgroundColor]; }"
        blocked, failed = denied.first.evaluate(style), cards.nth(len(CALLS) - 1).evaluate(style)
        assert blocked != failed, (blocked, failed)
        status = "el => getComputedStyle(el).backgroundColor"
        assert denied.first.locator(".tool-status").evaluate(status) != \
            cards.nth(len(CALLS) - 1).locator(".tool-status").evaluate(status)

    check()
    denied.first.locator("summary").click()
    expect(denied.first.locator(".tool-output")).to_contain_text("unshare failed")
    shot(page, "workspace-denials-1440.png", tmp_path)
    page.reload()                           # from the transcript, the same cards
    check()
    phone = pages(390, 844)
    phone.goto(f"{ui.base}/?token={ui.token}#{page.evaluate('location.hash.slice(1)')}")
    expect(phone.locator("details.tool.tool-denied")).to_have_count(4)
    expect(phone.locator(".denial-text").first).to_be_visible()
    no_overflow(phone)
