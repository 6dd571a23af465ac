"""The fuse backend (fuse-overlayfs): the clearly-labelled cooperative fallback.

fuse-overlayfs mounts the merged view at the session's own mount point, in the host's mount
namespace, out of the command's reach. Where the host allows it the command then gets
namespaces of its own:

    caller ──clone(NEWNS|NEWPID, +NEWUSER unless root)──▶ starter, PID 1 (maps its own ids;
              / made private, the merged view bound over the target's own path, a tmpfs over
              OVERLORD_HOME, a /proc of its PID namespace; reaps, forwards signals)
                                                          └─spawn─▶ command (own session)

so the command works at the target's real path (absolute-path writes to the target are
captured too) and neither sees OVERLORD_HOME nor reaches it through another process's
/proc/<pid>/root. Where the host refuses the namespaces the command runs as before, with its
cwd in the merged view, and `caveat()` says what that leaves open. It refuses containment
grants (jail, net) instead of pretending to honour them.
"""
import errno
import mmap
import os
import signal
import stat

from overlord.errors import LaunchError
from overlord.linux import libc
from overlord.sandbox import executor, harden, limits
from overlord import hosttools

NAME = "fuse"

# How far a command is kept from OVERLORD_HOME (what the starter reached, in order):
NONE = "none"            # no private mount namespace: the command sees the host's tree
HOST_PROC = "host-proc"  # OVERLORD_HOME hidden, but the host's /proc may lead back to it
HIDDEN = "hidden"        # OVERLORD_HOME hidden, and a /proc of the command's own PID namespace
_LEVELS = (NONE, HOST_PROC, HIDDEN)

_probed = None          # (level, why) from containment(), once per process
# what clone answers when the host (or a filter around us) does not allow the namespaces
_REFUSED = (errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSPC, errno.EUSERS, errno.ENOSYS)
_last = None            # (level, why) the last launch in this process reached


def _binaries():
    return hosttools.find("fuse-overlayfs"), hosttools.find("fusermount3") or hosttools.find("fusermount")


def probe():
    """(available, reason): the binaries on PATH and /dev/fuse openable by this user."""
    overlayfs, fusermount = _binaries()
    if not overlayfs:
        return False, "fuse-overlayfs is not installed (apt-get install fuse-overlayfs)"
    if os.getuid() != 0 and not fusermount:
        return False, "fusermount3 is not installed (apt-get install fuse3)"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"/dev/fuse cannot be opened by this user ({exc.strerror})"
    os.close(fd)
    return True, f"fuse-overlayfs ({overlayfs}), cooperative: no --jail, no --net none"


def _escape(path):
    if any(c in path for c in ",:\n"):
        raise LaunchError(f"the fuse backend cannot stack a path containing ',' or ':': {path}")
    return path


def mount(spec):
    overlayfs, _ = _binaries()
    lowers = ":".join(_escape(p) for p in spec.lowers)
    # writeback=0: with the kernel's writeback cache the command would see mtimes the
    # upper layer never gets
    opts = (f"lowerdir={lowers},upperdir={_escape(spec.upper)},workdir={_escape(spec.work)},"
            "writeback=0")
    os.makedirs(spec.mount_point, exist_ok=True)
    import subprocess        # the fuse backend only: the kernel one never spawns a tool
    proc = subprocess.run([overlayfs, "-o", opts, spec.mount_point], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        msg = " ".join(l for l in proc.stderr.splitlines() if "unknown argument ignored" not in l)
        raise LaunchError(f"fuse-overlayfs could not mount the session: {msg.strip() or proc.returncode}")


def unmount(mount_point):
    """Unmount; lazily if something still pins the mount. Returns True when it was lazy: a
    process holding the mount may then still write into the layer being sealed."""
    _, fusermount = _binaries()
    why = ""
    for lazy in (False, True):
        if fusermount:
            import subprocess
            proc = subprocess.run([fusermount, "-u", *(["-z"] if lazy else []), mount_point],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, errors="replace")
            if proc.returncode == 0:
                return lazy
            why = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            why = ": " + why[0][:300]     # e.g. a container without /etc/mtab
        else:
            try:
                libc.umount2(mount_point, libc.MNT_DETACH if lazy else 0)
                return lazy
            except OSError as exc:
                why = f": {exc.strerror}"
    raise LaunchError(f"cannot unmount {mount_point}{why}")


def launch(spec):
    """Mount, run the command in its own namespaces over the merged view, unmount."""
    mount(spec)
    try:
        outcome = _run(spec)
    except BaseException:
        unmount(spec.mount_point)
        raise
    outcome.pinned = unmount(spec.mount_point)
    return outcome


def terminate(pid):
    """End a command and every descendant (orphans were re-parented to its starter)."""
    executor.kill_tree(pid, include_root=True)


# -- containment ---------------------------------------------------------------------------------

def containment():
    """(level, why): how far this host lets the fuse backend keep OVERLORD_HOME from a command
    (NONE, HOST_PROC or HIDDEN), found once per process by running `true` through the same
    starter over plain directories. Clones: call it where a launch could run."""
    global _probed
    if _probed is None:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="overlord-probe-") as tmp:
            dirs = {n: os.path.join(tmp, n) for n in ("merged", "target", "home")}
            for d in dirs.values():
                os.mkdir(d)
            spec = executor.Launch(target=dirs["target"], lowers=[], upper=None, work=None,
                                   argv=["true"], cwd=dirs["target"],
                                   env={"PATH": executor.DEFAULT_PATH},
                                   mount_point=dirs["merged"], hide=(dirs["home"],),
                                   hardening=harden.prepare())
            try:
                outcome = _run(spec)
                _probed = (outcome.containment or (NONE, "the probe did not start")
                           if outcome.exit_code == 0 else (NONE, f"probe exited {outcome.exit_code}"))
            except (LaunchError, OSError) as exc:
                _probed = (NONE, str(exc))
    return _probed


def describe(level, why=""):
    """What a command can reach on this host, in plain words (doctor prints it as is)."""
    if level == HIDDEN:
        return "OVERLORD_HOME hidden from commands (private mount namespace, own PID namespace and /proc)"
    if level == HOST_PROC:
        return ("OVERLORD_HOME hidden from commands (private mount namespace), but this host "
                f"refused them a private /proc ({why}): a hostile command running as root can "
                "still reach other root processes' trees, and through them OVERLORD's records "
                "and the operator's keys, by /proc/PID/root; for cooperative programs only")
    return ("a hostile command can read and alter OVERLORD's records and the operator's keys "
            f"(no private mount namespace here: {why}); for cooperative programs only")


def caveat(grants=None):
    """None when a command cannot reach OVERLORD_HOME, else the one line a face prints after
    the run's session line. Uses what the last launch here reached, else probes."""
    level, why = _last or containment()
    return None if level == HIDDEN else "fuse backend: " + describe(level, why)


def _flags():
    flags = libc.CLONE_NEWNS | libc.CLONE_NEWPID
    return flags if os.geteuid() == 0 else flags | libc.CLONE_NEWUSER


def _map_own_ids(uid, gid):
    """In a user namespace of our own: our uid and gid mapped to themselves (the one mapping
    an ordinary user may write for itself)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"),
                       ("gid_map", f"{gid} {gid} 1\n")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _contain(spec, userns):
    """In the starter's fresh mount namespace: returns (level, why) reached."""
    try:
        # private propagation first, so nothing we mount leaks back to the host
        libc.mount(None, "/", None, libc.MS_REC | libc.MS_PRIVATE)
    except OSError as exc:
        return NONE, f"mounting in a private namespace: {exc.strerror}"
    # the merged view at the target's own path: the command's writes there, relative or
    # absolute, go through fuse-overlayfs
    libc.mount(spec.mount_point, spec.target, None, libc.MS_BIND | libc.MS_REC)
    for path in spec.hide:
        # OVERLORD_HOME (every session's records and layers, the keys, the merged mount
        # point itself): an empty read-only directory from inside
        libc.mount("tmpfs", path, "tmpfs", libc.MS_RDONLY | libc.MS_NOSUID | libc.MS_NODEV |
                   libc.MS_NOEXEC, "size=4k,mode=000")
    try:
        # The host's /proc could lead back: /proc/<pid>/root of another process is that
        # process's root, in its own mount namespace. The kernel lets a command follow it when
        # it has the target's uid and (in the target's user namespace) a superset of the
        # target's capabilities: as root, with none, that is every root process that has none
        # either (other sessions' commands) and every user namespace root created. A /proc of
        # the command's own PID namespace shows none of them.
        libc.mount("proc", "/proc", "proc", libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC)
    except OSError as exc:
        if userns:
            # an ordinary user's command in a user namespace of its own holds no capability in
            # any other: no process outside its own tree passes that check
            return HIDDEN, f"the host's /proc (mounting /proc: {exc.strerror})"
        return HOST_PROC, f"mounting /proc: {exc.strerror}"
    return HIDDEN, ""


def _check_stdio(spec):
    """A directory as stdin/out/err would let the command walk from it (to `..` of a hidden
    OVERLORD_HOME, say): refuse one."""
    given = list(spec.stdio or ()) + [None] * 3
    for i in (0, 1, 2):
        try:
            st = os.fstat(i if given[i] is None else given[i])
        except OSError:
            continue             # not open: the command gets it closed
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, f"the command's fd {i} is a directory")


def _translate_cwd(spec):
    rel = os.path.relpath(spec.cwd, spec.target)
    if rel == "." or not rel.startswith(".."):
        return os.path.normpath(os.path.join(spec.mount_point, rel))
    return spec.cwd


def _starter(spec, errw, down_r, state, ids):
    """The child that becomes PID 1 of the command's namespaces (or, where the host refused
    them, a plain subreaper; ids None): contain, harden, start the command, reap. Never
    returns."""
    namespaced = ids is not None
    try:
        # die with the caller (a launcher worker a SIGKILL took): as PID 1 our death takes
        # every process in the namespace along
        libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
        spec.hardening.scrub()
        if namespaced and ids[0] != 0:
            # our own /proc files are writable by us only while we are dumpable
            libc.prctl(libc.PR_SET_DUMPABLE, 1)
            _map_own_ids(*ids)
        libc.prctl(libc.PR_SET_DUMPABLE, 0)
        os.setpgid(0, 0)
        # Orphans are re-parented to us, so the whole tree can be ended with the command.
        libc.prctl(libc.PR_SET_CHILD_SUBREAPER, 1)
        if os.read(down_r, 1) != b"g":       # wait until the caller placed us (cgroup)
            os._exit(125)
        if namespaced:
            level, why = _contain(spec, userns=ids[0] != 0)
            _put_state(state, level, why)
        else:
            level = NONE
        # nothing the command inherits may point under OVERLORD_HOME: not its cwd (set
        # below, after the mounts, so it is on the bound view), not an fd (only 0-2 and the
        # trace pipe cross, and a directory there is refused)
        _check_stdio(spec)
        cwd = spec.cwd if level != NONE else _translate_cwd(spec)
        limits.apply_rlimits(spec.rlimits)
        spec.hardening.apply()
        child = executor.spawn_command(spec, cwd, errw)
        os.close(errw)
        code = executor.reap_until(child)
        if not namespaced:
            # as PID 1 our exit ends every process in the namespace; without one, end them
            executor.kill_tree(os.getpid())
        os._exit(code)
    except BaseException as exc:  # noqa: BLE001
        executor.report_and_exit(errw, exc)


def _put_state(state, level, why):
    data = why.encode("utf-8", "replace")[:len(state) - 2]
    state[1:1 + len(data)] = data
    state[0] = 1 + _LEVELS.index(level)


def _get_state(state):
    if not state[0]:
        return None
    why = bytes(state[1:]).split(b"\0", 1)[0].decode("utf-8", "replace")
    return _LEVELS[state[0] - 1], why


def _run(spec):
    """Start the starter (in namespaces where the host allows them), let it go, supervise.
    The Outcome's containment says what it reached."""
    global _last
    libc.libc()                # load before cloning, so no child pays for it
    state = mmap.mmap(-1, 256)     # shared with the starter: the level it reached
    spec.host = executor.host_facts()       # what the command's namespaces must differ from
    errr, errw = os.pipe2(os.O_CLOEXEC)
    down_r, down_w = os.pipe2(os.O_CLOEXEC)
    ids = (os.geteuid(), os.getegid())
    try:
        pid = libc.clone_namespaces(_flags())
    except OSError as exc:
        if exc.errno not in _REFUSED:
            for fd in (errr, errw, down_r, down_w):
                os.close(fd)
            state.close()
            raise LaunchError(f"cannot start the command: {exc.strerror}") from None
        # no namespaces here (unprivileged user namespaces disabled, a seccomp'd caller...):
        # today's behaviour, the command's cwd in the merged view
        _put_state(state, NONE, f"unshare: {os.strerror(exc.errno)}")
        ids = None
        pid = os.fork()
    if pid == 0:
        os.close(errr)
        os.close(down_w)
        _starter(spec, errw, down_r, state, ids)
    os.close(errw)
    os.close(down_r)
    try:
        outcome = executor.hand_over(pid, spec, errr, down_w, terminate)
    finally:
        reached = _get_state(state)
        state.close()
    outcome.containment = reached
    if outcome.attestation is not None:
        outcome.attestation = {"backend": NAME, **outcome.attestation}
    if reached:
        _last = reached
    return outcome
