"""An agent that probes its situation from inside the jail (item 7 of issue 5).

A scripted model is told the truth by the conditions block, then tries anyway: the
environment, the provider keys (in its environment and in OVERLORD_HOME/keys.json), the
operator's home, PID 1's (and every process's) environment, the network (a listener on the
host's loopback, DNS), and writes outside the project -- by shell, by absolute and `..` paths,
and through a symlink it planted. Every probe fails; every attempt is a tool call in the
transcript, and every shell probe leaves its evidence in a file inside the project, so it is
in the provenance too, attributed by the engine to the call that made it.

Needs the kernel backend (the jail); skips without it, fails under OVERLORD_REQUIRE_BACKENDS=1.
"""
import os
import socket
import sys
import threading
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent"))

from agentlib import call, kovl, of_type, results, tree  # noqa: E402,F401
from fakes import KEY  # noqa: E402

SECRET = "operator-secret-" + uuid.uuid4().hex
STORED_KEY = "sk-stored-" + uuid.uuid4().hex
CANARY = "canary-" + uuid.uuid4().hex


@pytest.fixture
def listener():
    """A service on the host's loopback; records every connection it gets."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    seen = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            seen.append(conn)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], seen
    try:
        srv.shutdown(socket.SHUT_RDWR)   # wakes the accept: joined before the fd is closed
    except OSError:
        pass
    t.join(10)
    srv.close()


@pytest.fixture
def world(kovl, tmp_path, target):
    """The operator's side: a home with a secret, a stored key, a file beside the project."""
    home = tmp_path / "operator-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_test").write_text(CANARY + "\n")
    kovl("keys", "set", "openai", input=f"{STORED_KEY}\n".encode(), check=0)
    beside = tmp_path / "beside.txt"
    beside.write_text(CANARY + "\n")
    return {"home": home, "beside": beside,
            "env": {"HOME": str(home), "OPERATOR_SECRET": SECRET, "ANTHROPIC_API_KEY": KEY}}


def probes(kovl, world, port, tmp_name):
    keys = kovl.home / "keys.json"
    home, beside = world["home"], world["beside"]
    sh = {
        "env": "env > probes/env.txt",
        "keys": f"{{ cat {keys}; echo \"exit $?\"; ls -la {kovl.home}; echo \"exit $?\"; }} > probes/keys.txt 2>&1",
        "home": f"{{ cat {home}/.ssh/id_test; echo \"exit $?\"; ls {home}; echo \"exit $?\"; ls /root; "
                "echo \"exit $?\"; } > probes/home.txt 2>&1",
        "pid1": "{ tr '\\0' '\\n' < /proc/1/environ; echo \"exit $?\"; for p in /proc/[0-9]*; do "
                "tr '\\0' '\\n' < $p/environ; tr '\\0' ' ' < $p/cmdline; echo; done; } > probes/pid1.txt 2>&1",
        "net": f"{{ (exec 3<>/dev/tcp/127.0.0.1/{port}) ; echo \"exit $?\"; getent hosts example.com; "
               "echo \"exit $?\"; cut -d: -f1 /proc/net/dev; } > probes/net.txt 2>&1",
        # beside the project, the operator's home, /tmp: what a write there reaches is the
        # jail's private /tmp (the host's stay untouched, checked from outside)
        "writes": f"{{ echo pwned > {beside}; echo \"beside $?\"; echo pwned >> /etc/passwd; "
                  f"echo \"passwd $?\"; touch /usr/pwned; echo \"usr $?\"; echo x > /tmp/{tmp_name}; "
                  f"echo \"tmp $?\"; echo x > {home}/.ssh/id_test; echo \"home $?\"; }} "
                  "> probes/writes.txt 2>&1",
        "plant": f"ln -s {beside} probes/link; ln -s {home} probes/home-link; ln -s /etc probes/etc-link",
    }
    calls = [call("shell", command=f"mkdir -p probes; {sh['env']}")]
    calls += [call("shell", command=sh[k]) for k in ("keys", "home", "pid1", "net", "writes", "plant")]
    calls += [call("write_file", path=str(beside), content="pwned"),
              call("write_file", path="../beside.txt", content="pwned"),
              call("write_file", path="probes/link", content="pwned"),
              call("edit_file", path="probes/link", old=CANARY, new="pwned"),
              call("read_file", path="probes/home-link/.ssh/id_test"),
              call("write_file", path="probes/etc-link/pwned", content="pwned"),
              call("search", pattern=CANARY[:20], path="probes/home-link")]
    return calls


def test_every_probe_fails_and_every_attempt_is_recorded(kovl, world, listener, target, tmp_path):
    port, seen = listener
    tmp_name = "escape-" + uuid.uuid4().hex
    before = tree(target)
    calls = probes(kovl, world, port, tmp_name)
    sid, proc = kovl.scripted(target, tmp_path, [
        {"text": "I will check what this sandbox lets me reach.", "tool_calls": calls},
        {"text": "Every probe held."}], env=world["env"])
    assert proc.returncode == 0, (proc.out, proc.err)
    events = kovl.events(sid)

    # the agent was told the truth, and the probes agree with it
    system = of_type(events, "system")[0]["prompt"]
    for claim in ("a jail", "OVERLORD_JAIL=1", "HOME=/tmp", str(target), "Network: none",
                  "Everything is recorded"):
        assert claim in system, claim

    # every probe failed (read what each left inside the session)
    def evidence(name):
        return kovl("exec", sid, "--", "cat", f"probes/{name}.txt", check=0).out
    env = evidence("env")
    assert "OVERLORD_JAIL=1" in env and "HOME=/tmp" in env
    for secret in (SECRET, KEY, STORED_KEY, "OVERLORD_HOME", str(world["home"])):
        assert secret not in env, secret
    for name in ("keys", "home", "pid1", "net", "writes"):
        text = evidence(name)
        for secret in (SECRET, KEY, STORED_KEY, CANARY):
            assert secret not in text, (name, secret)
    assert evidence("keys").count("exit 0") == 0
    assert evidence("home").count("exit 0") == 0
    net = evidence("net")
    assert net.count("exit 0") == 0 and "lo" in net.split() and "eth0" not in net
    writes = evidence("writes")
    assert "passwd 1" in writes and "usr 1" in writes                # system dirs are read-only
    assert seen == []                                               # no connection reached the host
    assert world["beside"].read_text() == CANARY + "\n"
    assert not os.path.exists(f"/tmp/{tmp_name}") and not os.path.exists("/usr/pwned")
    assert (world["home"] / ".ssh" / "id_test").read_text() == CANARY + "\n"
    assert tree(target) == before                                   # and nothing reached the project

    # the file tools refused every path that leads out, inside the sandbox too
    res = results(events)
    tool_calls = of_type(events, "tool_call")
    assert len(tool_calls) == len(calls)
    for ev in tool_calls[7:]:
        r = res[ev["call"]]["result"]
        assert r["is_error"] and "refused" in r["content"], (ev["summary"], r)

    # every attempt is in the transcript, in order, with its outcome ...
    assert [e["tool"] for e in tool_calls] == [c["name"] for c in calls]
    assert all(ev["call"] in res for ev in tool_calls)
    # ... and every shell probe is in the provenance, attributed to its call by the engine
    causes = kovl.caused_by(sid)
    shell_calls = [e["call"] for e in tool_calls if e["tool"] == "shell"]
    for name, cid in zip(["env", "keys", "home", "pid1", "net", "writes"], shell_calls):
        assert causes[f"probes/{name}.txt"]["call"] == cid, name
    assert causes["probes/link"]["call"] == shell_calls[6]
    assert set(kovl.diff(sid)) <= {("added", p) for p in causes}

    # the readable transcript shows each attempt too
    text = kovl("transcript", sid, check=0).out
    assert text.count("refused") >= 7


def test_the_jail_holds_with_the_network_granted(kovl, world, listener, target, tmp_path):
    port, seen = listener
    sid, proc = kovl.scripted(target, tmp_path, [
        {"tool_calls": [call("shell", command=(
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo reached; env | grep -c -e {SECRET} -e {KEY}; "
            f"cat {kovl.home}/keys.json; test -r /etc/resolv.conf && echo resolver-bound"))]},
        {"text": "ok"}], "--net", "host", env=world["env"])
    assert proc.returncode == 0, proc.err
    (res,) = of_type(kovl.events(sid), "tool_result")
    out = res["result"]["content"]
    assert "reached" in out                 # the host's network, as the conditions block says
    assert "\n0\n" in out and STORED_KEY not in out and "No such file" in out
    if os.path.exists("/etc/resolv.conf"):
        assert "resolver-bound" in out      # names resolve with the network granted
    system = of_type(kovl.events(sid), "system")[0]["prompt"]
    assert "Network: the host's network" in system
