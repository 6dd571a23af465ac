"""Connectors in the workspace, against the real @modelcontextprotocol/server-everything (stdio)
and the scripted provider playing the model: the configured servers for the welcome screen's
checkboxes, a conversation granted one, the approval gate as a card (the exact call, decided
once), a pending approval surviving a reload, Stop at the gate within 2 s, and a person in a
real browser allowing one card and denying another.

`echo` is read-only by the server's claim (it runs without asking); `toggle-simulated-logging`
is not, so it waits at the gate. The script the model follows is the test's own: a
sitecustomize on the server's PYTHONPATH points the workspace's demo provider at it.
"""
import json
import os
import sys
import threading
import time

import pytest

from weblib import REPO, UI, records, require_kernel, ui  # noqa: F401

sys.path.insert(0, os.path.join(REPO, "test", "connectors"))
from servers import everything_argv  # noqa: E402
from test_browser import browser, expect, no_overflow, open_workspace, pages, shot  # noqa: E402,F401

from overlord import ops  # noqa: E402
from overlord.errors import OverlordError  # noqa: E402
from overlord.web import chats as C  # noqa: E402

TOGGLE = "mcp__everything__toggle-simulated-logging"
ECHO = "mcp__everything__echo"
ODD = "<img src=x onerror=\"window.__pwned = 1\"> & \u00e9t\u00e9"      # model-chosen text
SITE = """import os
if os.environ.get("OVERLORD_TEST_SCRIPT"):
    from overlord.web import settings
    settings.DEMO_SCRIPT = os.environ["OVERLORD_TEST_SCRIPT"]
"""


def script(*turns):
    return {"model": "overlord-test", "turns": [dict(t, usage={"input_tokens": 1, "output_tokens": 1})
                                                for t in turns]}


GATED = script(
    {"text": "First, toggle the logging.", "tool_calls": [{"name": TOGGLE, "input": {"note": ODD}}]},
    {"text": "Echo, then toggle it back.",
     "tool_calls": [{"name": ECHO, "input": {"message": "hello from the model"}},
                    {"name": TOGGLE, "input": {"note": "back"}}]},
    {"text": "Both asked; see the record."})


def configure(home, servers=None, approval="ask"):
    if servers is None:
        argv = everything_argv()
        servers = {"everything": {"command": argv[0], "args": argv[1:], "env": {}}}
    path = os.path.join(str(home), "mcp.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"approval": approval, "servers": servers}, f)
    os.chmod(path, 0o600)


def serve(home, target, tmp_path, turns=GATED):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    (tmp_path / "script.json").write_text(json.dumps(turns))
    server = UI(home, target, env={"PYTHONPATH": f"{site}{os.pathsep}{REPO}",
                                   "OVERLORD_TEST_SCRIPT": str(tmp_path / "script.json")})
    server.ok("PUT", "/api/settings", {"provider": "scripted"})
    return server


@pytest.fixture
def gated(home, target, tmp_path):
    require_kernel()
    configure(home)
    server = serve(home, target, tmp_path)
    yield server
    server.close()


def start(ui, connectors=("everything",), message="toggle it"):
    r = ui.post("/api/chats", {"message": message, "connectors": list(connectors)})
    assert r.status == 200, r.body
    return r.json["sid"]


def approval(ev):
    """The next approval the run waits on (from a live event or a fresh snapshot)."""
    def found(name, data):
        return name == "approval" or name == "snapshot" and data.get("pending")
    ev.until(found)
    name, data = ev.seen[-1]
    return data if name == "approval" else data["pending"]


def decide(ui, sid, pending, allow, change=None):
    body = {"call": pending["call"], "fingerprint": pending["fingerprint"], "allow": allow,
            "request": pending.get("request")}                      # as the page sends it
    body.update(change or {})
    return ui.post(f"/api/chats/{sid}/approval", body)


# -- the configured connectors ---------------------------------------------------------------------

def test_the_configured_connectors_are_listed_without_their_secrets(home, target, tmp_path):
    configure(home, {"everything": {"command": "/usr/bin/node", "args": ["x.js"],
                                    "env": {"TOKEN": "s3cr3t-env-value-123456"}},
                     "docs": {"url": "https://docs.example/mcp?key=s3cr3t-query",
                              "headers": {"Authorization": "Bearer s3cr3t-header-value-789"}}},
              approval="readonly")
    ui = UI(home, target)
    try:
        r = ui.get("/api/connectors")
        assert r.status == 200, r.body
        data = r.json
        assert data["approval"] == "readonly"
        assert {c["name"]: c["transport"] for c in data["connectors"]} == {"everything": "stdio",
                                                                           "docs": "http"}
        shown = {s["name"]: s for s in data["servers"]}
        assert shown["everything"]["command"] == "/usr/bin/node" and shown["everything"]["args"] == ["x.js"]
        assert shown["docs"]["url"].startswith("https://docs.example/mcp?key=")
        assert b"s3cr3t" not in r.body
    finally:
        ui.close()


def test_none_configured_is_an_empty_list(ui):
    assert ui.ok("GET", "/api/connectors") == {"connectors": [], "approval": "ask", "servers": []}


def test_an_unknown_or_malformed_grant_is_refused_before_anything_opens(gated):
    ui = gated
    r = ui.post("/api/chats", {"message": "go", "connectors": ["nope"]})
    assert r.status == 400, r.body
    assert "nope" in r.json["error"] and "everything" in r.json["error"], r.json
    for bad in ("everything", [1], ["x" * 65], [""]):
        r = ui.post("/api/chats", {"message": "go", "connectors": bad})
        assert r.status == 400 and r.json["field"] == "connectors", (bad, r.body)
    assert ui.ok("GET", "/api/chats")["chats"] == []


# -- the approval gate -----------------------------------------------------------------------------

def test_the_gate_asks_for_exactly_one_call_and_records_who_decided(gated):
    ui = gated
    sid = start(ui)
    with ui.events(sid) as ev:
        first = approval(ev)
        assert first["server"] == "everything" and first["tool"] == "toggle-simulated-logging"
        assert first["offered"] == TOGGLE and first["input"] == {"note": ODD}
        assert first["readonly_claim"] is False and len(first["fingerprint"]) == 64
        # the header says which connectors the conversation holds
        assert ui.ok("GET", f"/api/chats/{sid}")["chat"]["connectors"] == ["everything"]
        # a reload while it waits: the snapshot still holds the card
        with ui.events(sid) as again:
            name, snap = again.next()
            assert name == "snapshot" and snap["running"] and snap["pending"] == first
            asked = [r for r in snap["records"] if r["type"] == "approval_requested"]
            assert [(r["call"], r["fingerprint"], r["input"]) for r in asked] == \
                [(first["call"], first["fingerprint"], {"note": ODD})]
        # an approval authorizes one call: another fingerprint or call id is not this one
        other = "0" * 64 if first["fingerprint"] != "0" * 64 else "1" * 64
        r = decide(ui, sid, first, True, {"fingerprint": other})
        assert r.status == 409 and "exactly one call" in r.json["error"], r.body
        r = decide(ui, sid, first, True, {"call": "call_9_9"})
        assert r.status == 409, r.body
        for bad in ({"allow": "yes"}, {"fingerprint": "xyz"}, {"call": 7}):
            assert decide(ui, sid, first, True, bad).status == 400, bad
        assert decide(ui, sid, first, True).status == 200
        r = decide(ui, sid, first, False)                   # once decided, decided
        assert r.status == 409 and "already allowed" in r.json["error"], r.body
        # echo runs without asking (read-only by the server's claim); the second toggle asks
        # again, though its server and tool are the same
        second = approval(ev)
        assert second["call"] != first["call"] and second["input"] == {"note": "back"}
        assert second["fingerprint"] != first["fingerprint"]
        assert decide(ui, sid, second, False).status == 200
        ev.until(lambda n, d: n == "state" and not d["running"])
        seen = ev.seen
    with ui.events(sid) as ev:
        recs = records(ev.until(lambda n, d: n == "snapshot"))
    decisions = [(r["call"], r["allow"], r["by"]) for r in recs if r["type"] == "approval"]
    assert (first["call"], True, "workspace") in decisions
    assert (second["call"], False, "workspace") in decisions
    echo = [r for r in recs if r["type"] == "approval" and r["call"] not in (first["call"], second["call"])]
    assert len(echo) == 1 and echo[0]["allow"] and "readOnlyHint" in echo[0]["by"]
    results = {r["call"]: r for r in recs if r["type"] == "tool_result"}
    allowed, denied = results[first["call"]], results[second["call"]]
    assert not allowed["is_error"] and "logging" in allowed["output"].lower()
    assert allowed["connector"]["server"] == "everything" and len(allowed["connector"]["sha256"]) == 64
    assert denied["is_error"] and "Denied" in denied["output"] and "not sent" in denied["output"]
    assert "hello from the model" in results[echo[0]["call"]]["output"]
    calls = [r for r in recs if r["type"] == "tool_call"]
    assert all(c["connector"]["server"] == "everything" for c in calls)
    assert [r["reason"] for r in recs if r["type"] == "done"] == ["end_turn"]
    assert any(n == "decision" for n, _ in seen)
    # the run is over: nothing waits any more
    assert decide(ui, sid, second, True).status == 409
    r = decide(ui, sid, {"call": "call_1_0", "fingerprint": "a" * 64}, True)
    assert r.status == 409 and "nothing" in r.json["error"], r.body


def test_stop_at_the_gate_ends_the_run_within_two_seconds(gated):
    ui = gated
    sid = start(ui)
    with ui.events(sid) as ev:
        pending = approval(ev)
        took = ui.stop(sid, ev)
        seen = ev.seen
    assert took < 2.0, took
    assert ("decision", {"call": pending["call"], "allow": None}) in seen
    assert records(seen, "done")[-1]["reason"] == "cancelled"
    result = [r for r in records(seen, "tool_result") if r["call"] == pending["call"]][-1]
    assert result["cancelled"] and "Not run" in result["output"]
    snap = ui.ok("GET", f"/api/chats/{sid}")
    assert snap["pending"] is None and not snap["chat"]["running"]
    assert decide(ui, sid, pending, True).status == 409


def test_stop_during_a_connector_call_ends_the_run_within_two_seconds(home, target, tmp_path):
    require_kernel()
    configure(home)
    slow = {"name": "mcp__everything__trigger-long-running-operation", "input": {"duration": 60, "steps": 60}}
    ui = serve(home, target, tmp_path, script({"text": "a long one", "tool_calls": [slow]}, {"text": "never"}))
    try:
        sid = start(ui, message="wait for it")
        with ui.events(sid) as ev:
            ev.until(lambda n, d: n == "record" and d.get("type") == "approval")   # allowed: it is in flight
            took = ui.stop(sid, ev)
            seen = ev.seen
        assert took < 2.0, took
        assert records(seen, "done")[-1]["reason"] == "cancelled"
        (result,) = records(seen, "tool_result")
        assert result["cancelled"] and result["is_error"]
    finally:
        ui.close()
    results = [a for a in map(json.loads, (home / "audit.jsonl").read_text().splitlines())
               if a["action"] == "connector.result"]
    assert results[-1]["cancelled"] is True


# -- Chats' approver on its own --------------------------------------------------------------------

class Request:
    def __init__(self, call="call_1_0", fp="ab" * 32):
        self.sid, self.turn, self.call, self.server, self.tool = "20260101-000000-abcdef", 1, call, "s", "t"
        self.offered, self.input, self.fingerprint, self.readonly_claim = "mcp__s__t", {"a": 1}, fp, False


@pytest.fixture
def chats(monkeypatch):
    monkeypatch.setattr(C, "_chat_session", lambda sid: None)
    return C.Chats(None)


def wait_pending(chats, sid):
    ch = chats.channel(sid)
    with ch.cond:
        assert ch.cond.wait_for(lambda: ch.pending is not None, 10)
        return dict(ch.pending)


def test_the_approver_returns_the_decision_for_exactly_its_call(chats):
    cancel, box = ops.Cancel(), {}
    req = Request()
    t = threading.Thread(target=lambda: box.update(d=chats.approver(req, cancel)))
    t.start()
    pending = wait_pending(chats, req.sid)
    assert pending["input"] == {"a": 1} and pending["fingerprint"] == req.fingerprint
    with pytest.raises(OverlordError) as exc:
        chats.decide(req.sid, {"call": req.call, "fingerprint": "cd" * 32, "allow": True})
    assert exc.value.http_status == 409
    token = pending["request"]
    assert chats.decide(req.sid, {"call": req.call, "fingerprint": req.fingerprint, "allow": False,
                                  "request": token})
    t.join(5)
    assert box["d"] == ops.Decision(allow=False, by="workspace", note=None)
    with pytest.raises(OverlordError) as exc:
        chats.decide(req.sid, {"call": req.call, "fingerprint": req.fingerprint, "allow": True,
                               "request": token})
    assert exc.value.http_status == 409 and "already denied" in str(exc.value)


def test_the_approver_raises_cancelled_when_the_run_is_stopped(chats):
    cancel, box = ops.Cancel(), {}
    req = Request()

    def wait():
        try:
            chats.approver(req, cancel)
        except ops.Cancelled:
            box["cancelled"] = time.monotonic()
    t = threading.Thread(target=wait)
    t.start()
    wait_pending(chats, req.sid)
    at = time.monotonic()
    cancel.set()                    # the token alone (not Chats.cancel) wakes it
    t.join(5)
    assert box["cancelled"] - at < 1.0
    assert chats.channel(req.sid).pending is None


# -- in a real browser -----------------------------------------------------------------------------

def test_a_person_grants_a_connector_allows_one_card_and_denies_another(home, target, tmp_path, pages):
    configure(home)
    ui = serve(home, target, tmp_path)
    try:
        page = pages()
        open_workspace(page, ui)
        box = page.locator("#connector-boxes input[value=everything]")
        expect(box).not_to_be_checked()
        box.check()
        page.fill("#prompt", "toggle the logging")
        page.click("#send")
        card = page.locator("section.approval")
        expect(card).to_have_count(1)
        expect(card.locator(".approval-server")).to_have_text("everything")
        expect(card.locator(".approval-tool")).to_have_text("toggle-simulated-logging")
        expect(card.locator(".approval-claim")).to_contain_text("read-only: no")
        # the exact input, pretty-printed, as text: the model chose it
        expect(card.locator(".approval-input")).to_have_text(json.dumps({"note": ODD}, indent=2, ensure_ascii=False))
        assert card.locator("img").count() == 0
        expect(page.locator("#chat-sub")).to_contain_text("connectors: everything")
        sid = page.evaluate("location.hash.slice(1)")
        # a reload while it waits still shows the card, with its buttons
        page.reload()
        expect(card.get_by_role("button", name="Allow")).to_be_enabled()
        shot(page, "workspace-approval-1440.png", tmp_path)
        phone = pages(390, 844)
        phone.goto(f"{ui.base}/?token={ui.token}#{sid}")
        expect(phone.locator("section.approval .approval-input")).to_be_visible()
        no_overflow(phone)
        card.get_by_role("button", name="Allow").click()
        expect(page.locator(".approval-line.asked.allowed")).to_contain_text("everything \u00b7 toggle-simulated-logging allowed by you")
        expect(card).to_have_count(1)                       # the second call asks on its own
        expect(card.locator(".approval-input")).to_contain_text('"note": "back"')
        card.get_by_role("button", name="Deny").click()
        expect(page.locator(".approval-line.asked.denied")).to_contain_text("denied by you")
        expect(page.locator(".note.done")).to_be_visible()
        expect(card).to_have_count(0)
        # what happened, as the transcript says: one call ran, the denied one did not
        tools = page.locator("details.tool.connector-tool")
        expect(tools).to_have_count(3)
        expect(tools.nth(0).locator(".tool-name")).to_have_text("everything \u00b7 toggle-simulated-logging")
        expect(tools.nth(0).locator(".tool-status")).to_have_text("done")
        expect(tools.nth(1).locator(".tool-status")).to_have_text("done")     # echo: read-only
        expect(page.locator(".approval-line:not(.asked)")).to_contain_text("everything \u00b7 echo ran without asking: readOnlyHint")
        expect(tools.nth(2).locator(".tool-status")).to_have_text("error")
        tools.nth(2).locator("summary").click()
        expect(tools.nth(2).locator(".tool-output")).to_contain_text("Denied: workspace did not allow")
        tools.nth(0).locator("summary").click()
        expect(tools.nth(0).locator(".connector-record")).to_contain_text("sha256")
        assert page.evaluate("window.__pwned") is None
        # the inspector lists what acted outside the sandbox, from the audit chain
        rows = page.locator("#external .external-row")
        expect(rows).to_have_count(3)
        expect(rows.nth(0)).to_contain_text("allowed by workspace; a result")
        expect(rows.nth(1)).to_contain_text("allowed by readOnlyHint")
        expect(rows.nth(2)).to_contain_text("denied by workspace; not sent")
        shot(page, "workspace-external-1440.png", tmp_path)
        console = pages(1440, 900)
        console.goto(f"{ui.base}/console?token={ui.token}#{sid}")
        ledger = console.locator(".external-ledger tbody tr")
        expect(ledger).to_have_count(3)
        expect(ledger.nth(2)).to_contain_text("denied by workspace")
        expect(console.locator(".doc-section h3").nth(2)).to_contain_text("External actions")
        expect(console.locator(".envelope")).to_contain_text("everything")
        assert console.evaluate("window.__pwned") is None
        shot(console, "console-external-1440.png", tmp_path)
        # the phone page followed along
        expect(phone.locator(".approval-line.asked.denied")).to_be_visible()
    finally:
        ui.close()


def test_settings_list_the_connectors_and_the_welcome_says_how_to_add_one(home, target, tmp_path, pages):
    ui = UI(home, target)
    try:
        ui.ok("PUT", "/api/settings", {"provider": "scripted"})      # no key wanted
        page = pages()
        open_workspace(page, ui)
        expect(page.locator("#connector-boxes")).to_contain_text("overlord mcp add")
        configure(home, {"everything": {"command": "/usr/bin/node", "args": ["srv.js"],
                                        "env": {"TOKEN": "s3cr3t-env-value-123456"}},
                         "docs": {"url": "https://docs.example/mcp", "headers": {"Authorization": "Bearer s3cr3t-1234567"}}},
                  approval="auto")
        page.click("#open-settings")
        rows = page.locator("#s-connectors .connector-row")
        expect(rows).to_have_count(2)
        expect(rows.nth(1)).to_contain_text("/usr/bin/node srv.js")
        expect(rows.nth(0)).to_contain_text("https://docs.example/mcp")
        expect(page.locator("#s-approval")).to_contain_text("auto")
        expect(page.locator("#settings")).to_contain_text("overlord mcp rm")
        assert "s3cr3t" not in page.locator("#settings").inner_text()
        page.click("#settings-close")
        expect(page.locator("#connector-boxes input")).to_have_count(2)
    finally:
        ui.close()
