"""Helpers of the per-session network namespace tests (test_netns.py, test_proxy_session.py)."""
import os
import select
import threading
import time

from overlord import ops
from overlord.ops import execute
from overlord.sandbox import netns

PY = "/usr/bin/python3"          # the jail has the host's /usr, not a pyenv under $HOME

# Prints the errno of a direct connect() to an outside IPv4 and IPv6 address, and to a port
# on 127.0.0.1 (argv[1]); 0 would mean it connected.
CONNECT = r'''
import socket, sys
for family, addr in ((socket.AF_INET, ("192.0.2.1", 80)), (socket.AF_INET6, ("2001:db8::1", 80)),
                     (socket.AF_INET, ("127.0.0.1", int(sys.argv[1])))):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    print(s.connect_ex(addr))
    s.close()
'''

# Sends argv[1] to the proxy's listener inside the session and prints the answer's first line.
ASK = r'''
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(sys.argv[1].encode())
print(s.makefile().readline().strip())
'''


def captured(call):
    """(result, stdout text, stderr text) of call(stdio)."""
    res, out, err, _ = execute.captured(call)
    return res, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def run(target, argv, grants, **kw):
    return captured(lambda stdio: ops.run(argv, target=str(target), backend="kernel",
                                          grants=grants, stdio=stdio, **kw))


def exec_in(sid, argv):
    return captured(lambda stdio: ops.exec_in(sid, argv, stdio=stdio))


def netns_of_pid(pid):
    """The inode of a process's network namespace, or None (gone, a zombie, not ours)."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return int(link[len("net:["):-1])


def inode_of(text):
    """The inode in `net:[4026531840]` as printed by readlink /proc/self/ns/net."""
    line = [l for l in text.splitlines() if l.startswith("net:[")][-1]
    return int(line[len("net:["):-1])


def processes_in(inode):
    """Every live process this test can see in the network namespace with that inode."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and netns_of_pid(name) == inode:
            out.append(int(name))
    return out


def processes_named(names=(netns.HOLDER_NAME, netns.BACK_NAME), parent=None):
    """Live (not zombie) processes whose comm is one of names (children of parent if given)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode("utf-8", "replace")
        state, ppid = stat[stat.rindex(b")") + 2:].split()[:2]
        if comm in names and state != b"Z" and (parent is None or int(ppid) == parent):
            out.append(int(name))
    return out


def exited(pidfd, timeout=10.0):
    """Wait (up to timeout) for the process behind a pidfd to end: True if it did."""
    ready, _, _ = select.select([pidfd], [], [], timeout)
    return bool(ready)


def wait_until(condition, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def reaped(pid):
    """True once our child pid has been waited for (by netns): nothing of it is left."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)    # looks, never reaps
    except ChildProcessError:
        return True
    return False


class Started:
    """Records every holder netns starts in this process, with pidfds of our own on H and B
    (opened while they live, so they say when each ended: no pid reuse)."""

    def __init__(self, monkeypatch):
        self.holders = []
        real = netns._start

        def start(*a, **kw):
            holder = real(*a, **kw)
            fds = {"holder": os.pidfd_open(holder.pid)}
            if holder.back_pid is not None:
                fds["back"] = os.pidfd_open(holder.back_pid)
            inode = os.fstat(holder.nsfds[1]).st_ino     # the namespace its commands join
            self.holders.append((holder, fds, inode))
            return holder
        monkeypatch.setattr(netns, "_start", start)

    def all_gone(self, timeout=10.0):
        """Every recorded holder and back ended and was reaped."""
        for holder, fds, _ in self.holders:
            for fd in fds.values():
                assert exited(fd, timeout), holder.pid
        for holder, _, _ in self.holders:
            for pid in (holder.pid, holder.back_pid):
                if pid is not None:
                    assert wait_until(lambda p=pid: reaped(p), timeout), pid
        return True

    def close(self):
        for _, fds, _ in self.holders:
            for fd in fds.values():
                os.close(fd)


def session_files(home, sid):
    """The names left in a session's directory."""
    return sorted(os.listdir(os.path.join(str(home), "sessions", sid)))


def no_sessions(home):
    d = os.path.join(str(home), "sessions")
    return not os.path.isdir(d) or os.listdir(d) == []


def slow_logging_proxy(record_dir, grants):
    """Answers at once, then writes its 'line' 0.3 s later on a thread of its own (a
    connection whose line is still to come when the command has ended)."""
    def serve(listener, stop):
        while not stop.is_set():
            conn, _ = listener.accept()
            conn.sendall(b"ok\n")
            conn.close()

            def log():
                time.sleep(0.3)
                with open(os.path.join(record_dir, "slow.log"), "a") as f:
                    f.write("line\n")
            threading.Thread(target=log).start()
    return serve
