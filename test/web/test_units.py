"""The web face's pure parts, without a server: diffs as correct patches, the request
coalescing (no answer older than its request), settings validation and the guard's decisions.
(Stop breaking a model call in another thread: test/agent/test_cancel.py.)"""
import os
import random
import re
import threading
import time
from email.message import Message

import pytest

from overlord.ops import patch as diffs
from overlord.web import api, security, settings


def patch(a, hunks):
    """Apply unified hunks to a, checking every context and removed line."""
    out, pos = [], 0
    for hunk in hunks:
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@$", hunk["header"])
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out += a[pos:start]
        pos = start
        for tag, text in hunk["lines"]:
            if tag in " -":
                assert a[pos] == text
                pos += 1
            if tag in " +":
                out.append(text)
    return out + a[pos:]


def test_diff_hunks_are_correct_patches_with_three_lines_of_context():
    rng = random.Random(7)
    for _ in range(2000):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 40))]
        b = list(a)
        for _ in range(rng.randint(0, 5)):
            r = rng.random()
            if r < 0.4 and b:
                b[rng.randrange(len(b))] = rng.choice("xyz")
            elif r < 0.7:
                b.insert(rng.randint(0, len(b)), rng.choice("xyz"))
            elif b:
                del b[rng.randrange(len(b))]
        out = {"hunks": [], "added": 0, "removed": 0, "truncated": False}
        diffs._hunks(out, a, b)
        assert patch(a, out["hunks"]) == b
        assert (a == b) == (out["hunks"] == [])
        for hunk in out["hunks"]:
            lines = hunk["lines"]
            changed = [i for i, (tag, _) in enumerate(lines) if tag != " "]
            assert changed[0] <= 3 and len(lines) - 1 - changed[-1] <= 3


def test_a_long_diff_is_cut_and_says_so(tmp_path):
    out = {"hunks": [], "added": 0, "removed": 0, "truncated": False}
    diffs._hunks(out, [], [str(i) for i in range(diffs.MAX_LINES + 50)])
    assert out["truncated"] and sum(len(h["lines"]) for h in out["hunks"]) == diffs.MAX_LINES
    assert out["added"] == diffs.MAX_LINES + 50


def test_coalesced_answers_are_never_older_than_their_request():
    shared = api.Coalesce()
    state = {"version": 0, "computations": 0}
    lock = threading.Lock()

    def compute():
        with lock:
            state["computations"] += 1
            seen = state["version"]
        time.sleep(0.01)
        return seen

    errors = []

    def client():
        for _ in range(20):
            with lock:
                state["version"] += 1
                asked_at = state["version"]
            got = shared.run("dossier", compute)
            if got < asked_at:
                errors.append((asked_at, got))
    threads = [threading.Thread(target=client) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert state["computations"] < 30 * 20 / 3          # shared, not once per request
    with pytest.raises(ZeroDivisionError):
        shared.run("x", lambda: 1 / 0)
    assert shared.run("x", lambda: 5) == 5              # a failure is not remembered


def test_knobs_and_headers_are_checked_field_by_field():
    assert settings.check_knobs({"max_tokens": "100", "temperature": 1, "top_p": "0.5", "stop": "A\nB",
                                 "effort": "low", "thinking": "off", "api": "chat", "stream": False,
                                 "max_tokens_x": None} | {"max_tokens_x": ""}) == {
        "max_tokens": 100, "temperature": 1.0, "top_p": 0.5, "stop": ["A", "B"], "effort": "low",
        "thinking": "off", "api": "chat", "stream": False}
    for knobs, field in (({"max_tokens": 1.5}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
                         ({"temperature": 3}, "temperature"), ({"wat": 1}, "wat"),
                         ({"stream": "yes"}, "stream"), ({"stop": ["x" * 300]}, "stop")):
        with pytest.raises(settings.Invalid) as e:
            settings.check_knobs(knobs)
        assert e.value.field == field
    old = {"Authorization": "Bearer real"}
    assert settings._headers({"Authorization": settings.MASK, "X-A": "1"}, old) == {
        "Authorization": "Bearer real", "X-A": "1"}
    with pytest.raises(settings.Invalid):
        settings._headers({"X-A": "1\r\nInjected: yes"}, {})


def _headers(**kw):
    m = Message()
    for k, v in kw.items():
        m[k.replace("_", "-")] = v
    return m


def test_the_guard_decides_by_origin_fetch_site_and_principal():
    g = security.Guard("t" * 48, "127.0.0.1", 7777)
    mine, other = "http://127.0.0.1:7777", "http://127.0.0.1:8000"
    assert g.host_ok(_headers(Host="127.0.0.1:7777")) and not g.host_ok(_headers(Host="localhost:7777"))
    assert g.principal(_headers(Authorization="Bearer " + "t" * 48)) == "bearer"
    assert g.principal(_headers(Cookie=f"a=b; overlord_ui={g.cookie_value}")) == "cookie"
    assert g.principal(_headers(Cookie="overlord_ui=" + "t" * 48)) is None
    ok = g.cross_origin
    assert ok("POST", _headers(Origin=mine), "cookie", True) is None
    assert ok("POST", _headers(Sec_Fetch_Site="same-origin"), "cookie", True) is None
    assert ok("POST", _headers(Origin=other), "cookie", True)
    assert ok("POST", _headers(), "cookie", True)
    assert ok("POST", _headers(), "bearer", True) is None
    assert ok("GET", _headers(Sec_Fetch_Site="same-site"), "cookie", True)
    assert ok("GET", _headers(Sec_Fetch_Site="same-site"), "cookie", False) is None   # a link to a page
    assert ok("GET", _headers(Origin=other), "bearer", True)


# -- names that are not UTF-8, metadata in words, the request log, the transcript's reasons -------

def _no_lone_surrogate(text):
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def test_json_answers_never_carry_lone_surrogates():
    import base64
    import json
    raw = b"/srv/t\xff/caf\xc3\xa9"
    path = os.fsdecode(raw)
    data = {"target": path, "sessions": [{"path": path, "paths": [path, "ok"], "error": f"no {path}"}],
            "plain": "café", path: 1}
    body = api.encode(data)
    text = body.decode("utf-8")                       # strict: valid UTF-8
    assert _no_lone_surrogate(text)
    out = json.loads(text)
    assert out["target"] == "/srv/t\\xff/café" and base64.b64decode(out["target_b64"]) == raw
    row = out["sessions"][0]
    assert base64.b64decode(row["path_b64"]) == raw and row["paths"] == ["/srv/t\\xff/café", "ok"]
    assert row["error"] == "no /srv/t\\xff/café" and "error_b64" not in row       # prose: escaped only
    assert out["plain"] == "café" and "plain_b64" not in out
    assert "/srv/t\\xff/café" in out
    exact = {"path": "/srv/ok", "n": [1, None, True]}
    assert api.encode(exact) == json.dumps(exact, ensure_ascii=False).encode()   # untouched


def test_metadata_changes_in_words():
    """The pages use the one vocabulary every face prints (ops.change_words), with arrows."""
    words = api.detail_words
    assert words({"type": "file", "mode": [0o644, 0o4644], "privileged": ["setuid"],
                  "metadata_only": True}, "modified") == ["mode 0644 → 4644", "setuid", "metadata only"]
    assert words({"type": "file", "mode": [0o2755, 0o755]}, "modified") == ["mode 2755 → 0755"]
    assert words({"type": "file", "mode": [None, 0o644]}, "added") == []      # an ordinary new file
    assert words({"type": "file", "mode": [None, 0o6755], "privileged": ["setuid", "setgid"]},
                 "added") == ["mode 6755", "setuid", "setgid"]
    assert words({"type": "file", "owner": [[0, 0], [1000, 1000]]}) == ["owner 0:0 → 1000:1000"]
    assert words({"xattrs": {"added": ["user.x", "system.posix_acl_access"], "removed": ["user.y"],
                             "changed": ["security.capability"]}, "privileged": ["acl"]}) == [
        "xattr user.x added", "ACL added", "xattr user.y removed", "capability changed",
        "ACL for another principal"]
    assert words({"type": "symlink", "before_type": "file", "link": "/etc/passwd"}, "modified") == [
        "link → /etc/passwd", "was a file"]
    assert words({"type": "char-device", "rdev": [1, 3]}) == ["char-device 1:3"]
    assert words({"type": "fifo"}) == ["fifo"] and words({}) == [] and words(None) == []



def test_the_request_log_never_holds_the_token_or_credentials():
    token, cookie = "ab" * 24, "cd" * 32
    lines = [f'127.0.0.1 - "GET /?token={token} HTTP/1.1" 303 -',
             f'127.0.0.1 - "GET /console?x=1&Token={token}#f HTTP/1.1" 303 -',
             f"127.0.0.1 - code 400, message Bad request syntax "
             f"('GET /?%74oken=%{ord(token[0]):02x}{token[1:]} HTTP/1.1')",
             f"Authorization: Bearer {token}", f"Cookie: overlord_ui={cookie}; a=b",
             f'127.0.0.1 - "GET /api/x?tok={token} HTTP/1.1" 404 -']
    for line in lines:
        out = security.redact(line, (token, cookie))
        assert token not in out and cookie not in out and security.REDACTED in out, out
    assert security.redact('"GET /api/sessions HTTP/1.1" 200 -') == '"GET /api/sessions HTTP/1.1" 200 -'


def test_a_failed_runs_reason_reaches_the_page():
    from overlord.web import chats
    error = chats.view_of({"type": "error", "turn": 1, "message": "anthropic: cannot reach "
                           "127.0.0.1:9: connection refused", "at": 1.0}, 4)
    assert error == {"i": 4, "type": "error", "at": 1.0, "turn": 1,
                     "message": "anthropic: cannot reach 127.0.0.1:9: connection refused"}
    done = chats.view_of({"type": "done", "reason": "error", "turns": 1, "usage": {},
                          "message": "anthropic: cannot reach 127.0.0.1:9: connection refused"}, 5)
    assert done["reason"] == "error" and "connection refused" in done["message"]
    task = chats.view_of({"type": "task", "text": "hi", "message": {"role": "user"}}, 0)
    assert "message" not in task


def test_the_demo_provider_ships_its_script(home):
    import json
    from overlord.agent.providers import scripted
    assert settings.DEMO in settings.PROVIDERS and settings.DEMO not in settings.NEEDS_KEY
    model, turns = scripted.load(settings.DEMO_SCRIPT)
    assert model == "overlord-demo" and len(turns) >= 3
    writes = [c for t in turns for c in t.get("tool_calls", ()) if c["name"] == "write_file"]
    assert writes, "the demo changes the folder, so there is a diff to review and commit"
    assert turns[-1].get("tool_calls") is None                # it ends, it does not loop
    with open(os.path.join(os.path.dirname(settings.__file__), "..", "..", "pyproject.toml")) as f:
        assert '"overlord.agent" = ["demo.json"]' in f.read()   # shipped as package data
    json.dumps(settings.Settings("/").public({}))
    with pytest.raises(settings.Invalid) as e:
        settings.Settings("/").update({"provider": settings.DEMO, "api_key": "k-123"})
    assert e.value.field == "api_key"


def test_the_countersignature_settings_and_the_demo_reviewer(home):
    from overlord.agent.providers import scripted
    model, turns = scripted.load(settings.DEMO_REVIEW_SCRIPT)
    assert model == settings.DEMO_REVIEWER != scripted.load(settings.DEMO_SCRIPT)[0]
    assert all(not t.get("tool_calls") for t in turns)       # it never approves nor rejects
    store = settings.Settings("/")
    assert store.load()["countersign"] == settings.empty_countersign()
    assert settings.reviewer(store.load()["countersign"]) is None            # never guessed
    keys = store.update({"countersign": {"provider": "openai", "model": "gpt-x",
                                         "base_url": "https://gw.example/v1",
                                         "headers": "X-Api-Key: s3cret"},
                         "countersign_key": "sk-1"})
    assert keys == [("openai", "sk-1")]
    assert settings.reviewer(store.load()["countersign"]) == "openai:gpt-x"
    assert store.public({})["countersign"]["headers"] == {"X-Api-Key": settings.MASK}
    store.update({"countersign": {"headers": {"X-Api-Key": settings.MASK}}})  # a mask keeps it
    assert store.load()["countersign"]["headers"] == {"X-Api-Key": "s3cret"}
    store.update({"countersign": {"provider": settings.DEMO, "model": "overlord-demo"}})
    assert store.load()["countersign"] == {"provider": settings.DEMO, "model": settings.DEMO_REVIEWER,
                                           "base_url": "", "headers": {}}
    for change, field in (({"countersign": {"provider": "nope"}}, "cs_provider"),
                          ({"countersign": {"provider": "openai", "base_url": "ftp://x"}}, "cs_base_url"),
                          ({"countersign": {"provider": "openai", "model": "a\nb"}}, "cs_model"),
                          ({"countersign": {"provider": "openai", "headers": "no colon"}}, "cs_headers"),
                          ({"countersign": {"knobs": {}}}, "knobs"),
                          ({"countersign": "openai"}, "cs_provider"),
                          ({"countersign_key": "k-1"}, "cs_api_key")):
        with pytest.raises(settings.Invalid) as e:
            store.update(change)
        assert e.value.field == field, change
    store.update({"countersign": {"provider": ""}})
    assert store.load()["countersign"] == settings.empty_countersign()


def test_a_handler_that_raises_is_answered_never_left_hanging(home, tmp_path, monkeypatch):
    """GET /api/sessions once hung on a target whose name is not UTF-8: the body failed to
    encode after the status line was buffered. Any failure, before or after an answer was
    begun, must be one whole JSON answer on a connection that keeps working."""
    import http.client
    import json
    from overlord.web import server

    def not_json(app, req):
        return {"x": {1, 2}}                                 # json cannot encode a set

    def half_answer(app, req):
        return server.Blob("a str, not bytes", "text/plain", "no-store")   # fails after start()

    def boom(app, req):
        raise RuntimeError("a bug")
    routes = dict(server.ROUTES)
    routes[("GET", ("api", "sessions"))] = not_json
    routes[("GET", ("api", "chats"))] = half_answer
    routes[("GET", ("api", "settings"))] = boom
    monkeypatch.setattr(server, "ROUTES", routes)
    token = "t" * 48
    httpd = server.Server(("127.0.0.1", 0), None)
    port = httpd.server_address[1]
    httpd.app = server.App(security.Guard(token, "127.0.0.1", port), settings.Settings(str(tmp_path)), {})
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    errors = []
    monkeypatch.setattr("traceback.print_exception", lambda *a, **k: errors.append(a[0]))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        headers = {"Host": f"127.0.0.1:{port}", "Authorization": f"Bearer {token}"}
        for path in ("/api/sessions", "/api/chats", "/api/settings", "/api/sessions"):
            conn.request("GET", path, headers=headers)
            res = conn.getresponse()
            body = res.read()
            assert res.status == 500, (path, res.status, body)
            assert json.loads(body) == {"error": "internal error (the server's log has the details)"}
            assert res.getheader("Content-Type").startswith("application/json")
        conn.request("GET", "/healthz", headers=headers)      # the same connection still works
        res = conn.getresponse()
        assert res.status == 200 and json.loads(res.read()) == {"ok": True}
        conn.close()
        assert errors == [TypeError, TypeError, RuntimeError, TypeError]   # each one logged
    finally:
        httpd.shutdown()
        httpd.server_close()
