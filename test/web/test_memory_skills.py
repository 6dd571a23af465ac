"""Memory and skills in the workspace: Settings -> Memory (your notes edited and saved, the
folder's project notes and journal shown read-only), the proposal card's Save (while the agent
still runs, recorded in the transcript and on the audit chain), Settings -> Skills (the folder's
catalogue, show, add from a path, remove a machine skill) and the skill_load card.

Over real HTTP against `overlord ui` (every new route guarded like the old ones, bad input a
clear 4xx JSON error with nothing changed) and in a real browser (Playwright driving Chromium).
The scripted provider plays the model: a sitecustomize on the server's PYTHONPATH points the
workspace's demo provider at the test's own script. Note text and skill descriptions are
attacker-chosen: they must arrive in the page as text, never as markup.
"""
import json
import os
import subprocess

import pytest

from conftest import require_tool
from weblib import REPO, UI, records, require_kernel, tree, ui  # noqa: F401
from test_browser import browser, no_overflow, open_workspace, pages, shot  # noqa: E402,F401

try:                                    # the browser tests skip without Playwright (pages)
    from playwright.sync_api import expect
except ImportError:                     # pragma: no cover - depends on the host
    expect = None

from overlord import ops  # noqa: E402

ODD = "<img src=x onerror=\"window.__pwned = 1\"> likes tabs & \u00e9t\u00e9"   # model-chosen
SITE = """import os
if os.environ.get("OVERLORD_TEST_SCRIPT"):
    from overlord.web import settings
    settings.DEMO_SCRIPT = os.environ["OVERLORD_TEST_SCRIPT"]
"""


RUN = 90_000                # ms a browser test waits for a conversation's run (CI is busy)


def script(*turns):
    return {"model": "overlord-test", "turns": [dict(t, usage={"input_tokens": 1, "output_tokens": 1})
                                                for t in turns]}


def serve(home, target, tmp_path, turns=None, jail=True):
    """`overlord ui` with the scripted provider following `turns` (a script())."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    env = {"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    if turns is not None:
        (tmp_path / "script.json").write_text(json.dumps(turns))
        env["OVERLORD_TEST_SCRIPT"] = str(tmp_path / "script.json")
    server = UI(home, target, env=env)
    server.ok("PUT", "/api/settings", {"provider": "scripted", "sandbox": {"jail": jail, "net": "none"}})
    return server


@pytest.fixture
def served(home, target, tmp_path):
    """serve(turns, jail), each server closed after the test's pages are checked (requested
    before `pages`, torn down after it: no page is left calling a server that went away)."""
    started = []

    def start(turns=None, jail=True):
        started.append(serve(home, target, tmp_path, turns, jail))
        return started[-1]
    yield start
    for server in started:
        server.close()


def gate_command(gate):
    """A shell command the agent runs that waits (on a condition, not a clock) until the test
    creates `gate`: the agent is still running meanwhile. Outside the target, so the session
    sees the host's file; the tools run unjailed for that."""
    return f"while [ ! -e {gate} ]; do sleep 0.02; done; echo released"


def proposing(gate):
    """remember (scope user) with a hostile note, a file change, then the gate; then done."""
    return script(
        {"text": "I'll remember that for you.",
         "tool_calls": [{"name": "remember", "input": {"scope": "user", "note": ODD}},
                        {"name": "write_file", "input": {"path": "notes.txt", "content": "kept\n"}}]},
        {"text": "Waiting for the build.", "tool_calls": [{"name": "shell", "input": {"command": gate_command(gate)}}]},
        {"text": "Done: notes.txt is written and I proposed one note for your notes."})


def audit_lines(home, action):
    path = home / "audit.jsonl"
    if not path.exists():
        return []
    return [a for a in map(json.loads, path.read_text().splitlines()) if a["action"] == action]


def cookie_of(ui):
    return ui.get(f"/?token={ui.token}", auth=False).header("set-cookie").split(";")[0]


# -- your notes --------------------------------------------------------------------------------------

def test_your_notes_are_read_and_replaced_by_an_audited_edit(ui, home):
    got = ui.ok("GET", "/api/memory/user")
    assert got["text"] == "" and got["bytes"] == 0 and got["cap"] == 8192
    assert got["path"] == str(home / "memory.md")
    saved = ui.ok("PUT", "/api/memory/user", {"text": "- I like small commits\n- pytest, not unittest"})
    assert (home / "memory.md").read_text() == "- I like small commits\n- pytest, not unittest\n"
    assert saved["text"] == (home / "memory.md").read_text() and saved["bytes"] == 46
    assert os.stat(home / "memory.md").st_mode & 0o777 == 0o600
    (edit,) = audit_lines(home, "memory.edit")
    assert edit["by"] == "workspace" and edit["bytes"] == 46 and len(edit["sha256"]) == 64
    assert "small commits" not in json.dumps(edit)            # a digest and a size, never the notes
    # and it is what an agent in any folder is told
    assert "pytest, not unittest" in ui.ok("GET", "/api/memory")["text"]


def test_bad_notes_are_refused_with_a_clear_error_and_nothing_changes(ui, home):
    ui.ok("PUT", "/api/memory/user", {"text": "- keep me\n"})
    before = (home / "memory.md").read_bytes()
    for body in ({}, {"text": 5}, {"text": None}, {"text": ["a"]}, {"note": "x"}, {"text": "a\u0000b"}):
        r = ui.put("/api/memory/user", body)
        assert r.status == 400, (body, r.body)
        assert r.json["error"] and r.json["field"] == "text", r.json
    r = ui.request("PUT", "/api/memory/user", raw=b"not json", headers={"Content-Type": "application/json"})
    assert r.status == 400 and "JSON" in r.json["error"]
    r = ui.request("POST", "/api/memory/user", body={"text": "x"})
    assert r.status == 405 and "PUT" in r.header("allow")
    assert (home / "memory.md").read_bytes() == before
    assert len(audit_lines(home, "memory.edit")) == 1


def test_the_new_routes_are_guarded_like_every_route(ui, home, target):
    cookie = cookie_of(ui)
    other = f"http://127.0.0.1:{ui.port + 1}"          # a page an agent serves on another port
    sid = "20260101-000000-abcdef"
    reads = ("/api/memory/user", "/api/memory", "/api/skills", "/api/skills/python-testing",
             f"/api/chats/{sid}/memory")
    for path in reads:
        assert ui.get(path, auth=False).status == 401, path
        r = ui.get(path, auth=False, headers={"Cookie": cookie, "Sec-Fetch-Site": "same-site"})
        assert r.status == 403, path
        assert ui.get(path, headers={"Host": "evil.example"}).status == 421, path
    changes = (("PUT", "/api/memory/user", {"text": "pwned"}), ("POST", "/api/skills", {"path": str(target)}),
               ("DELETE", "/api/skills/python-testing", None),
               ("POST", f"/api/chats/{sid}/memory/accept", {"ids": [1]}))
    for method, path, body in changes:
        assert ui.request(method, path, body=body, auth=False).status == 401, path
        for headers in ({"Cookie": cookie, "Origin": other}, {"Cookie": cookie},
                        {"Cookie": cookie, "Sec-Fetch-Site": "cross-site"}):
            r = ui.request(method, path, body=body, auth=False, headers=headers)
            assert r.status == 403 and r.json["error"], (method, path, headers)
    assert not (home / "memory.md").exists() and not (home / "skills").exists()
    # a route segment that is not a skill name / session id is refused before anything runs
    for bad in ("..%2Fetc", "Upper", "a%20b", "x" * 65, "-lead"):
        r = ui.get(f"/api/skills/{bad}")
        assert r.status == 400, (bad, r.body)
    assert ui.post("/api/chats/nope/memory/accept", {"ids": [1]}).status == 400


def test_the_folders_memory_is_exactly_what_the_agent_is_told(ui, home, target):
    (target / "OVERLORD.md").write_text(f"- run tests with `pytest -q`\n- {ODD}\n")
    got = ui.ok("GET", "/api/memory")
    assert got["folder"] == os.path.realpath(target)
    told = ops.memory_show(str(target))
    assert got["text"] == told["text"] and got["sha256"] == told["sha256"]
    assert "pytest -q" in got["text"] and ODD in got["text"]
    project = [s for s in got["sources"] if s["name"] == "project"]
    assert project and project[0]["bytes"] == len((target / "OVERLORD.md").read_bytes())
    assert got["journal"] == []
    other = target.parent / "elsewhere"
    other.mkdir()
    assert ui.ok("GET", f"/api/memory?folder={other}")["folder"] == str(other)
    for bad in ("relative/path", "/no/such/folder", str(target / "OVERLORD.md")):
        r = ui.get(f"/api/memory?folder={bad}")
        assert r.status == 400 and r.json["field"] == "folder", (bad, r.body)


# -- a proposal, saved while the agent runs ------------------------------------------------------------

@pytest.fixture
def proposer(home, target, tmp_path):
    require_kernel()
    gate = tmp_path / "gate"
    server = serve(home, target, tmp_path, proposing(gate), jail=False)
    server.gate = gate
    yield server
    server.close()


def test_a_proposal_is_saved_while_the_agent_runs_and_the_record_says_so(proposer, home, target):
    ui = proposer
    sid = ui.ok("POST", "/api/chats", {"message": "note my preference"})["sid"]
    with ui.events(sid) as ev:
        ev.until(lambda n, d: n == "record" and d["type"] == "tool_call" and d["tool"] == "shell")
        proposal = records(ev.seen, "memory_proposal")
        assert [(p["id"], p["note"]) for p in proposal] == [(1, ODD)]
        assert ui.ok("GET", f"/api/chats/{sid}")["chat"]["running"]
        listed = ui.ok("GET", f"/api/chats/{sid}/memory")["proposals"]
        assert [(p["id"], p["accepted"]) for p in listed] == [(1, False)]
        # bad input: a clear 400, and nothing changes
        for body in ({}, {"ids": []}, {"ids": "1"}, {"ids": [True]}, {"ids": [0]}, {"ids": [1.5]},
                     {"all": "yes"}, {"all": True, "ids": [1]}):
            r = ui.post(f"/api/chats/{sid}/memory/accept", body)
            assert r.status == 400 and r.json["error"], (body, r.body)
        r = ui.post(f"/api/chats/{sid}/memory/accept", {"ids": [7]})
        assert r.status == 400 and "7" in r.json["error"], r.body
        assert not (home / "memory.md").exists()
        assert audit_lines(home, "memory.accept") == []
        # Save: while the agent still runs (no "press Stop first")
        r = ui.ok("POST", f"/api/chats/{sid}/memory/accept", {"ids": [1]})
        assert [(a["id"], a["accepted"]) for a in r["accepted"]] == [(1, True)]
        assert [(p["id"], p["accepted"], p["by"]) for p in r["proposals"]] == [(1, True, "workspace")]
        assert ODD in (home / "memory.md").read_text()
        assert ui.ok("GET", f"/api/chats/{sid}")["chat"]["running"]
        ev.until(lambda n, d: n == "record" and d["type"] == "memory_accepted")
        assert ev.seen[-1][1]["ids"] == [1] and ev.seen[-1][1]["by"] == "workspace"
        # again: skipped and said, not appended twice
        again = ui.ok("POST", f"/api/chats/{sid}/memory/accept", {"ids": [1]})["accepted"]
        assert again[0]["accepted"] is False and "already" in again[0]["skipped"]
        assert (home / "memory.md").read_text().count("likes tabs") == 1
        ui.gate.write_text("go")
        ev.until(lambda n, d: n == "state" and not d["running"])
        live = [d for n, d in ev.seen if n == "record"]
    # the run went on with its own events at their own places: every live record is the
    # transcript's record at that index (the acceptance written beside it shifted nothing)
    with ui.events(sid) as ev:
        name, snap = ev.next()
    assert name == "snapshot"
    by_index = {r["i"]: r for r in snap["records"]}
    for r in live:
        assert by_index[r["i"]]["type"] == r["type"], (r, by_index.get(r["i"]))
    kinds = [r["type"] for r in snap["records"]]
    assert kinds.count("memory_accepted") == 1 and kinds[-1] == "done"
    events = ops.transcript(sid)
    (accepted,) = [e for e in events if e["type"] == "memory_accepted"]
    assert accepted["ids"] == [1] and accepted["by"] == "workspace"
    (line,) = audit_lines(home, "memory.accept")
    assert line["sid"] == sid and "likes tabs" not in json.dumps(line)
    # commit: the journal line is the engine's record, the model's words labelled as its claim
    ui.ok("POST", f"/api/session/{sid}/commit", {})
    (entry,) = ui.ok("GET", "/api/memory")["journal"]
    assert entry["sid"] == sid and entry["task"] == "note my preference"
    assert entry["files"] == ["notes.txt"] and entry["claim"].startswith("Done: notes.txt")


# -- in a real browser: Settings -> Memory ------------------------------------------------------------

def test_a_person_edits_their_notes_in_settings_memory(home, target, tmp_path, served, pages):
    (target / "OVERLORD.md").write_text(f"- the build is `make`\n- {ODD}\n")
    ui = served()
    page = pages()
    open_workspace(page, ui)
    page.click("#open-settings")
    notes = page.locator("#m-user")
    expect(notes).to_have_value("")
    expect(page.locator("#m-user-size")).to_contain_text("0 of the 8,192 bytes")
    # the folder's notes: read-only, as text (the model may have written them)
    expect(page.locator("#m-folder")).to_have_text(os.path.realpath(target))
    expect(page.locator("#m-journal")).to_contain_text("No committed agent work")
    page.locator(".memory-told").evaluate("d => { d.open = true; }")
    expect(page.locator("#m-told")).to_contain_text("the build is `make`")
    expect(page.locator("#m-told")).to_contain_text(ODD)
    assert page.locator("#s-memory img").count() == 0
    notes.fill("- answer in British English\n- I review every diff")
    expect(page.locator("#m-user-size")).to_contain_text("49 of the 8,192 bytes")
    page.click("#m-user-save")
    expect(page.locator("#m-user-saved")).to_contain_text("Saved (50 bytes)")
    assert (home / "memory.md").read_text() == "- answer in British English\n- I review every diff\n"
    expect(page.locator("#m-told")).to_contain_text("I review every diff")
    shot(page, "settings-memory-1440.png", tmp_path)
    # a refusal is said beside the notes, nothing changes: a link where the file was
    pages.allowed.append("status of 400")
    os.unlink(home / "memory.md")
    os.symlink(target / "OVERLORD.md", home / "memory.md")
    notes.fill("- overwritten?")
    page.click("#m-user-save")
    expect(page.locator("#m-user-error")).to_contain_text("symbolic link")
    assert os.path.islink(home / "memory.md")
    os.unlink(home / "memory.md")
    # the dialog's own Save keeps the notes too, and a reload reads them back
    page.click("#settings-close")
    page.click("#open-settings")
    notes.fill("- saved with the dialog")
    page.click("#settings-save")
    expect(page.locator("#settings")).to_be_hidden()
    assert (home / "memory.md").read_text() == "- saved with the dialog\n"
    page.reload()
    page.click("#open-settings")
    expect(notes).to_have_value("- saved with the dialog\n")
    # over the cap: said (the agent is told the newest part)
    notes.fill("x" * 9000)
    expect(page.locator("#m-user-size")).to_contain_text("over the 8,192")
    assert page.evaluate("window.__pwned") is None
    phone = pages(390, 844)
    open_workspace(phone, ui)
    phone.click("#rail-open")
    phone.click("#open-settings")
    expect(phone.locator("#m-user")).to_be_visible()
    expect(phone.locator("#m-folder")).to_have_text(os.path.realpath(target))
    expect(phone.locator("#k-list li")).to_have_count(1)            # every read has answered
    expect(phone.locator("#s-model-status")).not_to_contain_text("Loading")
    no_overflow(phone)


def test_save_on_a_proposal_card_while_the_agent_runs(home, target, tmp_path, served, pages):
    gate = tmp_path / "gate"
    ui = served(proposing(gate), jail=False)
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "note my preference")
    page.click("#send")
    card = page.locator("section.memory-proposal")
    expect(card).to_have_count(1, timeout=RUN)
    # the note is the model's text: shown as text, never markup
    expect(card.locator(".proposal-note")).to_have_text(ODD)
    assert card.locator("img").count() == 0
    expect(page.locator("details.tool").nth(2).locator(".tool-status")).to_have_text("running")
    expect(page.locator("#stop")).to_be_visible()               # the agent is still working
    card.get_by_role("button", name="Save to your notes").click()
    expect(card.locator(".proposal-status")).to_have_text("Saved to your notes by you, here.")
    expect(card).to_have_class("memory-proposal is-saved")
    expect(card.get_by_role("button")).to_be_hidden()
    assert ODD in (home / "memory.md").read_text()
    sid = page.evaluate("location.hash.slice(1)")
    assert [e["ids"] for e in ops.transcript(sid) if e["type"] == "memory_accepted"] == [[1]]
    expect(page.locator("#stop")).to_be_visible()
    shot(page, "workspace-memory-proposal-1440.png", tmp_path)
    gate.write_text("go")
    expect(page.locator(".note.done")).to_be_visible(timeout=RUN)
    # after a reload the card says saved, from the transcript's memory_accepted
    page.reload()
    expect(card.locator(".proposal-status")).to_have_text("Saved to your notes by you, here.")
    expect(card.get_by_role("button")).to_be_hidden()
    expect(page.locator("details.tool")).to_have_count(3)
    assert page.evaluate("window.__pwned") is None
    page.click("#open-settings")
    expect(page.locator("#m-user")).to_have_value(f"- {ODD}\n")
    page.click("#settings-close")
    # commit: the journal in Settings -> Memory is OVERLORD's record, the model's words its claim
    page.click("#commit")
    expect(page.locator("#decided")).to_contain_text("Committed")
    page.click("#open-settings")
    page.get_by_role("navigation", name="Settings sections").get_by_role("button", name="Memory").click()
    expect(page.locator("#s-memory legend")).to_be_in_viewport()
    entry = page.locator("#m-journal .journal-entry")
    expect(entry).to_have_count(1)
    expect(entry.locator(".journal-task")).to_have_text("Task: note my preference")
    expect(entry.locator(".claim-label")).to_have_text("The model's own claim (not checked):")
    expect(entry.locator(".claim-text")).to_have_text("Done: notes.txt is written and I proposed one note for your notes.")
    expect(entry.locator(".journal-files")).to_have_text("Files changed: notes.txt")
    shot(page, "settings-memory-journal-1440.png", tmp_path)


# -- skills -------------------------------------------------------------------------------------------

HOSTILE = "<img src=x onerror=\"window.__pwned = 2\"> formats & checks"        # a project chose it


def skill_md(name, description, body="Do it well.\n", when=None):
    head = [f"name: {name}", f"description: {description}"] + ([f"when: {when}"] if when else [])
    return "---\n" + "\n".join(head) + "\n---\n" + body


def make_skill(where, name, description="does things", files=None, text=None, folder=None, when=None):
    d = where / (folder or name)
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(text if text is not None else skill_md(name, description, when=when))
    for rel, content in (files or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(content)
    return d


def project_skills(target):
    return target / ".overlord" / "skills"


def set_policy(tmp_path, data):
    path = tmp_path / f"policy-{len(list(tmp_path.glob('policy-*.json')))}.json"
    path.write_text(json.dumps(data))
    ops.policy_set(str(path))


def machine_tree(home):
    return tree(home / "skills") if (home / "skills").exists() else {}


def test_a_machine_skill_is_added_from_a_path_listed_shown_and_removed(ui, home, target, tmp_path):
    shipped = os.path.join(REPO, "skills", "python-testing")
    added = ui.ok("POST", "/api/skills", {"path": shipped})["added"]
    assert added["name"] == "python-testing" and "checklist.md" in added["files"]
    assert (home / "skills" / "python-testing" / "SKILL.md").read_bytes() == \
        open(os.path.join(shipped, "SKILL.md"), "rb").read()
    (act,) = audit_lines(home, "skill.add")
    assert act["name"] == "python-testing" and act["by"] == "workspace"
    make_skill(project_skills(target), "fmt", HOSTILE, when="before a commit")
    listed = ui.ok("GET", "/api/skills")
    assert listed["folder"] == os.path.realpath(target)
    rows = {(k["name"], k["source"]): k for k in listed["skills"]}
    assert set(rows) == {("fmt", "project"), ("python-testing", "machine")}
    assert rows[("fmt", "project")]["description"] == HOSTILE            # exact: the page escapes it
    assert rows[("fmt", "project")]["when"] == "before a commit"
    assert rows[("python-testing", "machine")]["allowed"] is True
    assert rows[("python-testing", "machine")]["shadowed"] is False
    shown = ui.ok("GET", "/api/skills/python-testing")
    assert shown["source"] == "machine" and "pytest" in shown["text"].lower()
    assert ui.ok("GET", "/api/skills/fmt")["text"].startswith("---\nname: fmt")
    # the folder's policy caps machine skills; a project skill of the same name shadows one
    set_policy(tmp_path, {"default": {"skills": []}})
    make_skill(project_skills(target), "python-testing", "the project's own way")
    rows = {(k["name"], k["source"]): k for k in ui.ok("GET", "/api/skills")["skills"]}
    assert rows[("python-testing", "machine")]["allowed"] is False
    assert rows[("python-testing", "machine")]["shadowed"] is True
    assert ui.ok("GET", "/api/skills/python-testing")["source"] == "project"
    other = tmp_path / "elsewhere"
    other.mkdir()
    rows = ui.ok("GET", f"/api/skills?folder={other}")["skills"]
    assert [(k["name"], k["source"]) for k in rows] == [("python-testing", "machine")]
    # remove: machine skills only
    r = ui.request("DELETE", "/api/skills/fmt")
    assert r.status == 404 and "fmt" in r.json["error"], r.body
    assert (project_skills(target) / "fmt" / "SKILL.md").exists()
    assert ui.ok("DELETE", "/api/skills/python-testing")["removed"]["name"] == "python-testing"
    assert not (home / "skills" / "python-testing").exists()
    (act,) = audit_lines(home, "skill.remove")
    assert act["name"] == "python-testing" and act["by"] == "workspace"
    r = ui.request("DELETE", "/api/skills/python-testing")
    assert r.status == 404, r.body


def test_a_bad_skill_add_is_one_clear_error_and_nothing_changes(ui, home, target, tmp_path):
    ui.ok("POST", "/api/skills", {"path": os.path.join(REPO, "skills", "release-notes")})
    before, acts = machine_tree(home), len(audit_lines(home, "skill.add"))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "notes.md").write_text("no SKILL.md here")
    no_front = make_skill(tmp_path / "bad", "x", text="just text, no front matter\n", folder="nofront")
    slash = make_skill(tmp_path / "bad", "x", text=skill_md("a/b", "slashed"), folder="slash")
    clash = make_skill(tmp_path / "clash", "release-notes", "another one")
    cases = [({}, 400, "path"), ({"path": 7}, 400, "path"), ({"path": ""}, 400, "path"),
             ({"path": "relative/dir"}, 400, "path"), ({"path": "/no/such/skill"}, 400, "does not exist"),
             ({"path": str(bare)}, 400, "SKILL.md"), ({"path": str(no_front)}, 400, "nofront"),
             ({"path": str(slash)}, 400, "slash"), ({"path": str(clash)}, 409, "already installed")]
    for body, status, words in cases:
        r = ui.post("/api/skills", body)
        assert r.status == status, (body, r.status, r.body)
        assert words in (r.json.get("field") or "") + r.json["error"], (body, r.json)
        assert "Traceback" not in r.json["error"]
    assert machine_tree(home) == before
    assert len(audit_lines(home, "skill.add")) == acts
    for bad in ("../x", "UPPER"):
        r = ui.request("DELETE", f"/api/skills/{bad}")
        assert r.status in (400, 404), (bad, r.body)
    assert ui.request("DELETE", "/api/skills/nope").status == 404
    assert machine_tree(home) == before
    r = ui.get("/api/skills/nope")
    assert r.status == 404 and "nope" in r.json["error"]
    r = ui.get("/api/skills?folder=relative")
    assert r.status == 400 and r.json["field"] == "folder"


def test_the_skills_settings_list_show_add_and_remove(home, target, tmp_path, served, pages):
    make_skill(project_skills(target), "fmt", HOSTILE, when="before a <b>commit</b>")
    make_skill(project_skills(target), "broken", text="no front matter at all\n")
    machine = make_skill(tmp_path / "mine", "deploy-check", "checks a deploy", files={"steps.md": "1. look\n"})
    ui = served()
    ui.ok("POST", "/api/skills", {"path": os.path.join(REPO, "skills", "python-testing")})
    set_policy(tmp_path, {"default": {"skills": ["deploy-check"]}})
    page = pages()
    open_workspace(page, ui)
    page.click("#open-settings")
    page.get_by_role("navigation", name="Settings sections").get_by_role("button", name="Skills").click()
    expect(page.locator("#s-skills legend")).to_be_in_viewport()
    rows = page.locator("#k-list .skill-row")
    expect(rows).to_have_count(2)
    fmt = page.locator('.skill-row[data-skill="fmt"]')
    expect(fmt.locator(".skill-source")).to_have_text("project")
    expect(fmt.locator(".skill-desc")).to_have_text(HOSTILE)                # text, not markup
    expect(fmt.locator(".skill-when")).to_have_text("When: before a <b>commit</b>")
    assert fmt.locator("img, b").count() == 0
    expect(fmt.get_by_role("button", name="Remove")).to_have_count(0)       # a file of the folder
    py = page.locator('.skill-row[data-skill="python-testing"]')
    expect(py.locator(".skill-source")).to_have_text("machine")
    expect(py).to_contain_text("not allowed here by policy")
    expect(page.locator("#k-warnings")).to_contain_text("broken")
    # show one
    fmt.get_by_role("button", name="Show").click()
    expect(page.locator("#k-shown")).to_be_visible()
    expect(page.locator("#k-shown-text")).to_contain_text(f"description: {HOSTILE}")
    assert page.locator("#k-shown img").count() == 0
    # add one from a path on this machine; a bad path is said, nothing added
    pages.allowed.append("status of 400")
    page.fill("#k-path", str(tmp_path / "nothing-here"))
    page.click("#k-add")
    expect(page.locator("#k-error")).to_contain_text("does not exist")
    page.fill("#k-path", str(machine))
    page.click("#k-add")
    expect(page.locator("#k-status")).to_have_text("Added deploy-check.")
    expect(rows).to_have_count(3)
    dc = page.locator('.skill-row[data-skill="deploy-check"]')
    expect(dc).not_to_contain_text("not allowed")
    assert (home / "skills" / "deploy-check" / "steps.md").read_text() == "1. look\n"
    dc.get_by_role("button", name="Show").click()
    expect(page.locator("#k-shown-files")).to_contain_text("steps.md")
    shot(page, "settings-skills-1440.png", tmp_path)
    # remove a machine skill: asked once more, then gone
    py.get_by_role("button", name="Remove").click()
    expect(py.locator(".skill-confirm")).to_contain_text("Remove the machine skill python-testing")
    py.locator(".skill-confirm").get_by_role("button", name="Remove").click()
    expect(page.locator("#k-status")).to_have_text("Removed python-testing.")
    expect(rows).to_have_count(2)
    assert not (home / "skills" / "python-testing").exists()
    assert page.evaluate("window.__pwned") is None


def test_a_skill_load_shows_in_the_chat_as_a_small_card(home, target, tmp_path, served, pages):
    make_skill(project_skills(target), "fmt", HOSTILE, files={"rules.md": "tabs\n"})
    turns = script({"text": "Loading the skills that fit.",
                    "tool_calls": [{"name": "skill", "input": {"name": "python-testing"}},
                                   {"name": "skill", "input": {"name": "fmt"}}]},
                   {"text": "Both loaded."})
    ui = served(turns)
    ui.ok("POST", "/api/skills", {"path": os.path.join(REPO, "skills", "python-testing")})
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "test it")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible(timeout=RUN)
    cards = page.locator(".skill-load")
    expect(cards).to_have_count(2)
    expect(cards.nth(0).locator(".skill-load-name")).to_have_text("python-testing")
    expect(cards.nth(0).locator(".skill-source")).to_have_text("machine skill")
    expect(cards.nth(1).locator(".skill-load-name")).to_have_text("fmt")
    expect(cards.nth(1).locator(".skill-source")).to_have_text("project skill")
    cards.nth(0).locator("summary").click()
    expect(cards.nth(0).locator(".skill-load-files")).to_contain_text("checklist.md")
    shot(page, "workspace-skill-load-1440.png", tmp_path)
    sid = page.evaluate("location.hash.slice(1)")
    loads = [e for e in ops.transcript(sid) if e["type"] == "skill_load"]
    assert [(e["name"], e["source"]) for e in loads] == [("python-testing", "machine"), ("fmt", "project")]
    page.reload()
    expect(cards).to_have_count(2)
    assert page.evaluate("window.__pwned") is None


# -- the inspector: git's own files, one line per repository (ops.git_summary) ------------------------

def test_the_inspector_folds_a_sessions_git_files_into_one_line(home, target, tmp_path, served, pages):
    require_tool("git")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-qm", "first"]):
        subprocess.run(argv, cwd=target, env=env, check=True)
    turns = script({"text": "Committing.", "tool_calls": [
                        {"name": "write_file", "input": {"path": "app.txt", "content": "v2\n"}},
                        {"name": "shell", "input": {"command": "git add -A && git commit -qm 'agent: app' && git log --oneline | head -1"}}]},
                   {"text": "Committed inside the session."})
    ui = served(turns)
    page = pages()
    open_workspace(page, ui)
    page.fill("#prompt", "commit it")
    page.click("#send")
    expect(page.locator(".note.done")).to_be_visible(timeout=RUN)
    sid = page.evaluate("location.hash.slice(1)")
    summary = ui.ok("GET", f"/api/session/{sid}")["git"]
    (repo,) = summary["repos"]
    assert repo["dir"] == ".git" and repo["line"].startswith("git")
    row = page.locator("#file-list .git-row")
    expect(row).to_have_count(1)
    expect(row.locator("summary")).to_have_text(repo["line"])
    expect(page.locator('#file-list .file-row a[title="app.txt"]')).to_have_count(1)
    # no .git/ file listed on its own, nor among the diffs
    assert page.locator('#file-list > .file-row:not(.git-row) [title^=".git"]').count() == 0
    expect(page.locator("#diffs .file-diff")).to_have_count(1)
    expect(page.locator("#diffs .file-diff .path")).to_have_text("app.txt")
    row.locator("summary").click()
    assert row.locator("li").count() == summary["paths"]
    shot(page, "workspace-git-summary-1440.png", tmp_path)
