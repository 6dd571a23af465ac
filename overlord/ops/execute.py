"""Opening sessions and running commands in them: `run`, `exec`."""
import dataclasses
import os
import select
import shlex
import shutil
import stat
import sys
import threading
import time

from overlord.errors import Denied, LaunchError, OverlordError, UsageError
from overlord.sandbox import backends, executor, harden, jail, limits
from overlord.sandbox import trace_ebpf
from overlord.sandbox.trace import Recorder
from overlord.txn import gitdir, locks, store
from overlord.txn.session import Session, open_stamp_ns, remove_tree
from overlord.ops.grants import (_check_backend_grants, _inside, require_target, resolve_target,
                                 target_id, validate_grants)
from overlord.ops.review import _recover_stale, get_session
from overlord.trust import audit, policy


# -- the launcher hook --------------------------------------------------------------------------
# Namespaces come from a fresh single-threaded process (DESIGN.md): a threaded face (the web UI)
# must never clone them itself. Such a face forks a single-threaded helper before its first
# thread (overlord/ops/launcher.py) and sets `launcher` to the helper's client. From then on
# run() and exec_in() -- and so exec_capture() and every tool call of an agent running in one of
# the face's threads -- are performed by the helper and come back as the same results. The
# helper itself keeps `launcher` None. A pty or an on_child hook cannot cross the process
# boundary, so run() with either is refused while a launcher is set.
launcher = None


def use_launcher(client):
    """Route run/exec_in through `client` from now on, and pin the backend probes it made in
    the helper (probing clones too). Call once, before the face starts its threads' work."""
    global launcher
    backends.pin(client.probe_all())
    launcher = client


# -- run ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class RunResult:
    sid: str
    exit_code: int
    timed_out: bool
    state: str                # pending, timed-out, or unchanged (the command changed nothing)
    changes: list
    syscalls: int = None
    notes: list = dataclasses.field(default_factory=list)   # what the person must know: str
    at_line_start: bool = None   # track_stdout: did the caller's stdout end at a line start?
    layer: int = None         # the savepoint the command sealed, or None if it wrote nothing


def run(argv, target=None, backend=None, grants=None, trace=None, wait=False, stack=False,
        pty_slave=None, cause=None, on_child=None, track_stdout=False, close_if_unchanged=None,
        stdio=None, cancel=None, broker=None):
    """Open a session on target, run one command in it, leave it pending. Returns RunResult.

    A command that changed nothing leaves the session `unchanged`: closed, so it blocks no
    later run on the target -- unless close_if_unchanged is False (by default an agent's
    opening command, cause kind "agent", keeps its session open for the agent's calls).
    track_stdout: the command's stdout passes through this process (or, for a regular file,
    its last byte is read back), so RunResult.at_line_start can tell the face whether its
    own next line starts on a fresh line. stdio and cancel: as for exec_in(). broker: who
    asked, for a brokered session ({"face", "client"}, see ops.broker), kept on its record."""
    if not argv:
        raise UsageError("missing command after --")
    if launcher is not None:
        if pty_slave is not None or on_child is not None or track_stdout:
            raise UsageError("a pty, an on_child hook or track_stdout cannot be used through "
                             "the launcher")
        return launcher.run(argv, target=target, backend=backend, grants=grants, trace=trace,
                            wait=wait, stack=stack, cause=cause,
                            close_if_unchanged=close_if_unchanged, stdio=stdio, cancel=cancel,
                            broker=broker)
    cause = cause or command_cause(argv)
    if close_if_unchanged is None:
        close_if_unchanged = cause.get("kind") != "agent"
    given, target = target, resolve_target(target)
    if broker is not None and target != given:   # ops.Broker checked policy for `given`, real then
        from overlord.text import escape_path
        raise Denied(f"the target {escape_path(given)} changed since policy was checked for it "
                     f"(it leads to {escape_path(target)} now, through a symlink): nothing was opened")
    grants, held = policy.cap(target, grants or {})      # refuses a grant looser than policy
    mod = backends.choose(backend)
    _check_backend_grants(mod, grants, target)
    if trace not in (None, "strace", "ebpf"):
        raise UsageError(f"--trace takes strace or ebpf, not {trace!r}")
    if trace == "ebpf":
        ok, why = trace_ebpf.available()
        if not ok or mod.NAME != "kernel":
            raise OverlordError(f"--trace ebpf is unavailable: {why if not ok else 'needs the kernel backend'}")
    if trace == "strace" and not shutil.which("strace"):
        raise OverlordError("--trace needs strace; install it (apt-get install strace)")
    store.ensure_home()
    audit.ready()            # a session opens only where its opening can be recorded
    with locks.TargetLock(target, wait=wait):
        refuse_if_pending(target, stack)
        session = _create_session(target, mod, grants, argv, trace, held.origin(), broker)
        watch = StdoutWatch() if track_stdout and pty_slave is None else None
        try:
            outcome, count = _execute(session, mod, argv, cause, pty_slave=pty_slave,
                                      on_child=on_child,
                                      stdio=(watch.start() if watch else None) or stdio,
                                      cancel=cancel)
        except LaunchError:
            _stop_netns(session.sid)      # its holder (and proxy) too, if one was started
            remove_tree(session.dir)      # a launch that failed leaves no half-made session
            raise
        finally:
            if watch:
                watch.finish()
        changes = session.plan()
        layer = len(session.meta["layers"]) - 1 if session.meta["layers"] else None
        if not changes and close_if_unchanged:
            state = "unchanged"
        else:
            state = "timed-out" if outcome.timed_out else "pending"
        session.meta.update(state=state, exit_code=outcome.exit_code, finished=time.time())
        if outcome.timed_out:
            session.meta["timed_out"] = True
        session.save()
    if state == "unchanged":
        _close_unchanged(session)
    return RunResult(session.sid, outcome.exit_code, outcome.timed_out, state, changes, count,
                     notes=run_notes(mod, grants, target),
                     at_line_start=watch.at_line_start if watch else None, layer=layer)


def _stop_netns(sid):
    netns = sys.modules.get("overlord.sandbox.netns")
    if netns is not None:
        netns.stop(sid)


def _close_unchanged(session):
    """An unchanged session keeps only its record, like a rolled-back one."""
    from overlord.ops.decide import _drop_working_files
    _drop_working_files(session)


def run_notes(mod, grants, target):
    """What a person must know about what this session captured: said once, after the run."""
    from overlord.text import escape_path
    notes = []
    if not grants.get("jail"):
        notes.append(f"unjailed: writes outside {escape_path(target)} are not captured")
    caveat = getattr(mod, "caveat", None)
    said = caveat(grants) if caveat else None
    if isinstance(said, str):
        said = [said]
    notes.extend(n for n in said or () if n and n not in notes)
    return notes


class StdoutWatch:
    """Learns whether the caller's stdout ends at the start of a line once a command has
    written to it, so a face can start its own line fresh. A pipe or socket is relayed
    through this process (the command writes into our pipe; a thread copies every byte on,
    remembering the last); a regular file is read back at its end; a terminal cannot be
    known (at_line_start stays None) and is never interposed, nor is anything else."""

    def __init__(self):
        self.at_line_start = None
        self._relay = None
        self._file = False

    def start(self):
        """The stdio tuple to launch the command with (None: inherit the caller's)."""
        try:
            st = os.fstat(1)
        except OSError:
            return None
        if os.isatty(1):
            return None
        if stat.S_ISREG(st.st_mode):
            self._file = True
            return None
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            self._relay = _Relay(1)
            return (None, self._relay.write_fd, None)
        self.at_line_start = True          # a device such as /dev/null: lines do not matter
        return None

    def finish(self):
        if self._relay is not None:
            self.at_line_start = self._relay.finish()
        elif self._file:
            self.at_line_start = _file_ends_a_line(1)


def _file_ends_a_line(fd):
    """Does the regular file open on fd end (at this descriptor's offset, or at the end for
    an appending one) with a newline, or hold nothing before it? None if it cannot be read."""
    import fcntl
    try:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
            end = os.fstat(fd).st_size
        else:
            end = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return None
    if end <= 0:
        return True
    try:
        last = os.pread(fd, 1, end - 1)
    except OSError:
        try:           # write-only: read the same file through a fresh descriptor
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(rfd).st_mode):
                return None
            last = os.pread(rfd, 1, end - 1)
        except OSError:
            return None
        finally:
            os.close(rfd)
    return last in (b"\n", b"")


class _Relay:
    """Copies a pipe the command writes into on to `out`, remembering the last byte. After
    the command ended, finish() drains what it left in the pipe and stops (a process that
    outlived it and writes later gets EPIPE, as with a closed reader)."""

    def __init__(self, out):
        self.out = out
        self.read_fd, self.write_fd = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        self.last = b""
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self):
        try:
            while True:
                ready, _, _ = select.select([self.read_fd, self._stop_r], [], [])
                if self.read_fd not in ready:
                    return                        # stopped, and nothing is left to copy
                data = os.read(self.read_fd, 1 << 16)
                if not data:
                    return
                self.last = data[-1:]
                if not self._write(data):
                    return
        except OSError:
            return

    def _write(self, data):
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out, view)
            except BlockingIOError:
                select.select([], [self.out], [])
                continue
            except OSError:                    # the reader went away (EPIPE): so do we
                return False
            view = view[n:]
        return True

    def finish(self):
        """Stop after copying what is in the pipe; True if the last byte was a newline (or
        nothing was written)."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None
        os.write(self._stop_w, b"x")
        self.thread.join()
        for fd in (self.read_fd, self._stop_r, self._stop_w):
            os.close(fd)
        return self.last in (b"\n", b"")


def refuse_if_pending(target, stack):
    """One pending session per target unless --stack (call with the target lock held)."""
    for meta in locks.pending_on(target):
        if meta["state"] == "running":
            _recover_stale(Session(meta))
    others = locks.pending_on(target)
    if others and not stack:
        raise OverlordError(f"session {others[0]['sid']} is still {others[0]['state']} on "
                            f"{target}: commit or roll it back first (--stack overrides)")


@dataclasses.dataclass
class ExecResult:
    sid: str
    exit_code: int
    timed_out: bool
    layer: int        # the savepoint this command sealed, or None if it wrote nothing
    at_line_start: bool = None    # track_stdout: see run()


def exec_in(sid, argv, cause=None, timeout=None, wait=False, stdio=None, cancel=None,
            track_stdout=False):
    """Run one more command inside a pending session: the per-tool-call path.
    stdio: (stdin, stdout, stderr) fds for the command (None: the caller's own).
    cancel: a threading.Event; once it is set the command's whole tree is killed (within
    0.1 s), whatever signals it ignores -- an agent's Ctrl-C.
    track_stdout: as for run() (only with stdio None): ExecResult.at_line_start."""
    if not argv:
        raise UsageError("missing command after --")
    if timeout is not None:
        validate_grants({"timeout": timeout}, "--timeout")     # NaN, inf: refused, not a crash
    if launcher is not None:
        return launcher.exec_in(sid, argv, cause=cause, timeout=timeout, wait=wait, stdio=stdio,
                                cancel=cancel)
    session = get_session(sid)
    sid = session.sid
    if session.meta["state"] not in store.OPEN_STATES:
        raise OverlordError(f"cannot run in session {sid}: it is {session.meta['state']}")
    require_target(session.target, session.meta.get("target_id"))
    policy.hold(session.target, session.meta["grants"], timeout, sid)   # today's policy, not the opening one's
    if session.meta.get("limit"):
        raise OverlordError(f"session {sid} crossed its {session.meta['limit']} grant and can run "
                            "nothing more; review it, then commit or roll it back")
    mod = backends.get(session.dialect)
    watch = StdoutWatch() if track_stdout and stdio is None else None
    with locks.TargetLock(session.target, wait=wait):
        session = get_session(sid)     # as the command that held the lock left it (its layer)
        if session.meta["state"] not in store.OPEN_STATES:
            raise OverlordError(f"cannot run in session {sid}: it is {session.meta['state']}")
        before = len(session.meta["layers"])
        try:
            outcome, _ = _execute(session, mod, argv, cause or command_cause(argv), timeout=timeout,
                                  stdio=(watch.start() if watch else None) or stdio, cancel=cancel)
            granted = session.meta["grants"].get("timeout")
            if timeout and (not granted or timeout > granted):      # looser than it opened with
                audit.append("session.exec", sid=sid, target=session.target,
                             command=shlex.join(argv), grants={"timeout": timeout},
                             attestation=getattr(outcome, "attestation", None))
        finally:
            if watch:
                watch.finish()
        session.save()
    layer = before if len(session.meta["layers"]) > before else None
    return ExecResult(sid, outcome.exit_code, outcome.timed_out, layer,
                      at_line_start=watch.at_line_start if watch else None)


@dataclasses.dataclass
class Captured:
    sid: str
    exit_code: int
    timed_out: bool
    layer: int
    stdout: bytes
    stderr: bytes
    truncated: bool          # output over the cap: head and tail kept, the middle dropped


def exec_capture(sid, argv, input=b"", cause=None, timeout=None, wait=False, cap=64 << 10,
                 cancel=None, on_output=None):
    """exec_in with the command's stdin fed from `input` (never argv: any size works) and its
    output captured, keeping at most `cap` bytes per stream (head and tail); on_output(stream,
    chunk) also sees every chunk as it arrives ("stdout"/"stderr", bytes, from reader threads)."""
    res, stdout, stderr, cut = captured(
        lambda stdio: exec_in(sid, argv, cause=cause, timeout=timeout, wait=wait, stdio=stdio,
                              cancel=cancel), input, cap, on_output)
    return Captured(sid, res.exit_code, res.timed_out, res.layer, stdout, stderr, cut)


def captured(call, input=b"", cap=64 << 10, on_output=None):
    """(call's result, stdout, stderr, truncated): call(stdio) runs one command with stdin fed
    from `input` and its output drained by threads (see exec_capture)."""
    stdin = os.memfd_create("overlord-stdin", os.MFD_CLOEXEC)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    out, err = _Tail(out_r, cap, "stdout", on_output), _Tail(err_r, cap, "stderr", on_output)
    try:
        os.write(stdin, input or b"")
        os.lseek(stdin, 0, os.SEEK_SET)
        res = call((stdin, out_w, err_w))
    finally:
        for fd in (stdin, out_w, err_w):      # our copies: the readers see EOF when the command ends
            os.close(fd)
        (stdout, cut_out), (stderr, cut_err) = out.join(), err.join()
    return res, stdout, stderr, cut_out or cut_err


class _Tail:
    """Drains a pipe on a thread, keeping its first and last cap/2 bytes."""

    def __init__(self, fd, cap, stream=None, on_output=None):
        self.fd, self.cap, self.stream, self.on_output = fd, cap, stream, on_output
        self.head, self.tail, self.dropped = bytearray(), bytearray(), False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        half = self.cap // 2
        while True:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                break
            if self.on_output is not None:
                try:
                    self.on_output(self.stream, chunk)
                except Exception:          # noqa: BLE001 - a face's failure must not stop the drain
                    self.on_output = None
            room = half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail += chunk
                if len(self.tail) > half:
                    del self.tail[:len(self.tail) - half]
                    self.dropped = True
        os.close(self.fd)

    def join(self):
        self.thread.join()
        if self.dropped:
            return bytes(self.head) + b"\n[... output truncated ...]\n" + bytes(self.tail), True
        return bytes(self.head + self.tail), False


def command_cause(argv):
    return {"kind": "command", "command": shlex.join(argv)}


def _new_session_dir():
    while True:
        sid = store.new_sid()
        try:
            os.mkdir(store.session_dir(sid), 0o700)
            return sid
        except FileExistsError:
            continue


def _create_session(target, mod, grants, argv, trace, policy_origin=None, broker=None):
    sid = _new_session_dir()
    meta = {"sid": sid, "target": target, "backend": mod.NAME, "state": "running",
            "created": time.time(), "open_stamp_ns": open_stamp_ns(), "grants": grants,
            "target_id": target_id(target),
            "merge_base": bool(grants.get("merge_base")), "trace": trace,
            "command": shlex.join(argv), "layers": [], "uid": os.getuid(),
            "enforcement": enforcement(grants), "policy": policy_origin,
            "git": gitdir.record(target)}
    if broker:
        meta["broker"] = broker
    session = Session(meta)
    session.save()
    return session


def enforcement(grants):
    """Which layers will hold the session's resource grants on this host."""
    kind, why = limits.cgroup_kind()
    return {"rlimits": True, "cgroup": kind, "cgroup_reason": None if kind else why,
            "disk_watch": True, "not_enforced": limits.not_enforced(grants.get("limits"), kind)}


def _execute(session, mod, argv, cause, timeout=None, pty_slave=None, on_child=None, stdio=None,
             cancel=None):
    """Run one command over the session's stack, under the session's grants, and seal what
    it wrote as a new layer."""
    grants, trace = session.meta["grants"], session.meta.get("trace")
    jailed, net = bool(grants.get("jail")), grants.get("net", "host")
    env = executor.sandbox_env(jailed=jailed)
    holder = None
    if net in ("none", "proxy") and mod.NAME == "kernel":
        # the session's network namespace, kept by a holder in this (launching) process and
        # joined by every command; started before the session's cgroup holds this process,
        # so the holder and the proxy are never counted against the command's limits
        from overlord.sandbox import netns
        holder = netns.ensure(session.sid, session.dir, net, grants)     # or LaunchError
        if net == "proxy":
            env.update(netns.proxy_env())
            store.write_json_atomic(session.path("egress-command.json"),
                                    {"layer": len(session.meta["layers"]),
                                     "cause": cause_line(cause)})
    granted = limits.effective(grants.get("limits"))
    lowers, upper = session.stack_for_next()
    work = session.path("work")
    if not os.path.isdir(work):
        os.mkdir(work, 0o700)
    recorder = Recorder(session.path("syscalls.jsonl")) if trace == "strace" else None
    ebpf = trace_ebpf.EbpfRecorder(session.path("syscalls.jsonl")) if trace == "ebpf" else None
    tty = os.ttyname(pty_slave) if pty_slave is not None else None
    if jailed:
        os.makedirs(session.path("root"), exist_ok=True)
    cgroup = limits.Cgroup(session.sid, grants.get("limits"))
    cgroup.create()
    cgroup.enter()
    child = {}
    used = sum(layer.get("bytes", 0) for layer in session.meta["layers"])
    disk_left = max(1, granted["disk_mb"] * limits.MiB - used) if granted["disk_mb"] else 0
    disk = limits.DiskWatch(upper, disk_left, lambda: mod.terminate(child["pid"]))

    def watch():
        if disk.budget:
            disk.poll()
        if cancel is not None and cancel.is_set():
            mod.terminate(child["pid"])

    def started(pid):
        child["pid"] = pid
        if ebpf:
            ebpf.attach(pid)        # before the command may start; refuses to run without it
        for hook in (recorder.start if recorder else None, on_child):
            if hook:
                hook()
    spec = executor.Launch(
        target=session.target, lowers=lowers, upper=upper, work=work, argv=list(argv), cwd=command_cwd(session.target),
        env=env, timeout=timeout or grants.get("timeout"),
        pty_slave=pty_slave, tty_path=(jail.CONSOLE if jailed else tty) if tty else None,
        trace_fd=recorder.write_fd if recorder else None,
        mount_point=session.path("merged"), hide=(store.home(),), net=net,
        netns=holder.nsfds if holder is not None else None,
        jail=jail.plan(session.target, net, tty) if jailed else None, newroot=session.path("root"),
        hardening=harden.prepare(allow_ptrace=trace == "strace"), on_child=started,
        watch=watch if disk.budget or cancel is not None else None,
        rlimits=limits.rlimits(grants.get("limits"), cgroup.memory, disk_left), stdio=stdio)
    try:
        outcome = mod.launch(spec)
    except BaseException:
        for rec in (recorder, ebpf):
            if rec:
                rec.finish()
        if not session.absorbing:
            remove_tree(upper)
        remove_tree(work)
        raise
    else:
        if not outcome.pinned:      # overlay leaves a mode-000 dir in it: never leave that behind
            remove_tree(work)
    finally:
        crossed = disk.stop()
        for scratch in ("merged", "root"):
            if os.path.isdir(session.path(scratch)) and not os.path.ismount(session.path(scratch)):
                try:
                    os.rmdir(session.path(scratch))
                except OSError:
                    pass          # something was put in it after a lazy unmount
    if outcome.attestation is not None and not session.meta.get("attestation"):
        session.meta["attestation"] = outcome.attestation     # what confined its first command
    count = (recorder or ebpf).finish() if (recorder or ebpf) else None
    if count is not None:
        cause = dict(cause, syscalls=count)
    if crossed:
        outcome = dataclasses.replace(outcome, exit_code=limits.DISK_EXIT)
        session.meta["limit"] = "disk_mb"
        cause = dict(cause, limit="disk_mb")
    index = session.seal(cause)
    if index is not None:
        layer = session.meta["layers"][index]
        layer["bytes"] = limits.layer_bytes(session.path("layers", layer["dir"]))
        if outcome.attestation is not None:
            layer["attestation_sha256"] = executor.attestation_sha256(outcome.attestation)
    _record_acts(session, outcome, cause)
    if outcome.pinned:
        # a process outside the command still held the fuse mount: what it writes from now on
        # lands in this savepoint (or nowhere, if the command wrote nothing), unattributed
        session.meta.setdefault("pinned", []).append({"at": time.time(), "layer": index,
                                                      "cause": cause})
        if index is not None:
            session.meta["layers"][index]["pinned"] = True
    return outcome, count


def cause_line(cause, cap=1000):
    """A command's cause as one line of at most cap characters (for egress-command.json)."""
    from overlord.text import cause_text
    return " ".join(cause_text(cause).split())[:cap]


def _record_acts(session, outcome, cause):
    """The audit chain's view of a command: the session's opening (with what really confined
    it, read back by its first command), and a timeout or a crossed grant that ended one."""
    where = {"sid": session.sid, "target": session.target}
    if session.meta.get("opened_seq") is None:
        grants = session.meta["grants"]
        line = audit.append("session.open", **where, backend=session.meta["backend"],
                            grants=grants, command=session.meta.get("command"),
                            policy=session.meta.get("policy"), broker=session.meta.get("broker"),
                            attestation=session.meta.get("attestation"))
        session.meta["opened_seq"] = line["seq"]
    if outcome.timed_out:
        audit.append("session.timeout", **where, command=cause.get("command"),
                     timeout=session.meta["grants"].get("timeout"))
    if cause.get("limit"):
        name = cause["limit"]
        audit.append("session.limit", **where, grant=name, command=cause.get("command"),
                     value=limits.effective(session.meta["grants"].get("limits")).get(name))


def command_cwd(target):
    """The command starts where the caller is if that is inside the target, else at its root."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except FileNotFoundError:
        return target
    return cwd if _inside(cwd, target) else target
