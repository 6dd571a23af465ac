"""The recorded network (`--net proxy`) in a real browser (Playwright + Debian's Chromium)
against `overlord ui`: the Settings dialog's "recorded (proxy)" network with its allowlist (a
bad entry refused inline, next to the field; the fixed list saved normalised, with the hold);
and a real proxy session (`overlord run --net proxy --net-allow 127.0.0.1 --hold-writes`)
whose command made two POSTs that the session's proxy held: the console's Egress section shows
the log (hostile host, path and cause written into it as text: no element made, no dialog),
the held list unticked, and Commit with h0001 ticked sends exactly h0001 to a real upstream on
127.0.0.1 while h0002 is dropped, and the page says so.

Every page: no page error, no console error, no CSP violation (the Pages fixture), no dialog."""
import base64
import http.server
import json
import os
import threading

import pytest

from conftest import SESSION_RE, Ovl
from weblib import require_kernel, ui  # noqa: F401
from test_browser import Pages, browser, pages  # noqa: F401 -- fixtures

try:
    from playwright.sync_api import expect
except ImportError:                     # pragma: no cover - test_browser's fixture skips then
    expect = None

HOSTILE_HOST = "<img src=x onerror=alert(1)>"
HOSTILE_PATH = "/\x1b[31mred\x1b[0m/\u202egnp.exe/<script>alert(2)</script>"
HOSTILE_CAUSE = "<b onmouseover=alert(3)>bold</b>\u2066cause\u2069"


def watch(page):
    """Every page error and every dialog the page opens (an injected handler would open one)."""
    seen = {"errors": [], "dialogs": []}
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))

    def dialog(d):
        seen["dialogs"].append(d.message)
        d.dismiss()
    page.on("dialog", dialog)
    return seen


def clean(seen):
    assert seen["errors"] == [], seen["errors"]
    assert seen["dialogs"] == [], seen["dialogs"]


# -- Settings --------------------------------------------------------------------------------------

def test_settings_recorded_network_allowlist_refused_inline_then_saved(ui, home, pages):
    require_kernel()
    ui.ok("PUT", "/api/settings", {"provider": "scripted"})      # Save closes (the demo has its model)
    page = pages()
    seen = watch(page)
    page.goto(ui.link)
    expect(page.locator("#welcome")).to_be_visible()
    page.click("#open-settings")
    dialog = page.locator("#settings")
    expect(dialog).to_be_visible()
    expect(page.locator("#s-proxy")).to_be_hidden()               # only with the recorded network
    page.select_option("#s-net", "proxy")
    expect(page.locator("#s-proxy")).to_be_visible()
    page.fill("#s-net-allow", "PyPI.Org.\n*.PythonHosted.org, 127.0.0.1\nbad_host!")
    page.check("#s-hold-writes")
    pages.allowed.append("status of 400")                          # the refusal's own answer
    page.click("#settings-save")
    error = page.locator('#settings .field-error[data-for="net_allow"]')
    expect(error).to_contain_text("bad_host!")
    expect(error).to_contain_text("not a host name")
    expect(page.locator("#s-net-allow")).to_have_class("invalid")
    expect(dialog).to_be_visible()
    assert ui.ok("GET", "/api/settings")["sandbox"]["net"] == "none"           # nothing stored
    # fixed: saved, normalised, with the hold
    page.fill("#s-net-allow", "PyPI.Org.\n*.PythonHosted.org, 127.0.0.1\npypi.org")
    page.click("#settings-save")
    expect(dialog).to_be_hidden()
    want = {"jail": True, "net": "proxy", "net_allow": ["pypi.org", "*.pythonhosted.org", "127.0.0.1"],
            "hold_writes": True}
    assert ui.ok("GET", "/api/settings")["sandbox"] == want
    assert json.loads((home / "ui-settings.json").read_text())["sandbox"] == want
    # and the dialog reads it back
    page.click("#open-settings")
    expect(page.locator("#s-net")).to_have_value("proxy")
    expect(page.locator("#s-net-allow")).to_have_value("pypi.org\n*.pythonhosted.org\n127.0.0.1")
    expect(page.locator("#s-hold-writes")).to_be_checked()
    expect(page.locator('#settings .field-error[data-for="net_allow"]')).to_have_text("")
    clean(seen)


# -- a real proxy session's egress and held requests ----------------------------------------------

class Upstream:
    """A real HTTP server on 127.0.0.1 (threaded) that records every request it gets."""

    def __init__(self):
        got = self.got = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                got.append((self.command, self.path, self.rfile.read(n)))
                self.send_response(201)
                self.send_header("Content-Length", "2")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"ok")

            do_POST = do_PUT = do_GET = do_DELETE = do_PATCH = _any

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


POSTS = """
import urllib.request as u
for p in ("/one", "/two"):
    r = u.urlopen(u.Request("http://127.0.0.1:%d" + p, data=p[1:].encode() * 3, method="POST"))
    print(r.status, r.headers.get("X-Overlord-Held"))
"""


def proxy_session(home, target, upstream):
    """A pending session on the recorded network whose command wrote a file and made two
    POSTs to the upstream, both held by the session's proxy (h0001 /one, h0002 /two); then
    hostile lines added to its egress log and a hostile url/header on h0002, in the records'
    own formats. (sid, session dir)."""
    require_kernel()
    script = f"echo hi > note.txt && python3 -c '{POSTS % upstream.port}'"
    proc = Ovl(home)("run", "-t", target, "--net", "proxy", "--net-allow", "127.0.0.1",
                     "--hold-writes", "--", "sh", "-c", script, check=0)
    assert proc.returncode == 0, proc.err
    assert "202 h0001" in proc.out and "202 h0002" in proc.out, (proc.out, proc.err)
    sid = SESSION_RE.search(proc.out).group(1)
    assert upstream.got == []                                      # held: nothing left
    sdir = home / "sessions" / sid
    meta = json.loads((sdir / "meta.json").read_text())
    assert meta["state"] == "pending"
    assert meta["grants"]["net"] == "proxy" and meta["grants"]["net_allow"] == ["127.0.0.1"]
    assert meta["grants"]["hold_writes"] is True
    lines = [json.loads(x) for x in (sdir / "egress.jsonl").read_text().splitlines()]
    assert [x["held"] for x in lines] == ["h0001", "h0002"]
    hostile = [
        {"ts": lines[-1]["ts"] + 1, "host": HOSTILE_HOST, "port": 80, "method": "GET",
         "path": HOSTILE_PATH, "allowed": False, "status": 403, "bytes_up": 0, "bytes_down": 0,
         "duration_ms": 0.5, "layer": 0, "cause": HOSTILE_CAUSE,
         "reason": "not on the allowlist <i>x</i>\x07", "held": None},
        {"ts": lines[-1]["ts"] + 2, "host": "evil\u202etxt.example", "port": 443, "method": "CONNECT",
         "path": None, "allowed": True, "status": 200, "bytes_up": 1500, "bytes_down": 70000,
         "duration_ms": 12.0, "layer": 0, "cause": "curl", "reason": None, "held": None},
    ]
    with open(sdir / "egress.jsonl", "a") as f:
        for line in hostile:
            f.write(json.dumps(line) + "\n")
    h2 = json.loads((sdir / "held" / "h0002.json").read_text())
    assert h2["state"] == "held" and h2["path"] == "/two"
    h2["url"] = f"http://127.0.0.1:{upstream.port}/two?{HOSTILE_HOST}\x1b[2J"
    h2["headers"].append(["X-Note", HOSTILE_HOST + "\u202e"])
    h2["headers"].append(["Authorization", "Bearer s3cr3t-never-shown"])
    (sdir / "held" / "h0002.json").write_text(json.dumps(h2))
    os.chmod(sdir / "held" / "h0002.json", 0o600)
    return sid, sdir


def test_console_egress_and_held_release_one_drop_the_other(ui, home, target, pages, upstream):
    sid, sdir = proxy_session(home, target, upstream)
    report = ui.ok("GET", f"/api/session/{sid}/egress")
    assert report["recorded"] is True and report["net"] == "proxy", report
    assert [q["id"] for q in report["held"]] == ["h0001", "h0002"]
    assert "s3cr3t" not in json.dumps(report)
    page = pages()
    seen = watch(page)
    page.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    expect(page.locator(".doc-head")).to_contain_text(sid)
    section = page.locator(".doc-section", has=page.locator("h3", has_text="Egress"))
    expect(section).to_have_count(1)
    rows = section.locator("table.egress tbody tr")
    expect(rows).to_have_count(4)
    expect(section.locator(".egress-summary")).to_contain_text("4 connections")
    expect(section.locator(".egress-summary")).to_contain_text("1 refused")
    # the hostile strings are text: shown, escaped, nothing made of them
    refused = rows.nth(2)
    expect(refused).to_have_class("egress-refused")
    expect(refused.locator(".egress-host")).to_have_text(HOSTILE_HOST)
    path = refused.locator(".egress-path").text_content()
    assert "<script>alert(2)</script>" in path, path
    assert "\x1b" not in path and "\u202e" not in path, ascii(path)
    cause = refused.locator(".egress-cause").text_content()
    assert "<b onmouseover=alert(3)>" in cause and "\u2066" not in cause, ascii(cause)
    assert "\u202e" not in rows.nth(3).locator(".egress-host").text_content()
    expect(rows.nth(3).locator(".egress-path")).to_have_text("(tunnel)")
    assert page.locator("#paper img, #paper script, #paper b, #paper i").count() == 0
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    # the held list: under Disposition, two unticked boxes; the log's copy has none
    box = page.locator("#held")
    checks = box.locator("input.held-check")
    expect(checks).to_have_count(2)
    for i in range(2):
        expect(checks.nth(i)).not_to_be_checked()
    expect(section.locator("input.held-check")).to_have_count(0)
    h2 = box.locator('.held-row[data-id="h0002"]')
    expect(h2.locator(".held-url")).to_contain_text(HOSTILE_HOST)
    assert "\x1b" not in h2.locator(".held-url").text_content()
    assert "s3cr3t" not in page.content()
    # tick h0001 only and Commit
    page.check("#held-h0001")
    page.get_by_role("button", name="Commit", exact=True).click()
    expect(page.locator(".doc-head .pill")).to_have_text("committed")
    assert (target / "note.txt").read_text() == "hi\n"
    # exactly h0001 reached the upstream; h0002 did not
    assert upstream.got == [("POST", "/one", b"oneoneone")], upstream.got
    r1 = json.loads((sdir / "held" / "h0001.json").read_text())
    r2 = json.loads((sdir / "held" / "h0002.json").read_text())
    assert r1["state"] == "released" and r1["status"] == 201 and r1["released_at"], r1
    assert r2["state"] == "dropped" and r2["released_at"] is None, r2
    assert base64.b64decode(r1["body_b64"]) == b"oneoneone"
    # the page says what happened
    outcome = page.locator(".held-outcome")
    expect(outcome.locator(".held-released li")).to_have_count(1)
    expect(outcome.locator(".held-released")).to_contain_text("h0001")
    expect(outcome.locator(".held-released")).to_contain_text("status 201")
    expect(outcome.locator(".held-dropped")).to_have_text("Dropped: h0002.")
    section = page.locator(".doc-section", has=page.locator("h3", has_text="Egress"))
    expect(section.locator('.held-row[data-id="h0001"] .held-state')).to_have_text("released: 201")
    expect(section.locator('.held-row[data-id="h0002"] .held-state')).to_have_text("dropped")
    expect(page.locator("input.held-check")).to_have_count(0)
    assert upstream.got == [("POST", "/one", b"oneoneone")]
    clean(seen)


def test_the_egress_summary_names_the_allowlist(ui, home, target, pages, upstream):
    sid, _ = proxy_session(home, target, upstream)
    r = ui.get(f"/api/session/{sid}/egress")
    assert r.status == 200
    assert r.header("Allow") is None, r.header("Allow")          # today: "127.0.0.1"
    assert r.json.get("allow") == ["127.0.0.1"], sorted(r.json)
    page = pages()
    seen = watch(page)
    page.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    summary = page.locator(".doc-section .egress-summary")
    expect(summary).to_contain_text("allowlist: 127.0.0.1")
    clean(seen)


def held_record(rid, port, path, body, ts, cause="the demo"):
    """A held request in the brief's format (what netproxy writes under --hold-writes)."""
    return {"id": rid, "ts": ts, "method": "POST", "url": f"http://127.0.0.1:{port}{path}",
            "host": "127.0.0.1", "port": port, "path": path,
            "headers": [["Host", f"127.0.0.1:{port}"], ["Content-Type", "text/plain"],
                        ["Content-Length", str(len(body))], ["Cookie", "session=never-shown"]],
            "body_b64": base64.b64encode(body).decode(), "bytes": len(body), "layer": 0,
            "cause": cause, "state": "held", "status": None, "error": None, "released_at": None}


def proxy_chat(ui, home, upstream):
    """A demo conversation on the recorded network (Settings: proxy, 127.0.0.1, hold) run to
    its end, then its session's log and two held requests (h0001 POST /alpha, h0002 POST
    /beta to the upstream) and a hostile garbage line written in the records' formats.
    (sid, session dir)."""
    require_kernel()
    ui.ok("PUT", "/api/settings", {"provider": "scripted", "sandbox": {
        "jail": True, "net": "proxy", "net_allow": ["127.0.0.1"], "hold_writes": True}})
    sid = ui.ok("POST", "/api/chats", {"message": "show me"})["sid"]
    ui.wait_idle(sid)
    sdir = home / "sessions" / sid
    meta = json.loads((sdir / "meta.json").read_text())
    assert meta["state"] == "pending"
    assert meta["grants"]["net"] == "proxy" and meta["grants"]["net_allow"] == ["127.0.0.1"], meta["grants"]
    now = meta["created"] + 1
    lines = [
        {"ts": now, "host": "127.0.0.1", "port": upstream.port, "method": "POST", "path": "/alpha",
         "allowed": True, "status": 202, "bytes_up": 5, "bytes_down": 0, "duration_ms": 1.0,
         "layer": 0, "cause": "the demo", "reason": None, "held": "h0001"},
        {"ts": now + 1, "host": "127.0.0.1", "port": upstream.port, "method": "POST", "path": "/beta",
         "allowed": True, "status": 202, "bytes_up": 4, "bytes_down": 0, "duration_ms": 1.0,
         "layer": 0, "cause": "the demo", "reason": None, "held": "h0002"},
        {"ts": now + 2, "host": HOSTILE_HOST, "port": 80, "method": None, "path": HOSTILE_PATH,
         "allowed": False, "status": 400, "bytes_up": 0, "bytes_down": 0, "duration_ms": 0.1,
         "layer": 0, "cause": HOSTILE_CAUSE, "reason": "garbage \x1b]0;title\x07", "held": None},
    ]
    with open(sdir / "egress.jsonl", "a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    (sdir / "held").mkdir(exist_ok=True)
    for rec in (held_record("h0001", upstream.port, "/alpha", b"alpha", now),
                held_record("h0002", upstream.port, "/beta", b"beta", now + 1)):
        (sdir / "held" / f"{rec['id']}.json").write_text(json.dumps(rec))
    return sid, sdir


def test_the_workspace_inspector_releases_the_ticked_held_request(ui, home, pages, upstream):
    """The inspector of a recorded conversation: the held box at Commit has two unticked
    boxes (credentials not on the page); h0001 ticked, Commit: the upstream gets exactly it,
    h0002 is dropped, and the inspector's held list says so. (What the commit's answer says,
    the outcome box, and the Network table.)"""
    sid, sdir = proxy_chat(ui, home, upstream)
    page = pages()
    seen = watch(page)
    page.goto(f"{ui.link}#{sid}")
    expect(page.locator("#egress-section")).to_be_visible()
    expect(page.locator("#held-box")).to_be_visible()
    checks = page.locator("#held input.held-check")
    expect(checks).to_have_count(2)
    expect(checks.nth(0)).not_to_be_checked()
    expect(checks.nth(1)).not_to_be_checked()
    expect(page.locator('#held .held-row[data-id="h0002"] .held-url')).to_have_text(
        f"http://127.0.0.1:{upstream.port}/beta")
    assert "never-shown" not in page.content()
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    page.check("#held-h0001")
    page.click("#commit")
    expect(page.locator("#held-box")).to_be_hidden()
    expect(page.locator('#egress .held-row[data-id="h0001"] .held-state')).to_have_text("released: 201")
    expect(page.locator('#egress .held-row[data-id="h0002"] .held-state')).to_have_text("dropped")
    expect(page.locator("#held-outcome")).to_be_visible()
    assert upstream.got == [("POST", "/alpha", b"alpha")], upstream.got
    r1 = json.loads((sdir / "held" / "h0001.json").read_text())
    r2 = json.loads((sdir / "held" / "h0002.json").read_text())
    assert r1["state"] == "released" and r1["status"] == 201, r1
    assert r2["state"] == "dropped", r2
    assert json.loads((sdir / "meta.json").read_text())["state"] == "committed"
    clean(seen)


def test_the_workspace_inspector_shows_the_egress_table_and_the_outcome(ui, home, pages, upstream):
    sid, _ = proxy_chat(ui, home, upstream)
    page = pages()
    seen = watch(page)
    page.goto(f"{ui.link}#{sid}")
    expect(page.locator("#held-box")).to_be_visible()          # the panel has been filled
    wrong = []
    table = page.locator("#egress").text_content()
    rows = page.locator("#egress table.egress tbody tr")
    if "[object " in table or rows.count() != 3:
        wrong.append(f"Network table: {rows.count()} rows, text {table[:120]!r}")
    else:
        bad = rows.nth(2)
        text = bad.text_content()
        if bad.locator(".egress-host").text_content() != HOSTILE_HOST or \
                bad.locator(".egress-method").text_content() != "(garbage)" or \
                "<script>alert(2)</script>" not in text or "\x1b" in text or "\u202e" in text:
            wrong.append(f"hostile row: {ascii(text)}")
    assert page.evaluate("document.querySelectorAll('img, #egress b, #egress script').length") == 0
    page.check("#held-h0001")
    page.click("#commit")
    expect(page.locator("#held-box")).to_be_hidden()
    out = page.locator("#held-outcome")
    expect(out).to_be_visible()
    words = out.text_content()
    if "[object " in words or "h0001" not in words or "status 201" not in words or \
            "Dropped: h0002." not in words:
        wrong.append(f"outcome: {words[:120]!r}")
    clean(seen)
    assert wrong == [], wrong
