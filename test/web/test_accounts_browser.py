"""Accounts in a real browser: Playwright driving Debian's Chromium (/usr/bin/chromium) against
`overlord ui`, with accounts made by the real CLI (`overlord users ...`) and single sign-on
against a real OpenID provider (oidc-provider-mock, test/auth/oidcmock.py).

A person's paths: the sign-in page (a wrong password shows the error and sets no cookie; the
right one lands on the page asked for), Sign out; an admin adding an operator and a viewer in
Settings -> Accounts (every refusal next to its field), changing a role, resetting a password,
removing an account; the operator seeing only their own conversations (workspace and console);
the viewer reading every conversation behind a read-only composer; Settings -> Your account
(your own password, a script token shown once with a copy button, listed and revoked); and the
whole single sign-on flow: the button, the provider's consent form, back signed in with the
provisioned role. With accounts off nothing of this shows. On every page: no console error
(but the 401 the sign-in page answers with, and the refusals a test provokes), no CSP violation.

The server starts before the first account exists (its launch link is what weblib.UI reads);
the first `users add` turns sign-in on from the next request, as for a server already running.
scrypt costs ~0.35 s a hash here: each test makes only the hashes its story needs.
"""
import json
import os
import sys
import types

import pytest

from conftest import Ovl
from weblib import REPO, UI, Events, require_kernel
from test_browser import CSP_PROBE, Pages, browser, no_overflow, shot  # noqa: F401 -- browser: a fixture

sys.path.insert(0, os.path.join(REPO, "test", "auth"))
from oidcmock import start_mock  # noqa: E402

try:
    from playwright.sync_api import expect
except ImportError:                     # pragma: no cover - test_browser's fixture skips then
    expect = None

LOGIN = "overlord_login"


@pytest.fixture
def server(home, target):
    ui = UI(home, target)
    yield ui
    ui.close()


@pytest.fixture
def cli(home):
    return Ovl(home)


@pytest.fixture
def pages(browser):
    p = Pages(browser)
    p.allowed.append("status of 401")     # the sign-in page stands in for a page with a 401
    yield p
    try:
        p.check()
    finally:
        p.close()


# -- helpers ---------------------------------------------------------------------------------------

def add_user(cli, name, role, password):
    """`overlord users add NAME --role ROLE`, the password on stdin (never argv)."""
    cli("users", "add", name, "--role", role, input=f"{password}\n".encode(), check=0)


def token_of(cli, name):
    """A script token for `name` from the CLI (`users token` prints it once, on stdout)."""
    out = cli("users", "token", name, "--label", "test setup", check=0).out
    return next(w for w in out.split() if w.startswith("ovl_"))


def as_(ui, token, method, path, body=None, status=200):
    r = ui.request(method, path, body=body, auth=False, headers={"Authorization": f"Bearer {token}"})
    assert r.status == status, (method, path, r.status, r.body)
    return r.json


def chat(ui, token, message, folder):
    """A demo conversation started by the account the token names in `folder` (one pending
    session a folder), run to its end: its sid."""
    as_(ui, token, "PUT", "/api/settings", {"provider": "scripted", "folder": str(folder)})
    sid = as_(ui, token, "POST", "/api/chats", {"message": message})["sid"]
    shim = types.SimpleNamespace(conn=ui.conn, host=ui.host, token=token)
    with Events(shim, sid, 60) as ev:
        ev.until(lambda name, data: name == "state" and not data["running"]
                 or name == "snapshot" and not data["running"] and data["records"]
                 and data["records"][-1]["type"] == "done")
    return sid


def login_cookies(page):
    return [c for c in page.context.cookies() if c["name"].endswith(LOGIN) and c["value"]]


def sign_in(page, ui, name, password, path="/"):
    """Open `path`, meet the sign-in page there, sign in with the form."""
    page.goto(ui.base + path)
    expect(page.locator("#signin-form")).to_be_visible()
    page.fill("#signin-name", name)
    page.fill("#signin-password", password)
    page.click("#signin-submit")


def signed_in(pages, ui, name, password, path="/", **size):
    page = pages(**size)
    sign_in(page, ui, name, password, path)
    page.wait_for_url(ui.base + path)
    who = "#rail-user-name" if path.split("#")[0] == "/" else "#topbar-user-name"
    expect(page.locator(who)).to_have_text(name)
    return page


def open_settings(page, section):
    page.click("#open-settings")
    expect(page.locator("#settings")).to_be_visible()
    expect(page.locator(section)).to_be_visible()


def error_for(page, field):
    return page.locator(f'.field-error[data-for="{field}"]')


def account_row(page, name):
    return page.locator(f'#a-list .account-row[data-account="{name}"]')


# -- accounts off ------------------------------------------------------------------------------------

def test_with_accounts_off_nothing_of_them_shows(server, pages):
    page = pages()
    page.goto(server.link)
    expect(page.locator("#welcome")).to_be_visible()
    me = server.ok("GET", "/api/whoami")
    assert me["accounts"] is False
    expect(page.locator("#rail-user")).to_be_hidden()
    pages.allowed.append("status of 409")          # the model list: no API key yet
    page.click("#open-settings")
    expect(page.locator("#s-model-set")).to_be_visible()
    for hidden in ("#s-me", "#s-accounts", "#nav-me", "#nav-accounts"):
        expect(page.locator(hidden)).to_be_hidden()
    expect(page.locator("#prompt")).to_be_enabled()
    page.goto(server.base + "/console")
    expect(page.locator("#register-title")).to_be_visible()
    assert page.locator("#topbar-user").count() == 0
    expect(page.locator("#audit-link")).to_be_visible()


# -- signing in and out ----------------------------------------------------------------------------

def test_sign_in_with_a_password_lands_on_the_page_asked_for_and_sign_out_ends_it(server, cli, pages, tmp_path):
    add_user(cli, "ada", "admin", "correct horse 1")
    page = pages()
    page.goto(server.base + "/console")
    # the page asked for answers with the sign-in page; no single sign-on is configured
    expect(page.locator("#signin-form")).to_be_visible()
    assert page.title() == "OVERLORD \u00b7 Sign in"
    expect(page.locator("#signin-sso")).to_be_hidden()
    expect(page.locator("#signin-error")).to_be_hidden()
    assert page.locator("#signin-next").input_value() == "/console"
    # a wrong password: back to the page with the error line, and no login cookie
    page.fill("#signin-name", "ada")
    page.fill("#signin-password", "wrong horse")
    page.click("#signin-submit")
    page.wait_for_url("**/login?*error=1*")
    expect(page.locator("#signin-error")).to_be_visible()
    expect(page.locator("#signin-error")).to_contain_text("do not match")
    assert login_cookies(page) == []
    assert page.locator("#signin-next").input_value() == "/console"
    # the right one: on to /console, signed in as ada
    page.fill("#signin-name", "ada")
    page.fill("#signin-password", "correct horse 1")
    page.click("#signin-submit")
    page.wait_for_url(server.base + "/console")
    expect(page.locator("#topbar-user-name")).to_have_text("ada")
    expect(page.locator("#topbar-user-role")).to_have_text("admin")
    expect(page.locator("#audit-link")).to_be_visible()
    [cookie] = login_cookies(page)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    page.set_viewport_size({"width": 390, "height": 844})          # the top bar fits a phone
    no_overflow(page)
    shot(page, "console-signed-in-390.png", tmp_path)
    page.set_viewport_size({"width": 1440, "height": 900})
    # the rail of the workspace names who is signed in
    page.goto(server.base + "/")
    expect(page.locator("#rail-user")).to_be_visible()
    expect(page.locator("#rail-user-name")).to_have_text("ada")
    expect(page.locator("#rail-user-role")).to_have_text("admin")
    shot(page, "accounts-rail-1440.png", tmp_path)
    # sign out: the login ends, the browser is at the sign-in page, and / asks again
    page.click("#sign-out")
    page.wait_for_url(server.base + "/login")
    expect(page.locator("#signin-form")).to_be_visible()
    assert login_cookies(page) == []
    page.goto(server.base + "/")
    expect(page.locator("#signin-form")).to_be_visible()
    # the launch link proves no one any more: it lands on the sign-in page, the token gone
    page.goto(server.link)
    expect(page.locator("#signin-form")).to_be_visible()
    assert "token" not in page.url
    # on a phone: the page fits
    phone = pages(width=390, height=844)
    phone.goto(server.base + "/login?error=1")
    expect(phone.locator("#signin-error")).to_be_visible()
    no_overflow(phone)
    shot(phone, "signin-390.png", tmp_path)


# -- Settings -> Accounts, and what each role sees ------------------------------------------------------

def test_an_admin_adds_an_operator_and_a_viewer_and_each_sees_what_the_role_allows(server, cli, pages, target, tmp_path):
    require_kernel()                          # the conversations run jailed
    add_user(cli, "ada", "admin", "ada-pass-1")
    admin = signed_in(pages, server, "ada", "ada-pass-1")
    open_settings(admin, "#s-accounts")
    expect(admin.locator("#nav-accounts")).to_be_visible()
    expect(admin.locator("#a-list .account-row")).to_have_count(1)
    expect(account_row(admin, "ada")).to_contain_text("(you)")
    assert account_row(admin, "ada").get_by_role("button", name="Remove", exact=True).count() == 0
    # every refusal next to its field: the browser's own checks, then the server's
    pages.allowed.append("status of 400")
    pages.allowed.append("status of 409")
    admin.click("#a-add")
    expect(error_for(admin, "a-name")).to_contain_text("Name the account")
    admin.fill("#a-name", "Bo Smith")
    admin.click("#a-add")
    expect(error_for(admin, "a-name")).to_contain_text("lower-case")
    admin.fill("#a-name", "bo")
    admin.click("#a-add")
    expect(error_for(admin, "a-name")).to_be_hidden()
    expect(error_for(admin, "a-password")).to_contain_text("password")
    admin.fill("#a-name", "ada")
    admin.fill("#a-password", "another-1")
    admin.click("#a-add")                                            # the server: ada exists
    expect(error_for(admin, "a-name")).to_be_visible()
    expect(admin.locator("#a-list .account-row")).to_have_count(1)
    # an operator and a viewer
    admin.fill("#a-name", "bo")
    admin.fill("#a-password", "bo-pass-1")
    admin.press("#a-password", "Enter")                # Enter adds (and does not save Settings)
    expect(admin.locator("#a-status")).to_have_text("Added bo (operator).")
    expect(admin.locator("#settings")).to_be_visible()
    admin.fill("#a-name", "vi")
    admin.select_option("#a-role", "viewer")
    admin.fill("#a-password", "vi-pass-1")
    admin.click("#a-add")
    expect(admin.locator("#a-status")).to_have_text("Added vi (viewer).")
    expect(admin.locator("#a-list .account-row")).to_have_count(3)
    expect(account_row(admin, "bo").locator(".pill")).to_have_text("operator")
    expect(account_row(admin, "vi").locator(".pill")).to_have_text("viewer")
    assert admin.locator("#a-name").input_value() == "" and admin.locator("#a-password").input_value() == ""
    # a role changed, a password reset, an account removed
    admin.fill("#a-name", "tmp")
    admin.fill("#a-password", "tmp-pass-1")
    admin.click("#a-add")
    expect(account_row(admin, "tmp")).to_be_visible()
    tmp = account_row(admin, "tmp")
    tmp.get_by_role("button", name="Change role", exact=True).click()
    tmp.locator("select").select_option("viewer")
    tmp.get_by_role("button", name="Save role", exact=True).click()
    expect(account_row(admin, "tmp").locator(".pill")).to_have_text("viewer")
    expect(account_row(admin, "tmp").locator(".account-status")).to_contain_text("now viewer")
    tmp = account_row(admin, "tmp")
    tmp.get_by_role("button", name="Reset password", exact=True).click()
    tmp.get_by_role("button", name="Set password", exact=True).click()
    expect(tmp.locator(".account-edit .field-error")).to_contain_text("Type the new password")
    tmp.locator("input[type=password]").fill("tmp-pass-2")
    tmp.get_by_role("button", name="Set password", exact=True).click()
    expect(tmp.locator(".account-status")).to_contain_text("reset")
    shot(admin, "settings-accounts-1440.png", tmp_path)
    admin.set_viewport_size({"width": 390, "height": 844})        # Accounts fits a phone
    no_overflow(admin)
    assert admin.locator("#settings").evaluate("d => d.scrollWidth <= d.clientWidth")
    shot(admin, "settings-accounts-390.png", tmp_path)
    admin.set_viewport_size({"width": 1440, "height": 900})
    tmp.get_by_role("button", name="Remove", exact=True).click()
    tmp.locator(".account-edit").get_by_role("button", name="Remove", exact=True).click()
    expect(admin.locator("#a-status")).to_have_text("Removed tmp.")
    expect(admin.locator("#a-list .account-row")).to_have_count(3)
    listed = {u["name"]: u["role"] for u in as_(server, token_of(cli, "ada"), "GET", "/api/users")["users"]}
    assert listed == {"ada": "admin", "bo": "operator", "vi": "viewer"}
    # one conversation each for the admin and the operator
    ada_chat = chat(server, token_of(cli, "ada"), "ada's own task", target)
    (tmp_path / "bo-folder").mkdir()
    bo_chat = chat(server, token_of(cli, "bo"), "bo's own task", tmp_path / "bo-folder")
    # the operator sees only theirs: in the workspace, and in the console's register
    bo = signed_in(pages, server, "bo", "bo-pass-1")
    expect(bo.locator("#rail-user-role")).to_have_text("operator")
    expect(bo.locator(".chat-item")).to_have_count(1)
    expect(bo.locator(".chat-item")).to_contain_text("bo's own task")
    bo.locator(f'.chat-item[data-sid="{bo_chat}"]').click()
    expect(bo.locator(".note.done")).to_be_visible()
    expect(bo.locator("#prompt")).to_be_enabled()
    expect(bo.locator("#commit")).to_be_visible()
    open_settings(bo, "#s-me")
    expect(bo.locator("#s-accounts")).to_be_hidden()
    expect(bo.locator("#nav-accounts")).to_be_hidden()
    bo.click("#settings-close")
    bo.goto(server.base + "/console")
    expect(bo.locator("#register .reg-row")).to_have_count(1)
    assert bo.locator("#register .reg-row").get_attribute("data-sid") == bo_chat
    expect(bo.locator("#audit-link")).to_be_hidden()
    # the viewer reads every conversation behind a read-only composer
    vi = signed_in(pages, server, "vi", "vi-pass-1")
    expect(vi.locator(".chat-item")).to_have_count(2)
    expect(vi.locator("#prompt")).to_be_disabled()          # a viewer starts no conversation
    expect(vi.locator("#composer-note")).to_contain_text("viewer")
    vi.locator(f'.chat-item[data-sid="{ada_chat}"]').click()
    expect(vi.locator(".note.done")).to_be_visible()
    expect(vi.locator("#composer-note")).to_contain_text("You may only read this conversation")
    expect(vi.locator("#prompt")).to_be_disabled()
    expect(vi.locator("#send")).to_be_disabled()
    expect(vi.locator("#composer")).to_have_class("composer read-only")
    expect(vi.locator("#decided")).to_contain_text("You may only read this session")
    expect(vi.locator("#commit")).to_be_hidden()
    shot(vi, "workspace-read-only-1440.png", tmp_path)
    detail = as_(server, token_of(cli, "vi"), "GET", f"/api/chats/{ada_chat}")
    assert detail.get("may_write", detail["chat"].get("may_write")) is False
    vi.goto(server.base + f"/console#{ada_chat}")
    expect(vi.locator("#register .reg-row")).to_have_count(2)
    expect(vi.locator(".read-only-note")).to_contain_text("You may only read this session")
    assert vi.get_by_role("button", name="Commit", exact=True).count() == 0
    expect(vi.locator("#audit-link")).to_be_visible()


# -- Settings -> Your account ---------------------------------------------------------------------------

def test_your_own_password_and_a_script_token_shown_once(server, cli, pages, tmp_path):
    add_user(cli, "bo", "operator", "first-pass-1")
    other = signed_in(pages, server, "bo", "first-pass-1")       # another browser, signed in
    page = signed_in(pages, server, "bo", "first-pass-1")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base)
    pages.allowed.append("status of 409")          # the model list: no API key yet
    open_settings(page, "#s-me")
    expect(page.locator("#me-who")).to_contain_text("Signed in as bo")
    expect(page.locator("#me-sso-note")).to_be_hidden()
    expect(page.locator("#me-tokens .token-none")).to_have_text("No script tokens yet.")
    # the password: refusals next to their fields, then the change
    pages.allowed.append("status of 400")
    page.click("#me-password-save")
    expect(error_for(page, "me-old")).to_contain_text("current password")
    page.fill("#me-old", "first-pass-1")
    page.fill("#me-new", "second-pass-2")
    page.fill("#me-new2", "second-pass-3")
    page.click("#me-password-save")
    expect(error_for(page, "me-new2")).to_contain_text("differ")
    page.fill("#me-old", "not my password")
    page.fill("#me-new2", "second-pass-2")
    page.click("#me-password-save")                                  # the server: a wrong one
    expect(error_for(page, "me-old")).to_be_visible()
    expect(page.locator("#me-password-status")).to_have_text("")
    page.fill("#me-old", "first-pass-1")
    page.press("#me-new2", "Enter")
    expect(page.locator("#me-password-status")).to_contain_text("Password changed")
    expect(page.locator("#settings")).to_be_visible()
    assert page.locator("#me-old").input_value() == ""
    # the other browser's login ended: its next read sends it to sign in again; this one goes on
    other.click("#open-settings")
    other.wait_for_url("**/login?*error=expired*")
    expect(other.locator("#signin-error")).to_contain_text("ended")
    assert other.locator("#signin-next").input_value() == "/"
    assert as_(server, token_of(cli, "bo"), "GET", "/api/whoami")["name"] == "bo"
    # a script token: minted, shown once with a copy button, listed, used, revoked
    page.fill("#me-token-label", "nightly ci")
    page.click("#me-token-mint")
    expect(page.locator("#me-token-shown")).to_be_visible()
    token = page.locator("#me-token-value").input_value()
    assert token.startswith("ovl_")
    page.click("#me-token-copy")
    expect(page.locator("#me-token-copied")).to_have_text("Copied.")
    assert page.evaluate("navigator.clipboard.readText()") == token
    rows = page.locator("#me-tokens .token-row")
    expect(rows).to_have_count(2)                          # and the one token_of made above
    mine = rows.filter(has_text="nightly ci")
    expect(mine).to_have_count(1)
    assert token.startswith(f"ovl_{mine.get_attribute('data-token')}_")
    assert token not in page.locator("#me-tokens").inner_text()
    assert as_(server, token, "GET", "/api/whoami")["name"] == "bo"
    shot(page, "settings-your-account-1440.png", tmp_path)
    page.click("#settings-close")
    open_settings(page, "#s-me")                                  # shown once: not again
    expect(page.locator("#me-token-shown")).to_be_hidden()
    assert page.locator("#me-token-value").input_value() == ""
    mine = page.locator("#me-tokens .token-row").filter(has_text="nightly ci")
    mine.get_by_role("button", name="Revoke", exact=True).click()
    mine.locator(".skill-confirm").get_by_role("button", name="Revoke", exact=True).click()
    expect(page.locator("#me-tokens .token-row")).to_have_count(1)
    expect(page.locator("#me-tokens")).not_to_contain_text("nightly ci")
    assert server.request("GET", "/api/whoami", auth=False,
                          headers={"Authorization": f"Bearer {token}"}).json["name"] is None
    assert server.request("GET", "/api/sessions", auth=False,
                          headers={"Authorization": f"Bearer {token}"}).status == 401
    # the new password signs in; the old one no longer does
    page.click("#settings-close")
    page.click("#sign-out")
    page.wait_for_url(server.base + "/login")
    sign_in(page, server, "bo", "first-pass-1")
    page.wait_for_url("**/login?*error=1*")
    assert login_cookies(page) == []
    page.fill("#signin-name", "bo")
    page.fill("#signin-password", "second-pass-2")
    page.click("#signin-submit")
    page.wait_for_url(server.base + "/")
    expect(page.locator("#rail-user-name")).to_have_text("bo")


# -- single sign-on, the whole flow in the browser ------------------------------------------------------

def consent(page, sub):
    """The provider's own consent page: its `sub` field, then Authorize."""
    page.wait_for_selector("input[name=sub]")
    page.fill("input[name=sub]", sub)
    page.get_by_role("button", name="Authorize", exact=True).click()


def test_single_sign_on_through_a_real_provider_signs_in_with_the_provisioned_role(server, cli, pages, tmp_path):
    add_user(cli, "ada", "admin", "ada-pass-1")                 # accounts on
    with start_mock() as idp:
        idp.set_user("ann-sub", {"email": "ann@example.com", "email_verified": True, "name": "Ann"})
        idp.set_user("vic-sub", {"email": "Vic@Example.com", "email_verified": True, "name": "Vic"})
        cli("sso", "set", "--issuer", idp.issuer, "--client-id", "overlord-test", "--client-secret-stdin",
            "--domain", "example.com", "--viewer", "vic@example.com", input=b"the-client-secret\n", check=0)
        page = pages()
        pages.allowed.append("status of 409")      # the model list: no API key yet
        # the provider's page asks a CDN for its stylesheet: served empty here (no network)
        page.context.route("https://cdn.jsdelivr.net/**",
                           lambda route: route.fulfill(status=200, content_type="text/css", body=""))
        page.goto(server.base + "/console")
        expect(page.locator("#signin-sso")).to_be_visible()
        assert page.locator("#sso-button").get_attribute("href") == "/sso/start?next=%2Fconsole"
        shot(page, "signin-sso-1440.png", tmp_path)
        # the password form refuses a single sign-on account's name
        page.fill("#signin-name", "ann@example.com")
        page.fill("#signin-password", "anything")
        page.click("#signin-submit")
        page.wait_for_url("**/login?*error=1*")
        assert login_cookies(page) == []
        # the button, the provider's consent form, and back: signed in as an operator (the default)
        page.click("#sso-button")
        page.wait_for_url(f"{idp.issuer}/**")
        consent(page, "ann-sub")
        page.wait_for_url(server.base + "/console")
        expect(page.locator("#topbar-user-name")).to_have_text("ann@example.com")
        expect(page.locator("#topbar-user-role")).to_have_text("operator")
        assert len(login_cookies(page)) == 1
        assert not [c for c in page.context.cookies() if c["name"].endswith("overlord_sso") and c["value"]]
        page.goto(server.base + "/")
        expect(page.locator("#rail-user-role")).to_have_text("operator \u00b7 single sign-on")
        open_settings(page, "#s-me")
        expect(page.locator("#me-password-box")).to_be_hidden()
        expect(page.locator("#me-sso-note")).to_be_visible()
        expect(page.locator("#me-tokens-box")).to_be_visible()
        page.click("#settings-close")
        page.click("#sign-out")
        page.wait_for_url(server.base + "/login")
        # another person, named on the viewer list: provisioned a viewer, read-only from the start
        expect(page.locator("#signin-sso")).to_be_visible()
        page.click("#sso-button")
        consent(page, "vic-sub")
        page.wait_for_url(server.base + "/")
        expect(page.locator("#rail-user-name")).to_have_text("vic@example.com")
        expect(page.locator("#rail-user-role")).to_have_text("viewer \u00b7 single sign-on")
        expect(page.locator("#prompt")).to_be_disabled()
        listed = {u["name"]: (u["role"], u["sso"]) for u in
                  as_(server, token_of(cli, "ada"), "GET", "/api/users")["users"]}
        assert listed == {"ada": ("admin", False), "ann@example.com": ("operator", True),
                          "vic@example.com": ("viewer", True)}
        audit = cli("audit", "show", "--json", check=0).out
        assert "sso.provision" in audit and "the-client-secret" not in audit
        assert "the-client-secret" not in json.dumps(page.context.cookies())


# -- the sign-in page's slots, without a browser ------------------------------------------------------

def test_the_sign_in_page_never_points_elsewhere_and_never_echoes_the_url():
    from overlord.web import pages as P
    ps = P.Pages()
    for hostile in ("//evil.example/x", "/\\evil.example", "https://evil.example/", "javascript:alert(1)",
                    "evil", "/\tx", "/x\r\nSet-Cookie: a=b", "", None, 7, "/" + "a" * 2001):
        assert P.signin_slots(next=hostile)["next"] == "/", hostile
        assert P.local_path(hostile) == "/"
    assert P.signin_slots(next="/console#20260101-000000-abcdef")["next"] == "/console#20260101-000000-abcdef"
    page = ps.render("signin.html", "NONCE", next='/"><script>alert(1)</script>', error="<b>x</b>", sso=True)
    assert "<script>alert" not in page and "<b>x</b>" not in page
    assert 'value="/&quot;&gt;&lt;script&gt;' in page                       # a local path, escaped
    assert 'data-error="other"' in page and P.SIGNIN_GENERIC in page       # an unknown code: generic words
    assert 'id="signin-sso">' in page and 'href="/sso/start?next=%2F%22%3E%3Cscript%3E' in page
    assert 'nonce="NONCE"' in page and page.count("<script") == 1          # only the page's own script
    plain = ps.render("signin.html", "N")
    assert 'id="signin-sso" hidden>' in plain and 'id="signin-error" role="alert" data-error="" hidden>' in plain
    wrong = ps.render("signin.html", "N", next="/console", error="1")
    assert P.SIGNIN_ERRORS["1"] in wrong and 'value="/console"' in wrong
    # a caller that fills the derived slots itself keeps its own words
    own = ps.render("signin.html", "N", next="/", error_code="sso", error_text="Their words.", error_hidden="",
                    sso_hidden=" hidden", sso_href="/sso/start?next=%2F")
    assert "Their words." in own and P.SIGNIN_ERRORS["sso"] not in own
