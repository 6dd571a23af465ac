"""The per-session network namespace (sandbox/netns.py, kernel.py): an empty namespace the
kernel enforces, one per session in a launching process and joined by every command, and a
holder that dies with the session, with its launching process, and leaves nothing behind."""
import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO, Ovl, require_backend
from netnslib import (CONNECT, PY, Started, exec_in, exited, inode_of, netns_of_pid,
                      no_sessions, processes_in, processes_named, reaped, run, session_files,
                      wait_until)

from overlord import ops
from overlord.errors import LaunchError, OverlordError
from overlord.sandbox import executor, netns

ROOT = os.geteuid() == 0
ENETUNREACH, ECONNREFUSED = 101, 111
OFFLINE = {"jail": True, "net": "none"}


@pytest.fixture
def kernel(home):
    require_backend("kernel")
    yield
    netns.stop_all()


@pytest.fixture
def started(monkeypatch):
    s = Started(monkeypatch)
    yield s
    s.close()


@pytest.fixture
def host_listener():
    """A listener on the host's 127.0.0.1 that must never see a connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def host_net():
    return netns_of_pid(os.getpid())


def meta(home, sid):
    with open(os.path.join(str(home), "sessions", sid, "meta.json")) as f:
        return json.load(f)


def no_connection(listener):
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


@pytest.mark.parametrize("jailed", [True, False], ids=["jail", "nojail"])
def test_offline_commands_reach_nothing(kernel, home, target, host_listener, jailed):
    port = host_listener.getsockname()[1]
    grants = {"jail": True, "net": "none"} if jailed else {"net": "none"}
    res, out, err = run(target, ["sh", "-c", f"readlink /proc/self/ns/net; {PY} -c '{CONNECT}' {port}"],
                        grants)
    assert res.exit_code == 0, (out, err)
    inode = inode_of(out)
    codes = [int(x) for x in out.split()[1:]]
    # outside IPv4 and IPv6: no route at all (the kernel says so); the host's loopback: the
    # session's own loopback, where nothing listens
    assert codes == [ENETUNREACH, ENETUNREACH, ECONNREFUSED], out
    assert no_connection(host_listener)
    assert inode != host_net()
    att = meta(home, res.sid)["attestation"]
    assert att["net_namespace"] is True and att["user_namespace"] is True, att
    assert att["pid_namespace"] is att["mount_namespace"] is True
    assert att["jail"] is jailed and att["ipc_namespace"] is jailed and att["uts_namespace"] is jailed
    assert int(att["status"]["CapEff"], 16) == 0 and att["status"]["Seccomp"] == "2"


def test_one_namespace_per_session(kernel, home, tmp_path, started):
    targets = []
    for name in ("t1", "t2"):
        (tmp_path / name).mkdir()
        targets.append(tmp_path / name)
    script = "readlink /proc/self/ns/net; echo x >> f"
    first, out1, _ = run(targets[0], ["sh", "-c", script], OFFLINE)
    again, out2, _ = exec_in(first.sid, ["sh", "-c", script])
    third, out3, _ = exec_in(first.sid, ["readlink", "/proc/self/ns/net"])
    other, out4, _ = run(targets[1], ["sh", "-c", script], OFFLINE)
    assert first.state == "pending" and again.layer == 1 and third.layer is None
    same = {inode_of(out1), inode_of(out2), inode_of(out3)}
    assert len(same) == 1, (out1, out2, out3)
    assert inode_of(out4) not in same and host_net() not in same | {inode_of(out4)}
    assert len(started.holders) == 2          # one holder per session, reused by its commands
    holder = netns.live(first.sid)
    assert holder is started.holders[0][0] and holder.alive()
    assert started.holders[0][2] == inode_of(out1)
    if ROOT:           # the holder is in the namespace the commands joined (and only it now)
        assert processes_in(inode_of(out1)) == [holder.pid]
    ops.rollback(first.sid)
    ops.rollback(other.sid)


def end_session(how, sid, target):
    if how == "commit":
        ops.commit(sid)
    elif how == "rollback":
        ops.rollback(sid)


def host_baseline(how, tmp_path):
    """The files a jailed session on the host's network keeps after the same end."""
    t = tmp_path / "baseline"
    t.mkdir()
    argv = ["true"] if how == "unchanged" else ["touch", "new"]
    res = ops.run(argv, target=str(t), backend="kernel", grants={"jail": True})
    end_session(how, res.sid, t)
    return res.sid


@pytest.mark.parametrize("how", ["commit", "rollback", "unchanged"])
def test_the_holder_ends_with_the_session(kernel, home, target, tmp_path, started, how):
    argv = ["readlink", "/proc/self/ns/net"]
    if how != "unchanged":
        argv = ["sh", "-c", "readlink /proc/self/ns/net; touch new"]
    res, out, _ = run(target, argv, OFFLINE)
    inode = inode_of(out)
    assert res.state == ("unchanged" if how == "unchanged" else "pending")
    if how != "unchanged":
        assert netns.live(res.sid) is not None
        end_session(how, res.sid, target)
    assert len(started.holders) == 1 and started.holders[0][2] == inode
    assert started.all_gone()                 # ended and reaped, by the time the call returned
    for holder, fds, _ in started.holders:
        assert exited(fds["holder"], 0)
    assert netns.live(res.sid) is None
    assert processes_in(inode) == []
    assert processes_named(parent=os.getpid()) == []
    base = host_baseline(how, tmp_path)
    assert session_files(home, res.sid) == session_files(home, base)
    if how == "commit":
        assert (target / "new").exists()


def test_a_timed_out_session_stops_its_holder_and_a_later_command_gets_its_own(kernel, home, target,
                                                                           started):
    res, out, _ = run(target, ["sh", "-c", "touch a; exec sleep 30"], dict(OFFLINE, timeout=0.5))
    assert res.state == "timed-out" and res.timed_out
    assert started.all_gone()
    assert netns.live(res.sid) is None
    again, out, _ = exec_in(res.sid, ["sh", "-c", "readlink /proc/self/ns/net; touch b"])
    assert again.exit_code == 0 and inode_of(out) != host_net()
    # a fresh holder for it, stopped again as the session (still timed out) is saved
    assert len(started.holders) == 2 and started.holders[1][2] != started.holders[0][2]
    assert started.all_gone() and netns.live(res.sid) is None
    ops.rollback(res.sid)


def test_a_holder_notices_its_session_ended_elsewhere(kernel, home, target, started):
    """The commit is made by another process (a second CLI, or the daemon's server while the
    holder lives in a launcher worker): the holder sees the record finished by itself."""
    res, _, _ = run(target, ["touch", "new"], OFFLINE)
    holder, fds, _ = started.holders[0]
    assert not exited(fds["holder"], 0)
    Ovl(home, "kernel")("commit", res.sid, check=0)
    assert exited(fds["holder"], netns.POLL * 10)
    assert wait_until(lambda: netns.live(res.sid) is None)     # reaped on the next look
    assert reaped(holder.pid)


def test_a_holder_whose_session_record_is_gone_ends(kernel, home, target, started):
    res, _, _ = run(target, ["touch", "new"], OFFLINE)
    _, fds, _ = started.holders[0]
    os.rename(os.path.join(str(home), "sessions", res.sid),
              os.path.join(str(home), "sessions-moved-away"))
    assert exited(fds["holder"], netns.POLL * 10)


KILLED = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
from overlord import ops
from overlord.sandbox import netns
res = ops.run(["true"], target=sys.argv[2], backend="kernel", grants={"jail": True, "net": "none"},
              close_if_unchanged=False)
holder = netns.live(res.sid)
print(holder.pid, flush=True)
# a command that runs in the namespace while we are killed; it says when it is there
ops.exec_in(res.sid, ["sh", "-c", "readlink /proc/self/ns/net; exec sleep 600"])
'''


def test_the_holder_dies_with_its_launching_process(kernel, home, target):
    proc = subprocess.Popen([sys.executable, "-c", KILLED, REPO, str(target)],
                            stdout=subprocess.PIPE, env=dict(os.environ, OVERLORD_HOME=str(home)))
    try:
        pid = int(proc.stdout.readline())
        holder_fd = os.pidfd_open(pid)
        inode = inode_of(proc.stdout.readline().decode())
        assert inode != host_net()
        if ROOT:
            assert pid in processes_in(inode)
        proc.kill()
        proc.wait()
        assert exited(holder_fd, 10)
        os.close(holder_fd)
        # the command's init and its sleep went too (PDEATHSIG): the namespace is empty
        assert wait_until(lambda: processes_in(inode) == [], 10), processes_in(inode)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        executor.make_removable(str(home))    # the killed command's overlay work dir (mode 000)


def test_net_none_and_proxy_are_refused_on_fuse(home, target):
    require_backend("fuse")
    for net in ("none", "proxy"):
        with pytest.raises(OverlordError, match=f"--net {net} needs the kernel backend"):
            ops.run(["true"], target=str(target), backend="fuse", grants={"net": net})
    assert no_sessions(home)


class HostHolder:
    """A 'holder' that is not one: a process in its own user namespace but the host's
    network namespace (what a broken holder would be). A command must refuse to join it."""

    def __init__(self):
        self.proc = subprocess.Popen(["unshare", "-Ur", "sleep", "600"])
        wait_until(lambda: netns_of_pid(self.proc.pid) is not None and
                   os.readlink(f"/proc/{self.proc.pid}/ns/user") != os.readlink("/proc/self/ns/user"))
        self.nsfds = (os.open(f"/proc/{self.proc.pid}/ns/user", os.O_RDONLY),
                      os.open("/proc/self/ns/net", os.O_RDONLY))
        self.net = "none"

    def close(self):
        self.proc.kill()
        self.proc.wait()
        for fd in self.nsfds:
            os.close(fd)


def test_a_command_refuses_to_run_in_the_hosts_network(kernel, home, target, tmp_path, monkeypatch):
    fake = HostHolder()
    try:
        assert netns_of_pid(fake.proc.pid) == host_net()
        monkeypatch.setattr(netns, "ensure", lambda *a, **kw: fake)
        marker = tmp_path / "ran"
        # the kernel refuses the join itself (no capability over the host's network from the
        # holder's user namespace); init's own check (its network is not the host's) is behind it
        with pytest.raises(LaunchError, match="refused: the command would have the host's network|"
                                              "cannot join the session's network namespace: setns"):
            ops.run(["touch", str(marker)], target=str(target), backend="kernel",
                    grants={"net": "none"})
        assert not marker.exists()
        assert no_sessions(home)                  # no session left behind
    finally:
        fake.close()


def test_the_kernel_backend_alone_keeps_a_namespace_per_command_without_a_session(kernel, tmp_path):
    """kernel.launch with net none and no holder (no session: the probe, a direct caller)
    still makes an empty namespace of its own; net proxy without a holder is refused."""
    from overlord.sandbox import harden, kernel as K
    dirs = {n: tmp_path / n for n in ("lower", "upper", "work")}
    for d in dirs.values():
        d.mkdir()
    r, w = os.pipe()
    spec = executor.Launch(target=str(dirs["lower"]), lowers=[str(dirs["lower"])],
                           upper=str(dirs["upper"]), work=str(dirs["work"]),
                           argv=["readlink", "/proc/self/ns/net"], cwd="/",
                           env={"PATH": executor.DEFAULT_PATH}, hardening=harden.prepare(),
                           net="none", stdio=(None, w, None))
    try:
        outcome = K.launch(spec)
    finally:
        os.close(w)
        out = executor.read_all(r).decode()
        executor.make_removable(str(dirs["work"]))
    assert outcome.exit_code == 0 and outcome.attestation["net_namespace"] is True
    assert inode_of(out) != host_net()
    spec.net = "proxy"
    with pytest.raises(LaunchError, match="needs the session's network namespace"):
        K.launch(spec)


SERVED = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from overlord.ops import launcher
from overlord import ops
from overlord.ops import execute

def names(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        s = f.read()
    return s[s.index(b"(") + 1:s.rindex(b")")].decode(), s[s.rindex(b")") + 2:].split()[:2]

def holders():
    """(pid, state) of every overlord-netns process below us."""
    out = []
    for n in os.listdir("/proc"):
        if not n.isdigit():
            continue
        try:
            comm, (state, ppid) = names(n)
            _, (_, gpp) = names(int(ppid))
            _, (_, ggpp) = names(int(gpp))
        except (OSError, ValueError):
            continue
        if comm == "overlord-netns" and int(ggpp) == os.getpid():   # us > helper > worker > H
            out.append((int(n), state.decode()))
    return out

with launcher.serving():
    r = execute.captured(lambda stdio: ops.run(["sh", "-c", "readlink /proc/self/ns/net; touch a"],
                         target=sys.argv[2], backend="kernel",
                         grants={"jail": True, "net": "none"}, stdio=stdio))
    res, out = r[0], r[1].decode()
    r2 = execute.captured(lambda stdio: ops.exec_in(res.sid, ["readlink", "/proc/self/ns/net"],
                                                    stdio=stdio))
    before = holders()
    ops.rollback(res.sid)            # in this (the server's) process, not the worker's
    deadline = time.monotonic() + 10
    while holders() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"out": out + r2[1].decode(), "before": before, "after": holders(),
                      "sid": res.sid}))
'''


def test_a_threaded_faces_commands_get_their_holder_in_the_launcher_worker(kernel, home, target):
    proc = subprocess.run([sys.executable, "-c", SERVED, REPO, str(target)], capture_output=True,
                          env=dict(os.environ, OVERLORD_HOME=str(home)), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    got = json.loads(proc.stdout)
    inodes = [int(l[len("net:["):-1]) for l in got["out"].split()]
    assert len(inodes) == 2 and host_net() not in inodes
    # one holder per worker that ran the session's commands, none in the server itself
    assert 1 <= len(got["before"]) <= 2 and len(set(inodes)) == len(got["before"]), got
    assert all(state != "Z" for _, state in got["before"])
    # ended by itself after the rollback in the server, and reaped by its worker (no zombie)
    assert got["after"] == [], got
    assert meta(home, got["sid"])["attestation"]["net_namespace"] is True
