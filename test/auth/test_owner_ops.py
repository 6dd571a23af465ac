"""Sessions have owners; accounts have their own keys and notes (issue 15, the ops layer).

ops.agent(owner=...) records meta["owner"] in the same save as the agent settings; fork and
revert keep the source's owner unless given one; a resume reads the owner's key. Keys resolve
the account's own file first (users/<owner>/keys.json, held to the machine file's checks), then
the environment, then the machine's keys.json. Notes are users/<owner>/memory.md, and an
accepted proposal goes to the session owner's notes, never another's. A name that is not an
account name never makes a path: it is refused before anything is read or written. Without an
owner (the CLI) everything is as it was.
"""
import json
import os
import stat
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))

from agentlib import call, write_script  # noqa: E402
from conftest import require_backend, tree  # noqa: E402
from fakes import AnthropicFake  # noqa: E402

from overlord import ops  # noqa: E402
from overlord.agent import keys  # noqa: E402
from overlord.agent import transcript as T  # noqa: E402
from overlord.errors import OverlordError, UsageError  # noqa: E402

HOSTILE = ["", ".", "..", "../x", "a/b", "/etc", "Alice", "alice/../bob", "a\0b", "1abc",
           "x" * 33, "Bob@Example.com", "bob@x.org/../../etc", "@x.org", "a@", "a b", "é",
           "alice\n", 5, b"alice"]
ENVS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "OPENAI_COMPAT_API_KEY",
        "GEMINI_API_KEY")


@pytest.fixture
def clean_env(monkeypatch, home):
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def kernel(monkeypatch, clean_env):
    require_backend("kernel")
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", "kernel")
    return clean_env


def scripted(tmp_path, target, turns, **kw):
    return ops.agent("do the task", str(target), provider="scripted",
                     script=str(write_script(tmp_path, turns)), **kw)


def meta(home, sid):
    return json.loads((home / "sessions" / sid / "meta.json").read_text())


def acts(action):
    return ops.audit_show(action=action)


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


WRITE = [{"tool_calls": [call("write_file", path="a.txt", content="1\n")]}, {"text": "done"}]
PROPOSE = [{"tool_calls": [call("remember", scope="user", note="Prefers tabs")]}, {"text": "done"}]


# -- names -----------------------------------------------------------------------------------

def test_user_dir_is_under_users_and_refuses_every_other_name(home):
    assert ops.user_dir("alice") == os.path.join(str(home), "users", "alice")
    assert ops.user_dir("bob.smith@example.org") == os.path.join(str(home), "users",
                                                                 "bob.smith@example.org")
    assert ops.user_dir("a" * 32) and ops.valid_user("a.b-c_d")
    for name in HOSTILE:
        assert not ops.valid_user(name), name
        with pytest.raises(UsageError):
            ops.user_dir(name)
    assert not (home / "users").exists()


def test_a_hostile_owner_is_refused_everywhere_and_nothing_is_made(kernel, tmp_path, target):
    home = kernel
    sid = scripted(tmp_path, target, WRITE).sid
    before = tree(home), tree(target)
    for name in HOSTILE:
        if name == "":
            continue       # "" is refused as well, below, where None would not be
        with pytest.raises(UsageError):
            scripted(tmp_path, target, WRITE, owner=name)
        with pytest.raises(UsageError):
            ops.fork(sid, 0, owner=name)
        with pytest.raises(UsageError):
            ops.revert(sid, owner=name)
        with pytest.raises(UsageError):
            ops.keys_set("anthropic", "sk-x", owner=name)
        with pytest.raises(UsageError):
            ops.keys_list(owner=name)
        with pytest.raises(UsageError):
            keys.get("anthropic", owner=name)
        with pytest.raises(UsageError):
            ops.memory_user(owner=name)
        with pytest.raises(UsageError):
            ops.memory_user_add("a note", owner=name)
        with pytest.raises(UsageError):
            ops.memory_user_set("notes\n", owner=name)
        with pytest.raises(UsageError):
            ops.memory_show(str(target), owner=name)
    for call_ in (lambda: ops.keys_set("anthropic", "sk-x", owner=""),
                  lambda: ops.memory_user_add("n", owner=""),
                  lambda: ops.fork(sid, 0, owner="")):
        with pytest.raises(UsageError):
            call_()
    # (the scripts written for the refused runs are in tmp_path, not in home or target)
    assert (tree(home), tree(target)) == before
    assert [s for s in os.listdir(home / "sessions")] == [sid]
    assert not (home / "users").exists()


def test_a_symlinked_account_dir_is_not_written_through(clean_env, tmp_path):
    home = clean_env
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / "users").mkdir(mode=0o700)
    os.symlink(elsewhere, home / "users" / "alice")
    with pytest.raises(OverlordError, match="not a directory of yours"):
        ops.keys_set("anthropic", "sk-alice", owner="alice")
    with pytest.raises(OverlordError, match="not a directory of yours"):
        ops.memory_user_add("a note", owner="alice")
    assert os.listdir(elsewhere) == []


# -- owners of sessions ----------------------------------------------------------------------

def test_owner_is_recorded_with_the_agent_settings_and_inherited(kernel, tmp_path, target):
    home = kernel
    res = scripted(tmp_path, target, WRITE, owner="alice")
    m = meta(home, res.sid)
    assert m["owner"] == "alice" and m["agent"]["model"] == "scripted-test"
    assert {s.get("sid"): s.get("owner") for s in _metas()}[res.sid] == "alice"
    kept = ops.fork(res.sid, 0)
    given = ops.fork(res.sid, 0, owner="bob@example.org")
    assert meta(home, kept)["owner"] == "alice" and meta(home, given)["owner"] == "bob@example.org"
    forks = {a["sid"]: a.get("owner") for a in acts("session.fork")}
    assert forks == {kept: "alice", given: "bob@example.org"}
    for s in (kept, given):
        ops.rollback(s)
    ops.commit(res.sid)
    undo = ops.revert(res.sid)
    assert meta(home, undo)["owner"] == "alice" and meta(home, undo)["reverts"] == res.sid
    ops.rollback(undo)
    undo = ops.revert(res.sid, owner="carol")
    assert meta(home, undo)["owner"] == "carol"
    assert [a.get("owner") for a in acts("session.revert")] == ["alice", "carol"]


def test_cli_sessions_are_unchanged(kernel, tmp_path, target):
    home = kernel
    res = scripted(tmp_path, target, WRITE)
    assert meta(home, res.sid)["owner"] is None
    f = ops.fork(res.sid, 0)
    assert meta(home, f).get("owner") is None
    assert "owner" not in acts("session.fork")[0]
    ops.rollback(f)
    ops.commit(res.sid)
    undo = ops.revert(res.sid)
    assert "owner" not in meta(home, undo) and "owner" not in acts("session.revert")[0]
    # the CLI's notes and keys are where they always were
    ops.memory_user_add("machine note", by="cli:test")
    assert ops.memory_user()["path"] == str(home / "memory.md")
    assert (home / "memory.md").read_text() == "- machine note\n"
    assert "owner" not in acts("memory.edit")[0]
    ops.keys_set("anthropic", "sk-machine")
    assert keys.path() == str(home / "keys.json") and keys.get("anthropic") == "sk-machine"
    assert ops.keys_list()["anthropic"] == "store" and "own" not in ops.keys_list().values()
    assert not (home / "users").exists()


def _metas():
    return [json.loads(open(os.path.join(d, "meta.json")).read())
            for d in (os.path.join(ops.home(), "sessions", n)
                      for n in os.listdir(os.path.join(ops.home(), "sessions")))]


# -- keys -------------------------------------------------------------------------------------

def test_keys_resolve_own_then_env_then_machine_and_owners_are_isolated(clean_env, monkeypatch):
    home = clean_env
    ops.keys_set("anthropic", "sk-machine")
    ops.keys_set("anthropic", "sk-alice", owner="alice")
    ops.keys_set("openai", "sk-bob-openai", owner="bob@example.org")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    assert keys.get("anthropic", "alice") == "sk-alice"            # own first, over the env
    assert keys.get("anthropic", "bob@example.org") == "sk-env"    # none of bob's: the env
    assert keys.get("anthropic") == "sk-env"                       # the CLI: env, then machine
    assert keys.get("openai", "alice") is None and keys.get("openai") is None
    assert keys.get("openai", "bob@example.org") == "sk-bob-openai"
    assert ops.keys_list(owner="alice")["anthropic"] == "own"
    assert ops.keys_list(owner="bob@example.org")["anthropic"] == "env"
    assert ops.keys_list(owner="bob@example.org")["openai"] == "own"
    assert ops.keys_list(owner="alice")["openai"] is None
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert keys.get("anthropic", "bob@example.org") == "sk-machine"   # then the machine's
    assert ops.keys_list(owner="bob@example.org")["anthropic"] == "store"
    assert ops.keys_list()["anthropic"] == "store"
    # files: private, each account's apart from the machine's
    own = home / "users" / "alice" / "keys.json"
    assert mode(own) == 0o600 and mode(own.parent) == 0o700 and mode(home / "users") == 0o700
    assert json.loads(own.read_text()) == {"anthropic": "sk-alice"}
    assert json.loads((home / "keys.json").read_text()) == {"anthropic": "sk-machine"}
    # removing alice's own key falls back, and leaves the others'
    ops.keys_set("anthropic", "", owner="alice")
    assert keys.get("anthropic", "alice") == "sk-machine"
    assert keys.get("openai", "bob@example.org") == "sk-bob-openai"
    # an account's key file others may read is refused, like the machine's
    ops.keys_set("anthropic", "sk-alice-2", owner="alice")
    os.chmod(own, 0o640)
    with pytest.raises(OverlordError, match="lets others read it"):
        keys.get("anthropic", "alice")
    assert keys.get("anthropic", "bob@example.org") == "sk-machine"   # bob is not affected


def test_resume_calls_with_the_session_owner_s_key(kernel, tmp_path, target, monkeypatch):
    monkeypatch.setenv("OVERLORD_PROVIDER_RETRIES", "0")
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env-not-alice-s")
    ops.keys_set("anthropic", "sk-machine-not-alice-s")
    ops.keys_set("anthropic", "sk-alice-1", owner="alice")
    fake = AnthropicFake(key="sk-alice-1")
    try:
        fake.queue(fake.turn(text="Done."), fake.turn(text="Done again."))
        res = ops.agent("say done", str(target), provider="anthropic", model=fake.MODEL,
                        base_url=fake.url, owner="alice")
        assert res.reason == "end_turn", res.message
        ops.keys_set("anthropic", "sk-alice-2", owner="alice")   # read again at the resume
        fake.key = "sk-alice-2"
        again = ops.resume(res.sid, "once more")
        assert again.reason == "end_turn", again.message
        assert [r["headers"]["x-api-key"] for r in fake.requests] == ["sk-alice-1", "sk-alice-2"]
        assert fake.problems == []
        sdir = kernel / "sessions" / res.sid
        for name in ("meta.json", "transcript.jsonl"):
            assert "sk-alice" not in (sdir / name).read_text()
    finally:
        fake.close()


# -- notes ------------------------------------------------------------------------------------

def test_notes_are_each_account_s_own(kernel, tmp_path, target):
    home = kernel
    ops.memory_user_add("machine note", by="cli:test")
    ops.memory_user_add("alice note", by="workspace", owner="alice")
    ops.memory_user_set("bob's notes\n", by="workspace", owner="bob@example.org")
    alice = ops.memory_user(owner="alice")
    assert alice["path"] == str(home / "users" / "alice" / "memory.md")
    assert alice["text"] == "- alice note\n" and mode(alice["path"]) == 0o600
    assert ops.memory_user(owner="bob@example.org")["text"] == "bob's notes\n"
    assert ops.memory_user()["text"] == "- machine note\n"
    assert ops.memory_user(owner="carol")["exists"] is False
    assert [a.get("owner") for a in acts("memory.edit")] == [None, "alice", "bob@example.org"]
    shown = ops.memory_show(str(target), owner="alice")["text"]
    assert "alice note" in shown and "machine note" not in shown and "bob's" not in shown
    assert "machine note" in ops.memory_show(str(target))["text"]
    # what an owned session is told: its owner's notes, no one else's
    res = scripted(tmp_path, target, [{"text": "done"}], owner="alice")
    system = [e for e in T.read(str(home / "sessions" / res.sid)) if e["type"] == "system"][0]
    assert "alice note" in system["prompt"] and "machine note" not in system["prompt"]
    user = [s for s in meta(home, res.sid)["memory"]["sources"] if s["name"] == "user"][0]
    assert user["path"] == alice["path"] and user["sha256"] == alice["sha256"]


def test_accept_goes_to_the_session_owner_s_notes(kernel, tmp_path, target):
    home = kernel
    ops.memory_user_add("bob note", owner="bob")
    owned = scripted(tmp_path, target, PROPOSE, owner="alice").sid
    rows = ops.memory_accept(owned, all=True, by="workspace")      # whoever accepts
    assert [r["accepted"] for r in rows] == [True]
    assert ops.memory_user(owner="alice")["text"] == "- Prefers tabs\n"
    assert ops.memory_user(owner="bob")["text"] == "- bob note\n"
    assert not (home / "memory.md").exists()
    (event,) = [e for e in T.read(str(home / "sessions" / owned)) if e["type"] == "memory_accepted"]
    assert event["owner"] == "alice" and event["by"] == "workspace"
    (act,) = acts("memory.accept")
    assert act["owner"] == "alice" and "Prefers tabs" not in json.dumps(act)
    # a CLI session's proposals go to the machine's notes, as before
    ops.rollback(owned)
    cli = scripted(tmp_path, target, PROPOSE).sid
    ops.memory_accept(cli, ids=[1], by="cli:test")
    assert (home / "memory.md").read_text() == "- Prefers tabs\n"
    assert "owner" not in acts("memory.accept")[1]
    assert ops.memory_user(owner="alice")["text"] == "- Prefers tabs\n"
    # a meta whose owner names no account writes nowhere
    ops.rollback(cli)
    bad = scripted(tmp_path, target, PROPOSE, owner="alice").sid
    path = home / "sessions" / bad / "meta.json"
    m = json.loads(path.read_text())
    m["owner"] = "../../escape"
    path.write_text(json.dumps(m))
    before = tree(home)
    with pytest.raises(UsageError):
        ops.memory_accept(bad, all=True, by="workspace")
    assert tree(home) == before and not (tmp_path / "escape").exists()


# -- never through another's folder; the machine's key never to an account's URL ---------------

def test_a_symlinked_account_dir_is_not_read_through_by_any_reader(kernel, tmp_path, target):
    home = kernel
    ops.keys_set("anthropic", "sk-alice-own", owner="alice")
    ops.memory_user_add("alice's private note", owner="alice")
    os.symlink("alice", home / "users" / "bob")
    with pytest.raises(OverlordError, match="not a directory of yours"):
        keys.get("anthropic", owner="bob")
    with pytest.raises(OverlordError, match="not a directory of yours"):
        ops.keys_list(owner="bob")
    with pytest.raises(OverlordError, match="not a directory of yours"):
        ops.memory_user(owner="bob")
    shown = ops.memory_show(str(target), owner="bob")      # the prompt: a warning, not her notes
    assert "alice's private note" not in shown["text"]
    user = [s for s in shown["sources"] if s["name"] == "user"][0]
    assert "not a directory of yours" in user["warning"]
    res = scripted(tmp_path, target, [{"text": "done"}], owner="bob")
    system = [e for e in T.read(home / "sessions" / res.sid) if e["type"] == "system"][0]
    assert "alice's private note" not in json.dumps(system)
    # users/ itself a link to another home's users/: nobody's files are read through it
    other = tmp_path / "other-home"
    (other / "users" / "carol").mkdir(parents=True, mode=0o700)
    (other / "users" / "carol" / "memory.md").write_text("- carol's note\n")
    os.rename(home / "users", tmp_path / "kept-users")
    os.symlink(other / "users", home / "users")
    with pytest.raises(OverlordError, match="not a directory of yours"):
        ops.memory_user(owner="carol")
    with pytest.raises(OverlordError, match="not a directory of yours"):
        keys.get("anthropic", owner="alice")
    assert alice_notes_untouched(tmp_path / "kept-users")


def alice_notes_untouched(users):
    return (users / "alice" / "memory.md").read_text() == "- alice's private note\n"


class Listener:
    """A listener an account could run: records every request's headers."""

    def __init__(self):
        import http.server
        import threading
        self.seen = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.seen.append(dict(self.headers))
                data = b'{"object": "list", "data": [{"id": "m-1"}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_port}/v1"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.mark.parametrize("where", ["store", "env"])
def test_the_machines_key_goes_to_no_url_an_account_chose(clean_env, monkeypatch, where):
    from overlord.ops.agent import endpoint
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    secret = "sk-machine-shared-0123456789"
    if where == "store":
        ops.keys_set("openai", secret)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", secret)
    listener = Listener()
    try:
        for url in (listener.url, listener.url + "/", "https://api.openai.com.evil.example/v1"):
            with pytest.raises(OverlordError, match="the machine's shared key goes only to "
                               "openai's own endpoint; set your own key") as info:
                ops.models("openai", base_url=url, owner="olive")
            assert "\n" not in str(info.value) and info.value.http_status == 403
        assert listener.seen == []                   # refused before any connection
        # the provider's own endpoint (given or not) takes the machine's key, as before
        assert endpoint("openai", owner="olive").api_key == secret
        assert endpoint("openai", base_url="https://api.openai.com/v1/", owner="olive").api_key \
            == secret
        # the CLI and the launch token (no owner): unchanged
        ops.models("openai", base_url=listener.url)
        assert listener.seen and secret in json.dumps(listener.seen[-1])
        # the account's own key goes wherever the account says
        listener.seen.clear()
        ops.keys_set("openai", "sk-olive-own", owner="olive")
        ops.models("openai", base_url=listener.url, owner="olive")
        assert "sk-olive-own" in json.dumps(listener.seen) and secret not in json.dumps(listener.seen)
    finally:
        listener.close()


def test_a_resume_never_sends_the_machines_key_to_the_accounts_url(kernel, tmp_path, target,
                                                                  monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OVERLORD_PROVIDER_RETRIES", "0")
    ops.keys_set("anthropic", "sk-machine-not-alice-s")
    ops.keys_set("anthropic", "sk-alice-1", owner="alice")
    fake = AnthropicFake(key="sk-alice-1")
    try:
        fake.queue(fake.turn(text="Done."))
        res = ops.agent("say done", str(target), provider="anthropic", model=fake.MODEL,
                        base_url=fake.url, owner="alice")
        assert res.reason == "end_turn", res.message
        ops.keys_set("anthropic", "", owner="alice")      # her own key gone: the machine's left
        with pytest.raises(OverlordError, match="shared key goes only to anthropic's own"):
            ops.resume(res.sid, "once more")
        with pytest.raises(OverlordError, match="shared key goes only to anthropic's own"):
            ops.agent("again", str(target), provider="anthropic", model=fake.MODEL,
                      base_url=fake.url, owner="alice")
        assert len(fake.requests) == 1
        assert "sk-machine" not in json.dumps(fake.requests)
    finally:
        fake.close()


def test_an_accounts_workspace_settings_are_not_read_through_a_symlinked_folder(home):
    """users/bob -> alice: bob's Settings refuse (one line) rather than show alice's ui.json
    (its provider profiles may carry a gateway's credential header)."""
    from overlord.errors import OverlordError
    from overlord.web import settings as S
    alice = home / "users" / "alice"
    alice.mkdir(parents=True, mode=0o700)
    (alice / "ui.json").write_text('{"provider": "openai"}')
    (home / "users" / "bob").symlink_to("alice")
    assert S.Settings("/tmp", path=S.user_path("alice")).load()["provider"] == "openai"
    with pytest.raises(OverlordError, match="not a directory of yours"):
        S.Settings("/tmp", path=S.user_path("bob")).load()
    assert S.Settings("/tmp", path=S.user_path("carol")).load()["provider"] == "anthropic"


def test_an_accounts_agent_is_told_only_its_own_journal_lines(home, target):
    """The folder's journal names each committed session's task and files: an account's agent
    is told its own sessions' lines only; the CLI (the admin's) every line."""
    from overlord.agent import memory as M
    os.makedirs(M.journal_dir(), exist_ok=True)
    lines = [{"sid": "20261201-000000-aaaaaa", "at": 1, "task": "bob's secret plan", "owner": "bob",
              "files": ["a"], "changes": 1},
             {"sid": "20261201-000000-bbbbbb", "at": 2, "task": "olive's own work", "owner": "olive",
              "files": ["b"], "changes": 1},
             {"sid": "20261201-000000-cccccc", "at": 3, "task": "from the terminal", "files": [],
              "changes": 0}]
    with open(M.journal_path(os.path.realpath(target)), "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in lines))
    olive = M.gather(os.path.realpath(target), "olive").text
    assert "olive's own work" in olive and "bob's secret plan" not in olive and "terminal" not in olive
    cli = M.gather(os.path.realpath(target)).text
    assert all(t in cli for t in ("bob's secret plan", "olive's own work", "from the terminal"))
