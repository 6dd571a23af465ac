"""`overlord hook claude-code` against Claude Code's documented PreToolUse shapes: the input
(session_id, transcript_path, cwd, permission_mode, hook_event_name, tool_name, tool_input,
tool_use_id) on stdin, the answer {"hookSpecificOutput": {"hookEventName": "PreToolUse",
"permissionDecision", "permissionDecisionReason", "updatedInput"}} on stdout with exit 0, and
exit 2 (a blocking error: the call is not run, stderr goes to the model) for what it cannot read.

The rewritten Bash command is run for real, by bash, from another directory and with a bare
environment: it runs inside the session (the real tree unchanged, `overlord diff` shows the
change), every part of it, whatever quoting, newlines or `; overlord commit` the model tries.
"""
import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import REPO, tree
from overlord import ops

STATE = "hook-claude-code.json"


def admit(home, target, backend, **rule):
    """Install a policy whose `targets` entry covers target (fuse: the host's network)."""
    if backend == "fuse":
        rule.setdefault("net", "host")
    path = home.parent / "policy-to-install.json"
    path.write_text(json.dumps({"targets": {str(target): rule}}))
    ops.policy_set(str(path))


def flags(backend):
    """What the person puts after `overlord hook claude-code` for a backend: the fuse backend
    has no jail and cannot take the network away."""
    return ("--no-jail", "--net", "host") if backend == "fuse" else ()


def payload(tool, tool_input, cwd, event="PreToolUse"):
    return {"session_id": "3f2b8c1e-claude", "transcript_path": "/tmp/claude/transcript.jsonl",
            "cwd": str(cwd), "permission_mode": "default", "hook_event_name": event,
            "tool_name": tool, "tool_input": tool_input, "tool_use_id": "toolu_01ABC"}


def hook(ovl, data, backend, env=None):
    """Run the hook on data (a dict, or bytes as they are); the process, with .answer the
    parsed stdout (None when it printed nothing)."""
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    proc = ovl("hook", "claude-code", *flags(backend), input=raw,
               env={"CLAUDE_PROJECT_DIR": "", **(env or {})})
    proc.answer = json.loads(proc.out) if proc.out.strip() else None
    return proc


def decision(proc):
    assert proc.returncode == 0, (proc.returncode, proc.err)
    out = proc.answer["hookSpecificOutput"]
    assert out["hookEventName"] == "PreToolUse"
    assert out["permissionDecision"] in ("allow", "deny", "ask")
    assert isinstance(out["permissionDecisionReason"], str) and out["permissionDecisionReason"]
    return out


def run_rewritten(out, where):
    """Run the updated command the way Claude Code's Bash tool would: bash -c, from `where`,
    with nothing of the test's environment (no PYTHONPATH, no OVERLORD_HOME)."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    return subprocess.run(["bash", "-c", out["updatedInput"]["command"]], cwd=str(where),
                          env=env, capture_output=True, timeout=120)


def remembered(home, target):
    with open(home / STATE) as f:
        return json.load(f)["projects"][os.path.realpath(target)]["sid"]


def test_bash_runs_inside_a_session_and_only_there(ovl, home, target, backend, tmp_path):
    admit(home, target, backend)
    before = tree(target)
    tool_input = {"command": "echo new > made.txt; echo more >> hello.txt; cat hello.txt",
                  "description": "make a file", "timeout": 120000}
    out = decision(hook(ovl, payload("Bash", tool_input, target), backend))
    assert out["permissionDecision"] == "allow"
    updated = out["updatedInput"]
    assert {k: v for k, v in updated.items() if k != "command"} == \
        {"description": "make a file", "timeout": 120000}          # the other fields kept
    sid = remembered(home, target)
    assert f"exec --wait {sid} -- bash -c " in updated["command"] and sid in \
        out["permissionDecisionReason"]
    assert not updated["command"].startswith("overlord ")            # no PATH lookup
    done = run_rewritten(out, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"hello\nmore\n"
    assert tree(target) == before                                    # the real tree untouched
    assert ovl.diff(sid) == [("added", "made.txt"), ("modified", "hello.txt")]
    meta = ops.get_session(sid).meta
    assert meta["broker"] == {"face": "hook", "client": "claude-code"}
    if backend == "kernel":                                          # brokered: jailed, offline
        assert (meta["grants"]["jail"], meta["grants"]["net"]) == (True, "none")
    assert stat.S_IMODE(os.stat(home / STATE).st_mode) == 0o600


def test_the_exit_status_passes_through_and_the_command_starts_at_the_payloads_cwd(
        ovl, home, target, backend, tmp_path):
    admit(home, target, backend)
    out = decision(hook(ovl, payload("Bash", {"command": "pwd; exit 7"}, target / "sub"),
                        backend))
    done = run_rewritten(out, tmp_path)           # run from elsewhere: it still starts in sub
    assert done.returncode == 7
    assert done.stdout.decode().strip() == str(target / "sub")


ESCAPES = [
    ("quotes", "echo 'it'\"'\"'s' > \"q'uote\".txt; echo \"dq\\\"\" >> \"q'uote\".txt",
     ["q'uote.txt"]),
    ("newline", "echo a > n1.txt\necho b > n2.txt", ["n1.txt", "n2.txt"]),
    ("substitution", "echo $(touch subst.txt; echo x) `touch tick.txt` > out.txt",
     ["out.txt", "subst.txt", "tick.txt"]),
    ("closing quote", "touch first.txt; touch in.txt'; touch {real}/escaped.txt; echo '",
     ["first.txt"]),
    ("and-or", "false || touch or.txt && touch and.txt", ["and.txt", "or.txt"]),
]


@pytest.mark.parametrize("name,command,made", ESCAPES, ids=[e[0] for e in ESCAPES])
def test_no_part_of_the_command_runs_outside_the_session(ovl, home, target, backend, tmp_path,
                                                         name, command, made):
    admit(home, target, backend)
    before = tree(target)
    command = command.replace("{real}", str(target))
    out = decision(hook(ovl, payload("Bash", {"command": command}, target), backend))
    done = run_rewritten(out, tmp_path)
    assert tree(target) == before, done.stderr                       # nothing escaped
    sid = remembered(home, target)
    assert ovl.diff(sid) == [("added", p) for p in sorted(made)], done.stderr


def test_an_overlord_commit_in_the_command_cannot_commit_its_own_session(ovl, home, target,
                                                                        backend, tmp_path):
    admit(home, target, backend)
    before = tree(target)
    first = decision(hook(ovl, payload("Bash", {"command": "echo x > mine.txt"}, target), backend))
    run_rewritten(first, tmp_path)
    sid = remembered(home, target)
    commit = f"OVERLORD_HOME={home} PYTHONPATH={REPO} {sys.executable} -m overlord commit"
    attempt = f"echo y > also.txt; {commit} {sid}; {commit} last; {commit} --force {sid}"
    out = decision(hook(ovl, payload("Bash", {"command": attempt}, target), backend))
    run_rewritten(out, tmp_path)
    assert tree(target) == before
    assert ops.get_session(sid).meta["state"] == "pending"
    assert ovl.diff(sid) == [("added", "also.txt"), ("added", "mine.txt")]


def test_a_nul_byte_is_denied_and_nothing_opens(ovl, home, target, backend):
    admit(home, target, backend)
    out = decision(hook(ovl, payload("Bash", {"command": "echo a\0; touch x"}, target), backend))
    assert out["permissionDecision"] == "deny" and "NUL" in out["permissionDecisionReason"]
    assert "updatedInput" not in out
    assert ops.sessions() == []


def test_the_session_is_reused_while_pending_and_renewed_after_commit_or_rollback(
        ovl, home, target, backend, tmp_path):
    admit(home, target, backend)
    call = payload("Bash", {"command": "echo 1 >> log.txt"}, target)
    run_rewritten(decision(hook(ovl, call, backend)), tmp_path)
    first = remembered(home, target)
    run_rewritten(decision(hook(ovl, call, backend)), tmp_path)
    assert remembered(home, target) == first
    assert len(ops.savepoints(first)) == 2              # one savepoint per command
    ovl("rollback", first, check=0)
    run_rewritten(decision(hook(ovl, call, backend)), tmp_path)
    second = remembered(home, target)
    assert second != first and ops.get_session(first).meta["state"] == "rolled-back"
    ovl("commit", second, check=0)
    assert (target / "log.txt").read_text() == "1\n"
    out = decision(hook(ovl, call, backend))
    third = remembered(home, target)
    assert third not in (first, second) and third in out["updatedInput"]["command"]


def test_parallel_first_calls_share_one_session(ovl, home, target, backend):
    admit(home, target, backend)
    raw = json.dumps(payload("Bash", {"command": "true"}, target)).encode()
    argv = [sys.executable, "-m", "overlord", "hook", "claude-code", *flags(backend)]
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=ovl.env({"CLAUDE_PROJECT_DIR": ""}))
             for _ in range(3)]
    outs = [p.communicate(raw, timeout=120) for p in procs]
    sids = {remembered(home, target)}
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        command = json.loads(out)["hookSpecificOutput"]["updatedInput"]["command"]
        sids.add(command.split(" exec --wait ")[1].split(" ")[0])
    assert len(sids) == 1 and len(ops.sessions()) == 1


def test_claude_project_dir_names_the_project(ovl, home, target, backend):
    admit(home, target, backend)
    out = decision(hook(ovl, payload("Bash", {"command": "true"}, target / "sub"), backend,
                        env={"CLAUDE_PROJECT_DIR": str(target)}))
    sid = remembered(home, target)
    assert ops.get_session(sid).target == str(target) and sid in out["updatedInput"]["command"]


def test_an_uncovered_folder_is_denied_naming_the_policy_key(ovl, home, target, backend):
    out = decision(hook(ovl, payload("Bash", {"command": "touch x"}, target), backend))
    reason = out["permissionDecisionReason"]
    assert out["permissionDecision"] == "deny" and "updatedInput" not in out
    assert str(home / "policy.json") in reason and '"targets"' in reason and str(target) in reason
    assert ops.sessions() == [] and not (home / STATE).exists()


def test_a_policy_change_is_checked_again_by_the_broker(ovl, home, target, backend, tmp_path):
    admit(home, target, backend)
    call = payload("Bash", {"command": "echo a > a.txt"}, target)
    run_rewritten(decision(hook(ovl, call, backend)), tmp_path)
    sid = remembered(home, target)
    path = home.parent / "narrower.json"
    path.write_text(json.dumps({"targets": {str(tmp_path / "elsewhere"): {}}}))
    ops.policy_set(str(path))
    out = decision(hook(ovl, call, backend))
    assert out["permissionDecision"] == "deny" and "no target covering" in \
        out["permissionDecisionReason"]
    assert ops.get_session(sid).meta["state"] == "pending"           # left for a person
    admit(home, target, backend)                                     # covered again: reused
    out = decision(hook(ovl, call, backend))
    assert out["permissionDecision"] == "allow" and sid in out["updatedInput"]["command"]


@pytest.mark.parametrize("tool,tool_input", [
    ("Write", {"file_path": "/x/a.txt", "content": "hi"}),
    ("Edit", {"file_path": "/x/a.txt", "old_string": "a", "new_string": "b"}),
    ("MultiEdit", {"file_path": "/x/a.txt", "edits": [{"old_string": "a", "new_string": "b"}]}),
    ("NotebookEdit", {"notebook_path": "/x/n.ipynb", "new_source": "print(1)"}),
])
def test_file_tools_are_denied_naming_the_mcp_tools(ovl, home, target, backend, tool, tool_input):
    admit(home, target, backend)
    before = tree(target)
    out = decision(hook(ovl, payload(tool, tool_input, target), backend))
    reason = out["permissionDecisionReason"]
    assert out["permissionDecision"] == "deny" and "updatedInput" not in out
    sid = remembered(home, target)
    for words in ("mcp__overlord__write_file", "mcp__overlord__edit_file", "overlord mcp serve",
                  sid):
        assert words in reason
    assert tree(target) == before


@pytest.mark.parametrize("tool", ["Read", "Glob", "Grep", "WebFetch", "mcp__overlord__exec"])
def test_other_tools_get_no_opinion(ovl, home, target, backend, tool):
    proc = hook(ovl, payload(tool, {"file_path": str(target / "hello.txt")}, target), backend)
    assert (proc.returncode, proc.out, proc.err) == (0, "", "")
    assert ops.sessions() == []


@pytest.mark.parametrize("data,words", [
    (b"not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "JSON list, not an object"),
    (b"{}", "no hook_event_name"),
    (json.dumps({"hook_event_name": "PreToolUse", "tool_input": {}}).encode(), "no tool_name"),
    (json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash",
                 "tool_input": "ls"}).encode(), "tool_input is not an object"),
    (json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": "/",
                 "tool_input": {"command": ["ls"]}}).encode(), "no command string"),
    (json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": "rel",
                 "tool_input": {"command": "ls"}}).encode(), "not an absolute path"),
    (json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash",
                 "tool_input": {"command": "ls"}}).encode(), "no project directory"),
])
def test_input_it_cannot_read_blocks_the_call(ovl, home, target, backend, data, words):
    admit(home, target, backend)
    proc = hook(ovl, data, backend)
    assert proc.returncode == 2 and proc.out == ""
    lines = proc.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: hook claude-code: ")
    assert words in lines[0] and lines[0].endswith("the call is blocked")
    assert ops.sessions() == []


def test_another_hook_event_is_a_non_blocking_error(ovl, home, target, backend):
    proc = hook(ovl, payload("Bash", {"command": "ls"}, target, event="PostToolUse"), backend)
    assert proc.returncode == 1 and proc.out == ""
    assert "PreToolUse only" in proc.err and len(proc.err.splitlines()) == 1
