"""Red team of the faces in front of the broker (issue 12): the daemon's wire, its socket and
start-up, the Claude Code hook's rewrite and state file, and the SDK facing a hostile or buggy
peer on its socket. (The broker itself: test_redteam_broker.py; the MCP server:
test/mcp/test_mcp_redteam.py, which may import mcp -- this file may not.)

Each test is one attack: a hole that was found is a test that failed before its fix; an
attack that held stays as a cheap test so it keeps holding.
"""
import base64
import importlib.util
import json
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import REPO, Ovl, require_backend, tree
from overlord import ops

import overlord_client as oc

# the daemon fixture and its line-protocol client, from test/daemon/conftest.py (loaded by
# path: the module name `conftest` is test/conftest.py's here)
_spec = importlib.util.spec_from_file_location(
    "overlord_redteam_daemon_conftest", os.path.join(REPO, "test", "daemon", "conftest.py"))
_dconf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_dconf)
daemon = _dconf.daemon          # the fixture

sys.path.insert(0, os.path.join(REPO, "test", "daemon"))
from test_hook import STATE, admit, decision, hook, payload, run_rewritten  # noqa: E402
from test_sdk import fake, send  # noqa: E402,F401 - fake is a fixture

NOBODY = 65534
LONE = "ev\ud800il"          # a lone surrogate: JSON can say it, UTF-8 cannot carry it


def grants(backend):
    """What a brokered session must ask for on a backend (the fuse backend cannot jail)."""
    return {"jail": False, "net": "host"} if backend == "fuse" else {}


def meta(home, sid):
    with open(os.path.join(home, "sessions", sid, "meta.json"), encoding="utf-8") as f:
        return json.load(f)


def needs_root(test):
    """Root makes a child another user; CI's ordinary-user pass deselects these (second_user)."""
    skip = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a child becomes uid 65534")
    return pytest.mark.second_user(skip(test))


# == the daemon ==================================================================================

def test_a_client_name_with_a_lone_surrogate_opens_a_whole_session_and_sessions_answers(
        daemon, home, target, backend):
    """The name reached the audit chain's rendering (text.jsonable), which could not encode
    it: the open died half-way, leaving a session `running` on the target that blocked every
    later open there, and `sessions` never answered anyone (its reply could not be encoded)."""
    daemon.allow(target)
    with daemon.connect(timeout=60) as conn:
        reply = conn.request({"op": "open", "target": str(target), "grants": grants(backend),
                              "client": LONE})
        assert reply["ok"] and reply["state"] == "pending", reply
        sid = reply["sid"]
        listed = conn.request({"op": "sessions"})
        assert listed["ok"], listed
        assert [s["sid"] for s in listed["sessions"]] == [sid]
        assert base64.b64decode(listed["sessions"][0]["broker"]["client_b64"]) == \
            LONE.encode("utf-8", "surrogatepass")
    assert meta(home, sid)["state"] == "pending"
    acts = [json.loads(line)["action"] for line in (home / "audit.jsonl").read_text().splitlines()]
    assert "session.open" in acts
    proc = Ovl(home, backend)("sessions", check=0)
    assert proc.returncode == 0 and "Traceback" not in proc.err, proc.err


def test_a_lone_surrogate_in_an_id_or_an_argument_is_a_400_and_the_connection_lives(daemon):
    """An id with a lone surrogate killed the connection without a reply (the reply could not
    be encoded); a path argument with one was a 500 with a traceback in the daemon's log."""
    with daemon.connect(timeout=30) as conn:
        for line in (b'{"id": "\\ud800", "op": "ping"}', b'{"id": "x\\udfff", "op": "sessions"}',
                     b'{"id": 1, "op": "blame", "path": "\\ud800"}',
                     b'{"id": 2, "op": "open", "target": "/tmp/\\ud800"}'):
            conn.send(line + b"\n")
            reply = conn.recv()
            assert reply["ok"] is False and reply["code"] == 400, (line, reply)
            assert conn.request({"op": "ping"})["ok"]
    assert not any("Traceback" in line for line in daemon.log), daemon.log


def start_daemon(home, path, timeout=60):
    """Start `overlord daemon --socket path`: ("served", its log) once it serves (then it is
    stopped), or (exit status, stderr) when it refuses to start."""
    proc = subprocess.Popen([sys.executable, "-m", "overlord", "daemon", "--socket", str(path)],
                            env=Ovl(home).env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    log = b""
    deadline = time.monotonic() + timeout
    while b" serving on " not in log:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(proc.stderr.fileno(), 1 << 16) if ready else b""
        if not chunk:
            proc.kill() if not ready else None
            return proc.wait(timeout=60), log.decode()
        log += chunk
    proc.terminate()
    proc.wait(timeout=60)
    return "served", log.decode()


@pytest.mark.parametrize("mode", [0o777, 0o703, 0o772])
def test_the_daemon_will_not_listen_in_a_folder_others_may_write(home, tmp_path, mode):
    """In a folder others may write (and that is not sticky) another user can rename their own
    socket over the daemon's: every client then talks to them."""
    where = tmp_path / "shared"
    where.mkdir()
    os.chmod(where, mode)
    status, err = start_daemon(home, where / "d.sock")
    assert status == 1, err
    assert err.startswith("overlord: ") and err.count("\n") == 1 and "writ" in err, err
    assert "Traceback" not in err
    assert os.listdir(where) in ([], ["d.sock.lock"])


def test_a_sticky_or_private_folder_is_fine(home, tmp_path):
    for mode in (0o1777, 0o700, 0o775):          # 0775: its group is the user's own
        where = tmp_path / f"dir-{mode:o}"
        where.mkdir()
        os.chmod(where, mode)
        status, err = start_daemon(home, where / "d.sock")
        assert status == "served", err


@needs_root
def test_the_daemon_will_not_listen_in_a_folder_another_user_or_group_may_write(home, tmp_path):
    where = tmp_path / "theirs"
    where.mkdir()
    os.chown(where, NOBODY, NOBODY)
    status, err = start_daemon(home, where / "d.sock")
    assert status == 1 and "writ" in err, err
    group = tmp_path / "group"
    group.mkdir()
    os.chown(group, -1, NOBODY)                  # a group the daemon's user is not
    os.chmod(group, 0o770)
    status, err = start_daemon(home, group / "d.sock")
    assert status == 1 and "writ" in err, err


def test_a_planted_symlink_or_fifo_at_the_socket_or_its_lock_is_refused(home, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    for i, (name, plant) in enumerate((("d.sock", lambda p: os.symlink(victim, p)),
                                       ("d.sock.lock", lambda p: os.symlink(victim, p)),
                                       ("d.sock.lock", os.mkfifo), ("d.sock", os.mkfifo))):
        where = tmp_path / f"plant{i}"
        where.mkdir(mode=0o700)
        plant(str(where / name))
        status, err = start_daemon(home, where / "d.sock")
        assert status == 1 and err.startswith("overlord: ") and "Traceback" not in err, err
    assert victim.read_text() == "keep me\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644


@needs_root
def test_a_stale_socket_of_another_user_is_not_replaced(home, tmp_path):
    where = tmp_path / "d"
    where.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(where / "d.sock"))
    stale.close()
    os.chown(where / "d.sock", NOBODY, NOBODY)
    status, err = start_daemon(home, where / "d.sock")
    assert status == 1 and "not a socket of yours" in err, err
    assert os.lstat(where / "d.sock").st_uid == NOBODY


def test_thousands_of_pipelined_requests_are_each_answered_in_order(daemon):
    n = 3000
    with daemon.connect(timeout=120) as conn:
        conn.send(b"".join(json.dumps({"id": i, "op": "ping"}).encode() + b"\n" for i in range(n)))
        got = [conn.recv() for _ in range(n)]
        assert [m["id"] for m in got] == list(range(n)) and all(m["ok"] for m in got)
    assert daemon.ok({"op": "ping"})["pid"] == daemon.proc.pid


def test_output_that_is_not_utf8_comes_back_exact(daemon, target, backend):
    daemon.allow(target)
    sid = daemon.ok({"op": "open", "target": str(target), "grants": grants(backend)})["sid"]
    weird = b"ok\xff\xfe\xed\xa0\x80\xc0\x80\xf4\x90\x80\x80 \xe2\x82\xac\n\x00end\xe2\x82"
    with daemon.connect(timeout=120) as conn:
        reply = conn.request({"op": "exec", "sid": sid, "argv": [
            "python3", "-c", "import sys; sys.stdout.buffer.write(bytes.fromhex(sys.argv[1]))",
            weird.hex()]})
        assert reply["ok"] and reply["exit_code"] == 0, reply
        assert conn.output() == weird
        assert any("b64" in e for e in conn.events)


def test_a_command_in_a_brokered_session_cannot_reach_the_daemon(daemon, target, backend):
    """The daemon's socket lives in OVERLORD_HOME, which a session's command never sees (the
    jail's root; on the fuse backend a tmpfs over it): a command cannot ask the daemon to
    commit its own session."""
    daemon.allow(target)
    sid = daemon.ok({"op": "open", "target": str(target), "grants": grants(backend)})["sid"]
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n"
             "    s.connect(sys.argv[1]); s.sendall(b'{\"id\":1,\"op\":\"ping\"}\\n')\n"
             "    print('REACHED', s.recv(999))\n"
             "except OSError as e:\n"
             "    print('REFUSED', e.errno)\n")
    with daemon.connect(timeout=120) as conn:
        reply = conn.request({"op": "exec", "sid": sid,
                              "argv": ["python3", "-c", probe, daemon.socket]})
        assert reply["ok"], reply
        assert conn.output().startswith(b"REFUSED"), conn.output()


# == the hook ====================================================================================

def sid_in(out):
    """The session id the rewritten command runs in."""
    words = out["updatedInput"]["command"].split()
    return words[words.index("--wait") + 1].strip("'")


def test_a_state_file_naming_another_folders_session_is_not_used(ovl, home, target, backend,
                                                                  tmp_path):
    """The remembered entry was trusted as long as its sid's record matched the entry's own
    target -- not the project asked about: an entry copied from another project ran this
    project's commands in that project's session."""
    other = tmp_path / "other"
    other.mkdir()
    path = home.parent / "policy-two.json"
    rule = {"net": "host"} if backend == "fuse" else {}
    path.write_text(json.dumps({"targets": {str(target): rule, str(other): rule}}))
    ops.policy_set(str(path))
    theirs = sid_in(decision(hook(ovl, payload("Bash", {"command": "true"}, other), backend)))
    state = json.loads((home / STATE).read_text())
    state["projects"][os.path.realpath(target)] = state["projects"][os.path.realpath(other)]
    (home / STATE).write_text(json.dumps(state))
    out = decision(hook(ovl, payload("Bash", {"command": "echo x > mine.txt"}, target), backend))
    if out["permissionDecision"] != "deny":
        ours = sid_in(out)
        assert ours != theirs
        assert ops.get_session(ours).target == os.path.realpath(target)
        assert run_rewritten(out, tmp_path).returncode == 0
        assert ovl.diff(ours) == [("added", "mine.txt")]
    assert ovl.diff(theirs) == []


def test_a_remembered_session_looser_than_the_hook_now_asks_is_not_used(home, target, tmp_path,
                                                                        monkeypatch):
    """A person who drops --no-jail from the hook's command expects the jail: the session the
    unjailed hook opened kept being used, unjailed, until someone committed it. (The jail is
    the kernel backend's: this runs there only.)"""
    require_backend("kernel")
    backend = "kernel"
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", backend)
    ovl = Ovl(home, backend)
    admit(home, target, backend)
    loose = ovl("hook", "claude-code", "--no-jail", "--net", "host",
                input=json.dumps(payload("Bash", {"command": "true"}, target)).encode(),
                env={"CLAUDE_PROJECT_DIR": ""})
    loose.answer = json.loads(loose.out)
    first = sid_in(decision(loose))
    assert ops.get_session(first).meta["grants"]["jail"] is False
    out = decision(hook(ovl, payload("Bash", {"command": "echo x > j.txt"}, target), backend))
    if out["permissionDecision"] == "deny":
        assert first in out["permissionDecisionReason"] or "pending" in \
            out["permissionDecisionReason"], out
        return
    sid = sid_in(out)
    assert sid != first
    assert (ops.get_session(sid).meta["grants"]["jail"], ops.get_session(sid).meta["grants"]["net"]) \
        == (True, "none")


@pytest.mark.parametrize("command", ["-e; echo ran > dash.txt", "+x; echo ran > dash.txt",
                                     "--version; echo ran > dash.txt",
                                     "-- 2>/dev/null; echo ran > dash.txt"])
def test_a_command_that_starts_with_a_dash_runs_as_a_command(ovl, home, target, backend,
                                                            tmp_path, command):
    """`bash -c CMD` reads a CMD that starts with - or + as bash's own options: the command
    did not run at all (or, for --version, printed bash's version and exited 0)."""
    admit(home, target, backend)
    out = decision(hook(ovl, payload("Bash", {"command": command}, target), backend))
    done = run_rewritten(out, tmp_path)
    assert b"GNU bash" not in done.stdout, done.stdout
    assert ovl.diff(sid_in(out)) == [("added", "dash.txt")], done.stderr


TRICKS = [
    ("ansi-c quote", "echo $'a\\x27b' > ansi.txt", {"ansi.txt": b"a'b\n"}),
    ("here-doc", "cat > here.txt <<'EOF'\n$(touch {real}/escaped.txt) 'q' \"d\"\nEOF",
     {"here.txt": b"$(touch {real}/escaped.txt) 'q' \"d\"\n"}),
    ("trailing backslash", "echo tb > tb.txt \\", {"tb.txt": b"tb \\\n"}),
    ("unicode", "echo 'é€😀' > 'ünï😀.txt'", {"ünï😀.txt": "é€😀\n".encode()}),
    ("carriage return", "echo one > one.txt\r\necho two > two.txt", {"two.txt": b"two\n"}),
    ("long", "echo " + "x" * 60000 + " > long.txt", {"long.txt": b"x" * 60000 + b"\n"}),
    ("quotes galore", "printf '%s\\n' \"it's\" 'say \"hi\"' \"\\$HOME\" > q.txt",
     {"q.txt": b"it's\nsay \"hi\"\n$HOME\n"}),
]


@pytest.mark.parametrize("name,command,made", TRICKS, ids=[t[0] for t in TRICKS])
def test_shell_tricks_run_whole_inside_the_session(ovl, home, target, backend, tmp_path,
                                                   name, command, made):
    admit(home, target, backend)
    before = tree(target)
    command = command.replace("{real}", str(target))
    out = decision(hook(ovl, payload("Bash", {"command": command}, target), backend))
    assert out["permissionDecision"] == "allow", out
    run_rewritten(out, tmp_path)
    assert tree(target) == before                          # nothing reached the real tree
    sid = sid_in(out)
    for path, content in made.items():
        assert ("added", path) in ovl.diff(sid), (name, ovl.diff(sid))
        shown = ovl("exec", sid, "--", "cat", path, check=0)
        assert shown.out.encode() == content.replace(b"{real}", str(target).encode()), shown.err


def test_a_project_dir_at_overlord_home_or_its_inside_is_denied(ovl, home, target, backend):
    admit(home, target, backend)
    for where in (home, home / "sessions"):
        proc = hook(ovl, payload("Bash", {"command": "true"}, target), backend,
                    env={"CLAUDE_PROJECT_DIR": str(where)})
        out = decision(proc)
        assert out["permissionDecision"] == "deny" and "updatedInput" not in out, out
    assert not (home / "sessions").exists() or os.listdir(home / "sessions") == []


def test_a_project_dir_through_a_symlink_is_the_folder_it_names(ovl, home, target, backend,
                                                                tmp_path):
    admit(home, target, backend)
    link = tmp_path / "link"
    link.symlink_to(target)
    out = decision(hook(ovl, payload("Bash", {"command": "pwd; echo l > l.txt"}, link), backend,
                        env={"CLAUDE_PROJECT_DIR": str(link)}))
    sid = sid_in(out)
    assert ops.get_session(sid).target == os.path.realpath(target)
    done = run_rewritten(out, tmp_path)
    assert done.returncode == 0 and ovl.diff(sid) == [("added", "l.txt")], done.stderr


def test_a_cwd_outside_the_project_starts_at_the_project_root_inside_the_session(
        ovl, home, target, backend, tmp_path):
    admit(home, target, backend)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = decision(hook(ovl, payload("Bash", {"command": "pwd; echo e > e.txt"}, elsewhere),
                        backend, env={"CLAUDE_PROJECT_DIR": str(target)}))
    done = run_rewritten(out, tmp_path)
    assert done.returncode == 0 and done.stdout.decode().strip() == str(target), done.stderr
    assert not (elsewhere / "e.txt").exists()
    assert ovl.diff(sid_in(out)) == [("added", "e.txt")]


def test_a_state_file_planted_as_a_symlink_is_replaced_not_written_through(ovl, home, target,
                                                                          backend, tmp_path):
    admit(home, target, backend)
    victim = tmp_path / "victim.json"
    victim.write_text('{"projects": {}}')
    os.symlink(victim, home / STATE)
    decision(hook(ovl, payload("Bash", {"command": "true"}, target), backend))
    assert victim.read_text() == '{"projects": {}}'
    st = os.lstat(home / STATE)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


# == the SDK =====================================================================================
# against test_sdk.py's fake daemon: fake(behave) answers each request line with behave(f, r)

def calling(fn, limit=60):
    """fn() in a thread: (the exception it raised or its result, seconds); fails if it is
    still running after limit seconds."""
    box = []
    t0 = time.monotonic()
    thread = threading.Thread(target=lambda: box.append(_outcome(fn)), daemon=True)
    thread.start()
    thread.join(limit)
    assert box, f"the call was still running after {limit} s"
    return box[0], time.monotonic() - t0


def _outcome(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - inspected by the test
        return exc


def test_a_reply_nested_past_the_parser_is_502_not_a_dead_reader(fake):
    """json.loads raises RecursionError (not ValueError) on deep nesting: the SDK's reader
    thread died with a traceback on stderr and every call waited for ever (or its timeout)."""
    d = fake(lambda f, r: send(f, b"[" * 200000 + b"\n") or "hang up")
    client = oc.Client(d.path, timeout=30)
    got, took = calling(client.ping)
    assert isinstance(got, oc.OverlordError) and got.code == oc.BAD_REPLY, repr(got)
    assert took < 20
    client.close()


def test_an_event_of_an_odd_shape_is_not_a_raw_exception(fake):
    def behave(f, r):
        for event in ({"kind": "output", "stream": ["stdout"], "text": "x"},
                      {"kind": "output", "stream": {"a": 1}, "b64": "eA=="},
                      {"kind": ["output"]}, "not an object"):
            send(f, {"id": r["id"], "event": event})
        send(f, {"id": r["id"], "ok": True, "exit_code": 0})
        return "hang up"
    d = fake(behave)
    with oc.Client(d.path, timeout=30) as client:
        got, _ = calling(lambda: client.exec("20260101-000000-abcdef", ["true"]))
        assert isinstance(got, (oc.ExecResult, oc.OverlordError)), repr(got)


def test_a_peer_that_never_reads_cannot_hold_a_call_past_its_timeout(tmp_path):
    path = str(tmp_path / "deaf.sock")
    deaf = socket.socket(socket.AF_UNIX)            # listens, never accepts, never reads
    deaf.bind(path)
    deaf.listen(1)
    client = oc.Client(path, timeout=2)
    try:
        got, took = calling(lambda: client.exec("20260101-000000-abcdef", ["cat"],
                                                stdin="x" * (900 << 10)))
        assert isinstance(got, oc.OverlordError) and got.code in (oc.NO_DAEMON, oc.NO_REPLY), \
            repr(got)
        assert took < 30
    finally:
        client.close()
        deaf.close()


def test_a_reply_line_without_end_is_refused_past_the_cap(fake, monkeypatch):
    monkeypatch.setattr(oc, "MAX_REPLY", 1 << 20, raising=False)
    def behave(f, r):
        try:
            send(f, b'{"id": 1, "ok": true, "pad": "' + b"y" * (3 << 20))
        except OSError:
            pass                                     # the client stopped reading, as it should
        return "hang up"
    d = fake(behave)
    client = oc.Client(d.path)                       # no timeout at all
    got, _ = calling(client.ping, limit=60)
    assert isinstance(got, oc.OverlordError) and got.code == oc.BAD_REPLY, repr(got)
    client.close()


def test_garbage_bytes_and_stray_ids_from_the_peer_are_overlord_errors(fake):
    def behave(f, r):
        for rid in ("1", 1.0, [1], {"id": 1}, None, r["id"] + 1000):
            send(f, {"id": rid, "ok": True, "stray": True})
        send(f, b"\xff\xfe not utf-8\n")
        return "hang up"
    d = fake(behave)
    client = oc.Client(d.path, timeout=30)
    got, _ = calling(client.ping)
    assert isinstance(got, oc.OverlordError) and got.code == oc.BAD_REPLY, repr(got)
    client.close()


@needs_root
def test_the_sdk_will_not_talk_to_a_socket_another_user_serves():
    """Anything another user manages to put on the socket path (a folder they can write, a
    daemon that is not running) got every request -- commands, stdin -- and was believed."""
    where = tempfile.mkdtemp(prefix="overlord-rt-", dir="/tmp")    # reachable by every user
    os.chmod(where, 0o1777)                                        # and sticky, as /tmp
    path = os.path.join(where, "overlordd.sock")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the impostor, as uid 65534
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            s = socket.socket(socket.AF_UNIX)
            s.bind(path)
            os.chmod(path, 0o666)
            s.listen(1)
            os.write(w, b"ready")
            conn, _ = s.accept()
            seen = b""
            while b"\n" not in seen:
                seen += conn.recv(1 << 16)
            req = json.loads(seen.split(b"\n")[0])
            conn.sendall(json.dumps({"id": req["id"], "ok": True, "pid": 1, "uid": 0,
                                     "impostor": True}).encode() + b"\n")
            os.write(w, seen)
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert select.select([r], [], [], 60)[0] and os.read(r, 5) == b"ready"
        client = oc.Client(path, timeout=30)
        got, _ = calling(lambda: client.call("ping", secret="stdin of a command"))
        assert isinstance(got, oc.OverlordError) and got.code == oc.NO_DAEMON, repr(got)
        assert str(NOBODY) in str(got)
        client.close()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        leaked = os.read(r, 1 << 16) if select.select([r], [], [], 0)[0] else b""
        os.close(r)
        shutil.rmtree(where, ignore_errors=True)
    assert b"stdin of a command" not in leaked
