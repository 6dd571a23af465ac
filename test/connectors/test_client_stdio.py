"""The stdio transport against servers that misbehave at the process and pipe level: one
that stops reading (a large argument, a flood of pings), floods its stderr, answers twice,
dies by a signal, or leaves children behind -- even after setsid(), even when we are the one
killed with SIGKILL."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from conftest import REPO
from connlib import alive, pid_in, until
from overlord.agent.cancel import Cancel, Cancelled
from overlord.agent.connectors import client
from overlord.agent.connectors.client import ConnectorError

FAKE = r"""
import json, os, signal, sys, time
mode, state = sys.argv[1], sys.argv[2]

def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n"); sys.stdout.flush()

def spawn(name, leave_group):
    pid = os.fork()
    if pid == 0:
        if leave_group:
            os.setsid()
        os.closerange(0, 3)
        time.sleep(120)
        os._exit(0)
    with open(os.path.join(state, name), "w") as f:
        f.write(str(pid))

if mode == "tree":
    spawn("group.pid", False)
    spawn("escaped.pid", True)
if mode == "stderr":
    for _ in range(8):
        os.write(2, b"E" * (1 << 20))
    os.write(2, b"\nSTDERR-END\n")
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)         # and stays on after its stdin closes
with open(os.path.join(state, "server.pid"), "w") as f:
    f.write(str(os.getpid()))
for line in sys.stdin:
    msg = json.loads(line)
    i, method = msg.get("id"), msg.get("method")
    if i is None:
        continue
    if method == "server/discover":
        send({"jsonrpc": "2.0", "id": i, "error": {"code": -32601, "message": "Method not found"}})
    elif method == "initialize":
        send({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "fake-" + mode}}})
        if mode == "deaf":
            time.sleep(120)                               # never reads its stdin again
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": i, "result": {"tools": [{"name": "t", "inputSchema": {}}]}})
    elif method == "tools/call":
        if mode == "pings":
            n = 0
            while True:                                   # a ping flood, never reading
                n += 1
                send({"jsonrpc": "2.0", "id": "p%d" % n, "method": "ping"})
        elif mode == "signal":
            os.kill(os.getpid(), signal.SIGKILL)
        for said in ("first", "second"):
            send({"jsonrpc": "2.0", "id": i, "result": {"content": [{"type": "text", "text": said}]}})
if mode == "stubborn":
    time.sleep(120)
"""


@pytest.fixture(scope="module")
def fake_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("stdio-fake") / "fake_server.py"
    path.write_text(FAKE)
    return path


def server(mode, script, state):
    return types.SimpleNamespace(name="fake", transport="stdio", command=sys.executable,
                                 args=[str(script), mode, str(state)], env={}, url=None,
                                 headers={})


@pytest.fixture
def fake(fake_script, tmp_path):
    """open_fake(mode) -> (client, log path); every client is closed at the end."""
    opened = []

    def open_fake(mode, **kw):
        log = tmp_path / f"{mode}.log"
        c = client.open(server(mode, fake_script, tmp_path), log=str(log), **kw)
        opened.append(c)
        return c, log
    yield open_fake
    for c in opened:
        c.close()


def in_thread(fn):
    """Run fn in a thread; (thread, box) -- box gets "result" or "error"."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
            box["error"] = exc
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, box


def test_a_large_argument_to_a_server_that_stops_reading_times_out_and_ends_the_connection(fake):
    c, log = fake("deaf")
    started = time.monotonic()
    with pytest.raises(ConnectorError, match=r"^connector fake: did not answer tools/call within "
                                             r"0\.5 s \(timed out\)$"):
        c.call_tool("t", {"what": "x" * (4 << 20)}, timeout=0.5)
    assert time.monotonic() - started < 3
    with pytest.raises(ConnectorError, match="stopped reading its input: a request timed out "
                                             "half-written"):
        c.call_tool("t", {})                  # dead to us: the caller reconnects
    assert "stopped reading its input" in log.read_text()
    started = time.monotonic()
    c.close()
    assert time.monotonic() - started < 5     # close() does not wait on the full pipe


def test_a_cancel_ends_a_call_stuck_writing_to_a_server_that_stopped_reading(fake):
    c, _ = fake("deaf")
    cancel = Cancel()
    worker, box = in_thread(lambda: c.call_tool("t", {"what": "x" * (4 << 20)}, timeout=60,
                                                cancel=cancel))
    worker.join(0.5)
    assert worker.is_alive()                  # the deaf server holds it...
    cancel.set()
    worker.join(1)                            # ...until the cancel, within a second
    assert not worker.is_alive() and isinstance(box.get("error"), Cancelled), box


def test_a_ping_flood_from_a_server_that_stops_reading_ends_the_connection(fake):
    c, log = fake("pings")
    started = time.monotonic()
    with pytest.raises(ConnectorError, match="^connector fake: stopped reading its input"):
        c.call_tool("t", {}, timeout=60)
    assert time.monotonic() - started < 30
    assert "MiB waiting): the connection is over" in log.read_text()


def test_a_servers_stderr_is_capped_in_the_log_and_never_blocks_it(fake):
    c, log = fake("stderr")                   # 8 MiB on stderr before it answers anything
    assert [t["name"] for t in c.list_tools()] == ["t"]
    c.close()
    text = log.read_text()
    assert len(text.encode()) < client.Log.STDERR_MAX + (64 << 10)
    assert text.startswith("E" * 1000)
    assert "its stderr filled this log's 1 MiB: the rest is dropped" in text
    assert "STDERR-END" not in text
    assert "connected: handshake 2025-11-25" in text       # our own lines still come


def test_the_first_answer_to_a_request_stands_and_the_second_is_logged(fake):
    c, log = fake("twice")
    for _ in range(5):
        assert c.call_tool("t", {}).text == "first"
    until(lambda: log.read_text().count("ignored") >= 5, "the second answers in the log")


def test_a_server_killed_by_a_signal_is_reported_so(fake):
    c, log = fake("signal")
    with pytest.raises(ConnectorError) as err:
        c.call_tool("t", {})
    assert str(err.value) == "connector fake: the server exited with status -9 (no answer)"


def test_close_ends_every_process_the_server_left_even_out_of_its_group(fake, tmp_path):
    c, _ = fake("tree")
    pids = [pid_in(tmp_path / name) for name in ("server.pid", "group.pid", "escaped.pid")]
    assert all(alive(p) for p in pids)
    c.close()
    until(lambda: not any(alive(p) for p in pids), "the server and both children to end", 3)


def test_a_hurried_close_ends_a_server_that_ignores_eof_and_sigterm_at_once(fake, tmp_path):
    """After a stop (a person waits at the prompt) close does not sit out the graces."""
    c, _ = fake("stubborn")
    pid = pid_in(tmp_path / "server.pid")
    started = time.monotonic()
    c.close(hurry=True)
    took = time.monotonic() - started
    assert took < 1.0, took
    until(lambda: not alive(pid), "the stubborn server to end", 3)


def test_a_server_we_cannot_start_is_a_clean_error(tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    nope = types.SimpleNamespace(name="nope", transport="stdio", command=str(script), args=[],
                                 env={}, url=None, headers={})
    with pytest.raises(ConnectorError, match=r"^connector nope: cannot start /.*: "
                                             r"Permission denied$"):
        client.open(nope)


DRIVER = r"""
import sys, time, types
sys.path.insert(0, sys.argv[1])
from overlord.agent.connectors import client
c = client.open(types.SimpleNamespace(name="fake", transport="stdio", command=sys.executable,
                                      args=sys.argv[2:], env={}, url=None, headers={}))
print("ready", flush=True)
time.sleep(120)
"""


def test_when_we_are_killed_the_server_and_all_it_left_end_too(fake_script, tmp_path):
    """SIGKILL leaves no chance to clean up: the supervisor's lifeline breaks instead."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, REPO, str(fake_script), "tree",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline() == "ready\n"
        pids = [pid_in(tmp_path / name) for name in ("server.pid", "group.pid", "escaped.pid")]
        assert all(alive(p) for p in pids)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        until(lambda: not any(alive(p) for p in pids), "the server's tree to end", 5)
    finally:
        driver.kill()
        driver.wait()
        for name in ("server.pid", "group.pid", "escaped.pid"):
            path = tmp_path / name
            if path.exists() and alive(int(path.read_text())):
                os.kill(int(path.read_text()), signal.SIGKILL)


def test_an_answer_read_before_its_request_was_all_written_is_ignored(fake):
    """A server cannot answer what it has not read: an answer that came in a read made before
    the request's last byte went out is forged early (a race the tests above cannot pin)."""
    from overlord.agent.connectors import stdio
    c, log = fake("twice")
    wire, slot = c._wire, stdio._Slot()
    with wire.lock:
        wire.pending[4242] = slot

    def answer(said, index):
        wire._line(json.dumps({"jsonrpc": "2.0", "id": 4242, "result": {"said": said}}).encode(),
                   index)
    try:
        answer("before it was written", 7)        # its request not written yet
        slot.after = 7
        answer("in the same read as the write", 7)
        assert slot.answer is None
        answer("after", 8)
        answer("a second one", 9)
    finally:
        with wire.lock:
            wire.pending.pop(4242, None)
    assert slot.answer["result"]["said"] == "after"
    text = log.read_text()
    assert text.count("answered request 4242 before it was sent (ignored)") == 2
    assert "answered request 4242 again: the first answer stands" in text
