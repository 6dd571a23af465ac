"""The stdio transport: the server is a child process speaking newline-delimited JSON-RPC 2.0
on its stdin and stdout; its stderr is appended to the connector log (up to a cap, then
drained and dropped), never our terminal.

The child gets exactly the environment configured for it plus PATH, HOME and LANG from ours
(no provider key reaches a connector); a configured value that is `secret://NAME` is resolved
by the vault as the server starts (client.secret_values). It is started through a small supervisor (SUPERVISOR
below, the same Python, no preexec_fn): the supervisor is a child subreaper
(PR_SET_CHILD_SUBREAPER), so whatever the server leaves behind -- even a child that called
setsid() to leave its process group -- becomes the supervisor's child when its parent dies,
and is killed (it is our child until we reap it, so its pid cannot be someone else's). The
server runs in a session of its own with PR_SET_PDEATHSIG(SIGKILL) against the supervisor,
and the supervisor holds the read end of a lifeline pipe only we write: when we exit, however
we exit (SIGKILL included), the lifeline breaks and the supervisor ends the server's tree.
When the server exits, its process group and every orphan it left are ended, and the
supervisor exits with the server's status (which is what we report).

close(): stdin closed, a moment's grace, then the lifeline closed (the supervisor: SIGTERM to
the server's group, a grace, SIGKILL, the orphans swept), then SIGKILL to the supervisor as a
last resort; reaped. It never waits on a pipe.

Writes never block: a writer thread drains a bounded queue into the non-blocking stdin with
poll(). A request that times out or is cancelled before its line was written is taken out of
the queue; one left half-written ends the connection (the server is dead to us; the caller
reconnects at the next call); a queue over OUT_MAX bytes (a server that stopped reading) ends
it too. A reader thread hands each response to the call waiting on its id (the first answer
wins; a second one is logged and ignored), answers the server's `ping`, refuses every other
server request with -32601 and ignores notifications. A line that is not a JSON-RPC message
(or one over LINE_MAX bytes) ends the calls then waiting.
"""
import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from overlord.agent.cancel import Cancelled
from overlord.agent.connectors.client import (LINE_MAX, ConnectorError, TimedOut, _clip,
                                              answer_to_server, secret_values)

INHERITED = ("PATH", "HOME", "LANG")
GRACE = 1.0                  # seconds a server has to leave after its stdin closes
TERM_GRACE = 1.0             # seconds between SIGTERM and SIGKILL (the supervisor's)
OUT_MAX = 4 << 20            # bytes waiting for a server to read before it is dead to us
CHUNK = 1 << 16              # bytes written (or read) at a time

# argv: status-fd lifeline-fd term-grace command args...  The environment is the one we gave
# (read back from /proc/self/environ: Python's own start may coerce LC_CTYPE into os.environ).
# Status line on status-fd: "S<server pid>" once the command was exec'd, "E<errno>" when not.
SUPERVISOR = r'''
import os, select, signal, sys, time
status, lifeline, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
argv = sys.argv[4:]
ENDING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
try:
    import ctypes
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
    def prctl(option, value):
        return _prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0),
                      ctypes.c_ulong(0), ctypes.c_ulong(0))
except Exception:
    def prctl(option, value):
        return -1
prctl(36, 1)                                     # PR_SET_CHILD_SUBREAPER
try:
    with open("/proc/self/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
except OSError:
    env = dict(os.environb)
woke, wake = os.pipe()                          # a signal to end us wakes the poll below
os.set_blocking(wake, False)
signal.set_wakeup_fd(wake)
for sig in ENDING:
    signal.signal(sig, lambda *_: None)
me = os.getpid()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        prctl(1, signal.SIGKILL)                 # PR_SET_PDEATHSIG: die with the supervisor
        if os.getppid() != me:
            os._exit(127)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        os.closerange(3, w)
        os.closerange(w + 1, 1 << 16)
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(w, b"%d" % (exc.errno or 0))
    except BaseException:
        pass
    os._exit(127)
os.close(w)
err = b""
while True:
    chunk = os.read(r, 64)
    if not chunk:
        break
    err += chunk
os.close(r)
if err:
    os.write(status, b"E" + err + b"\n")
    os.waitpid(pid, 0)
    os._exit(127)
os.write(status, b"S%d\n" % pid)
os.close(status)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
os.close(null)
try:
    pidfd = os.pidfd_open(pid)
except (AttributeError, OSError):
    pidfd = None

def exited():
    # the server exited (a zombie: not reaped, so its pid and group id stay ours)
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

def wait(fds, timeout):
    # until one of fds is readable, the server exited, or timeout (None: no end)
    poller = select.poll()
    for fd in fds + ([pidfd] if pidfd is not None else []):
        poller.register(fd, select.POLLIN)
    end_at = None if timeout is None else time.monotonic() + timeout
    while not exited():
        left = None if end_at is None else end_at - time.monotonic()
        if left is not None and left <= 0:
            return
        step = left if pidfd is not None else min(0.1, left or 0.1)
        if poller.poll(None if step is None else step * 1000) and fds and not exited():
            return

wait([lifeline, woke], None)                     # the server exits, or we are told to end
if not exited():                                 # told to end: the lifeline or a signal
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGTERM)
        except OSError:
            pass
    wait([], grace)
for kill in (os.killpg, os.kill):
    try:
        kill(pid, signal.SIGKILL)                # and what it left in its group
    except OSError:
        pass
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

def children():
    try:
        with open("/proc/self/task/%d/children" % me) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        pass
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return found

while True:                                      # the orphans it left: ours, as a subreaper
    for child in children():
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
if code < 0:                                     # the server's death, as our own
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        signal.signal(-code, signal.SIG_DFL)
    except (OSError, ValueError):
        pass                                     # SIGKILL: its default cannot be changed
    os.kill(me, -code)
os._exit(code & 0xFF if code >= 0 else 128 - code)
'''


def environment(configured):
    """The child's environment: PATH, HOME and LANG from ours, then what was configured."""
    env = {k: os.environ[k] for k in INHERITED if k in os.environ}
    env.update({str(k): str(v) for k, v in (configured or {}).items()})
    return env


class _Slot:
    __slots__ = ("event", "answer", "error", "after")

    def __init__(self):
        self.event = threading.Event()
        self.answer = None
        self.error = None
        self.after = None        # chunks read from stdout when its request was all written


class _Out:
    """One line queued for the server's stdin, and how much of it was written."""
    __slots__ = ("data", "sent", "slot")

    def __init__(self, data, slot=None):
        self.data, self.sent, self.slot = data, 0, slot


class Stdio:
    def __init__(self, server, log, deadline=None, cancel=None):
        self.name, self.log = server.name, log
        command = getattr(server, "command", None)
        if not isinstance(command, str) or not command:
            raise ConnectorError(f"connector {self.name}: no command to start")
        if not sys.executable:
            raise ConnectorError(f"connector {self.name}: cannot start {_clip(command)}: no "
                                 "Python interpreter to supervise it")
        argv = [command, *[str(a) for a in (getattr(server, "args", None) or [])]]
        env = environment(secret_values(self.name, "env", getattr(server, "env", None)))
        self.pending = {}                  # request id -> _Slot
        self.lock = threading.Lock()       # pending, dead, the queue
        self.cond = threading.Condition(self.lock)
        self.queue = collections.deque()   # _Out, oldest first
        self.queued = 0                    # bytes in the queue
        self.chunks = 0                    # reads from stdout so far (answers' ordering)
        self.dead = None                   # why the connection is over, once it is
        self.closing = False               # close() began: the writer drains, then stops
        self.stopping = False              # the writer stops now
        self.reaped = False
        self.pidfd = None
        self.lifeline = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        status_r, status_w = os.pipe()
        life_r, life_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", SUPERVISOR, str(status_w), str(life_r),
                 str(TERM_GRACE), *argv],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if log.path is not None else subprocess.DEVNULL,
                env=env, start_new_session=True,
                close_fds=True, pass_fds=(status_w, life_r))
        except OSError as exc:
            for fd in (status_r, life_w, self.wake_r, self.wake_w):
                os.close(fd)
            raise ConnectorError(f"connector {self.name}: cannot start {_clip(command)}: "
                                 f"{exc.strerror or exc}") from None
        finally:
            os.close(status_w)
            os.close(life_r)
        self.lifeline = life_w
        self.pid = self.proc.pid           # the supervisor (its exit status is the server's)
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None
        try:
            self.server_pid = self._started(status_r, command, deadline, cancel)
        except BaseException:
            self._kill()
            raise
        finally:
            os.close(status_r)
        self.stdin = self.proc.stdin.fileno()
        os.set_blocking(self.stdin, False)
        self.reader = threading.Thread(target=self._read, name=f"mcp-{self.name}", daemon=True)
        self.writer = threading.Thread(target=self._write_loop, name=f"mcp-{self.name}-in",
                                       daemon=True)
        self.drainer = None
        if self.proc.stderr is not None:
            self.drainer = threading.Thread(target=self._drain, name=f"mcp-{self.name}-err",
                                            daemon=True)
            self.drainer.start()
        self.reader.start()
        self.writer.start()

    def _started(self, fd, command, deadline, cancel):
        """The server's pid once the supervisor exec'd it; ConnectorError when it could not."""
        line = b""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        watch = cancel.on_set(self._wake) if cancel is not None else contextlib.nullcontext()
        with watch:
            while b"\n" not in line:
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise ConnectorError(f"connector {self.name}: {_clip(command)} did not "
                                         "start in time")
                ready = {f for f, _ in poller.poll(None if left is None else left * 1000)}
                if self.wake_r in ready:
                    self._unwake()
                if fd in ready:
                    chunk = os.read(fd, 64)
                    if not chunk:
                        break
                    line += chunk
        if line.startswith(b"S") and line[1:].strip().isdigit():
            return int(line[1:])
        if line.startswith(b"E") and line[1:].strip().isdigit():
            why = os.strerror(int(line[1:]))
        else:
            why = "its supervisor failed (see the connector log)"
        raise ConnectorError(f"connector {self.name}: cannot start {_clip(command)}: {why}")

    # -- what the client calls ----------------------------------------------------------------

    def stateless(self, version):
        pass

    def handshake(self, version):
        pass

    def request(self, msg_id, message, deadline, cancel):
        slot = _Slot()
        with self.lock:
            if self.dead:
                raise ConnectorError(f"connector {self.name}: {self.dead}")
            self.pending[msg_id] = slot
        try:
            out = self._send(message, slot)
            watch = cancel.on_set(slot.event.set) if cancel is not None else \
                contextlib.nullcontext()
            with watch:
                while True:
                    if slot.answer is not None:
                        return slot.answer
                    if slot.error is not None:
                        raise ConnectorError(f"connector {self.name}: {slot.error}")
                    if cancel is not None and cancel.is_set():
                        self._abandon(out, "cancelled")
                        raise Cancelled()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._abandon(out, "timed out")
                        raise TimedOut(f"connector {self.name}: timed out")
                    slot.event.wait(left)
        finally:
            with self.lock:
                self.pending.pop(msg_id, None)

    def notify(self, message):
        self._send(message)

    def close(self, hurry=False):
        """hurry (the run was stopped: a person is waiting for the prompt): a tenth of the
        graces, then SIGKILL -- the server was already told to cancel what it was doing."""
        grace, term = (GRACE / 10, (TERM_GRACE + GRACE) / 4) if hurry else (GRACE, TERM_GRACE + GRACE)
        with self.cond:
            self.closing = True            # the writer writes what is queued, then closes stdin
            self.cond.notify_all()
        if not self._exited(grace):
            self._stop_writer()
            self._close_lifeline()         # the supervisor: SIGTERM, a grace, SIGKILL, sweep
            if not self._exited(term):
                self._signal(signal.SIGKILL)
        self.reader.join(GRACE)            # the server's tree is gone: its pipes are at EOF
        if self.drainer is not None:
            self.drainer.join(GRACE)
        self._kill()
        self._fail("is closed")

    # -- the process --------------------------------------------------------------------------

    def _kill(self):
        """End it all now (a failed start, or the end of close) and reap the supervisor."""
        self._stop_writer()
        self._close_lifeline()             # the supervisor ends the server's tree, and exits
        if not self._exited(TERM_GRACE + GRACE):
            self._signal(signal.SIGKILL)
        self.proc.wait()
        self.reaped = True
        writer = getattr(self, "writer", None)
        if writer is not None:
            writer.join(GRACE)             # it only ever waits in poll() with the wake pipe
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and (pipe is not self.proc.stdin or writer is None
                                     or not writer.is_alive()):
                with contextlib.suppress(OSError):
                    pipe.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        if writer is None or not writer.is_alive():
            with self.lock:
                for fd in (self.wake_r, self.wake_w):
                    os.close(fd)
                self.wake_r = self.wake_w = None

    def _close_lifeline(self):
        with self.lock:
            fd, self.lifeline = self.lifeline, None
        if fd is not None:
            os.close(fd)

    def _signal(self, sig):
        """Signal the supervisor's group (its leader is not reaped yet, so the id is ours)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _exited(self, timeout):
        """Whether the supervisor has exited within timeout seconds (it is not reaped)."""
        if self.reaped:
            return True
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            return bool(poller.poll(timeout * 1000))
        end = time.monotonic() + timeout
        while True:
            if self._status() is not None:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)

    def _status(self):
        """The exit status without reaping, or None while it runs."""
        if self.reaped:
            return self.proc.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.proc.returncode
        if info is None:
            return None
        if info.si_code == os.CLD_EXITED:
            return info.si_status
        return -info.si_status

    # -- writing: a bounded queue, a writer thread, never a blocking write ---------------------

    def _send(self, message, slot=None):
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        out = _Out(data.encode("utf-8", "surrogatepass") + b"\n", slot)
        what = message.get("method") or "an answer"
        with self.cond:
            if self.dead or self.closing:
                raise ConnectorError(f"connector {self.name}: {self.dead or 'is closed'} "
                                     f"({_clip(what)} was not sent)")
            full = self.queued > OUT_MAX
            if not full:
                self.queue.append(out)
                self.queued += len(out.data)
                self.cond.notify_all()
        if full:
            why = (f"stopped reading its input ({self.queued >> 20} MiB waiting): the "
                   "connection is over")
            self._end(why)
            raise ConnectorError(f"connector {self.name}: {why} ({_clip(what)} was not sent)")
        return out

    def _abandon(self, out, why):
        """A request given up (timed out, cancelled): out of the queue when none of it was
        written; half-written, the connection is over (its next line would be garbage)."""
        with self.lock:
            if out.sent == len(out.data):
                return
            if out.sent == 0:
                with contextlib.suppress(ValueError):
                    self.queue.remove(out)
                    self.queued -= len(out.data)
                return
        self._end(f"stopped reading its input: a request {why} half-written "
                  f"({out.sent} of {len(out.data)} bytes): the connection is over")

    def _write_loop(self):
        poller = select.poll()
        poller.register(self.stdin, select.POLLOUT)
        poller.register(self.wake_r, select.POLLIN)
        failed = None
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.stopping and not self.closing:
                        self.cond.wait()
                    if self.stopping or not self.queue:
                        return
                    out = self.queue[0]
                    try:
                        n = os.write(self.stdin, memoryview(out.data)[out.sent:out.sent + CHUNK])
                    except BlockingIOError:
                        n = None
                    except OSError as exc:
                        failed = exc
                        return
                    if n is not None:
                        out.sent += n
                        if out.sent == len(out.data):
                            self.queue.popleft()
                            if out.slot is not None:     # an answer must be read after this
                                out.slot.after = self.chunks
                            self.queued -= len(out.data)
                        continue
                poller.poll()                # writable again, or woken to stop
                self._unwake()
        finally:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            if failed is not None:
                status = self._status()
                self._end(f"the server exited with status {status}" if status is not None
                          else f"the server closed its input ({failed.strerror or failed})")

    def _stop_writer(self):
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self._wake()

    def _wake(self):
        with self.lock, contextlib.suppress(OSError):
            if self.wake_w is not None:
                os.write(self.wake_w, b"\0")

    def _unwake(self):
        with contextlib.suppress(OSError):
            while os.read(self.wake_r, 64):
                pass

    def _end(self, why):
        """The connection is over (the server is dead to us; close() ends the process)."""
        with self.lock:
            first = self.dead is None and not self.closing
        if first:
            self.log.write(why)
        self._fail(why)
        self._stop_writer()

    # -- reading: stderr to the log, stdout to the calls ---------------------------------------

    def _drain(self):
        """The server's stderr into the log until the cap, then read and dropped (the server
        never blocks on it)."""
        fd, keep = self.proc.stderr.fileno(), True
        with contextlib.suppress(OSError):
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    return
                if keep:
                    keep = self.log.stderr(chunk)

    def _read(self):
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        skipping = False                     # inside a line over LINE_MAX: drop to its end
        try:
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                with self.lock:
                    self.chunks += 1
                    index = self.chunks
                start = 0
                while True:
                    end = chunk.find(b"\n", start)
                    if end < 0:
                        break
                    if skipping:
                        skipping = False
                    else:
                        buf += chunk[start:end]
                        self._line(bytes(buf), index)
                    buf.clear()
                    start = end + 1
                if not skipping:
                    buf += chunk[start:]
                    if len(buf) > LINE_MAX:
                        buf.clear()
                        skipping = True
                        self._garbage(f"sent a line over {LINE_MAX >> 20} MiB")
        except OSError:
            pass
        if self.closing:
            self._fail("is closed")
            return
        status = self._status() if self._exited(0.5) else None
        why = "closed its output" if status is None else f"exited with status {status}"
        self.log.write(f"the server {why}")
        self._fail(f"the server {why}")

    def _fail(self, why):
        """The connection is over: no request is taken any more, the calls waiting end."""
        with self.lock:
            if self.dead is None:
                self.dead = why
        self._end_calls(f"{why} (no answer)")

    def _garbage(self, what):
        """A line no call can take: the calls then waiting end (the connection stays)."""
        self.log.write(what)
        self._end_calls(what)

    def _end_calls(self, error):
        """Every call waiting without an answer ends with `error`."""
        with self.lock:
            slots = list(self.pending.values())
        for slot in slots:
            if slot.answer is None and slot.error is None:
                slot.error = error
            slot.event.set()

    def _line(self, line, index=None):
        """One line from stdout; index: the read it came in (None: unknown, not checked)."""
        if not line.strip():
            return
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            msg = None
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return self._garbage("sent garbage on stdout (not a JSON-RPC message): "
                                 + _clip(line.decode("utf-8", "replace"), 60))
        method = msg.get("method")
        if isinstance(method, str):
            if "id" in msg:
                with contextlib.suppress(ConnectorError):     # queued, never blocking the reader
                    self._send(answer_to_server(msg["id"], method, self.log))
            return                                   # a notification: nothing to do
        if "id" in msg and ("result" in msg or "error" in msg):
            with self.lock:
                slot = self.pending.get(msg["id"]) if _key(msg["id"]) else None
                early = slot is not None and index is not None and (
                    slot.after is None or index <= slot.after)
                first = slot is not None and not early and slot.answer is None
                if first:
                    slot.answer = msg
            if first:
                slot.event.set()
            elif early:
                self.log.write(f"answered request {_clip(msg['id'])} before it was sent "
                               "(ignored)")
            elif slot is not None:
                self.log.write(f"answered request {_clip(msg['id'])} again: the first answer "
                               "stands, this one is ignored")
            else:
                self.log.write(f"sent an answer to {_clip(msg['id'])}, which no call awaits "
                               "(ignored)")
            return
        self._garbage("sent a message that is neither a request nor a response: "
                      + _clip(line.decode("utf-8", "replace"), 60))


def _key(value):
    return isinstance(value, (str, int)) and not isinstance(value, bool)
