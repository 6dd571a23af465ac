"""Single sign-on through a real `overlord ui` against a real OpenID provider for tests
(oidc-provider-mock, test/auth/oidcmock.py), without a browser: /sso/start -> the provider's
consent -> /sso/callback -> the login cookie. Then what must fail, cleanly and without a
cookie: another browser's state (login CSRF), a wrong or missing state, no flow cookie, the
provider's error, a domain not allowed; `next` never leaves this server; and the password form
refuses a single sign-on account."""
import http.client
import json
import os
import sys
import urllib.parse

import pytest

from weblib import REPO, UI

sys.path.insert(0, os.path.join(REPO, "test", "auth"))
from oidcmock import authorize_without_browser, start_mock  # noqa: E402

ALICE = ("alice-sub", {"email": "alice@example.com", "email_verified": True, "name": "Alice"})


@pytest.fixture
def idp():
    with start_mock() as mock:
        mock.set_user(*ALICE)
        mock.set_user("mallory-sub", {"email": "mallory@example.com", "email_verified": True})
        mock.set_user("bob-sub", {"email": "bob@elsewhere.org", "email_verified": True})
        yield mock


@pytest.fixture
def sso(home, target, idp):
    from overlord.ops import auth
    from overlord.ops import sso as oidc
    auth.add("ada", "admin", password="ada-password-1")      # sign-in on, a local admin
    oidc.configure(idp.issuer, "overlord-test", "the-client-secret", domains=["example.com"])
    ui = UI(home, target)
    ui.issuer = idp.issuer
    yield ui
    ui.close()


def send(ui, path, cookies=None, method="GET", body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=30)
    headers = dict(headers or {}, Host=ui.host)
    if cookies:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    raw = None
    if body is not None:
        raw = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=raw, headers=headers)
        res = conn.getresponse()
        data = res.read()
        return res.status, res.getheader("Location"), res.headers.get_all("Set-Cookie") or [], data
    finally:
        conn.close()


def cookies_of(lines):
    out = {}
    for line in lines:
        name, _, rest = line.partition("=")
        out[name] = (rest.split(";")[0], line)
    return out


def start(ui, next_path="/console"):
    """GET /sso/start: (the provider's authorize URL, this browser's flow cookie value)."""
    status, location, lines, data = send(ui, "/sso/start?" + urllib.parse.urlencode({"next": next_path}))
    assert status == 303, data
    jar = cookies_of(lines)
    value, line = jar["overlord_sso"]
    assert "HttpOnly" in line and "SameSite=Lax" in line and "Max-Age=600" in line
    assert location.startswith(ui.issuer + "/")             # off to the provider
    return location, value


def callback_path(url):
    parts = urllib.parse.urlsplit(url)
    return parts.path + "?" + parts.query


def whoami(ui, login):
    status, _, _, data = send(ui, "/api/whoami", cookies={"overlord_login": login})
    assert status == 200
    return json.loads(data)


def test_the_flow_signs_in_and_provisions_the_account(sso, idp):
    authorize, binding = start(sso, "/console")
    q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(authorize).query))
    assert q["code_challenge_method"] == "S256" and q["state"] and q["nonce"]
    assert q["redirect_uri"] == f"{sso.base}/sso/callback"
    back = authorize_without_browser(authorize, ALICE[0])
    status, _, lines, page = send(sso, callback_path(back), cookies={"overlord_sso": binding})
    assert status == 200, page
    jar = cookies_of(lines)
    login, line = jar["overlord_login"]
    assert "HttpOnly" in line and "SameSite=Strict" in line
    assert "Max-Age=0" in jar["overlord_sso"][1]                 # the flow cookie is cleared
    assert b'content="0;url=/console"' in page                  # on to next, same-site
    me = whoami(sso, login)
    assert me == {"accounts": True, "name": "alice@example.com", "role": "operator",
                  "via": "cookie", "sso": True}
    # the same callback again: the flow was used once
    status, _, lines, _ = send(sso, callback_path(back), cookies={"overlord_sso": binding})
    assert status == 400 and "overlord_login" not in cookies_of(lines)
    # the password form refuses a single sign-on account
    status, _, lines, data = send(sso, "/api/login", method="POST",
                                  body={"name": "alice@example.com", "password": "whatever-it-is"})
    assert status == 401 and b"single sign-on" in data and not lines


def test_another_browsers_state_fails_login_csrf(sso, idp):
    """Mallory starts a flow and consents as herself, then hands the callback to Alice's
    browser (which holds its own flow cookie, or none): refused, no login."""
    mallory_url, mallory_binding = start(sso)
    evil = callback_path(authorize_without_browser(mallory_url, "mallory-sub"))
    _, alice_binding = start(sso)
    for cookies in ({"overlord_sso": alice_binding}, {}):
        status, _, lines, data = send(sso, evil, cookies=cookies)
        assert status == 400, data
        assert "overlord_login" not in cookies_of(lines)
    # the flow was spent by the refused attempt: not even Mallory's browser may finish it now
    status, _, lines, _ = send(sso, evil, cookies={"overlord_sso": mallory_binding})
    assert status == 400 and "overlord_login" not in cookies_of(lines)


def test_wrong_or_missing_state_and_provider_errors_are_clean_refusals(sso, idp):
    url, binding = start(sso)
    back = urllib.parse.urlsplit(authorize_without_browser(url, ALICE[0]))
    q = dict(urllib.parse.parse_qsl(back.query))
    for query in ({"code": q["code"]}, {"code": q["code"], "state": "not-the-state"}, {}):
        status, _, lines, data = send(sso, "/sso/callback?" + urllib.parse.urlencode(query),
                                      cookies={"overlord_sso": binding})
        assert status == 400 and "error" in json.loads(data), data
        assert "overlord_login" not in cookies_of(lines)
    url, binding = start(sso)
    denied = authorize_without_browser(url, ALICE[0], deny=True)
    status, _, lines, data = send(sso, callback_path(denied), cookies={"overlord_sso": binding})
    assert status == 401 and "refused" in json.loads(data)["error"]
    assert "overlord_login" not in cookies_of(lines)


def test_a_browser_back_from_a_failed_sign_on_gets_the_sign_in_page_saying_so(sso, idp):
    """A person's browser (a page navigation) is shown the sign-in page with its error line,
    the refusal's status kept; never a JSON body, never a login."""
    url, binding = start(sso)
    denied = authorize_without_browser(url, ALICE[0], deny=True)
    status, _, lines, page = send(sso, callback_path(denied), cookies={"overlord_sso": binding},
                                  headers={"Sec-Fetch-Mode": "navigate", "Accept": "text/html"})
    assert status == 401 and b'id="signin-sso"' in page and b"<!doctype html" in page.lower()
    assert "overlord_login" not in cookies_of(lines)
    status, _, lines, page = send(sso, "/sso/callback?state=nope&code=x",
                                  cookies={"overlord_sso": binding}, headers={"Accept": "text/html"})
    assert status == 400 and b'id="signin-sso"' in page and "overlord_login" not in cookies_of(lines)


def test_a_domain_not_allowed_is_refused(sso, idp):
    url, binding = start(sso)
    back = authorize_without_browser(url, "bob-sub")
    status, _, lines, data = send(sso, callback_path(back), cookies={"overlord_sso": binding})
    assert status == 403, data
    assert "overlord_login" not in cookies_of(lines)
    from overlord.ops import auth
    assert auth.get("bob@elsewhere.org") is None


def test_next_never_leaves_this_server(sso, idp):
    for evil in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        url, binding = start(sso, evil)
        back = authorize_without_browser(url, ALICE[0])
        status, _, _, page = send(sso, callback_path(back), cookies={"overlord_sso": binding})
        assert status == 200 and b'content="0;url=/"' in page, (evil, page)


def test_the_sign_in_page_shows_the_button(sso):
    status, _, _, page = send(sso, "/login?next=/console")
    assert status == 200 and b'id="signin-sso"' in page
    assert b'id="signin-sso" hidden' not in page and b"/sso/start?next=%2Fconsole" in page
