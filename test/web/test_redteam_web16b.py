"""Red team 2, issue 16, the web face: an account's budget line on a chat the account runs in
the browser, and the usage meter as an operator sees it (issue 15 roles: an operator sees
only its own). A real `overlord ui`, accounts with script tokens. Root only."""
import json

import pytest

from conftest import Ovl, SESSION_RE
from weblib import UI, require_kernel


def call(ui, method, path, token, body=None):
    return ui.request(method, path, body=body, auth=False,
                      headers={"Authorization": f"Bearer {token}"})


def idle(ui, sid, token):
    """wait_idle on the account's own token (the launch token is refused once accounts exist)."""
    saved, ui.token = ui.token, token
    try:
        return ui.wait_idle(sid)
    finally:
        ui.token = saved


def ledger(home):
    try:
        with open(home / "ledger.jsonl") as f:
            return [json.loads(ln) for ln in f if ln.strip()]
    except FileNotFoundError:
        return []


@pytest.fixture
def accounts(home, target):
    require_kernel()
    from overlord.ops import auth
    ui = UI(home, target)
    try:
        tokens = {}
        for name, role in (("olive", "operator"), ("oscar", "operator"), ("ada", "admin")):
            auth.add(name, role, password=f"{name}-password-1")
            tokens[name] = auth.mint_token(name, label="t")[1]
        for name in ("olive", "oscar"):
            r = call(ui, "PUT", "/api/settings", tokens[name], {"provider": "scripted"})
            assert r.status == 200, r.body
        yield ui, tokens
    finally:
        ui.close()


def test_an_accounts_day_line_stops_its_web_chat_before_the_first_call(accounts, home):
    """`overlord users budget olive --day-usd 0`: olive's chat in the browser stops with
    reason budget before any model call, named as the account's line; oscar's is not held."""
    ui, tokens = accounts
    Ovl(home)("users", "budget", "olive", "--day-usd", "0", check=0)
    r = call(ui, "POST", "/api/chats", tokens["olive"], {"message": "hello"})
    assert r.status == 200, r.body
    sid = r.json["sid"]
    idle(ui, sid, tokens["olive"])
    chat = call(ui, "GET", f"/api/chats/{sid}", tokens["olive"]).json
    stops = [rec for rec in chat["records"] if rec["type"] == "budget"]
    assert len(stops) == 1 and stops[0]["key"] == "day_usd", chat["records"]
    assert "olive" in stops[0]["source"], stops[0]
    assert [ln for ln in ledger(home) if ln["sid"] == sid] == []
    Ovl(home)("rollback", sid)                 # the folder free for oscar's chat
    r = call(ui, "POST", "/api/chats", tokens["oscar"], {"message": "hello"})
    assert r.status == 200, r.body
    other = r.json["sid"]
    idle(ui, other, tokens["oscar"])
    chat = call(ui, "GET", f"/api/chats/{other}", tokens["oscar"]).json
    assert not [rec for rec in chat["records"] if rec["type"] == "budget"], chat["records"]


def test_the_meter_shows_an_operator_its_own_spend_not_anothers(accounts, home, target):
    """olive spends $3 today; oscar (no line of his own, no machine line) sees $0 as his
    spend and none of olive's name or figures; olive sees her own."""
    ui, tokens = accounts
    proc = Ovl(home)("run", "-t", target, "--", "true", check=0)
    sid = SESSION_RE.search(proc.out).group(1) if SESSION_RE.search(proc.out) else None
    from overlord.trust import cost
    cost.set_price("rt2-model", 1_000_000, 1_000_000)
    meter = cost.Meter(sid or "20261201-000000-abcdef", str(target), "olive")
    meter.charge("turn", "scripted", "rt2-model", {"input_tokens": 3, "output_tokens": 0,
                                                     "cache_read_tokens": 0, "cache_write_tokens": 0})
    theirs = call(ui, "GET", "/api/usage", tokens["oscar"])
    assert theirs.status == 200, theirs.body
    assert theirs.json["spend"]["day"]["spent"] == 0, theirs.json
    assert "olive" not in theirs.body.decode(), theirs.body
    own = call(ui, "GET", "/api/usage", tokens["olive"]).json
    assert own["spend"]["day"]["spent"] == pytest.approx(3.0), own


def test_an_operator_cannot_reach_notifications_or_a_cost_report(accounts):
    ui, tokens = accounts
    t = tokens["olive"]
    for method, path, body in (("GET", "/api/webhooks", None),
                               ("POST", "/api/webhooks", {"name": "mine", "url": "https://example.com/h",
                                                          "format": "json", "on": ["*"]}),
                               ("PUT", "/api/webhooks/base-url", {"url": "https://evil.example"}),
                               ("GET", "/api/webhooks/deliveries", None),
                               ("GET", "/api/cost", None), ("GET", "/api/cost?by=account", None)):
        r = call(ui, method, path, t, body)
        assert r.status in (403, 404), (method, path, r.status, r.body)
    listed = call(ui, "GET", "/api/webhooks", tokens["ada"]).json
    assert listed["hooks"] == [] and listed["base_url"] is None


def test_a_review_started_in_the_browser_stops_at_the_askers_account_line(accounts, home, target):
    """ada (admin) has a day_usd 0 line of her own: the second-model review she starts from
    the inspector makes no model call; its verdict is no-verdict naming the budget."""
    import time
    ui, tokens = accounts
    t = tokens["ada"]
    o = Ovl(home)
    o("users", "budget", "ada", "--day-usd", "0", check=0)
    proc = o("run", "-t", target, "--", "sh", "-c", "echo changed > hello.txt", check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    r = call(ui, "PUT", "/api/settings", t, {"countersign": {"provider": "scripted", "model": "",
                                                               "base_url": ""}})
    assert r.status == 200, r.body
    r = call(ui, "POST", f"/api/session/{sid}/review", t, {})
    assert r.status == 200, r.body
    deadline = time.monotonic() + 60
    while True:
        got = call(ui, "GET", f"/api/session/{sid}/reviews", t).json
        if got["reviewing"] and not got["reviewing"]["running"]:
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    [v] = got["reviews"]
    assert v["verdict"] == "no-verdict" and "budget" in json.dumps(v), v
    assert [ln for ln in ledger(home) if ln["kind"] == "review"] == []


def test_with_a_machine_line_an_operator_sees_the_machines_spend_labelled_as_such(accounts, home, target):
    """Decided, not a hole: the machine's day line binds every account, so an operator's meter
    shows the machine's spend against it (scope "*", source the machine's budget) -- an
    aggregate, never another account's name or its own line."""
    ui, tokens = accounts
    o = Ovl(home)
    o("cost", "budget", "--day-usd", "10", check=0)
    o("users", "budget", "olive", "--day-usd", "5", check=0)
    from overlord.trust import cost
    cost.set_price("rt2-model", 1_000_000, 1_000_000)
    cost.Meter("20261201-000000-abcdef", str(target), "olive").charge(
        "turn", "scripted", "rt2-model", {"input_tokens": 3, "output_tokens": 0,
                                          "cache_read_tokens": 0, "cache_write_tokens": 0})
    r = call(ui, "GET", "/api/usage", tokens["oscar"])
    day = r.json["spend"]["day"]
    assert day["scope"] == "*" and day["limit"] == 10 and day["spent"] == pytest.approx(3.0), day
    assert "olive" not in r.body.decode() and "5" not in json.dumps(day["limit"])
