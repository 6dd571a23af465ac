"""Red team, issue 16: the vault. A secret:// name reaches a command line; a secret value
passes through OVERLORD. Who chooses the argv, and where does the value end up?

The resolver here is a real script that logs its argv (one JSON line per run) and prints a
value derived from a random marker, so a grep of OVERLORD_HOME and of every output can tell
whether the value leaked.
"""
import json
import os
import stat
import sys
import time

import pytest

from conftest import Ovl

RESOLVER = r'''#!{py}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
name = sys.argv[-1]
mode = {mode!r}
if mode == "stderr":
    sys.stderr.write("STDERR-MARK diagnostics\n")
if mode == "fail":
    sys.stderr.write("STDERR-MARK it failed\n")
    sys.exit(3)
if mode == "hang":
    with open({log!r} + ".pid", "w") as f:
        f.write(str(os.getpid()))
    os.execvp("sleep", ["sleep", "600"])
print({value!r} + name)
'''


@pytest.fixture
def o(home):
    return Ovl(home)


@pytest.fixture
def vault(o, tmp_path):
    """make(mode="ok", extra_args="") -> (value prefix, argv log path)."""
    def make(mode="ok", template="{script} {{name}}", ttl=300):
        value = "VAL-" + os.urandom(8).hex() + "-"
        log = tmp_path / "argv.log"
        script = tmp_path / f"resolver-{mode}.py"
        script.write_text(RESOLVER.format(py=sys.executable, log=str(log), mode=mode, value=value))
        script.chmod(0o755)
        o("secrets", "set-command", template.format(script=script), "--ttl", str(ttl), check=0)
        return value, log
    return make


def runs(log):
    try:
        return [json.loads(x) for x in open(log) if x.strip()]
    except FileNotFoundError:
        return []


def grep_home(home, needle):
    hits = []
    for base, _, files in os.walk(home):
        for f in files:
            p = os.path.join(base, f)
            try:
                with open(p, "rb") as fh:
                    if needle.encode() in fh.read():
                        hits.append(os.path.relpath(p, home))
            except OSError:
                pass
    return hits


@pytest.mark.parametrize("name", ["a;touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a b",
                                  "../x", "a/../../b", "-rf", "/etc/passwd",
                                  "a\nb", "a\n", "x|y", "a'b", "", "." * 300])
def test_hostile_names_never_reach_the_resolver(o, vault, tmp_path, name):
    value, log = vault()
    proc = o("secrets", "test", name, cwd=tmp_path)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.err, proc.err
    assert runs(log) == []
    assert not (tmp_path / "PWNED").exists()


def test_a_name_is_exactly_one_argument(o, vault, tmp_path):
    value, log = vault(template="{script} --name=x{{name}}y {{name}}")
    proc = o("secrets", "test", "team/prod.db_pw-1", "--json", check=0)
    assert runs(log) == [["--name=xteam/prod.db_pw-1y", "team/prod.db_pw-1"]]
    assert json.loads(proc.out)["length"] == len(value + "team/prod.db_pw-1")
    assert value not in proc.out + proc.err


def test_set_command_takes_no_shell(o, tmp_path):
    """A command that would need a shell is one program with literal arguments."""
    proc = o("secrets", "set-command", f"sh -c 'touch {tmp_path}/PWNED' {{name}}", check=0)
    o("secrets", "test", "x")
    assert (tmp_path / "PWNED").exists() is True       # sh -c was asked for explicitly: fine
    (tmp_path / "PWNED").unlink()
    proc = o("secrets", "set-command", f"echo {{name}}; touch {tmp_path}/PWNED2")
    o("secrets", "test", "x")
    assert not (tmp_path / "PWNED2").exists()


def test_value_never_in_outputs_audit_or_home(o, vault, tmp_path):
    value, log = vault(mode="stderr")
    secret = value + "hooksig"
    outs = [o("secrets", "test", "hooksig", "--json", check=0),
            o("secrets", "test", "hooksig", check=0), o("secrets", "show", "--json", check=0),
            o("audit", "show", check=0)]
    for p in outs:
        assert secret not in p.out + p.err
    assert grep_home(o.home, value) == []
    assert grep_home(o.home, "STDERR-MARK") == []       # a resolver's stderr is not kept
    audit = [json.loads(x) for x in open(o.home / "audit.jsonl") if x.strip()]
    res = [a for a in audit if a["action"] == "secret.resolve"]
    assert res and all(a.get("name") == "hooksig" and a.get("ok") is True for a in res)


def test_failing_resolver_is_one_line_naming_the_reference(o, vault):
    value, log = vault(mode="fail")
    proc = o("secrets", "test", "db/pw")
    assert proc.returncode == 1
    lines = [ln for ln in proc.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "secret://db/pw" in lines[0] and "exit" in lines[0], proc.err
    audit = open(o.home / "audit.jsonl").read()
    assert "STDERR-MARK" not in audit


def test_hanging_resolver_is_killed_and_reported(o, vault, tmp_path):
    value, log = vault(mode="hang")
    t0 = time.monotonic()
    proc = o("secrets", "test", "slow", timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 1 and "secret://slow" in proc.err, proc.err
    assert took < 30
    pid = int(open(str(log) + ".pid").read())
    # the resolver (exec'd into sleep) is gone: killed with its group, and reaped
    assert not os.path.exists(f"/proc/{pid}") or \
        open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_a_reference_inside_a_longer_string_is_not_resolved(o, vault, tmp_path):
    """A webhook secret 'Bearer secret://x' is used as it is, never looked up."""
    value, log = vault()
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    got = []

    def serve():
        try:
            c, _ = srv.accept()
        except OSError:
            return
        data = b""
        while b"\r\n\r\n" not in data:
            data += c.recv(65536)
        got.append(data)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        c.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    o("webhooks", "add", "h", f"http://127.0.0.1:{port}/", "--format", "json", "--allow-private",
      "--secret-stdin", input=b"Bearer secret://hooksig\n", check=0)
    o("webhooks", "test", "h", check=0)
    t.join(10)
    try:
        srv.shutdown(socket.SHUT_RDWR)   # wakes an accept never connected: joined before close
    except OSError:
        pass
    t.join(10)
    srv.close()
    assert got and runs(log) == []


def test_resolver_config_others_can_read_is_refused(o, vault):
    value, log = vault()
    os.chmod(o.home / "secrets.json", 0o644)
    proc = o("secrets", "test", "x")
    assert proc.returncode == 1 and "secrets.json" in proc.err, proc.err
    assert runs(log) == []



def test_a_connector_the_policy_refuses_never_resolves_its_secret(o, vault, tmp_path, target):
    """mcp.json gives connector srv an env secret://tok; the folder's policy allows only
    `other`. `agent --connector srv` is refused before the server starts: the resolver is
    never run. (Positive control: with no rule, the CLI grant starts it and resolves.)"""
    value, log = vault()
    o("mcp", "add", "srv", "--command", "/bin/cat", "--env", "TOKEN=secret://tok", check=0)
    pol = tmp_path / "policy.json"
    pol.write_text(json.dumps({"targets": {str(target): {"connectors": ["other"]}}}))
    o("policy", "set", pol, check=0)
    env = {"ANTHROPIC_API_KEY": "dummy", "no_proxy": "*", "https_proxy": "", "http_proxy": ""}
    proc = o("agent", "-t", target, "--model", "claude-sonnet-4-5", "--connector", "srv", "hi",
             env=env)
    assert proc.returncode == 1 and "allows connectors" in proc.err, proc.err
    assert runs(log) == []
    o("mcp", "test", "srv")                       # the operator's own act: resolves (control)
    assert runs(log) == [["tok"]]


def test_resolver_stderr_is_not_kept_by_a_webhook(o, vault):
    value, log = vault(mode="fail")
    o("webhooks", "add", "h", "https://example.com/hook", "--format", "json", "--secret-stdin",
      input=b"secret://hooksig\n", check=0)
    o("webhooks", "test", "h")
    assert runs(log) == [["hooksig"]]                 # the resolver did run (and fail)
    assert grep_home(o.home, "STDERR-MARK") == []
