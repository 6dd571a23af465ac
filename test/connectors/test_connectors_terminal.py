"""The approval gate at a real terminal (a pty: the CLI asks on /dev/tty), and Ctrl-C -- typed
at that terminal -- ending a run within 2 s at the gate and during a connector call."""
import os
import pty
import select
import signal
import sys
import time

from conftest import REPO
from connlib import ENV, acts, configure, everything_argv, kovl, of_type, results, write_script  # noqa: F401

STOP_WITHIN = 2.0


class Terminal:
    """`overlord agent ...` with a pty as its controlling terminal (stdin, stdout, /dev/tty)."""

    def __init__(self, home, backend, argv):
        env = dict(os.environ, **ENV, OVERLORD_HOME=str(home), PYTHONPATH=REPO,
                   OVERLORD_TEST_BACKEND=backend)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe(sys.executable, [sys.executable, "-m", "overlord", *map(str, argv)], env)
        self.seen = b""

    def expect(self, text, timeout=60):
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; the terminal shows:\n{self.seen.decode(errors='replace')}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:
                    data = b""
                assert data, f"the terminal closed before {text!r}:\n{self.seen.decode(errors='replace')}"
                self.seen += data
        return self.seen.decode(errors="replace")

    def type(self, data):
        os.write(self.fd, data)

    def wait(self, timeout=60):
        """The exit status, reading what is left meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                try:
                    self.seen += os.read(self.fd, 4096)
                except OSError:
                    pass
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"the run did not end:\n{self.seen.decode(errors='replace')}")


def at_the_terminal(home, target, tmp_path, turns):
    """`overlord agent` granted server-everything, the model playing `turns`, on a pty."""
    configure(home, {"everything": everything_argv()})
    script = write_script(tmp_path, turns)
    return Terminal(home, "kernel", ["agent", "-t", target, "--provider", "scripted", "--script",
                                     script, "--connector", "everything", "do it"])


def last_run(kovl, home):
    """(sid, transcript events) of the newest session."""
    sid = sorted(os.listdir(home / "sessions"))[-1]
    return sid, kovl.events(sid)


TOGGLE = {"name": "mcp__everything__toggle-simulated-logging", "input": {}}


def test_the_operator_allows_one_call_and_denies_the_next(kovl, home, target, tmp_path):
    term = at_the_terminal(home, target, tmp_path,
                           [{"tool_calls": [TOGGLE]}, {"tool_calls": [TOGGLE]}, {"text": "ok"}])
    shown = term.expect("[y/N] ")
    assert "everything:toggle-simulated-logging" in shown and "does not mark it read-only" in shown
    term.type(b"y\n")
    term.expect("allowed by the operator at the terminal")
    term.seen = b""
    term.expect("[y/N] ")
    term.type(b"n\n")
    term.expect("denied by the operator at the terminal")
    assert term.wait() == 0
    sid, ev = last_run(kovl, home)
    first, second = of_type(ev, "approval")
    assert first["allow"] and not second["allow"] and "terminal" in first["by"]
    assert [r["result"]["is_error"] for r in of_type(ev, "tool_result")] == [False, True]
    names = [a["action"] for a in acts(home, sid)]
    assert names == ["connector.call", "connector.approval_requested", "connector.decision",
                     "connector.result", "connector.call", "connector.approval_requested",
                     "connector.decision"]
    decisions = [a for a in acts(home, sid) if a["action"] == "connector.decision"]
    assert [d["decision"] for d in decisions] == ["allow", "deny"]
    assert all("terminal" in d["approver"] for d in decisions)


def _interrupt(term):
    started = time.monotonic()
    term.type(b"\x03")                 # Ctrl-C, typed at the terminal
    code = term.wait(timeout=10)
    return code, time.monotonic() - started


def test_ctrl_c_at_the_approval_prompt_ends_the_run(kovl, home, target, tmp_path):
    term = at_the_terminal(home, target, tmp_path, [{"tool_calls": [TOGGLE]}, {"text": "never"}])
    term.expect("[y/N] ")
    code, took = _interrupt(term)
    assert code == 130 and took < STOP_WITHIN, (code, took, term.seen)
    sid, ev = last_run(kovl, home)
    assert of_type(ev, "done")[0]["reason"] == "cancelled"
    (decision,) = of_type(ev, "approval")
    assert not decision["allow"]
    assert "connector.result" not in [a["action"] for a in acts(home, sid)]


def test_ctrl_c_during_a_connector_call_ends_the_run(kovl, home, target, tmp_path):
    slow = {"name": "mcp__everything__trigger-long-running-operation", "input": {"duration": 60, "steps": 60}}
    term = at_the_terminal(home, target, tmp_path, [{"tool_calls": [slow]}, {"text": "never"}])
    term.expect("everything:trigger-long-running-operation")
    deadline = time.monotonic() + 30   # allowed (read-only): the call goes out right after the decision act
    while "connector.decision" not in [a["action"] for a in acts(home)]:
        assert time.monotonic() < deadline, term.seen
        time.sleep(0.02)
    code, took = _interrupt(term)
    assert code == 130 and took < STOP_WITHIN, (code, took, term.seen)
    sid, ev = last_run(kovl, home)
    assert of_type(ev, "done")[0]["reason"] == "cancelled"
    res = of_type(ev, "tool_result")[0]
    assert res["cancelled"] and res["result"]["is_error"]
    last = acts(home, sid)[-1]
    assert last["action"] == "connector.result" and last["cancelled"] is True
