"""Red team 2, issue 15, the web face: ownership through the routes that take a folder or a
path rather than a session id (blame, memory, skills), the accounts API driven into a state
with no administrator, cookies sent twice or under the wrong name, sign-in by GET or with an
oversized or oddly encoded body, what --log-json writes, and who the audit chain says acted.

A hole is a strict xfail naming it; an attack that is refused is a plain test guarding the
refusal. Logins are made with auth.login_create and tokens with auth.mint_token (no scrypt):
only the sign-in attacks pay one."""
import http.client
import json
import os
import sys
import urllib.parse

import pytest

from conftest import require_backend
from weblib import UI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))
from agentlib import call, write_script  # noqa: E402

from overlord import ops  # noqa: E402
from overlord.ops import auth  # noqa: E402

PW = {"ada": "ada-password-1", "vera": "vera-password-1", "olive": "olive-password-1",
      "bob": "bob-password-1", "ed": "ed-password-1"}
ROLE = {"ada": "admin", "vera": "viewer", "olive": "operator", "bob": "operator", "ed": "admin"}
WRITE = [{"tool_calls": [call("write_file", path="bob.txt", content="bob's line\n")]},
         {"text": "done"}]


@pytest.fixture
def server(home, target):
    ui = UI(home, target)
    yield ui
    ui.close()


@pytest.fixture
def kernel(monkeypatch, home):
    require_backend("kernel")
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", "kernel")
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return home


def add(*names):
    """Local accounts (one scrypt each); their logins and tokens are made without one."""
    for name in names:
        auth.add(name, ROLE[name], password=PW[name])


def bearer(name):
    return {"Authorization": f"Bearer {auth.mint_token(name, label='rt2')[1]}"}


def send(ui, method, path, body=None, headers=None, form=None, raw=None, ctype=None):
    conn = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=30)
    hdrs = {"Host": ui.host}
    if form is not None:
        raw = urllib.parse.urlencode(form).encode()
        hdrs["Content-Type"] = "application/x-www-form-urlencoded"
    elif body is not None:
        raw = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    if ctype:
        hdrs["Content-Type"] = ctype
    hdrs.update(headers or {})
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in hdrs.items():
            conn.putheader(k, v)
        if raw is not None:
            conn.putheader("Content-Length", str(len(raw)))
        conn.endheaders(raw)
        res = conn.getresponse()
        return res.status, res.getheaders(), res.read()
    finally:
        conn.close()


def header(headers, name):
    return [v for k, v in headers if k.lower() == name.lower()]


def bobs_committed_work(tmp_path):
    """bob's conversation on a folder of his, committed: his file, his journal entry."""
    folder = tmp_path / "bobs-project"
    folder.mkdir()
    (folder / "secret.txt").write_text("bob's private plan, never touched by a session\n")
    sid = ops.agent("bob's confidential task: plan the merger", str(folder), provider="scripted",
                    script=str(write_script(tmp_path, WRITE)), owner="bob").sid
    ops.commit(sid)
    return folder, sid


# -- a path or a folder instead of a session id -------------------------------------------------

def test_blame_does_not_read_another_operators_folder(kernel, tmp_path, target):
    add("olive")
    folder, sid = bobs_committed_work(tmp_path)
    ui = UI(kernel, target)
    try:
        q = urllib.parse.urlencode({"path": str(folder / "secret.txt")})
        status, _, data = send(ui, "GET", "/api/blame?" + q, headers=bearer("olive"))
        assert b"private plan" not in data, (status, data[:300])
        assert status == 404, (status, data[:300])
    finally:
        ui.close()


def test_blame_of_another_operators_lines_is_404(kernel, tmp_path, target):
    """What bob's session wrote (every line his) is as if it had no blame for olive."""
    add("olive")
    folder, sid = bobs_committed_work(tmp_path)
    ui = UI(kernel, target)
    try:
        q = urllib.parse.urlencode({"path": str(folder / "bob.txt")})
        status, _, data = send(ui, "GET", "/api/blame?" + q, headers=bearer("olive"))
        assert status == 404 and b"bob's line" not in data and sid.encode() not in data
        add("vera")
        status, _, data = send(ui, "GET", "/api/blame?" + q, headers=bearer("vera"))
        assert status == 200 and json.loads(data)["lines"][0]["owner"]["sid"] == sid
    finally:
        ui.close()


def test_memory_of_a_folder_does_not_tell_another_operators_sessions(kernel, tmp_path, target):
    add("olive")
    folder, sid = bobs_committed_work(tmp_path)
    ui = UI(kernel, target)
    try:
        assert send(ui, "GET", f"/api/session/{sid}", headers=bearer("olive"))[0] == 404
        q = urllib.parse.urlencode({"folder": str(folder)})
        status, _, data = send(ui, "GET", "/api/memory?" + q, headers=bearer("olive"))
        assert status == 200, data[:300]
        got = json.loads(data)
        assert sid not in json.dumps(got["journal"]), got["journal"]
        assert b"confidential task" not in data and sid.encode() not in data
    finally:
        ui.close()


def test_a_folder_overlapping_overlord_home_is_refused_for_memory_skills_and_chats(server, home):
    """An operator names OVERLORD_HOME (or a folder inside it) as the folder: refused, so no
    route reads users.json, the logins or another account's notes through it."""
    add("olive")
    h = bearer("olive")
    for folder in (str(home), str(home / "users"), str(home / "users" / "olive")):
        os.makedirs(folder, exist_ok=True)
        q = urllib.parse.urlencode({"folder": folder})
        for path in ("/api/memory?" + q, "/api/skills?" + q):
            status, _, data = send(server, "GET", path, headers=h)
            assert status == 400 and b"overlap" in data, (path, status, data[:200])
        status, _, data = send(server, "POST", "/api/chats",
                               {"message": "cat users.json", "provider": "scripted",
                                "folder": folder}, headers=h)
        assert status in (400, 409) and b"\"sid\"" not in data, (folder, status, data[:200])


# -- the accounts API: no way into a machine without an administrator --------------------------

def test_the_last_admin_cannot_demote_themselves(server):
    add("ada")
    login = auth.login_create("ada")
    h = {"Cookie": f"overlord_login={login}", "Origin": server.base}
    status, _, data = send(server, "PUT", "/api/users/ada", {"role": "viewer"}, headers=h)
    roles = {r["name"]: r["role"] for r in auth.listing()}
    assert "admin" in roles.values(), (status, data[:200], roles)
    assert status == 409, (status, data[:200])


def test_accounts_api_refuses_bad_roles_renames_and_self_removal(server):
    add("ada", "olive")
    h = bearer("ada")
    for body in ({"role": "root"}, {"role": "Admin"}, {"role": ["admin"]}, {"role": None},
                 {"role": "admin", "password": "both-at-once-1"}, {"name": "mallory"},
                 {"role": {"admin": 1}}, {}):
        status, _, data = send(server, "PUT", "/api/users/olive", body, headers=h)
        assert status == 400, (body, status, data[:200])
    for body in ({"name": "eve@example.com", "role": "admin", "password": "eve-password-1"},
                 {"name": "Eve", "role": "operator", "password": "eve-password-1"},
                 {"name": "eve", "role": "superuser", "password": "eve-password-1"},
                 {"name": "eve", "role": "operator"},
                 {"name": "../ada", "role": "operator", "password": "eve-password-1"}):
        status, _, data = send(server, "POST", "/api/users", body, headers=h)
        assert status == 400, (body, status, data[:200])
    status, _, _ = send(server, "DELETE", "/api/users/ada", headers=h)
    assert status == 409
    status, _, _ = send(server, "PUT", "/api/users/nobody", {"role": "viewer"}, headers=h)
    assert status == 404
    assert {r["name"]: r["role"] for r in auth.listing()} == {"ada": "admin", "olive": "operator"}


def test_an_admins_script_token_cannot_change_its_own_accounts_password(server):
    add("ada")
    login = auth.login_create("ada")                 # ada, signed in in her browser
    h = bearer("ada")                                # ada's CI token, leaked
    before = len(ops.audit_show(action="user.passwd"))
    status, _, data = send(server, "PUT", "/api/users/ada", {"password": "taken-over-1"},
                           headers=h)
    changed = len(ops.audit_show(action="user.passwd")) - before
    assert changed == 0 and auth.login_lookup(login) is not None, (status, data[:200])
    assert status == 403, (status, data[:200])


def test_another_accounts_token_cannot_be_revoked_or_listed(server):
    add("ada", "olive")
    tid, token = auth.mint_token("ada", label="ada-ci")
    h = bearer("olive")
    status, _, data = send(server, "DELETE", f"/api/me/tokens/{tid}", headers=h)
    assert status == 404, (status, data[:200])
    listed = json.loads(send(server, "GET", "/api/me/tokens", headers=h)[2])["tokens"]
    assert tid not in json.dumps(listed)
    assert auth.bearer(token).name == "ada"


def test_a_token_speaks_with_the_accounts_current_role(server):
    """A script token minted while ada was an admin: once she is a viewer it is a viewer's."""
    add("ada", "ed")
    h = bearer("ada")
    assert send(server, "GET", "/api/users", headers=h)[0] == 200
    auth.set_role("ada", "viewer", by="ed")
    assert send(server, "GET", "/api/users", headers=h)[0] == 403
    status, _, data = send(server, "PUT", "/api/settings", {}, headers=h)
    assert status == 403
    who = json.loads(send(server, "GET", "/api/whoami", headers=h)[2])
    assert who["role"] == "viewer"


# -- cookies -----------------------------------------------------------------------------------

def test_cookie_tricks_name_no_one_or_only_the_first(server):
    # the launch cookie, taken while sign-in was still off
    status, headers, _ = send(server, "GET", f"/?token={server.token}")
    launch = [c.split(";")[0] for c in header(headers, "Set-Cookie") if c.startswith("overlord_ui=")]
    assert status == 303 and launch, headers
    add("ada", "vera")
    admin, viewer = auth.login_create("ada"), auth.login_create("vera")

    def whoami(cookie, extra=None):
        h = {"Cookie": cookie}
        h.update(extra or {})
        return json.loads(send(server, "GET", "/api/whoami", headers=h)[2])
    # the __Host- name is TLS's: on plain http it names no one
    assert whoami(f"__Host-overlord_login={admin}")["name"] is None
    # twice: the first counts, a garbage first never falls through to a good second
    assert whoami(f"overlord_login=garbage; overlord_login={admin}")["name"] is None
    assert whoami(f"overlord_login={viewer}; overlord_login={admin}")["role"] == "viewer"
    # the launch token's cookie or header beside a viewer's login adds nothing
    got = whoami(f"overlord_login={viewer}", {"Authorization": f"Bearer {server.token}"})
    assert got["name"] is None and got["role"] is None
    got = whoami(f"overlord_login={viewer}", {"Authorization": "Basic YWRhOmFkYQ=="})
    assert got["name"] is None
    assert whoami(launch[0])["name"] is None
    assert whoami(f"{launch[0]}; overlord_login={viewer}")["role"] == "viewer"
    status, _, _ = send(server, "GET", "/api/users",
                        headers={"Cookie": f"{launch[0]}; overlord_login={viewer}"})
    assert status == 403
    status, _, _ = send(server, "GET", "/api/sessions", headers={"Cookie": launch[0]})
    assert status == 401
    # a change with the viewer's cookie and an admin's looking name around it
    status, _, _ = send(server, "GET", "/api/users",
                        headers={"Cookie": f"overlord_login={viewer}; OVERLORD_LOGIN={admin}"})
    assert status == 403


# -- signing in: by GET, too big, oddly encoded ------------------------------------------------

def failed_logins():
    return len(ops.audit_show(action="auth.login_failed"))


def test_sign_in_by_get_too_big_or_oddly_encoded_is_refused(server):
    add("ada")
    before = failed_logins()
    q = urllib.parse.urlencode({"name": "ada", "password": PW["ada"]})
    status, headers, _ = send(server, "GET", "/api/login?" + q)
    assert status in (401, 405) and not header(headers, "Set-Cookie")   # no GET route
    status, headers, _ = send(server, "POST", "/api/login?" + q, raw=b"")
    assert status in (400, 401) and not header(headers, "Set-Cookie")
    big = json.dumps({"name": "ada", "password": PW["ada"], "pad": "x" * (2 << 20)}).encode()
    status, headers, _ = send(server, "POST", "/api/login", raw=big, ctype="application/json")
    assert status == 413 and not header(headers, "Set-Cookie")
    odd = [
        ("application/x-www-form-urlencoded; charset=utf-16",
         "name=ada&password=".encode("utf-16-le") + PW["ada"].encode("utf-16-le")),
        ("application/x-www-form-urlencoded", b"name=ada%00&password=" + PW["ada"].encode()),
        ("application/x-www-form-urlencoded", b"name=ada&password=%FF%FE"),
        ("text/plain", b"name=ada&password=" + PW["ada"].encode()),
        ("multipart/form-data; boundary=x",
         b"--x\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nada\r\n--x--\r\n"),
        ("application/json", json.dumps({"name": ["ada"], "password": PW["ada"]}).encode()),
        ("application/json", json.dumps({"name": "ada", "password": {"$ne": ""}}).encode()),
        ("application/json", b'{"name": "ada", "password": "\\ud800"}'),
    ]
    for ctype, raw in odd:
        status, headers, data = send(server, "POST", "/api/login", raw=raw, ctype=ctype)
        assert not header(headers, "Set-Cookie"), (ctype, raw[:40], status)
        assert status in (303, 400, 401), (ctype, raw[:40], status, data[:200])
    # the %FF%FE password (decoded to U+FFFD twice) and the lone surrogate are well-formed
    # wrong guesses; the rest never reach the password check
    assert failed_logins() - before <= 2
    assert "Traceback" not in server.stderr()


# -- --log-json ----------------------------------------------------------------------------------

def test_log_json_keeps_no_typed_name_password_or_token(home, target):
    add("ada")
    ui = UI(home, target, args=("--log-json",))
    try:
        typed = "ada-typed-her-password-here"
        status, _, _ = send(ui, "POST", "/api/login", {"name": typed, "password": "hunter2-secret"})
        assert status == 401
        _, token = auth.mint_token("ada", label="log")
        send(ui, "GET", f"/?token={ui.token}")
        send(ui, "GET", f"/api/sessions?access_token={token}&password=hunter2-secret")
        send(ui, "GET", f"/%3Ftoken={ui.token}")
        send(ui, "GET", "/api/sessions", headers={"Authorization": f"Bearer {token}"})
        send(ui, "GET", "/sso/callback?code=the-code-123&state=the-state-456")
    finally:
        ui.close()
    err = ui.stderr()
    lines = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    assert len(lines) >= 6, err[-2000:]
    for secret in (typed, "hunter2-secret", token, ui.token, "the-code-123", "the-state-456"):
        assert secret not in err, secret
    assert any(ln["principal"] == "ada" and ln["path"] == "/api/sessions" for ln in lines), lines


# -- who the audit chain says acted --------------------------------------------------------------

def test_an_operators_commit_revert_fork_and_discard_name_the_account(kernel, tmp_path, target):
    add("olive")
    sid = ops.agent("olive's task", str(target), provider="scripted",
                    script=str(write_script(tmp_path, WRITE)), owner="olive").sid
    ui = UI(kernel, target)
    try:
        h = bearer("olive")

        def post(path, body=None):
            status, _, data = send(ui, "POST", path, body if body is not None else {}, headers=h)
            assert status == 200, (path, status, data[:300])
            return json.loads(data)
        post(f"/api/session/{sid}/commit")
        rev = post(f"/api/session/{sid}/revert")["sid"]
        fork = post(f"/api/session/{rev}/fork", {"at": 0})["sid"]
        post(f"/api/session/{fork}/rollback")
        for new in (rev, fork):
            meta = json.loads(send(ui, "GET", f"/api/session/{new}", headers=h)[2])["meta"]
            assert meta["owner"] == "olive", meta
        add("vera")
        status, _, data = send(ui, "GET", "/api/audit", headers=bearer("vera"))
        assert status == 200
        records = json.loads(data)["records"]
    finally:
        ui.close()
    acts = {(r["action"], r.get("sid")): r.get("actor") for r in records}
    mine = {k: v for k, v in acts.items() if k[1] in (rev, fork) or k == ("session.commit", sid)}
    assert ("session.revert", rev) in mine and ("session.fork", fork) in mine, mine
    for key in mine:
        assert mine[key] == "account:olive", (key, mine)
    for key in (("session.commit", sid), ("session.revert", rev), ("session.fork", fork)):
        assert acts.get(key) == "account:olive", (key, {k: v for k, v in acts.items()
                                                        if k[1] in (sid, rev, fork)})
