"""Signing in to a real `overlord ui`: the login cookie, sign-out, the sign-in form and where it
sends the browser, wrong passwords (401, never a cookie), the lockout by name and by address
(requests from other loopback addresses: 127.0.0.2, ...), an unknown name costing what a known
one does, logins that outlive a restart and a `kill -9`, idle expiry, a password or role change
ending the account's other logins, revoked and orphaned script tokens, each account's own
settings, keys and notes, and the account as the actor on the audit chain.

Accounts are made in-process (overlord.ops.auth, the same OVERLORD_HOME) while the server runs:
sign-in turns on at its next request. Every scrypt costs ~0.35 s: each test makes few."""
import hashlib
import http.client
import json
import os
import stat
import time
import urllib.parse

import pytest

from weblib import UI

PW = {"ada": "ada-password-1", "olive": "olive-password-1", "oscar": "oscar-password-1"}


@pytest.fixture
def server(home, target):
    ui = UI(home, target)
    yield ui
    ui.close()


def add(*names, role=None):
    from overlord.ops import auth
    roles = {"ada": "admin"}
    for name in names:
        auth.add(name, role or roles.get(name, "operator"), password=PW[name])


def send(ui, method, path, body=None, headers=None, source=None, form=None):
    """One request; source: the client's own loopback address (the lockout counts by it)."""
    conn = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=30,
                                      source_address=(source, 0) if source else None)
    hdrs = {"Host": ui.host}
    raw = None
    if form is not None:
        raw = urllib.parse.urlencode(form).encode()
        hdrs["Content-Type"] = "application/x-www-form-urlencoded"
    elif body is not None:
        raw = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    try:
        conn.request(method, path, body=raw, headers=hdrs)
        res = conn.getresponse()
        data = res.read()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, data
    finally:
        conn.close()


def login(ui, name, password, source=None):
    return send(ui, "POST", "/api/login", {"name": name, "password": password}, source=source)


def cookie_of(headers):
    """The login cookie's value from a Set-Cookie header (None when none was set)."""
    line = headers.get("set-cookie")
    if not line:
        return None
    name, _, rest = line.partition("=")
    assert name == "overlord_login", line
    return rest.split(";")[0]


def signed_in(ui, name):
    status, headers, data = login(ui, name, PW[name])
    assert status == 200, data
    return cookie_of(headers)


def with_cookie(value, change=False, ui=None):
    h = {"Cookie": f"overlord_login={value}"}
    if change:
        h["Origin"] = ui.base
    return h


def whoami(ui, value):
    status, _, data = send(ui, "GET", "/api/whoami", headers=with_cookie(value))
    assert status == 200
    return json.loads(data)


def login_file(home, value):
    return os.path.join(home, "logins", hashlib.sha256(value.encode()).hexdigest() + ".json")


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


# -- the cookie, sign-out ----------------------------------------------------------------------------

def test_login_sets_a_strict_cookie_and_logout_ends_it(server, home):
    add("ada")
    status, headers, data = login(server, "ada", PW["ada"])
    assert status == 200 and json.loads(data) == {"name": "ada", "role": "admin"}
    line = headers["set-cookie"]
    for attr in ("HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={7 * 86400}"):
        assert attr in line, line
    assert "Secure" not in line and not line.startswith("__Host-")      # no TLS here
    value = cookie_of(headers)
    assert whoami(server, value) == {"accounts": True, "name": "ada", "role": "admin",
                                     "via": "cookie", "sso": False}
    path = login_file(home, value)
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    with open(path) as f:
        assert value not in f.read()                      # the file is keyed by its hash only
    status, _, _ = send(server, "GET", "/api/sessions", headers=with_cookie(value))
    assert status == 200
    # the launch token alone names no one once accounts exist
    status, _, data = send(server, "GET", "/api/sessions", headers=bearer(server.token))
    assert status == 401 and b"sign in" in data
    status, headers, data = send(server, "GET", "/", headers={})
    assert status == 401 and b"signin-form" in data
    status, headers, _ = send(server, "GET", f"/?token={server.token}")
    assert status == 303 and headers["location"].startswith("/login?") and "set-cookie" not in headers
    # sign-out: the file goes, the cookie is cleared and no longer works
    status, headers, _ = send(server, "POST", "/api/logout", {}, headers=with_cookie(value, True, server))
    assert status == 200 and "Max-Age=0" in headers["set-cookie"]
    assert not os.path.exists(path)
    assert whoami(server, value)["name"] is None
    assert send(server, "GET", "/api/sessions", headers=with_cookie(value))[0] == 401


def test_a_wrong_password_is_401_and_never_a_cookie(server):
    add("ada")
    status, headers, wrong = login(server, "ada", "not-the-password")
    assert status == 401 and "set-cookie" not in headers
    status, headers, unknown = login(server, "nobody", "not-the-password")
    assert status == 401 and "set-cookie" not in headers
    assert json.loads(wrong) == json.loads(unknown)              # the same words: no enumeration
    for bad in ("x", "A" * 43, "../../users", "\u00e9" * 10):
        status, _, _ = send(server, "GET", "/api/sessions",
                            headers={"Cookie": f"overlord_login={bad}".encode().decode("latin-1")})
        assert status == 401
    for body in ({}, {"name": "ada"}, {"name": 1, "password": "x"}, {"name": "ada", "password": ["x"]}):
        assert login(server, body.get("name"), body.get("password"))[0] in (400, 401)
    status, _, data = send(server, "GET", "/api/sessions", headers=bearer("ovl_000000000000_" + "a" * 43))
    assert status == 401


def test_the_sign_in_form_redirects_to_a_local_next_only(server):
    add("ada")
    origin = {"Origin": server.base}
    status, headers, _ = send(server, "POST", "/api/login", headers=origin,
                              form={"name": "ada", "password": PW["ada"], "next": "/console"})
    assert status == 303 and headers["location"] == "/console" and cookie_of(headers)
    status, headers, _ = send(server, "POST", "/api/login", headers=origin,
                              form={"name": "ada", "password": "wrong-password", "next": "/console"})
    assert status == 303 and "set-cookie" not in headers
    assert headers["location"].startswith("/login?") and "error=1" in headers["location"]
    for evil in ("//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"):
        status, headers, _ = send(server, "POST", "/api/login", headers=origin,
                                  form={"name": "ada", "password": PW["ada"], "next": evil})
        assert status == 303 and headers["location"] == "/", evil
    # a form posted from another site is refused before any password is looked at
    status, headers, _ = send(server, "POST", "/api/login", headers={"Origin": "http://evil.example"},
                              form={"name": "ada", "password": PW["ada"]})
    assert status == 403 and "set-cookie" not in headers
    status, _, page = send(server, "GET", "/login?error=1&next=/console")
    assert status == 200 and b"signin-form" in page and b'value="/console"' in page


# -- the lockout ----------------------------------------------------------------------------------------

def test_five_wrong_passwords_lock_the_name(server):
    """Five failures for one name, each from its own address (no address reaches five): the
    name is locked, even with the right password, from anywhere; another name is not."""
    add("ada", "olive")
    for i in range(5):
        assert login(server, "ada", "wrong-password", source=f"127.0.0.{i + 2}")[0] == 401
    status, headers, data = login(server, "ada", PW["ada"], source="127.0.0.9")
    assert status == 429 and int(headers["retry-after"]) >= 1 and "set-cookie" not in headers
    assert login(server, "olive", PW["olive"], source="127.0.0.9")[0] == 200
    actions = [r["action"] for r in audit_records(server, "olive")]
    assert actions.count("auth.login_failed") == 5 and "auth.lockout" in actions


def test_five_wrong_passwords_lock_the_address(server):
    """Five failures from one address, each for another name: that address is locked, even for
    a right password; the same account from another address is not."""
    add("ada")
    for i in range(5):
        assert login(server, f"nobody{i}", "wrong-password", source="127.0.0.2")[0] == 401
    assert login(server, "ada", PW["ada"], source="127.0.0.2")[0] == 429
    assert login(server, "ada", PW["ada"], source="127.0.0.3")[0] == 200


def test_an_unknown_name_costs_what_a_known_one_does(server):
    add("ada")
    def took(name):
        t = time.monotonic()
        assert login(server, name, "wrong-password")[0] == 401
        return time.monotonic() - t
    known = min(took("ada") for _ in range(2))
    unknown = min(took("nobody") for _ in range(2))
    assert 1 / 3 < unknown / known < 3, (known, unknown)


# -- durable logins -----------------------------------------------------------------------------------

def test_a_login_outlives_a_restart_and_a_kill_9(home, target):
    ui = UI(home, target)
    add("ada")
    value = signed_in(ui, "ada")
    ui.close()
    ui = UI(home, target)
    assert whoami(ui, value)["name"] == "ada"
    ui.proc.kill()
    ui.proc.wait()
    ui.close()
    ui = UI(home, target)
    try:
        assert whoami(ui, value)["name"] == "ada"
    finally:
        ui.close()


def test_an_idle_login_expires(server, home):
    add("ada")
    value = signed_in(server, "ada")
    path = login_file(home, value)
    with open(path) as f:
        rec = json.load(f)
    rec["seen"] = time.time() - 8 * 86400
    with open(path, "w") as f:
        json.dump(rec, f)
    assert whoami(server, value)["name"] is None
    assert send(server, "GET", "/api/sessions", headers=with_cookie(value))[0] == 401
    assert not os.path.exists(path)


def test_a_password_or_role_change_ends_the_accounts_other_logins(server):
    add("ada", "olive")
    mine, other = signed_in(server, "ada"), signed_in(server, "ada")
    status, _, data = send(server, "POST", "/api/me/password", {"old": "wrong-password", "new": "x" * 12},
                           headers=with_cookie(mine, True, server))
    assert status == 401
    status, _, data = send(server, "POST", "/api/me/password", {"old": PW["ada"], "new": "new-ada-password"},
                           headers=with_cookie(mine, True, server))
    assert status == 200, data
    assert whoami(server, mine)["name"] == "ada"
    assert whoami(server, other)["name"] is None
    olive = signed_in(server, "olive")
    status, _, data = send(server, "PUT", "/api/users/olive", {"role": "viewer"},
                           headers=with_cookie(mine, True, server))
    assert status == 200 and json.loads(data)["user"]["role"] == "viewer"
    assert whoami(server, olive)["name"] is None


def test_revoked_and_orphaned_tokens_name_no_one(server):
    add("ada", "olive")
    from overlord.ops import auth
    admin = auth.mint_token("ada", label="admin")[1]
    olive = signed_in(server, "olive")
    status, _, data = send(server, "POST", "/api/me/tokens", {"label": "script"},
                           headers=with_cookie(olive, True, server))
    assert status == 200, data
    minted = json.loads(data)
    assert minted["token"].startswith("ovl_")
    assert send(server, "GET", "/api/whoami", headers=bearer(minted["token"]))[2].count(b'"olive"') == 1
    listed = json.loads(send(server, "GET", "/api/me/tokens", headers=with_cookie(olive))[2])["tokens"]
    assert [t["id"] for t in listed] == [minted["id"]] and "token" not in listed[0]
    status, _, _ = send(server, "DELETE", f"/api/me/tokens/{minted['id']}", headers=with_cookie(olive, True, server))
    assert status == 200
    assert send(server, "GET", "/api/sessions", headers=bearer(minted["token"]))[0] == 401
    # a token of an account that is removed
    second = json.loads(send(server, "POST", "/api/me/tokens", {}, headers=with_cookie(olive, True, server))[2])
    assert send(server, "GET", "/api/sessions", headers=bearer(second["token"]))[0] == 200
    assert send(server, "DELETE", "/api/users/olive", headers=bearer(admin))[0] == 200
    assert send(server, "GET", "/api/sessions", headers=bearer(second["token"]))[0] == 401
    assert send(server, "GET", "/api/sessions", headers=with_cookie(olive))[0] == 401
    # an admin may not remove themselves
    assert send(server, "DELETE", "/api/users/ada", headers=bearer(admin))[0] == 409


# -- each account's own settings, keys and notes; the account on the audit chain --------------------------

def audit_records(ui, admin_name):
    from overlord.ops import auth
    if auth.get("ada") is None:
        add("ada")
    token = auth.mint_token("ada", label="audit")[1]
    status, _, data = send(ui, "GET", "/api/audit", headers=bearer(token))
    assert status == 200, data
    return json.loads(data)["records"]


def test_settings_keys_and_notes_are_each_accounts_own(server, home):
    add("olive", "oscar")
    from overlord.ops import auth
    olive, oscar = (auth.mint_token(n, label="t")[1] for n in ("olive", "oscar"))
    status, _, data = send(server, "PUT", "/api/settings",
                           {"provider": "anthropic", "api_key": "sk-olive-own-key",
                            "profile": {"model": "olive-model"}}, headers=bearer(olive))
    assert status == 200, data
    mine = json.loads(data)
    assert mine["keys"]["anthropic"] == "own" and mine["profiles"]["anthropic"]["model"] == "olive-model"
    theirs = json.loads(send(server, "GET", "/api/settings", headers=bearer(oscar))[2])
    assert theirs["keys"]["anthropic"] != "own" and theirs["profiles"]["anthropic"]["model"] == ""
    for name in ("ui.json", "keys.json"):
        st = os.stat(home / "users" / "olive" / name)
        assert stat.S_IMODE(st.st_mode) == 0o600
    assert "sk-olive-own-key" in (home / "users" / "olive" / "keys.json").read_text()
    assert not (home / "ui-settings.json").exists() and not (home / "keys.json").exists()
    status, _, data = send(server, "PUT", "/api/memory/user", {"text": "olive likes tabs\n"},
                           headers=bearer(olive))
    assert status == 200, data
    assert json.loads(send(server, "GET", "/api/memory/user", headers=bearer(olive))[2])["text"] == "olive likes tabs\n"
    assert json.loads(send(server, "GET", "/api/memory/user", headers=bearer(oscar))[2])["text"] == ""
    assert "olive likes tabs" in (home / "users" / "olive" / "memory.md").read_text()
    assert not (home / "memory.md").exists()
    # the acts are olive's on the audit chain
    records = audit_records(server, "ada")
    olive_acts = {r["action"] for r in records if r.get("actor") == "account:olive"}
    assert olive_acts, [(r["action"], r.get("actor")) for r in records]
    memory_acts = [r for r in records if r["action"].startswith("memory.")]
    assert memory_acts and all(r["actor"] == "account:olive" for r in memory_acts)


def test_a_sign_in_is_audited_with_the_account_as_actor(server):
    add("olive")
    signed_in(server, "olive")
    logins = [r for r in audit_records(server, "ada") if r["action"] == "auth.login"]
    assert logins and logins[-1]["actor"] == "account:olive" and logins[-1]["name"] == "olive"
    assert all("password" not in json.dumps(r) or "olive-password" not in json.dumps(r) for r in logins)
