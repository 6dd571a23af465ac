"""`overlord keys` and `overlord models` through the real CLI, and the help of every agent
command. No sandbox needed."""
import json
import stat

import pytest

from agentlib import AgentOvl
from fakes import AnthropicFake, GeminiFake, ResponsesFake

NO_KEYS = {"ANTHROPIC_API_KEY": "", "OPENAI_API_KEY": "", "AZURE_OPENAI_API_KEY": "",
           "GEMINI_API_KEY": "", "OPENAI_COMPAT_API_KEY": ""}


@pytest.fixture
def cli(home):
    return AgentOvl(home)


def test_keys_set_reads_stdin_and_list_never_shows_a_key(cli, home):
    secret = "sk-ant-test-0123456789abcdef"
    proc = cli("keys", "set", "anthropic", input=f"{secret}\n".encode(), env=NO_KEYS, check=0)
    assert secret not in proc.out + proc.err
    keyfile = home / "keys.json"
    assert stat.S_IMODE(keyfile.stat().st_mode) == 0o600
    assert json.loads(keyfile.read_text()) == {"anthropic": secret}
    proc = cli("keys", "list", env=NO_KEYS, check=0)
    assert secret not in proc.out
    rows = dict(line.split(None, 1) for line in proc.out.splitlines())
    assert rows["anthropic"] == "store" and rows["openai"] == "-"
    listing = json.loads(cli("keys", "list", "--json", env=dict(NO_KEYS, OPENAI_API_KEY="sk-x"),
                             check=0).out)
    assert listing["anthropic"] == "store" and listing["openai"] == "env" and listing["gemini"] is None


def test_keys_set_refuses_argv_and_empty_input(cli):
    proc = cli("keys", "set", "anthropic", "sk-on-the-command-line")
    assert proc.returncode == 2 and "Traceback" not in proc.err
    proc = cli("keys", "set", "anthropic", input=b"\n")
    assert proc.returncode == 2 and "no key on stdin" in proc.err
    proc = cli("keys", "set", "nosuch", input=b"k\n")
    assert proc.returncode == 2


def test_keys_file_readable_by_others_is_refused(cli, home):
    cli("keys", "set", "gemini", input=b"g-key\n", env=NO_KEYS, check=0)
    (home / "keys.json").chmod(0o644)
    proc = cli("keys", "list", env=NO_KEYS)
    assert proc.returncode == 1 and "chmod 600" in proc.err


@pytest.mark.parametrize("kind", ["anthropic", "openai", "gemini"])
def test_models_lists_what_the_endpoint_serves(cli, kind):
    fake = {"anthropic": AnthropicFake, "openai": ResponsesFake, "gemini": GeminiFake}[kind]()
    fake.queue(fake.models(), fake.models())
    try:
        proc = cli("models", "--provider", kind, "--base-url", fake.url, check=0)
        listed = json.loads(cli("models", "--provider", kind, "--base-url", fake.url, "--json",
                                check=0).out)
    finally:
        fake.close()
    assert fake.problems == []
    ids = [m["id"] for m in listed]
    assert ids and all(i in proc.out for i in ids)
    assert {"anthropic": "claude-test-5", "openai": "gpt-test-5", "gemini": "gemini-test-3"}[kind] in ids


def test_models_failure_is_one_line(cli):
    fake = AnthropicFake(key="another-key")
    try:
        proc = cli("models", "--provider", "anthropic", "--base-url", fake.url)
    finally:
        fake.close()
    assert proc.returncode == 1 and proc.err.count("\n") == 1 and proc.err.startswith("overlord: ")
    proc = cli("models", "--provider", "gemini", env=NO_KEYS)
    assert proc.returncode == 1 and "overlord keys set gemini" in proc.err


@pytest.mark.parametrize("argv", [["agent"], ["resume"], ["transcript"], ["keys"], ["keys", "set"],
                                  ["keys", "list"], ["models"]])
def test_every_agent_command_has_help(cli, argv):
    proc = cli(*argv, "--help", check=0)
    assert "usage: overlord " + " ".join(argv) in proc.out
    assert len(proc.out.splitlines()) > 4


def test_agent_help_names_every_knob(cli):
    text = cli("agent", "--help", check=0).out
    for flag in ("--provider", "--model", "--base-url", "--header", "--max-turns", "--no-jail",
                 "--net", "--trace", "--audit", "--max-tokens", "--temperature", "--top-p", "--stop",
                 "--effort", "--thinking", "--api", "--system", "--no-stream", "--no-fallbacks",
                 "--context-window", "--azure-api-version", "--script"):
        assert flag in text, flag
