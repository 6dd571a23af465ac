"""Start-up: a command imports only what it runs (a harness hook pays the CLI's start-up on every
tool call; bench/bench_startup.py times it). Checked on the modules a real process loaded, not
on timings: `overlord --help`, `overlord exec SID -- true` and the hook's answer in a session it
reuses each leave the providers, ssl, http, email, the web face and everything else they do not
run unimported -- and each face module in overlord.cli.main.FACE_CLI keeps its top level light,
since `--help` and every face command import them all to learn their subcommands.
"""
import json
import subprocess
import sys

import pytest

from conftest import REPO, Ovl
from overlord import ops
from overlord.cli import main as cli

# Never needed to parse arguments, print help or run a command in a session.
HEAVY = ("ssl", "http.client", "http.server", "email", "urllib.request", "asyncio", "socket",
         "overlord.agent", "overlord.web", "overlord.daemon", "overlord.mcp")
# ...and, beyond those, what --help and the hook's hot path never touch.
ENGINE = ("overlord.txn", "overlord.sandbox", "overlord.linux", "overlord.trust", "ctypes",
          "subprocess", "hashlib", "dataclasses", "shutil", "tempfile")
# What a face module may bring in at its top level: the light part of overlord.
FACE_OK = ("overlord", "overlord.cli", "overlord.errors", "overlord.text", "overlord.ops")

PROBE = """
import atexit, sys
where, before = sys.argv[1], set(sys.modules)     # what the interpreter's own start loaded
def dump():
    import json
    with open(where, "w") as f:
        json.dump(sorted(set(sys.modules) - before), f)
atexit.register(dump)
sys.argv[:2] = ["overlord"]
from overlord.cli.main import main
sys.exit(main())
"""


def loaded(ovl, tmp_path, *args, input=None, env=None):
    """The modules a real `overlord ARGS` process loaded (beyond what `python3 -c pass` has
    loaded: a site-packages .pth may import tempfile), and the process."""
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], input=input,
                          env=ovl.env(env), capture_output=True, timeout=120, cwd=REPO)
    with open(out) as f:
        return set(json.load(f)), proc


def offenders(modules, banned):
    return sorted(m for m in modules if any(m == b or m.startswith(b + ".") for b in banned))


def test_help_imports_no_operation_and_nothing_heavy(home, tmp_path):
    modules, proc = loaded(Ovl(home), tmp_path, "--help")
    assert proc.returncode == 0 and b"exec" in proc.stdout
    assert offenders(modules, HEAVY + ENGINE) == []
    assert [m for m in modules if m.startswith("overlord.ops.")] == []


def test_exec_imports_only_the_run_path(ovl, tmp_path, target):
    sid, _ = ovl.sh(target, "echo x > new.txt")
    modules, proc = loaded(ovl, tmp_path, "exec", sid, "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert "overlord.ops.execute" in modules            # it did run the command
    banned = HEAVY + ("overlord.ops.decide", "overlord.ops.broker", "overlord.ops.agent",
                      "overlord.ops.countersign", "overlord.ops.clearance", "overlord.trust.gate",
                      "overlord.txn.commit", "overlord.txn.replay", "overlord.txn.blame",
                      "difflib", "tempfile", "platform")
    if ovl.backend == "kernel":                # fuse-overlayfs is a tool the fuse backend runs
        banned += ("subprocess",)
    assert offenders(modules, banned) == []


def test_the_hooks_answer_in_a_reused_session_loads_no_engine(ovl, home, tmp_path, target):
    policy = tmp_path / "policy.json"        # a targets entry: the hook's session is brokered
    policy.write_text(json.dumps({"targets": {str(target): {"net": "host"}}}))
    ops.policy_set(str(policy))
    payload = json.dumps({"session_id": "s", "transcript_path": "/tmp/t.jsonl",
                          "cwd": str(target), "permission_mode": "default",
                          "hook_event_name": "PreToolUse", "tool_name": "Bash",
                          "tool_input": {"command": "ls"}, "tool_use_id": "t"}).encode()
    hook = ("hook", "claude-code") + (("--no-jail", "--net", "host")
                                      if ovl.backend == "fuse" else ())
    env = {"CLAUDE_PROJECT_DIR": ""}
    first, proc = loaded(ovl, tmp_path, *hook, input=payload, env=env)
    assert proc.returncode == 0 and b'"allow"' in proc.stdout, proc.stderr
    assert "overlord.ops.broker" in first                 # the first call opened the session
    modules, proc = loaded(ovl, tmp_path, *hook, input=payload, env=env)
    assert proc.returncode == 0 and b'"allow"' in proc.stdout, proc.stderr
    assert offenders(modules, HEAVY + ENGINE + ("overlord.ops.broker", "overlord.ops.execute",
                                                "overlord.ops.review")) == \
        ["overlord.txn", "overlord.txn.store"]            # the store's record reader only


@pytest.mark.parametrize("name", cli.FACE_CLI)
def test_a_face_module_is_light_at_its_top_level(name):
    """The rule for overlord/cli/*_cmd(s).py: at the top, the standard library's cheap modules
    and FACE_OK only; anything heavier is imported inside the command function."""
    code = ("import sys, json; before = set(sys.modules); import overlord.cli." + name +
            "; print(json.dumps(sorted(set(sys.modules) - before)))")
    new = json.loads(subprocess.check_output([sys.executable, "-c", code], cwd=REPO))
    ours = [m for m in new if m.startswith("overlord") and m not in FACE_OK
            and not m.startswith("overlord.cli.")]
    assert ours == [] and offenders(new, HEAVY + ENGINE) == [], (ours, new)


def test_only_the_named_subcommand_is_built():
    """Every subcommand is listed, but only the one being run gets its full parser."""
    parser = cli.build_parser("exec")
    sub = next(a for a in parser._actions if a.nargs == "A...")
    assert sub.choices["exec"] is not cli.SKIPPED and sub.choices["diff"] is cli.SKIPPED
    full = cli.build_parser()
    names = next(a for a in full._actions if a.nargs == "A...").choices
    top = cli.build_parser("")
    assert list(next(a for a in top._actions if a.nargs == "A...").choices) == list(names)
    assert top.format_help() == full.format_help()
