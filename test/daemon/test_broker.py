"""The broker: a harness (daemon, MCP server, hook) never gets a looser scope than policy grants.

In-process, through ops.Broker, on both backends: deny by default, refusals of every looser
request naming the rule, and each way of trying to get more later (open loose then exec, fork,
resume, revert, commit flags, tightened policy) -- each refused with nothing changed.
"""
import json
import os

import pytest

from conftest import tree
from overlord import ops
from overlord.errors import Denied, OverlordError, UsageError


def set_policy(home, data):
    path = home / "policy.json"
    path.write_text(json.dumps(data))
    os.chmod(path, 0o600)
    ops.policy_show(str(home.parent / "target"))   # the change is noticed (policy.change) now


def audit_lines(home):
    path = home / "audit.jsonl"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def env(home, target, backend, monkeypatch):
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", backend)
    monkeypatch.chdir(target)
    return home, target, backend


def loose(backend):
    """What a harness must ask for on this backend (the fuse backend cannot jail)."""
    return {"jail": False, "net": "host"} if backend == "fuse" else None


def broker(client="test-harness"):
    return ops.Broker(ops.Caller("mcp", client=client))


def untouched(home, target):
    """A snapshot of what must not change: the tree, the sessions, the audit chain."""
    return tree(target), sorted(os.listdir(home / "sessions")) if (home / "sessions").exists() else [], audit_lines(home)


def test_no_policy_file_denies_naming_the_file_and_the_key(env):
    home, target, _ = env
    before = untouched(home, target)
    with pytest.raises(Denied) as exc:
        broker().open(str(target))
    msg = str(exc.value)
    assert str(home / "policy.json") in msg and '"targets"' in msg and str(target) in msg
    assert untouched(home, target) == before


def test_the_default_rule_alone_admits_nothing(env):
    home, target, backend = env
    set_policy(home, {"default": {"timeout": 60}})
    with pytest.raises(Denied, match="no target covering"):
        broker().open(str(target), loose(backend))
    assert ops.sessions() == []


def test_a_broken_policy_denies(env):
    home, target, backend = env
    set_policy(home, {})
    (home / "policy.json").write_text("{not json")
    with pytest.raises(Denied, match="policy"):
        broker().open(str(target), loose(backend))


def test_covered_unasked_is_jailed_and_offline_and_recorded(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    if backend == "fuse":
        with pytest.raises(OverlordError, match="kernel"):   # a jail it cannot give: refused
            broker().open(str(target))
        return
    r = broker("claude\x1b[2J").open(str(target))
    meta = ops.get_session(r.sid).meta
    assert meta["grants"]["jail"] is True and meta["grants"]["net"] == "none"
    assert meta["broker"] == {"face": "mcp", "client": "claude\x1b[2J"}
    opened = [json.loads(line) for line in audit_lines(home) if '"session.open"' in line]
    assert opened[-1]["broker"] == {"face": "mcp", "client": "claude\x1b[2J"}
    assert r.state == "pending"


@pytest.mark.parametrize("rule, asked, words", [
    ({"jail": True}, {"jail": False}, "forces jail: true"),
    ({"net": "none"}, {"net": "host"}, "allows at most net: none"),
    ({"timeout": 30}, {"timeout": 31}, "caps timeout at 30 s"),
    ({"limits": {"pids": 64}}, {"limits": {"pids": 0}}, "caps limits.pids at 64"),
    ({"limits": {"pids": 64}}, {"limits": {"pids": 65}}, "caps limits.pids at 64"),
])
def test_a_looser_request_is_refused_naming_the_rule(env, rule, asked, words):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): rule}})
    before = untouched(home, target)
    with pytest.raises(Denied) as exc:
        broker().open(str(target), asked)
    assert words in str(exc.value) and f"targets[{target}]" in str(exc.value)
    assert untouched(home, target) == before


@pytest.mark.parametrize("grants, words", [
    ("jail", "grants must be an object"),
    ({"root": True}, "unknown key"),
    ({"jail": "yes"}, "wrong type"),
    ({"net": "lan"}, "net must be one of"),
])
def test_ill_typed_grants_are_a_usage_error(env, grants, words):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    with pytest.raises(UsageError, match=words):
        broker().open(str(target), grants)
    assert ops.sessions() == []


@pytest.mark.parametrize("sid", ["../../etc", "a/b", "..", "", 7, None])
def test_a_bad_session_id_is_refused(env, sid):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    with pytest.raises(OverlordError):
        broker().exec(sid, ["true"])


def person_session(target):
    """A session a person opened at the terminal: unjailed, on the host's network."""
    return ops.run(["sh", "-c", "echo p > person.txt"], target=str(target),
                   grants={"jail": False, "net": "host"}).sid


def test_open_loose_then_exec_after_policy_tightens_is_refused(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker().open(str(target), {"jail": False, "net": "host"}).sid
    set_policy(home, {"targets": {str(target): {"net": "none"}}})
    before = untouched(home, target)
    with pytest.raises(Denied, match="allows at most net: none"):
        broker().exec(sid, ["sh", "-c", "echo x > leak.txt"])
    assert untouched(home, target) == before
    assert ops.diff(sid) == []


def test_exec_in_a_persons_session_on_an_uncovered_folder_is_refused(env):
    home, target, _ = env
    sid = person_session(target)
    with pytest.raises(Denied, match="no target covering"):
        broker().exec(sid, ["sh", "-c", "echo x > more.txt"])
    with pytest.raises(Denied):
        broker().tool(sid, "write_file", {"path": "more.txt", "content": "x"})
    with pytest.raises(Denied):
        broker().fork(sid, 0)
    with pytest.raises(Denied):
        broker().rollback(sid)
    assert [c.path for c in ops.diff(sid)] == ["person.txt"]


def test_exec_timeout_over_the_cap_is_refused(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {"timeout": 30}}})
    sid = broker().open(str(target), loose(backend)).sid
    with pytest.raises(Denied, match="caps timeout at 30 s"):
        broker().exec(sid, ["true"], timeout=31)
    assert broker().exec(sid, ["true"], timeout=5).exit_code == 0


def test_fork_under_a_tightened_policy_is_refused(env):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker().open(str(target), {"jail": False, "net": "host"}).sid
    broker().exec(sid, ["sh", "-c", "echo a > a.txt"])
    set_policy(home, {"targets": {str(target): {"jail": True}}})
    with pytest.raises(Denied, match="forces jail: true"):
        broker().fork(sid, 0)
    assert len(ops.sessions()) == 1


def test_commit_flags_are_held_to_policy(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {"allow_force": False, "require_review": True}}})
    sid = broker().open(str(target), loose(backend)).sid
    broker().exec(sid, ["sh", "-c", "echo a > a.txt"])
    before = tree(target)
    with pytest.raises(OverlordError, match="force"):
        broker().commit(sid, force=True)
    with pytest.raises(OverlordError, match="review|approv"):
        broker().commit(sid)
    with pytest.raises(TypeError):
        broker().commit(sid, allow_privileged=True)        # not a brokered caller's flag
    assert tree(target) == before
    set_policy(home, {"targets": {str(target): {}}})
    assert broker().commit(sid).changes
    assert (target / "a.txt").read_text() == "a\n"


def test_revert_of_an_uncovered_folder_is_refused(env):
    home, target, _ = env
    sid = person_session(target)
    ops.commit(sid)
    with pytest.raises(Denied, match="no target covering"):
        broker().revert(sid)
    assert (target / "person.txt").exists()


def test_agent_person_flags_and_looser_jail_are_refused(env):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {"jail": True}}})
    with pytest.raises(Denied, match="trace"):
        broker().agent("task", str(target), trace="strace")
    with pytest.raises(Denied, match="forces jail: true"):
        broker().agent("task", str(target), jail=False)
    assert ops.sessions() == []


def test_request_review_marks_the_session_and_the_chain(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker("harness").open(str(target), loose(backend)).sid
    got = broker("harness").request_review(sid)
    assert got["needs_review"]["face"] == "mcp" and got["needs_review"]["client"] == "harness"
    assert ops.get_session(sid).meta["needs_review"]["client"] == "harness"
    acts = [json.loads(line) for line in audit_lines(home)]
    assert acts[-1]["action"] == "session.needs_review" and acts[-1]["sid"] == sid
    ops.rollback(sid)
    with pytest.raises(OverlordError, match="nothing to review"):
        broker().request_review(sid)


def test_a_tool_call_is_attributed_to_the_client(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker("my-client").open(str(target), loose(backend)).sid
    out = broker("my-client").tool(sid, "write_file", {"path": "n.txt", "content": "N\n"},
                                   call=("write_file", 41))
    assert not out.is_error and out.layer == 0
    from overlord.text import cause_text, jsonable
    causes = [sp["cause"] for sp in jsonable(ops.savepoints(sid))]
    assert causes == [{"kind": "mcp", "tool": "write_file", "call": "41", "client": "my-client",
                       "summary": "write_file(n.txt)"}]
    assert cause_text(causes[0]) == "mcp my-client write_file 41: write_file(n.txt)"
    with pytest.raises(UsageError, match="unknown tool"):
        broker().tool(sid, "shell", {"command": "id"})
    with pytest.raises(UsageError):
        broker().tool(sid, "read_file", {"path": 3})


def test_a_persons_session_is_theirs_to_change_a_harness_may_only_look(env):
    """A harness that learns the id of a person's pending session (a "still pending" refusal
    names it) may read it, never run in, rewind, roll back, review or commit it."""
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = person_session(target)
    assert [c.path for c in broker().diff(sid)] == ["person.txt"]
    assert broker().savepoints(sid) and broker().log(sid)
    before = untouched(home, target)
    for act in (lambda: broker().exec(sid, ["sh", "-c", "echo x > x.txt"]),
                lambda: broker().tool(sid, "write_file", {"path": "x.txt", "content": "x"}),
                lambda: broker().rewind(sid, 0), lambda: broker().rollback(sid),
                lambda: broker().fork(sid, 0), lambda: broker().commit(sid),
                lambda: broker().request_review(sid), lambda: broker().resume(sid, "go on")):
        with pytest.raises(Denied, match="opened by a person"):
            act()
    assert untouched(home, target) == before
    assert ops.get_session(sid).meta["state"] == "pending"
