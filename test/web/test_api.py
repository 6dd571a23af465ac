"""The JSON API and the server's guards, over real HTTP against `overlord ui` on port 0: every
route, the launch token (file, cookie exchange, Bearer, 401), the origin guard (another loopback
port is refused), Host (421), the headers every answer carries, bad session ids, body limits and
malformed bodies (4xx, never 500), and a sandboxed process with the host's network refused."""
import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.parse

import pytest

from conftest import SESSION_RE, Ovl
from weblib import KEY, REPO, UI, AnthropicFake, ResponsesFake, require_kernel, ui  # noqa: F401

SID = "20260101-000000-abcdef"


@pytest.fixture
def ovl(home):
    return Ovl(home)


def session(ovl, target, script):
    proc = ovl("run", "-t", target, "--", "sh", "-c", script, check=0)
    return SESSION_RE.search(proc.out).group(1)


# -- the launch token ------------------------------------------------------------------------------

def test_the_token_lives_in_ui_token_0600_and_is_printed(ui, home):
    path = home / "ui.token"
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert path.read_text().strip() == ui.token and len(ui.token) >= 32
    assert ui.link == f"{ui.base}/?token={ui.token}"


def test_a_token_file_others_may_read_is_replaced(home, target):
    (home / "ui.token").write_text("0" * 48 + "\n")
    os.chmod(home / "ui.token", 0o644)
    server = UI(home, target)
    try:
        assert server.token != "0" * 48
        assert stat.S_IMODE(os.stat(home / "ui.token").st_mode) == 0o600
    finally:
        server.close()


def test_without_the_token_everything_but_healthz_is_401(ui):
    for path in ("/api/sessions", "/api/chats", "/api/settings", f"/api/session/{SID}",
                 "/api/models?provider=anthropic", "/api/blame?path=/x"):
        r = ui.get(path, auth=False)
        assert r.status == 401, path
        assert "error" in r.json
    assert ui.post("/api/chats", {"message": "hi"}, auth=False).status == 401
    page = ui.get("/", auth=False)
    assert page.status == 401 and b"launch token" in page.body
    assert page.header("content-type").startswith("text/html")
    r = ui.get("/api/sessions", auth=False, headers={"Authorization": "Bearer " + "f" * 48})
    assert r.status == 401
    r = ui.get("/api/sessions", auth=False, headers={"Cookie": "overlord_ui=" + ui.token})
    assert r.status == 401            # the cookie holds a derived value, not the token itself
    health = ui.get("/healthz", auth=False)
    assert health.status == 200 and health.json == {"ok": True}


def test_token_link_sets_a_strict_cookie_and_redirects_without_it(ui):
    r = ui.get(f"/console?token={ui.token}&x=1", auth=False)
    assert r.status == 303
    assert r.header("location") == "/console?x=1"
    cookie = r.header("set-cookie")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert ui.token not in cookie
    value = cookie.split(";")[0]
    page = ui.get("/console", auth=False, headers={"Cookie": value})
    assert page.status == 200 and b"Register" in page.body
    api = ui.get("/api/sessions", auth=False, headers={"Cookie": value, "Sec-Fetch-Site": "same-origin"})
    assert api.status == 200
    bad = ui.get(f"/?token={'0' * 48}", auth=False)
    assert bad.status == 401 and "set-cookie" not in bad.headers


def test_a_sandboxed_process_on_the_hosts_network_is_refused(ui, home, target):
    """Red team A13: with net=host a jailed command shares the loopback, yet it cannot read the
    token (OVERLORD_HOME is out of its reach) and without it every request is 401."""
    require_kernel()
    probe = (
        "import json, sys, urllib.request, urllib.error\n"
        "out = {}\n"
        "try:\n"
        f"    open({str(home / 'ui.token')!r}).read(); out['token'] = 'read'\n"
        "except OSError as e: out['token'] = type(e).__name__\n"
        "for path in ('/api/sessions', '/'):\n"
        f"    req = urllib.request.Request('{ui.base}' + path)\n"
        "    try: out[path] = urllib.request.urlopen(req, timeout=5).status\n"
        "    except urllib.error.HTTPError as e: out[path] = e.code\n"
        "    except OSError as e: out[path] = str(e)\n"
        "print(json.dumps(out))\n")
    proc = Ovl(home, "kernel")("run", "-t", target, "--jail", "--net", "host", "--", "python3", "-c", probe)
    assert proc.returncode == 0, proc.err
    out = json.loads(proc.out.splitlines()[0])
    assert out["token"] in ("FileNotFoundError", "PermissionError"), out
    assert out["/api/sessions"] == 401 and out["/"] == 401, out


# -- Host, Origin, headers ----------------------------------------------------------------------------

def test_a_foreign_host_header_is_421(ui):
    for host in ("evil.example", f"localhost:{ui.port}", "127.0.0.1", f"127.0.0.1:{ui.port + 1}", None):
        r = ui.get("/api/sessions", headers={"Host": host})
        assert r.status == 421, host
    assert ui.get("/healthz", headers={"Host": "rebind.example"}).status == 421


def test_state_changing_requests_must_come_from_this_origin(ui):
    cookie = ui.get(f"/?token={ui.token}", auth=False).header("set-cookie").split(";")[0]
    other = f"http://127.0.0.1:{ui.port + 1}"          # a page an agent serves on another port
    body = {"provider": "gemini"}
    refused = [
        {"Cookie": cookie, "Origin": other, "Sec-Fetch-Site": "same-site"},
        {"Cookie": cookie, "Origin": other},
        {"Cookie": cookie, "Sec-Fetch-Site": "same-site"},
        {"Cookie": cookie, "Sec-Fetch-Site": "cross-site"},
        {"Cookie": cookie, "Origin": "null"},
        {"Cookie": cookie},                                 # no evidence at all
        {"Authorization": f"Bearer {ui.token}", "Origin": other},
    ]
    for headers in refused:
        r = ui.put("/api/settings", body, auth="Authorization" in headers, headers=headers)
        assert r.status == 403, headers
    assert ui.ok("GET", "/api/settings")["provider"] == "anthropic"
    ok = [{"Cookie": cookie, "Origin": ui.base, "Sec-Fetch-Site": "same-origin"},
          {"Cookie": cookie, "Sec-Fetch-Site": "same-origin"},
          {"Cookie": cookie, "Origin": ui.base}]
    for headers in ok:
        assert ui.put("/api/settings", body, auth=False, headers=headers).status == 200, headers
    # reads with the cookie from another port are refused too (the API answers this page only)
    r = ui.get("/api/sessions", auth=False, headers={"Cookie": cookie, "Sec-Fetch-Site": "same-site"})
    assert r.status == 403
    # a script with the Bearer token needs no Origin
    assert ui.put("/api/settings", {"provider": "anthropic"}).status == 200


def test_every_answer_carries_the_security_headers(ui):
    page = ui.get("/")
    csp = page.header("content-security-policy")
    nonce = re.search(r"'nonce-([A-Za-z0-9_-]+)'", csp).group(1)
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert "style-src 'self'" in csp
    html = page.body.decode()
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts and all(f'nonce="{nonce}"' in s and "src=" in s for s in scripts)
    assert not re.search(r"\son[a-z]+\s*=", html), "an inline event handler"
    assert not re.search(r"\sstyle\s*=", html) and "<style" not in html
    again = ui.get("/").header("content-security-policy")
    assert again != csp                                     # a fresh nonce per response
    for r in (page, ui.get("/api/sessions"), ui.get("/api/nothing"), ui.get("/healthz")):
        assert r.header("x-content-type-options") == "nosniff"
        assert r.header("referrer-policy") == "no-referrer"
        assert r.header("cache-control") == "no-store"
        assert r.header("content-security-policy")
    assert ui.get("/api/sessions").header("content-type").startswith("application/json")


def test_static_assets_are_files_with_hashed_urls(ui):
    html = ui.get("/").body.decode()
    urls = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert {u.split("?")[0] for u in urls} >= {"/static/app.css", "/static/common.js", "/static/workspace.js"}
    for url in urls:
        r = ui.get(url.replace("&amp;", "&"))
        assert r.status == 200 and "immutable" in r.header("cache-control")
        name = url.split("?")[0].rsplit("/", 1)[1]
        with open(os.path.join(REPO, "overlord", "web", "static", name), "rb") as f:
            assert f.read() == r.body
    assert ui.get("/static/app.css").header("cache-control") == "no-store"
    js = ui.get("/static/workspace.js")
    assert js.header("content-type").startswith("text/javascript")
    for bad in ("/static/../server.py", "/static/%2e%2e/server.py", "/static/..%2fserver.py",
                "/static/nope.js", "/static/workspace.html"):
        assert ui.get(bad).status in (400, 404), bad


# -- paths, bodies, methods ------------------------------------------------------------------------------

def test_bad_session_ids_are_400(ui):
    for path in ("/api/session/..", "/api/session/%2e%2e", "/api/session/%2E%2E/meta",
                 "/api/session/..%2f..%2fetc", "/api/session/x", "/api/chats/../events",
                 "/api/session/20260101-000000-ABCDEF", "/api/chats/%2e%2e/events",
                 "/api/session/20260101-000000-abcdef%00"):
        r = ui.get(path)
        assert r.status == 400, (path, r.status)
        assert "error" in r.json
    assert ui.post("/api/session/%2e%2e/commit").status == 400
    assert ui.get(f"/api/session/{SID}").status == 404
    assert ui.post(f"/api/chats/{SID}/message", {"message": "x"}).status == 404


def test_unknown_routes_and_methods(ui):
    assert ui.get("/api/nothing").status == 404
    assert ui.get("/nothing").status == 404
    r = ui.request("DELETE", "/api/sessions")
    assert r.status == 405 and r.header("allow") == "GET"
    assert ui.get(f"/api/session/{SID}/commit").status == 405
    assert ui.request("PUT", "/api/chats", body={}).status == 405
    assert ui.request("BREW", "/").status in (400, 405, 501)


def test_bodies_are_capped_and_must_be_json_objects(ui):
    big = b'{"message": "' + b"x" * (1 << 20) + b'"}'
    r = ui.request("POST", "/api/chats", raw=big, headers={"Content-Type": "application/json"})
    assert r.status == 413 and "error" in r.json
    for raw in (b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe"):
        r = ui.request("POST", "/api/chats", raw=raw, headers={"Content-Type": "application/json"})
        assert r.status == 400, raw
    r = ui.request("PUT", "/api/settings", raw=b"", headers={"Content-Type": "application/json"})
    assert r.status == 400
    r = ui.request("POST", "/api/chats", raw=b"5\r\n{}\r\n0\r\n\r\n",
                   headers={"Transfer-Encoding": "chunked"})
    assert r.status == 411
    r = ui.request("POST", "/api/chats", raw=b"{}", headers={"Content-Length": "abc"})
    assert r.status == 400


def test_keep_alive_serves_many_requests_on_one_connection(ui):
    conn = ui.conn()
    try:
        took = []
        for _ in range(20):
            t = time.perf_counter()
            r = ui.get("/api/sessions", conn=conn)
            took.append(time.perf_counter() - t)
            assert r.status == 200
        # no Nagle / delayed-ACK stall (40 ms a request) on a kept-alive connection
        assert sorted(took)[10] < 0.025, took
        assert ui.get("/api/nothing", conn=conn).status == 404
        assert ui.get("/api/sessions", conn=conn).status == 200
    finally:
        conn.close()


# -- sessions: register, dossier, decisions ------------------------------------------------------------

def test_sessions_and_the_dossier(ui, ovl, target):
    sid = session(ovl, target, "printf 'one\\ntwo\\n' > hello.txt; echo new > new.txt; rm sub/a.txt")
    rows = ui.ok("GET", "/api/sessions")["sessions"]
    assert [r["sid"] for r in rows] == [sid] and rows[0]["state"] == "pending" and not rows[0]["chat"]
    d = ui.ok("GET", f"/api/session/{sid}")
    assert d["meta"]["sid"] == sid and d["meta"]["target"] == str(target) and d["staged"] is True
    changes = {c["path"]: c for c in d["changes"]}
    assert changes["hello.txt"]["kind"] == "modified" and changes["hello.txt"]["before"] != changes["hello.txt"]["after"]
    assert changes["sub/a.txt"]["after"] is None and changes["new.txt"]["before"] is None
    assert changes["new.txt"]["cause"]["command"].startswith("sh -c")
    diffs = {x["path"]: x for x in d["diffs"]}
    assert diffs["hello.txt"]["hunks"][0]["lines"] == [["-", "hello"], ["+", "one"], ["+", "two"]]
    assert diffs["sub/a.txt"]["removed"] == 1
    assert d["savepoints"][0]["paths"] == 3
    page = ui.get("/console").body.decode()
    assert sid in page                     # the register's first paint comes from the server


def test_commit_with_drift_is_refused_in_words_then_forced(ui, ovl, target):
    sid = session(ovl, target, "echo mine > hello.txt")
    (target / "hello.txt").write_text("theirs\n")
    r = ui.post(f"/api/session/{sid}/commit")
    assert r.status == 409
    assert r.json["drifts"][0]["path"] == "hello.txt"
    assert "changed outside OVERLORD" in r.json["drifts"][0]["words"] and r.json["drifts"][0]["forceable"]
    assert (target / "hello.txt").read_text() == "theirs\n"
    assert ui.ok("POST", f"/api/session/{sid}/commit", {"force": True})["state"] == "committed"
    assert (target / "hello.txt").read_text() == "mine\n"
    assert ui.post(f"/api/session/{sid}/commit").status == 409
    assert ui.post(f"/api/session/{sid}/rollback").status == 409


def test_rewind_fork_and_commit_by_dropping_savepoints(ui, ovl, target):
    sid = session(ovl, target, "echo 0 > zero.txt")
    for n in (1, 2, 3):
        assert ovl("exec", sid, "--", "sh", "-c", f"echo {n} > f{n}.txt").returncode == 0
    fork = ui.ok("POST", f"/api/session/{sid}/fork", {"at": 1})
    assert fork["from"] == sid and fork["at"] == 1
    assert {c["path"] for c in ui.ok("GET", f"/api/session/{fork['sid']}")["changes"]} == {"zero.txt", "f1.txt"}
    assert ui.ok("POST", f"/api/session/{sid}/rewind", {"to": 2}) == {"sid": sid, "to": 2, "dropped": 1}
    assert len(ui.ok("GET", f"/api/session/{sid}")["savepoints"]) == 3
    for bad in ({"to": "2"}, {"to": True}, {}, {"to": 9}):
        assert ui.post(f"/api/session/{sid}/rewind", bad).status == 400, bad
    assert ui.post(f"/api/session/{sid}/commit", {"drop": "layer:9"}).status == 400
    assert ui.post(f"/api/session/{sid}/commit", {"force": "yes"}).status == 400
    done = ui.ok("POST", f"/api/session/{sid}/commit", {"drop": ["layer:1"]})
    assert sorted(c["path"] for c in done["changes"]) == ["f2.txt", "zero.txt"]
    assert done["dropped"] == ["f1.txt"]
    assert not (target / "f1.txt").exists() and (target / "f2.txt").read_text() == "2\n"
    # the record says what was committed, and lists what was left out apart, as dropped
    d = ui.ok("GET", f"/api/session/{sid}")
    assert sorted(c["path"] for c in d["changes"]) == ["f2.txt", "zero.txt"]
    assert [(c["path"], c["layer"]) for c in d["dropped"]] == [("f1.txt", 1)]
    assert d["meta"]["committed_layers"] == [0, 2]
    assert ui.ok("POST", f"/api/session/{fork['sid']}/rollback") == {"sid": fork["sid"], "state": "rolled-back"}


def test_blame_of_a_committed_path(ui, ovl, target):
    sid = session(ovl, target, "printf 'a\\nb\\n' > b.txt")
    ui.ok("POST", f"/api/session/{sid}/commit")
    data = ui.ok("GET", "/api/blame?" + f"path={target}/b.txt")
    assert [line["text"] for line in data["lines"]] == ["a", "b"]
    assert data["lines"][0]["owner"]["sid"] == sid
    assert ui.get("/api/blame").status == 400
    assert ui.get("/api/blame?path=/not/known/anywhere").status == 400


# -- settings and models ---------------------------------------------------------------------------------

def test_settings_round_trip_keep_profiles_and_refuse_bad_values(ui, home, target):
    s = ui.ok("GET", "/api/settings")
    assert s["provider"] == "anthropic" and s["folder"] == str(target)
    assert s["sandbox"] == {"jail": True, "net": "none", "net_allow": [], "hold_writes": False}
    assert set(s["profiles"]) == {"anthropic", "openai", "azure", "openai-compatible", "gemini", "scripted"}
    ui.ok("PUT", "/api/settings", {"provider": "openai", "profile": {
        "model": "gpt-x", "base_url": "https://gw.example/v1", "headers": "X-Team: blue\nX-Api-Key: s3cr3t-value",
        "knobs": {"max_tokens": "2048", "temperature": "0.5", "effort": "high", "stop": ["END"]}}})
    ui.ok("PUT", "/api/settings", {"provider": "gemini", "profile": {"model": "gemini-x"},
                                   "api_key": "g-key-123", "sandbox": {"jail": False, "net": "host"}})
    s = ui.ok("GET", "/api/settings")
    assert s["provider"] == "gemini" and s["profiles"]["gemini"]["model"] == "gemini-x"
    openai = s["profiles"]["openai"]
    assert openai["model"] == "gpt-x" and openai["knobs"] == {"max_tokens": 2048, "temperature": 0.5,
                                                              "effort": "high", "stop": ["END"]}
    assert openai["headers"]["X-Team"] == "blue" and openai["headers"]["X-Api-Key"] != "s3cr3t-value"
    assert s["keys"]["gemini"] == "store" and "g-key-123" not in json.dumps(s)
    assert s["sandbox"] == {"jail": False, "net": "host", "net_allow": [], "hold_writes": False}
    # the masked value written back keeps the stored one
    ui.ok("PUT", "/api/settings", {"provider": "openai", "profile": {"headers": openai["headers"]}})
    stored = json.loads((home / "ui-settings.json").read_text())
    assert stored["profiles"]["openai"]["headers"]["X-Api-Key"] == "s3cr3t-value"
    assert stat.S_IMODE(os.stat(home / "ui-settings.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(home / "keys.json").st_mode) == 0o600
    bad = [({"provider": "nope"}, "provider"),
           ({"profile": {"base_url": "ftp://x"}}, "base_url"),
           ({"profile": {"knobs": {"temperature": "hot"}}}, "temperature"),
           ({"profile": {"knobs": {"max_tokens": 0}}}, "max_tokens"),
           ({"profile": {"knobs": {"effort": "extreme"}}}, "effort"),
           ({"profile": {"knobs": {"top_p": 2}}}, "top_p"),
           ({"profile": {"headers": "no colon here"}}, "headers"),
           ({"profile": {"headers": {"Bad Name": "x"}}}, "headers"),
           ({"profile": {"model": "a\nb"}}, "model"),
           ({"folder": "relative/path"}, "folder"),
           ({"folder": str(target / "missing")}, "folder"),
           ({"sandbox": {"jail": "yes"}}, "jail"),
           ({"sandbox": {"net": "everything"}}, "net"),
           ({"api_key": "two words"}, "api_key"),
           ({"colour": "red"}, "colour")]
    for body, field in bad:
        r = ui.put("/api/settings", body)
        assert r.status == 400 and r.json["field"] == field, (body, r.body)
    assert ui.ok("GET", "/api/settings")["provider"] == "openai"      # nothing half-applied


def test_models_come_from_the_endpoints_live_list(ui):
    fake = AnthropicFake()
    try:
        ui.use(fake)
        fake.queue(fake.models())
        listed = ui.ok("GET", "/api/models?provider=anthropic")
        assert [m["id"] for m in listed["models"]] == ["claude-test-5", "claude-test-4"]
        assert fake.requests[-1]["headers"]["x-api-key"] == KEY
        fake.queue(fake.models())
        assert ui.ok("GET", f"/api/models?provider=anthropic&base_url={fake.url}")["provider"] == "anthropic"
        assert ui.get("/api/models?provider=nope").status == 400
        assert ui.get("/api/models?provider=anthropic&base_url=file:///etc/passwd").status == 400
        r = ui.get("/api/models?provider=gemini")
        assert r.status == 409 and "no key for gemini" in r.json["error"]
        assert fake.problems == []
    finally:
        fake.close()


def test_chat_routes_refuse_what_is_not_a_conversation(ui, ovl, target):
    sid = session(ovl, target, "true")
    assert ui.get(f"/api/chats/{sid}").status == 404
    assert ui.get(f"/api/chats/{sid}/events").status == 404
    assert ui.post(f"/api/chats/{sid}/message", {"message": "x"}).status == 404
    assert ui.ok("POST", f"/api/chats/{sid}/cancel") == {"stopping": False}
    assert ui.ok("GET", "/api/chats") == {"chats": []}


def test_the_ui_command(home, target):
    env = dict(os.environ, OVERLORD_HOME=str(home), PYTHONPATH=REPO)
    help_ = subprocess.run([sys.executable, "-m", "overlord", "ui", "--help"], env=env,
                           capture_output=True, text=True)
    assert help_.returncode == 0 and "--port" in help_.stdout and "token" in help_.stdout
    bad = subprocess.run([sys.executable, "-m", "overlord", "ui", "--port", "0", "--folder",
                          str(target / "missing")], env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.startswith("overlord: no such folder")
    server = UI(home, target)
    try:
        taken = subprocess.run([sys.executable, "-m", "overlord", "ui", "--port", str(server.port)],
                               env=env, capture_output=True, text=True, timeout=30)
        assert taken.returncode == 1 and "cannot listen" in taken.stderr
    finally:
        server.close()


# -- names that are not UTF-8, metadata, privileged modes, the request log -------------------------

def test_a_target_whose_name_is_not_utf8_is_listed_with_its_bytes(ui, ovl, tmp_path):
    """It once hung GET /api/sessions (item 4): now strict JSON, escaped text plus *_b64."""
    import base64
    raw = os.fsencode(str(tmp_path)) + b"/t\xff"
    os.mkdir(raw)
    with open(raw + b"/n\xfe.txt", "wb") as f:
        f.write(b"old\n")
    script = "echo new > \"$(printf 'n\\376.txt')\"; echo x > \"$(printf 'b\\375')\""
    proc = ovl("run", "-t", os.fsdecode(raw), "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.err
    sid = SESSION_RE.search(proc.out).group(1)

    def strict(r):
        assert r.status == 200, r.body
        text = r.body.decode("utf-8")                     # valid UTF-8, so no lone surrogate
        assert not any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        return json.loads(text)
    conn = ui.conn(timeout=10)                             # a hang is a timeout, a failure
    try:
        rows = strict(ui.get("/api/sessions", conn=conn))["sessions"]
    finally:
        conn.close()
    assert rows[0]["target"] == f"{tmp_path}/t\\xff"
    assert base64.b64decode(rows[0]["target_b64"]) == raw
    d = strict(ui.get(f"/api/session/{sid}"))
    paths = {base64.b64decode(c["path_b64"]) if "path_b64" in c else c["path"].encode(): c
             for c in d["changes"]}
    assert set(paths) == {b"n\xfe.txt", b"b\xfd"}, paths
    assert paths[b"n\xfe.txt"]["path"] == "n\\xfe.txt" and paths[b"n\xfe.txt"]["kind"] == "modified"
    assert {x["path"] for x in d["diffs"]} == {"n\\xfe.txt", "b\\xfd"}
    page = ui.get("/console")
    assert page.status == 200 and "t\\xff" in page.body.decode("utf-8")
    assert ui.ok("POST", f"/api/session/{sid}/commit")["state"] == "committed"
    committed = strict(ui.get(f"/api/session/{sid}"))
    assert committed["meta"]["target_b64"] == rows[0]["target_b64"]
    # blame by the exact bytes of a name that is not UTF-8
    q = urllib.parse.quote(base64.b64encode(raw + b"/n\xfe.txt").decode(), safe="")
    blame = strict(ui.get("/api/blame?path_b64=" + q))
    assert [line["text"] for line in blame["lines"]] == ["new"]
    assert ui.get("/api/blame?path_b64=not*base64").status == 400


def test_metadata_changes_and_privileged_modes_in_words(ui, ovl, target):
    """chmod u+s lands only when the person allows it; the dossier says what changed."""
    sid = session(ovl, target, "chmod u+s hello.txt; chmod 0600 sub/a.txt")
    d = ui.ok("GET", f"/api/session/{sid}")
    notes = {c["path"]: c["notes"] for c in d["changes"]}
    before = stat.S_IMODE(os.stat(target / "hello.txt").st_mode)
    assert notes["hello.txt"] == [f"mode {before:04o} → {before | 0o4000:04o}", "setuid",
                                  "metadata only"]
    assert {c["path"]: c["privileged"] for c in d["changes"]}["hello.txt"] == ["setuid"]
    assert notes["sub/a.txt"] == [f"mode {stat.S_IMODE(os.stat(target / 'sub/a.txt').st_mode):04o} → 0600",
                                  "metadata only"]
    diffs = {x["path"]: x for x in d["diffs"]}
    assert diffs["hello.txt"]["summary"].startswith("metadata only: mode ")
    r = ui.post(f"/api/session/{sid}/commit")
    assert r.status == 409
    assert r.json["override"] == "allow_privileged_modes" and "allow_privileged_modes" in r.json["error"]
    assert r.json["privileged"] == [{"path": "hello.txt", "adds": ["setuid"], "notes": notes["hello.txt"]}]
    assert not stat.S_IMODE(os.stat(target / "hello.txt").st_mode) & 0o4000
    assert ui.post(f"/api/session/{sid}/commit", {"allow_privileged_modes": "yes"}).status == 400
    done = ui.ok("POST", f"/api/session/{sid}/commit", {"allow_privileged_modes": True})
    assert done["state"] == "committed"
    assert stat.S_IMODE(os.stat(target / "hello.txt").st_mode) & 0o4000
    d = ui.ok("GET", f"/api/session/{sid}")
    assert d["meta"]["allowed_privileged"] and d["dropped"] == []
    # the committed record tells the mode change (what the commit allowed is on the meta)
    assert {c["path"]: c["notes"] for c in d["changes"]}["hello.txt"][0] == notes["hello.txt"][0]


def test_the_request_log_never_writes_the_launch_token(home, target):
    server = UI(home, target, env={"OVERLORD_UI_LOG": "1"})
    try:
        r = server.get(f"/?token={server.token}", auth=False)
        assert r.status == 303
        cookie = r.header("set-cookie").split(";")[0]
        assert server.get("/console?x=1", auth=False, headers={"Cookie": cookie}).status == 200
        assert server.get(f"/console?%74oken={server.token}", auth=False).status == 303
        assert server.get("/api/sessions").status == 200            # Bearer
        assert server.get(f"/?token={'0' * 48}", auth=False).status == 401
        conn = server.conn()
        conn.sock = None
        conn.connect()
        conn.sock.sendall(f"BREW /?token={server.token} HTTP/1.1\r\nHost: {server.host}\r\n\r\n".encode())
        conn.sock.recv(4096)
        conn.close()
    finally:
        server.close()
    log = server.stderr()
    assert "/console?x=1" in log and "/api/sessions" in log            # it is the request log
    assert server.token not in log and cookie.split("=", 1)[1] not in log
    assert log.count("token=[redacted]") >= 3


def test_an_unchanged_session_is_listed_and_has_a_dossier(ui, ovl, target):
    """A run that changed nothing is recorded `unchanged` and closed (item 8)."""
    sid = session(ovl, target, "true")
    rows = {r["sid"]: r for r in ui.ok("GET", "/api/sessions")["sessions"]}
    assert rows[sid]["state"] == "unchanged"
    d = ui.ok("GET", f"/api/session/{sid}")
    assert d["meta"]["state"] == "unchanged" and d["staged"] is False
    assert d["changes"] == [] and d["dropped"] == [] and d["diffs"] == []
    assert ui.post(f"/api/session/{sid}/commit").status == 409
    page = ui.get("/console").body.decode()
    assert f'data-sid="{sid}" data-state="unchanged"' in page


# -- the record of trust: committed diffs, revert, the gate, policy, the second model, audit ------------

def policy(home, rule=None, **targets):
    (home / "policy.json").write_text(json.dumps({"default": rule or {}, **targets}))


def wait_review(ui, sid, timeout=60):
    """GET /reviews until the review under way has ended; return that answer."""
    deadline = time.monotonic() + timeout
    while True:
        r = ui.ok("GET", f"/api/session/{sid}/reviews")
        if r["reviewing"] and not r["reviewing"]["running"]:
            return r
        assert time.monotonic() < deadline, r
        time.sleep(0.05)


def countersign(ui, provider, model="", base_url="", key=None):
    body = {"countersign": {"provider": provider, "model": model, "base_url": base_url}}
    if key:
        body["countersign_key"] = key
    return ui.ok("PUT", "/api/settings", body)


def approve(fake, reason="looks right"):
    fake.queue(fake.turn(text="Reviewed.", calls=[("approve", {"reason": reason})]))


def test_the_committed_dossier_shows_its_diff_from_the_kept_objects_and_reverts(ui, ovl, target):
    sid = session(ovl, target, "printf 'hello\\nworld\\n' > hello.txt; echo new > new.txt; rm sub/a.txt")
    ui.ok("POST", f"/api/session/{sid}/commit")
    (target / "unrelated.txt").write_text("outside\n")       # the folder moves on; the record does not
    d = ui.ok("GET", f"/api/session/{sid}")
    assert d["staged"] is False and d["checks"] is None
    diffs = {x["path"]: x for x in d["diffs"]}
    assert set(diffs) == {"hello.txt", "new.txt", "sub/a.txt"}
    assert diffs["hello.txt"]["hunks"][0]["lines"] == [[" ", "hello"], ["+", "world"]]
    assert diffs["new.txt"]["hunks"][0]["lines"] == [["+", "new"]] and diffs["new.txt"]["kept"]
    assert diffs["sub/a.txt"]["kind"] == "deleted" and diffs["sub/a.txt"]["removed"] == 1
    # Revert stages the inverse as a new pending session; committing it puts the folder back
    r = ui.ok("POST", f"/api/session/{sid}/revert")
    assert r["reverts"] == sid and r["sid"] != sid
    back = ui.ok("GET", f"/api/session/{r['sid']}")
    assert back["meta"]["state"] == "pending" and back["meta"]["reverts"] == sid
    assert {(c["path"], c["kind"]) for c in back["changes"]} == {
        ("hello.txt", "modified"), ("new.txt", "deleted"), ("sub/a.txt", "added")}
    assert ui.post(f"/api/session/{r['sid']}/revert").status == 409      # only a committed one
    ui.ok("POST", f"/api/session/{r['sid']}/commit")
    assert (target / "hello.txt").read_text() == "hello\n" and not (target / "new.txt").exists()
    assert (target / "sub" / "a.txt").read_text() == "a\n"


def test_commit_from_the_web_is_held_to_policy_and_the_gate(ui, ovl, home, target):
    sid = session(ovl, target, "echo '{}' > package.json; echo x > hello.txt")
    # the gate's findings are in the dossier before Commit (default severity: warn)
    d = ui.ok("GET", f"/api/session/{sid}")
    found = [f for f in d["checks"]["findings"] if f["path"] == "package.json"]
    assert found and found[0]["kind"] == "dependencies" and found[0]["severity"] == "warn"
    assert ui.ok("GET", f"/api/session/{sid}/check")["findings"] == d["checks"]["findings"]
    # block: refused with the rule's one line, nothing written
    policy(home, {"checks": {"dependencies": "block"}})
    assert ui.ok("GET", f"/api/session/{sid}")["checks"]["findings"][0]["severity"] == "block"
    r = ui.post(f"/api/session/{sid}/commit")
    assert r.status == 409 and r.json["error"].startswith("commit refused: the content gate blocks "
                                                         "dependencies in package.json")
    assert "\n" not in r.json["error"] and not (target / "package.json").exists()
    # allow_force: false refuses force outright
    policy(home, {"allow_force": False})
    r = ui.post(f"/api/session/{sid}/commit", {"force": True})
    assert r.status == 409 and "policy forbids --force here (allow_force: false" in r.json["error"]
    # only with a fresh countersignature: none on record
    policy(home, {})
    r = ui.post(f"/api/session/{sid}/commit", {"countersigned": True})
    assert r.status == 409 and "--countersigned needs a fresh, complete second-model approval" in r.json["error"]
    assert ui.post(f"/api/session/{sid}/commit", {"countersigned": "yes"}).status == 400
    # a broken policy file refuses the commit and says so in the dossier's checks
    (home / "policy.json").write_text("{not json")
    assert "policy" in ui.ok("GET", f"/api/session/{sid}")["checks"]["error"]
    assert ui.post(f"/api/session/{sid}/commit").status == 409
    assert (target / "hello.txt").read_text() == "hello\n"
    policy(home, {})
    done = ui.ok("POST", f"/api/session/{sid}/commit")
    assert done["state"] == "committed" and done["countersigned"] is None
    assert any(f["path"] == "package.json" for f in done["findings"])


def test_the_second_model_check_with_the_demo_reviewer_gives_no_verdict(ui, ovl, target):
    sid = session(ovl, target, "echo changed > hello.txt")
    r = ui.post(f"/api/session/{sid}/review")
    assert r.status == 400 and r.json["field"] == "cs_provider"      # no second model named yet
    s = countersign(ui, "scripted")
    assert s["countersign"]["provider"] == "scripted"
    listed = ui.ok("GET", "/api/models?provider=scripted&role=countersign")["models"]
    assert [m["id"] for m in listed] == ["overlord-demo-reviewer"]
    d = ui.ok("GET", f"/api/session/{sid}")
    assert d["countersign"] == {"reviewer": "scripted:overlord-demo-reviewer", "agent": None,
                                "same_as_agent": False}
    started = ui.ok("POST", f"/api/session/{sid}/review")
    assert started["reviewing"]["reviewer"] == "scripted:overlord-demo-reviewer"
    done = wait_review(ui, sid)
    assert done["reviewing"]["error"] is None, done
    [v] = done["reviews"]
    assert v["verdict"] == "no-verdict" and v["reviewer"] == "scripted:overlord-demo-reviewer"
    assert v["fresh"] is True and v["same_model"] is False
    # it never countersigns: --countersigned is still refused
    r = ui.post(f"/api/session/{sid}/commit", {"countersigned": True})
    assert r.status == 409 and "fresh verdict is no-verdict" in r.json["error"]
    # a committed session cannot be reviewed
    ui.ok("POST", f"/api/session/{sid}/commit")
    r = ui.post(f"/api/session/{sid}/review")
    assert r.status == 409 and "committed" in r.json["error"]
    assert ui.ok("GET", f"/api/session/{sid}")["reviews"][0]["fresh"] is None


def test_an_approval_countersigns_until_the_change_moves(ui, ovl, home, target):
    sid = session(ovl, target, "echo changed > hello.txt")
    policy(home, {"require_review": True})
    r = ui.post(f"/api/session/{sid}/commit")
    assert r.status == 409 and "policy require_review" in r.json["error"]
    fake = ResponsesFake()
    try:
        countersign(ui, "openai", model=fake.MODEL, base_url=fake.url, key=KEY)
        fake.queue(fake.turn(text="ok", calls=[("approve", {"reason": "the edit is what was asked"})]))
        ui.ok("POST", f"/api/session/{sid}/review")
        [v] = wait_review(ui, sid)["reviews"][:1]
        assert (v["verdict"], v["reason"], v["reviewer"], v["fresh"], v["partial"]) == (
            "approve", "the edit is what was asked", f"openai:{fake.MODEL}", True, False)
        # another savepoint: the approval is stale, and require_review refuses again
        assert ovl("exec", sid, "--", "sh", "-c", "echo more > more.txt").returncode == 0
        d = ui.ok("GET", f"/api/session/{sid}")
        assert [x["fresh"] for x in d["reviews"]] == [False]
        r = ui.post(f"/api/session/{sid}/commit")
        assert r.status == 409 and "stale" in r.json["error"]
        # rewind back to what was reviewed: fresh again, and the commit is countersigned
        ui.ok("POST", f"/api/session/{sid}/rewind", {"to": 0})
        assert [x["fresh"] for x in ui.ok("GET", f"/api/session/{sid}/reviews")["reviews"]] == [True]
        done = ui.ok("POST", f"/api/session/{sid}/commit", {"countersigned": True})
        assert done["countersigned"] == {"review": 1, "reviewer": f"openai:{fake.MODEL}"}
        assert fake.problems == []
    finally:
        fake.close()


def test_a_fresh_rejection_blocks_until_forced(ui, ovl, target):
    sid = session(ovl, target, "echo changed > hello.txt")
    fake = AnthropicFake()
    try:
        countersign(ui, "anthropic", model=fake.MODEL, base_url=fake.url, key=KEY)
        fake.queue(fake.turn(calls=[("reject", {"reason": "it deletes the greeting", "paths": ["hello.txt"]})]))
        ui.ok("POST", f"/api/session/{sid}/review")
        [v] = wait_review(ui, sid)["reviews"]
        assert v["verdict"] == "reject" and v["paths"] == ["hello.txt"] and v["fresh"] is True
        r = ui.post(f"/api/session/{sid}/commit")
        assert r.status == 409 and r.json["forceable"] is True
        assert "the second model rejected this change (review #1: it deletes the greeting)" in r.json["error"]
        assert (target / "hello.txt").read_text() == "hello\n"
        assert ui.ok("POST", f"/api/session/{sid}/commit", {"force": True})["state"] == "committed"
        assert fake.problems == []
    finally:
        fake.close()


def test_a_review_that_cannot_run_says_why(ui, ovl, target):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    sid = session(ovl, target, "echo changed > hello.txt")
    countersign(ui, "openai", model="gpt-x")                 # no key for it: nothing is recorded
    ui.ok("POST", f"/api/session/{sid}/review")
    done = wait_review(ui, sid)
    assert done["reviewing"]["error"].startswith("no key for openai") and \
        done["reviewing"]["error"].endswith("add it under Settings \u2192 Countersignature"), done
    assert done["reviews"] == [] and ui.ok("GET", f"/api/session/{sid}")["reviewing"] == done["reviewing"]
    # an endpoint that does not answer: a no-verdict that says so (it never countersigns)
    countersign(ui, "openai-compatible", model="local", base_url=f"http://127.0.0.1:{port}/v1")
    ui.ok("POST", f"/api/session/{sid}/review")
    [v] = wait_review(ui, sid)["reviews"]
    assert v["verdict"] == "no-verdict" and f"cannot reach 127.0.0.1:{port}" in v["reason"]


def test_the_server_refuses_the_agents_own_model_as_the_second(ui, target):
    require_kernel()
    fake = AnthropicFake()
    try:
        ui.use(fake)
        fake.queue(fake.turn(calls=[("write_file", {"path": "a.txt", "content": "a\n"})]), fake.turn(text="done"))
        sid = ui.ok("POST", "/api/chats", {"message": "write a"})["sid"]
        ui.wait_idle(sid)
        countersign(ui, "anthropic", model=fake.MODEL, base_url=fake.url)
        d = ui.ok("GET", f"/api/session/{sid}")
        agent = f"anthropic:{fake.MODEL}"
        assert d["countersign"] == {"reviewer": agent, "agent": agent, "same_as_agent": True}
        r = ui.post(f"/api/session/{sid}/review")
        assert r.status == 409 and f"{agent} is this session's agent" in r.json["error"]
        assert len(fake.requests) == 2 and ui.ok("GET", f"/api/session/{sid}")["reviews"] == []
        # the person ticks the box that says so: reviewed, and the verdict records it
        approve(fake)
        ui.ok("POST", f"/api/session/{sid}/review", {"same_model": True})
        [v] = wait_review(ui, sid)["reviews"]
        assert v["same_model"] is True and v["agent"] == agent and v["verdict"] == "approve"
        assert fake.problems == []
    finally:
        fake.close()


def test_the_audit_log_and_its_verify_result(ui, ovl, target, home):
    sid = session(ovl, target, "echo changed > hello.txt")
    ui.ok("POST", f"/api/session/{sid}/commit")
    data = ui.ok("GET", "/api/audit")
    v = data["verify"]
    assert v["signed"] is True and v["ok"] is True and v["lines"] == data["total"] >= 2
    assert v["head"]["seq"] == data["records"][-1]["seq"]
    actions = [r["action"] for r in data["records"]]
    assert "session.open" in actions and "session.commit" in actions
    commits = ui.ok("GET", "/api/audit?action=session.commit")["records"]
    assert [r["sid"] for r in commits] == [sid]
    assert all(r["seq"] >= 2 for r in ui.ok("GET", "/api/audit?since=2")["records"])
    for bad in ("since=x", "since=-1", "action=a%20b"):
        assert ui.get(f"/api/audit?{bad}").status == 400, bad
    assert ui.get("/api/audit", auth=False).status == 401
    # an edited line: verify names it
    log = home / "audit.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[0] = lines[0].replace(b"session.open", b"session.opem")
    log.write_bytes(b"".join(lines))
    v = ui.ok("GET", "/api/audit")["verify"]
    assert v["ok"] is False and v["bad"]["line"] == 1
