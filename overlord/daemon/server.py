"""`overlord daemon`: the socket, the peer check, the connections and their framing.

    main thread: accept ──peer check (SO_PEERCRED)──▶ a reader thread per connection
                                                        │ one JSON object per line (1 MiB cap)
                                                        └─▶ a thread per request ──▶ handlers
                                                              (events and the reply written
                                                               under the connection's lock)

Start-up happens while the process is single-threaded: the lock next to the socket, recover,
reconcile, the launcher helper (the one process that clones namespaces), then the socket
(bound in a fresh 0700 directory under umask 0177, chmod 0600, renamed into place) and only
then threads. docs/DAEMON.md is the protocol.
"""
import fcntl
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
import traceback

from overlord import ops
from overlord.daemon import handlers
from overlord.errors import OverlordError, UsageError
from overlord.ops import launcher
from overlord.ops.doctor import daemon_ping, daemon_socket
from overlord.text import escape_path, is_exact, jsonable

MAX_LINE = 1 << 20             # bytes of one request line, the newline not counted
MAX_CONNECTIONS = 128
MAX_INFLIGHT = 16              # requests in flight on one connection
MAX_INFLIGHT_ALL = 256
SEND_TIMEOUT = 30.0            # seconds a client may leave one line of ours unread
LOCK_WAIT = 10.0               # seconds a dying daemon's helpers may hold the lock
STOP_WAIT = 10.0               # seconds requests cancelled at a stop get to finish
HUP_POLL = 200                 # ms between checks that a half-closed client is still there
SUN_PATH_MAX = 107             # bytes of a unix socket path (sun_path less its NUL)


def _error(rid, message, code):
    return {"id": rid, "ok": False, "error": " ".join(str(message).split()) or "error",
            "code": code}


def encode(obj):
    """One protocol line: compact JSON, UTF-8, every string made exact (text.jsonable)."""
    obj = jsonable(obj)
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


# -- start-up ---------------------------------------------------------------------------------

def serve(path=None, out=None):
    """Run the daemon until SIGTERM/SIGINT. Returns the exit status (0)."""
    out = out or sys.stderr
    notify = os.environ.pop("NOTIFY_SOCKET", None)    # systemd's, for us: not for any command
    path = _socket_path(path)
    lock = _take_lock(path)
    try:
        ops.recover()
        settled = ops.reconcile()
        with launcher.serving():
            daemon = Daemon(path, notify, out)
            daemon.bind()
            if settled:
                print(f"overlord daemon: {len(settled)} session(s) a stopped daemon left "
                      f"mid-command settled as pending: {', '.join(settled)}", file=out, flush=True)
            return daemon.run()
    finally:
        os.close(lock)


def _socket_path(path):
    if path is None:
        path = daemon_socket()
        if os.path.dirname(path) == os.path.abspath(ops.home()):
            ops.ensure_home()
    path = os.path.abspath(path)
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise UsageError(f"socket path too long for a unix socket ({len(os.fsencode(path))} "
                         f"bytes, at most {SUN_PATH_MAX}): {escape_path(path)}")
    if not os.path.isdir(os.path.dirname(path)):
        raise OverlordError(f"cannot listen on {escape_path(path)}: its directory does not exist")
    st = os.stat(os.path.dirname(path))
    shared = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid())
    if st.st_uid not in (os.geteuid(), 0) or (shared and not st.st_mode & stat.S_ISVTX):
        # whoever else may write there (your own group aside) can rename a socket over ours
        raise OverlordError(f"will not listen in {escape_path(os.path.dirname(path))}: others "
                            f"than you can write in it (owner uid {st.st_uid}, mode "
                            f"{stat.S_IMODE(st.st_mode):04o}) and so replace the socket; use a "
                            "folder only you (or root) can write, or a sticky one such as /tmp")
    return path


def _answering(path):
    """The pid of a daemon answering ping on path, or None."""
    try:
        reply = daemon_ping(path, timeout=2.0)
    except OSError:
        return None
    if reply and reply.get("ok"):
        return reply.get("pid", "?")
    return None


def _take_lock(path):
    """An flock on PATH.lock, held for the daemon's life (its helpers inherit it, so it is
    free only once a killed daemon's whole family is gone). Refuses if a daemon answers."""
    pid = _answering(path)
    if pid is not None:
        raise OverlordError(f"a daemon already answers on {escape_path(path)} (pid {pid})")
    lock_path = path + ".lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise OverlordError(f"cannot open {escape_path(lock_path)}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise OverlordError(f"{escape_path(lock_path)} is not a regular file of yours: remove it")
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        pid = _answering(path)
        if pid is not None or time.monotonic() > deadline:
            os.close(fd)
            if pid is not None:
                raise OverlordError(f"a daemon already answers on {escape_path(path)} (pid {pid})")
            raise OverlordError(f"{escape_path(lock_path)} is held by another process (a daemon "
                                "starting or stopping?); try again")
        time.sleep(0.05)


def _notify(address, state):
    """sd_notify(3) without libsystemd: one datagram to systemd's NOTIFY_SOCKET."""
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state.encode(), address)
    except OSError:
        pass


# -- the daemon -------------------------------------------------------------------------------

class Daemon:
    def __init__(self, path, notify=None, out=None):
        self.path, self.notify, self.out = path, notify, out or sys.stderr
        self.listener = None
        self.ident = None               # (st_dev, st_ino) of our socket file
        self.lock = threading.Lock()
        self.conns = set()
        self.inflight = 0
        self.agents = {}                # sid -> set of cancel Events of agents running in it
        self.stopping = False
        try:
            self.send_timeout = float(os.environ.get("OVERLORD_DAEMON_SEND_TIMEOUT") or SEND_TIMEOUT)
        except ValueError:
            raise UsageError("OVERLORD_DAEMON_SEND_TIMEOUT takes a number of seconds") from None

    def log(self, text):
        try:
            print(f"overlord daemon: {text}", file=self.out, flush=True)
        except (OSError, ValueError):
            pass

    # -- the socket ---------------------------------------------------------------------------

    def bind(self):
        """Listen on self.path with no moment at which another user could connect."""
        path, parent = self.path, os.path.dirname(self.path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not (stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid()):
            raise OverlordError(f"{escape_path(path)} exists and is not a socket of yours: "
                                "remove it or choose another --socket")
        try:
            private = tempfile.mkdtemp(prefix=".overlordd-", dir=parent)     # mode 0700
        except OSError as exc:
            raise OverlordError(f"cannot listen in {escape_path(parent)}: {exc.strerror}") from None
        tmp = os.path.join(private, "s")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        dfd = None
        try:
            address = tmp
            if len(os.fsencode(tmp)) > SUN_PATH_MAX:          # bind through the directory's fd
                dfd = os.open(private, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                address = f"/proc/self/fd/{dfd}/s"
            old = os.umask(0o177)
            try:
                sock.bind(address)
            finally:
                os.umask(old)
            os.chmod(tmp, 0o600)
            sock.listen(128)
            os.rename(tmp, path)
        except OSError as exc:
            sock.close()
            raise OverlordError(f"cannot listen on {escape_path(path)}: {exc.strerror}") from None
        finally:
            if dfd is not None:
                os.close(dfd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            os.rmdir(private)
        st = os.lstat(path)
        self.listener, self.ident = sock, (st.st_dev, st.st_ino)

    def _remove_socket(self):
        """Unlink the socket file if it is still ours (never another daemon's)."""
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self.ident:
                os.unlink(self.path)
        except OSError:
            pass

    # -- the main loop ------------------------------------------------------------------------

    def run(self):
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

        def stop(signum, frame):
            if self.stopping:
                os._exit(1)            # a second signal: no more waiting
            self.stopping = True
            try:
                os.write(wake_w, b"x")
            except OSError:
                pass
        old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        # a signal taken by another thread does not interrupt this select(): the wakeup fd
        # makes the interpreter's own C handler write to the pipe, whichever thread took it
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            self.log(f"serving on {escape_path(self.path)} (pid {os.getpid()})")
            _notify(self.notify, f"READY=1\nMAINPID={os.getpid()}")
            while not self.stopping:
                ready, _, _ = select.select([self.listener, wake_r], [], [])
                if self.listener in ready and not self.stopping:
                    self._accept()
            _notify(self.notify, "STOPPING=1")
            self._stop()
            self.log("stopped")
            return 0
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in old.items():
                signal.signal(s, handler)
            os.close(wake_r)
            os.close(wake_w)
            self._remove_socket()
            self.listener.close()

    def _accept(self):
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:           # out of descriptors: let a connection end first
            self.log(f"accept: {exc.strerror}")
            time.sleep(0.1)
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", int(self.send_timeout),
                                    int(self.send_timeout % 1 * 1e6)))
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
        if uid not in (os.geteuid(), 0):
            self.log(f"refused a connection from uid {uid} (pid {pid})")
            self._refuse(sock, f"this daemon serves its own user (uid {os.geteuid()}) and root "
                               f"only, not uid {uid}", 403)
            return
        with self.lock:
            full = len(self.conns) >= MAX_CONNECTIONS
        if full:
            self._refuse(sock, f"the daemon serves at most {MAX_CONNECTIONS} connections at "
                               "once; try again when one has closed", 429)
            return
        conn = Connection(self, sock, pid)
        with self.lock:
            self.conns.add(conn)
        threading.Thread(target=conn.serve, name=f"overlordd-conn-{pid}", daemon=True).start()

    @staticmethod
    def _refuse(sock, message, code):
        try:
            sock.sendall(encode(_error(None, message, code)))
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def _stop(self):
        """Cancel every request in flight, give them STOP_WAIT to finish (their sessions
        sealed), then drop every connection."""
        self._remove_socket()
        with self.lock:
            conns = list(self.conns)
        for conn in conns:
            conn.cancel_all()
        deadline = time.monotonic() + STOP_WAIT
        for conn in conns:
            conn.wait_idle(max(0.0, deadline - time.monotonic()))
        for conn in conns:
            conn.drop()

    # -- shared state -------------------------------------------------------------------------

    def admit(self):
        with self.lock:
            if self.inflight >= MAX_INFLIGHT_ALL:
                return False
            self.inflight += 1
            return True

    def release(self):
        with self.lock:
            self.inflight -= 1

    def forget(self, conn):
        with self.lock:
            self.conns.discard(conn)

    def agent_started(self, sid, event):
        with self.lock:
            self.agents.setdefault(sid, set()).add(event)

    def agent_ended(self, sid, event):
        with self.lock:
            events = self.agents.get(sid)
            if events:
                events.discard(event)
                if not events:
                    del self.agents[sid]

    def cancel_agents(self, sid):
        with self.lock:
            events = list(self.agents.get(sid, ()))
        for event in events:
            event.set()
        return bool(events)


# -- one connection ---------------------------------------------------------------------------

class Request:
    def __init__(self, rid, op, args):
        self.id, self.op, self.args = rid, op, args
        self.cancel = threading.Event()
        self.sids = set()               # the sessions it runs in, once known (close cancels)
        self.done = False               # its reply is made (being sent)


class Connection:
    def __init__(self, daemon, sock, pid):
        self.daemon, self.sock, self.pid = daemon, sock, pid
        self.wlock = threading.Lock()          # one line at a time, whole
        self.state = threading.Condition()     # guards inflight
        self.inflight = {}                     # id -> Request
        self.alive = True

    # -- writing ------------------------------------------------------------------------------

    def send(self, obj):
        """Write one line; False once the connection is gone. A client that leaves a line
        unread past the send timeout is dropped (its requests cancelled)."""
        data = encode(obj)
        with self.wlock:
            if not self.alive:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                pass
        self.drop()
        return False

    def drop(self):
        """The client is gone (or dropped): cancel what it asked for, wake the reader."""
        with self.wlock:
            was, self.alive = self.alive, False
        self.cancel_all()
        if was:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel_all(self):
        with self.state:
            requests = list(self.inflight.values())
        for req in requests:
            req.cancel.set()

    def wait_idle(self, timeout=None):
        with self.state:
            return self.state.wait_for(lambda: not self.inflight, timeout)

    # -- reading ------------------------------------------------------------------------------

    def serve(self):
        try:
            self._read()
            self._wait_out()
        except Exception:  # noqa: BLE001 - a connection's bug must not take the daemon down
            traceback.print_exc()
            self.drop()
        finally:
            self.wait_idle()
            self.daemon.forget(self)
            with self.wlock:
                self.alive = False
            self.sock.close()

    def _read(self):
        buf, scanned = bytearray(), 0
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n", scanned)
                if nl < 0:
                    scanned = len(buf)
                    if len(buf) > MAX_LINE:
                        return self._too_long()
                    break
                if nl > MAX_LINE:
                    return self._too_long()
                line = bytes(buf[:nl])
                del buf[:nl + 1]
                scanned = 0
                self._line(line)
                if not self.alive:
                    return

    def _too_long(self):
        self.send(_error(None, f"request line over {MAX_LINE} bytes: the connection is closed",
                         413))
        self.drop()

    def _wait_out(self):
        """After the client's end of the stream: finish what it asked for -- unless it is gone
        altogether (POLLHUP: it closed, not only shut down its writing), then cancel."""
        if not self.alive:
            return
        poller = select.poll()
        poller.register(self.sock.fileno(), 0)      # POLLHUP/POLLERR are always reported
        while not self.wait_idle(0):
            if poller.poll(HUP_POLL):
                self.drop()
                return

    def _line(self, line):
        if not line.strip():
            return
        try:
            msg = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            return self.send(_error(None, "a request line must be UTF-8", 400))
        except (ValueError, RecursionError) as exc:
            return self.send(_error(None, f"not JSON: {str(exc)[:100]}", 400))
        if not isinstance(msg, dict):
            return self.send(_error(None, "a request is one JSON object per line", 400))
        rid = msg.get("id")
        if isinstance(rid, bool) or not isinstance(rid, (int, str)) or (
                isinstance(rid, str) and not (0 < len(rid) <= 200 and is_exact(rid))):
            return self.send(_error(None, "a request needs an id: an integer or a string of "
                                          "1 to 200 characters", 400))
        try:
            op, args = handlers.parse(msg)
        except OverlordError as exc:
            return self.send(_error(rid, exc, exc.http_status))
        with self.state:
            busy = rid in self.inflight and not self.inflight[rid].done
        if busy:
            return self.send(_error(rid, f"id {rid!r} is already in flight on this connection",
                                    400))
        if op.inline:
            return self._answer(Request(rid, op, args))
        with self.state:
            if len(self.inflight) >= MAX_INFLIGHT:
                return self.send(_error(rid, f"at most {MAX_INFLIGHT} requests may be in flight "
                                             "on one connection", 429))
            if not self.daemon.admit():
                return self.send(_error(rid, f"the daemon is running {MAX_INFLIGHT_ALL} requests "
                                             "already; try again", 429))
            req = Request(rid, op, args)
            self.inflight[rid] = req
        threading.Thread(target=self._work, args=(req,), name=f"overlordd-{op.name}",
                         daemon=True).start()

    def _work(self, req):
        try:
            self._answer(req)
        finally:
            self.daemon.release()
            with self.state:
                if self.inflight.get(req.id) is req:
                    del self.inflight[req.id]
                self.state.notify_all()

    def _answer(self, req):
        reply = self._result(req)
        with self.state:
            req.done = True       # answered: its id is free, close no longer counts it
        self.send(reply)

    def _result(self, req):
        try:
            result = handlers.call(req.op, req.args, Context(self, req))
            reply = {"id": req.id, "ok": True, **result}
        except OverlordError as exc:
            reply = _error(req.id, exc, exc.http_status)
        except OSError as exc:
            where = f" ({escape_path(exc.filename)})" if isinstance(exc.filename, str) else ""
            reply = _error(req.id, f"{exc.strerror or exc}{where}", 500)
        except Exception:  # noqa: BLE001 - every failure is an answer, never a dropped request
            traceback.print_exc()
            reply = _error(req.id, "internal error (the daemon's log has the details)", 500)
        return reply

    # -- what a handler may ask of its connection -----------------------------------------------

    def cancel_in(self, sid):
        """Cancel this connection's requests running in session sid; how many."""
        with self.state:
            requests = [r for r in self.inflight.values() if sid in r.sids and not r.done]
        for req in requests:
            req.cancel.set()
        return len(requests)


class Context:
    """What a handler gets: the request's cancel, a way to stream events, the daemon."""

    def __init__(self, conn, req):
        self.conn, self.req = conn, req
        self.cancel = req.cancel
        self.daemon = conn.daemon
        self.client = None               # the request's own name for its caller
        self._broker = None

    @property
    def broker(self):
        if self._broker is None:
            self._broker = ops.Broker(ops.Caller(face="daemon", client=self.client))
        return self._broker

    def emit(self, event):
        """Send one event line for this request; False once the client is gone."""
        return self.conn.send({"id": self.req.id, "event": event})

    def running_in(self, sid):
        """This request now runs in session sid (`close` cancels it; `agent_cancel` too, for
        an agent)."""
        self.req.sids.add(sid)
        if not self.conn.alive:
            self.req.cancel.set()
