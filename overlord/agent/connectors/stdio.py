"""The stdio transport: the server is a child process speaking newline-delimited JSON-RPC 2.0
on its stdin and stdout; its stderr is appended to the connector log, never our terminal.

The child gets exactly the environment configured for it plus PATH, HOME and LANG from ours
(no provider key reaches a connector), and runs in a session of its own, so close() can end
its whole process group: stdin closed, a moment's grace, SIGTERM, SIGKILL, reaped. The leader
is reaped last, so the group id we signal can never be someone else's.

A reader thread hands each response to the call waiting on its id, answers the server's
`ping`, refuses every other server request with -32601 and ignores notifications. A line
that is not a JSON-RPC message (or one over LINE_MAX bytes) ends the calls then waiting.
"""
import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time

from overlord.agent.cancel import Cancelled
from overlord.agent.connectors.client import (LINE_MAX, METHOD_NOT_FOUND, ConnectorError,
                                              TimedOut, _clip)

INHERITED = ("PATH", "HOME", "LANG")
GRACE = 1.0                  # seconds a server has to leave after its stdin closes
TERM_GRACE = 1.0             # seconds between SIGTERM and SIGKILL


def environment(configured):
    """The child's environment: PATH, HOME and LANG from ours, then what was configured."""
    env = {k: os.environ[k] for k in INHERITED if k in os.environ}
    env.update({str(k): str(v) for k, v in (configured or {}).items()})
    return env


class _Slot:
    __slots__ = ("event", "answer", "error")

    def __init__(self):
        self.event = threading.Event()
        self.answer = None
        self.error = None


class Stdio:
    def __init__(self, server, log):
        self.name, self.log = server.name, log
        command = getattr(server, "command", None)
        if not isinstance(command, str) or not command:
            raise ConnectorError(f"connector {self.name}: no command to start")
        argv = [command, *[str(a) for a in (getattr(server, "args", None) or [])]]
        errfd = log.stderr()
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=errfd if errfd is not None else subprocess.DEVNULL,
                env=environment(getattr(server, "env", None)), start_new_session=True,
                close_fds=True)
        except OSError as exc:
            raise ConnectorError(f"connector {self.name}: cannot start {_clip(command)}: "
                                 f"{exc.strerror or exc}") from None
        finally:
            if errfd is not None:
                os.close(errfd)
        self.pid = self.proc.pid
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None
        self.pending = {}                  # request id -> _Slot
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.dead = None                   # why the connection is over, once it is
        self.closing = False
        self.reaped = False
        self.reader = threading.Thread(target=self._read, name=f"mcp-{self.name}", daemon=True)
        self.reader.start()

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
            self._write(message)
            watch = cancel.on_set(slot.event.set) if cancel is not None else \
                contextlib.nullcontext()
            with watch:
                while True:
                    if slot.answer is not None:
                        return slot.answer
                    if slot.error is not None:
                        raise ConnectorError(f"connector {self.name}: {slot.error}")
                    if cancel is not None and cancel.is_set():
                        raise Cancelled()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimedOut(f"connector {self.name}: timed out")
                    slot.event.wait(left)
        finally:
            with self.lock:
                self.pending.pop(msg_id, None)

    def notify(self, message):
        self._write(message)

    def close(self):
        self.closing = True
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        if not self._exited(GRACE):
            self._signal(signal.SIGTERM)
            self._exited(TERM_GRACE)
        self._signal(signal.SIGKILL)        # the leader, or what it left behind in its group
        self.proc.wait()
        self.reaped = True
        self.reader.join(GRACE)
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        with contextlib.suppress(OSError):
            self.proc.stdout.close()
        self._fail("is closed")

    # -- the process --------------------------------------------------------------------------

    def _signal(self, sig):
        """Signal the whole group (the leader is not reaped yet, so its id is still ours)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _exited(self, timeout):
        """Whether the leader has exited within timeout seconds (it is not reaped)."""
        if self.pidfd is not None:
            return bool(select.select([self.pidfd], [], [], timeout)[0])
        end = time.monotonic() + timeout
        while True:
            if self._status() is not None:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)

    def _status(self):
        """The leader's exit status without reaping it, or None while it runs."""
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

    def _write(self, message):
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        data = data.encode("utf-8", "surrogatepass") + b"\n"
        with self.write_lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (OSError, ValueError):
                raise ConnectorError(f"connector {self.name}: {self.dead or 'is not running'} "
                                     f"({message.get('method') or 'an answer'} was not sent)"
                                     ) from None

    # -- the reader thread --------------------------------------------------------------------

    def _read(self):
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        skipping = False                     # inside a line over LINE_MAX: drop to its end
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                start = 0
                while True:
                    end = chunk.find(b"\n", start)
                    if end < 0:
                        break
                    if skipping:
                        skipping = False
                    else:
                        buf += chunk[start:end]
                        self._line(bytes(buf))
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
        with self.lock:
            if self.dead is None:
                self.dead = why
            slots = list(self.pending.values())
        for slot in slots:
            if slot.answer is None and slot.error is None:
                slot.error = f"{why} (no answer)"
            slot.event.set()

    def _garbage(self, what):
        self.log.write(what)
        with self.lock:
            slots = list(self.pending.values())
        for slot in slots:
            if slot.answer is None and slot.error is None:
                slot.error = what
            slot.event.set()

    def _line(self, line):
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
                self._answer_request(msg["id"], method)
            return                                   # a notification: nothing to do
        if "id" in msg and ("result" in msg or "error" in msg):
            with self.lock:
                slot = self.pending.get(msg["id"]) if _key(msg["id"]) else None
            if slot is not None:
                slot.answer = msg
                slot.event.set()
            return                                   # an answer nobody awaits any more
        self._garbage("sent a message that is neither a request nor a response: "
                      + _clip(line.decode("utf-8", "replace"), 60))

    def _answer_request(self, msg_id, method):
        if method == "ping":
            answer = {"jsonrpc": "2.0", "id": msg_id, "result": {}}
        else:
            answer = refusal(msg_id, method)
            self.log.write(f"refused the server's request {_clip(method)} (not supported)")
        with contextlib.suppress(ConnectorError):
            self._write(answer)


def refusal(msg_id, method):
    return {"jsonrpc": "2.0", "id": msg_id, "error": {
        "code": METHOD_NOT_FOUND,
        "message": f"Method not found: this client does not support {_clip(method)}"}}


def _key(value):
    return isinstance(value, (str, int)) and not isinstance(value, bool)
