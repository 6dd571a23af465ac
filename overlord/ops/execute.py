"""Opening sessions and running commands in them: `run`, `exec`."""
import dataclasses
import os
import shlex
import shutil
import time

from overlord.errors import LaunchError, OverlordError, UsageError
from overlord.sandbox import backends, executor, harden, jail, limits
from overlord.sandbox import trace_ebpf
from overlord.sandbox.trace import Recorder
from overlord.txn import locks, store
from overlord.txn.session import Session, open_stamp_ns, remove_tree
from overlord.ops.grants import _check_backend_grants, _inside, resolve_target
from overlord.ops.review import _recover_stale, get_session


# -- the launcher hook --------------------------------------------------------------------------
# Namespaces come from a fresh single-threaded process (DESIGN.md): a threaded face (the web UI)
# must never clone them itself. Such a face forks a single-threaded helper before its first
# thread (overlord/web/launcher.py) and sets `launcher` to the helper's client. From then on
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
    state: str
    changes: list
    syscalls: int = None


def run(argv, target=None, backend=None, grants=None, trace=None, wait=False, stack=False,
        pty_slave=None, cause=None, on_child=None):
    """Open a session on target, run one command in it, leave it pending. Returns RunResult."""
    if not argv:
        raise UsageError("missing command after --")
    if launcher is not None:
        if pty_slave is not None or on_child is not None:
            raise UsageError("a pty or an on_child hook cannot be used through the launcher")
        return launcher.run(argv, target=target, backend=backend, grants=grants, trace=trace,
                            wait=wait, stack=stack, cause=cause)
    grants = grants or {}
    target = resolve_target(target)
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
    with locks.TargetLock(target, wait=wait):
        refuse_if_pending(target, stack)
        session = _create_session(target, mod, grants, argv, trace)
        try:
            outcome, count = _execute(session, mod, argv, cause or command_cause(argv),
                                      pty_slave=pty_slave, on_child=on_child)
        except LaunchError:
            remove_tree(session.dir)      # a launch that failed leaves no half-made session
            raise
    session.meta.update(state="timed-out" if outcome.timed_out else "pending",
                        exit_code=outcome.exit_code, finished=time.time())
    session.save()
    return RunResult(session.sid, outcome.exit_code, outcome.timed_out, session.meta["state"],
                     session.plan(), count)


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


def exec_in(sid, argv, cause=None, timeout=None, wait=False, stdio=None, cancel=None):
    """Run one more command inside a pending session: the per-tool-call path.
    stdio: (stdin, stdout, stderr) fds for the command (None: the caller's own).
    cancel: a threading.Event; once it is set the command's whole tree is killed (within
    0.1 s), whatever signals it ignores -- an agent's Ctrl-C."""
    if not argv:
        raise UsageError("missing command after --")
    if launcher is not None:
        return launcher.exec_in(sid, argv, cause=cause, timeout=timeout, wait=wait, stdio=stdio,
                                cancel=cancel)
    session = get_session(sid)
    if session.meta["state"] not in store.OPEN_STATES:
        raise OverlordError(f"cannot run in session {sid}: it is {session.meta['state']}")
    if session.meta.get("limit"):
        raise OverlordError(f"session {sid} crossed its {session.meta['limit']} grant and can run "
                            "nothing more; review it, then commit or roll it back")
    mod = backends.get(session.dialect)
    with locks.TargetLock(session.target, wait=wait):
        before = len(session.meta["layers"])
        outcome, _ = _execute(session, mod, argv, cause or command_cause(argv), timeout=timeout,
                              stdio=stdio, cancel=cancel)
        session.save()
    layer = before if len(session.meta["layers"]) > before else None
    return ExecResult(sid, outcome.exit_code, outcome.timed_out, layer)


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
                 cancel=None):
    """exec_in with the command's stdin fed from `input` (never argv: any size works) and its
    output captured, keeping at most `cap` bytes per stream (head and tail)."""
    stdin = os.memfd_create("overlord-stdin", os.MFD_CLOEXEC)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    out, err = _Tail(out_r, cap), _Tail(err_r, cap)
    try:
        os.write(stdin, input)
        os.lseek(stdin, 0, os.SEEK_SET)
        res = exec_in(sid, argv, cause=cause, timeout=timeout, wait=wait, stdio=(stdin, out_w, err_w),
                      cancel=cancel)
    finally:
        for fd in (stdin, out_w, err_w):      # our copies: the readers see EOF when the command ends
            os.close(fd)
        (stdout, cut_out), (stderr, cut_err) = out.join(), err.join()
    return Captured(sid, res.exit_code, res.timed_out, res.layer, stdout, stderr, cut_out or cut_err)


class _Tail:
    """Drains a pipe on a thread, keeping its first and last cap/2 bytes."""

    def __init__(self, fd, cap):
        import threading
        self.fd, self.cap = fd, cap
        self.head, self.tail, self.dropped = bytearray(), bytearray(), False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        half = self.cap // 2
        while True:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                break
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


def _create_session(target, mod, grants, argv, trace):
    sid = _new_session_dir()
    meta = {"sid": sid, "target": target, "backend": mod.NAME, "state": "running",
            "created": time.time(), "open_stamp_ns": open_stamp_ns(), "grants": grants,
            "merge_base": bool(grants.get("merge_base")), "trace": trace,
            "command": shlex.join(argv), "layers": [], "uid": os.getuid(),
            "enforcement": enforcement(grants)}
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
        env=executor.sandbox_env(jailed=jailed), timeout=timeout or grants.get("timeout"),
        pty_slave=pty_slave, tty_path=(jail.CONSOLE if jailed else tty) if tty else None,
        trace_fd=recorder.write_fd if recorder else None,
        mount_point=session.path("merged"), hide=(store.home(),), net=net,
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
    count = (recorder or ebpf).finish() if (recorder or ebpf) else None
    if count is not None:
        cause = dict(cause, syscalls=count)
    if crossed:
        outcome = executor.Outcome(limits.DISK_EXIT, outcome.timed_out, outcome.pinned)
        session.meta["limit"] = "disk_mb"
        cause = dict(cause, limit="disk_mb")
    index = session.seal(cause)
    if index is not None:
        layer = session.meta["layers"][index]
        layer["bytes"] = limits.layer_bytes(session.path("layers", layer["dir"]))
    if outcome.pinned:
        # a process outside the command still held the fuse mount: what it writes from now on
        # lands in this savepoint (or nowhere, if the command wrote nothing), unattributed
        session.meta.setdefault("pinned", []).append({"at": time.time(), "layer": index,
                                                      "cause": cause})
        if index is not None:
            session.meta["layers"][index]["pinned"] = True
    return outcome, count


def command_cwd(target):
    """The command starts where the caller is if that is inside the target, else at its root."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except FileNotFoundError:
        return target
    return cwd if _inside(cwd, target) else target
