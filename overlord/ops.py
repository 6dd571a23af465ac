"""The service layer: every operation a face (CLI, web, daemon) offers, implemented once.

Faces parse and render; they call these functions and nothing below them. Results are data
(dataclasses and dicts); errors are OverlordError subclasses carrying their exit code.
"""
import dataclasses
import json
import os
import shlex
import shutil
import time

from overlord.errors import LaunchError, NotFound, OverlordError, UsageError
from overlord.linux import libc
from overlord.sandbox import backends, executor, harden, jail, limits
from overlord.sandbox import trace_ebpf
from overlord.sandbox.trace import Recorder
from overlord.txn import changes as C
from overlord.txn import commit as K
from overlord.txn import history, locks, objects, replay, retain, store
from overlord.txn.session import MAX_SAVEPOINTS, Session, open_stamp_ns, remove_tree

GRANT_KEYS = {"jail": bool, "net": str, "timeout": (int, float), "merge_base": bool, "limits": dict}
NET_VALUES = ("host", "none")


# -- grants -----------------------------------------------------------------------------------

def load_manifest(path):
    """Grants from a JSON manifest; unknown keys and broken JSON are refused."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"manifest not found: {path}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"manifest {path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read manifest {path}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise UsageError(f"manifest {path} must be a JSON object")
    unknown = sorted(set(data) - set(GRANT_KEYS))
    if unknown:
        raise UsageError(f"manifest {path}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(GRANT_KEYS)})")
    return validate_grants(data, f"manifest {path}")


def validate_grants(grants, where="grants"):
    out = {}
    for key, value in grants.items():
        if value is None:
            continue
        kind = GRANT_KEYS[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise UsageError(f"{where}: {key} has the wrong type ({type(value).__name__})")
        if key == "net" and value not in NET_VALUES:
            raise UsageError(f"{where}: net must be one of {', '.join(NET_VALUES)}")
        if key == "timeout" and value <= 0:
            raise UsageError(f"{where}: timeout must be a positive number of seconds")
        if key == "limits":
            value = limits.validate(value, f"{where}: limits")
        out[key] = value
    return out


def merge_grants(manifest, flags, limit_flags=()):
    """Flags override the manifest (each --limit key over the manifest's value for it)."""
    grants = dict(manifest or {})
    grants.update(validate_grants(flags, "flags"))
    if limit_flags:
        grants["limits"] = limits.parse(limit_flags, grants.get("limits"))
    return grants


# -- targets ----------------------------------------------------------------------------------

def resolve_target(target):
    if target is None:
        target = os.getcwd()
    if not os.path.exists(target):
        raise UsageError(f"target does not exist: {target}")
    real = os.path.realpath(target)
    if not os.path.isdir(real):
        raise UsageError(f"target is not a directory: {target}")
    if real == "/":
        raise UsageError("the filesystem root cannot be a target")
    home = os.path.realpath(store.home())
    if _inside(home, real) or _inside(real, home):
        raise UsageError(f"target {real} and OVERLORD_HOME {home} overlap; choose a target "
                         "that neither contains nor lies inside OVERLORD_HOME")
    return real


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_backend_grants(backend, grants, target):
    """A backend that cannot honour a containment grant refuses it; it never pretends."""
    if backend.NAME != "kernel":
        if grants.get("jail"):
            raise OverlordError(f"--jail needs the kernel backend; the {backend.NAME} backend is "
                                "cooperative and refuses rather than running unjailed")
        if grants.get("net") == "none":
            raise OverlordError(f"--net none needs the kernel backend; the {backend.NAME} backend "
                                "refuses rather than running with the network")
    if grants.get("jail"):
        jail.plan(target, grants.get("net", "host"))      # refuses a target it cannot jail


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
        for meta in locks.pending_on(target):
            if meta["state"] == "running":
                _recover_stale(Session(meta))
        others = locks.pending_on(target)
        if others and not stack:
            raise OverlordError(f"session {others[0]['sid']} is still {others[0]['state']} on "
                                f"{target}: commit or roll it back first (--stack overrides)")
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


@dataclasses.dataclass
class ExecResult:
    sid: str
    exit_code: int
    timed_out: bool
    layer: int        # the savepoint this command sealed, or None if it wrote nothing


def exec_in(sid, argv, cause=None, timeout=None, wait=False):
    """Run one more command inside a pending session: the per-tool-call path."""
    if not argv:
        raise UsageError("missing command after --")
    session = get_session(sid)
    if session.meta["state"] not in store.OPEN_STATES:
        raise OverlordError(f"cannot run in session {sid}: it is {session.meta['state']}")
    if session.meta.get("limit"):
        raise OverlordError(f"session {sid} crossed its {session.meta['limit']} grant and can run "
                            "nothing more; review it, then commit or roll it back")
    mod = backends.get(session.dialect)
    with locks.TargetLock(session.target, wait=wait):
        before = len(session.meta["layers"])
        outcome, _ = _execute(session, mod, argv, cause or command_cause(argv), timeout=timeout)
        session.save()
    layer = before if len(session.meta["layers"]) > before else None
    return ExecResult(sid, outcome.exit_code, outcome.timed_out, layer)


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


def _execute(session, mod, argv, cause, timeout=None, pty_slave=None, on_child=None):
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

    def started(pid):
        child["pid"] = pid
        if ebpf:
            ebpf.attach(pid)        # before the command may start; refuses to run without it
        for hook in (recorder.start if recorder else None, on_child):
            if hook:
                hook()
    spec = executor.Launch(
        target=session.target, lowers=lowers, upper=upper, work=work, argv=list(argv), cwd=_command_cwd(session.target),
        env=executor.sandbox_env(jailed=jailed), timeout=timeout or grants.get("timeout"),
        pty_slave=pty_slave, tty_path=(jail.CONSOLE if jailed else tty) if tty else None,
        trace_fd=recorder.write_fd if recorder else None,
        mount_point=session.path("merged"), hide=(store.home(),), net=net,
        jail=jail.plan(session.target, net, tty) if jailed else None, newroot=session.path("root"),
        hardening=harden.prepare(allow_ptrace=trace == "strace"), on_child=started,
        watch=disk.poll if disk.budget else None,
        rlimits=limits.rlimits(grants.get("limits"), cgroup.memory, disk_left))
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
    finally:
        crossed = disk.stop()
        for scratch in ("merged", "root"):
            if os.path.isdir(session.path(scratch)) and not os.path.ismount(session.path(scratch)):
                os.rmdir(session.path(scratch))
    count = (recorder or ebpf).finish() if (recorder or ebpf) else None
    if count is not None:
        cause = dict(cause, syscalls=count)
    if crossed:
        outcome = executor.Outcome(limits.DISK_EXIT, outcome.timed_out)
        session.meta["limit"] = "disk_mb"
        cause = dict(cause, limit="disk_mb")
    index = session.seal(cause)
    if index is not None:
        layer = session.meta["layers"][index]
        layer["bytes"] = limits.layer_bytes(session.path("layers", layer["dir"]))
    return outcome, count


def _command_cwd(target):
    """The command starts where the caller is if that is inside the target, else at its root."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except FileNotFoundError:
        return target
    return cwd if _inside(cwd, target) else target


# -- review ---------------------------------------------------------------------------------------

def get_session(sid):
    session = Session.load(store.check_sid(sid))
    if session.meta["state"] == "running":
        try:
            with locks.TargetLock(session.target):
                session = Session.load(sid)
                if session.meta["state"] == "running":
                    _recover_stale(session)
        except OverlordError:
            pass          # a command really is executing on the target right now
    return session


def _recover_stale(session):
    """A session left 'running' by a process that died (nothing holds the target lock):
    seal what its last command wrote and make it reviewable again."""
    merged = session.path("merged")
    if os.path.ismount(merged):
        backends.get("fuse").unmount(merged)
    if os.path.isdir(session.path("upper")):
        session.seal({"kind": "command", "command": session.meta.get("command", ""),
                      "interrupted": True})
    session.meta.update(state="pending", interrupted=True)
    session.save()


def diff(sid):
    """[Change] of a session against the real tree (the plan commit would execute)."""
    session = get_session(sid)
    _require_layers(session)
    return session.plan()


def _require_layers(session):
    if session.meta["state"] in ("committed", "rolled-back"):
        raise OverlordError(f"session {session.sid} is {session.meta['state']}; its changes "
                            "are no longer staged")


@dataclasses.dataclass
class LogRecord:
    path: str
    kind: str
    before: str
    after: str
    layer: int
    caused_by: dict
    syscalls: int = None


def log(sid):
    """Per change: sha256 before (real tree) -> after (session), the layer and its cause."""
    session = get_session(sid)
    if session.meta["state"] in ("committed", "rolled-back"):
        return [LogRecord(r["path"], r["kind"], r.get("before"), r.get("after"), r.get("layer"),
                          r.get("caused_by")) for r in _net_provenance(session)]
    out = []
    layers_meta = session.meta["layers"]
    for ch in session.plan():
        before = C.content_hash(C.real_path(session.target, ch.path), ch.real) if ch.real else None
        after = C.content_hash(ch.entry.src, ch.entry.st) if ch.entry.src else None
        cause = layers_meta[ch.layer]["cause"] if ch.layer is not None else None
        out.append(LogRecord(ch.path, ch.kind, before, after, ch.layer, cause))
    return out


def _net_provenance(session):
    """After commit or rollback: the last provenance record per path."""
    last = {}
    for rec in store.read_jsonl(session.path("provenance.jsonl")):
        last[rec["path"]] = rec
    return [last[p] for p in sorted(last, key=lambda p: p.split("/"))]


def syscalls(sid):
    return store.read_jsonl(get_session(sid).path("syscalls.jsonl"))


# -- decide ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class CommitResult:
    sid: str
    changes: list
    merged: list


def commit(sid, force=False, merge=False, only=(), drop=()):
    """Replay the session (or the savepoints chosen by cause) onto the real tree."""
    session = get_session(sid)
    state = session.meta["state"]
    if state not in store.OPEN_STATES:
        raise OverlordError(f"cannot commit session {sid}: it is {state}")
    if merge and not session.meta.get("merge_base"):
        raise UsageError(f"commit --merge needs a session opened with --merge-base ({sid} was not)")
    if merge and not shutil.which("git"):
        raise OverlordError("commit --merge needs git (git merge-file); install git")
    chosen = history.select(session, only, drop)
    if chosen is not None and not chosen:
        raise UsageError("the selectors leave no savepoint to commit")
    with locks.TargetLock(session.target):
        view = session.view(chosen)
        plan = C.plan(view, session.target)
        drifts = K.check_drift(session, view)
        merged = {}
        if drifts and merge:
            hard = [d for d in drifts if not d.forceable]
            K.refuse_if_drift(hard, force=False)
            merged = K.three_way(session, drifts, view)
            drifts = []
        K.refuse_if_drift(drifts, force)
        keeper = objects.Keeper(sid)
        try:
            records = store.read_jsonl(session.path("provenance.jsonl"))
            after = retain.written(keeper, view, merged, records)
            before = replay.replay(sid, session.target, view, merged, consume=True,
                                   keep=lambda bfd, steps: retain.replaced(keeper, bfd, steps))
        except BaseException:
            keeper.abandon()
            raise
        _keep_record(session, chosen, keeper, before, after, records)
        session.meta.update(state="committed", committed=time.time(), forced=bool(force and drifts),
                            merged=sorted(merged),
                            committed_layers=sorted(chosen) if chosen is not None else None)
        session.save()
    _drop_working_files(session)
    return CommitResult(sid, plan, sorted(merged))


def _keep_record(session, chosen, keeper, before, after, records):
    """The committed record (before/after of every path) and its objects. The commit already
    stands: a failure here costs blame and revert their detail, never the commit."""
    try:
        retain.layer_versions(keeper, session, chosen, records)
        keeper.finish()
        retain.save(session, before, after, keeper)
    except OSError:
        pass


def rollback(sid):
    session = get_session(sid)
    state = session.meta["state"]
    if state not in store.OPEN_STATES:
        raise OverlordError(f"cannot roll back session {sid}: it is {state}")
    session.meta.update(state="rolled-back", rolled_back=time.time())
    session.save()
    _drop_working_files(session)
    return session.meta


def _drop_working_files(session):
    """Keep the small record (meta, provenance, syscalls); drop layers, scratch dirs and the
    session's cgroup."""
    limits.Cgroup(session.sid, None).remove()
    for name in ("layers", "upper", "work", "merged", "base"):
        remove_tree(session.path(name))


# -- history ------------------------------------------------------------------------------------

def _open_session(sid, what):
    session = get_session(sid)
    if session.meta["state"] not in store.OPEN_STATES:
        raise OverlordError(f"cannot {what} session {sid}: it is {session.meta['state']}")
    return session


def savepoints(sid):
    return history.savepoints(get_session(sid))


def rewind(sid, to):
    """Drop every savepoint above @to (refused while a command runs on the target)."""
    session = _open_session(sid, "rewind")
    history.check_index(session, to)
    with locks.TargetLock(session.target):
        session = get_session(sid)
        return history.rewind(session, to)


def fork(sid, at):
    """A new pending session on the same snapshot holding a copy of the stack up to @at."""
    session = _open_session(sid, "fork")
    history.check_index(session, at, "--at")
    new = _new_session_dir()
    try:
        newdir = store.session_dir(new)
        os.mkdir(os.path.join(newdir, "layers"), 0o700)
        if os.path.isdir(session.path("base")):       # --merge-base copies, shared
            shutil.copytree(session.path("base"), os.path.join(newdir, "base"), copy_function=os.link)
        for layer in session.meta["layers"][:at + 1]:
            history.copy_layer(session.path("layers", layer["dir"]),
                               os.path.join(newdir, "layers", layer["dir"]))
        store.append_jsonl(os.path.join(newdir, "provenance.jsonl"),
                           history.fork_records(session, at))
        meta = {k: v for k, v in session.meta.items() if k not in ("rewinds", "limit", "exit_code")}
        meta.update(sid=new, state="pending", created=time.time(), layers=session.meta["layers"][:at + 1],
                    forked_from={"sid": sid, "at": at}, pid=None)
        store.save_meta(meta)
    except BaseException:
        remove_tree(store.session_dir(new))
        raise
    return new


def compare(a, b):
    if a == b:
        raise UsageError("compare needs two different sessions")
    sa, sb = get_session(a), get_session(b)
    for s in (sa, sb):
        _require_layers(s)
    return history.compare(sa, sb)


def recover():
    """Settle any commit a crash interrupted: undo it if it was not finished, or complete the
    bookkeeping if it was. Every overlord command calls this first; it costs one listdir."""
    for data in replay.pending_journals():
        try:
            with locks.TargetLock(data["target"], wait=True):
                if data["state"] == "done":
                    session = Session.load(data["sid"])
                    if session.meta["state"] != "committed":
                        session.meta.update(state="committed", committed=time.time(), recovered=True)
                        session.save()
                    replay.settle(data)
                    _drop_working_files(session)
                else:
                    replay.undo(data)
                    _note_restored(Session.load(data["sid"]), data)
        except (OSError, OverlordError):
            continue


def _note_restored(session, data):
    """Undoing a commit renames the originals back, which moves their ctime: remember the
    restored (inode, ctime) so the retried commit does not mistake our own undo for drift."""
    restored = {}
    for step in data["steps"]:
        st = C.lstat_or_none(C.real_path(data["target"], step["path"]))
        if st is not None and step["existed"] and st.st_ino == step["ino"]:
            restored[step["path"]] = [st.st_ino, st.st_ctime_ns]
    store.write_json_atomic(session.path("restored.json"), restored)


# -- listing and diagnostics ----------------------------------------------------------------------

def sessions():
    return store.list_metas()


@dataclasses.dataclass
class DoctorReport:
    backends: dict            # name -> (available, reason)
    active: str
    tools: dict               # name -> path or None
    home: str
    in_jail: bool
    containment: dict         # layer -> (available, what it means here)


def doctor():
    probes = backends.probe_all()
    forced = os.environ.get("OVERLORD_TEST_BACKEND")
    if forced in probes and probes[forced][0]:
        active = forced
    else:
        active = next((n for n, (ok, _) in probes.items() if ok), None)
    tools = {t: shutil.which(t) for t in ("fuse-overlayfs", "fusermount3", "strace", "bpftrace", "git")}
    return DoctorReport(probes, active, tools, store.home(), os.environ.get("OVERLORD_JAIL") == "1",
                        containment_layers(probes["kernel"][0], tools))


def containment_layers(kernel_ok, tools):
    """What each grant will mean on this host."""
    kind, why = limits.cgroup_kind()
    unenforced = limits.not_enforced({}, kind)
    try:
        harden.prepare()
        seccomp_row = (True, f"filter for {libc.machine()}: mount, unshare, bpf, ptrace, ... refused")
    except OSError as exc:
        seccomp_row = (False, exc.strerror)
    ebpf_ok, ebpf_why = trace_ebpf.available()
    return {
        "jail": (kernel_ok, "pivot_root jail on the kernel backend" if kernel_ok
                 else "needs the kernel backend; the fuse backend refuses --jail"),
        "net none": (kernel_ok, "a private, empty network namespace" if kernel_ok
                     else "needs the kernel backend; the fuse backend refuses --net none"),
        "hardening": seccomp_row,
        "rlimits": (True, "processes, file size, open files" +
                    ("" if kind else ", data segment (memory)") + " in every command"),
        "cgroup": (kind is not None, f"cgroup {kind}: memory, pids, cpu around each session"
                   if kind else f"none ({why}); not enforced: {', '.join(unenforced)}"),
        "disk watch": (True, "each command's layer measured while it runs (exit 122 past the grant)"),
        "savepoints": (True, f"one per writing command up to {MAX_SAVEPOINTS} (the kernel's overlay "
                       "stack); past it the top savepoint absorbs commands and records each cause"),
        "trace strace": (bool(tools.get("strace")), tools.get("strace") or "strace is not installed"),
        "trace ebpf": (ebpf_ok, ebpf_why),
    }


__all__ = ["run", "diff", "log", "commit", "rollback", "sessions", "doctor", "load_manifest",
           "merge_grants", "NotFound", "LaunchError"]
