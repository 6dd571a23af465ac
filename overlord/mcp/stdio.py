"""The stdio transport: newline-delimited JSON-RPC on stdin and stdout.

stdout carries protocol messages and nothing else, ever: before anything runs, the protocol's
ends are moved to private descriptors and fd 0 and fd 1 become /dev/null and stderr, so a
stray print, a library's warning or a child process that inherits them cannot corrupt the
stream. Diagnostics go to stderr.

The reader handles every message in turn, except tool calls, which each run on a thread of
their own: `ping` and `notifications/cancelled` are answered while a command runs, and a
cancel kills that command's tree (its session stays pending). End of input cancels what is
still running and ends the server.
"""
import os
import sys
import threading

from overlord.mcp import jsonrpc as J
from overlord.mcp import protocol

LINE_MAX = 32 << 20          # bytes of one message line (a write_file's content rides in it)
JOIN = 10.0                  # seconds to let cancelled calls finish at the end of input


def claim_stdio():
    """(input file, output fd): the protocol's private ends. Leaves fd 0 on /dev/null and fd 1
    on stderr, and sys.stdout pointing at stderr."""
    proto_in, proto_out = os.dup(0), os.dup(1)       # new descriptors are close-on-exec
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_in, "rb", buffering=1 << 16), proto_out


class Writer:
    """Whole messages, one line each, from any thread."""

    def __init__(self, fd):
        self.fd, self.lock, self.broken = fd, threading.Lock(), False

    def send(self, message):
        if message is None:
            return
        data = J.encode(message) + b"\n"
        with self.lock:
            if self.broken:
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view):]
            except OSError:
                self.broken = True        # the client went away; the reader sees EOF next


def serve(tools, infile, out_fd):
    """Serve one client until its input ends. Returns 0."""
    conversation = protocol.Conversation(tools)
    writer = Writer(out_fd)
    threads = set()
    try:
        for line in _lines(infile, writer):
            try:
                msg = J.decode(line)
            except J.RpcError as exc:
                writer.send(J.error(exc.id, exc))
                continue
            answer, work = conversation.receive(msg)
            writer.send(answer)
            if work is not None:
                thread = threading.Thread(target=_run, args=(work, writer, threads), daemon=True)
                threads.add(thread)
                thread.start()
    finally:
        conversation.cancel()
        for thread in list(threads):
            thread.join(JOIN)
    return 0


def _run(work, writer, threads):
    try:
        writer.send(work())
    finally:
        threads.discard(threading.current_thread())


def _lines(infile, writer):
    """The non-blank lines of the input (without their newline); a line over LINE_MAX is
    answered with -32600 and skipped."""
    while True:
        line = infile.readline(LINE_MAX + 1)
        if not line:
            return
        if len(line) > LINE_MAX and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = infile.readline(1 << 20)
            writer.send(J.error(None, J.RpcError(
                J.INVALID_REQUEST, f"Invalid Request: a message is at most {LINE_MAX} bytes")))
            continue
        line = line.strip()
        if line:
            yield line
