"""What the CLI says, as a person at a terminal meets it: OVERLORD's own lines survive whatever
a command left the terminal in, text a command chose reaches the terminal escaped, and the
refusals and summaries name what happened (a deleted target, a crossed disk grant, a mergeable
drift, a fork)."""
import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios

from conftest import SESSION_RE, Ovl, state_of

COLS = 80


# -- a small terminal -----------------------------------------------------------------------------

class Screen:
    """Just enough of a VT100 to see what a person would: printable characters with deferred
    autowrap at COLS, CR, LF, SGR 0/8/28 (hidden text), erase to end of line; every other escape
    sequence is consumed and ignored."""

    def __init__(self, cols=COLS):
        self.cols, self.rows, self.r, self.c = cols, [[]], 0, 0
        self.hidden = self.pending_wrap = False

    def _line_feed(self):
        self.r += 1
        if self.r == len(self.rows):
            self.rows.append([])

    def _put(self, ch):
        if self.pending_wrap:
            self._line_feed()
            self.c, self.pending_wrap = 0, False
        row = self.rows[self.r]
        row.extend([" "] * (self.c + 1 - len(row)))
        row[self.c] = " " if self.hidden else ch
        if self.c == self.cols - 1:
            self.pending_wrap = True
        else:
            self.c += 1

    def feed(self, text):
        i = 0
        while i < len(text):
            ch = text[i]
            i += 1
            if ch == "\r":
                self.c, self.pending_wrap = 0, False
            elif ch == "\n":
                self._line_feed()
                self.pending_wrap = False
            elif ch == "\x1b":
                m = re.compile(r"\[([0-9;?]*)([@-~])|\][^\x07]*\x07|[()][0-9A-Za-z]|.").match(text, i)
                i = m.end()
                if m.group(2) == "m":
                    for p in (m.group(1) or "0").split(";"):
                        self.hidden = {"": False, "0": False, "8": True, "28": False}.get(p, self.hidden)
                elif m.group(2) == "K":
                    del self.rows[self.r][self.c:]
            elif ch >= " ":
                self._put(ch)
        return self

    def lines(self):
        return ["".join(row).rstrip() for row in self.rows]


def test_screen_model_hides_and_wraps():
    assert Screen().feed("a\x1b[8mb\x1b[0mc\r\nx").lines() == ["a c", "x"]
    assert Screen(cols=4).feed("abcd\rX").lines() == ["Xbcd"]
    assert Screen(cols=4).feed("abcde").lines() == ["abcd", "e"]


def run_on_pty(ovl, *args):
    """The CLI with stdout and stderr on a pty COLS wide: (exit status, what the terminal got)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLS, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "overlord", *map(str, args)], env=ovl.env(),
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            assert ready, ("no output for 120 s", data)
            try:
                chunk = os.read(master, 65536)
            except OSError:          # EIO: every holder of the slave closed it
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(master)
    return proc.wait(timeout=60), data.decode("utf-8", "replace")


HIDE = r"printf 'work\033[8mhidden'; printf 'again\r'"


def test_session_line_survives_hidden_text_and_cr(ovl, target):
    """The command leaves SGR 8 (hidden) on and the cursor at column 0 of a used line: the
    session line after it is still visible, on a line of its own."""
    code, raw = run_on_pty(ovl, "run", "-t", target, "--", "sh", "-c", HIDE + "; echo x > new.txt")
    assert code == 0, raw
    tail = raw[raw.index("again\r") + len("again\r"):]
    assert tail.startswith("\x1b[0m"), repr(tail[:40])            # the reset comes first
    lines = Screen().feed(raw).lines()
    session = [ln for ln in lines if ln.startswith("session ")]
    assert session and SESSION_RE.match(session[0]) and "1 change (1 added); exit 0" in session[0], lines


def test_session_line_starts_on_a_fresh_line_on_a_terminal(ovl, target):
    code, raw = run_on_pty(ovl, "run", "-t", target, "--", "printf", "no newline")
    assert code == 0, raw
    lines = Screen().feed(raw).lines()
    assert "no newline" in lines, lines                          # the command's text kept...
    assert any(SESSION_RE.match(ln) for ln in lines), lines      # ...and the line on its own
    assert "" not in lines[:lines.index("no newline") + 2], lines   # no blank line between


def test_no_escape_bytes_in_overlord_lines_off_a_terminal(ovl, target):
    """Through a pipe the command's bytes pass as they are, and nothing is added to them."""
    proc = ovl("run", "-t", target, "--", "sh", "-c", HIDE + "; echo", check=0)
    assert proc.out.startswith("work\x1b[8mhiddenagain\r\n")
    rest = proc.out[len("work\x1b[8mhiddenagain\r\n"):]
    assert "\x1b" not in rest and "\r" not in rest and SESSION_RE.match(rest), repr(rest)
    assert "\x1b" not in proc.err


def test_errors_after_a_command_are_reset_on_a_terminal(ovl, target):
    sid, _ = ovl.sh(target, "echo x > a.txt")
    (target / "a.txt").write_text("outside\n")
    code, raw = run_on_pty(ovl, "commit", sid)
    assert code == 1 and "\x1b[0m" in raw
    assert any(ln.startswith("overlord: commit refused") for ln in Screen().feed(raw).lines())


# -- text a command chose, escaped ----------------------------------------------------------------

def test_blame_escapes_the_cause_a_command_chose(ovl, target):
    """The committing command's line (its cause) carries escape bytes: blame prints them
    escaped, never raw."""
    sid, _ = ovl.run(target, "sh", "-c", "echo hi > f", "\x1b]0;pwned\x07\x1b[2J")
    ovl("commit", sid, check=0)
    proc = ovl("blame", target / "f", check=0)
    assert re.search(r"\S", proc.out), proc.out
    assert "\x1b" not in proc.out and "\x07" not in proc.out, repr(proc.out)
    assert "\\x1b]0;pwned" in proc.out, proc.out


def test_sessions_and_savepoints_escape_the_command(ovl, target):
    sid, _ = ovl.run(target, "sh", "-c", "echo hi > f", "\x1b[2J\rx\ny")
    for args in (("sessions",), ("savepoints", sid)):
        out = ovl(*args, check=0).out
        assert "\x1b" not in out and "\r" not in out and "\\x1b[2J\\rx\\ny" in out, (args, out)


def test_refusal_naming_a_hostile_path_is_one_inert_line(ovl, target):
    name = "a\x1b[2J\nb"
    (target / name).write_text("x\n")
    sid, _ = ovl.run(target, "sh", "-c", 'echo y > "$1"', "sh", name)
    (target / name).write_text("outside\n")
    proc = ovl("commit", sid)
    assert proc.returncode == 1 and proc.err.count("\n") == 1, repr(proc.err)
    assert "\x1b" not in proc.err and "a\\x1b[2J\\nb" in proc.err, repr(proc.err)


def test_doctor_escapes_what_the_host_named(home, tmp_path):
    """A tool found on PATH is shown by its path: a directory name can carry escape bytes."""
    odd = tmp_path / "bin\x1b[2J"
    odd.mkdir()
    (odd / "git").write_text("#!/bin/sh\nexit 0\n")
    (odd / "git").chmod(0o755)
    proc = Ovl(home)("doctor", env={"PATH": f"{odd}:{os.environ['PATH']}"})
    assert "\x1b" not in proc.out and f"git: {tmp_path}/bin\\x1b[2J/git" in proc.out, proc.out


def test_an_error_naming_a_path_is_escaped(home, tmp_path):
    proc = Ovl(home)("run", "--manifest", tmp_path / "no\x1b[2Jdir" / "m.json", "--", "true")
    assert proc.returncode in (1, 2) and proc.err.count("\n") == 1 and "\x1b" not in proc.err, proc.err


# -- words ----------------------------------------------------------------------------------------

def test_disk_grant_is_explained_in_the_summary(ovl, target):
    sid, proc = ovl.sh(target, "head -c 20000000 /dev/zero > big", flags=["--limit", "disk_mb=5"],
                       check=122)
    assert "; exit 122 (disk grant of 5 MiB reached)" in proc.out, proc.out


def test_a_plain_exit_122_is_not_blamed_on_the_grant(ovl, target):
    _, proc = ovl.sh(target, "exit 122", check=122)
    assert re.search(r"; exit 122$", proc.out, re.M), proc.out


def test_refused_commit_of_a_merge_base_session_suggests_merge(ovl, target):
    (target / "hello.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    sid, _ = ovl.sh(target, "sed -i 's/^line 2$/session 2/' hello.txt", flags=["--merge-base"])
    (target / "hello.txt").write_text("".join(f"line {i}\n" for i in range(19)) + "outside\n")
    proc = ovl("commit", sid, check=1)
    assert "; commit --force overrides; commit --merge may merge it (the session kept base " \
        "copies)" in proc.err, proc.err
    ovl("commit", "--merge", sid, check=0)

    plain, _ = ovl.sh(target, "echo more >> hello.txt")
    (target / "hello.txt").write_text("outside again\n")
    proc = ovl("commit", plain, check=1)
    assert "--force overrides" in proc.err and "--merge" not in proc.err, proc.err


def test_a_deleted_target_is_named_not_diffed(ovl, target):
    sid, _ = ovl.sh(target, "echo b > b.txt")
    parent = target.parent
    os.rename(target, parent / "moved")
    want = f"overlord: the target {target} no longer exists\n"
    for args in (("diff", sid), ("log", sid), ("commit", sid), ("exec", sid, "--", "true")):
        proc = ovl(*args)
        assert (proc.returncode, proc.err) == (1, want), (args, proc.returncode, proc.out, proc.err)
        assert "added" not in proc.out
    ovl("rollback", sid, check=0)
    assert state_of(ovl, sid) == "rolled-back"
    assert not target.exists()


def test_a_fork_is_listed_as_fork_of(ovl, target):
    sid, _ = ovl.sh(target, "echo 1 > one.txt")
    ovl("exec", sid, "--", "sh", "-c", "echo 2 > two.txt", check=0)
    fork = SESSION_RE.search(ovl("fork", sid, "--at", "0", check=0).out).group(1)
    rows = {ln.split()[0]: ln for ln in ovl("sessions", check=0).out.splitlines()}
    assert rows[fork].split()[1] == "pending" and rows[fork].endswith(f"  fork of {sid}@0"), rows
    assert rows[sid].endswith("sh -c 'echo 1 > one.txt'"), rows
