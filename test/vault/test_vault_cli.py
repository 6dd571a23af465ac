"""`overlord secrets set-command|show|test|off` through the real CLI: one line for bad input,
no shell anywhere, the length and never the value."""
import json

import pytest

from conftest import Ovl
from vaultlib import VALUES, assert_nowhere, audit_lines, resolver  # noqa: F401


@pytest.fixture
def cli(home):
    return Ovl(home)


def one_line(proc, code):
    assert proc.returncode == code, (proc.returncode, proc.out, proc.err)
    lines = proc.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: ") and "Traceback" not in proc.err, \
        proc.err
    return lines[0]


def test_set_show_test_off(cli, home, resolver):
    proc = cli("secrets", "set-command", resolver.command, "--ttl", "120", check=0)
    assert proc.out.startswith("resolver set")
    assert f"command  {resolver.script} '{{name}}'" in proc.out and "ttl      120 s" in proc.out
    shown = json.loads(cli("secrets", "show", "--json", check=0).out)
    assert shown == {"configured": True, "path": str(home / "secrets.json"),
                     "command": [str(resolver.script), "{name}"], "program": "resolve.py",
                     "ttl": 120}
    assert "program  resolve.py" in cli("secrets", "show", check=0).out

    proc = cli("secrets", "test", "db/password", check=0)
    assert proc.out == f"secret://db/password: {len(VALUES['db/password'])} characters\n"
    js = json.loads(cli("secrets", "test", "providers/anthropic", "--json", check=0).out)
    assert js == {"name": "providers/anthropic", "length": len(VALUES["providers/anthropic"])}
    assert resolver.calls() == [["db/password"], ["providers/anthropic"]]
    tested = audit_lines(home, "secret.resolve")
    assert [(t["name"], t["what"], t["ok"]) for t in tested] == [
        ("db/password", "secrets test", True), ("providers/anthropic", "secrets test", True)]

    assert cli("secrets", "off", check=0).out.startswith("resolver removed")
    assert not (home / "secrets.json").exists()
    assert cli("secrets", "show", check=0).out.startswith("no resolver is set")
    assert cli("secrets", "off", check=0).err == "no resolver was set\n"
    line = one_line(cli("secrets", "test", "db/password"), 1)
    assert "no resolver is configured" in line
    assert [a["op"] for a in audit_lines(home, "secret.config")] == ["set-command", "off"]
    assert_nowhere(home)


def test_a_failing_resolver_is_one_line_naming_the_reference(cli, home, resolver):
    cli("secrets", "set-command", resolver.command, check=0)
    line = one_line(cli("secrets", "test", "no/such"), 1)
    assert line == "overlord: secret://no/such: the resolver exited 3 (no secret named no/such)"
    resolver.put("bad/empty", "")
    assert one_line(cli("secrets", "test", "bad/empty"), 1) == \
        "overlord: secret://bad/empty: the resolver printed nothing (an empty secret)"


@pytest.mark.parametrize("argv,code,words", [
    (["set-command", ""], 2, "is empty"),
    (["set-command", "pass show"], 2, "has no {name}"),
    (["set-command", "no-such-resolver-prog {name}"], 1, "not found on PATH"),
    (["set-command", "/no/such/dir/prog {name}"], 1, "does not exist"),
    (["set-command", "pass 'open {name}"], 2, "cannot parse"),
    (["set-command", "sh -c {name}", "--ttl", "-5"], 2, "--ttl"),
    (["set-command", "sh -c {name}", "--ttl", "soon"], 2, "--ttl"),
    (["test", "../etc/passwd"], 2, "not a secret name"),
    (["test", "/etc/passwd"], 2, "not a secret name"),
    (["test", "a b"], 2, "not a secret name"),
    (["test", "-x"], 2, None),                   # argparse: an option, not a name
    (["test", "x;touch pwned"], 2, "not a secret name"),
    (["test", "$(touch pwned)"], 2, "not a secret name"),
    (["test", "`touch pwned`"], 2, "not a secret name"),
    (["test", "n" * 300], 2, "not a secret name"),
])
def test_bad_input_is_one_line_and_changes_nothing(cli, home, resolver, tmp_path, argv, code,
                                                   words):
    cli("secrets", "set-command", resolver.command, check=0)
    before = (home / "secrets.json").read_bytes(), (home / "audit.jsonl").read_bytes()
    proc = cli("secrets", *argv, cwd=tmp_path)
    if words is None:
        assert proc.returncode == code and "Traceback" not in proc.err
    else:
        assert words in one_line(proc, code)
    assert ((home / "secrets.json").read_bytes(), (home / "audit.jsonl").read_bytes()) == before
    assert resolver.calls() == [] and not (tmp_path / "pwned").exists()


def test_no_shell_ever_runs_the_command(cli, home, resolver, tmp_path):
    """Shell syntax in the configured command is handed over as plain arguments: nothing is
    run but the program, so `;touch pwned` creates nothing, `$(...)` expands to nothing."""
    pwned = tmp_path / "pwned"
    cmd = f"{resolver.script} {{name}} ;touch {pwned} '$(touch {pwned})' '|' touch {pwned}"
    cli("secrets", "set-command", cmd, check=0)
    cli("secrets", "test", "db/password", cwd=tmp_path, check=0)
    assert not pwned.exists()
    assert resolver.calls() == [["db/password", ";touch", str(pwned), f"$(touch {pwned})", "|",
                                 "touch", str(pwned)]]


def test_every_secrets_command_has_help(cli):
    for argv in (["secrets"], ["secrets", "set-command"], ["secrets", "show"],
                 ["secrets", "test"], ["secrets", "off"]):
        proc = cli(*argv, "--help", check=0)
        assert "usage: overlord " + " ".join(argv) in proc.out
    text = cli("secrets", "--help", check=0).out
    assert "secrets.json" in text and "docs/VAULT.md" in text
