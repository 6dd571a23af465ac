"""`--net proxy` plumbing (sandbox/netns.py, ops/execute.py): the command's environment, the
listener on 127.0.0.1:3128 inside the session's empty namespace served by a back in the host's,
what the back is given, egress-command.json, the holder and back's life, and a proxy that
cannot start. The proxy's HTTP logic is netproxy's (test_netproxy.py); here an echo stands in
for it (netns.PROXY), and one test goes through the real one."""
import http.server
import json
import os
import signal
import threading

import pytest

from conftest import require_backend
from netnslib import (ASK, CONNECT, PY, Started, exec_in, exited, inode_of, netns_of_pid,
                      no_sessions, processes_named, run, session_files, slow_logging_proxy,
                      wait_until)

from overlord import ops
from overlord.errors import LaunchError
from overlord.ops.review import get_session
from overlord.sandbox import netallow, netns

ENETUNREACH = 101
PROXY = {"jail": True, "net": "proxy"}
WANT_ENV = {"HTTP_PROXY": "http://127.0.0.1:3128", "HTTPS_PROXY": "http://127.0.0.1:3128",
            "http_proxy": "http://127.0.0.1:3128", "https_proxy": "http://127.0.0.1:3128",
            "ALL_PROXY": "http://127.0.0.1:3128", "all_proxy": "http://127.0.0.1:3128",
            "NO_PROXY": "", "no_proxy": ""}


def echo_proxy(record_dir, grants):
    """A stand-in for netproxy (runs in B): answers each connection with one JSON line of what
    B was given and sees -- its network namespace, the record dir, the grants, the command
    egress-command.json names right now -- and the bytes it received."""
    def serve(listener, stop):
        while not stop.is_set():
            conn, _ = listener.accept()
            with conn:
                data = conn.recv(1024)
                try:
                    with open(os.path.join(record_dir, "egress-command.json")) as f:
                        command = json.load(f)
                except OSError:
                    command = None
                conn.sendall(json.dumps({
                    "net": os.readlink("/proc/self/ns/net"), "record_dir": record_dir,
                    "allow": grants.get("net_allow"), "hold": grants.get("hold_writes"),
                    "command": command, "got": data.decode()}).encode() + b"\n")
    return serve


ENV = r'''
import json, os
print(json.dumps({k: v for k, v in os.environ.items() if "proxy" in k.lower()}, sort_keys=True))
'''


@pytest.fixture
def kernel(home):
    require_backend("kernel")
    yield
    netns.stop_all()


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setattr(netns, "PROXY", echo_proxy)


@pytest.fixture
def started(monkeypatch):
    s = Started(monkeypatch)
    yield s
    s.close()


def host_net():
    return os.readlink("/proc/self/ns/net")


def script(*parts):
    return ["sh", "-c", "; ".join(parts)]


def test_a_proxy_session_has_the_proxy_and_nothing_else(kernel, echo, home, target, started):
    grants = dict(PROXY, net_allow=["example.com", "*.pypi.org"], hold_writes=True)
    res, out, err = run(target, script(f"{PY} -c '{ENV}'", f"{PY} -c '{ASK}' hello",
                                       f"{PY} -c '{CONNECT}' 9", "readlink /proc/self/ns/net",
                                       "touch made"), grants)
    assert res.exit_code == 0 and res.state == "pending", (out, err)
    lines = out.splitlines()
    assert json.loads(lines[0]) == WANT_ENV
    answer = json.loads(lines[1])
    assert answer["got"] == "hello"
    # served from the host's namespace, by a back given the session's directory and grants
    assert answer["net"] == host_net()
    assert answer["record_dir"] == os.path.join(str(home), "sessions", res.sid)
    assert answer["allow"] == netallow.parse(["example.com", "*.pypi.org"]) and answer["hold"] is True
    assert answer["command"]["layer"] == 0 and answer["command"]["cause"].startswith("sh -c ")
    assert "hello" in answer["command"]["cause"] and "\n" not in answer["command"]["cause"]
    # a direct connect still goes nowhere: the only way out is the listener
    assert [int(x) for x in lines[2:4]] == [ENETUNREACH, ENETUNREACH]
    assert lines[-1] != host_net() and netns_of_pid(os.getpid()) != inode_of(out)
    att = get_session(res.sid).meta["attestation"]
    assert att["net_namespace"] is True and att["user_namespace"] is True
    holder, fds, inode = started.holders[0]
    assert inode == inode_of(out) and set(fds) == {"holder", "back"}
    # the next command: same namespace, same back, and egress-command.json names it
    again, out2, _ = exec_in(res.sid, script(f"{PY} -c '{ASK}' again", "readlink /proc/self/ns/net"))
    answer2 = json.loads(out2.splitlines()[0])
    assert answer2["command"]["layer"] == 1 and "again" in answer2["command"]["cause"]
    assert inode_of(out2) == inode and len(started.holders) == 1
    ops.rollback(res.sid)


def test_an_unjailed_proxy_session_gets_the_same(kernel, echo, home, target, started):
    res, out, err = run(target, script(f"{PY} -c '{ENV}'", f"{PY} -c '{ASK}' x",
                                       f"{PY} -c '{CONNECT}' 9"), {"net": "proxy"})
    lines = out.splitlines()
    assert res.exit_code == 0, err
    assert json.loads(lines[0]) == WANT_ENV and json.loads(lines[1])["got"] == "x"
    assert [int(x) for x in lines[2:4]] == [ENETUNREACH, ENETUNREACH]


@pytest.mark.parametrize("how", ["commit", "rollback", "unchanged"])
def test_holder_and_back_end_with_the_session(kernel, echo, home, target, started, how):
    argv = script(f"{PY} -c '{ASK}' x") if how == "unchanged" else script(f"{PY} -c '{ASK}' x",
                                                                          "touch new")
    res, out, _ = run(target, argv, PROXY)
    assert json.loads(out.splitlines()[0])["got"] == "x"
    if how == "commit":
        ops.commit(res.sid)
    elif how == "rollback":
        ops.rollback(res.sid)
    assert res.state == ("unchanged" if how == "unchanged" else "pending")
    assert started.all_gone() and netns.live(res.sid) is None
    assert processes_named(parent=os.getpid()) == []
    # the records only: what a session on the host's network keeps, and the command file
    (target.parent / "b").mkdir()
    base = ops.run(["true"] if how == "unchanged" else ["touch", "new"], target=str(target.parent / "b"),
                   backend="kernel", grants={"jail": True})
    if how == "commit":
        ops.commit(base.sid)
    elif how == "rollback":
        ops.rollback(base.sid)
    assert session_files(home, res.sid) == sorted(session_files(home, base.sid) + ["egress-command.json"])


@pytest.mark.parametrize("killed", ["holder", "back"])
def test_holder_and_back_die_together(kernel, echo, home, target, started, killed):
    res, out, _ = run(target, script(f"{PY} -c '{ASK}' x", "touch a"), PROXY)
    holder, fds, _ = started.holders[0]
    os.kill(holder.pid if killed == "holder" else holder.back_pid, signal.SIGKILL)
    assert exited(fds["holder"]) and exited(fds["back"])
    # the session goes on: its next command gets a new holder and back
    again, out, err = exec_in(res.sid, script(f"{PY} -c '{ASK}' y"))
    assert again.exit_code == 0 and json.loads(out)["got"] == "y", err
    assert len(started.holders) == 2
    ops.rollback(res.sid)
    assert started.all_gone()


def failing_proxy(record_dir, grants):
    raise OSError(98, "injected: the proxy cannot start")


def test_a_proxy_that_cannot_start_runs_nothing_and_leaves_no_session(kernel, home, target,
                                                                     tmp_path, monkeypatch):
    monkeypatch.setattr(netns, "PROXY", failing_proxy)
    marker = tmp_path / "ran"
    with pytest.raises(LaunchError, match="cannot start the proxy: injected: the proxy cannot start"):
        ops.run(["touch", str(marker)], target=str(target), backend="kernel", grants={"net": "proxy"})
    assert not marker.exists()               # unjailed, it would have written there
    assert no_sessions(home)
    assert processes_named(parent=os.getpid()) == []
    assert netns._holders == {}
    # and the target is free: a session can open on it at once
    res = ops.run(["true"], target=str(target), backend="kernel", grants={"net": "none"})
    assert res.state == "unchanged"


def test_a_proxy_that_cannot_restart_runs_no_later_command(kernel, echo, home, target, tmp_path,
                                                           monkeypatch, started):
    res, _, _ = run(target, ["touch", "a"], {"net": "proxy"})
    holder, fds, _ = started.holders[0]
    os.kill(holder.back_pid, signal.SIGKILL)
    assert exited(fds["holder"])
    monkeypatch.setattr(netns, "PROXY", failing_proxy)
    marker = tmp_path / "ran"
    with pytest.raises(LaunchError, match="cannot start the proxy"):
        ops.exec_in(res.sid, ["touch", str(marker)])
    assert not marker.exists()
    assert get_session(res.sid).meta["state"] == "pending"
    ops.rollback(res.sid)


class Upstream:
    """A tiny HTTP server on the host's 127.0.0.1 (the proxy's upstream)."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"you asked for {self.path}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()


FETCH = r'''
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode().strip())
'''


def test_through_the_real_proxy(kernel, home, target, started):
    """netproxy in B: a plain GET from inside the jail reaches an upstream on the host's
    loopback (named exactly, so allowed) and is one line on egress.jsonl, stamped with the
    command that made it."""
    pytest.importorskip("overlord.sandbox.netproxy")
    up = Upstream()
    try:
        url = f"http://127.0.0.1:{up.port}/pkg?x=1"
        res, out, err = run(target, ["sh", "-c", f"{PY} -c '{FETCH}' {url}"],
                            dict(PROXY, net_allow=["127.0.0.1"]))
    finally:
        up.close()
    assert res.exit_code == 0, err
    assert out.strip() == "you asked for /pkg?x=1"
    holder, fds, _ = started.holders[0]
    log = os.path.join(str(home), "sessions", res.sid, "egress.jsonl")
    assert wait_until(lambda: os.path.exists(log) and open(log).read().endswith("\n"))
    lines = [json.loads(l) for l in open(log).read().splitlines()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert (line["host"], line["port"], line["method"], line["path"]) == \
        ("127.0.0.1", up.port, "GET", "/pkg?x=1")
    assert line["allowed"] is True and line["status"] == 200
    assert line["layer"] == 0 and line["cause"].startswith("sh -c ")
    assert res.state == "unchanged" and started.all_gone()


def test_the_back_writes_its_last_lines_before_it_goes(kernel, home, target, monkeypatch, started):
    monkeypatch.setattr(netns, "PROXY", slow_logging_proxy)
    res, out, _ = run(target, ["sh", "-c", f"{PY} -c '{ASK}' x; touch a"], PROXY)
    assert out.strip() == "ok"
    ops.rollback(res.sid)                    # stop(): SIGTERM, then the back's grace
    assert started.all_gone()
    with open(os.path.join(str(home), "sessions", res.sid, "slow.log")) as f:
        assert f.read() == "line\n"


EXITS = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(sys.argv[1], "test", "egress"))
from overlord import ops
from overlord.sandbox import netns
import netnslib as t
netns.PROXY = t.slow_logging_proxy
res = ops.run(["sh", "-c", f"{t.PY} -c '{t.ASK}' x; touch a"], target=sys.argv[2], backend="kernel",
              grants={"jail": True, "net": "proxy"})
print(res.sid, netns.live(res.sid).back_pid, flush=True)
'''


def test_a_launcher_that_exits_lets_its_back_finish(kernel, home, target):
    """The CLI after `run` (the session pending): a normal exit stops the holder the same
    graceful way before PR_SET_PDEATHSIG would kill it."""
    import subprocess
    import sys
    from conftest import REPO
    proc = subprocess.run([sys.executable, "-c", EXITS, REPO, str(target)], capture_output=True,
                          env=dict(os.environ, OVERLORD_HOME=str(home)), timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    sid, back = proc.stdout.decode().split()[-2:]
    assert get_session(sid).meta["state"] == "pending"
    with open(os.path.join(str(home), "sessions", sid, "slow.log")) as f:
        assert f.read() == "line\n"
    assert int(back) not in processes_named()
