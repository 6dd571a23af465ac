"""OVERLORD's Python SDK: drive the policy-brokered daemon (`overlord daemon`) from a harness.

One standalone file, standard library only, importing nothing from `overlord`: a harness may
vendor it. It speaks the daemon's wire protocol (docs/DAEMON.md) over the daemon's unix socket;
docs/INTEGRATION.md shows a harness wrapping its shell tool with it.

    import overlord_client as oc

    with oc.Client() as client:
        with client.open("/srv/app") as live:          # a pending session, policy-brokered
            r = live.exec(["make", "test"])            # one command, its own savepoint
            print(r.exit_code, r.stdout)
            print(live.diff())
        # leaving the block closes the attachment: the session stays pending for a person
        # (`overlord diff`, `overlord commit`); the SDK never commits on its own

Conventions:

- Every failure is `OverlordError`: `.code` is the daemon's code (400 bad arguments, 403 denied
  by policy, 404 unknown session or op, 409 refused, 413 request too long, 429 over a cap of
  the daemon's, 500 internal) or one of the SDK's own: 503 no daemon / connection lost
  (`NO_DAEMON`), 504 no reply within the client's timeout (`NO_REPLY`), 502 the daemon sent
  something that is not the protocol (`BAD_REPLY`: not JSON, nested past the parser, a line
  over 256 MiB); str(exc) is the daemon's one-line message. A socket another user than you or root serves is 503 and is
  sent nothing (SO_PEERCRED). No socket or JSON exception escapes the API. An exception
  raised by one of your own callbacks reaches you unchanged.
- The connection is made lazily, by the first call (or `connect()`), and remade by the next
  call after it was lost; a call in flight when it is lost fails with 503 (sessions live in the
  daemon's records, not in the connection: their sids stay valid).
- A Client is thread-safe: a reader thread demultiplexes replies and events by request id, so
  one thread may run `agent()` while another calls `agent_cancel()`. Callbacks (`on_event`,
  `on_output`, ...) run in the thread that made the call, never in the reader thread, so they
  may call the client themselves. The daemon serves at most 16 requests in flight on one
  connection: a 17th call waits here for a slot instead of failing.
- `target=None` (open, agent) is this process's working directory, not the daemon's.
- Output: `ExecResult.stdout` / `.stderr` are str (UTF-8, undecodable bytes replaced);
  `.stdout_bytes` / `.stderr_bytes` are the exact bytes. `on_output(stream, data)` gets
  stream "stdout" or "stderr" and data as bytes, as the command writes it. stdin may be str or
  bytes. A request line is capped at 1 MiB by the daemon: a larger one (a huge stdin) is
  refused here with 413 before anything is sent.
- Results that are reports (diff, log, savepoints, sessions, ...) are the daemon's JSON as
  plain dicts and lists: the shapes of the CLI's `--json` (docs/JSON.md).
"""
import base64
import itertools
import json
import os
import queue
import socket as _socket
import struct
import threading

__all__ = ["BAD_REPLY", "Client", "ExecResult", "LiveSession", "NO_DAEMON", "NO_REPLY",
           "OverlordError", "Session", "default_socket"]

NO_DAEMON = 503          # no daemon on the socket, or the connection to it was lost
BAD_REPLY = 502          # the daemon's side sent a line that is not the protocol
NO_REPLY = 504           # no reply within the client's timeout
MAX_LINE = 1 << 20       # the daemon's request cap (a request line, newline not counted)
MAX_REPLY = 256 << 20    # the longest line taken from the daemon's side (past it: BAD_REPLY)
IN_FLIGHT = 16           # the daemon's cap on requests in flight on one connection

GRANTS = ("jail", "net", "timeout", "limits", "merge_base")   # what a session may be granted


class OverlordError(Exception):
    """Every failure of the SDK: `.code` (int) and the message as str(exc)."""

    def __init__(self, message, code=500):
        super().__init__(message)
        self.code = code

    def __repr__(self):
        return f"OverlordError({str(self)!r}, code={self.code})"


def default_socket():
    """$OVERLORD_SOCKET, else $OVERLORD_HOME/overlordd.sock, else ~/.overlord/overlordd.sock."""
    path = os.environ.get("OVERLORD_SOCKET")
    if path:
        return path
    home = os.environ.get("OVERLORD_HOME") or os.path.join(os.path.expanduser("~"), ".overlord")
    return os.path.join(home, "overlordd.sock")


class _Lost:
    """Put on a waiting call's queue when its connection ended before its reply."""

    def __init__(self, error):
        self.error = error


class _Connection:
    """One socket to the daemon and the reader thread that hands each line to its call."""

    def __init__(self, path, timeout):
        self.path = path
        self.calls = {}                  # request id -> queue of messages
        self.lock = threading.Lock()     # guards calls and closed
        self.send_lock = threading.Lock()
        self.closed = None               # the OverlordError every later call gets
        self.sock = _connect(path, timeout)
        self.reader = threading.Thread(target=self._read, name="overlord-client-reader",
                                       daemon=True)
        self.reader.start()

    def register(self, rid):
        q = queue.SimpleQueue()
        with self.lock:
            if self.closed is not None:
                raise self.closed
            self.calls[rid] = q
        return q

    def forget(self, rid):
        with self.lock:
            self.calls.pop(rid, None)

    def send(self, data):
        try:
            with self.send_lock:
                self.sock.sendall(data)
        except BlockingIOError:               # SO_SNDTIMEO: the peer read nothing for that long
            err = OverlordError(f"the daemon on {self.path} did not read the request within "
                                "the client's timeout", NO_REPLY)
            self.end(err)
            raise err from None
        except OSError as exc:
            err = OverlordError(f"the connection to the daemon on {self.path} was lost "
                                f"({_why(exc)})", NO_DAEMON)
            self.end(err)
            raise err from None

    def _read(self):
        err = OverlordError(f"the daemon on {self.path} closed the connection", NO_DAEMON)
        try:
            stream = self.sock.makefile("rb")
            while True:
                line = stream.readline(MAX_REPLY + 1)
                if not line:
                    break
                if len(line) > MAX_REPLY and not line.endswith(b"\n"):
                    err = OverlordError(f"the daemon on {self.path} sent a line over "
                                        f"{MAX_REPLY} bytes", BAD_REPLY)
                    break
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except (ValueError, RecursionError):     # deep nesting is a RecursionError
                    err = OverlordError(f"the daemon on {self.path} sent a line that is not "
                                        "JSON", BAD_REPLY)
                    break
                if not isinstance(msg, dict):
                    err = OverlordError(f"the daemon on {self.path} sent a line that is not a "
                                        "JSON object", BAD_REPLY)
                    break
                rid = msg.get("id")
                with self.lock:
                    q = self.calls.get(rid) if isinstance(rid, int) else None
                if q is not None:
                    q.put(msg)
                elif rid is None and msg.get("ok") is False:
                    # an error about the connection itself (a line over the cap, a refused
                    # peer): the daemon closes it after this line
                    err = OverlordError(_text(msg.get("error")) or "the daemon refused the "
                                        "connection", _code(msg.get("code")))
                # a line for a call nobody waits for any more (timed out) is dropped
        except OSError as exc:
            if self.closed is None:
                err = OverlordError(f"the connection to the daemon on {self.path} was lost "
                                    f"({_why(exc)})", NO_DAEMON)
        self.end(err)

    def end(self, err):
        with self.lock:
            if self.closed is None:
                self.closed = err
            calls, self.calls = self.calls, {}
        for q in calls.values():
            q.put(_Lost(self.closed))
        try:
            self.sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self):
        self.end(OverlordError("the client was closed", NO_DAEMON))
        if self.reader is not threading.current_thread():
            self.reader.join(5)
        try:
            self.sock.close()
        except OSError:
            pass


def _connect(path, timeout):
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    dirfd = None
    try:
        sock.settimeout(timeout)
        address = path
        if len(os.fsencode(path)) > 100:
            # sun_path holds 108 bytes: reach a deeper socket through its directory's fd
            dirfd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_CLOEXEC)
            address = f"/proc/self/fd/{dirfd}/{os.path.basename(path)}"
        sock.connect(address)
        sock.settimeout(None)
        _check_peer(sock, path)
        if timeout is not None:               # a peer that never reads holds no send for ever
            t = max(float(timeout), 0.001)
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO,
                            struct.pack("ll", int(t), int(t % 1 * 1e6)))
        return sock
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        sock.close()
        raise OverlordError(f"no daemon on {path}: start it with `overlord daemon`",
                            NO_DAEMON) from None
    except OverlordError:
        sock.close()
        raise
    except OSError as exc:
        sock.close()
        raise OverlordError(f"cannot connect to the daemon on {path}: {_why(exc)}",
                            NO_DAEMON) from None
    finally:
        if dirfd is not None:
            os.close(dirfd)


def _check_peer(sock, path):
    """Only a daemon of this user's (or root's) is spoken to: whatever another user put on
    the socket path gets nothing, not even the first request."""
    _, uid, _ = struct.unpack("3i", sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED,
                                                    struct.calcsize("3i")))
    if uid not in (os.geteuid(), 0):
        raise OverlordError(f"{path} is served by uid {uid}, not by you (uid {os.geteuid()}) "
                            "or root: not your daemon, so nothing was sent to it", NO_DAEMON)


def _why(exc):
    return exc.strerror or str(exc) or type(exc).__name__


def _text(value):
    return value if isinstance(value, str) else (None if value is None else str(value))


def _code(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else 500


def _chunk(event):
    """The bytes of an output event: "text" (valid UTF-8) or "b64"."""
    if "b64" in event:
        try:
            return base64.b64decode(event["b64"])
        except (ValueError, TypeError):
            raise OverlordError("the daemon sent an output event that is not base64",
                                BAD_REPLY) from None
    text = event.get("text")
    return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else b""


def _put_bytes(args, name, data):
    """Carry data (str or bytes) as args[name] (UTF-8 text without NUL) or else, exactly, as
    args[name + "_b64"]."""
    if data is None:
        return
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise OverlordError(f"{name} must be str or bytes, not {type(data).__name__}", 400)
    data = bytes(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\0" not in text:
        args[name] = text
    else:
        args[name + "_b64"] = base64.b64encode(data).decode("ascii")


def _argv(argv):
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)):
        raise OverlordError("argv must be a list of strings (for one shell command string "
                            "use shell())", 400)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise OverlordError("argv must be a non-empty list of strings", 400)
    return list(argv)


def _grants(op, kwargs):
    """The grants among op's keyword arguments (sent under "grants"); 400 for any other."""
    grants = {k: kwargs.pop(k) for k in GRANTS if k in kwargs and kwargs[k] is not None}
    if kwargs:
        raise OverlordError(f"{op}: unknown argument(s) {', '.join(sorted(kwargs))}", 400)
    return grants


def _strip(reply):
    return {k: v for k, v in reply.items() if k not in ("id", "ok")}


class Client:
    """A connection to the daemon. `Client(socket=None, timeout=None, name=None)`:

    socket: the daemon's socket path (default: `default_socket()`); timeout: seconds a call
    waits for the daemon's next message (an event or the reply), for the connection and for
    the daemon to take in a request, None to wait as long as it takes (an agent may run for
    an hour); name: how this client names itself, sent as every request's "client" (the
    sessions it opens record it as `broker.client`; at most 200 characters are kept)."""

    def __init__(self, socket=None, timeout=None, name=None):
        self.socket = os.fspath(socket) if socket is not None else default_socket()
        self.timeout = timeout
        self.name = name
        self._conn = None
        self._conn_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._slots = threading.BoundedSemaphore(IN_FLIGHT)
        self._local = threading.local()     # calls this thread is inside (a callback's own)

    # -- the connection ------------------------------------------------------------------

    def connect(self):
        """Connect now (a call connects by itself); raises OverlordError 503 if no daemon."""
        self._connection()
        return self

    def _connection(self):
        with self._conn_lock:
            if self._closed:
                raise OverlordError("the client was closed", NO_DAEMON)
            if self._conn is None or self._conn.closed is not None:
                if self._conn is not None:
                    self._conn.close()
                self._conn = _Connection(self.socket, self.timeout)
            return self._conn

    def close(self):
        """Close the connection. Sessions stay as they are in the daemon (pending)."""
        with self._conn_lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one request ---------------------------------------------------------------------

    def call(self, op, on_event=None, **args):
        """Send one request `{"id", "op", **args}` and return the reply's fields (without
        id and ok); on_event(event) is called for each event before it. The building block of
        every method below, for an op this file does not wrap."""
        args = {k: v for k, v in args.items() if v is not None}
        if self.name is not None:
            args.setdefault("client", self.name)
        rid = next(self._ids)
        try:
            line = json.dumps(dict(args, id=rid, op=op), ensure_ascii=False,
                              separators=(",", ":")).encode("utf-8") + b"\n"
        except (TypeError, ValueError) as exc:
            raise OverlordError(f"{op}: an argument cannot be sent as JSON ({exc})", 400) from None
        if len(line) - 1 > MAX_LINE:
            raise OverlordError(f"{op}: the request is {len(line)} bytes, over the daemon's "
                                f"limit of {MAX_LINE} bytes", 413)
        depth = getattr(self._local, "depth", 0)
        if depth == 0:          # a call made from a callback uses its caller's slot
            self._slots.acquire()
        self._local.depth = depth + 1
        try:
            return self._exchange(op, rid, line, on_event)
        finally:
            self._local.depth = depth
            if depth == 0:
                self._slots.release()

    def _exchange(self, op, rid, line, on_event):
        conn = self._connection()
        q = conn.register(rid)
        try:
            conn.send(line)
            while True:
                try:
                    msg = q.get(timeout=self.timeout)
                except queue.Empty:
                    raise OverlordError(f"{op}: no reply from the daemon within "
                                        f"{self.timeout} s", NO_REPLY) from None
                if isinstance(msg, _Lost):
                    raise OverlordError(str(msg.error), msg.error.code)
                if "event" in msg and "ok" not in msg:
                    if on_event is not None and isinstance(msg["event"], dict):
                        on_event(msg["event"])
                    continue
                if msg.get("ok") is True:
                    return _strip(msg)
                raise OverlordError(_text(msg.get("error")) or f"{op} failed",
                                    _code(msg.get("code")))
        finally:
            conn.forget(rid)

    def _output(self, on_output):
        """(on_event for an exec-like op, the two byte buffers it fills)."""
        out = {"stdout": bytearray(), "stderr": bytearray()}

        def on_event(event):
            stream = event.get("stream")
            if event.get("kind") != "output" or not isinstance(stream, str) or stream not in out:
                return
            data = _chunk(event)
            out[event["stream"]] += data
            if on_output is not None:
                on_output(event["stream"], data)
        return on_event, out

    # -- sessions ------------------------------------------------------------------------

    def ping(self):
        """{"pid", "uid", "version", "socket"} of the daemon."""
        return self.call("ping")

    def run(self, target, argv, stdin=None, on_output=None, backend=None, stack=False,
            wait=False, **grants):
        """Open a session on target, run argv in it, leave it pending: a Session.
        grants: jail, net, timeout, limits, merge_base (unasked: jailed and offline, held to
        the target's policy)."""
        grants = _grants("run", grants)
        args = {"target": _target(target), "argv": _argv(argv), "grants": grants,
                "backend": backend, "stack": stack or None, "wait": wait or None}
        _put_bytes(args, "stdin", stdin)
        on_event, out = self._output(on_output)
        reply = self.call("run", on_event=on_event, **args)
        return Session(self, reply, bytes(out["stdout"]), bytes(out["stderr"]))

    def open(self, target=None, on_output=None, backend=None, stack=False, wait=False,
             **grants):
        """Open a pending session on target (None: this process's working directory) for
        exec calls: a LiveSession. grants as for run(). on_output(stream, data) gets every
        exec's output as it is written. As a context manager it closes on exit and never
        commits."""
        grants = _grants("open", grants)
        reply = self.call("open", target=_target(target), grants=grants, backend=backend,
                          stack=stack or None, wait=wait or None)
        return LiveSession(self, reply, on_output)

    def exec(self, sid, argv, stdin=None, timeout=None, on_output=None, wait=None):
        """One more command in a pending session: an ExecResult. wait=False refuses (409)
        instead of queueing behind a command already running in the session."""
        args = {"sid": sid, "argv": _argv(argv), "timeout": timeout, "wait": wait}
        _put_bytes(args, "stdin", stdin)
        on_event, out = self._output(on_output)
        reply = self.call("exec", on_event=on_event, **args)
        return ExecResult(reply, bytes(out["stdout"]), bytes(out["stderr"]))

    def close_session(self, sid):
        """End a live session's attachment: this connection's requests still running in it
        are cancelled; the session stays pending for a person. {"sid", "state", "cancelled"}"""
        return self.call("close", sid=sid)

    def sessions(self):
        """Every session the daemon's OVERLORD_HOME holds, oldest first (dicts)."""
        return _list(self.call("sessions"), "sessions")

    def diff(self, sid):
        """The session's changes: [{"path", "kind", "layer", "details"}] (diff --json)."""
        return _list(self.call("diff", sid=sid), "changes")

    def log(self, sid):
        """{"sid", "changes": [{"path", "kind", "before", "after", "layer", "caused_by",
        "details"}], "dropped": [...]} (log --json)."""
        return self.call("log", sid=sid)

    def savepoints(self, sid):
        """[{"layer", "paths", "caused_by", "causes", "coarse", "pinned", "sealed", "bytes"}]"""
        return _list(self.call("savepoints", sid=sid), "savepoints")

    def rewind(self, sid, to):
        """Drop the savepoints above @to: {"sid", "to", "dropped"} (how many were dropped)."""
        return self.call("rewind", sid=sid, to=to)

    def fork(self, sid, at):
        """A new pending session holding sid's stack up to @at: a Session."""
        return Session(self, self.call("fork", sid=sid, at=at))

    def compare(self, a, b):
        """{"a", "b", "rows": [{"path", "status"}]}: same, differs, only-in-a, only-in-b."""
        return self.call("compare", a=a, b=b)

    def blame(self, path):
        """Who wrote each line of a committed file (blame --json's object)."""
        return self.call("blame", path=os.fspath(path))

    def revert(self, sid, stack=False, backend=None, **grants):
        """A new pending session undoing the committed session sid: a Session. grants as
        for open() (unasked: jailed and offline, held to the target's policy)."""
        grants = _grants("revert", grants)
        return Session(self, self.call("revert", sid=sid, stack=stack or None, backend=backend,
                                       grants=grants or None))

    def commit(self, sid, force=False, merge=False, only=(), drop=(), countersigned=False):
        """Commit onto the real tree (policy's allow_force and require_review hold): {"sid",
        "state": "committed", "changes", "counts", "merged", "findings", "countersigned"}."""
        return self.call("commit", sid=sid, force=force or None, merge=merge or None,
                         only=list(only) or None, drop=list(drop) or None,
                         countersigned=countersigned or None)

    def rollback(self, sid):
        return self.call("rollback", sid=sid)

    def check(self, sid, only=(), drop=()):
        """What a commit would face: check --json's object."""
        return self.call("check", sid=sid, only=list(only) or None, drop=list(drop) or None)

    def request_review(self, sid):
        """Mark the session as waiting for a person (the audit act session.needs_review)."""
        return self.call("request_review", sid=sid)

    def audit_head(self):
        """The audit chain's head: {"seq", "mac"} ({"seq": 0, "mac": None} when empty)."""
        return self.call("audit_head")

    # -- the agent -----------------------------------------------------------------------

    def agent(self, task, target=None, on_event=None, on_session=None, on_delta=None,
              **opts):
        """Run the built-in agent on task in a new session on target (None: this process's
        working directory); blocks until it is done, and returns a Session whose .reason,
        .turns, .usage and .message say how it ended (the session is left pending), .cost its
        running total ({calls, tokens, usd, unpriced, ...}) and .budget the budget stop
        ({key, limit, spent, source, kind, message}) when reason is "budget", else None.
        on_session(sid): once, as soon as the session exists (the sid agent_cancel takes);
        on_event(event): each transcript event as it is recorded ({"type": "task" |
        "request" | "assistant" | "tool_call" | "tool_result" | "done" | ..., ...});
        on_delta(type, text): the model's text as it streams. opts as docs/DAEMON.md's
        agent op: provider, model, base_url, headers, knobs, script, system, max_turns,
        context_window, jail, net, timeout, limits, backend, audit, stack, connectors (names
        configured with `overlord mcp add`; policy must name them for a brokered session, and an
        action is denied, as nobody can be asked), connector_shell."""
        return Session(self, self.call(
            "agent", on_event=_agent_events(on_event, on_session, on_delta), task=task,
            target=_target(target), deltas=True if on_delta else None, **opts))

    def resume(self, sid, note=None, on_event=None, on_delta=None, **opts):
        """Continue an agent session, note as the next user turn (headers, max_turns): a
        Session, as agent() returns."""
        return Session(self, self.call(
            "resume", on_event=_agent_events(on_event, None, on_delta), sid=sid, note=note,
            deltas=True if on_delta else None, **opts))

    def agent_cancel(self, sid):
        """Stop the agent running in session sid (from any thread or client): it stops at its
        next step, a running tool call is killed, the session stays pending. {"sid",
        "stopping"}: stopping is True when an agent was running in it."""
        return self.call("agent_cancel", sid=sid)

    def review(self, sid, on_event=None, **opts):
        """Put the session's pending diff before the reviewing model (provider, model,
        headers, knobs, api, same_model, only, drop): {"sid", "verdict"}. on_event gets the
        review's record as it is written. The reviewer is a person's choice: a brokered
        caller's `script` or `base_url` is refused (403)."""
        def unwrap(event):
            if on_event is not None and event.get("kind") == "review":
                on_event(event.get("event"))
        return self.call("review", on_event=unwrap, sid=sid, **opts)

    def models(self, **opts):
        """What an endpoint serves right now: [{"id", "name"}]."""
        return _list(self.call("models", **opts), "models")


def _agent_events(on_event, on_session, on_delta):
    def unwrap(event):
        kind = event.get("kind")
        if kind == "session" and on_session is not None:
            on_session(event.get("sid"))
        elif kind == "agent" and on_event is not None and isinstance(event.get("event"), dict):
            on_event(event["event"])
        elif kind == "delta" and on_delta is not None:
            on_delta(event.get("type"), event.get("text"))
    return unwrap


def _target(target):
    return os.path.abspath(os.fspath(target if target is not None else os.getcwd()))


def _list(reply, key):
    value = reply.get(key)
    if not isinstance(value, list):
        raise OverlordError(f"the daemon's reply holds no list {key!r}", BAD_REPLY)
    return value


class _Handle:
    """What every session handle offers: the review and decision ops on its sid."""

    def __init__(self, client, sid):
        self.client, self.sid = client, sid

    def diff(self):
        return self.client.diff(self.sid)

    def log(self):
        return self.client.log(self.sid)

    def savepoints(self):
        return self.client.savepoints(self.sid)

    def rewind(self, to):
        return self.client.rewind(self.sid, to)

    def fork(self, at):
        return self.client.fork(self.sid, at)

    def check(self, **opts):
        return self.client.check(self.sid, **opts)

    def review(self, **opts):
        return self.client.review(self.sid, **opts)

    def request_review(self):
        return self.client.request_review(self.sid)

    def commit(self, **opts):
        """Commit the session onto the real tree (force, merge, only, drop, countersigned):
        the daemon's commit result (a dict). Policy may refuse (403/409)."""
        return self.client.commit(self.sid, **opts)

    def rollback(self):
        return self.client.rollback(self.sid)


class Session(_Handle):
    """A session as an op left it: sid, state, exit_code, timed_out, layer, changes, notes
    (and for an agent: reason, turns, usage, message, cost, budget); stdout / stderr (bytes) what `run`'s
    command wrote. `.data` is the whole reply."""

    def __init__(self, client, reply, stdout=b"", stderr=b""):
        super().__init__(client, reply.get("sid"))
        self.data = reply
        self.state = reply.get("state")
        self.exit_code = reply.get("exit_code")
        self.timed_out = reply.get("timed_out")
        self.layer = reply.get("layer")
        self.changes = reply.get("changes", [])
        self.notes = reply.get("notes", [])
        self.stdout_bytes, self.stderr_bytes = stdout, stderr
        self.stdout = stdout.decode("utf-8", "replace")
        self.stderr = stderr.decode("utf-8", "replace")

    def __getattr__(self, name):
        data = self.__dict__.get("data") or {}
        if name in data:
            return data[name]
        raise AttributeError(name)

    def __repr__(self):
        return f"Session(sid={self.sid!r}, state={self.state!r}, exit_code={self.exit_code!r})"


class LiveSession(_Handle):
    """A pending session open for commands. exec(argv) / shell(command) each run one command
    (its own savepoint); close() ends the attachment and leaves the session pending. As a
    context manager it closes on exit -- it never commits or rolls back on its own."""

    def __init__(self, client, reply, on_output=None):
        super().__init__(client, reply.get("sid"))
        self.data = reply
        self.on_output = on_output
        self.closed = False

    @property
    def state(self):
        return self.data.get("state")

    def exec(self, argv, stdin=None, timeout=None, on_output=None):
        """Run argv (a list) in the session: an ExecResult. stdin: str or bytes; timeout in
        seconds (held to policy); on_output: as for the session, or the session's."""
        return self.client.exec(self.sid, argv, stdin=stdin, timeout=timeout,
                                on_output=on_output or self.on_output)

    def shell(self, command, stdin=None, timeout=None, on_output=None):
        """Run one shell command string with `sh -c`."""
        if not isinstance(command, str):
            raise OverlordError("shell() takes one command string", 400)
        return self.exec(["sh", "-c", command], stdin=stdin, timeout=timeout, on_output=on_output)

    def close(self):
        """End this attachment (idempotent). The session stays pending for a person."""
        if self.closed:
            return None
        self.closed = True
        return self.client.close_session(self.sid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        except OverlordError:
            if exc[0] is None:
                raise       # a failure of the block itself is the one to see

    def __repr__(self):
        return f"LiveSession(sid={self.sid!r})"


class ExecResult:
    """One command's outcome: exit_code, timed_out, cancelled, layer (the savepoint it sealed,
    or None), state (the session's, after it), stdout / stderr (str) and stdout_bytes /
    stderr_bytes (exact)."""

    def __init__(self, reply, stdout=b"", stderr=b""):
        self.data = reply
        self.sid = reply.get("sid")
        self.exit_code = reply.get("exit_code")
        self.timed_out = reply.get("timed_out")
        self.layer = reply.get("layer")
        self.state = reply.get("state")
        self.cancelled = reply.get("cancelled")
        self.stdout_bytes, self.stderr_bytes = stdout, stderr
        self.stdout = stdout.decode("utf-8", "replace")
        self.stderr = stderr.decode("utf-8", "replace")

    def __repr__(self):
        return (f"ExecResult(exit_code={self.exit_code!r}, timed_out={self.timed_out!r}, "
                f"layer={self.layer!r})")

