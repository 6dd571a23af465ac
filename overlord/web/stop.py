"""Stop: cancelling an agent that runs in a server thread, within 2 s, at any moment.

The agent's own Cancel (ops.Cancel) gets a model call out of a blocking socket read
by raising from a signal handler, which only works on the main thread. A conversation runs in a
server thread, so Stop does the same job another way, with no change to the agent:

  - between steps and during a tool call, nothing new: the loop checks the flag, and the
    launcher passes it to the helper, which kills the command's tree;
  - during a model call (`interruptible()`), the connections the thread opens are noticed
    through the interpreter's audit hook ("socket.connect"), and set() shuts them down: the
    read returns at once and the provider sees a broken answer. Its retry then either sleeps
    ("time.sleep") or connects again, and the hook raises Cancelled there, as the signal
    handler would have.

The hook is process-wide and installed once; for every other event it is one dictionary look-up.
"""
import contextlib
import os
import socket
import sys
import threading

from overlord.ops.cancel import Cancel, Cancelled

_calls = {}                  # thread ident -> the Stop whose model call that thread is making
_installed = False
_install_lock = threading.Lock()


def _hook(event, args):
    if event != "socket.connect" and event != "time.sleep":
        return
    stop = _calls.get(threading.get_ident())
    if stop is None:
        return
    if stop.is_set():
        raise Cancelled()
    if event == "socket.connect":
        stop._adopt(args[0])


def _install():
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True


class Stop(Cancel):
    """A Cancel another thread may set: set() also breaks the model call in progress."""

    def __init__(self):
        super().__init__()
        _install()
        self._lock = threading.Lock()
        self._fds = []               # our duplicates of the model call's sockets

    @contextlib.contextmanager
    def interruptible(self):
        if self.is_set():
            raise Cancelled()
        ident = threading.get_ident()
        _calls[ident] = self
        try:
            yield
        finally:
            _calls.pop(ident, None)
            with self._lock:
                fds, self._fds = self._fds, []
            for fd in fds:
                os.close(fd)

    def _adopt(self, sock):
        """Keep a duplicate of a socket the model call opened, so set() can shut it down."""
        try:
            fd = os.dup(sock.fileno())
        except OSError:
            return
        with self._lock:
            self._fds.append(fd)

    def set(self):
        self.event.set()
        with self._lock:
            fds = list(self._fds)
            for fd in fds:
                try:
                    with socket.socket(fileno=os.dup(fd)) as s:
                        s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
