"""Policy: OVERLORD_HOME/policy.json parsed and validated (one line naming the problem, exit 1),
resolved per folder (longest containing target, on path components, key by key), shown and
checked by the CLI, capping run/exec/agent grants (a looser request refused naming the rule,
an omitted value taking the policy's), and every real change on the audit chain once."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SESSION_RE, Ovl, require_backend, tree

sys.path.insert(0, os.path.join(REPO, "test", "agent"))
from agentlib import AgentOvl, write_script  # noqa: E402

from overlord.errors import OverlordError  # noqa: E402
from overlord.trust import policy as P  # noqa: E402

DONE = [{"text": "nothing to do", "stop_reason": "end_turn"}]


@pytest.fixture
def cli(home):
    return Ovl(home)


def put(home, data):
    path = home / "policy.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def audit_lines(home, action=None):
    path = home / "audit.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [x for x in lines if action is None or x["action"] == action]


def sessions(home):
    d = home / "sessions"
    return sorted(os.listdir(d)) if d.exists() else []


def one_line_refusal(proc, says):
    assert proc.returncode == 1, (proc.returncode, proc.out, proc.err)
    assert proc.err.startswith("overlord: ") and proc.err.count("\n") == 1, proc.err
    assert says in proc.err, proc.err
    assert "Traceback" not in proc.err


# -- parsing and validation ---------------------------------------------------------------------

BROKEN = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"default": {}, "rules": {}}', "unknown key 'rules' (known: default, targets)"),
    ('{"default": {"jial": true}}', "default: unknown key 'jial' (known: jail, net,"),
    ('{"default": {"jail": "yes"}}', "default.jail must be true or false, not 'yes'"),
    ('{"default": {"net": "lan"}}', 'default.net must be one of "none", "proxy", "host"'),
    ('{"default": {"timeout": 0}}', "default.timeout must be a number of seconds > 0"),
    ('{"default": {"timeout": true}}', "default.timeout must be a number of seconds > 0"),
    ('{"default": {"limits": {"memory_mb": -1}}}', "default.limits.memory_mb must be a whole number >= 0"),
    ('{"default": {"limits": {"ram": 5}}}', "default.limits: unknown limit 'ram'"),
    ('{"default": {"allow_force": 0}}', "default.allow_force must be true or false"),
    ('{"default": {"protect": "src/**"}}', "default.protect must be a list of glob strings"),
    ('{"default": {"protect": ["/etc/**"]}}', "default.protect must hold globs relative to the target"),
    ('{"default": {"checks": {"secrets": "deny"}}}', "default.checks.secrets must be one of block"),
    ('{"default": {"checks": {"viruses": "block"}}}', "default.checks: unknown check 'viruses'"),
    ('{"default": {"checks": {"size_mb": "big"}}}', "default.checks.size_mb must be a number"),
    ('{"default": []}', "default must be an object of rule keys"),
    ('{"targets": ["/srv"]}', "targets must be an object"),
    ('{"targets": {"srv/app": {}}}', "targets: 'srv/app' is not an absolute path"),
    ('{"targets": {"/srv/app": {"net": 1}}}', "targets[/srv/app].net must be one of"),
    ('{"targets": {"/srv/app": {}, "/srv/app/": {}}}', "targets: '/srv/app' and '/srv/app/' name the same folder"),
    ('{"default": {}, "default": {"jail": true}}', "the key 'default' appears twice"),
    (b'{"default": {"protect": ["\xff"]}}', "not UTF-8"),
]


@pytest.mark.parametrize("text,says", BROKEN, ids=[s for _, s in BROKEN])
def test_policy_check_names_each_problem_in_one_line(cli, tmp_path, text, says):
    path = tmp_path / "p.json"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    proc = cli("policy", "check", path)
    one_line_refusal(proc, f"policy {path}: {says}")
    assert not (cli.home / "audit.jsonl").exists(), "checking another file records nothing"


def test_check_of_a_good_file_and_of_the_live_one(cli, home, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"default": {"jail": True}, "targets": {"/srv": {"net": "none"}}}))
    proc = cli("policy", "check", path, check=0)
    assert proc.out == f"ok  {path}  (1 target)\n"
    data = json.loads(cli("policy", "check", path, "--json", check=0).out)
    assert data["ok"] is True and data["targets"] == ["/srv"] and len(data["sha256"]) == 64
    assert cli("policy", "check", check=0).out == f"ok  {home / 'policy.json'}  (no file: built-in values)\n"
    put(home, '{"default": {"timeout": "soon"}}')
    one_line_refusal(cli("policy", "check"), "default.timeout must be a number of seconds > 0")
    assert cli("policy", "check", tmp_path / "missing.json").returncode == 2


def test_unreadable_policy_is_refused(cli, home):
    (home / "policy.json").mkdir()
    one_line_refusal(cli("policy", "show"), "policy.json: not a regular file")


# -- precedence ---------------------------------------------------------------------------------

def test_longest_prefix_on_components_and_per_key_sources(home, tmp_path):
    srv = tmp_path / "srv"
    for d in ("app/sub", "apple"):
        (srv / d).mkdir(parents=True)
    put(home, {"default": {"net": "none", "timeout": 60, "checks": {"secrets": "block"},
                           "limits": {"memory_mb": 1024}},
               "targets": {str(srv): {"jail": True, "timeout": 30},
                           str(srv / "app"): {"timeout": 10, "limits": {"pids": 64},
                                              "checks": {"binaries": "off"}}}})
    app, sub, apple = (str(srv / d) for d in ("app", "app/sub", "apple"))
    for folder in (app, sub):
        r = P.rule(folder)
        assert r["timeout"] == 10 and r.source("timeout") == f"targets[{app}]"
        assert r["jail"] is True and r.source("jail") == f"targets[{srv}]"        # the shorter target
        assert r["net"] == "none" and r.source("net") == "default"
        assert r["allow_force"] is True and r.source("allow_force") == "built-in"
        assert r["limits"] == {"memory_mb": 1024, "pids": 64}
        assert r.source("limits.pids") == f"targets[{app}]" and r.source("limits.memory_mb") == "default"
        assert r["checks"] == {"secrets": "block", "binaries": "off", "dependencies": "warn", "git_exec": "countersign", "size_mb": 50}
        assert r.source("checks.secrets") == "default" and r.source("checks.dependencies") == "built-in"
        assert r.source("checks") == f"targets[{app}]"
        assert r.chain == [f"targets[{app}]", f"targets[{srv}]", "default"]
    r = P.rule(apple)              # /srv/app is no prefix of /srv/apple
    assert r["timeout"] == 30 and r.source("timeout") == f"targets[{srv}]" and r["limits"] == {"memory_mb": 1024}
    r = P.rule(str(tmp_path))      # outside every target
    assert r["timeout"] == 60 and r.source("timeout") == "default" and r["jail"] is None
    assert r.origin() == {"source": "default", "sha256": r.sha256} and len(r.sha256) == 64


def test_a_target_named_through_a_symlink_still_covers(home, tmp_path):
    real = tmp_path / "data" / "app"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "data")
    put(home, {"targets": {str(tmp_path / "link" / "app"): {"jail": True}}})
    r = P.rule(str(real))
    assert r["jail"] is True and r.source("jail") == f"targets[{tmp_path / 'link' / 'app'}]"


def test_no_policy_file_is_the_built_in_rule(home, tmp_path):
    r = P.rule(str(tmp_path))
    assert r.as_dict() == {"jail": None, "net": None, "net_allow": None, "timeout": None, "limits": {},
                           "allow_force": True, "require_review": False, "protect": [],
                           "checks": {"secrets": "countersign", "binaries": "warn",
                                      "dependencies": "warn", "git_exec": "countersign", "size_mb": 50},
                           "connectors": None, "connector_shell": False, "distrust_hints": [], "skills": "*",
                           "budget": {}}
    assert {r.source(k) for k in P.KEYS} == {"built-in"} and r.origin()["sha256"] is None


def test_cap_grants_fills_omitted_values_with_the_tighter_one(home, tmp_path):
    put(home, {"default": {"jail": True, "net": "host", "timeout": 900,
                           "limits": {"memory_mb": 512, "pids": 100000, "nofile": 0}}})
    t = str(tmp_path)
    assert P.cap_grants(t, {}) == {"jail": True, "net": "host", "timeout": 900,
                                   "limits": {"memory_mb": 512, "pids": 512}}
    agent = {"jail": True, "net": "none", "timeout": 600}
    assert P.cap_grants(t, {}, agent) == {"jail": True, "net": "none", "timeout": 600,
                                          "limits": {"memory_mb": 512, "pids": 512}}
    asked = {"net": "none", "timeout": 5, "limits": {"memory_mb": 256, "nofile": 0}}
    assert P.cap_grants(t, asked) == {"jail": True, "net": "none", "timeout": 5,
                                      "limits": {"memory_mb": 256, "pids": 512, "nofile": 0}}
    for asked, says in [({"jail": False}, "policy default forces jail: true; this request asked for jail: false"),
                        ({"timeout": 901}, "policy default caps timeout at 900 s; this request asked for timeout: 901"),
                        ({"limits": {"memory_mb": 0}}, "policy default caps limits.memory_mb at 512; this request asked for "
                                                       "limits.memory_mb: 0 (unlimited)")]:
        with pytest.raises(OverlordError) as exc:
            P.cap_grants(t, asked)
        assert str(exc.value) == says


# -- the CLI: show ------------------------------------------------------------------------------

def test_policy_show_readable_and_json(cli, home, target):
    put(home, {"default": {"net": "none"}, "targets": {str(target): {"timeout": 30, "protect": ["sub/**"]}}})
    proc = cli("policy", "show", "-t", target, check=0)
    rows = {line.split()[0]: line.split()[1:] for line in proc.out.splitlines()[1:]}
    assert proc.out.startswith(f"policy for {target}: {home / 'policy.json'} (sha256 ")
    assert rows["timeout"] == ["30", f"targets[{target}]"]
    assert rows["net"] == ["none", "default"]
    assert rows["jail"] == ["-", "built-in"] and rows["limits"] == ["-", "built-in"]
    assert rows["protect"] == ['["sub/**"]', f"targets[{target}]"]
    assert rows["checks.secrets"] == ["countersign", "built-in"]
    data = json.loads(cli("policy", "show", "-t", target, "--json", check=0).out)
    assert data["target"] == str(target) and data["exists"] is True
    assert data["matched"] == [f"targets[{target}]", "default"]
    assert data["rule"]["timeout"] == 30 and data["rule"]["net"] == "none"
    assert data["sources"]["timeout"] == f"targets[{target}]" and data["sources"]["checks"]["size_mb"] == "built-in"
    # from inside the folder, -t defaults to it
    assert json.loads(cli("policy", "show", "--json", cwd=target / "sub", check=0).out)["target"] == str(target / "sub")
    assert cli("policy", "show", "-t", target / "nope").returncode == 2


# -- policy.change on the audit chain ------------------------------------------------------------

def test_policy_change_is_recorded_once_per_real_change(cli, home, target, tmp_path):
    cli("policy", "show", "-t", target, check=0)
    assert audit_lines(home, "policy.change") == []
    put(home, {"default": {"net": "none"}})
    procs = [subprocess.Popen([sys.executable, "-m", "overlord", "policy", "show", "-t", str(target)],
                              env=cli.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(8)]
    assert [p.wait(60) for p in procs] == [0] * 8
    changes = audit_lines(home, "policy.change")
    assert len(changes) == 1, changes
    first = changes[0]
    assert first["old_sha256"] is None and first["new_sha256"] == P.load().sha256
    assert oct((home / "policy.seen").stat().st_mode & 0o777) == "0o600"
    put(home, {"default": {"net": "none"}})                 # rewritten, same bytes: no change
    cli("policy", "show", "-t", target, check=0)
    assert len(audit_lines(home, "policy.change")) == 1
    put(home, "{broken")                                     # a broken file is a change too ...
    one_line_refusal(cli("policy", "show", "-t", target), "not valid JSON")
    one_line_refusal(cli("policy", "show", "-t", target), "not valid JSON")
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"default": {"jail": True}}))
    proc = cli("policy", "set", new, "--json", check=0)      # ... and set replaces it
    result = json.loads(proc.out)
    assert result["changed"] is True and result["file"] == str(home / "policy.json")
    assert (home / "policy.json").read_bytes() == new.read_bytes()
    assert oct((home / "policy.json").stat().st_mode & 0o777) == "0o600"
    changes = audit_lines(home, "policy.change")
    assert [c["via"] for c in changes] == ["noticed", "noticed", "policy set"]
    assert changes[1]["old_sha256"] == first["new_sha256"] and changes[2]["new_sha256"] == result["sha256"]
    assert changes[2]["old_sha256"] == changes[1]["new_sha256"]
    assert cli("policy", "set", new, check=0).out.startswith("unchanged ")
    (home / "policy.json").unlink()                          # removed: the last change
    cli("policy", "show", "-t", target, check=0)
    assert audit_lines(home, "policy.change")[-1]["new_sha256"] is None
    assert len(audit_lines(home, "policy.change")) == 4
    assert cli("audit", "verify", check=0)


def test_policy_set_refuses_a_broken_file_and_keeps_the_live_one(cli, home, tmp_path):
    live = put(home, {"default": {"jail": True}})
    before = live.read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_text('{"default": {"jail": 1}}')
    one_line_refusal(cli("policy", "set", bad), f"policy {bad}: default.jail must be true or false")
    assert live.read_bytes() == before
    assert [c["via"] for c in audit_lines(home, "policy.change")] == []


# -- run and exec: refused when looser, filled when omitted ---------------------------------------

RUN_POLICY = {"default": {"net": "none", "timeout": 30, "limits": {"memory_mb": 1024, "pids": 64}}}


@pytest.mark.parametrize("flags,says", [
    (["--net", "host"], "policy default allows at most net: none; this request asked for net: host"),
    (["--timeout", "60"], "policy default caps timeout at 30 s; this request asked for timeout: 60"),
    (["--limit", "memory_mb=2048"], "policy default caps limits.memory_mb at 1024; this request asked "
                                    "for limits.memory_mb: 2048"),
    (["--limit", "pids=0"], "policy default caps limits.pids at 64; this request asked for "
                            "limits.pids: 0 (unlimited)"),
])
def test_run_looser_than_policy_is_refused(cli, home, target, flags, says):
    put(home, RUN_POLICY)
    before = tree(target)
    one_line_refusal(cli("run", "-t", target, *flags, "--", "sh", "-c", "echo x > new.txt"), says)
    assert tree(target) == before and sessions(home) == []
    assert audit_lines(home, "session.open") == []


def test_run_under_a_manifest_asking_for_no_jail_is_refused(cli, home, target, tmp_path):
    put(home, {"targets": {str(target): {"jail": True}}})
    manifest = tmp_path / "m.json"
    manifest.write_text('{"jail": false}')
    one_line_refusal(cli("run", "-t", target, "--manifest", manifest, "--", "true"),
                     f"policy targets[{target}] forces jail: true; this request asked for jail: false")
    assert sessions(home) == []


def test_a_broken_policy_refuses_run_and_agent(cli, home, target, tmp_path):
    put(home, {"default": {"jail": True, "jial": 1}})
    before = tree(target)
    one_line_refusal(cli("run", "-t", target, "--", "sh", "-c", "echo x > f"),
                     f"policy {home / 'policy.json'}: default: unknown key 'jial'")
    agent = AgentOvl(home)
    _, proc = agent.agent(target, "task", "--provider", "scripted", "--script",
                          write_script(tmp_path, DONE))
    one_line_refusal(proc, "default: unknown key 'jial'")
    assert tree(target) == before and sessions(home) == []


def test_omitted_grants_take_the_policy_and_exec_is_capped(ovl, home, target):
    put(home, {"targets": {str(target): {"jail": True, "timeout": 20, "limits": {"pids": 100}}}})
    if ovl.backend != "kernel":        # the jail the policy forces needs the kernel: refused, never unjailed
        one_line_refusal(ovl("run", "-t", target, "--", "true"), "--jail needs the kernel backend")
        assert sessions(home) == []
        return
    sid, _ = ovl.run(target, "sh", "-c", "echo x > f")
    meta = json.loads((home / "sessions" / sid / "meta.json").read_text())
    assert meta["grants"]["jail"] is True and meta["grants"]["timeout"] == 20
    assert meta["grants"]["limits"] == {"pids": 100}
    rule = P.rule(str(target))
    assert meta["policy"] == {"source": f"targets[{target}]", "sha256": rule.sha256}
    opened = audit_lines(home, "session.open")[-1]
    assert opened["sid"] == sid and opened["policy"] == meta["policy"]
    assert opened["grants"]["jail"] is True
    one_line_refusal(ovl("exec", sid, "--timeout", "21", "--", "true"),
                     f"policy targets[{target}] caps timeout at 20 s; this request asked for timeout: 21")
    ovl("exec", sid, "--timeout", "5", "--", "true", check=0)


# -- the agent -----------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,says", [
    (["--no-jail"], "forces jail: true; this request asked for jail: false"),
    (["--net", "host"], "allows at most net: none; this request asked for net: host"),
    (["--timeout", "100"], "caps timeout at 10 s; this request asked for timeout: 100"),
    (["--limit", "memory_mb=0"], "caps limits.memory_mb at 256; this request asked for limits.memory_mb: 0"),
])
def test_agent_looser_than_policy_is_refused(home, target, tmp_path, flags, says):
    put(home, {"targets": {str(target): {"jail": True, "net": "none", "timeout": 10,
                                         "limits": {"memory_mb": 256}}}})
    agent = AgentOvl(home)
    _, proc = agent.agent(target, "task", "--provider", "scripted", "--script",
                          write_script(tmp_path, DONE), *flags)
    one_line_refusal(proc, f"policy targets[{target}] {says}")
    assert sessions(home) == [] and audit_lines(home, "session.open") == []


def test_agent_omitted_grants_take_the_tighter_of_its_defaults_and_policy(home, target, tmp_path):
    require_backend("kernel")
    put(home, {"default": {"net": "host", "timeout": 30, "limits": {"pids": 128}}})
    agent = AgentOvl(home, "kernel")
    sid, proc = agent.scripted(target, tmp_path, DONE, check=0)
    assert sid, proc.err
    grants = agent.meta(sid)["grants"]
    # the agent runs jailed and offline unless told otherwise: policy's "host" is only the loosest allowed
    assert grants["jail"] is True and grants["net"] == "none"
    assert grants["timeout"] == 30 and grants["limits"] == {"pids": 128}
    assert agent.meta(sid)["policy"]["source"] == "default"
    assert SESSION_RE.search(proc.out)


# -- the file itself: what may be taken for the policy --------------------------------------------

def test_a_fifo_or_an_oversized_file_is_refused_without_hanging(cli, home, tmp_path):
    live, other = home / "policy.json", tmp_path / "other.fifo"
    os.mkfifo(live)
    os.mkfifo(other)
    for args, path in ((("policy", "show"), live), (("policy", "check"), live),
                       (("policy", "check", live), live), (("policy", "check", other), other),
                       (("policy", "set", other), other)):
        proc = cli(*args, timeout=20)
        one_line_refusal(proc, f"policy {path}: not a regular file")
        assert proc.err == f"overlord: policy {path}: not a regular file\n"
    big = tmp_path / "big.json"
    big.write_text('{"default": {}}' + " " * P.MAX_BYTES)
    one_line_refusal(cli("policy", "check", big),
                     f"policy {big}: is {P.MAX_BYTES + 15} bytes, over the 1 MiB a policy may be")
    good = tmp_path / "good.json"
    good.write_text('{"default": {"require_review": true}}')
    cli("policy", "set", good, check=0)                 # replaces the FIFO
    assert live.is_file() and json.loads(cli("policy", "show", "--json", check=0).out)["rule"]["require_review"]


@pytest.mark.parametrize("how", ["group-writable", "other-writable", "symlink", "someone-else's"])
def test_a_policy_someone_else_can_write_governs_nothing(cli, home, target, tmp_path, how):
    live = put(home, {"default": {"require_review": True}})
    os.chmod(live, 0o644)
    cli("policy", "show", "-t", target, check=0)          # readable by others is fine
    if how == "someone-else's" and os.geteuid() != 0:
        os.chmod(live, 0o600)                            # only root can give a file away: ours
        cli("policy", "show", "-t", target, check=0)      # (and root's, below) are trusted
        return
    says = {"group-writable": f"is mode 0664: group/other may write it (chmod go-w {live})",
            "other-writable": f"is mode 0646: group/other may write it (chmod go-w {live})",
            "symlink": "is a symlink (`overlord policy set FILE` installs one of yours)",
            "someone-else's": "is owned by uid 65534, not by you (uid 0) or root "
                              "(`overlord policy set FILE` installs one of yours)"}[how]
    if how == "group-writable":
        os.chmod(live, 0o664)
    elif how == "other-writable":
        os.chmod(live, 0o646)
    elif how == "symlink":
        shared = tmp_path / "shared.json"
        shared.write_text(json.dumps({"default": {"require_review": False}}))
        live.unlink()
        live.symlink_to(shared)
    else:
        os.chown(live, 65534, 65534)
    before = tree(target)
    for args in (("policy", "show", "-t", target), ("policy", "check"),
                 ("run", "-t", target, "--", "sh", "-c", "echo x > f")):
        one_line_refusal(cli(*args), f"policy {live}: {says}")
    assert tree(target) == before and sessions(home) == []
    good = tmp_path / "good.json"
    good.write_text('{"default": {}}')
    cli("policy", "set", good, check=0)                 # the way out the refusal names
    assert not live.is_symlink() and oct(live.stat().st_mode & 0o777) == "0o600"
    assert live.stat().st_uid == os.geteuid()
    cli("policy", "show", "-t", target, check=0)
    if os.geteuid() == 0:
        os.chown(live, 0, 0)                            # root's own policy is trusted
        cli("policy", "show", "-t", target, check=0)


@pytest.mark.parametrize("depth", [900, 100000])
def test_a_deeply_nested_policy_is_refused_naming_the_file(cli, home, tmp_path, depth):
    deep = '{"default": {"jail": ' + "[" * depth + "]" * depth + "}}"
    other = tmp_path / "deep.json"
    for path in (home / "policy.json", other):
        path.write_text(deep)
    for args, path in ((("policy", "show"), home / "policy.json"), (("policy", "check", other), other),
                       (("policy", "set", other), other)):
        proc = cli(*args)
        one_line_refusal(proc, f"policy {path}: ")
        if depth > 1000:
            assert proc.err == f"overlord: policy {path}: nested too deeply\n"


# -- a session is held to the policy in force now, at every command ------------------------------

@pytest.mark.parametrize("rule,says", [
    ({"jail": True}, "forces jail: true; session {sid} was opened with jail: false"),
    ({"net": "none"}, "allows at most net: none; session {sid} was opened with net: host"),
    ({"timeout": 5}, "caps timeout at 5 s; session {sid} was opened with no timeout"),
    ({"limits": {"pids": 64}}, "caps limits.pids at 64; session {sid} was opened with limits.pids: 512"),
])
def test_exec_is_refused_when_todays_policy_is_tighter_than_the_sessions_grants(
        ovl, home, target, rule, says):
    sid, _ = ovl.sh(target, "echo 1 > one.txt")
    put(home, {"default": rule})
    layers = len(json.loads((home / "sessions" / sid / "meta.json").read_text())["layers"])
    one_line_refusal(ovl("exec", sid, "--", "sh", "-c", "echo 2 > two.txt"),
                     f"policy default {says.format(sid=sid)}; roll it back (or commit it) and "
                     "open a new one under today's policy")
    meta = json.loads((home / "sessions" / sid / "meta.json").read_text())
    assert len(meta["layers"]) == layers and ovl.diff(sid) == [("added", "one.txt")]
    assert audit_lines(home, "session.exec") == []
    if "timeout" in rule:         # this command's own --timeout bounds it within the cap
        one_line_refusal(ovl("exec", sid, "--timeout", "6", "--", "true"),
                         "policy default caps timeout at 5 s; this request asked for timeout: 6")
        ovl("exec", sid, "--timeout", "5", "--", "true", check=0)
    os.unlink(home / "policy.json")
    ovl("exec", sid, "--", "true", check=0)               # rolled back: it runs again


def test_a_session_opened_under_the_policy_keeps_running_under_it(ovl, home, target):
    put(home, {"default": {"timeout": 30, "limits": {"pids": 64, "nofile": 1024}}})
    sid, _ = ovl.sh(target, "echo 1 > one.txt")
    for i in range(2):
        ovl("exec", sid, "--", "sh", "-c", f"echo {i} > n{i}.txt", check=0)
    put(home, {"default": {"timeout": 30, "limits": {"pids": 65}}})      # looser: still fine
    ovl("exec", sid, "--", "true", check=0)


def test_resume_is_refused_when_todays_policy_is_tighter(home, target, tmp_path):
    require_backend("kernel")
    agent = AgentOvl(home, "kernel")
    sid, proc = agent.scripted(target, tmp_path, DONE, check=0)
    assert sid, proc.err
    events = len(agent.events(sid))
    put(home, {"default": {"limits": {"pids": 64}}})
    one_line_refusal(agent("resume", sid, "--note", "go on"),
                     f"policy default caps limits.pids at 64; session {sid} was opened with "
                     "limits.pids: 512")
    assert len(agent.events(sid)) == events, "nothing recorded for a refused resume"
