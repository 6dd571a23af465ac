"""Settings -> Notifications: webhooks through the web face, against a real receiver (an
http.server on 127.0.0.1 in this test) -- the API (add, list without the secret, test, the
delivery log, the base URL, remove, every bad input refused with nothing changed), and the same
in a real browser (Playwright + Debian's Chromium): an admin adds a hook, tests it, sees the
delivery; an operator and a viewer get 403 from every route and no Notifications section."""
import hashlib
import hmac
import http.server
import json
import threading

import pytest

from conftest import Ovl
from weblib import UI, ui  # noqa: F401
from test_browser import Pages, browser  # noqa: F401 -- browser: a fixture

try:
    from playwright.sync_api import expect
except ImportError:                     # pragma: no cover - test_browser's fixture skips then
    expect = None

SECRET = "hunter2-web-secret-value"


class Receiver:
    """A webhook endpoint on 127.0.0.1: every POST kept (path, headers, body); answers 200."""

    def __init__(self, status=200):
        seen, self.status = [], status
        self.seen, self.got = seen, threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(outer.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                with outer.got:
                    seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                 "body": body})
                    outer.got.notify_all()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n=1, timeout=30):
        with self.got:
            assert self.got.wait_for(lambda: len(self.seen) >= n, timeout), self.seen
        return self.seen

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def pages(browser):
    p = Pages(browser)
    p.allowed.append("status of 4")        # the refusals a test provokes
    yield p
    try:
        p.check()
    finally:
        p.close()


def hook_body(receiver, **over):
    return dict({"name": "team", "url": receiver.url, "format": "json",
                 "on": ["session.needs_review", "webhook.test"], "secret": SECRET,
                 "allow_private": True}, **over)


def test_add_list_test_deliveries_base_url_remove(ui, receiver):
    listed = ui.ok("GET", "/api/webhooks")
    assert listed["hooks"] == [] and "session.needs_review" in listed["actions"]
    assert "connector.approval_requested" in listed["actions"] and "budget.stop" in listed["actions"]
    r = ui.post("/api/webhooks", hook_body(receiver))
    assert r.status == 200, r.body
    assert SECRET.encode() not in r.body
    (hook,) = r.json["hooks"]
    assert hook == {"name": "team", "url": receiver.url, "host": "127.0.0.1", "format": "json",
                    "on": ["session.needs_review", "webhook.test"], "secret": "set",
                    "allow_private": True, "created": hook["created"]}
    r = ui.post("/api/webhooks/team/test", {})
    assert r.status == 200, r.body
    assert r.json["outcome"]["ok"] is True, r.json
    assert SECRET.encode() not in r.body
    (got,) = receiver.wait(1)
    # a signed json post: t=<unix>,v1=HMAC-SHA256(secret, "t.body")
    sig = dict(part.split("=", 1) for part in got["headers"]["x-overlord-signature"].split(","))
    want = hmac.new(SECRET.encode(), f"{sig['t']}.".encode() + got["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(sig["v1"], want)
    assert json.loads(got["body"])["text"]
    r = ui.get("/api/webhooks/deliveries")
    assert r.status == 200 and SECRET.encode() not in r.body
    assert any(d.get("hook") == "team" and d.get("ok") for d in r.json["deliveries"]), r.json
    assert ui.ok("PUT", "/api/webhooks/base-url", {"url": "https://overlord.example.com"})["base_url"] == \
        "https://overlord.example.com"
    assert ui.ok("PUT", "/api/webhooks/base-url", {"url": None})["base_url"] is None
    assert ui.ok("DELETE", "/api/webhooks/team")["hooks"] == []
    assert ui.request("DELETE", "/api/webhooks/team").status == 404


def test_a_private_target_is_refused_without_allow_private(ui, receiver):
    ui.ok("POST", "/api/webhooks", hook_body(receiver, name="loop", allow_private=False, secret=None))
    r = ui.post("/api/webhooks/loop/test", {})
    outcome = r.json.get("outcome") if r.status == 200 else r.json
    assert r.status != 200 or outcome["ok"] is False, r.json
    assert receiver.seen == []


@pytest.mark.parametrize("change, field", [
    ({"name": "bad/name"}, "w-name"), ({"name": "team\n"}, "w-name"), ({"name": ""}, "w-name"), ({"name": "-x"}, "w-name"),
    ({"url": "ftp://example.com/x"}, "w-url"), ({"url": "not a url"}, "w-url"),
    ({"url": "http:///nohost"}, "w-url"), ({"url": "http://[::1"}, "w-url"),
    ({"url": "http://h:99999/"}, "w-url"), ({"url": "http://user:pw@example.com/"}, "w-url"),
    ({"url": None}, "w-url"), ({"secret": "   "}, "w-secret"), ({"format": "xml"}, "w-format"),
    ({"on": ["no.such_act"]}, "w-on"), ({"on": [1]}, "w-on"),
    ({"secret": 5}, "w-secret"), ({"secret": "a\nb"}, "w-secret"),
    ({"allow_private": "yes"}, "w-private"), ({"extra": 1}, "w-name"),
])
def test_bad_input_is_one_clean_400_and_changes_nothing(ui, receiver, change, field):
    r = ui.post("/api/webhooks", hook_body(receiver, **change))
    assert r.status == 400, r.body
    assert r.json["field"] == field and r.json["error"]
    assert ui.ok("GET", "/api/webhooks")["hooks"] == []


def test_bad_paths_and_bodies(ui):
    assert ui.request("DELETE", "/api/webhooks/bad%20name").status == 400
    assert ui.request("DELETE", "/api/webhooks/team%0A").status == 400      # the whole segment
    assert ui.request("POST", "/api/webhooks/a..b%2Fc/test", body={}).status == 400
    assert ui.request("DELETE", "/api/webhooks/nosuch").status == 404
    assert ui.request("POST", "/api/webhooks/nosuch/test", body={}).status == 404
    for body in ({}, {"url": "ftp://x"}, {"url": 7}, {"url": "http://a b"}, {"url": "https://[x"}):
        r = ui.put("/api/webhooks/base-url", body)
        assert r.status == 400 and r.json["field"] == "w-base-url", (body, r.body)
    assert ui.request("GET", "/api/webhooks/deliveries?limit=0").status == 400
    assert ui.request("GET", "/api/webhooks/deliveries?limit=x").status == 400
    assert ui.post("/api/webhooks", None, raw=b"[1]", headers={"Content-Type": "application/json"}).status == 400


def test_an_admin_adds_tests_and_sees_the_delivery_in_the_browser(ui, receiver, pages):
    page = pages()
    page.goto(ui.link)
    page.click("#open-settings")
    expect(page.locator("#nav-notify")).to_be_visible()
    page.click("#nav-notify")
    expect(page.locator("#s-notify")).to_be_visible()
    expect(page.locator("#w-list .hook-none")).to_be_visible()
    # a refusal lands next to its field, nothing is added
    page.fill("#w-name", "team")
    page.fill("#w-url", "ftp://example.com/")
    page.click("#w-add")
    expect(page.locator('.field-error[data-for="w-url"]')).not_to_be_empty()
    page.fill("#w-url", receiver.url)
    page.select_option("#w-format", "json")
    page.select_option("#w-on", ["session.needs_review", "webhook.test"])
    page.fill("#w-secret", SECRET)
    page.check("#w-private")
    page.press("#w-secret", "Enter")            # presses Add, never the dialog's Save
    expect(page.locator("#settings")).to_be_visible()
    row = page.locator('#w-list .hook-row[data-hook="team"]')
    expect(row).to_be_visible()
    expect(row.locator(".hook-host")).to_have_text("127.0.0.1")
    expect(row.locator(".hook-secret")).to_have_text("secret set")
    expect(row.locator(".hook-private")).to_be_visible()
    expect(row.locator(".hook-on")).to_contain_text("session.needs_review, webhook.test")
    assert page.input_value("#w-secret") == ""
    assert SECRET not in page.content()
    row.locator("button", has_text="Test").click()
    expect(row.locator(".hook-status")).to_contain_text("Delivered")
    receiver.wait(1)
    expect(page.locator('#w-deliveries tr.delivery[data-hook="team"]').first).to_be_visible()
    # base URL
    page.fill("#w-base-url", "https://overlord.example.com")
    page.click("#w-base-save")
    expect(page.locator("#w-base-status")).to_contain_text("https://overlord.example.com")
    # remove, after asking
    row.locator("button", has_text="Remove").click()
    row.locator(".hook-confirm button", has_text="Remove").click()
    expect(row).to_have_count(0)
    assert ui.ok("GET", "/api/webhooks")["hooks"] == []
    assert SECRET not in page.content()


def test_operators_and_viewers_get_403_and_no_section(home, target, receiver, pages):
    """With accounts on: the webhook routes refuse an operator and a viewer (403), and their
    Settings has no Notifications section; an admin's has."""
    from overlord.ops import auth
    ui = UI(home, target)
    try:
        cli = Ovl(home)
        for name, role in (("ada", "admin"), ("oscar", "operator"), ("vera", "viewer")):
            cli("users", "add", name, "--role", role, input=f"{name}-password-1\n".encode(), check=0)
        for name in ("oscar", "vera"):
            token = auth.mint_token(name, label="t")[1]
            h = {"Authorization": f"Bearer {token}"}
            for method, path, body in (("GET", "/api/webhooks", None), ("POST", "/api/webhooks", hook_body(receiver)),
                                       ("GET", "/api/webhooks/deliveries", None),
                                       ("PUT", "/api/webhooks/base-url", {"url": None}),
                                       ("DELETE", "/api/webhooks/team", None),
                                       ("POST", "/api/webhooks/team/test", {})):
                r = ui.request(method, path, body=body, auth=False, headers=h)
                assert r.status == 403, (name, method, path, r.status, r.body)
        for name, shown in (("vera", False), ("oscar", False), ("ada", True)):
            page = pages()
            page.context.add_cookies([{"name": "overlord_login", "value": auth.login_create(name),
                                       "url": ui.base}])
            page.goto(ui.base + "/")
            expect(page.locator("#rail-user-name")).to_have_text(name)
            page.click("#open-settings")
            expect(page.locator("#s-model-set")).to_be_visible()
            if shown:
                expect(page.locator("#s-notify")).to_be_visible()
                expect(page.locator("#w-list .hook-none")).to_be_visible()
            else:
                expect(page.locator("#nav-notify")).to_be_hidden()
                expect(page.locator("#s-notify")).to_be_hidden()
    finally:
        ui.close()
