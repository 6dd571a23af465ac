"""The command line as scripts and people meet it: output contracts, bad input, failed launches,
arbitration and the interactive shell."""
import base64
import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import stat
import subprocess
import sys
import termios
import time
import uuid

import pytest

from conftest import SESSION_RE, Ovl, require_tool, state_of

SID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
HEX12 = r"[0-9a-f]{12}"
SUBCOMMANDS = ("run", "shell", "sessions", "diff", "log", "commit", "rollback", "doctor")


# -- helpers ----------------------------------------------------------------------------------

def sha(data):
    return hashlib.sha256(data).hexdigest()


def snapshot(*roots):
    """Everything observable about the trees under roots: type, mode, size, mtime, content."""
    out = {}
    for root in roots:
        root = os.fsencode(str(root))
        if not os.path.lexists(root):
            out[root] = None
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in sorted(dirnames + filenames):
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                rec = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, "rb") as f:
                        rec += (sha(f.read()),)
                elif os.path.islink(p):
                    rec += (os.readlink(p),)
                out[p] = rec
            st = os.lstat(dirpath)
            out[dirpath] = (st.st_mode, st.st_mtime_ns)
    return out


def session_dirs(home):
    d = home / "sessions"
    return sorted(n for n in os.listdir(d) if SID_RE.match(n)) if d.is_dir() else []


def assert_one_line_error(proc, codes=(1, 2)):
    codes = (codes,) if isinstance(codes, int) else codes
    assert proc.returncode in codes, (proc.returncode, proc.out, proc.err)
    assert "Traceback" not in proc.err, proc.err
    lines = proc.err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("overlord: "), repr(proc.err)
    assert not SESSION_RE.search(proc.out), proc.out


def mount_points():
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            field = line.split()[4]
            points.append(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))
    return points


def procs_mentioning(needle):
    """pids of live processes whose command line contains needle (bytes)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle in cmdline:
            found.append((int(name), cmdline))
    return found


def wait_for(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def meta(home, sid):
    with open(home / "sessions" / sid / "meta.json", encoding="utf-8") as f:
        return json.load(f)


def decoy_meta(sid, target):
    return {"sid": sid, "target": str(target), "backend": "kernel", "state": "pending",
            "created": time.time(), "open_stamp_ns": time.time_ns(), "grants": {},
            "merge_base": False, "trace": None, "command": "decoy", "layers": [],
            "uid": os.getuid()}


# -- 1. output contracts ---------------------------------------------------------------------

def test_run_prints_command_output_then_session_line(ovl, target):
    sid, proc = ovl.sh(target, "echo first-line; echo second-line")
    lines = proc.out.splitlines()
    assert lines[0] == "first-line" and lines[1] == "second-line", proc.out
    assert lines[-1].startswith(f"session {sid}"), proc.out
    assert SID_RE.match(sid)
    assert len(SESSION_RE.findall(proc.out)) == 1


@pytest.mark.parametrize("script,code", [("exit 7", 7), ("exit 0", 0), ("kill -TERM $$", 143)])
def test_exit_status_passes_through(ovl, target, script, code):
    sid, proc = ovl.sh(target, script, check=code)
    assert sid and SID_RE.match(sid), proc.out
    assert f"session {sid}" in proc.out.splitlines()[-1]


def test_diff_and_log_lines(ovl, target):
    new = b"new content\n"
    sid, _ = ovl.sh(target, "echo more >> hello.txt; printf 'new content\\n' > new.txt; rm sub/a.txt")
    diff = ovl("diff", sid, check=0).out.splitlines()
    assert sorted(diff) == ["added  new.txt", "deleted  sub/a.txt", "modified  hello.txt"]

    log = ovl("log", sid, check=0).out.splitlines()
    rows = {}
    for line in log:
        m = re.match(rf"^(\S+)  (.+)  ({HEX12}|-) -> ({HEX12}|-)$", line)
        if m:
            rows[m.group(2)] = (m.group(1), m.group(3), m.group(4))
    assert rows["hello.txt"] == ("modified", sha(b"hello\n")[:12], sha(b"hello\nmore\n")[:12]), log
    assert rows["new.txt"] == ("added", "-", sha(new)[:12]), log
    assert rows["sub/a.txt"] == ("deleted", sha(b"a\n")[:12], "-"), log
    assert len(rows) == 3, log


def test_sessions_lines_carry_every_state(ovl, target, tmp_path):
    t2 = tmp_path / "t2"
    t2.mkdir()
    pending, _ = ovl.sh(target, "echo p > p.txt")
    committed, _ = ovl.sh(target, "echo c > c.txt", flags=["--stack"])
    rolled, _ = ovl.sh(target, "echo r > r.txt", flags=["--stack"])
    timed, _ = ovl.sh(t2, "echo t > t.txt; sleep 30", flags=["--timeout", "0.5"], check=124)
    ovl("commit", committed, check=0)
    ovl("rollback", rolled, check=0)
    out = ovl("sessions", check=0).out
    states = {}
    for line in out.splitlines():
        m = re.match(r"^(\d{8}-\d{6}-[0-9a-f]{6})\s+(\S+)", line)
        assert m, f"sessions line does not begin '<sid> <state>': {line!r}"
        states[m.group(1)] = m.group(2)
    assert states == {pending: "pending", committed: "committed", rolled: "rolled-back",
                      timed: "timed-out"}, out


def test_sessions_is_one_line_per_session_even_for_odd_commands(ovl, target):
    """A command line holding a newline or an undecodable byte is escaped, like a path."""
    sid, _ = ovl.run(target, "sh", "-c", "echo one\necho two > x.txt")
    out = ovl("sessions", check=0).out
    lines = out.splitlines()
    assert len(lines) == 1, f"one session must be one line: {out!r}"
    assert re.match(rf"^{sid}\s+pending\b", lines[0]), out
    sid2, _ = ovl.run(target, "touch", os.fsdecode(b"odd\xffname"), flags=["--stack"])
    raw = ovl("sessions", check=0).stdout
    assert b"\xff" not in raw, raw
    assert len(raw.splitlines()) == 2 and sid2.encode() in raw


def exact(row, key="path"):
    """The exact bytes of a name in --json: key_b64 when the name is not valid UTF-8 (the
    key then holds its escaped form), else the key itself."""
    if f"{key}_b64" in row:
        return base64.b64decode(row[f"{key}_b64"])
    return os.fsencode(row[key])


def strict_json(raw):
    """Parse --json output as a strict parser would: UTF-8, and no lone surrogate escaped."""
    text = raw.decode("utf-8")
    assert not re.search(r"\\ud[89a-f][0-9a-f]{2}", text, re.I), f"lone surrogate in {text!r}"
    return json.loads(text)


def test_json_carries_non_utf8_and_newline_paths_exactly(ovl, tmp_path, home):
    tgt = os.path.join(os.fsencode(str(tmp_path)), b"tg\xfft")
    os.mkdir(tgt)
    with open(os.path.join(tgt, b"old"), "wb") as f:
        f.write(b"old\n")
    target = os.fsdecode(tgt)
    script = r'printf x > "$(printf "bad\377name")"; printf "y" > "$(printf "nl\nname")"; rm old'
    sid, _ = ovl.sh(target, script)
    want = {b"bad\xffname": "added", b"nl\nname": "added", b"old": "deleted"}

    human = ovl("diff", sid, check=0).stdout
    assert b"\xff" not in human, human
    assert sorted(human.splitlines()) == [b"added  bad\\xffname", b"added  nl\\nname", b"deleted  old"]

    diff = strict_json(ovl("diff", "--json", sid, check=0).stdout)
    assert {exact(r): r["kind"] for r in diff} == want
    assert {r["path"] for r in diff} >= {"bad\\xffname", "nl\nname"}   # escaped beside the bytes

    log = strict_json(ovl("log", "--json", sid, check=0).stdout)
    changes = {exact(r): r for r in log["changes"]}
    assert set(changes) == set(want)
    assert changes[b"bad\xffname"]["after"] == sha(b"x")
    assert changes[b"nl\nname"]["after"] == sha(b"y")
    assert changes[b"old"]["before"] == sha(b"old\n") and changes[b"old"]["after"] is None

    human_log = ovl("log", sid, check=0).stdout
    assert b"\xff" not in human_log
    assert any(line.startswith(b"added  nl\\nname  - -> ") for line in human_log.splitlines())

    sessions = strict_json(ovl("sessions", "--json", check=0).stdout)
    assert [exact(s, "target") for s in sessions if s["sid"] == sid] == [tgt]
    human_sessions = ovl("sessions", check=0).stdout
    assert b"\xff" not in human_sessions and b"tg\\xfft" in human_sessions


def test_doctor_json_and_human_carry_a_non_utf8_home(ovl, tmp_path):
    odd_home = os.path.join(os.fsencode(str(tmp_path)), b"ho\xffme")
    os.mkdir(odd_home)
    env = {"OVERLORD_HOME": os.fsdecode(odd_home)}
    report = strict_json(ovl("doctor", "--json", env=env, check=0).stdout)
    assert exact(report, "home") == odd_home
    assert report["active"] == ovl.backend
    human = ovl("doctor", env=env, check=0).stdout
    assert b"\xff" not in human, f"human output must escape undecodable bytes: {human!r}"
    assert b"ho\\xffme" in human


def test_doctor_names_backends_and_the_active_one(ovl):
    proc = ovl("doctor", check=0)
    lines = proc.out.splitlines()
    for name in ("kernel", "fuse"):
        mine = [l for l in lines if l.startswith(f"{name} backend")]
        assert len(mine) == 1, proc.out
        assert mine[0].endswith(": available") or ": unavailable (" in mine[0], mine[0]
    assert f"active backend: {ovl.backend}" in lines, proc.out
    assert any(l.startswith(f"{ovl.backend} backend") and l.endswith(": available") for l in lines)
    report = json.loads(ovl("doctor", "--json", check=0).stdout)
    assert report["active"] == ovl.backend
    assert report["backends"][ovl.backend]["available"] is True
    assert set(report["backends"]) >= {"kernel", "fuse"}


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_help(home, sub):
    proc = Ovl(home)(sub, "--help", check=0)
    assert proc.out.strip() and "usage" in proc.out.lower(), proc.out
    assert sub in proc.out


def test_top_level_help(home):
    proc = Ovl(home)("--help", check=0)
    for sub in SUBCOMMANDS:
        assert sub in proc.out


# -- 2. bad input ---------------------------------------------------------------------------

@pytest.fixture
def world(ovl, tmp_path, home):
    """A pending session on another target, so there is state a bad request could disturb."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "o.txt").write_text("o\n")
    sid, _ = ovl.sh(other, "echo changed >> o.txt")
    return {"sid": sid, "other": other}


def check_refused(ovl, args, roots, codes=(1, 2), **kw):
    before = snapshot(*roots)
    proc = ovl(*args, **kw)
    assert_one_line_error(proc, codes)
    assert snapshot(*roots) == before, f"{args} changed state"
    return proc


ABSENT = "20261129-000000-abcdef"


@pytest.mark.parametrize("sub", ["diff", "log", "commit", "rollback"])
def test_unknown_session_id(ovl, world, home, target, sub):
    proc = check_refused(ovl, [sub, ABSENT], [home / "sessions", target, world["other"]], codes=1)
    assert ABSENT in proc.err


@pytest.mark.parametrize("sub", ["diff", "log", "commit", "rollback"])
@pytest.mark.parametrize("bad", ["../../etc", f"{ABSENT}/..", "..", f"../sessions/{ABSENT}"])
def test_session_id_with_traversal_is_a_usage_error(ovl, world, home, tmp_path, sub, bad):
    # Plant records where a joined path would land, so following it would do damage.
    decoy_target = tmp_path / "decoy"
    decoy_target.mkdir()
    (home / "sessions" / ABSENT).mkdir()
    for where in (home / "sessions", tmp_path / "etc"):
        where.mkdir(exist_ok=True)
        (where / "meta.json").write_text(json.dumps(decoy_meta(ABSENT, decoy_target)))
    check_refused(ovl, [sub, bad], [home, tmp_path / "etc", decoy_target, world["other"]], codes=2)


def test_missing_target(ovl, world, home, tmp_path):
    proc = check_refused(ovl, ["run", "-t", tmp_path / "nope", "--", "touch", "x"],
                         [home / "sessions", tmp_path])
    assert "nope" in proc.err


def test_target_is_a_file(ovl, world, home, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    check_refused(ovl, ["run", "-t", f, "--", "true"], [home / "sessions", tmp_path])


@pytest.mark.parametrize("args", [["--"], [], ["--timeout", "5", "--"]])
def test_missing_command(ovl, world, home, target, args):
    check_refused(ovl, ["run", "-t", target, *args], [home / "sessions", target], codes=2)


@pytest.mark.parametrize("text", ["{", '{"timeout": 1', '{"foo": 1}', '{"timeout": "1"}',
                                  '{"jail": 1}', '{"net": 5}', '{"net": "sideways"}', "[]",
                                  '{"timeout": true}', '{"merge_base": "yes"}', "\xff"])
def test_broken_manifest(ovl, world, home, target, tmp_path, text):
    cap = tmp_path / "cap.json"
    cap.write_bytes(text.encode("latin-1"))
    marker = f"ran-{uuid.uuid4().hex[:8]}"
    check_refused(ovl, ["run", "-t", target, "--manifest", cap, "--", "touch", marker],
                  [home / "sessions", target])
    assert not list(home.glob(f"sessions/*/**/{marker}"))


def test_missing_manifest(ovl, world, home, target, tmp_path):
    check_refused(ovl, ["run", "-t", target, "--manifest", tmp_path / "none.json", "--", "true"],
                  [home / "sessions", target])


def test_target_containing_home(ovl, world, home, tmp_path):
    # tmp_path holds OVERLORD_HOME
    check_refused(ovl, ["run", "-t", tmp_path, "--", "touch", "x"], [tmp_path])


@pytest.mark.parametrize("inner", [".", "sub", "sessions"])
def test_target_inside_home(ovl, world, home, inner):
    (home / inner).mkdir(exist_ok=True)
    check_refused(ovl, ["run", "-t", home / inner, "--", "touch", "x"], [home])


def test_commit_merge_without_merge_base(ovl, world, home):
    check_refused(ovl, ["commit", "--merge", world["sid"]], [home / "sessions", world["other"]],
                  codes=2)
    assert (world["other"] / "o.txt").read_text() == "o\n"


@pytest.mark.parametrize("sub", ["run", "shell"])
def test_bogus_backend(ovl, world, home, target, sub):
    args = [sub, "--backend", "bogus", "-t", target] + (["--", "touch", "x"] if sub == "run" else [])
    check_refused(ovl, args, [home / "sessions", target], codes=2)


def test_unknown_subcommand_and_option(ovl, world, home, target):
    check_refused(ovl, ["frobnicate"], [home / "sessions"], codes=2)
    check_refused(ovl, ["run", "--frob", "-t", target, "--", "true"], [home / "sessions", target],
                  codes=2)
    check_refused(ovl, ["run", "-t", target, "--timeout", "soon", "--", "true"],
                  [home / "sessions", target], codes=2)
    check_refused(ovl, ["run", "-t", target, "--timeout", "-1", "--", "true"],
                  [home / "sessions", target], codes=2)


# -- 3. a launch that fails halfway leaves nothing --------------------------------------------

def _assert_nothing_left(home, target, before):
    assert session_dirs(home) == before
    for point in mount_points():
        for root in (os.fsencode(str(home)), os.fsencode(str(target))):
            assert not (point == root or point.startswith(root + b"/")), f"mount left at {point!r}"
    # fuse-overlayfs names the target in its command line; give an exiting one a moment
    wait_for(lambda: not procs_mentioning(os.fsencode(str(target))), timeout=5,
             what=f"no process naming {target}")


def test_launch_of_missing_command_leaves_nothing(ovl, home, target):
    ovl.sh(target, "true", flags=["--stack"])        # sessions/ exists; one finished session
    before = session_dirs(home)
    tree = snapshot(target)
    proc = ovl("run", "-t", target, "--stack", "--", "/nonexistent/cmd")
    assert_one_line_error(proc, 1)
    assert "/nonexistent/cmd" in proc.err
    _assert_nothing_left(home, target, before)
    assert snapshot(target) == tree


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_launch_of_unexecutable_file_leaves_nothing(ovl, home, target, tmp_path, where):
    base = target if where == "inside" else tmp_path
    script = base / "notexec.sh"
    script.write_text("#!/bin/sh\necho should-not-run > ran.txt\n")
    os.chmod(script, 0o644)
    ovl.sh(target, "true", flags=["--stack"])
    before = session_dirs(home)
    tree = snapshot(target)
    proc = ovl("run", "-t", target, "--stack", "--", str(script))
    assert_one_line_error(proc, 1)
    assert "notexec.sh" in proc.err
    assert "should-not-run" not in proc.out
    _assert_nothing_left(home, target, before)
    assert snapshot(target) == tree


def test_failed_launch_releases_the_target(ovl, home, target):
    """After a launch failure the next run is neither refused as pending nor as busy."""
    proc = ovl("run", "-t", target, "--", "/nonexistent/cmd")
    assert proc.returncode == 1
    sid, _ = ovl.sh(target, "echo ok > ok.txt")
    assert ovl.diff(sid) == [("added", "ok.txt")]


# -- 5. arbitration -------------------------------------------------------------------------

def test_second_run_refused_while_pending_unless_stack(ovl, home, target):
    first, _ = ovl.sh(target, "echo 1 > one.txt")
    before = session_dirs(home)
    proc = ovl("run", "-t", target, "--", "sh", "-c", "echo 2 > two.txt")
    assert_one_line_error(proc, 1)
    assert first in proc.err
    assert session_dirs(home) == before
    second, _ = ovl.sh(target, "echo 2 > two.txt", flags=["--stack"])
    assert second and second != first
    assert ovl.diff(second) == [("added", "two.txt")]
    ovl("rollback", first, check=0)
    ovl("rollback", second, check=0)
    third, _ = ovl.sh(target, "echo 3 > three.txt")     # nothing pending: no --stack needed
    assert third


def test_busy_target_refused_and_wait_queues(ovl, home, target, tmp_path):
    sync = tmp_path / f"sync-{uuid.uuid4().hex[:8]}"
    sync.mkdir()
    go = sync / "go"
    first = subprocess.Popen(
        [sys.executable, "-m", "overlord", "run", "-t", str(target), "--", "sh", "-c",
         f"touch started; while [ ! -e {go} ]; do sleep 0.05; done; echo first-done"],
        env=ovl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    queued = None
    try:
        wait_for(lambda: session_dirs(home), what="the first session to open")
        busy = ovl("run", "-t", target, "--stack", "--", "touch", "busy.txt")
        assert_one_line_error(busy, 1)
        assert "busy" in busy.err.lower(), busy.err
        assert len(session_dirs(home)) == 1

        queued = subprocess.Popen(
            [sys.executable, "-m", "overlord", "run", "-t", str(target), "--stack", "--wait",
             "--", "sh", "-c", f"test -e {go} && echo queued-ran"],
            env=ovl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def blocked():
            with open("/proc/locks") as f:
                return any("->" in l and l.split()[5] == str(queued.pid) for l in f)
        wait_for(blocked, what="the --wait run to block on the target lock")
        assert first.poll() is None and queued.poll() is None
        go.touch()
        out1, err1 = first.communicate(timeout=60)
        out2, err2 = queued.communicate(timeout=60)
    finally:
        go.touch()
        for p in (first, queued):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    assert first.returncode == 0, err1
    assert queued.returncode == 0, (out2, err2)
    assert b"first-done" in out1 and b"queued-ran" in out2
    assert SESSION_RE.search(out1.decode()) and SESSION_RE.search(out2.decode())
    assert len(session_dirs(home)) == 2


# -- 6. shell -------------------------------------------------------------------------------

def test_shell_from_stdin_is_one_savepoint(ovl, home, target):
    proc = ovl("shell", "-t", target, input=b"echo hi > s.txt\necho two > t.txt\nexit 3\n",
               check=3)
    m = SESSION_RE.search(proc.out)
    assert m, proc.out
    assert proc.out.splitlines()[-1].startswith("session "), proc.out
    sid = m.group(1)
    assert len(meta(home, sid)["layers"]) == 1
    assert ovl.diff(sid) == [("added", "s.txt"), ("added", "t.txt")]
    assert not (target / "s.txt").exists()


class Pty:
    """`overlord shell` on a real pty that is its controlling terminal."""

    def __init__(self, ovl, target):
        self.master, slave = os.openpty()

        def make_ctty():
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "overlord", "shell", "-t", str(target)], stdin=slave,
            stdout=slave, stderr=slave, env=ovl.env({"TERM": "dumb"}),
            start_new_session=True, preexec_fn=make_ctty)
        os.close(slave)
        self.buf = b""

    def write(self, data):
        os.write(self.master, data)

    def read_until(self, pattern, timeout=30):
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.buf):
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.buf!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    data = b""
                assert data, f"pty closed before {pattern!r}: {self.buf!r}"
                self.buf += data
        return re.search(pattern, self.buf)

    def prompt(self):
        """Wait for the shell's prompt: input typed before overlord takes the terminal may be
        flushed by the switch to raw mode, as on any terminal program."""
        self.read_until(rb"[$#] $")
        self.buf = b""

    def close(self):
        os.close(self.master)            # hang up: overlord ends the shell and unmounts
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_shell_on_a_pty(ovl, home, target):
    sh = Pty(ovl, target)
    try:
        sh.prompt()
        sh.write(b"echo $((6*7)) > pty.txt; exit\n")
        sid = sh.read_until(rb"session (\d{8}-\d{6}-[0-9a-f]{6})").group(1).decode()
        assert sh.proc.wait(timeout=30) == 0
    finally:
        sh.close()
    assert ("added", "pty.txt") in ovl.diff(sid)
    ovl("commit", sid, check=0)
    assert (target / "pty.txt").read_text() == "42\n"


def test_shell_ctrl_c_interrupts_the_command_not_the_shell(ovl, home, target):
    marker = b"30.%d" % (uuid.uuid4().int % 1000000)
    sh = Pty(ovl, target)
    try:
        sh.prompt()
        sh.write(b"sleep " + marker + b"\n")
        wait_for(lambda: any(c.split(b"\0")[0].endswith(b"sleep")
                             for _, c in procs_mentioning(marker)), what="sleep to start")
        sh.write(b"\x03")
        wait_for(lambda: not procs_mentioning(marker), timeout=10, what="Ctrl-C to end the sleep")
        assert sh.proc.poll() is None, "Ctrl-C ended overlord shell itself"
        sh.prompt()
        sh.write(b"echo after > after.txt; exit\n")
        sid = sh.read_until(rb"session (\d{8}-\d{6}-[0-9a-f]{6})").group(1).decode()
        sh.proc.wait(timeout=30)
    finally:
        sh.close()
    assert ("added", "after.txt") in ovl.diff(sid)


# -- 7. scripts get the session they made; empty runs; seeing the change (issue 10) ----------

def _shell(ovl, script, **kw):
    """A shell pipeline whose `overlord` is this checkout's CLI."""
    return subprocess.run(["sh", "-c", script], env=ovl.env({"OVERLORD": f"{sys.executable} -m overlord"}),
                          capture_output=True, timeout=120, **kw)


@pytest.mark.parametrize("output", ["x", "x\n", ""])
def test_the_session_line_starts_a_fresh_line_through_a_pipe_and_into_a_file(ovl, target, tmp_path,
                                                                             output):
    """`sid=$(overlord run -- printf x | awk '/^session /{print $2}')` gets the sid; a command
    whose output ends with a newline gets no blank line before the session line."""
    proc = _shell(ovl, f"$OVERLORD run -t '{target}' -- printf '{output}' | "
                       "awk '/^session /{print $2}'")
    sid = proc.stdout.decode().strip()
    assert SID_RE.match(sid), (proc.stdout, proc.stderr)
    out = tmp_path / "out.txt"
    proc = _shell(ovl, f"$OVERLORD run -t '{target}' -- printf '{output}' > '{out}'")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    lines = text.split("\n")
    assert text.startswith(output) and lines[-1] == "" and len(lines) == (3 if output else 2), text
    assert SESSION_RE.match(lines[-2]), text
    # appended to a file that already ends mid-line, whoever wrote it
    out.write_text("earlier")
    _shell(ovl, f"$OVERLORD run -t '{target}' -- true >> '{out}'")
    assert SESSION_RE.match(out.read_text().split("\n")[1]), out.read_text()


def test_exec_json_starts_a_fresh_line(ovl, target):
    sid, _ = ovl.sh(target, "echo 1 > one")
    proc = ovl("exec", "--json", sid, "--", "printf", "no-newline", check=0)
    head, _, last = proc.out.rstrip("\n").rpartition("\n")
    assert head == "no-newline", proc.out
    assert json.loads(last)["sid"] == sid


def test_sessions_are_listed_in_creation_order_and_last_names_the_newest(ovl, target, home):
    (home / "sessions").mkdir(exist_ok=True)
    # ids in the same second sort by their random tail, not by when they were made
    for sid, created in (("20260101-000000-ffffff", 1000.0), ("20260101-000000-000000", 2000.0)):
        (home / "sessions" / sid).mkdir()
        (home / "sessions" / sid / "meta.json").write_text(
            json.dumps(dict(decoy_meta(sid, target), state="rolled-back", created=created)))
    listed = [line.split()[0] for line in ovl("sessions", check=0).out.splitlines()]
    assert listed == ["20260101-000000-ffffff", "20260101-000000-000000"]
    assert [s["sid"] for s in json.loads(ovl("sessions", "--json", check=0).out)] == listed
    first, _ = ovl.sh(target, "echo 1 > first.txt")
    second, _ = ovl.sh(target, "echo 2 > second.txt", flags=["--stack"])
    assert [line.split()[0] for line in ovl("sessions", check=0).out.splitlines()][-2:] == [first, second]
    assert ovl.diff("last") == [("added", "second.txt")]
    assert json.loads(ovl("log", "--json", "last", check=0).out)["sid"] == second
    ovl("exec", "last", "--", "sh", "-c", "echo 3 > third.txt", check=0)
    assert ("added", "third.txt") in ovl.diff(second)
    ovl("rollback", "last", check=0)
    assert state_of(ovl, second) == "rolled-back" and state_of(ovl, first) == "pending"
    proc = ovl("fork", first, "--at", "0", check=0)
    fork = SESSION_RE.search(proc.out).group(1)
    assert ovl("compare", first, "last", check=0).out.splitlines() == ["same  first.txt"]
    ovl("commit", "last", check=0)
    assert state_of(ovl, fork) == "committed" and (target / "first.txt").exists()


def test_last_with_no_sessions_is_one_line(home):
    proc = Ovl(home)("diff", "last")
    assert_one_line_error(proc, 1)
    assert "no sessions" in proc.err


def test_a_run_that_changed_nothing_is_unchanged_and_blocks_nothing(ovl, target, home):
    before = snapshot(target)
    sid, proc = ovl.sh(target, "cat hello.txt > /dev/null; echo looked")
    assert re.search(rf"^session {sid}  unchanged  no changes; exit 0$", proc.out, re.M), proc.out
    assert state_of(ovl, sid) == "unchanged"
    assert meta(home, sid)["state"] == "unchanged"
    assert ovl("diff", sid, check=0).out == "" and ovl("log", sid, check=0).out == ""
    # closed: nothing can run in it or commit it, and the next run needs no --stack
    assert_one_line_error(ovl("exec", sid, "--", "touch", "x"), 1)
    assert_one_line_error(ovl("commit", sid), 1)
    nxt, _ = ovl.sh(target, "echo n > n.txt")
    assert nxt and state_of(ovl, nxt) == "pending"
    ovl("rollback", nxt, check=0)
    # a shell that changed nothing, and a timed-out command that changed nothing, likewise
    proc = ovl("shell", "-t", target, input=b"ls > /dev/null\n", check=0)
    assert state_of(ovl, SESSION_RE.search(proc.out).group(1)) == "unchanged"
    timed, _ = ovl.sh(target, "sleep 30", flags=["--timeout", "0.5"], check=124)
    assert state_of(ovl, timed) == "unchanged"
    assert snapshot(target) == before
    assert not os.path.exists(home / "sessions" / sid / "layers")


def test_an_agent_session_that_changed_nothing_stays_pending(ovl, target, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"model": "scripted-test", "turns": [{"text": "nothing to do"}]}))
    flags = ["--no-jail", "--net", "host"] if ovl.backend == "fuse" else []
    proc = ovl("agent", "-t", target, "--provider", "scripted", "--script", script, *flags,
               "look around", check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    assert state_of(ovl, sid) == "pending", proc.out


def test_diff_marks_types_and_metadata(ovl, target):
    mode = stat.S_IMODE(os.stat(target / "hello.txt").st_mode)
    sid, _ = ovl.sh(target, "ln -s /etc/passwd evil; mkfifo f; chmod u+s hello.txt; "
                            "mkdir d; echo x > plain.txt; "
                            "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"")
    lines = ovl("diff", sid, check=0).out.splitlines()
    assert "added  evil  (link -> /etc/passwd)" in lines, lines
    assert "added  f  (fifo)" in lines and "added  sock  (socket)" in lines, lines
    assert "added  d  (dir)" in lines and "added  plain.txt" in lines, lines
    assert f"modified  hello.txt  (mode {mode:04o} -> {mode | 0o4000:04o}, setuid, metadata only)" \
        in lines, lines
    log = {split[1]: split for split in (line.split("  ") for line in ovl("log", sid, check=0).out.splitlines())}
    assert log["evil"][-1] == "(link -> /etc/passwd)" and log["f"][-1] == "(fifo)", log
    assert ovl.diff(sid) == sorted([("added", "evil"), ("added", "f"), ("added", "sock"),
                                    ("added", "d"), ("added", "plain.txt"),
                                    ("modified", "hello.txt")])


def _applied(target, patch, tmp_path):
    """The target with the patch applied by git (outside any repository), as a tree."""
    from conftest import tree
    copy = tmp_path / "applied"
    shutil.copytree(target, copy, symlinks=True)
    proc = subprocess.run(["git", "apply", "--unsafe-paths", "-p1", "--directory=.", "-"],
                          input=patch, cwd=copy, capture_output=True)
    assert proc.returncode == 0, (proc.stderr, patch)
    return tree(copy)


def test_diff_patch_is_a_unified_diff_git_can_apply(ovl, target, tmp_path, home):
    from conftest import tree
    require_tool("git")
    (target / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 41)))
    (target / "bye.txt").write_text("going\n")
    (target / "blob.bin").write_bytes(b"\0\1\2")
    script = ("sed -i 's/^line 20$/line twenty/' long.txt; echo more >> hello.txt; rm bye.txt; "
              "printf 'no newline' > sub/new.txt; printf 'x\\0y' > blob.bin; "
              "head -c 700000 /dev/zero | tr '\\0' 'a' > big.txt")
    sid, _ = ovl.sh(target, script)
    proc = ovl("diff", sid, "--patch", check=0)
    patch = proc.stdout
    text = patch.decode()
    assert "@@ -17,7 +17,7 @@\n line 17\n line 18\n line 19\n-line 20\n+line twenty\n" in text, text
    assert "diff --git a/bye.txt b/bye.txt\ndeleted file mode 100" in text
    assert "+++ b/sub/new.txt\n@@ -0,0 +1 @@\n+no newline\n\\ No newline at end of file\n" in text
    assert "Binary files a/blob.bin and b/blob.bin differ" in text
    assert re.search(r"diff --git a/big.txt b/big.txt\nnew file mode 100\d+\n# large file, not compared: "
                     r"683\.6 KiB\n", text), text
    # what git applies from the text patch is the session's tree, but for what it summarized
    ovl("exec", sid, "--", "rm", "blob.bin", "big.txt", check=0)
    (target / "blob.bin").unlink()
    session_tree = {k: v for k, v in tree(target).items()}
    applied = _applied(target, ovl("diff", sid, "--patch", check=0).stdout, tmp_path)
    expected = dict(session_tree)
    expected["long.txt"] = expected["long.txt"].replace(b"line 20\n", b"line twenty\n")
    expected["hello.txt"] += b"more\n"
    del expected["bye.txt"]
    expected["sub/new.txt"] = b"no newline"
    assert applied == expected


def test_log_after_a_partial_commit_shows_what_was_committed_and_what_was_dropped(ovl, target):
    sid, _ = ovl.sh(target, "echo kept > kept.txt; echo more >> hello.txt")
    ovl("exec", sid, "--", "sh", "-c", "echo notes > NOTES.md; echo again >> hello.txt", check=0)
    ovl("commit", sid, "--drop", "layer:1", check=0)
    assert not (target / "NOTES.md").exists() and (target / "hello.txt").read_text() == "hello\nmore\n"
    lines = ovl("log", sid, check=0).out.splitlines()
    cut = lines.index("dropped (not committed):")
    committed, dropped = lines[:cut], lines[cut + 1:]
    assert [line.split("  ")[:2] for line in committed] == [["modified", "hello.txt"], ["added", "kept.txt"]]
    assert f"{sha(b'hello' + bytes([10]))[:12]} -> {sha(b'hello' + bytes([10]) + b'more' + bytes([10]))[:12]}" \
        == committed[0].split("  ")[2], committed
    assert sorted(line.split("  ")[:2] for line in dropped) == [["added", "NOTES.md"], ["modified", "hello.txt"]]
    data = json.loads(ovl("log", "--json", sid, check=0).out)
    assert [(c["path"], c["layer"]) for c in data["changes"]] == [("hello.txt", 0), ("kept.txt", 0)]
    assert sorted((c["path"], c["layer"]) for c in data["dropped"]) == [("NOTES.md", 1), ("hello.txt", 1)]
    assert data["changes"][0]["after"] == sha(b"hello\nmore\n")
    # a whole commit has nothing dropped
    whole, _ = ovl.sh(target, "echo w > w.txt")
    ovl("commit", whole, check=0)
    assert json.loads(ovl("log", "--json", whole, check=0).out)["dropped"] == []
    assert "dropped" not in ovl("log", whole, check=0).out


def test_syscalls_shows_what_trace_recorded(ovl, target):
    require_tool("strace")
    marker = uuid.uuid4().hex[:8]
    sid, _ = ovl.run(target, "sh", "-c", f"echo x > traced-{marker}.txt", flags=["--trace"])
    proc = ovl("syscalls", sid, check=0)
    rows = [line.split() for line in proc.out.splitlines()]
    writes = [r for r in rows if r[-1].endswith(f"traced-{marker}.txt") and "write" in r[-2]]
    assert writes, proc.out
    assert all(r[0].isdigit() and r[1].startswith("+") and r[3].startswith("=") for r in rows)
    data = json.loads(ovl("syscalls", "--json", sid, check=0).out)
    assert data["sid"] == sid and data["syscalls"] == len(data["syscall_records"]) == len(rows)
    assert ovl("log", "--syscalls", sid, check=0).out.splitlines()[-len(rows):] == proc.out.splitlines()
    untraced, _ = ovl.sh(target, "echo u > u.txt", flags=["--stack"])
    assert_one_line_error(ovl("syscalls", untraced), 1)


def test_an_unjailed_run_says_what_it_does_not_capture(ovl, target):
    sid, proc = ovl.sh(target, "echo x > x.txt")
    note = f"unjailed: writes outside {target} are not captured"
    assert proc.err.count(note) == 1, proc.err
    assert note not in proc.out
    if ovl.backend == "kernel":
        sid, proc = ovl.sh(target, "echo y > y.txt", flags=["--jail", "--stack"])
        assert "unjailed" not in proc.err, proc.err


def test_commit_allow_privileged_modes(ovl, target, home):
    sid, _ = ovl.sh(target, "chmod u+s hello.txt")
    proc = ovl("commit", sid)
    assert_one_line_error(proc, 1)
    assert "--allow-privileged-modes" in proc.err and "setuid" in proc.err
    assert not os.stat(target / "hello.txt").st_mode & stat.S_ISUID
    ovl("commit", sid, "--allow-privileged-modes", check=0)
    assert os.stat(target / "hello.txt").st_mode & stat.S_ISUID
    assert meta(home, sid).get("allowed_privileged")
