"""The workspace and the console in a real browser: Playwright driving Debian's Chromium
(/usr/bin/chromium), against `overlord ui` and a fake model endpoint on 127.0.0.1.

A person's whole path: the token link, a task, the reply streaming into its bubble, the diff in
the inspector, Commit and the file on disk; Discard and the folder byte-identical; Stop; Settings
round-trips; the console's register (j/k), dossier, rewind-here, fork-here, keep/drop commit and
blame sheet. On every page: no console error, no CSP violation, no horizontal overflow at 390 px.
Screenshots go to docs/screenshots/ when OVERLORD_SCREENSHOTS=1 (else to the test's tmp dir).
"""
import os
import time

import pytest

from conftest import SESSION_RE, Ovl
from weblib import KEY, REPO, AnthropicFake, GeminiFake, ResponsesFake, require_kernel, sse_text, tree, ui  # noqa: F401

CHROMIUM = "/usr/bin/chromium"
SHOTS = os.path.join(REPO, "docs", "screenshots")

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:                     # pragma: no cover - depends on the host
    sync_playwright = None


def _require_browser():
    missing = None
    if sync_playwright is None:
        missing = "Playwright for Python is not installed (pip install playwright)"
    elif not os.access(CHROMIUM, os.X_OK):
        missing = f"{CHROMIUM} is missing (apt-get install chromium)"
    if missing:
        if os.environ.get("OVERLORD_REQUIRE_BACKENDS"):
            pytest.fail(f"browser tests must run here: {missing}")
        pytest.skip(missing)


@pytest.fixture(scope="module")
def browser():
    _require_browser()
    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.getuid() == 0 else []     # Chromium's sandbox refuses root
        b = p.chromium.launch(executable_path=CHROMIUM, args=args)
        yield b
        b.close()


CSP_PROBE = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""


class Pages:
    """New pages at a given width; every console error, page error and CSP violation is kept
    and checked when the test ends."""

    def __init__(self, browser):
        self.browser, self.contexts, self.problems, self.allowed = browser, [], [], []

    def __call__(self, width=1440, height=900):
        ctx = self.browser.new_context(viewport={"width": width, "height": height})
        ctx.add_init_script(CSP_PROBE)
        self.contexts.append(ctx)
        page = ctx.new_page()
        page.on("console", lambda m: m.type == "error" and self.problems.append(m.text))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.set_default_timeout(20000)
        return page

    def check(self):
        for ctx in self.contexts:
            for page in ctx.pages:
                violations = page.evaluate("window.__csp || []")
                assert violations == [], violations
        problems = [p for p in self.problems if not any(a in p for a in self.allowed)]
        assert problems == [], problems

    def close(self):
        for ctx in self.contexts:
            ctx.close()


@pytest.fixture
def pages(browser):
    require_kernel()
    p = Pages(browser)
    yield p
    try:
        p.check()
    finally:
        p.close()


@pytest.fixture
def fake():
    f = AnthropicFake()
    yield f
    f.close()
    assert f.problems == []


class Slow:
    """A streamed answer that dribbles (one SSE event every `pause` seconds)."""

    def __init__(self, answer, pause=0.04):
        self.answer, self.pause = answer, pause

    def send(self, h):
        h.send_response(200)
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        try:
            for c in sse_text(self.answer.events):
                c = c.encode()
                h.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                h.wfile.flush()
                time.sleep(self.pause)
            h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


def shot(page, name, tmp_path):
    """Save a screenshot as an artifact: docs/screenshots/ when asked, else the tmp dir."""
    folder = SHOTS if os.environ.get("OVERLORD_SCREENSHOTS") == "1" else str(tmp_path)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    page.screenshot(path=path, full_page=name.startswith("console"))
    return path


def no_overflow(page):
    sizes = page.evaluate("[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]")
    assert max(sizes[:2]) <= sizes[2], sizes


CONTRAST = """
(selectors) => {
  const lum = (c) => { const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map((v) => {
    v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const bg = (el) => { for (; el; el = el.parentElement) { const c = getComputedStyle(el).backgroundColor;
    if (!/rgba\\(.*, 0\\)$/.test(c) && c !== 'transparent') return c; } return 'rgb(255, 255, 255)'; };
  const out = [];
  for (const sel of selectors) for (const el of document.querySelectorAll(sel)) {
    if (!el.offsetParent && el.tagName !== 'BODY') continue;
    const a = lum(getComputedStyle(el).color), b = lum(bg(el));
    out.push([sel, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)]);
  }
  return out;
}"""


def readable(page, selectors):
    ratios = page.evaluate(CONTRAST, selectors)
    low = [(s, round(r, 2)) for s, r in ratios if r < 4.5]
    assert ratios and low == [], low


def demo(fake, slow=False):
    """A small, real-looking first turn: edit, new file, a shell run; then a short answer."""
    first = fake.turn(
        text="I'll add a `shout` option to **greet** and a test for it.\n\n1. Edit `app.py`\n2. Add "
             "`test_app.py`\n3. Run it once",
        calls=[("edit_file", {"path": "app.py", "old": "def greet(name):\n    return 'hello ' + name",
                              "new": "def greet(name, shout=False):\n    text = 'hello ' + name\n"
                                     "    return text.upper() if shout else text"}),
               ("write_file", {"path": "test_app.py", "content": "from app import greet\n\n\n"
                               "def test_greet():\n    assert greet('bo') == 'hello bo'\n\n\n"
                               "def test_shout():\n    assert greet('bo', shout=True) == 'HELLO BO'\n"}),
               ("shell", {"command": "python3 -B -c 'import app; print(app.greet(\"ada\", shout=True))'"})])
    fake.queue(Slow(first) if slow else first,
               fake.turn(text="Done. `greet('ada', shout=True)` now gives `HELLO ADA`, and "
                              "`test_app.py` covers both cases.\n\nNothing is on disk yet: read the "
                              "diff on the right, then **Commit** or **Discard**."))


def project(target):
    (target / "app.py").write_text("def greet(name):\n    return 'hello ' + name\n\n\n"
                                   "if __name__ == '__main__':\n    print(greet('world'))\n")


def open_workspace(page, ui):
    page.goto(ui.link)
    expect(page.locator("#welcome")).to_be_visible()
    assert "token" not in page.url


def converse(pages, ui, message):
    """A new page on the workspace, one message sent and its run ended: (page, sid)."""
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", message)
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible()
    return page, page.evaluate("location.hash.slice(1)")


# -- the workspace -----------------------------------------------------------------------------------

def test_a_person_sends_a_task_watches_it_stream_reviews_and_commits(ui, fake, target, pages, tmp_path):
    project(target)
    ui.use(fake)
    demo(fake, slow=True)
    page = pages(1440)
    open_workspace(page, ui)
    cookie = page.context.cookies()[0]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != ui.token
    page.fill("#prompt", "Add a shout option to greet, with a test")
    page.keyboard.press("Enter")
    # the reply streams: the bubble is marked streaming and grows before the turn ends
    bubble = page.locator(".msg-assistant .bubble.streaming .md")
    expect(bubble).to_contain_text("I'll add")
    early = bubble.inner_text()
    expect(page.locator(".msg-assistant .bubble").first).to_contain_text("Run it once")
    assert len(early) < len(page.locator(".msg-assistant .bubble").first.inner_text())
    expect(page.locator(".note.done")).to_contain_text("Done")
    # tool calls as compact cards
    cards = page.locator("details.tool")
    expect(cards).to_have_count(3)
    expect(cards.nth(0).locator(".tool-name")).to_have_text("edit_file")
    expect(cards.nth(2).locator(".tool-status")).to_have_text("exit 0")
    cards.nth(2).locator("summary").click()
    expect(cards.nth(2).locator(".tool-output")).to_contain_text("HELLO ADA")
    # the inspector: the files and a readable, coloured diff; nothing on disk yet
    expect(page.locator("#file-list .file-row")).to_have_count(2)
    expect(page.locator(".file-diff .diff-line.add").first).to_be_visible()
    assert "text = 'hello ' + name" in page.locator(".file-diff .diff-line.add").all_inner_texts()[1]
    expect(page.locator("#steps li")).to_have_count(2)
    assert not (target / "test_app.py").exists()
    readable(page, [".diff-line.add .text", ".diff-line.del .text", ".diff-hunk", ".tool-status",
                    ".chat-sub", ".msg-user .bubble", ".md", ".step-what", ".chat-item-meta"])
    sid = page.evaluate("location.hash.slice(1)")
    shot(page, "workspace-1440.png", tmp_path)
    phone = pages(390, 844)
    phone.goto(f"{ui.base}/?token={ui.token}#{sid}")
    expect(phone.locator(".note.done")).to_be_visible()
    no_overflow(phone)
    shot(phone, "workspace-390.png", tmp_path)
    phone.click("#inspector-open")
    expect(phone.locator(".file-diff").first).to_be_in_viewport()
    no_overflow(phone)
    shot(phone, "inspector-390.png", tmp_path)
    # commit: the file is on disk, the conversation links to its dossier
    page.click("#commit")
    expect(page.locator("#decided")).to_contain_text("Committed")
    assert "test_shout" in (target / "test_app.py").read_text()
    assert "shout=False" in (target / "app.py").read_text()
    expect(page.locator("#composer-note a")).to_have_attribute("href", f"/console#{sid}")
    assert page.locator("#prompt").is_disabled()


def test_discard_leaves_the_folder_byte_identical(ui, fake, target, pages):
    project(target)
    before = tree(target)
    ui.use(fake)
    demo(fake)
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "try it")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible()
    expect(page.locator("#file-list .file-row")).to_have_count(2)
    page.click("#discard")
    page.click("#discard-yes")
    expect(page.locator("#decided")).to_contain_text("Discarded")
    assert tree(target) == before
    expect(page.locator("#composer-note")).to_contain_text("discarded")


def test_the_inspector_explains_a_drift_refusal_and_can_commit_anyway(ui, fake, target, pages):
    project(target)
    ui.use(fake)
    demo(fake)
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "go")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible()
    (target / "app.py").write_text("edited by hand meanwhile\n")
    pages.allowed.append("status of 409")
    page.click("#commit")
    refusal = page.locator("#refusal")
    expect(refusal).to_contain_text("Commit refused. Nothing was written.")
    expect(refusal).to_contain_text("app.py was changed outside OVERLORD after this session began")
    assert (target / "app.py").read_text() == "edited by hand meanwhile\n"
    assert not (target / "test_app.py").exists()
    refusal.get_by_role("button", name="Commit anyway").click()
    expect(page.locator("#decided")).to_contain_text("Committed")
    assert "shout=False" in (target / "app.py").read_text()


def test_model_text_renders_inert_and_markdown_safely(ui, fake, pages):
    ui.use(fake)
    fake.queue(fake.turn(text=(
        "# Title\n\nSome **bold**, *em* and `code`.\n\n"
        "<img src=x onerror=\"window.__pwned = 1\"> <script>window.__pwned = 2</script>\n\n"
        "[bad](javascript:window.__pwned=3) [data](data:text/html,hi) [good](https://example.org/a)\n\n"
        "```\n<b>not bold</b>\n```\n\n- one\n- two")))
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "render")
    page.click("#send")
    md = page.locator(".msg-assistant .md")
    expect(md.locator("h1")).to_have_text("Title")
    expect(md.locator("strong")).to_have_text("bold")
    expect(md.locator("ul li")).to_have_count(2)
    expect(md.locator("pre code")).to_have_text("<b>not bold</b>")
    assert md.locator("img, script, b, iframe").count() == 0
    links = md.locator("a")
    expect(links).to_have_count(1)
    assert links.get_attribute("href") == "https://example.org/a"
    assert links.get_attribute("rel") == "noopener noreferrer nofollow"
    text = md.inner_text()
    assert "<img src=x onerror=" in text and "<script>" in text and "javascript:window.__pwned=3" in text
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None


def test_stop_cancels_within_two_seconds_and_the_conversation_resumes(ui, fake, pages):
    ui.use(fake)
    fake.queue(Slow(fake.turn(text="counting " * 300), pause=0.05))
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "count slowly")
    page.click("#send")
    expect(page.locator(".bubble.streaming .md")).to_contain_text("counting")
    expect(page.locator("#stop")).to_be_visible()
    t = time.monotonic()
    page.click("#stop")
    expect(page.locator(".note.done")).to_contain_text("Stopped", timeout=2000)
    assert time.monotonic() - t < 2.0
    expect(page.locator("#send")).to_be_visible()
    fake.queue(fake.turn(text="Resumed where I stopped."))
    page.fill("#prompt", "go on")
    page.keyboard.press("Enter")
    expect(page.locator(".msg-assistant .md").last).to_have_text("Resumed where I stopped.")
    expect(page.locator(".msg-user .bubble").last).to_have_text("go on")


def test_conversations_are_listed_and_rebuilt_on_reload(ui, fake, pages):
    ui.use(fake)
    fake.queue(fake.turn(text="First answer."))
    page, sid = converse(pages, ui, "first question")
    page.click("#discard")
    page.click("#discard-yes")
    expect(page.locator("#decided")).to_contain_text("Discarded")
    page.click("#new-chat")
    expect(page.locator("#welcome")).to_be_visible()
    fake.queue(fake.turn(text="Second answer."))
    page.fill("#prompt", "second question")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible()
    expect(page.locator(".chat-item")).to_have_count(2)
    page.reload()
    expect(page.locator(".msg-assistant .md")).to_have_text("Second answer.")
    page.locator(f'.chat-item[data-sid="{sid}"]').click()
    expect(page.locator(".msg-assistant .md")).to_have_text("First answer.")
    expect(page.locator(".msg-user .bubble")).to_have_text("first question")
    assert page.evaluate("location.hash.slice(1)") == sid


def test_settings_round_trip_with_the_live_model_list(ui, fake, pages, tmp_path):
    gemini = GeminiFake()
    try:
        ui.ok("PUT", "/api/settings", {"provider": "anthropic", "profile": {"base_url": fake.url}})
        ui.ok("PUT", "/api/settings", {"provider": "gemini", "profile": {"base_url": gemini.url}})
        ui.ok("PUT", "/api/settings", {"provider": "anthropic"})
        page = pages()
        open_workspace(page, ui)
        page.click("#open-settings")
        dialog = page.locator("#settings")
        expect(dialog).to_be_visible()
        expect(page.locator("#s-model-status")).to_contain_text("could not be loaded")   # no key yet
        pages.allowed.append("status of 409")
        page.fill("#s-key", "sk-test-Secret-9f8e7d6c5b4a39281706")
        pages.allowed.append("status of 400")          # the refusals below are the point
        page.fill("#s-temperature", "hot")
        page.click("#settings-save")
        expect(page.locator('.field-error[data-for="temperature"]')).to_contain_text("number")
        page.fill("#s-temperature", "0.3")
        page.fill("#s-headers", "X-Team: blue")
        fake.queue(fake.models(), fake.models())
        page.click("#settings-save")
        # saved (the key too), but there is no model yet: it says so next to the field, and stays
        expect(page.locator("#settings-saved")).to_contain_text("no model is chosen")
        expect(page.locator('.field-error[data-for="model"]')).to_contain_text("Choose a model")
        expect(dialog).to_be_visible()
        expect(page.locator("#s-key-status")).to_contain_text("stored")
        assert page.locator("#s-key").input_value() == ""
        expect(page.locator("#s-model option")).to_have_count(3)
        page.select_option("#s-model", "claude-test-4")
        expect(page.locator('.field-error[data-for="model"]')).to_be_hidden()
        expect(page.locator("#settings-saved")).to_have_text("")
        # another provider keeps its own profile
        gemini.queue(gemini.models())
        page.select_option("#s-provider", "gemini")
        expect(page.locator("#s-base-url")).to_have_value(gemini.url)
        expect(page.locator("#s-temperature")).to_have_value("")
        page.select_option("#s-provider", "anthropic")
        expect(page.locator("#s-temperature")).to_have_value("0.3")
        page.fill("#s-folder", str(tmp_path / "no-such-folder"))
        page.click("#settings-save")
        expect(page.locator('.field-error[data-for="folder"]')).to_contain_text("no such folder")
        page.fill("#s-folder", str(tmp_path))
        page.select_option("#s-net", "host")
        page.locator("#settings .dialog-body").evaluate("el => { el.scrollTop = 0; }")
        shot(page, "settings-1440.png", tmp_path)
        page.click("#settings-save")
        expect(dialog).to_be_hidden()                                # Save closes the dialog
        expect(page.locator("#composer-note")).to_contain_text("Settings saved")
        saved = ui.ok("GET", "/api/settings")
        prof = saved["profiles"]["anthropic"]
        assert prof["model"] == "claude-test-4" and prof["knobs"] == {"temperature": 0.3}
        assert prof["headers"] == {"X-Team": "blue"} and saved["keys"]["anthropic"] == "store"
        assert saved["folder"] == str(tmp_path) and saved["sandbox"] == {"jail": True, "net": "host", "net_allow": [], "hold_writes": False}
        assert saved["profiles"]["gemini"]["base_url"] == gemini.url
        page.reload()
        expect(page.locator("#welcome-model")).to_contain_text("claude-test-4")
        expect(page.locator("#welcome-folder")).to_have_text(str(tmp_path))
        assert gemini.problems == []
    finally:
        gemini.close()


# -- the console ----------------------------------------------------------------------------------------

def run(home, target, script):
    proc = Ovl(home)("run", "-t", target, "--", "sh", "-c", script, check=0)
    return SESSION_RE.search(proc.out).group(1)


def test_console_register_dossier_rewind_fork_drop_and_blame(ui, home, target, pages, tmp_path):
    ovl = Ovl(home)
    old = run(home, target, "printf 'first\\nsecond\\n' > doc.txt")
    ui.ok("POST", f"/api/session/{old}/commit")
    sid = run(home, target, "echo zero > zero.txt")
    for n in (1, 2, 3):
        assert ovl("exec", sid, "--", "sh", "-c", f"echo {n} > f{n}.txt").returncode == 0
    page = pages()
    page.goto(f"{ui.base}/console?token={ui.token}")
    rows = page.locator(".reg-row")
    expect(rows).to_have_count(2)
    expect(page.locator(".doc-head")).to_contain_text(sid)          # the newest, opened at once
    # j / k move through the register, and the dossier follows
    page.locator("body").press("j")
    expect(page.locator(".reg-row[aria-selected=true]")).to_have_attribute("data-sid", old)
    expect(page.locator(".doc-head .pill")).to_have_text("committed")
    page.locator("body").press("k")
    expect(page.locator(".reg-row[aria-selected=true]")).to_have_attribute("data-sid", sid)
    expect(page.locator(".chain tbody tr")).to_have_count(4)
    expect(page.locator(".envelope")).to_contain_text("Network")
    expect(page.locator(".ledger").first).to_contain_text("zero.txt")
    # fork here: a new session holding @0..@1, selected
    page.locator(".chain tbody tr").nth(1).get_by_role("button", name="Fork here").click()
    expect(rows).to_have_count(3)
    forked = page.evaluate("location.hash.slice(1)")
    assert forked not in (sid, old)
    expect(page.locator(".doc-sub")).to_contain_text(f"forked from {sid} at @1")
    expect(page.locator(".chain tbody tr")).to_have_count(2)
    ui.ok("POST", f"/api/session/{forked}/rollback")
    page.goto(f"{ui.base}/console#{sid}")
    expect(page.locator(".chain tbody tr")).to_have_count(4)
    # rewind here (asks once more)
    button = page.locator(".chain tbody tr").nth(2).get_by_role("button", name="Rewind here")
    button.click()
    expect(page.locator(".chain tbody tr").nth(2).get_by_role("button", name="Confirm rewind")).to_be_visible()
    page.locator(".chain tbody tr").nth(2).get_by_role("button", name="Confirm rewind").click()
    expect(page.locator(".chain tbody tr")).to_have_count(3)
    # keep / drop: untick @1, commit the rest
    page.locator(".chain input[type=checkbox]").nth(1).uncheck()
    expect(page.locator("#kept-note")).to_contain_text("@1")
    shot(page, "console-1440.png", tmp_path)
    page.get_by_role("button", name="Commit", exact=True).click()
    expect(page.locator(".doc-head .pill")).to_have_text("committed")
    expect(page.locator(".decided")).to_contain_text("@0, @2")
    expect(page.locator(".decided")).to_contain_text("1 change dropped")
    assert (target / "zero.txt").exists() and (target / "f2.txt").exists()
    assert not (target / "f1.txt").exists()
    # the record: what was committed, and apart from it what was dropped, with no blame
    committed = page.locator(".doc-section .ledger").first
    expect(committed.locator("tbody tr")).to_have_count(2)
    expect(committed).not_to_contain_text("f1.txt")
    expect(committed.get_by_role("button", name="blame")).to_have_count(2)
    expect(page.locator(".dropped-title")).to_contain_text("Dropped: left out of the commit (1)")
    left_out = page.locator(".dropped-ledger")
    expect(left_out.locator("tbody tr")).to_have_count(1)
    expect(left_out).to_contain_text("f1.txt")
    expect(left_out.locator("button")).to_have_count(0)
    # the blame sheet of a committed path
    page.locator(".ledger tr", has_text="zero.txt").get_by_role("button", name="blame").click()
    sheet = page.locator("#blame")
    expect(sheet).to_be_visible()
    expect(sheet.locator(".blame-line")).to_have_count(1)
    expect(sheet.locator(".blame-line .owner")).to_contain_text(sid)
    expect(sheet.locator(".blame-line .text")).to_have_text("zero")
    page.keyboard.press("Escape")
    expect(sheet).to_be_hidden()
    page.goto(f"{ui.base}/console#{old}")
    page.locator(".ledger tr", has_text="doc.txt").get_by_role("button", name="blame").click()
    expect(sheet.locator(".blame-line")).to_have_count(2)
    expect(sheet.locator(".blame-legend")).to_contain_text(old)
    phone = pages(390, 844)
    phone.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    expect(phone.locator(".doc-head")).to_contain_text(sid)
    no_overflow(phone)


def test_console_dossier_of_a_conversation_and_drift_refusal(ui, fake, target, pages, tmp_path):
    project(target)
    ui.use(fake)
    demo(fake)
    page, sid = converse(pages, ui, "Add a shout option to greet, with a test")
    page.goto(f"{ui.base}/console#{sid}")
    expect(page.locator(".doc-head")).to_contain_text("agent: Add a shout option")
    expect(page.locator(".envelope")).to_contain_text("claude-test-5")
    expect(page.locator(".envelope")).to_contain_text("pivot_root jail")
    expect(page.locator(".ledger").first).to_contain_text("edit_file(app.py)")
    expect(page.locator(".file-diff")).to_have_count(2)
    readable(page, [".ledger td", ".envelope dd", ".envelope dt", ".diff-line.add .text", ".reg-meta"])
    shot(page, "console-dossier-1440.png", tmp_path)
    phone = pages(390, 844)
    phone.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    expect(phone.locator(".file-diff")).to_have_count(2)
    no_overflow(phone)
    shot(phone, "console-390.png", tmp_path)
    # drift: the folder changes under the session; Commit is refused, in words
    (target / "app.py").write_text("changed outside\n")
    pages.allowed.append("status of 409")
    page.get_by_role("button", name="Commit", exact=True).click()
    refusal = page.locator(".doc-message")
    expect(refusal).to_contain_text("app.py was changed outside OVERLORD after this session began")
    assert (target / "app.py").read_text() == "changed outside\n"
    page.locator("label[for=force]").click()
    page.get_by_role("button", name="Commit", exact=True).click()
    expect(page.locator(".doc-head .pill")).to_have_text("committed")
    assert "shout=False" in (target / "app.py").read_text()


# -- keyboard and phone width --------------------------------------------------------------------------------

def test_keyboard_and_phone_width(ui, fake, pages, tmp_path):
    ui.use(fake)
    page = pages(390, 844)
    open_workspace(page, ui)
    no_overflow(page)
    # the composer is reachable and Enter sends, Shift+Enter makes a new line
    page.locator("#prompt").focus()
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    assert page.locator("#prompt").input_value() == "line one\nline two"
    fake.queue(fake.turn(text="Two lines received. " + "A long line of text without breaks " * 8
                         + "`" + "x" * 200 + "`"))
    page.keyboard.press("Enter")
    expect(page.locator(".note.done")).to_be_visible()
    expect(page.locator(".msg-user .bubble")).to_have_text("line one\nline two")
    no_overflow(page)
    # drawers open by button and close with Escape
    page.click("#rail-open")
    expect(page.locator(".chat-item")).to_be_in_viewport()
    no_overflow(page)
    page.keyboard.press("Escape")
    expect(page.locator(".chat-item")).not_to_be_in_viewport()
    page.click("#rail-open")
    fake.queue(fake.models())
    page.click("#open-settings")
    expect(page.locator("#settings")).to_be_visible()
    expect(page.locator("#s-model option")).to_have_count(3)
    no_overflow(page)
    page.keyboard.press("Escape")
    expect(page.locator("#settings")).to_be_hidden()
    # Tab walks the controls, each with a visible focus ring
    page.locator("#prompt").focus()
    for _ in range(3):
        page.keyboard.press("Shift+Tab")
        ring = page.evaluate("[document.activeElement.tagName, getComputedStyle(document.activeElement).outlineStyle]")
        assert ring[0] != "BODY" and ring[1] != "none", ring


# -- the workspace for someone without a key ----------------------------------------------------------

def test_the_demo_provider_from_settings_through_to_a_commit(ui, target, pages, tmp_path):
    """A newcomer with no key: Settings offers the demo, its one model is chosen for them,
    Save closes the dialog, and a whole conversation, its diff and a commit follow."""
    project(target)
    page = pages()
    open_workspace(page, ui)
    expect(page.locator("#welcome-model")).to_contain_text("Demo provider")       # the hint
    page.click("#open-settings")
    pages.allowed.append("status of 409")                  # the default provider has no key
    page.select_option("#s-provider", "scripted")
    expect(page.locator("#s-demo-note")).to_be_visible()
    expect(page.locator("#s-key")).to_be_hidden()
    expect(page.locator("#s-model")).to_have_value("overlord-demo")             # preselected
    expect(page.locator("#s-model-status")).to_contain_text("demo script")
    page.click("#settings-save")
    expect(page.locator("#settings")).to_be_hidden()
    expect(page.locator("#welcome-model")).to_contain_text("overlord-demo")
    page.fill("#prompt", "show me what you do")
    page.keyboard.press("Enter")
    expect(page.locator(".note.done")).to_contain_text("Done")
    expect(page.locator(".msg-assistant .md").first).to_contain_text("demo script")
    expect(page.locator("details.tool")).to_have_count(3)
    expect(page.locator("#file-list .file-row")).to_have_count(1)
    expect(page.locator("#file-list")).to_contain_text("OVERLORD-DEMO.md")
    expect(page.locator(".file-diff .diff-line.add").first).to_contain_text("Written by the OVERLORD demo")
    assert not (target / "OVERLORD-DEMO.md").exists()
    page.click("#commit")
    expect(page.locator("#decided")).to_contain_text("Committed")
    assert (target / "OVERLORD-DEMO.md").read_text().startswith("# Written by the OVERLORD demo")


def test_a_failed_run_shows_its_reason(ui, pages):
    """A provider pointed at a closed port: the page says what the transcript says."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ui.ok("PUT", "/api/settings", {"provider": "openai-compatible",
                                   "profile": {"model": "local-model",
                                               "base_url": f"http://127.0.0.1:{port}/v1"}})
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "hello?")
    page.keyboard.press("Enter")
    note = page.locator(".note.error")
    reason = f"The run failed: openai-compatible: cannot reach 127.0.0.1:{port}"
    expect(note).to_contain_text(reason)
    expect(note).to_contain_text("refused")
    expect(note).to_have_count(1)                       # the error and the run's end: one note
    expect(page.locator("#send")).to_be_visible()
    page.reload()                                       # rebuilt from the transcript: the same words
    expect(page.locator(".note.error")).to_contain_text(reason)


def test_console_shows_metadata_and_asks_before_privileged_modes(ui, home, target, pages):
    import stat as st
    sid = run(home, target, "chmod u+s hello.txt; echo more >> sub/a.txt; chmod 0600 sub/a.txt")
    mode = st.S_IMODE(os.stat(target / "hello.txt").st_mode)
    page = pages()
    page.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    ledger = page.locator(".doc-section .ledger").first
    note = ledger.locator("td.path", has_text="hello.txt").locator(".meta-notes")
    expect(note).to_have_text(f"mode {mode:04o} → {mode | 0o4000:04o} \u00b7 setuid \u00b7 metadata only")
    expect(note).to_have_class("meta-notes privileged")
    expect(ledger.locator("td.path", has_text="sub/a.txt").locator(".meta-notes")).to_contain_text("→ 0600")
    expect(page.locator(".file-diff", has_text="hello.txt")).to_contain_text("metadata only: mode")
    pages.allowed.append("status of 409")
    page.get_by_role("button", name="Commit", exact=True).click()
    refusal = page.locator(".doc-message")
    expect(refusal).to_contain_text("Commit refused; nothing was written.")
    expect(refusal).to_contain_text("adds privileges a commit never grants silently: hello.txt (mode")
    assert not os.stat(target / "hello.txt").st_mode & 0o4000
    allow = page.locator("label.allow-privileged")
    expect(allow).to_contain_text("allow privileged modes")
    allow.click()
    page.get_by_role("button", name="Commit", exact=True).click()
    expect(page.locator(".doc-head .pill")).to_have_text("committed")
    expect(page.locator(".decided")).to_contain_text("Privileged modes allowed")
    assert os.stat(target / "hello.txt").st_mode & 0o4000
    # discard: the one vocabulary (Discard = roll back) on a second session
    other = run(home, target, "echo x > x.txt")
    page.goto(f"{ui.base}/console#{other}")
    page.get_by_role("button", name="Discard").click()
    page.get_by_role("button", name="Confirm discard").click()
    expect(page.locator(".doc-head .pill")).to_have_text("rolled back")
    expect(page.locator(".decided")).to_contain_text("Discarded (rolled back)")
    assert not (target / "x.txt").exists()


def test_the_inspector_shows_metadata_and_asks_before_privileged_modes(ui, fake, target, pages):
    project(target)
    ui.use(fake)
    fake.queue(fake.turn(text="Making it setuid.", calls=[("shell", {"command": "chmod u+s app.py"})]),
               fake.turn(text="Done."))
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "make app.py setuid")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible()
    row = page.locator("#file-list .file-row", has_text="app.py")
    expect(row.locator(".meta-notes.privileged")).to_contain_text("\u00b7 setuid")
    expect(page.locator(".file-diff .diff-summary")).to_contain_text("metadata only: mode")
    pages.allowed.append("status of 409")
    page.click("#commit")
    refusal = page.locator("#refusal")
    expect(refusal).to_contain_text("Commit refused. Nothing was written.")
    expect(refusal).to_contain_text("app.py (mode")
    go = refusal.get_by_role("button", name="Commit with these privileges")
    expect(go).to_be_disabled()
    refusal.locator("label.allow-privileged").click()
    go.click()
    expect(page.locator("#decided")).to_contain_text("Committed")
    assert os.stat(target / "app.py").st_mode & 0o4000


def test_console_lists_and_blames_names_that_are_not_utf8(ui, home, tmp_path, pages):
    raw = os.fsencode(str(tmp_path)) + b"/t\xff"
    os.mkdir(raw)
    proc = Ovl(home)("run", "-t", os.fsdecode(raw), "--", "sh", "-c",
                     "printf 'one\\ntwo\\n' > \"$(printf 'n\\376.txt')\"", check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    ui.ok("POST", f"/api/session/{sid}/commit")
    page = pages()
    page.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    expect(page.locator(".doc-sub")).to_contain_text("t\\xff")
    expect(page.locator(".reg-row .reg-target")).to_contain_text("t\\xff")
    page.locator(".ledger tr", has_text="n\\xfe.txt").get_by_role("button", name="blame").click()
    sheet = page.locator("#blame")
    expect(sheet.locator(".blame-line")).to_have_count(2)
    expect(sheet.locator(".blame-line .text").first).to_have_text("one")


# -- the record of trust: the second model, the gate, the committed diff, the audit log ------------------

def test_the_second_model_check_shows_a_verdict_that_turns_stale_after_a_rewind(ui, fake, target, pages):
    project(target)
    ui.use(fake)
    fake.queue(fake.turn(text="Two files.", calls=[("write_file", {"path": "a.txt", "content": "a\n"}),
                                                    ("write_file", {"path": "b.txt", "content": "b\n"})]),
               fake.turn(text="Done."))
    reviewer = ResponsesFake()
    try:
        ui.ok("PUT", "/api/settings", {"countersign": {"provider": "openai", "model": reviewer.MODEL,
                                                       "base_url": reviewer.url}, "countersign_key": KEY})
        page, sid = converse(pages, ui, "write a and b")
        panel = page.locator("#countersign")
        expect(panel).to_contain_text(f"openai:{reviewer.MODEL}")
        expect(page.locator("#gate")).to_contain_text("found nothing")
        reviewer.queue(reviewer.turn(text="ok", calls=[("approve", {"reason": "two small <b>files</b>, as asked"})]))
        panel.get_by_role("button", name="Second-model check").click()
        verdict = panel.locator(".verdict")
        expect(verdict).to_have_count(1)
        expect(verdict.locator(".verdict-badge")).to_have_text("Approved")
        expect(verdict.locator(".verdict-reason")).to_have_text("two small <b>files</b>, as asked")   # text, not markup
        expect(verdict.locator(".verdict-standing")).to_have_text("fresh: it countersigns this change")
        expect(verdict).to_contain_text(f"#1 \u00b7 openai:{reviewer.MODEL}")
        # the console's countersignature block shows it too; a rewind there makes it stale
        page.goto(f"{ui.base}/console#{sid}")
        block = page.locator(".countersign-panel")
        expect(block.locator(".verdict-standing")).to_have_text("fresh: it countersigns this change")
        rows = page.locator(".chain tbody tr")
        last = rows.count() - 1
        rows.nth(last - 1).get_by_role("button", name="Rewind here").click()
        rows.nth(last - 1).get_by_role("button", name="Confirm rewind").click()
        expect(rows).to_have_count(last)
        expect(block.locator(".verdict-standing")).to_have_text("stale: the change moved since it was reviewed")
        expect(block.locator(".verdict")).to_have_attribute("data-fresh", "false")
        # and "only with a fresh countersignature" refuses the commit, in words
        pages.allowed.append("status of 409")
        page.locator("label[for=countersigned]").click()
        page.get_by_role("button", name="Commit", exact=True).click()
        expect(page.locator(".doc-message")).to_contain_text("--countersigned needs a fresh, complete second-model approval")
        assert not (target / "a.txt").exists()
        assert reviewer.problems == []
    finally:
        reviewer.close()


def test_a_commit_the_gate_blocks_shows_the_refusal(ui, home, target, pages):
    sid = run(home, target, "echo '{\"name\": \"x\"}' > package.json")
    (home / "policy.json").write_text('{"default": {"checks": {"dependencies": "block"}}}')
    page = pages()
    page.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    finding = page.locator(".gate-block .finding")
    expect(finding).to_have_count(1)
    expect(finding.locator(".sev")).to_have_text("blocks the commit")
    expect(finding).to_contain_text("package.json")
    pages.allowed.append("status of 409")
    page.get_by_role("button", name="Commit", exact=True).click()
    refusal = page.locator(".doc-message")
    expect(refusal).to_contain_text("Commit refused; nothing was written.")
    expect(refusal.locator(".refusal-line")).to_contain_text("the content gate blocks dependencies in package.json")
    assert not (target / "package.json").exists()
    expect(page.locator(".doc-head .pill")).to_have_text("pending")


def test_the_committed_dossier_shows_its_diff_and_revert_stages_the_undo(ui, home, target, pages):
    sid = run(home, target, "printf 'hello\\nagain\\n' > hello.txt")
    ui.ok("POST", f"/api/session/{sid}/commit")
    page = pages()
    page.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    expect(page.locator(".doc-head .pill")).to_have_text("committed")
    diff = page.locator(".file-diff", has_text="hello.txt")
    expect(diff.locator(".diff-line.add .text")).to_have_text(["again"])
    expect(page.locator(".kept-note")).to_contain_text("read back from the versions it kept")
    page.get_by_role("button", name="Revert").click()
    expect(page.locator(".doc-head .pill")).to_have_text("pending")
    undo = page.evaluate("location.hash.slice(1)")
    assert undo != sid
    expect(page.locator(".reg-row")).to_have_count(2)
    expect(page.locator(".file-diff", has_text="hello.txt").locator(".diff-line.del .text")).to_have_text(["again"])
    assert (target / "hello.txt").read_text() == "hello\nagain\n"        # staged, not written
    page.get_by_role("button", name="Commit", exact=True).click()
    expect(page.locator(".doc-head .pill")).to_have_text("committed")
    assert (target / "hello.txt").read_text() == "hello\n"


def test_the_audit_log_shows_signed_and_renders_records_as_text(ui, home, target, pages):
    sid = run(home, target, "echo '<img src=x id=pwn>' > '<b>bold.txt'")
    ui.ok("POST", f"/api/session/{sid}/commit")
    page = pages()
    page.goto(f"{ui.base}/console?token={ui.token}#{sid}")
    page.click("#audit-link")
    verify = page.locator(".audit-verify")
    expect(verify).to_contain_text("signed")
    expect(verify).to_contain_text("the chain holds")
    expect(verify.locator(".audit-signed")).to_have_text("signed")
    table = page.locator("table.audit")
    expect(table.locator("tr", has_text="session.commit")).to_have_count(1)
    expect(table).to_contain_text("<img src=x id=pwn>")                 # the command, as text
    assert page.locator("#pwn").count() == 0 and page.locator("table.audit b").count() == 0
    page.fill("#audit-action", "session.commit")
    page.get_by_role("button", name="Show").click()
    expect(table.locator("tbody tr")).to_have_count(1)
    table.locator("a", has_text=sid).click()
    expect(page.locator(".doc-head")).to_contain_text(sid)
    # Settings -> Countersignature names the demo reviewer without a key
    page.goto(f"{ui.base}/")
    pages.allowed.append("status of 409")                  # the agent's default provider has no key
    page.click("#open-settings")
    page.select_option("#cs-provider", "scripted")
    expect(page.locator("#cs-demo-note")).to_be_visible()
    expect(page.locator("#cs-key")).to_be_hidden()
    expect(page.locator("#cs-model")).to_have_value("overlord-demo-reviewer")
    page.click("#settings-save")
    expect(page.locator("#settings-saved")).to_contain_text("Saved")      # (the agent has no model yet)
    assert ui.ok("GET", "/api/settings")["countersign"] == {
        "provider": "scripted", "model": "overlord-demo-reviewer", "base_url": "", "headers": {}}
