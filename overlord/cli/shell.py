"""`overlord shell`: an interactive shell on a real pty, relayed to the operator's terminal."""
import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios
import threading
import tty

from overlord import ops


def _shell_argv(interactive):
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    return [shell, "-i"] if interactive else [shell]


def _copy_winsize(src_fd, dst_fd):
    try:
        size = fcntl.ioctl(src_fd, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        fcntl.ioctl(dst_fd, termios.TIOCSWINSZ, size)
    except OSError:
        pass


class Relay:
    """Copy bytes terminal <-> pty master until the shell side closes."""

    def __init__(self, master):
        self.master = master
        self.thread = threading.Thread(target=self._pump, daemon=True)

    def _pump(self):
        fds = [self.master, sys.stdin.fileno()]
        while True:
            try:
                ready, _, _ = select.select(fds, [], [])
            except InterruptedError:
                continue
            if self.master in ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                if not data:
                    return
                os.write(sys.stdout.fileno(), data)
            if sys.stdin.fileno() in ready:
                data = os.read(sys.stdin.fileno(), 65536)
                if not data:
                    fds.remove(sys.stdin.fileno())
                    continue
                os.write(self.master, data)


def run_shell(args):
    from overlord.cli.main import _grants
    grants = _grants(args)           # --net, --net-allow, --hold-writes (bad ones: refused here)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    if not interactive:
        return ops.run(_shell_argv(False), target=args.target, backend=args.backend,
                       wait=args.wait, stack=args.stack, cause={"kind": "command", "command": "shell"},
                       track_stdout=True, grants=grants)
    master, slave = pty.openpty()
    _copy_winsize(sys.stdin.fileno(), slave)
    relay = Relay(master)

    def started():
        os.close(slave)           # only the shell holds the slave: EOF on master when it exits
        relay.thread.start()
    saved_attrs = termios.tcgetattr(sys.stdin.fileno())
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: _copy_winsize(sys.stdin.fileno(), master))
    tty.setraw(sys.stdin.fileno(), termios.TCSADRAIN)     # keep what was typed ahead
    try:
        result = ops.run(_shell_argv(True), target=args.target, backend=args.backend, wait=args.wait,
                         stack=args.stack, pty_slave=slave, on_child=started,
                         cause={"kind": "command", "command": "shell"}, grants=grants)
        relay.thread.join(timeout=2)
    finally:
        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved_attrs)
        signal.signal(signal.SIGWINCH, old_winch)
        os.close(master)
    return result
