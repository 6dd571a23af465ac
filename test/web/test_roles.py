"""Roles on every route: a real `overlord ui`, accounts made while it runs (sign-in turns on at
its next request), and every route of server.ROUTES called by each kind of principal -- an
anonymous client, the launch token alone (once accounts exist it names no one), a viewer,
an operator who does not own the session, the operator who does, an admin -- compared with a
table written here, independently of the server's own. A route added without a row here fails
test_every_route_has_a_row.

Expectations: OK (allowed: not 401/403/404, no 5xx), OK404 (allowed, and what it names may not
exist: 404 is the handler's own answer), or the status the refusal must have. Bodies are the
smallest that pass the gate and stop at the handler's validation where a call would change
things (commit {"force": "x"} is a 400), so the walk changes little."""
import json
import os

import pytest

from conftest import Ovl, SESSION_RE
from weblib import UI, require_kernel, ui  # noqa: F401

from overlord.web import server

OK, OK404 = "ok", "ok404"
SID_SEG, NAME_SEG, USER_SEG, TOKEN_SEG = server.S_ID, server.NAME, server.USER, server.TOKEN_ID
HOOK_SEG = server.HOOK
PRINCIPALS = ("anonymous", "launch", "viewer", "other", "owner", "admin")

A = (401, 401, OK, OK, OK, OK)                 # any signed-in principal
SEE = (401, 401, OK, 404, OK, OK)
CHANGE = (401, 401, 403, 404, OK, OK)
WRITE = (401, 401, 403, OK, OK, OK)
ADMIN = (401, 401, 403, 403, 403, OK)
ADMIN404 = (401, 401, 403, 403, 403, OK404)
AUDIT = (401, 401, OK, 403, 403, OK)
OPEN = (OK, OK, OK, OK, OK, OK)
OPEN404 = (OK404,) * 6
ACCOUNT = (401, 401, OK, OK, OK, OK)
PERSON_BY_TOKEN = (401, 401, 403, 403, 403, 403)     # a script token never does (a login does)
ACCOUNT404 = (401, 401, OK404, OK404, OK404, OK404)
A404 = (401, 401, OK404, OK404, OK404, OK404)

# (method, path pattern): (expectations, query, body)
EXPECTED = {
    ("GET", ("",)): (A, "", None),
    ("GET", ("console",)): (A, "", None),
    ("GET", ("api", "sessions")): (A, "", None),
    ("GET", ("api", "session", SID_SEG)): (SEE, "", None),
    ("POST", ("api", "session", SID_SEG, "commit")): (CHANGE, "", {"force": "x"}),
    ("POST", ("api", "session", SID_SEG, "rollback")): (CHANGE, "", {}),
    ("POST", ("api", "session", SID_SEG, "rewind")): (CHANGE, "", {}),
    ("POST", ("api", "session", SID_SEG, "fork")): (CHANGE, "", {}),
    ("POST", ("api", "session", SID_SEG, "revert")): (CHANGE, "", {}),
    ("GET", ("api", "session", SID_SEG, "check")): (SEE, "", None),
    ("POST", ("api", "session", SID_SEG, "review")): (CHANGE, "", {"same_model": "x"}),
    ("GET", ("api", "session", SID_SEG, "reviews")): (SEE, "", None),
    ("GET", ("api", "audit")): (AUDIT, "", None),
    ("GET", ("api", "blame")): (A404, "?path={target}/hello.txt", None),
    ("GET", ("api", "chats")): (A, "", None),
    ("POST", ("api", "chats")): (WRITE, "", {}),
    ("GET", ("api", "chats", SID_SEG)): (SEE, "", None),
    ("POST", ("api", "chats", SID_SEG, "message")): (CHANGE, "", {}),
    ("POST", ("api", "chats", SID_SEG, "cancel")): (CHANGE, "", {}),
    ("POST", ("api", "chats", SID_SEG, "approval")): (CHANGE, "", {}),
    ("GET", ("api", "connectors")): (A, "", None),
    ("GET", ("api", "chats", SID_SEG, "events")): (SEE, "", None),
    ("GET", ("api", "settings")): (A, "", None),
    ("PUT", ("api", "settings")): (WRITE, "", {}),
    ("GET", ("api", "models")): (A, "?provider=scripted", None),
    ("GET", ("api", "memory")): (A, "", None),
    ("GET", ("api", "memory", "user")): (A, "", None),
    ("PUT", ("api", "memory", "user")): (WRITE, "", {}),
    ("GET", ("api", "chats", SID_SEG, "memory")): (SEE, "", None),
    ("POST", ("api", "chats", SID_SEG, "memory", "accept")): (CHANGE, "", {}),
    ("GET", ("api", "skills")): (A, "", None),
    ("POST", ("api", "skills")): (ADMIN, "", {}),
    ("GET", ("api", "skills", NAME_SEG)): (A404, "", None),
    ("DELETE", ("api", "skills", NAME_SEG)): (ADMIN404, "", None),
    ("GET", ("login",)): (OPEN, "", None),
    ("POST", ("api", "login")): (OPEN, "", {}),
    ("POST", ("api", "logout")): (OPEN, "", {}),
    ("GET", ("api", "whoami")): (OPEN, "", None),
    ("GET", ("sso", "start")): (OPEN404, "?next=/", None),
    ("GET", ("sso", "callback")): (OPEN404, "?state=x&code=y", None),
    ("GET", ("api", "users")): (ADMIN, "", None),
    ("POST", ("api", "users")): (ADMIN, "", {}),
    ("PUT", ("api", "users", USER_SEG)): (ADMIN, "", {}),
    ("DELETE", ("api", "users", USER_SEG)): (ADMIN, "", None),
    ("POST", ("api", "me", "password")): (PERSON_BY_TOKEN, "", {}),
    ("GET", ("api", "me", "tokens")): (ACCOUNT, "", None),
    ("POST", ("api", "me", "tokens")): (PERSON_BY_TOKEN, "", {"label": "walk"}),
    ("DELETE", ("api", "me", "tokens", TOKEN_SEG)): (ACCOUNT404, "", None),
    ("GET", ("api", "usage")): (A, "", None),
    ("GET", ("api", "session", SID_SEG, "export")): (SEE, "", None),
    ("GET", ("api", "session", SID_SEG, "egress")): (SEE, "", None),
    ("GET", ("api", "webhooks")): (ADMIN, "", None),
    ("POST", ("api", "webhooks")): (ADMIN, "", {}),
    ("PUT", ("api", "webhooks", "base-url")): (ADMIN, "", {}),
    ("GET", ("api", "webhooks", "deliveries")): (ADMIN, "", None),
    ("DELETE", ("api", "webhooks", HOOK_SEG)): (ADMIN404, "", None),
    ("POST", ("api", "webhooks", HOOK_SEG, "test")): (ADMIN404, "", {}),
}


def test_every_route_has_a_row():
    """The server's table and this one name the same routes, and every route has a rule."""
    assert set(server.ROUTES) == set(EXPECTED), (set(server.ROUTES) ^ set(EXPECTED))
    assert set(server.RULES) == set(server.ROUTES)
    assert all(rule in server.R.RULES for rule in server.RULES.values())


def status_of(ui, method, path, auth, body):
    """The status of one request (a stream's too: its headers are read, not its body)."""
    conn = ui.conn(30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", ui.host)
        if auth:
            conn.putheader("Authorization", f"Bearer {auth}")
        raw = None
        if body is not None:
            raw = json.dumps(body).encode()
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(raw)))
        conn.endheaders(raw)
        res = conn.getresponse()
        if (res.getheader("Content-Type") or "").startswith("text/event-stream"):
            return res.status, b""
        return res.status, res.read()
    finally:
        conn.close()


def concrete(pattern, sid, query, target):
    segs = []
    for seg in pattern:
        segs.append(sid if seg is SID_SEG else "demo-skill" if seg is NAME_SEG else
                    "tmpuser" if seg is USER_SEG else "000000000000" if seg is TOKEN_SEG else
                    "walk-hook" if seg is HOOK_SEG else seg)
    return "/" + "/".join(segs) + query.format(target=target)


def allowed(status, want):
    if want == OK:
        return status < 500 and status not in (401, 403, 404)
    if want == OK404:
        return status < 500 and status not in (401, 403)
    return status == want


@pytest.fixture
def team(home, target):
    """A server, an operator's conversation (olive's), then the accounts: sign-in is on from
    the next request. Each principal is a script token, except the anonymous client and the
    launch token."""
    require_kernel()
    from overlord.ops import auth
    ui = UI(home, target)
    try:
        auth.add("olive", "operator", password="olive-password-1")
        tokens = {"owner": auth.mint_token("olive", label="t")[1]}
        r = ui.request("PUT", "/api/settings", body={"provider": "scripted"}, auth=False,
                       headers={"Authorization": f"Bearer {tokens['owner']}"})
        assert r.status == 200, r.body
        r = ui.request("POST", "/api/chats", body={"message": "hello"}, auth=False,
                       headers={"Authorization": f"Bearer {tokens['owner']}"})
        assert r.status == 200, r.body
        sid = r.json["sid"]
        for name, role, who in (("ada", "admin", "admin"), ("oscar", "operator", "other"),
                                ("vera", "viewer", "viewer")):
            auth.add(name, role, password=f"{name}-password-1")
            tokens[who] = auth.mint_token(name, label="t")[1]
        auth.add("tmpuser", "viewer", password="tmp-password-1")
        tokens["launch"], tokens["anonymous"] = ui.token, None
        yield ui, sid, tokens
    finally:
        ui.close()


def test_every_route_by_every_principal(team, target):
    ui, sid, tokens = team
    wrong = []
    for key, (want, query, body) in EXPECTED.items():
        method, pattern = key
        path = concrete(pattern, sid, query, target)
        for who, expect in zip(PRINCIPALS, want):
            status, data = status_of(ui, method, path, tokens[who], body)
            if not allowed(status, expect):
                wrong.append((method, path, who, expect, status, data[:200]))
    assert not wrong, "\n".join(map(repr, wrong))


def test_another_operators_session_is_as_if_it_did_not_exist(team):
    ui, sid, tokens = team
    ghost = "20200101-000000-abcdef"
    for path in (f"/api/session/{sid}", f"/api/chats/{sid}", f"/api/chats/{sid}/memory"):
        theirs = status_of(ui, "GET", path, tokens["other"], None)
        none = status_of(ui, "GET", path.replace(sid, ghost), tokens["other"], None)
        assert theirs[0] == none[0] == 404
        assert theirs[1].replace(sid.encode(), ghost.encode()) == none[1]


def listing(ui, token, path):
    r = ui.request("GET", path, auth=False, headers={"Authorization": f"Bearer {token}"})
    assert r.status == 200, r.body
    return r


def test_listings_are_filtered_and_may_write_says_who_writes(team):
    ui, sid, tokens = team
    for who, sees in (("owner", True), ("other", False), ("viewer", True), ("admin", True)):
        rows = listing(ui, tokens[who], "/api/sessions").json["sessions"]
        assert (sid in [r["sid"] for r in rows]) is sees, who
        chats = listing(ui, tokens[who], "/api/chats").json["chats"]
        assert (sid in [c["sid"] for c in chats]) is sees, who
        page = listing(ui, tokens[who], "/console").body
        assert (sid.encode() in page) is sees, who
    owner_rows = listing(ui, tokens["owner"], "/api/sessions").json["sessions"]
    assert [r["owner"] for r in owner_rows if r["sid"] == sid] == ["olive"]
    for who, may in (("owner", True), ("viewer", False), ("admin", True)):
        d = listing(ui, tokens[who], f"/api/chats/{sid}").json
        assert d["may_write"] is may, who


def test_blame_drops_what_the_principal_may_not_see(team, home, tmp_path):
    """A CLI session (no owner: the admin's) wrote a file: an operator gets 404 for its blame,
    a viewer and an admin see its lines."""
    ui, sid, tokens = team
    folder = tmp_path / "cli-folder"
    folder.mkdir()
    ovl = Ovl(home)
    proc = ovl("run", "-t", folder, "--", "sh", "-c", "echo cli > cli.txt", check=0)
    cli_sid = SESSION_RE.search(proc.out).group(1)
    ovl("commit", cli_sid, check=0)
    path = f"/api/blame?path={folder}/cli.txt"
    assert status_of(ui, "GET", path, tokens["other"], None)[0] == 404
    assert status_of(ui, "GET", path, tokens["owner"], None)[0] == 404
    for who in ("viewer", "admin"):
        status, data = status_of(ui, "GET", path, tokens[who], None)
        assert status == 200, data
        assert json.loads(data)["lines"][0]["owner"]["sid"] == cli_sid


def test_the_launch_token_still_works_with_accounts_off(ui):
    """Without accounts the launch token is the admin, as before (the whole suite runs so)."""
    assert ui.ok("GET", "/api/whoami") == {"accounts": False, "name": None, "role": "admin",
                                             "via": "launch", "sso": False}
    assert ui.ok("GET", "/api/users") == {"users": []}
    r = ui.post("/api/me/tokens", {"label": "x"})
    assert r.status == 409 and "no accounts" in r.json["error"]
    assert os.path.exists(os.path.join(ui.home, "ui.token"))


def as_(ui, token, method, path, body=None):
    r = ui.request(method, path, body=body, auth=False, headers={"Authorization": f"Bearer {token}"})
    assert r.status == 200, (method, path, r.status, r.body)
    return r.json


def wait_for(check, timeout=60):
    import time
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_account_acts_on_the_chain_from_its_threads_too(team):
    """The conversation's session (opened by the chat's thread, through the launcher) and a
    second-model review's verdict (appended by the review's thread) name olive as actor."""
    ui, sid, tokens = team
    olive = tokens["owner"]
    wait_for(lambda: not as_(ui, olive, "GET", f"/api/chats/{sid}")["chat"]["running"])
    as_(ui, olive, "PUT", "/api/settings", {"countersign": {"provider": "scripted"}})
    as_(ui, olive, "POST", f"/api/session/{sid}/review", {"same_model": True})
    wait_for(lambda: not (as_(ui, olive, "GET", f"/api/session/{sid}/reviews")["reviewing"] or
                          {}).get("running"))
    records = as_(ui, tokens["admin"], "GET", "/api/audit")["records"]
    mine = {r["action"]: r["actor"] for r in records if r.get("sid") == sid}
    assert mine.get("session.open") == "account:olive", mine
    assert mine.get("review.verdict") == "account:olive", mine


def test_a_login_may_do_what_a_script_token_may_not(team):
    """roles.PERSON: with a login (not a token) an account mints a token and reaches the
    password check (a wrong old password is the check's 401, not the rule's 403)."""
    ui, sid, tokens = team
    from overlord.ops import auth
    value = auth.login_create("vera")
    h = {"Cookie": f"overlord_login={value}", "Origin": ui.base}
    r = ui.request("POST", "/api/me/tokens", body={"label": "mine"}, auth=False, headers=h)
    assert r.status == 200 and r.json["token"].startswith("ovl_")
    r = ui.request("POST", "/api/me/password", body={"old": "not-it", "new": "new-password-1"},
                   auth=False, headers=h)
    assert r.status == 401


def test_a_stream_ends_when_its_readers_token_is_revoked(team):
    """A conversation's event stream re-checks its reader (every RECHECK seconds): once the
    token is revoked the stream ends rather than keep telling a signed-out account."""
    import time
    ui, sid, tokens = team
    from overlord.ops import auth
    tid, token = auth.mint_token("vera", label="stream")
    conn = ui.conn(60)
    conn.putrequest("GET", f"/api/chats/{sid}/events", skip_host=True)
    conn.putheader("Host", ui.host)
    conn.putheader("Authorization", f"Bearer {token}")
    conn.endheaders()
    res = conn.getresponse()
    assert res.status == 200
    auth.revoke("vera", tid)
    t = time.monotonic()
    while res.fp.readline():
        assert time.monotonic() - t < 40, "the stream went on after the token was revoked"
    conn.close()
