"""Red team, issue 15, the web face: a real `overlord ui` attacked with sign-in requests from
other origins, spoofed client addresses, method and path tricks around the role table, and
`next` values meant to leave the server or split a header.

A hole is a strict xfail naming it; an attack that is refused is a plain test guarding the
refusal. Accounts are made in-process (the same OVERLORD_HOME) and their logins with
auth.login_create (no hash): only the attacks on the password form pay a scrypt (~0.35 s)."""
import http.client
import json
import urllib.parse

import pytest

from weblib import UI

from overlord.ops import auth

PW = {"ada": "ada-password-1", "vera": "vera-password-1", "olive": "olive-password-1"}
ROLE = {"ada": "admin", "vera": "viewer", "olive": "operator"}


@pytest.fixture
def server(home, target):
    ui = UI(home, target)
    yield ui
    ui.close()


def add(*names):
    for name in names:
        auth.add(name, ROLE[name], password=PW[name])


def send(ui, method, path, body=None, headers=None, source=None, form=None, raw=None):
    """One request, exactly as given (the path is not quoted); source: the client's loopback
    address."""
    conn = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=30,
                                      source_address=(source, 0) if source else None)
    hdrs = {"Host": ui.host}
    if form is not None:
        raw = urllib.parse.urlencode(form).encode()
        hdrs["Content-Type"] = "application/x-www-form-urlencoded"
    elif body is not None:
        raw = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in hdrs.items():
            conn.putheader(k, v)
        if raw is not None:
            conn.putheader("Content-Length", str(len(raw)))
        conn.endheaders(raw)
        res = conn.getresponse()
        data = res.read()
        return res.status, res.getheaders(), data
    finally:
        conn.close()


def header(headers, name):
    return [v for k, v in headers if k.lower() == name.lower()]


def cookie(value, ui=None):
    h = {"Cookie": f"overlord_login={value}"}
    if ui is not None:
        h["Origin"] = ui.base          # a change from this very page
    return h


def users_roles():
    return {r["name"]: r["role"] for r in auth.listing()}


# -- the client's address is the socket's, never a header ------------------------------------------

def test_forwarded_headers_do_not_reset_the_address_lockout(server):
    add("ada")
    spoofs = [{"X-Forwarded-For": "10.0.0.1"}, {"X-Real-IP": "10.0.0.2"},
              {"Forwarded": "for=10.0.0.3"}, {"X-Forwarded-For": "127.0.0.9, 10.0.0.4"},
              {"X-Client-IP": "10.0.0.5", "True-Client-IP": "10.0.0.5"}]
    for i, spoof in enumerate(spoofs):                       # five names: only the address adds up
        status, _, _ = send(server, "POST", "/api/login", {"name": f"nobody{i}", "password": "x" * 9},
                            headers=spoof, source="127.0.0.3")
        assert status == 401
    status, headers, _ = send(server, "POST", "/api/login", {"name": "ada", "password": PW["ada"]},
                              headers={"X-Forwarded-For": "10.9.9.9", "X-Real-IP": "10.9.9.9"},
                              source="127.0.0.3")
    assert status == 429 and not header(headers, "Set-Cookie") and header(headers, "Retry-After")
    status, _, _ = send(server, "POST", "/api/login", {"name": "ada", "password": PW["ada"]},
                        source="127.0.0.4")
    assert status == 200                                     # the name itself is not locked


# -- sign-in and sign-out asked for by another site -------------------------------------------------

def test_login_and_logout_from_another_origin_are_refused_before_any_work(server, home):
    add("ada")
    login_ready = auth.login_create("ada")
    before = len([e for e in __import__("overlord.ops", fromlist=["audit"]).audit_show()
                  if e["action"] == "auth.login_failed"])
    foreign = [{"Origin": "http://evil.example"}, {"Origin": "null"},
               {"Origin": f"http://127.0.0.1:{server.port + 1}"},
               {"Origin": f"https://{server.host}"},
               {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
               {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"}]
    for h in foreign:
        for form in (True, False):
            fields = {"name": "ada", "password": PW["ada"], "next": "/"}
            status, headers, _ = send(server, "POST", "/api/login", headers=h,
                                      form=fields if form else None, body=None if form else fields)
            assert status == 403 and not header(headers, "Set-Cookie"), (h, form, status)
        # sign-out CSRF: the victim's cookie rides along, the login must survive
        status, headers, _ = send(server, "POST", "/api/logout", {},
                                  headers=dict(cookie(login_ready), **h))
        assert status == 403 and not header(headers, "Set-Cookie"), (h, status)
    assert auth.login_lookup(login_ready).name == "ada"
    after = len([e for e in __import__("overlord.ops", fromlist=["audit"]).audit_show()
                 if e["action"] == "auth.login_failed"])
    assert after == before                                   # refused before any check


# -- the role table: no method, path or header reaches an admin route ---------------------------

TRICKS = [
    ("GET", "/api/users", None, {}),
    ("HEAD", "/api/users", None, {}),
    ("OPTIONS", "/api/users", None, {}),
    ("GET", "/api/%75sers", None, {}),
    ("GET", "/api/users?role=admin", None, {}),
    ("GET", "/api/users/", None, {}),
    ("GET", "/api//users", None, {}),
    ("GET", "/API/users", None, {}),
    ("GET", "/api/users%2F", None, {}),
    ("GET", "/api/./users", None, {}),
    ("GET", "/api/x/../users", None, {}),
    ("GET", "//api/users", None, {}),
    ("GET", "/api/users;admin", None, {}),
    ("POST", "/api/users", {"name": "mallory", "role": "admin", "password": "mallory-pass-1"}, {}),
    ("POST", "/api/users", {"name": "mallory", "role": "admin", "password": "mallory-pass-1"},
     {"X-HTTP-Method-Override": "GET", "X-Method-Override": "GET"}),
    ("GET", "/api/users", None, {"X-HTTP-Method-Override": "POST", "X-Original-URL": "/api/whoami",
                                 "X-Rewrite-URL": "/api/whoami"}),
    ("PUT", "/api/users/{me}", {"role": "admin"}, {}),
    ("PUT", "/api/users/%7Bme%7D", {"role": "admin"}, {}),
    ("PUT", "/api/users/ada", {"password": "taken-over-1"}, {}),
    ("DELETE", "/api/users/ada", None, {}),
    ("PATCH", "/api/users/ada", {"role": "viewer"}, {}),
    ("POST", "/api/skills", {"name": "x"}, {}),
    ("DELETE", "/api/skills/x", None, {}),
]


@pytest.mark.parametrize("who", ["vera", "olive"])
def test_a_viewer_or_operator_never_reaches_an_admin_route(server, who):
    add("ada", who)
    value = auth.login_create(who)
    _, token = auth.mint_token(who, label="script")
    for method, path, body, extra in TRICKS:
        path = path.replace("{me}", who)
        for creds in (cookie(value, server), {"Authorization": f"Bearer {token}"}):
            status, _, data = send(server, method, path, body, headers=dict(creds, **extra))
            assert status in (400, 403, 404, 405), (who, method, path, extra, status, data[:200])
            assert b"ada-password" not in data and b'"users"' not in data
    assert users_roles() == {"ada": "admin", who: ROLE[who]}
    assert auth.check_password("ada", PW["ada"], "127.0.0.8").name == "ada"


# -- where a sign-in sends the browser ----------------------------------------------------------

def test_safe_next_keeps_every_browser_on_this_server():
    from overlord.web import accounts
    leave = ["//evil.example", "/\\evil.example", "\\\\evil.example", "/\t/evil.example",
             "/\n/evil.example", "/\r\n/evil.example", "https://evil.example", "https:evil.example",
             "javascript:alert(1)", "/x\r\nSet-Cookie: a=b", "/\x00", " /", "evil.example",
             "/\\/evil.example", "/login?next=//evil.example", "/sso/start?next=//evil.example",
             "/api/logout", "\u3000//evil.example", "/" + "a" * 3000, None, 7, ["/"]]
    for value in leave:
        assert accounts.safe_next(value) == "/", value
    for value in ("/", "/console", "/%2F%2Fevil.example", "/a//b", "/?q=//evil.example#x"):
        got = accounts.safe_next(value)
        parts = urllib.parse.urlsplit(got)
        assert got.startswith("/") and not got.startswith("//") and not parts.netloc


def test_a_form_sign_in_never_splits_a_header_or_leaves(server):
    add("ada")
    for nxt in ("/x\r\nSet-Cookie: evil=1", "/\t/evil.example"):
        status, headers, _ = send(server, "POST", "/api/login", headers={"Origin": server.base},
                                  form={"name": "ada", "password": PW["ada"], "next": nxt})
        assert status == 303 and header(headers, "Location") == ["/"], (nxt, headers)
        assert len(header(headers, "Set-Cookie")) == 1 and "evil" not in str(headers)


def test_a_form_sign_in_with_a_unicode_next_is_a_redirect(home, target):
    add("ada")
    ui = UI(home, target)
    try:
        status, headers, data = send(ui, "POST", "/api/login", headers={"Origin": ui.base},
                                     form={"name": "ada", "password": PW["ada"], "next": "/\u2603"})
        assert status == 303 and header(headers, "Set-Cookie"), (status, data[:200])
        assert "Traceback" not in ui.stderr()
    finally:                      # closed here: the fixture's own Traceback check is this test's
        ui.proc.terminate()
        ui.proc.wait(10)
        ui.proc.stdout.close()


def test_the_sign_in_page_escapes_next_and_error(server):
    add("ada")
    evil = '/"><script>alert(1)</script><form action="//evil.example">'
    q = urllib.parse.urlencode({"next": evil, "error": "<b>owned</b>"})
    status, _, data = send(server, "GET", "/login?" + q)
    assert status == 200
    assert b"<script>alert" not in data and b"<b>owned" not in data
    assert b'action="//evil.example"' not in data


# -- script tokens ---------------------------------------------------------------------------------

def test_a_script_token_cannot_mint_its_successor(server):
    add("olive")
    tid, token = auth.mint_token("olive", label="ci")
    status, _, data = send(server, "POST", "/api/me/tokens", {"label": "backdoor"},
                           headers={"Authorization": f"Bearer {token}"})
    auth.revoke("olive", tid)                          # the owner revokes the leaked token
    assert status in (401, 403, 409), (status, data[:200])
    assert [t["label"] for t in auth.tokens("olive")] == []


# -- the machine's shared provider key ------------------------------------------------------------

@pytest.mark.parametrize("who", ["vera", "olive"])
def test_the_machines_key_is_not_sent_to_a_url_an_account_chose(server, who):
    import http.server
    import threading
    from overlord import ops
    add(who)
    secret = "sk-machine-shared-0123456789abcdef"
    ops.keys_set("openai", secret)
    seen = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(dict(self.headers))
            data = b'{"object": "list", "data": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        value = auth.login_create(who)
        q = urllib.parse.urlencode({"provider": "openai",
                                    "base_url": f"http://127.0.0.1:{srv.server_port}/v1"})
        send(server, "GET", "/api/models?" + q, headers=cookie(value))
    finally:
        srv.shutdown()
        srv.server_close()
    assert not any(secret in json.dumps(h) for h in seen), seen


# -- single sign-on: one anonymous client against everyone's pending sign-ins ----------------------

def test_one_client_cannot_evict_another_browsers_sign_in(server):
    import http.server
    import threading
    from overlord.ops import sso
    add("ada")
    doc = {}

    class Provider(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(200, doc)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.reply(400, {"error": "invalid_grant"})      # the code is refused: far enough

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = "http://127.0.0.1:%d" % srv.server_port
        doc.update(issuer=base, authorization_endpoint=base + "/authorize",
                   token_endpoint=base + "/token", userinfo_endpoint=base + "/me",
                   jwks_uri=base + "/jwks")
        sso.configure(base, "cid", "secret", domains=["example.com"])
        status, headers, _ = send(server, "GET", "/sso/start?next=/", source="127.0.0.5")
        assert status == 303
        state = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(
            header(headers, "Location")[0]).query))["state"]
        binding = [c.split(";")[0] for c in header(headers, "Set-Cookie")
                   if c.startswith("overlord_sso=")][0]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30,
                                          source_address=("127.0.0.6", 0))
        try:
            for _ in range(1001):                             # one keep-alive connection
                conn.request("GET", "/sso/start", headers={"Host": server.host})
                res = conn.getresponse()
                res.read()
                if res.status != 303:
                    break                                     # refused: a fix
        finally:
            conn.close()
        q = urllib.parse.urlencode({"code": "C-1", "state": state})
        status, _, data = send(server, "GET", "/sso/callback?" + q, headers={"Cookie": binding},
                               source="127.0.0.5")
        assert b"unknown or has expired" not in data, (status, data[:200])
    finally:
        srv.shutdown()
        srv.server_close()


# -- beyond loopback, the launch token must never do -------------------------------------------

def test_beyond_loopback_the_launch_token_never_does_even_after_the_last_account_goes(
        home, target, tmp_path):
    from conftest import Ovl
    name = "overlord.test"
    out = tmp_path / "tls"
    Ovl(home)("tls", "selfsign", "--host", name, "--host", "127.0.0.1", "--out", out, check=0)
    auth.add("ada", "admin", password=PW["ada"])
    ui = UI(home, target, args=("--bind", "0.0.0.0", "--tls-cert", out / "cert.pem",
                                "--tls-key", out / "key.pem", "--host", name),
            cafile=out / "cert.pem")
    try:
        assert ui.get("/api/sessions").status == 401            # the launch token: no one
        auth.remove("ada")                                      # the last account goes
        assert ui.get("/api/sessions").status == 401
        assert ui.get("/api/users").status in (401, 403)
    finally:
        ui.close()
