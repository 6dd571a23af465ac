"""`overlord mcp add|list|test|rm|approval`, run as a subprocess with a private OVERLORD_HOME:
masked output, real servers (server-everything, and OVERLORD's own `mcp serve`, which has a
shell-shaped tool), and every bad input as one `overlord:` line with mcp.json unchanged."""
import json
import os
import stat
import sys
import time

import pytest

from conftest import REPO, Ovl
from servers import everything_argv

TOKEN = "ghp_0123456789abcdefSECRET"
BEARER = "Bearer sk-verysecretvalue-123"
SECRETS = (TOKEN, "sk-verysecret", "hunter2")


@pytest.fixture
def cli(home):
    return Ovl(home)


def one_error_line(proc, code):
    assert proc.returncode == code, (proc.returncode, proc.out, proc.err)
    lines = proc.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err
    return lines[0]


def no_secret(*procs):
    for p in procs:
        for secret in SECRETS:
            assert secret not in p.out and secret not in p.err, (secret, p.out, p.err)


def add_both(cli):
    a = cli("mcp", "add", "gh", "--command", "npx", "--arg", "-y", "--arg", "@x/server-github",
            "--env", f"GITHUB_TOKEN={TOKEN}", "--env", "SHORT=hunter2", check=0)
    b = cli("mcp", "add", "docs", "--url", "https://host.example/mcp",
            "--header", f"Authorization: {BEARER}", check=0)
    return a, b


def test_add_and_list_mask_every_secret(cli, home):
    a, b = add_both(cli)
    assert a.out == "added gh (stdio): npx -y @x/server-github\n"
    assert b.out == "added docs (http): https://host.example/mcp\n"
    mcp = home / "mcp.json"
    assert stat.S_IMODE(mcp.stat().st_mode) == 0o600
    stored = json.loads(mcp.read_text())["servers"]
    assert stored["gh"]["args"] == ["-y", "@x/server-github"]          # `--arg -y` as written
    assert stored["gh"]["env"]["GITHUB_TOKEN"] == TOKEN
    human = cli("mcp", "list", check=0)
    lines = human.out.splitlines()
    assert lines[0].startswith("approval: ask (actions ask first)")
    assert lines[1].split() == ["NAME", "TRANSPORT", "COMMAND", "OR", "URL", "ENV", "OR", "HEADERS"]
    assert lines[2].split() == ["docs", "http", "https://host.example/mcp", "Authorization:",
                                "Bea…(masked)"]
    assert lines[3].split() == ["gh", "stdio", "npx", "-y", "@x/server-github",
                                "GITHUB_TOKEN=ghp…(masked),", "SHORT=••••"]
    js = cli("mcp", "list", "--json", check=0)
    data = json.loads(js.out)
    assert data["approval"] == "ask" and data["file"] == str(mcp)
    assert data["servers"] == [
        {"name": "docs", "transport": "http", "url": "https://host.example/mcp",
         "headers": {"Authorization": "Bea…(masked)"}},
        {"name": "gh", "transport": "stdio", "command": "npx", "args": ["-y", "@x/server-github"],
         "env": {"GITHUB_TOKEN": "ghp…(masked)", "SHORT": "••••"}}]
    no_secret(a, b, human, js)


def test_list_with_nothing_configured(cli, home):
    proc = cli("mcp", "list", check=0)
    assert "no connectors configured" in proc.out and not (home / "mcp.json").exists()
    assert json.loads(cli("mcp", "list", "--json", check=0).out)["servers"] == []


def test_what_the_config_chose_is_escaped(cli, home):
    cli("mcp", "add", "evil", "--command", "srv\x1b[2J", "--arg", "a\rb", check=0)
    out = cli("mcp", "list", check=0).out
    assert "\x1b" not in out and "\r" not in out
    assert "srv\\x1b[2J" in out and "a\\rb" in out


def test_test_lists_the_real_servers_tools_with_their_read_only_status(cli, home):
    argv = everything_argv()
    cli("mcp", "add", "everything", "--command", argv[0], *[f"--arg={a}" for a in argv[1:]],
        "--env", f"GITHUB_TOKEN={TOKEN}", check=0)
    proc = cli("mcp", "test", "everything", check=0)
    lines = proc.out.splitlines()
    assert lines[0].startswith("everything: ") and "(stdio)" in lines[0]
    assert lines[1] == "protocol: 2025-11-25 (era: handshake)"
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines if line.startswith("  ")}
    assert rows["mcp__everything__echo"] == "read-only (server's claim)"
    assert rows["mcp__everything__toggle-simulated-logging"] == "acts: asks first"
    assert not [r for r in rows.values() if "withheld" in r]
    no_secret(proc)
    data = json.loads(cli("mcp", "test", "everything", "--json", check=0).out)
    assert (data["version"], data["era"], data["approval"]) == ("2025-11-25", "handshake", "ask")
    tools = {t["tool"]: t for t in data["tools"]}
    assert tools["echo"]["readonly"] is True and tools["toggle-simulated-logging"]["readonly"] is False
    assert tools["get-sum"]["offered"] == "mcp__everything__get-sum"
    assert data["server_info"].get("name")
    assert stat.S_IMODE(os.stat(data["log"]).st_mode) == 0o600
    cli("mcp", "approval", "readonly", check=0)
    rows = {line.split()[0]: line.split(None, 1)[1]
            for line in cli("mcp", "test", "everything", check=0).out.splitlines() if line.startswith("  ")}
    assert rows["mcp__everything__toggle-simulated-logging"] == "acts: refused (approval readonly)"
    assert rows["mcp__everything__echo"] == "read-only (server's claim)"


def test_test_withholds_a_shell_shaped_tool_of_overlords_own_server(cli, tmp_path):
    """`overlord mcp serve` is a real stateless-revision server with an `exec` tool that takes
    a command line: the one real shell-shaped tool at hand."""
    other = tmp_path / "served-home"
    other.mkdir()
    cli("mcp", "add", "self", "--command", sys.executable, "--arg", "-m", "--arg", "overlord",
        "--arg", "mcp", "--arg", "serve", "--arg", "-t", "--arg", str(tmp_path),
        "--env", f"PYTHONPATH={REPO}", "--env", f"OVERLORD_HOME={other}", check=0)
    proc = cli("mcp", "test", "self", check=0)
    assert "protocol: 2026-07-28 (era: stateless)" in proc.out
    rows = {line.split()[0]: line for line in proc.out.splitlines() if line.startswith("  ")}
    assert "withheld (shell-shaped)" in rows["mcp__self__exec"]
    assert "acts: asks first" in rows["mcp__self__exec"]
    assert rows["mcp__self__read_file"].split(None, 1)[1] == "read-only (server's claim)"
    assert [n for n, r in rows.items() if "withheld" in r] == ["mcp__self__exec"]
    assert "1 withheld as shell-shaped" in proc.out


@pytest.mark.parametrize("argv", [
    ["--command", "/nonexistent/mcp-server"],                                  # cannot start
    ["--command", "sh", "--arg=-c", "--arg", "echo starting >&2; exit 3"],     # exits at once
    ["--command", "sh", "--arg=-c", "--arg", "echo not json; sleep 30"],       # garbage
    ["--command", "sleep", "--arg", "30"],                                     # hangs at start
], ids=["missing", "exits", "garbage", "hangs"])
def test_a_server_that_fails_is_one_line_and_exit_1(cli, home, argv):
    cli("mcp", "add", "broken", *argv, "--env", f"GITHUB_TOKEN={TOKEN}", check=0)
    started = time.monotonic()
    proc = cli("mcp", "test", "broken", "--timeout", "2", check=None)
    line = one_error_line(proc, 1)
    assert line.startswith("overlord: connector broken: ") and proc.out == ""
    assert time.monotonic() - started < 15
    no_secret(proc)


def test_rm_and_approval(cli, home):
    add_both(cli)
    mcp = home / "mcp.json"
    proc = cli("mcp", "rm", "docs", check=0)
    assert proc.out == "removed docs (http): https://host.example/mcp\n"
    assert list(json.loads(mcp.read_text())["servers"]) == ["gh"]
    assert cli("mcp", "approval", check=0).out == "approval: ask: actions ask first\n"
    assert cli("mcp", "approval", "auto", check=0).out == \
        "approval: auto (was ask): actions run without asking\n"
    assert json.loads(mcp.read_text())["approval"] == "auto"
    assert cli("mcp", "approval", check=0).out.startswith("approval: auto:")
    assert stat.S_IMODE(mcp.stat().st_mode) == 0o600


BAD = [
    (["add", "a_b", "--command", "x"], 2, "NAME: 'a_b' is not a server name"),
    (["add", "-x", "--command", "x"], 2, ""),
    (["add", "x" * 33, "--command", "x"], 2, "is not a server name"),
    (["add", "new", "--command", "x", "--url", "https://h/"], 2, "not allowed with"),
    (["add", "new"], 2, "one of the arguments --command --url is required"),
    (["add", "new", "--url", "ftp://host/"], 2, "--url: 'ftp://host/' is not an http"),
    (["add", "new", "--url", "https://"], 2, "with a host"),
    (["add", "new", "--url", "https://h/", "--header", "Authorization Bearer hunter2"], 2,
     "--header: entry 1 is not 'Name: value'"),
    (["add", "new", "--url", "https://h/", "--header", "Bad Name: v"], 2, "--header: 'Bad Name' is not a header name"),
    (["add", "new", "--url", "https://h/", "--header", "A: 1", "--header", "a: 2"], 2, "given twice"),
    (["add", "new", "--command", "x", "--env", "hunter2"], 2, "--env: entry 1 is not KEY=VALUE"),
    (["add", "new", "--command", "x", "--env", "1X=v"], 2, "--env: '1X' is not an environment variable name"),
    (["add", "new", "--command", "x", "--header", "A: b"], 2, "--header goes with --url"),
    (["add", "new", "--url", "https://h/", "--arg", "x"], 2, "--arg and --env go with --command"),
    (["add", "new", "--command", ""], 2, "--command: the command is empty"),
    (["add", "gh", "--command", "other"], 2, "already configured; run `overlord mcp rm gh` first"),
    (["rm", "nope"], 2, "no connector named 'nope'"),
    (["test", "nope"], 2, "configured: docs, gh"),
    (["test", "gh", "--timeout", "0"], 2, "--timeout"),
    (["approval", "never"], 2, "invalid choice: 'never'"),
]


@pytest.mark.parametrize("argv, code, what", BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_one_line_and_changes_nothing(cli, home, argv, code, what):
    add_both(cli)
    mcp = home / "mcp.json"
    before = mcp.read_bytes()
    proc = cli("mcp", *argv, check=None)
    line = one_error_line(proc, code)
    assert what in line, line
    assert mcp.read_bytes() == before
    no_secret(proc)


def test_a_damaged_or_open_mcp_json_is_one_line_for_every_action(cli, home):
    mcp = home / "mcp.json"
    mcp.write_text('{"servers": {"gh": {"command": "npx", "cwd": "/"}}}')
    os.chmod(mcp, 0o600)
    before = mcp.read_bytes()
    for argv in (["list"], ["test", "gh"], ["rm", "gh"], ["approval"], ["approval", "auto"],
                 ["add", "new", "--command", "x"]):
        line = one_error_line(cli("mcp", *argv, check=None), 1)
        assert line == f"overlord: mcp.json {mcp}: servers.gh.cwd: unknown key (a server has " \
            "command, args, env or url, headers)", (argv, line)
    assert mcp.read_bytes() == before
    os.chmod(mcp, 0o644)
    line = one_error_line(cli("mcp", "list", check=None), 1)
    assert "lets others read it; run: chmod 600" in line


def test_serve_is_still_there(cli):
    proc = cli("mcp", "serve", "--help", check=0)
    assert "--http" in proc.out and "open_session" in proc.out
    help_ = cli("mcp", "--help", check=0).out
    for action in ("serve", "add", "list", "test", "rm", "approval"):
        assert action in help_
