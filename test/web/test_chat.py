"""Conversations through the JSON API and its event stream, against fake model endpoints:
one conversation is one jailed agent session whose tools run in the launcher helper, replies
stream as deltas, later messages resume it, Stop ends a run within 2 s at any moment and leaves
it resumable, and a restarted server rebuilds the conversation from its transcript."""
import json
import os
import time

import pytest

from weblib import (KEY, UI, AnthropicFake, ChatFake, GeminiFake, ResponsesFake, records,  # noqa: F401
                    require_backend, require_kernel, sse_text, tree, ui)

WRITE = ("write_file", {"path": "notes/plan.md", "content": "# Plan\n\n1. read\n2. write\n"})
SHELL = ("shell", {"command": "printf 'beta\\n' > b.txt && echo wrote b"})


@pytest.fixture(autouse=True)
def kernel():
    require_kernel()


@pytest.fixture
def fake():
    f = AnthropicFake()
    yield f
    f.close()
    assert f.problems == []


def start(ui, message="make a plan"):
    r = ui.post("/api/chats", {"message": message})
    assert r.status == 200, r.body
    return r.json["sid"]


def test_a_conversation_streams_runs_jailed_tools_and_commits(ui, fake, target):
    before = tree(target)
    ui.use(fake)
    fake.queue(fake.turn(text="I will write the plan.", calls=[WRITE, SHELL]),
               fake.turn(text="Done: **plan** written."))
    sid = start(ui)
    events = ui.wait_idle(sid)
    names = [n for n, _ in events]
    assert "delta" in names, names
    text = "".join(d["text"] for n, d in events if n == "delta" and d["kind"] == "text")
    assert "I will write the plan." in text and "Done: **plan** written." in text
    kinds = [r["type"] for r in records(events)]
    assert kinds[:2] == ["task", "assistant"] and kinds[-1] == "done", kinds
    results = records(events, "tool_result")
    assert [r["exit_code"] for r in results] == [0, 0]
    assert results[0]["paths"] == ["notes", "notes/plan.md"] or "notes/plan.md" in results[0]["paths"]
    assert "wrote b" in results[1]["output"]
    assert records(events, "done")[0]["reason"] == "end_turn"
    # the session ran jailed and offline, as Settings said; nothing is on disk yet
    meta = ui.ok("GET", f"/api/session/{sid}")
    assert meta["meta"]["grants"]["jail"] is True and meta["meta"]["grants"]["net"] == "none"
    assert meta["meta"]["backend"] == "kernel"
    assert meta["agent"]["model"] == fake.MODEL and meta["agent"]["provider"] == "anthropic"
    assert tree(target) == before
    paths = {d["path"]: d for d in meta["diffs"]}
    plan = paths["notes/plan.md"]
    assert plan["kind"] == "added" and plan["added"] == 4
    assert [line for line in plan["hunks"][0]["lines"]][0] == ["+", "# Plan"]
    causes = {c["path"]: c["cause"] for c in meta["changes"]}
    assert causes["notes/plan.md"]["tool"] == "write_file" and causes["b.txt"]["tool"] == "shell"
    chats = ui.ok("GET", "/api/chats")["chats"]
    assert chats[0]["sid"] == sid and chats[0]["title"] == "make a plan" and not chats[0]["running"]
    done = ui.ok("POST", f"/api/session/{sid}/commit", {})
    assert done["state"] == "committed"
    assert (target / "notes" / "plan.md").read_text() == WRITE[1]["content"]
    assert (target / "b.txt").read_text() == "beta\n"
    # a committed conversation takes no more messages
    r = ui.post(f"/api/chats/{sid}/message", {"message": "more"})
    assert r.status == 409 and "committed" in r.json["error"]


def test_discard_leaves_the_folder_byte_identical(ui, fake, target):
    before = tree(target)
    ui.use(fake)
    fake.queue(fake.turn(calls=[WRITE, ("shell", {"command": "rm hello.txt; echo x > sub/a.txt"})]),
               fake.turn(text="ok"))
    sid = start(ui)
    ui.wait_idle(sid)
    kinds = {d["path"]: d["kind"] for d in ui.ok("GET", f"/api/session/{sid}")["diffs"]}
    assert kinds["hello.txt"] == "deleted" and kinds["sub/a.txt"] == "modified"
    assert ui.ok("POST", f"/api/session/{sid}/rollback", {})["state"] == "rolled-back"
    assert tree(target) == before


def test_a_later_message_resumes_the_same_session_and_model(ui, fake, target):
    ui.use(fake)
    fake.queue(fake.turn(text="first", calls=[WRITE]), fake.turn(text="one done"))
    sid = start(ui)
    ui.wait_idle(sid)
    # Settings change after the start: the conversation keeps its own model and endpoint
    other = ResponsesFake()
    try:
        ui.use(other, provider="openai")
        fake.queue(fake.turn(text="second", calls=[("shell", {"command": "echo 2 > two.txt"})]),
                   fake.turn(text="two done"))
        r = ui.post(f"/api/chats/{sid}/message", {"message": "now the second"})
        assert r.status == 200, r.body
        events = ui.wait_idle(sid)
        assert other.requests == []
    finally:
        other.close()
    recs = records(events)
    assert [r["note"] for r in recs if r["type"] == "resume"] == ["now the second"]
    assert [r["reason"] for r in recs if r["type"] == "done"] == ["end_turn", "end_turn"]
    last = fake.body()["messages"]
    assert any(m["role"] == "user" and "now the second" in json.dumps(m["content"]) for m in last)
    paths = {d["path"] for d in ui.ok("GET", f"/api/session/{sid}")["diffs"]}
    assert {"notes/plan.md", "two.txt"} <= paths
    points = ui.ok("GET", f"/api/session/{sid}")["savepoints"]
    assert [p["cause"].get("tool") for p in points] == ["write_file", "shell"]


def test_stop_during_a_tool_call_ends_within_two_seconds_and_resumes(ui, fake, target):
    ui.use(fake)
    fake.queue(fake.turn(calls=[("shell", {"command": "trap '' TERM INT; echo started; sleep 60"})]))
    sid = start(ui)
    with ui.events(sid) as ev:
        ev.until(lambda n, d: n == "record" and d["type"] == "tool_call")
        time.sleep(0.3)
        took = ui.stop(sid, ev)
        seen = ev.seen
    assert took < 2.0, took
    result = records(seen, "tool_result")[-1]
    assert result["cancelled"] is True
    assert records(seen, "done")[-1]["reason"] == "cancelled"
    fake.queue(fake.turn(text="picked up again"))
    assert ui.post(f"/api/chats/{sid}/message", {"message": "go on"}).status == 200
    assert records(ui.wait_idle(sid), "done")[-1]["reason"] == "end_turn"


def test_stop_during_a_model_call_that_has_not_answered(ui, fake):
    ui.use(fake)
    late = fake.turn(text="late")
    late.stall = 30
    fake.queue(late)
    sid = start(ui)
    with ui.events(sid) as ev:
        ev.until(lambda n, d: n == "snapshot")
        deadline = time.monotonic() + 10
        while not fake.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        took = ui.stop(sid, ev)
    assert took < 2.0, took
    detail = ui.ok("GET", f"/api/chats/{sid}")
    assert detail["records"][-1]["type"] == "done" and detail["records"][-1]["reason"] == "cancelled"
    assert len(fake.requests) == 1          # the broken call was not retried
    fake.plan.clear()
    fake.queue(fake.turn(text="now answering"))
    assert ui.post(f"/api/chats/{sid}/message", {"message": "try again"}).status == 200
    assert records(ui.wait_idle(sid), "done")[-1]["reason"] == "end_turn"


class Slow:
    """An answer whose stream dribbles: one event every 50 ms."""

    def __init__(self, answer):
        self.answer = answer

    def send(self, h):
        chunks = [c.encode() for c in sse_text(self.answer.events)]
        h.send_response(200)
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        try:
            for c in chunks:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                h.wfile.flush()
                time.sleep(0.05)
            h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


def test_stop_while_the_reply_streams(ui, fake):
    ui.use(fake)
    fake.queue(Slow(fake.turn(text="word " * 200)))
    sid = start(ui)
    with ui.events(sid) as ev:
        ev.until(lambda n, d: n == "delta" and d["text"])
        took = ui.stop(sid, ev)
    assert took < 2.0, took
    last = ui.ok("GET", f"/api/chats/{sid}")["records"][-1]
    assert last["type"] == "done" and last["reason"] == "cancelled"
    assert len(fake.requests) == 1          # the broken stream was not retried


def test_a_restarted_server_rebuilds_the_conversation(home, target, fake):
    first = UI(home, target)
    try:
        first.use(fake)
        fake.queue(fake.turn(text="Here is *the* answer.", calls=[WRITE]), fake.turn(text="bye"))
        sid = start(first)
        before = records(first.wait_idle(sid))
    finally:
        first.close()
    second = UI(home, target)
    try:
        assert second.token == first.token          # the launch token survives a restart
        with second.events(sid) as ev:
            name, snap = ev.next()
        assert name == "snapshot" and snap["running"] is False
        assert [r["type"] for r in snap["records"]] == [r["type"] for r in before]
        assert snap["records"][1]["text"] == "Here is *the* answer."
        assert second.ok("GET", "/api/chats")["chats"][0]["sid"] == sid
        fake.queue(fake.turn(text="still here"))
        assert second.post(f"/api/chats/{sid}/message", {"message": "again"}).status == 200
        assert records(second.wait_idle(sid), "done")[-1]["reason"] == "end_turn"
    finally:
        second.close()


@pytest.mark.parametrize("name", ["openai", "azure", "openai-compatible", "gemini"])
def test_every_provider_serves_a_conversation(ui, target, name):
    if name == "openai":
        f = ResponsesFake()
        ui.use(f, provider="openai")
    elif name == "azure":
        f = ChatFake(path="/openai/deployments/my-dep/chat/completions", auth="api-key",
                     query={"api-version": "2024-10-21"})
        ui.use(f, provider="azure", model="my-dep", knobs={"azure_api_version": "2024-10-21"})
    elif name == "openai-compatible":
        f = ChatFake(key=None, path="/v1/chat/completions", auth=None, tokens_field="max_tokens")
        ui.ok("PUT", "/api/settings", {"provider": name, "profile": {"model": "qwen-test",
                                                                     "base_url": f.url + "/v1"}})
    else:
        f = GeminiFake()
        ui.use(f, provider="gemini")
    try:
        f.queue(f.turn(text="writing", calls=[WRITE]), f.turn(text="done"))
        sid = start(ui)
        events = ui.wait_idle(sid)
        assert records(events, "done")[-1]["reason"] == "end_turn", records(events)
        assert any(n == "delta" for n, _ in events)
        assert "notes/plan.md" in {d["path"] for d in ui.ok("GET", f"/api/session/{sid}")["diffs"]}
        assert f.problems == []
    finally:
        f.close()


def test_audit_preset_from_the_composer(ui, fake):
    ui.use(fake)
    fake.queue(fake.turn(text="Audit: clean."))
    sid = start(ui, "/audit focus on /proc")
    events = ui.wait_idle(sid)
    task = records(events, "task")[0]
    assert task["audit"] is True and "/proc" in task["text"]
    assert ui.ok("GET", "/api/chats")["chats"][0]["audit"] is True
    r = ui.post(f"/api/chats/{sid}/message", {"message": "/audit"})
    assert r.status == 400


def test_a_start_that_cannot_open_says_why(ui, fake, target):
    # no key for the provider: refused before anything opens
    ui.ok("PUT", "/api/settings", {"provider": "anthropic", "profile": {"model": "m", "base_url": fake.url}})
    r = ui.post("/api/chats", {"message": "hi"})
    assert r.status == 409 and "no key for anthropic" in r.json["error"]
    assert ui.ok("GET", "/api/chats")["chats"] == []
    r = ui.post("/api/chats", {"message": "  "})
    assert r.status == 400 and r.json["field"] == "message"
    r = ui.post("/api/chats", {"message": "hi", "folder": str(target / "nope")})
    assert r.status == 400 and r.json["field"] == "folder"
    # one pending conversation per folder: the second is refused in words
    ui.use(fake)
    fake.queue(fake.turn(text="one"))
    sid = start(ui)
    ui.wait_idle(sid)
    r = ui.post("/api/chats", {"message": "another"})
    assert r.status == 409 and sid in r.json["error"] and "commit or roll it back" in r.json["error"]


def test_the_helper_does_every_clone(ui, fake):
    """The server process never clones namespaces: its tools run in children of the launcher."""
    ui.use(fake)
    fake.queue(fake.turn(calls=[("shell", {"command": "cat /proc/self/status | grep PPid; echo $$"})]),
               fake.turn(text="ok"))
    sid = start(ui)
    ui.wait_idle(sid)
    helpers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == ui.proc.pid]
    assert len(helpers) == 1, helpers          # the launcher, and no other child of the server
    threads = os.listdir(f"/proc/{helpers[0]}/task")
    assert len(threads) == 1                   # single-threaded


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def test_sandbox_grants_from_settings_and_refusals_in_settings_words(home, target, fake):
    ui = UI(home, target)
    try:
        ui.use(fake)
        ui.ok("PUT", "/api/settings", {"sandbox": {"jail": False, "net": "host"}})
        fake.queue(fake.turn(calls=[("shell", {"command": "test -d /proc/1 && echo unjailed"})]),
                   fake.turn(text="ok"))
        sid = start(ui)
        events = ui.wait_idle(sid)
        grants = ui.ok("GET", f"/api/session/{sid}")["meta"]["grants"]
        assert grants["jail"] is False and grants["net"] == "host"
        assert records(events, "tool_result")[0]["exit_code"] == 0
        ui.ok("POST", f"/api/session/{sid}/rollback")
    finally:
        ui.close()
    fuse = UI(home, target, env={"OVERLORD_TEST_BACKEND": "fuse"})
    try:
        require_backend("fuse")
        fuse.ok("PUT", "/api/settings", {"sandbox": {"jail": True, "net": "none"}})
        r = fuse.post("/api/chats", {"message": "hi"})
        assert r.status == 409, r.body
        assert "Jail the agent's tools" in r.json["error"] and "--no-jail" not in r.json["error"]
        # unjailed, with the host's network, the fuse backend serves a conversation too
        fuse.use(fake)
        fuse.ok("PUT", "/api/settings", {"sandbox": {"jail": False, "net": "host"}})
        fake.queue(fake.turn(calls=[WRITE]), fake.turn(text="ok"))
        sid = start(fuse)
        assert records(fuse.wait_idle(sid), "done")[-1]["reason"] == "end_turn"
        detail = fuse.ok("GET", f"/api/session/{sid}")
        assert detail["meta"]["backend"] == "fuse"
        assert "notes/plan.md" in {d["path"] for d in detail["diffs"]}
        fuse.ok("POST", f"/api/session/{sid}/rollback")
    finally:
        fuse.close()


# -- the workspace for someone without a key --------------------------------------------------------

def closed_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                       # nothing listens there now: a connection is refused
    return port


def test_the_demo_provider_runs_a_whole_conversation_without_a_key(ui, target):
    before = tree(target)
    s = ui.ok("PUT", "/api/settings", {"provider": "scripted"})
    assert "scripted" in s["providers"] and s["demo"] == "scripted" and "scripted" not in s["needs_key"]
    listed = ui.ok("GET", "/api/models?provider=scripted")["models"]
    assert [m["id"] for m in listed] == ["overlord-demo"]
    sid = start(ui, "show me")
    events = ui.wait_idle(sid)
    assert records(events, "done")[-1]["reason"] == "end_turn"
    assert [r["exit_code"] for r in records(events, "tool_result")] == [0, 0, 0]
    assert "demo script" in records(events, "assistant")[0]["text"]
    assert tree(target) == before                               # nothing on disk before Commit
    d = ui.ok("GET", f"/api/session/{sid}")
    assert [(c["path"], c["kind"]) for c in d["changes"]] == [("OVERLORD-DEMO.md", "added")]
    assert d["agent"]["model"] == "overlord-demo" and d["agent"]["provider"] == "scripted"
    assert "script" not in d["agent"]["endpoint"]
    ui.ok("POST", f"/api/session/{sid}/commit")
    assert (target / "OVERLORD-DEMO.md").read_text().startswith("# Written by the OVERLORD demo")


def test_a_failed_run_says_why_from_the_transcript(ui, target):
    port = closed_port()
    ui.ok("PUT", "/api/settings", {"provider": "openai-compatible",
                                   "profile": {"model": "m", "base_url": f"http://127.0.0.1:{port}/v1"}})
    sid = start(ui, "hi")
    events = ui.wait_idle(sid)
    error = records(events, "error")[-1]["message"]
    assert f"cannot reach 127.0.0.1:{port}" in error and "refused" in error, error
    done = records(events, "done")[-1]
    assert done["reason"] == "error" and done["message"] == error
    chat = ui.ok("GET", f"/api/chats/{sid}")
    assert [r["message"] for r in chat["records"] if r["type"] == "done"] == [error]
    assert ui.ok("GET", "/api/chats")["chats"][0]["last"]["message"] == error
    ui.ok("POST", f"/api/session/{sid}/rollback")


def test_a_start_without_a_model_says_so(ui, fake):
    ui.ok("PUT", "/api/settings", {"provider": "openai-compatible", "profile": {"base_url": fake.url}})
    r = ui.post("/api/chats", {"message": "hi"})
    assert r.status == 400 and r.json["field"] == "model" and "model" in r.json["error"]
    assert ui.ok("GET", "/api/chats")["chats"] == []
