"""trust/vault.py in this process, against a real resolver script: references, the command's
checks, the run (no shell, one argument, stdin closed, caps, timeout), the cache, the audit
lines (never a value, never stderr) and secrets.json's discipline."""
import json
import os
import stat
import threading

import pytest

from vaultlib import VALUES, assert_nowhere, audit_lines, resolver  # noqa: F401
from overlord.errors import OverlordError, UsageError
from overlord.trust import vault


@pytest.fixture(autouse=True)
def fresh(home):
    vault.forget()
    yield
    vault.forget()


@pytest.fixture
def ready(home, resolver):
    vault.set_command(resolver.command)
    yield resolver
    assert_nowhere(home)


@pytest.mark.parametrize("value,name", [
    ("secret://db/password", "db/password"), ("secret://a", "a"),
    ("secret://A-Z_0.9/x-y", "A-Z_0.9/x-y"), ("secret://providers/anthropic", "providers/anthropic"),
    ("secret://a/./b", "a/./b"), ("secret://" + "n" * 256, "n" * 256)])
def test_a_whole_reference(value, name):
    assert vault.is_ref(value) and vault.ref_name(value) == name


@pytest.mark.parametrize("value", [
    "Bearer secret://x", "secret://", "secret:///etc/passwd", "secret://../x", "secret://a/../b",
    "secret://a/..", "secret://a b", "secret://x;touch y", "secret://$(id)", "secret://a\nb",
    "secret://-rf", "secret://" + "n" * 257, "SECRET://x", " secret://x", "secret://x ",
    "secret://é", "secret://a\\b", None, 7, ""])
def test_not_a_reference(value):
    assert not vault.is_ref(value)


def test_a_value_that_is_not_a_reference_is_returned_as_it_is_and_runs_nothing(ready):
    for value in ("plain-key", "Bearer secret://db/password", "x secret://db/password", ""):
        assert vault.resolve(value, "test") == value
    assert ready.calls() == []


def test_a_malformed_reference_is_refused_not_passed_on(ready):
    for value in ("secret://../etc/passwd", "secret://a b", "secret://x;touch y", "secret://"):
        with pytest.raises(OverlordError) as e:
            vault.resolve(value, "test")
        assert "not a valid secret reference" in str(e.value)
    assert ready.calls() == []


def test_resolve_runs_the_command_with_the_name_as_one_argument(ready):
    assert vault.resolve("secret://db/password", "test") == VALUES["db/password"]
    assert ready.calls() == [["db/password"]]


def test_name_inside_an_argument_is_still_one_argument_never_split(home, resolver):
    vault.set_command(f"{resolver.script} 'the {{name}} here' extra")
    resolver.put("the db/password here", "inside\n")       # what the program gets as argv[1]
    assert vault.resolve("secret://db/password", "test") == "inside"
    assert resolver.calls() == [["the db/password here", "extra"]]


def test_one_trailing_newline_is_stripped_and_no_more(ready):
    ready.put("nl/two", "two\n\n")
    ready.put("nl/crlf", "crlf\r\n")
    ready.put("nl/none", "none")
    ready.put("nl/inner", " spaced value \n")
    assert vault.resolve("secret://nl/two", "t") == "two\n"
    assert vault.resolve("secret://nl/crlf", "t") == "crlf"
    assert vault.resolve("secret://nl/none", "t") == "none"
    assert vault.resolve("secret://nl/inner", "t") == " spaced value "


@pytest.mark.parametrize("name,data,reason,words", [
    ("bad/empty", b"", "empty", "printed nothing"),
    ("bad/newline", b"\n", "empty", "printed nothing"),
    ("bad/nul", b"a\x00b\n", "nul", "NUL"),
    ("bad/latin1", b"caf\xe9\n", "not-utf8", "not UTF-8"),
    ("bad/missing", None, "exit 3", "exited 3 (no secret named bad/missing)"),
    ("act/huge", None, "too-long", "more than 64 KiB"),
    ("act/killed", None, "exit -9", "killed by signal 9"),
])
def test_a_failing_resolver_is_a_clean_error_naming_the_reference(ready, home, name, data,
                                                                 reason, words):
    if data is not None:
        ready.put(name, data)
    with pytest.raises(OverlordError) as e:
        vault.resolve(f"secret://{name}", "test")
    msg = str(e.value)
    assert msg.startswith(f"secret://{name}: ") and words in msg and "\n" not in msg
    last = audit_lines(home, "secret.resolve")[-1]
    assert last["name"] == name and last["ok"] is False and last["reason"] == reason
    # never cached: the next use runs it again
    before = len(ready.calls())
    with pytest.raises(OverlordError):
        vault.resolve(f"secret://{name}", "test")
    assert len(ready.calls()) == before + 1


def test_stderr_reaches_the_message_capped_and_escaped_never_the_audit_line(ready, home):
    with pytest.raises(vault.VaultError) as e:
        vault.resolve("secret://act/leaky", "test")
    msg = str(e.value)
    assert msg == ("secret://act/leaky: the resolver exited 4 "
                   "(denied: the value would have been LEAKY-STDERR-9d8c7b)")
    assert "LEAKY" not in e.value.short and "second line" not in msg
    assert "LEAKY" not in (home / "audit.jsonl").read_text()
    assert_nowhere(home, extra=["LEAKY-STDERR"])


def test_a_resolver_that_hangs_is_killed_at_the_timeout(ready, monkeypatch):
    monkeypatch.setattr(vault, "TIMEOUT", 1.0)
    import time
    start = time.monotonic()
    with pytest.raises(OverlordError, match=r"^secret://act/slow: the resolver did not answer "
                                            r"within 1 s$"):
        vault.resolve("secret://act/slow", "test")
    assert time.monotonic() - start < 5


def test_the_resolver_gets_stdin_closed_and_our_environment(home, tmp_path, monkeypatch):
    probe = tmp_path / "probe.py"
    import sys
    probe.write_text(f"#!{sys.executable}\nimport os, sys\n"
                     "data = sys.stdin.read()\n"
                     "print(f\"stdin={len(data)} env={os.environ.get('VAULT_ADDR_TEST')}\")\n")
    probe.chmod(0o755)
    monkeypatch.setenv("VAULT_ADDR_TEST", "http://vault.example:8200")
    vault.set_command(f"{probe} {{name}}", ttl=0)
    assert vault.resolve("secret://x", "t") == "stdin=0 env=http://vault.example:8200"


# -- the cache --------------------------------------------------------------------------------

def test_two_uses_within_the_ttl_run_the_command_once_and_audit_once(ready, home):
    for _ in range(3):
        assert vault.resolve("secret://db/password", "use") == VALUES["db/password"]
    assert len(ready.calls()) == 1
    lines = audit_lines(home, "secret.resolve")
    assert len(lines) == 1
    assert {k: lines[0][k] for k in ("name", "what", "ok")} == \
        {"name": "db/password", "what": "use", "ok": True}
    assert "reason" not in lines[0] and VALUES["db/password"] not in json.dumps(lines)


def test_ttl_zero_runs_every_time(home, resolver):
    vault.set_command(resolver.command, ttl=0)
    vault.resolve("secret://db/password", "use")
    vault.resolve("secret://db/password", "use")
    assert len(resolver.calls()) == 2
    assert len(audit_lines(home, "secret.resolve")) == 2


def test_a_cached_value_expires_after_its_ttl(home, resolver, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(vault, "_clock", lambda: now[0])
    vault.set_command(resolver.command, ttl=60)
    vault.resolve("secret://db/password", "use")
    now[0] += 59.9
    vault.resolve("secret://db/password", "use")
    assert len(resolver.calls()) == 1
    now[0] += 0.2
    resolver.put("db/password", "rotated-Value-9911\n")
    assert vault.resolve("secret://db/password", "use") == "rotated-Value-9911"
    assert len(resolver.calls()) == 2
    assert_nowhere(home, extra=["rotated-Value-9911"])


def test_a_new_command_forgets_what_the_old_one_gave(home, resolver, tmp_path):
    vault.set_command(resolver.command)
    vault.resolve("secret://db/password", "use")
    vault.set_command(f"{resolver.script} {{name}} again")
    vault.resolve("secret://db/password", "use")
    assert resolver.calls() == [["db/password"], ["db/password", "again"]]


def test_fetch_fresh_skips_the_cache(ready):
    vault.resolve("secret://db/password", "use")
    vault.fetch("db/password", "test", fresh=True)
    assert len(ready.calls()) == 2


def test_concurrent_uses_of_one_name_run_it_once(ready):
    got, barrier = [], threading.Barrier(8)

    def use():
        barrier.wait()
        got.append(vault.resolve("secret://db/password", "use"))
    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [VALUES["db/password"]] * 8 and len(ready.calls()) == 1


def test_lookup_without_a_resolver_is_none_and_resolve_says_how_to_set_one(home, resolver):
    assert vault.lookup("providers/anthropic", "key") is None
    with pytest.raises(OverlordError, match=r"^secret://db/password: no resolver is configured; "
                                            r"run `overlord secrets set-command"):
        vault.resolve("secret://db/password", "use")
    assert resolver.calls() == []


# -- the configuration ------------------------------------------------------------------------

def test_set_command_writes_a_private_file_with_the_parsed_argv(home, resolver):
    old = os.umask(0)
    try:
        shown = vault.set_command(f"{resolver.script} --field 'a b' {{name}}", ttl=30)
    finally:
        os.umask(old)
    path = home / "secrets.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "command": [str(resolver.script), "--field", "a b", "{name}"], "ttl": 30}
    assert shown["program"] == "resolve.py" and shown["ttl"] == 30 and shown["configured"]


def test_a_relative_program_path_is_made_absolute(home, resolver, monkeypatch):
    monkeypatch.chdir(resolver.dir)
    vault.set_command("./resolve.py {name}")
    assert vault.show()["command"][0] == str(resolver.script)


def test_secret_config_records_the_program_and_the_argument_count_only(home, resolver):
    vault.set_command(f"{resolver.script} --token=tok-InArgv-55e1 {{name}}", ttl=10)
    vault.off()
    acts = audit_lines(home, "secret.config")
    assert [(a["op"], a.get("program"), a.get("args"), a.get("ttl")) for a in acts] == [
        ("set-command", "resolve.py", 2, 10), ("off", None, None, None)]
    assert "tok-InArgv" not in (home / "audit.jsonl").read_text()


@pytest.mark.parametrize("cmd,exc,words", [
    ("", UsageError, "is empty"),
    ("   ", UsageError, "is empty"),
    ("pass show", UsageError, "has no {name}"),
    ("nosuch-program-xyz {name}", OverlordError, "not found on PATH"),
    ("/nonexistent/bin/tool {name}", OverlordError, "does not exist"),
    ("{name} x", UsageError, "cannot be {name}"),
    ("pass 'unclosed {name}", UsageError, "cannot parse"),
    ("pass show '' {name}", UsageError, "empty argument"),
])
def test_a_bad_command_is_refused_and_nothing_is_written(home, cmd, exc, words):
    with pytest.raises(exc) as e:
        vault.set_command(cmd)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (home / "secrets.json").exists() and audit_lines(home) == []


def test_a_program_that_is_not_executable_is_refused(home, resolver):
    resolver.script.chmod(0o644)
    with pytest.raises(OverlordError, match="is not executable"):
        vault.set_command(resolver.command)


@pytest.mark.parametrize("ttl", [-1, "x", "1.5", 10 ** 9])
def test_a_bad_ttl_is_refused(home, resolver, ttl):
    with pytest.raises(UsageError):
        vault.set_command(resolver.command, ttl=ttl)
    assert not (home / "secrets.json").exists()


def test_a_program_gone_since_set_command_is_a_clean_error_at_use(ready):
    ready.script.unlink()
    with pytest.raises(OverlordError, match=r"^secret://db/password: cannot run the resolver: "
                                            r"the program .*resolve.py does not exist$"):
        vault.resolve("secret://db/password", "use")


def test_a_readable_or_damaged_secrets_file_is_refused(home, resolver):
    vault.set_command(resolver.command)
    path = home / "secrets.json"
    path.chmod(0o644)
    with pytest.raises(OverlordError, match="chmod 600"):
        vault.resolve("secret://db/password", "use")
    path.chmod(0o600)
    for bad in ("{", '{"command": "pass {name}"}', '{"command": ["pass"]}',
                '{"command": ["p", "{name}"], "ttl": -4}', "[]"):
        path.write_text(bad)
        with pytest.raises(OverlordError, match="damaged"):
            vault.resolve("secret://db/password", "use")
    assert resolver.calls() == []


def test_off_removes_the_resolver_and_references_stop_resolving(ready, home):
    vault.resolve("secret://db/password", "use")
    assert vault.off() is True and vault.off() is False
    assert not (home / "secrets.json").exists()
    with pytest.raises(OverlordError, match="no resolver is configured"):
        vault.resolve("secret://db/password", "use")       # the cache went with it


def test_a_damaged_file_is_replaced_by_set_command_and_removed_by_off(home, resolver):
    path = home / "secrets.json"
    path.write_text("{")
    path.chmod(0o644)
    vault.set_command(resolver.command)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and vault.show()["configured"]
    path.write_text("[]")
    assert vault.off() is True and not path.exists()
