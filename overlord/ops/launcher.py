"""The launcher: a single-threaded helper that opens sessions and runs commands for a threaded face.

The kernel backend clones namespaces from the calling process and runs Python in the child;
from a multithreaded server that is unsafe (a lock another thread held at the clone stays held
forever in the child). So a threaded face (`overlord ui`, `overlord daemon`, `overlord mcp serve`)
enters `with serving():` before its first thread (start() + execute.use_launcher): every `run` and
`exec_in` made anywhere in that process (the agent's tool calls included) travels here instead.

    server thread ──request + reply socket + stdio fds──▶ helper (one loop, never a thread)
                                                            └──▶ idle worker: ops.run / exec_in
    server thread ◀──────────── result (JSON) ──────────────────────────┘

The helper hands each request to an idle worker, forking one when none is idle and keeping
SPARE forked ahead, so a request never waits for a fork and a long command in one conversation
never holds up another's. A worker is single-threaded and serves one request at a time; one
that is left with a thread after a request exits rather than clone beside it. Requests are
JSON datagrams on a SOCK_SEQPACKET socketpair; each carries a fresh socketpair end of its own
(SCM_RIGHTS) on which the worker answers and on which the server may send b"cancel": the
worker's cancel is that socket, polled by the engine every 0.1 s while the command runs, so
Stop kills the command tree within a fraction of a second. A server thread that goes away (its
end closed) cancels too. The helper dies with the server (PR_SET_PDEATHSIG), the
workers with the helper, and a command with its worker (the engine's own PDEATHSIG).

A worker is the launching process of the commands it runs, so a `net: none|proxy` session's
network-namespace holder (sandbox/netns.py) is made and kept in the worker: a daemon may keep
one holder per worker that ran the session's commands (each its own namespace, the same
grants). Each dies with its worker, or within netns.POLL seconds of the session's end (the
commit runs in the server, so the holder sees the record finished), and is reaped at once.
"""
import json
import os
import select
import signal
import socket
import sys
import threading

from overlord import errors
from overlord.errors import OverlordError

MAX_MESSAGE = 1 << 20
POLL = 0.1                 # seconds between cancel checks while a request runs


# -- the server's side --------------------------------------------------------------------------

class Client:
    """What ops.execute.launcher is set to in the server: run() and exec_in() by proxy."""

    def __init__(self, pid, sock):
        self.pid, self.sock = pid, sock
        self._send = threading.Lock()

    def call(self, request, fds=(), cancel=None):
        """Send one request; wait for its answer, passing a cancel on. Returns the answer dict
        or raises the OverlordError the worker raised."""
        from overlord.trust import audit
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # the account a face acts for is who the worker's audit lines name
            data = json.dumps(dict(request, actor=audit.current_actor())).encode()
            with self._send:
                try:
                    socket.send_fds(self.sock, [data], [theirs.fileno(), *fds])
                except OSError as exc:
                    raise OverlordError(f"the launcher helper is gone ({exc.strerror})") from None
            theirs.close()
            asked = False
            while True:
                ready, _, _ = select.select([mine], [], [], POLL)
                if ready:
                    answer = mine.recv(MAX_MESSAGE)
                    break
                if cancel is not None and not asked and cancel.is_set():
                    mine.send(b"cancel")
                    asked = True
        finally:
            theirs.close()
            mine.close()
        if not answer:
            raise OverlordError("the launcher helper's worker died before it answered")
        answer = json.loads(answer)
        if "error" in answer:
            cls = getattr(errors, answer["error"], OverlordError)
            if not (isinstance(cls, type) and issubclass(cls, OverlordError)):
                cls = OverlordError
            raise cls(answer["message"])
        return answer

    def run(self, argv, target=None, backend=None, grants=None, trace=None, wait=False,
            stack=False, cause=None, close_if_unchanged=None, stdio=None, cancel=None,
            broker=None):
        from overlord.ops.execute import RunResult
        from overlord.ops.review import get_session
        fds = _stdio_fds(stdio)
        a = self.call({"op": "run", "argv": list(argv), "target": target, "backend": backend,
                       "grants": grants, "trace": trace, "wait": wait, "stack": stack,
                       "cause": cause, "close_if_unchanged": close_if_unchanged,
                       "stdio": len(fds), "broker": broker}, fds, cancel)
        _opened(a["sid"])
        return RunResult(a["sid"], a["exit_code"], a["timed_out"], a["state"],
                         get_session(a["sid"]).plan(), a["syscalls"], notes=a["notes"],
                         layer=a["layer"])

    def exec_in(self, sid, argv, cause=None, timeout=None, wait=False, stdio=None, cancel=None):
        from overlord.ops.execute import ExecResult
        fds = _stdio_fds(stdio)
        a = self.call({"op": "exec_in", "sid": sid, "argv": list(argv), "cause": cause,
                       "timeout": timeout, "wait": wait, "stdio": len(fds)}, fds, cancel)
        return ExecResult(a["sid"], a["exit_code"], a["timed_out"], a["layer"])

    def probe_all(self):
        return {name: tuple(v) for name, v in self.call({"op": "probe"})["backends"].items()}

    def close(self):
        try:
            self.sock.close()
        finally:
            try:
                os.kill(self.pid, signal.SIGTERM)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _stdio_fds(stdio):
    fds = [fd for fd in stdio or () if fd is not None]
    if stdio is not None and len(fds) != 3:
        raise OverlordError("the launcher takes stdio as three descriptors")
    return fds


_local = threading.local()


class opening:
    """`with opening(callback):` -- callback(sid) when run() opens a session on this thread.
    (ops.agent opens its session inside the call; a chat needs the id while the agent runs.)"""

    def __init__(self, callback):
        self.callback = callback

    def __enter__(self):
        _local.opened = self.callback

    def __exit__(self, *exc):
        _local.opened = None


def _opened(sid):
    callback = getattr(_local, "opened", None)
    if callback:
        callback(sid)


def start():
    """Fork the helper. Call while this process is still single-threaded. Returns a Client."""
    if threading.active_count() > 1:
        raise OverlordError("the launcher must be started before any thread")
    import overlord.ops.execute  # noqa: F401 - the engine, imported once here, not in every worker
    server_side, helper_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        server_side.close()
        code = 1
        try:
            _helper(helper_side)
            code = 0
        finally:
            os._exit(code)
    helper_side.close()
    return Client(pid, server_side)


# -- the helper ---------------------------------------------------------------------------------

SPARE = 2                  # idle workers kept ready: a request never waits for a fork
KEEP = 8                   # idle workers kept after a burst; more than that exit


def _helper(sock):
    """Hand each request to an idle worker (forking one when none is idle). A worker serves
    requests one at a time, single-threaded, and says when it is idle again; a long command
    in one conversation never holds up another's."""
    from overlord.linux import libc
    libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # ^C at the terminal is the server's
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    idle = []                        # the sockets of idle workers
    pids = {}                        # socket -> pid, every live worker
    for _ in range(SPARE):
        idle.append(_fork_worker(sock, pids))
    while True:
        ready, _, _ = select.select([sock, *pids], [], [], 1.0)
        _reap(pids.values())
        for w in [r for r in ready if r is not sock]:
            try:
                note = w.recv(16)
            except OSError:
                note = b""
            if note == b"idle" and len(idle) < KEEP:
                idle.append(w)
            else:                        # it died, or there are idle ones enough: let it go
                if w in idle:
                    idle.remove(w)
                pids.pop(w, None)
                w.close()
        if sock not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
        except InterruptedError:
            continue
        if not data:
            return                       # the server closed its end: leave with it
        while True:
            w = idle.pop() if idle else _fork_worker(sock, pids)
            try:
                socket.send_fds(w, [data], fds)
                break
            except OSError:              # that worker died while idle: try another
                pids.pop(w, None)
                w.close()
        for fd in fds:
            os.close(fd)
        while len(idle) < SPARE:         # fork the next spare now, while this request runs
            idle.append(_fork_worker(sock, pids))


def _fork_worker(server_sock, pids):
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            server_sock.close()
            for other in pids:
                other.close()
            mine.close()
            _serve_requests(theirs)
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    pids[mine] = pid
    return mine


def _reap(pids):
    for pid in list(pids):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _serve_requests(sock):
    try:
        _serve_loop(sock)
    finally:
        netns = sys.modules.get("overlord.sandbox.netns")
        if netns is not None:
            netns.stop_all()         # gracefully, before our exit's PDEATHSIG would


def _serve_loop(sock):
    from overlord.linux import libc
    libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)                 # a command without stdio of its own writes nowhere
    os.close(null)
    while True:
        if not _wait_for_request(sock):
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
        except InterruptedError:
            continue
        if not data:
            return                       # the helper let us go, or is gone
        try:
            _worker(json.loads(data), fds)
        finally:
            for fd in fds[1:]:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if threading.active_count() > 1:
            return                       # a thread outlived its request: never clone beside it
        sock.send(b"idle")


def _wait_for_request(sock):
    """Block until a request (or the helper's goodbye) is readable: True. Meanwhile reap the
    session network-namespace holders this worker started that ended on their own (a session
    committed elsewhere: the holder saw its record finished): False, look again. A worker's
    holders live while it does (it is single-threaded, so the thread that forked them with
    PR_SET_PDEATHSIG is the worker itself) and die with it."""
    netns = sys.modules.get("overlord.sandbox.netns")
    watched = netns.pidfds() if netns is not None else []
    if not watched:
        return True
    try:
        ready, _, _ = select.select([sock, *watched], [], [])
    except InterruptedError:
        return False
    if sock in ready:
        return True
    netns.reap()
    return False


class _SocketCancel:
    """A cancel flag read from the reply socket: b"cancel", or the server's end closing."""

    def __init__(self, sock):
        self.sock, self.flag = sock, False

    def is_set(self):
        if not self.flag:
            try:
                if self.sock.recv(16, socket.MSG_DONTWAIT) in (b"cancel", b""):
                    self.flag = True
            except BlockingIOError:
                pass
            except OSError:
                self.flag = True
        return self.flag


def _worker(request, fds):
    reply = socket.socket(fileno=fds[0])
    stdio = fds[1:]
    from overlord.trust import audit
    try:
        with audit.acting_as(request.get("actor")):
            answer = _perform(request, stdio, _SocketCancel(reply))
    except OverlordError as exc:
        answer = {"error": type(exc).__name__, "message": str(exc)}
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        answer = {"error": "OverlordError", "message": f"{exc.strerror or exc}{where}"}
    except BaseException as exc:  # noqa: BLE001 - the server must get an answer, whatever it was
        answer = {"error": "OverlordError", "message": f"internal error: {type(exc).__name__}: {exc}"}
    try:
        reply.send(json.dumps(answer).encode())
    except OSError:
        pass                          # the asking thread is gone
    finally:
        reply.close()


def _perform(request, stdio, cancel):
    from overlord.ops import execute
    from overlord.sandbox import backends
    op = request["op"]
    if op == "run":
        r = execute.run(request["argv"], target=request["target"], backend=request["backend"],
                        grants=request["grants"], trace=request["trace"], wait=request["wait"],
                        stack=request["stack"], cause=request["cause"],
                        close_if_unchanged=request["close_if_unchanged"],
                        stdio=tuple(stdio) if request["stdio"] else None, cancel=cancel,
                        broker=request["broker"])
        return {"sid": r.sid, "exit_code": r.exit_code, "timed_out": r.timed_out, "state": r.state,
                "syscalls": r.syscalls, "notes": r.notes, "layer": r.layer}
    if op == "exec_in":
        r = execute.exec_in(request["sid"], request["argv"], cause=request["cause"],
                            timeout=request["timeout"], wait=request["wait"],
                            stdio=tuple(stdio) if request["stdio"] else None, cancel=cancel)
        return {"sid": r.sid, "exit_code": r.exit_code, "timed_out": r.timed_out, "layer": r.layer}
    if op == "probe":
        return {"backends": {name: list(v) for name, v in backends.probe_all().items()}}
    raise OverlordError(f"the launcher does not know {op!r}")


class serving:
    """`with launcher.serving():` -- for a threaded face (web, daemon, MCP server): fork the
    helper (call while still single-threaded), route run/exec_in through it, and on exit stop
    routing and let the helper go."""

    def __enter__(self):
        from overlord.ops import execute
        self.client = start()
        try:
            execute.use_launcher(self.client)
        except BaseException:
            self.client.close()
            raise
        return self.client

    def __exit__(self, *exc):
        from overlord.ops import execute
        execute.launcher = None
        self.client.close()
