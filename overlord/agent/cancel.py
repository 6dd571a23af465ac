"""Stopping a run: one token (Cancel) per run. A face sets it (the workspace's Stop, from a
server thread) or Ctrl-C does (SIGINT, also SIGTERM and SIGHUP, on the CLI's main thread).

What honours it, at every depth:
  - between steps, the loop checks the flag;
  - during a model call, the provider HTTP layer watches its sockets and waits on the token
    between retries (providers/http.py): set() shuts the connection, the call raises Cancelled;
  - during a tool call, the engine kills the tool's whole process tree when it sees the flag
    (ops.exec_capture(cancel=...)), within 0.1 s;
  - during a connector call or at the approval gate, watch() / on_set() / wait() likewise.

Ctrl-C reaches the token two ways: our handler sets the flag (and, inside interruptible(),
raises Cancelled at once); and the signal's byte on the wakeup fd wakes a watcher thread that
calls set(), so watched sockets and on_set callbacks fire too -- also while the engine's
supervisor holds the handler during a tool call (it forwards the signal to the command, which
may ignore it).
"""
import contextlib
import os
import select
import signal
import socket
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Cancelled(BaseException):
    """Raised out of whatever a cancel interrupts (a BaseException: no `except Exception` eats it)."""


class Cancel:
    """The one cancel token of a run: the loop checks it between steps, the provider HTTP layer
    and the connector client honour it inside a call (watch: set() shuts a registered socket
    down, so a blocked read returns at once; wait: a pause that ends early), the engine kills
    a tool's process tree when it sees its event."""

    def __init__(self, event=None):
        self.event = event if event is not None else threading.Event()
        self._raise = False
        self._lock = threading.Lock()
        self._fds = {}               # token -> our duplicate of a watched socket's fd
        self._callbacks = {}         # token -> called once when set
        self._next = 0

    def is_set(self):
        return self.event.is_set()

    def set(self):
        self.event.set()
        with self._lock:
            fds, callbacks = list(self._fds.values()), list(self._callbacks.values())
        for fd in fds:
            _shutdown(fd)
        for callback in callbacks:
            callback()

    def check(self):
        """Raise Cancelled if the token is set."""
        if self.event.is_set():
            raise Cancelled()

    def wait(self, seconds):
        """Pause up to `seconds`; True (at once) when cancelled meanwhile."""
        return self.event.wait(max(0.0, seconds))

    @contextlib.contextmanager
    def watch(self, sock):
        """While inside, set() shuts `sock` down (we keep a duplicate of its fd, so a socket
        its owner closed meanwhile never lends its number to another). Set already: at once."""
        try:
            fd = os.dup(sock.fileno())
        except (OSError, ValueError):
            yield
            return
        token = self._add(self._fds, fd)
        if self.event.is_set():
            _shutdown(fd)
        try:
            yield
        finally:
            with self._lock:
                self._fds.pop(token, None)
            os.close(fd)

    @contextlib.contextmanager
    def on_set(self, callback):
        """While inside, set() also calls callback() (from the thread that sets)."""
        token = self._add(self._callbacks, callback)
        try:
            yield
        finally:
            with self._lock:
                self._callbacks.pop(token, None)

    def _add(self, table, value):
        with self._lock:
            self._next += 1
            table[self._next] = value
            return self._next

    @contextlib.contextmanager
    def interruptible(self):
        """Within: a cancel raises Cancelled at once (checked on entry too)."""
        if self.is_set():
            raise Cancelled()
        self._raise = True
        try:
            yield
        finally:
            self._raise = False

    def _handler(self, signum, frame):
        self.event.set()
        if self._raise:
            self._raise = False
            raise Cancelled()

    @contextlib.contextmanager
    def signals(self):
        """Wire SIGINT/SIGTERM/SIGHUP to this cancel for the duration. Only the main thread
        owns signals; elsewhere (a server's worker) the caller sets the event itself."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        saved = {sig: signal.signal(sig, self._handler) for sig in SIGNALS}
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        watcher = threading.Thread(target=self._watch, args=(r,), daemon=True)
        watcher.start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(old_fd)
            for sig, handler in saved.items():
                signal.signal(sig, handler)
            os.close(w)             # the watcher sees end of file and leaves
            watcher.join()
            os.close(r)

    def _watch(self, fd):
        wanted = {int(s) for s in SIGNALS}
        while True:
            select.select([fd], [], [])
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                continue
            if not data:
                return
            if wanted & set(data):
                self.set()          # not in the handler: set() takes a lock


def _shutdown(fd):
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
