"""Red team of the broker (issue 12 item 2): a hostile harness whose every argument arrives as
JSON of any type tries to get a looser scope than policy grants, or to act on what no `targets`
rule covers, through ops.Broker -- the one facade the daemon, the MCP server and the hook share.

In-process like test/daemon/test_broker.py, on both backends. Each test proves one attack is
refused with nothing changed (or, for the held ones, that the broker already held).
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, Ovl, require_tool, tree
from overlord import ops
from overlord.errors import Denied, OverlordError, UsageError
from overlord.ops import execute

sys.path.insert(0, os.path.join(REPO, "test", "daemon"))
from test_broker import env, loose, set_policy  # noqa: E402,F401 - env is a fixture

NAN, INF = float("nan"), float("inf")


def broker(client="red-team"):
    return ops.Broker(ops.Caller("daemon", client=client))


def records(home):
    """What a refusal must leave as it was: the sessions and the audit chain."""
    sessions = home / "sessions"
    chain = home / "audit.jsonl"
    return (sorted(os.listdir(sessions)) if sessions.exists() else [],
            chain.read_text() if chain.exists() else "")


def person_session(target, script="echo p > person.txt", **kw):
    """A session a person opened at the terminal: unjailed, on the host's network."""
    return ops.run(["sh", "-c", script], target=str(target),
                   grants={"jail": False, "net": "host"}, **kw).sid


# -- grants of odd types and values ------------------------------------------------------------

@pytest.mark.parametrize("timeout", [NAN, 10 ** 400, INF, -INF, 1e300])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_refused(env, timeout):
    """NaN compares false with everything, so `NaN > cap` let it past a timeout cap; the
    command then crashed the launcher with a half-made session left `running`."""
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {"timeout": 30}}})
    before = records(home)
    with pytest.raises((UsageError, Denied), match="timeout"):
        broker().open(str(target), dict(loose(backend) or {}, timeout=timeout))
    assert records(home) == before


@pytest.mark.parametrize("timeout", [NAN, INF, 10 ** 400])
def test_an_exec_timeout_that_is_not_finite_is_refused(env, timeout):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker().open(str(target), loose(backend)).sid
    before = records(home), tree(target)
    with pytest.raises(UsageError, match="timeout"):
        broker().exec(sid, ["sh", "-c", "echo x > x.txt"], timeout=timeout)
    assert (records(home), tree(target)) == before
    assert ops.diff(sid) == []


@pytest.mark.parametrize("bad", [
    {"net": ["none"]}, {"jail": 1}, {"jail": 1.0}, {"limits": {"pids": 1.5}},
    {"limits": {"pids": -1}}, {"limits": {"pids": True}}, {"limits": {"pids": {"max": 1}}},
    {"limits": {"root": 1}}, {"timeout": "30"}, {"timeout": True}, {"merge_base": "yes"},
    {"trace": "strace"}, {"allow_privileged": True}, {"broker": {"face": "person"}},
])
def test_grants_of_the_wrong_shape_are_refused_before_anything_opens(env, bad):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {"limits": {"pids": 64}}}})
    before = records(home)
    with pytest.raises(UsageError):
        broker().open(str(target), bad)
    assert records(home) == before


@pytest.mark.parametrize("limits", [{"pids": 5_000_000}, {"pids": 2 ** 63}, {"memory_mb": 10 ** 30}])
def test_a_limit_the_kernel_refuses_is_refused_before_a_session_opens(env, limits):
    """No ceiling caps it, but the cgroup refuses it (EINVAL, ERANGE): that crashed the first
    command and left a half-made session `running`, blocking every later open."""
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    before = records(home)
    with pytest.raises(UsageError, match="limits"):
        broker().open(str(target), dict(loose(backend) or {}, limits=limits))
    assert records(home) == before
    assert broker().open(str(target), loose(backend)).state == "pending"


def test_a_nan_timeout_in_the_policy_file_refuses_rather_than_capping_nothing(env):
    """json.loads takes NaN: a NaN cap compared false with every request and capped nothing."""
    home, target, backend = env
    (home / "policy.json").write_text('{"targets": {"%s": {"timeout": NaN}}}' % target)
    os.chmod(home / "policy.json", 0o600)
    with pytest.raises(Denied, match="timeout"):
        broker().open(str(target), dict(loose(backend) or {}, timeout=10 ** 6))
    assert ops.sessions() == []


BAD_CALLS = [5, "ab", ("exec",), ("exec", 1, 2), {"a": 1, "b": 2}, ("exec", ["x"]), (None, 1)]
BAD_CAPS = ["big", -1, 1.5, True, None]


@pytest.mark.parametrize("kw", [{"call": c} for c in BAD_CALLS] + [{"cap": c} for c in BAD_CAPS])
def test_exec_arguments_of_the_wrong_shape_are_a_usage_error(env, kw):
    """A call id was unpacked unchecked (a traceback, or a str or dict taken apart); a str cap
    killed the reader threads, and the command then blocked on a full pipe."""
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker().open(str(target), loose(backend)).sid
    name = next(iter(kw))
    with pytest.raises(UsageError, match=name):
        broker().capture(sid, ["true"], **kw)
    if name == "call":
        with pytest.raises(UsageError, match="call"):
            broker().tool(sid, "list_dir", {"path": "."}, call=kw["call"])
    assert ops.savepoints(sid) == []


# -- targets: symlinks, `..`, prefixes, OVERLORD_HOME, a swap between check and use -----------

def test_targets_are_matched_by_the_folder_they_resolve_to(env, tmp_path):
    home, target, backend = env
    app, apple, secret = tmp_path / "app", tmp_path / "apple", tmp_path / "secret"
    for d in (app, apple, secret):
        d.mkdir()
    (app / "out").symlink_to(secret)              # a symlink in a covered folder leading out
    (secret / "in").symlink_to(app)               # one outside leading in
    set_policy(home, {"targets": {str(app): {}}})
    for name in (apple, app / "out", app / ".." / "secret", f"{app}/../apple"):
        with pytest.raises(Denied, match="no target covering"):
            broker().open(str(name), loose(backend))
    assert ops.sessions() == []
    r = broker().open(str(secret / "in"), loose(backend))
    assert ops.get_session(r.sid).meta["target"] == str(app)


def test_a_target_overlapping_overlord_home_is_refused(env, tmp_path):
    home, target, backend = env
    set_policy(home, {"targets": {"/": {}}})
    (home / "inside").mkdir()
    for name in (home, home / "inside", tmp_path):
        with pytest.raises(UsageError, match="OVERLORD_HOME"):
            broker().open(str(name), loose(backend))
    assert ops.sessions() == []


def test_a_symlink_swapped_between_the_check_and_the_open_is_refused(env, tmp_path, monkeypatch):
    """Broker._admit resolves and checks the target, then execute.run resolves it again: a
    component turned into a symlink in between must not open a session on the folder it leads
    to (here one no rule covers), under the grants the covered rule gave."""
    home, target, backend = env
    covered, secret = tmp_path / "covered", tmp_path / "secret"
    (covered / "proj").mkdir(parents=True)
    secret.mkdir()
    (secret / "key.txt").write_text("secret\n")
    set_policy(home, {"targets": {str(covered): {}}})
    real_run = execute.run

    def swapped(*args, **kw):
        os.rename(covered / "proj", covered / "proj.old")
        (covered / "proj").symlink_to(secret)
        return real_run(*args, **kw)
    monkeypatch.setattr(execute, "run", swapped)
    with pytest.raises(OverlordError, match="changed"):
        broker().run(str(covered / "proj"), ["cat", "key.txt"], loose(backend))
    assert [s for s in ops.sessions() if s["target"] == str(secret)] == []


# -- the policy's `default` with `targets` -----------------------------------------------------

def test_the_default_rule_still_binds_a_covered_target(env):
    home, target, backend = env
    set_policy(home, {"default": {"timeout": 5, "net": "host"}, "targets": {str(target): {}}})
    with pytest.raises(Denied, match=r"policy default caps timeout at 5 s"):
        broker().open(str(target), dict(loose(backend) or {}, timeout=6))
    if backend == "kernel":
        grants = ops.get_session(broker().open(str(target)).sid).meta["grants"]
        assert grants["jail"] is True and grants["net"] == "none" and grants["timeout"] == 5


# -- sessions a person opened, traced, reverted, forked ----------------------------------------

def test_exec_into_a_session_the_rule_now_refuses_is_refused(env):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker().open(str(target), {"jail": False, "net": "host"}).sid
    set_policy(home, {"targets": {str(target): {"jail": True}}})
    before = records(home), tree(target)
    for act in (lambda: broker().exec(sid, ["sh", "-c", "echo x > x.txt"]),
                lambda: broker().tool(sid, "write_file", {"path": "x.txt", "content": "x"}),
                lambda: broker().fork(sid, 0)):
        with pytest.raises(Denied, match="forces jail: true"):
            act()
    assert (records(home), tree(target)) == before


def test_a_traced_persons_session_runs_nothing_for_a_harness(env):
    """`--trace strace` loosens the session's seccomp filter to allow ptrace: the broker never
    grants trace, so it may not run a command (or fork a session) under one a person traced."""
    require_tool("strace")
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = person_session(target, trace="strace")
    before = records(home), tree(target)
    for act in (lambda: broker().exec(sid, ["true"]),
                lambda: broker().capture(sid, ["true"]),
                lambda: broker().tool(sid, "list_dir", {"path": "."}),
                lambda: broker().fork(sid, 0)):
        with pytest.raises(Denied, match="trace|opened by a person"):
            act()
    assert (records(home), tree(target)) == before


def test_a_brokered_revert_is_held_to_the_broker_rules(env):
    """ops.revert opens its session with no grants at all (unjailed, on the host network) and
    no record of who asked; through the broker it gets the broker's unasked grants."""
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    done = person_session(target)
    ops.commit(done)
    if backend == "fuse":
        with pytest.raises(OverlordError, match="kernel"):
            broker().revert(done)
        sid = broker("reverter").revert(done, grants={"jail": False, "net": "host"})
    else:
        sid = broker("reverter").revert(done)
    meta = ops.get_session(sid).meta
    assert meta["broker"] == {"face": "daemon", "client": "reverter"}
    assert meta["policy"]["source"] == f"targets[{target}]"
    if backend == "kernel":
        assert meta["grants"]["jail"] is True and meta["grants"]["net"] == "none"
    set_policy(home, {"targets": {str(target): {"net": "none"}}})
    if backend == "kernel":
        assert broker().exec(sid, ["true"]).exit_code == 0


def test_a_brokered_revert_refuses_grants_looser_than_the_rule(env):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    done = person_session(target)
    ops.commit(done)
    set_policy(home, {"targets": {str(target): {"net": "none"}}})
    before = records(home)
    with pytest.raises(Denied, match="allows at most net: none"):
        broker().revert(done, grants={"net": "host"})
    assert records(home) == before


def test_a_fork_records_who_asked_for_it(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    with pytest.raises(Denied, match="opened by a person"):     # a person's: theirs to fork
        broker("forker").fork(person_session(target), 0)
    theirs = broker("first").open(str(target), dict(loose(backend) or {}), stack=True).sid
    broker("first").exec(theirs, ["sh", "-c", "echo f > f.txt"])
    again = broker("second").fork(theirs, 0)
    assert ops.get_session(again).meta["broker"]["client"] == "second"


# -- looking at what no rule covers ------------------------------------------------------------

def test_looking_at_a_session_no_rule_covers_is_denied(env):
    """Every act on an existing session re-checks coverage: reading one counts too (its
    changes, their contents in the gate's findings, its provenance)."""
    home, target, _ = env
    sid = person_session(target, "echo AKIAIOSFODNN7EXAMPLE > key.txt")
    other = person_session(target, "echo q > q.txt", stack=True)
    looks = {"diff": lambda: broker().diff(sid), "log": lambda: broker().log(sid),
             "savepoints": lambda: broker().savepoints(sid),
             "check": lambda: broker().check(sid), "compare": lambda: broker().compare(sid, other),
             "blame": lambda: broker().blame(str(target / "hello.txt")),
             "request_review": lambda: broker().request_review(sid)}
    for name, look in looks.items():
        with pytest.raises(Denied, match="no target covering"):
            look()
    set_policy(home, {"targets": {str(target): {}}})
    assert [c.path for c in broker().diff(sid)] == ["key.txt"]
    assert len(broker().savepoints(sid)) == 1


def test_sessions_lists_only_what_a_rule_covers(env, tmp_path):
    """A person's sessions elsewhere (their targets, their command lines) are not listed."""
    home, target, _ = env
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mine = person_session(target)
    person_session(elsewhere, "echo TOKEN=s3cr3t > .env")
    set_policy(home, {"targets": {str(target): {}}})
    assert [m["sid"] for m in broker().sessions()] == [mine]
    assert len(ops.sessions()) == 2
    (home / "policy.json").write_text("{broken")
    with pytest.raises(Denied, match="policy"):
        broker().sessions()


# -- the reviewer, the agent's endpoint --------------------------------------------------------

def approving_script(tmp_path):
    path = tmp_path / "approve.json"
    path.write_text(json.dumps({"model": "rubber-stamp", "turns": [
        {"tool_calls": [{"name": "approve", "input": {"reason": "fine"}}]}]}))
    return str(path)


def test_a_harness_cannot_pick_the_reviewer_that_countersigns_its_commit(env, tmp_path):
    """require_review wants a second model's approval; a reviewer the harness scripts (or a
    base_url it serves) is its own approval. Refused, nothing recorded, the commit refused."""
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {"require_review": True}}})
    sid = broker().open(str(target), loose(backend)).sid
    broker().exec(sid, ["sh", "-c", "echo a > a.txt"])
    before = records(home), tree(target)
    for kw in ({"provider": "scripted", "script": approving_script(tmp_path)},
               {"provider": "openai-compatible", "model": "m", "base_url": "http://127.0.0.1:9"}):
        with pytest.raises(Denied, match="reviewer"):
            broker().review(sid, **kw)
    assert (records(home), tree(target)) == before
    assert not ops.get_session(sid).meta.get("reviews")
    with pytest.raises(OverlordError, match="review"):
        broker().commit(sid)
    assert tree(target) == before[1]


def test_a_harness_cannot_send_a_stored_key_to_a_base_url_of_its_choosing(env, monkeypatch):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-the-persons-key")
    before = records(home)
    with pytest.raises(Denied, match="base_url"):
        broker().models(provider="anthropic", base_url="http://127.0.0.1:9")
    with pytest.raises(Denied, match="base_url"):
        broker().agent("task", str(target), provider="anthropic", model="m",
                       base_url="http://127.0.0.1:9", **(loose(backend) or {}))
    assert records(home) == before


def test_a_harness_resume_never_sends_a_key_stored_since_to_its_base_url(env, monkeypatch):
    """A harness's agent session on a keyless endpoint of its own (allowed: no key to send);
    once the person stores a key for that provider, resuming it would send the key there."""
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    for name, value in (("OVERLORD_RETRY_SCALE", "0"), ("OVERLORD_PROVIDER_RETRIES", "0"),
                        ("OPENAI_COMPAT_API_KEY", ""), ("no_proxy", "*")):
        monkeypatch.setenv(name, value)
    sid = broker().agent("task", str(target), provider="openai-compatible", model="m",
                         base_url="http://127.0.0.1:9/v1", **(loose(backend) or {})).sid
    monkeypatch.setenv("OPENAI_COMPAT_API_KEY", "the-persons-key")
    before = records(home)
    with pytest.raises(Denied, match="base_url"):
        broker().resume(sid, "go on")
    assert records(home) == before


def test_agent_flags_only_a_person_may_pass_are_refused(env, tmp_path):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    script = approving_script(tmp_path)
    before = records(home)
    for kw in ({"trace": "strace"}, {"trace": "ebpf"}):
        with pytest.raises(Denied):
            broker().agent("t", str(target), provider="scripted", script=script, **kw)
    for kw in ({"broker": {"face": "person"}}, {"pty_slave": 0}, {"on_child": print},
               {"allow_privileged": True}):
        with pytest.raises((Denied, TypeError)):
            broker().agent("t", str(target), provider="scripted", script=script, **kw)
    assert records(home) == before


def test_resume_after_the_policy_tightened_is_refused(env, tmp_path):
    home, target, _ = env
    set_policy(home, {"targets": {str(target): {}}})
    script = tmp_path / "agent.json"
    script.write_text(json.dumps({"model": "m", "turns": [{"text": "done"}]}))
    sid = broker().agent("task", str(target), provider="scripted", script=str(script),
                         jail=False, net="host").sid
    set_policy(home, {"targets": {str(target): {"jail": True}}})
    before = records(home)
    with pytest.raises(Denied, match="forces jail: true"):
        broker().resume(sid, "more")
    assert records(home) == before


# -- commit flags ------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [
    {}, {"force": True}, {"merge": True}, {"countersigned": True}, {"force": True, "merge": True},
    {"only": ["layer:0"]}, {"drop": ["layer:1"]}, {"only": ["layer:0"], "force": True},
])
def test_no_combination_of_commit_flags_passes_require_review(env, flags):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {"require_review": True, "allow_force": False}}})
    sid = broker().open(str(target), loose(backend)).sid
    broker().exec(sid, ["sh", "-c", "echo a > a.txt"])
    broker().exec(sid, ["sh", "-c", "echo b > b.txt"])
    before = tree(target)
    with pytest.raises(OverlordError):
        broker().commit(sid, **flags)
    assert tree(target) == before and ops.get_session(sid).meta["state"] == "pending"


@pytest.mark.parametrize("flags", [{"force": 1}, {"merge": "true"}, {"only": "layer:0"},
                                   {"drop": [0]}, {"countersigned": None}])
def test_commit_flags_of_the_wrong_type_are_a_usage_error(env, flags):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker().open(str(target), loose(backend)).sid
    broker().exec(sid, ["sh", "-c", "echo a > a.txt"])
    with pytest.raises(UsageError):
        broker().commit(sid, **flags)
    assert not (target / "a.txt").exists()


# -- the tool op -------------------------------------------------------------------------------

def test_tools_stay_inside_the_project_root(env, tmp_path):
    home, target, backend = env
    outside = tmp_path / "outside.txt"
    outside.write_text("SECRET-OUTSIDE\n")
    set_policy(home, {"targets": {str(target): {}}})
    sid = broker().open(str(target), loose(backend)).sid
    broker().exec(sid, ["ln", "-s", str(outside), "link"])
    broker().exec(sid, ["ln", "-s", str(tmp_path), "dirlink"])
    b = broker()
    for name, args in (("read_file", {"path": "../outside.txt"}),
                       ("read_file", {"path": str(outside)}),
                       ("read_file", {"path": "link"}),
                       ("write_file", {"path": "link", "content": "pwned\n"}),
                       ("write_file", {"path": "dirlink/new.txt", "content": "pwned\n"}),
                       ("edit_file", {"path": "link", "old": "SECRET", "new": "pwned"}),
                       ("list_dir", {"path": "dirlink"}),
                       ("search", {"pattern": "SECRET", "path": "dirlink"})):
        out = b.tool(sid, name, args)
        assert out.is_error and "SECRET" not in out.content, (name, args, out)
    assert outside.read_text() == "SECRET-OUTSIDE\n" and not (tmp_path / "new.txt").exists()


# -- who asked, and what reaches a terminal ----------------------------------------------------

def test_a_client_name_must_be_text():
    for client in (5, ["x"], {"n": 1}, b"bytes"):
        with pytest.raises(UsageError):
            ops.Caller("mcp", client=client)
    with pytest.raises((UsageError, ValueError)):
        ops.Caller("person")


def test_a_hostile_client_name_and_call_reach_the_cli_escaped(env):
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    evil = "harness\x1b]0;owned\x07\nsession 99999999-000000-abcdef pending"
    b = ops.Broker(ops.Caller("mcp", client=evil))
    sid = b.open(str(target), loose(backend)).sid
    b.exec(sid, ["sh", "-c", "echo a > a.txt\n\x1b[2J"], call=("exec\x1b[31m\n", "1\x07"))
    b.tool(sid, "write_file", {"path": "b\x1b[2J.txt", "content": "b"}, call=("write_file\n", 2))
    b.request_review(sid)
    ovl = Ovl(home, backend)
    for args in (("log", sid), ("savepoints", sid), ("sessions",), ("diff", sid),
                 ("audit", "show")):
        proc = ovl(*args, check=0)
        for ch in ("\x1b", "\x07"):
            assert ch not in proc.out and ch not in proc.err, (args, proc.out)
        assert "99999999-000000-abcdef pending" not in [
            line.partition("session ")[2] for line in proc.out.splitlines()], (args, proc.out)


def test_through_the_launcher_the_session_records_who_asked(env):
    """A threaded face runs every open through ops.launcher: the broker's record and the
    pending state must travel with it (an open changes nothing, yet stays open)."""
    home, target, backend = env
    set_policy(home, {"targets": {str(target): {}}})
    code = (
        "import json, sys\n"
        "from overlord import ops\n"
        "from overlord.ops import launcher\n"
        "with launcher.serving():\n"
        "    b = ops.Broker(ops.Caller('mcp', client='via-launcher'))\n"
        "    r = b.open(sys.argv[1], {'jail': False, 'net': 'host'})\n"
        "    e = b.capture(r.sid, ['sh', '-c', 'echo hi; echo x > x.txt'])\n"
        "print(json.dumps([r.state, ops.get_session(r.sid).meta.get('broker'),\n"
        "                  e.stdout.decode(), e.layer]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True,
                          text=True, env=dict(os.environ, OVERLORD_HOME=str(home),
                                              OVERLORD_TEST_BACKEND=backend, PYTHONPATH=REPO),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["pending", {"face": "mcp", "client": "via-launcher"},
                                       "hi\n", 0]
