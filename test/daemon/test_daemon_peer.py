"""The daemon as another user meets it: refused on connect (SO_PEERCRED) even past the file
mode, and never able to connect at any moment while the socket is being made.

Both tests need root, to be uid 65534 in a forked child (CI's root run has it); they skip
otherwise. The socket lives in a world-traversable directory, so only what the daemon does
stands between that user and it.
"""
import json
import os
import select
import shutil
import socket
import tempfile
import time

import pytest

from conftest import Daemon

NOBODY = 65534

pytestmark = [pytest.mark.second_user,      # CI's ordinary-user pass deselects these
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a child becomes uid 65534")]


@pytest.fixture
def shared():
    path = tempfile.mkdtemp(prefix="overlordd-peer-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(work):
    """Fork; in the child become uid/gid 65534 and run work(report), which may call
    report(obj) once. Returns (pid, read end); collect() reads the report."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                # only os, socket and json from here on
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = work()
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            out = {"error": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    return pid, r


def collect(child, timeout=120):
    pid, r = child
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, 9)
            pytest.fail("the uid-65534 child did not report")
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _talk(path):
    """Connect to path as this user and read until the daemon closes: (lines, error)."""
    def work():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        try:
            s.connect(path)
        except OSError as exc:
            return {"connect_errno": exc.errno}
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
        return {"lines": [json.loads(line) for line in data.splitlines()]}
    return work


def test_another_uid_is_refused_with_403_and_the_owner_is_served_on(home, shared):
    d = Daemon(home, os.path.join(shared, "d.sock")).start()
    try:
        first = collect(as_nobody(_talk(d.socket)))
        assert first == {"connect_errno": 13}, first        # EACCES: the 0600 file mode
        os.chmod(d.socket, 0o666)                           # out of the way: the peer check
        refused = collect(as_nobody(_talk(d.socket)))
        assert "lines" in refused, refused
        [line] = refused["lines"]                           # one line, then the close
        assert line["ok"] is False and line["code"] == 403 and line["id"] is None
        assert str(NOBODY) in line["error"]
        assert d.ok({"op": "ping"})["pid"] == d.proc.pid    # its owner is served on
        assert any(f"refused a connection from uid {NOBODY}" in x for x in d.log), d.log
    finally:
        d.stop()


def test_no_moment_at_which_another_uid_can_connect_while_the_daemon_starts(home, shared):
    path = os.path.join(shared, "d.sock")
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)     # one it may connect to
    control.bind(os.path.join(shared, "control.sock"))
    os.chmod(os.path.join(shared, "control.sock"), 0o666)
    control.listen(8)
    stop_r, stop_w = os.pipe()

    def spin():
        os.close(stop_w)                                         # the parent's, to end us
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(shared, "control.sock"))          # the child can connect here
        s.close()
        attempts, got, seen = 0, [], set()
        while not select.select([stop_r], [], [], 0)[0]:
            candidates = [path] + [os.path.join(shared, n, "s") for n in os.listdir(shared)
                                   if n.startswith(".overlordd-")]
            for where in candidates:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(where)
                    got.append(where)
                except OSError as exc:
                    seen.add(exc.errno)
                finally:
                    s.close()
                attempts += 1
        return {"attempts": attempts, "got": got, "errnos": sorted(seen)}

    child = as_nobody(spin)
    os.close(stop_r)
    try:
        d = Daemon(home, path)
        for _ in range(12):
            d.start()
            assert os.stat(path).st_mode & 0o777 == 0o600
            d.stop()
    finally:
        os.close(stop_w)
        result = collect(child)
        control.close()
    assert "error" not in result, result
    assert result["got"] == [], result
    assert result["attempts"] > 100, result
    assert 13 in result["errnos"], result        # it did meet the socket (EACCES), not only ENOENT
    assert not any("refused a connection" in x for x in d.log), d.log
