"""The inspector's Export and cost line, and the chat's budget stop, against a real `overlord ui`:
GET /api/session/<sid>/export is the session as a signed .ovl download (attachment, nothing
left on disk) that `overlord import` on a second OVERLORD_HOME accepts -- verified with the
machine's bundle key shared, unverified (and refused under --require-signature) without it;
the same download from the Export button in a real browser (Playwright + Debian's Chromium);
the session's cost (tokens, dollars) in the inspector; and a conversation stopped by a
session_tokens line shows the stop as one clear line naming the line."""
import io
import json
import os
import shutil
import tarfile

import pytest

from conftest import Ovl
from weblib import AnthropicFake, require_kernel, ui  # noqa: F401
from test_browser import Pages, browser, fake, pages  # noqa: F401 -- fixtures

try:
    from playwright.sync_api import expect
except ImportError:                     # pragma: no cover - test_browser's fixture skips then
    expect = None

MODEL = AnthropicFake.MODEL


def demo_chat(ui):
    """A demo conversation (the scripted provider) run to its end: a pending session with a
    change (OVERLORD-DEMO.md)."""
    require_kernel()
    ui.ok("PUT", "/api/settings", {"provider": "scripted"})
    sid = ui.ok("POST", "/api/chats", {"message": "show me"})["sid"]
    ui.wait_idle(sid)
    return sid


def second_home(tmp_path, name, key_from=None):
    h = tmp_path / name
    h.mkdir()
    if key_from is not None:
        shutil.copy2(key_from / "bundle.key", h / "bundle.key")
        os.chmod(h / "bundle.key", 0o600)
    return Ovl(h)


def members(data):
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getnames()


def test_export_is_a_download_another_home_imports(ui, home, tmp_path):
    sid = demo_chat(ui)
    before = set(os.listdir(home))
    r = ui.get(f"/api/session/{sid}/export")
    assert r.status == 200, r.body[:300]
    assert r.header("Content-Type") == "application/octet-stream"
    assert r.header("Content-Disposition") == f'attachment; filename="{sid}.ovl"'
    assert r.header("Cache-Control") == "no-store"
    assert int(r.header("Content-Length")) == len(r.body)
    names = members(r.body)
    assert "manifest.json" in names and any(n.endswith("OVERLORD-DEMO.md") for n in names), names
    # nothing of the bundle stays on disk here (the key is made on the first export)
    assert set(os.listdir(home)) - before <= {"bundle.key"}, set(os.listdir(home)) - before
    bundle = tmp_path / f"{sid}.ovl"
    bundle.write_bytes(r.body)
    # the key shared: verified, and --require-signature passes
    shared = second_home(tmp_path, "home2", key_from=home)
    out = shared("import", bundle, "--require-signature", check=0).out
    assert f"imported session {sid}" in out and "verified" in out and "UNVERIFIED" not in out
    meta = json.loads((shared.home / "sessions" / sid / "meta.json").read_text())
    assert meta["imported"]["verified"] is True and meta["imported"]["original_state"] == "pending"
    assert meta["state"] == "imported"
    # without it: unverified, and refused when a signature is required
    stranger = second_home(tmp_path, "home3")
    refused = stranger("import", bundle, "--require-signature", check=1)
    assert refused.err.startswith("overlord: ") and "Traceback" not in refused.err
    assert "UNVERIFIED" in stranger("import", bundle, check=0).out


def test_no_export_while_the_agent_works(ui, fake):
    """A run under way: 409, in words (the bundle would catch it half-way); once it has
    stopped, the export goes."""
    require_kernel()
    slow = fake.turn(text="thinking it over")
    slow.stall = 3
    fake.queue(slow)
    ui.use(fake)
    sid = ui.ok("POST", "/api/chats", {"message": "take your time"})["sid"]
    with ui.events(sid) as ev:
        ev.until(lambda name, data: name == "state" and data["running"]
                 or name == "snapshot" and data["running"])
        r = ui.get(f"/api/session/{sid}/export")
        assert r.status == 409 and "Stop first" in r.json["error"], r.body
        ev.until(lambda name, data: name == "state" and not data["running"])
    r = ui.get(f"/api/session/{sid}/export")
    assert r.status == 200 and "manifest.json" in members(r.body)


def test_bad_and_unknown_sessions(ui):
    assert ui.get("/api/session/not-a-sid/export").status == 400
    r = ui.get("/api/session/20200101-000000-abcdef/export")
    assert r.status == 404 and r.json["error"]


def test_the_inspector_shows_the_cost_and_exports(ui, home, fake, pages, tmp_path, target):
    """A priced turn (47 tokens of claude-test-5 at $1,000/MTok in and out, $0 cache: $0.037)
    writes a file; the inspector says what the session cost and its Export button downloads
    the bundle, which a second home with the key imports."""
    require_kernel()
    cli = Ovl(home)
    cli("cost", "set-price", MODEL, "--input", "1000", "--output", "1000", "--cache-read", "0",
        "--cache-write", "0", check=0)
    fake.queue(fake.turn(text="Writing it.", calls=[("write_file", {"path": "note.txt", "content": "hi\n"})]),
               fake.turn(text="Done."))
    ui.use(fake)
    page = pages()
    page.goto(ui.link)
    page.fill("#prompt", "Write a note")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible()
    expect(page.locator("#file-list .file-row")).to_have_count(1)
    sid = page.evaluate("location.hash.slice(1)")
    total = ui.ok("GET", f"/api/session/{sid}")["cost"]
    assert total["tokens"] == 2 * 47 and round(total["usd"], 6) == round(2 * 37 / 1000, 6), total
    expect(page.locator("#session-cost")).to_have_text("Cost: 94 tokens \u00b7 $0.0740 \u00b7 2 model calls")
    expect(page.locator(".note.done")).to_contain_text("94 tokens")
    link = page.locator("#export")
    expect(link).to_have_attribute("href", f"/api/session/{sid}/export")
    with page.expect_download() as info:
        link.click()
    download = info.value
    assert download.suggested_filename == f"{sid}.ovl"
    saved = tmp_path / "from-browser.ovl"
    download.save_as(saved)
    assert "manifest.json" in members(saved.read_bytes())
    out = second_home(tmp_path, "home2", key_from=home)("import", saved, "--require-signature", check=0).out
    assert f"imported session {sid}" in out


def test_a_budget_stop_is_one_clear_line_in_the_chat(ui, home, fake, pages):
    """A session_tokens line of 40: the first call (47 tokens) is charged, the check before
    the second stops the run with reason budget; the chat says which line stopped it."""
    require_kernel()
    Ovl(home)("cost", "budget", "--session-tokens", "40", check=0)
    fake.queue(fake.turn(text="Writing it.", calls=[("write_file", {"path": "note.txt", "content": "hi\n"})]),
               fake.turn(text="never asked for"))
    ui.use(fake)
    page = pages()
    page.goto(ui.link)
    page.fill("#prompt", "Write a note")
    page.click("#send")
    stop = page.locator(".note.budget-stop")
    expect(stop).to_be_visible()
    expect(stop).to_have_text("Stopped: the session_tokens budget of 40 tokens (config) is reached: "
                              "47 tokens spent.")
    expect(page.locator(".note.done")).to_contain_text("Stopped at a budget line")
    assert len(fake.requests) == 1
    # the work so far stays for review
    expect(page.locator("#file-list .file-row")).to_have_count(1)
    sid = page.evaluate("location.hash.slice(1)")
    page.reload()
    expect(page.locator(".note.budget-stop")).to_have_count(1)
    assert ui.ok("GET", f"/api/session/{sid}")["meta"]["state"] == "pending"
