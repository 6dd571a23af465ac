"""One network namespace per session: the holder that keeps it, and (--net proxy) its back.

    launching process ──clone(NEWUSER|NEWNET)──▶ H, the holder (the caller writes its id maps):
        │                                       loopback up; for a proxy it binds
        │                                       127.0.0.1:PROXY_PORT and hands the listener to
        │                                       B over SCM_RIGHTS; then it waits
        ├──fork──▶ B, the back (proxy only; the host's network): serves the listener
        │          (netproxy.serve(listener, netproxy.Config(...)))
        └──per command: fork ─▶ J ─setns(H, user+net)─clone(CLONE_PARENT|NEWNS|NEWPID...)─▶
                                   the command's PID 1, a child of the launching process
                                   (kernel.py)

A holder belongs to one (launching process, session): made on the session's first `net:
none` or `net: proxy` command in that process, cached here, joined by its later commands
there. The launching process identifies H by a pidfd (no pid reuse) and keeps H's user and
network namespace fds, opened while H was still dumpable (a command joins through them:
setns through a pidfd, like opening /proc/<H>/ns/*, needs ptrace access to H, which a
non-dumpable H gives an ordinary user no more). H and B die:
  - with the launching process (PR_SET_PDEATHSIG; a launcher worker is single-threaded, so
    the thread that forked them lives as long as the worker);
  - with each other (their socket pair: either end closing wakes the other);
  - on stop(sid): the session left running/pending (txn/session.py calls it on save);
  - as a fallback, when H sees the session record finished or gone (every POLL seconds).
They make no file and no mount, and the namespace dies with its last process.
"""
import os
import select
import signal

from overlord.errors import LaunchError
from overlord.linux import libc

PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
POLL = 0.5                      # seconds between the holder's looks at the session record
GRACE = 2.0                     # seconds a stopping back may take to finish its connections' lines
LIVE_STATES = ("running", "pending", "timed-out")   # a holder outlives none of the others
HOLDER_NAME, BACK_NAME = "overlord-netns", "overlord-proxy"     # their comm, for ps


def proxy_env():
    """What a command on a proxy session finds in its environment."""
    env = {name: PROXY_URL for name in PROXY_ENV}
    env.update(NO_PROXY="", no_proxy="")
    return env


def proxy_server(record_dir, grants):
    """In B, before it says it is ready: the callable that serves the listener until the
    threading.Event `stop` is set. Raising here is a proxy that cannot start (the command
    never runs)."""
    from overlord.sandbox import netproxy
    config = netproxy.Config(record_dir=record_dir, allow=list(grants.get("net_allow") or ()),
                             hold_writes=bool(grants.get("hold_writes")),
                             cap=grants.get("net_cap"))
    return lambda listener, stop: netproxy.serve(listener, config, stop)


PROXY = proxy_server            # PROXY(record_dir, grants) -> serve(listener, stop); tests replace it


class Holder:
    """The launching process's handle on one session's holder (and back)."""

    def __init__(self, sid, net, pid, pidfd):
        self.owner = os.getpid()
        self.sid, self.net, self.pid, self.pidfd = sid, net, pid, pidfd
        self.back_pid = self.back_pidfd = None
        self.nsfds = None           # (user, net) namespace fds of H: what a command joins

    def pidfds(self):
        return [fd for fd in (self.pidfd, self.back_pidfd) if fd is not None]

    def alive(self):
        fds = self.pidfds()
        if not fds:
            return False
        ready, _, _ = select.select(fds, [], [], 0)     # a pidfd is readable once it exited
        return not ready

    def kill(self):
        """End both through their pidfds and reap them: nothing of them is left. The back
        first gets SIGTERM and up to GRACE seconds to write the lines of the connections it
        is serving (at once if it serves none), then SIGKILL like the holder."""
        if self.back_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.back_pidfd, signal.SIGTERM)
                select.select([self.back_pidfd], [], [], GRACE)
            except ProcessLookupError:
                pass
        for pid, fd in ((self.back_pid, self.back_pidfd), (self.pid, self.pidfd)):
            if fd is None:
                continue
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            os.close(fd)
        for fd in self.nsfds or ():
            os.close(fd)
        self.pidfd = self.back_pidfd = self.nsfds = None


_holders = {}                   # sid -> Holder, this process's


def ensure(sid, record_dir, net, grants=None):
    """The session's live holder in this process, started if there is none. Raises
    LaunchError when it (or, for net proxy, its proxy) cannot start."""
    if net not in ("none", "proxy"):
        raise LaunchError(f"no network namespace of a session's own for net {net!r}")
    reap()
    holder = _holders.get(sid)
    if holder is not None and holder.net == net:
        return holder
    stop(sid)
    holder = _start(sid, record_dir, net, grants or {})
    _holders[sid] = holder
    _stop_at_exit()
    return holder


_registered = []


def _stop_at_exit():
    """A process that leaves normally (the CLI after `run`) stops its holders the graceful way
    (a back writes the lines of the connections it still serves) before PR_SET_PDEATHSIG
    would SIGKILL them."""
    if os.getpid() not in _registered:
        import atexit
        atexit.register(stop_all)
        _registered.append(os.getpid())


def live(sid):
    """The session's holder in this process if it is alive (else None)."""
    reap()
    return _holders.get(sid)


def stop(sid):
    """End the session's holder and back in this process, if it has them (cheap if not)."""
    holder = _holders.pop(sid, None)
    if holder is not None and holder.owner == os.getpid():
        holder.kill()


def stop_all():
    """Stop every holder this process started (the others are forgotten)."""
    for sid in list(_holders):
        stop(sid)


def reap():
    """Forget holders that died on their own (reaping them), and those a process we were
    forked from made (not ours to signal or wait for)."""
    for sid, holder in list(_holders.items()):
        if holder.owner != os.getpid():
            del _holders[sid]
            for fd in holder.pidfds() + list(holder.nsfds or ()):
                try:
                    os.close(fd)
                except OSError:
                    pass
        elif not holder.alive():
            del _holders[sid]
            holder.kill()


def pidfds():
    """Every pidfd of this process's holders: readable when one should be reaped."""
    return [fd for h in _holders.values() if h.owner == os.getpid() for fd in h.pidfds()]


# -- the launching process's side ---------------------------------------------------------------

def _start(sid, record_dir, net, grants):
    import socket
    from overlord.sandbox import executor, kernel
    libc.libc()                   # loaded before cloning, so H never loads it
    proxy = net == "proxy"
    meta = os.path.join(record_dir, "meta.json")
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if proxy else None
    parent = os.getpid()
    # H must be dumpable until its id maps are written (we open its /proc files), as a
    # command's init is (kernel.launch); from then on neither it nor we are
    libc.prctl(libc.PR_SET_DUMPABLE, 1)
    try:
        pid = libc.clone_namespaces(libc.CLONE_NEWUSER | libc.CLONE_NEWNET)
    except OSError as exc:
        libc.prctl(libc.PR_SET_DUMPABLE, 0)
        for fd in (go_r, go_w, rep_r, rep_w):
            os.close(fd)
        for end in pair or ():
            end.close()
        raise LaunchError(f"cannot create the session's network namespace: {exc.strerror}") from None
    if pid == 0:
        _holder(parent, meta, go_r, rep_w, pair[0] if pair else None)       # never returns
    os.close(go_r)
    os.close(rep_w)
    holder = Holder(sid, net, pid, os.pidfd_open(pid))
    try:
        try:
            try:
                kernel._write_id_maps(pid)
                holder.nsfds = tuple(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
                                     for name in ("user", "net"))
            except OSError as exc:
                raise LaunchError("cannot map ids into the session's user namespace: "
                                  f"{exc.strerror}") from None
            finally:
                libc.prctl(libc.PR_SET_DUMPABLE, 0)
            os.write(go_w, b"g")
        finally:
            os.close(go_w)
        said = executor.read_all(rep_r)        # b"ok", or why it failed (EOF either way)
        if said != b"ok":
            why = said.decode("utf-8", "replace") or "it died"
            raise LaunchError(f"cannot start the session's network namespace: {why}")
        if proxy:
            _start_back(holder, record_dir, grants, pair)
    except BaseException:
        holder.kill()
        raise
    finally:
        for end in pair or ():
            end.close()
    return holder


def _start_back(holder, record_dir, grants, pair):
    from overlord.sandbox import executor
    if PROXY is proxy_server:
        try:                  # imported here once per process (a launcher worker: per session
            from overlord.sandbox import netproxy  # noqa: F401 - not each back)
        except Exception:     # noqa: BLE001 - B reports it as a proxy that cannot start
            pass
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(ready_r)
        os.close(ready_w)
        raise LaunchError(f"cannot start the proxy: {exc.strerror}") from None
    if pid == 0:
        _back(parent, pair[1], ready_w, record_dir, grants)           # never returns
    os.close(ready_w)
    holder.back_pid, holder.back_pidfd = pid, os.pidfd_open(pid)
    said = executor.read_all(ready_r)
    if said != b"ok":
        raise LaunchError(f"cannot start the proxy: {said.decode('utf-8', 'replace') or 'it died'}")


# -- H and B ------------------------------------------------------------------------------------

def _detach(parent, name, keep):
    """First steps of H and B: die with the launching process, leave its process group (a ^C
    at the terminal is the command's and the launcher's, never ours), hold nothing of it
    (no stdio a reader waits on, no cwd, no other fd)."""
    libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)                # it died before we could ask to die with it
    libc.set_name(name)
    os.setpgid(0, 0)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = set(keep) | {0, 1, 2}
    for fd in _open_fds():
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _open_fds():
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def _holder(parent, meta, go_r, rep_w, sock):
    """H: in the session's new user + network namespaces. Never returns."""
    from overlord.sandbox import executor
    try:
        _detach(parent, HOLDER_NAME, {go_r, rep_w} | ({sock.fileno()} if sock else set()))
        if os.read(go_r, 1) != b"g":         # our id maps are written
            os._exit(0)
        os.close(go_r)
        libc.prctl(libc.PR_SET_DUMPABLE, 0)
        libc.loopback_up()
        if sock is not None:
            import socket
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", PROXY_PORT))
            listener.listen(socket.SOMAXCONN)
            socket.send_fds(sock, [b"L"], [listener.fileno()])
            listener.close()                 # B holds it now; we never accept
        os.write(rep_w, b"ok")
        os.close(rep_w)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        executor.report_and_exit(rep_w, exc)
    try:
        _wait(meta, sock)
    finally:
        os._exit(0)


def _wait(meta, sock):
    """Until the session is finished or gone (or, with a back, the back is gone)."""
    fds = [sock] if sock is not None else []
    seen = None
    while True:
        try:
            ready, _, _ = select.select(fds, [], [], POLL)
        except InterruptedError:
            continue
        if ready:
            return                               # B closed its end: it died
        try:
            st = os.stat(meta)
        except FileNotFoundError:
            return                               # the session (or its directory) is gone
        except OSError:
            continue
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != seen:
            seen = stamp
            if not _live(meta):
                return


def _live(meta):
    import json
    try:
        with open(meta, encoding="utf-8") as f:
            state = json.load(f).get("state")
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError):
        return True                  # unreadable for a moment: look again next time
    return state in LIVE_STATES


class _Stopping(BaseException):
    """Raised in B's main thread by SIGTERM: out of the accept loop at once (a BaseException,
    so no `except Exception` in the loop holds it)."""


def _back(parent, sock, ready_w, record_dir, grants):
    """B: in the host's network namespace, serving the listener H bound. Never returns.
    SIGTERM (stop(), or H gone) ends it gracefully: the accept loop stops, the connections
    being served get up to GRACE seconds to finish and write their lines."""
    import socket
    import threading
    from overlord.sandbox import executor
    stop = threading.Event()

    def stopping(_sig, _frame):
        if not stop.is_set():
            stop.set()
            raise _Stopping()
    try:
        _detach(parent, BACK_NAME, {sock.fileno(), ready_w})
        libc.prctl(libc.PR_SET_DUMPABLE, 0)
        signal.signal(signal.SIGTERM, stopping)
        _, fds, _, _ = socket.recv_fds(sock, 16, 1)
        if len(fds) != 1:
            raise OSError(0, "the holder handed over no listener")
        listener = socket.socket(fileno=fds[0])
        serve = PROXY(record_dir, grants)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        executor.report_and_exit(ready_w, exc)
    try:
        os.write(ready_w, b"ok")
        os.close(ready_w)
        watcher = threading.Thread(target=_leave_with, args=(sock,), daemon=True)
        watcher.start()
        serve(listener, stop)
    except _Stopping:
        pass
    finally:
        try:
            stop.set()
            _finish(GRACE, {threading.current_thread(), watcher})
        except BaseException:  # noqa: BLE001 - a second signal: leave now
            pass
        os._exit(0)


def _finish(grace, skip):
    """Wait (up to grace seconds) for B's connection threads to end."""
    import threading
    import time
    deadline = time.monotonic() + grace
    for thread in threading.enumerate():
        if thread not in skip:
            thread.join(max(0.0, deadline - time.monotonic()))


def _leave_with(sock):
    """In B: H closing its end of the pair (it died) stops B, as stop() would."""
    import time
    while True:
        try:
            select.select([sock], [], [])
            break
        except InterruptedError:
            continue
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE + 1)
    os._exit(0)
