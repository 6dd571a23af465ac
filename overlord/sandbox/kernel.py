"""The kernel backend: user + mount + PID namespaces and overlayfs over the target's own path.

Process shape for one command:

    caller ──clone(NEWUSER|NEWNS|NEWPID)──▶ init, PID 1 (caller writes its id maps;
                                            it mounts, reaps, forwards signals; when it dies
                                            the namespace and every process in it die)
                                              └─spawn─▶ command (own session)

With `net: none` or `net: proxy` in a session, the command joins the session's network
namespace instead of making one (netns.py keeps it, in a holder process H):

    caller ──fork──▶ J ──setns(H's user, net ns fds)──clone(PARENT|NEWNS|NEWPID)──▶ init
                     (J exits at once; init is the caller's child, in H's user namespace, whose
                     id maps are written already)

The overlay is mounted over the target path inside the private mount namespace, so even
absolute-path writes into the target land in the session's upper layer.
"""
import os
import signal

from overlord.errors import LaunchError
from overlord.linux import libc
from overlord.sandbox import executor, harden, jail, limits

NAME = "kernel"


def overlay_options(launch):
    return [("upperdir", launch.upper), ("workdir", launch.work)]


def mount_overlay(launch, target):
    """Mount the stack over target: the new mount API where the kernel has lowerdir+."""
    lowers = list(launch.lowers)
    try:
        fsfd = libc.fsopen("overlay")
    except OSError:
        fsfd = None
    if fsfd is not None:
        try:
            try:
                for layer in lowers:
                    libc.fsconfig(fsfd, libc.FSCONFIG_SET_STRING, "lowerdir+", layer)
                new_api = True
            except OSError:
                new_api = False      # kernel < 6.8: no lowerdir+; use mount(2) below
            if new_api:
                for key, value in overlay_options(launch):
                    libc.fsconfig(fsfd, libc.FSCONFIG_SET_STRING, key, value)
                libc.fsconfig(fsfd, libc.FSCONFIG_SET_FLAG, "userxattr")
                libc.fsconfig(fsfd, libc.FSCONFIG_SET_STRING, "redirect_dir", "nofollow")
                libc.fsconfig(fsfd, libc.FSCONFIG_CMD_CREATE)
                mfd = libc.fsmount(fsfd)
                try:
                    libc.move_mount_fd(mfd, target)
                finally:
                    os.close(mfd)
                return
        finally:
            os.close(fsfd)
    # mount(2): the data page is 4 KiB, so name layers relative to the session directory.
    base = os.path.dirname(launch.upper)
    os.chdir(base)
    rel = [os.path.relpath(p, base) if p.startswith(base + os.sep) else p for p in lowers]
    data = ",".join([f"lowerdir={':'.join(rel)}", f"upperdir={os.path.relpath(launch.upper, base)}",
                     f"workdir={os.path.relpath(launch.work, base)}", "userxattr", "redirect_dir=nofollow"])
    libc.mount("overlay", target, "overlay", 0, data)


def _write_id_maps(pid):
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        maps = {"uid_map": "0 0 4294967295\n", "gid_map": "0 0 4294967295\n"}
    else:
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
        maps = {"uid_map": f"{uid} {uid} 1\n", "gid_map": f"{gid} {gid} 1\n"}
    for name, text in maps.items():
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)


NAMESPACES = libc.CLONE_NEWUSER | libc.CLONE_NEWNS | libc.CLONE_NEWPID


def namespaces(spec):
    """Always user, mount and PID; a jail adds its own IPC (no host System V or POSIX
    queues) and UTS namespaces; net none its own empty network namespace. A command that
    joins its session's holder (spec.netns) takes the holder's user and network namespaces
    and makes the rest."""
    flags = NAMESPACES
    if spec.jail is not None:
        flags |= libc.CLONE_NEWIPC | libc.CLONE_NEWUTS
    if spec.netns is not None:
        flags &= ~libc.CLONE_NEWUSER
    elif spec.net != "host":
        flags |= libc.CLONE_NEWNET
    return flags


def _host_network(launch):
    """Fail closed: a command meant to be offline (or proxied) that finds itself in the host's
    network namespace (a holder that was not what it should be) refuses to start."""
    host = (launch.host or ({},))[0].get("net")
    own = executor._ns_inode("net")
    return host is None or own is None or own == host


def _init_process(launch, errw, from_parent):
    """PID 1 of the command's namespaces: mount, start the command, reap. Never returns."""
    try:
        # die with the caller; as PID 1 our death takes every process in the namespace along
        libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
        launch.hardening.scrub()
        os.setpgid(0, 0)          # out of the caller's process group: the caller forwards ^C
        if os.read(from_parent, 1) != b"g":     # wait for our uid/gid maps
            os._exit(125)
        os.close(from_parent)
        libc.prctl(libc.PR_SET_DUMPABLE, 0)
        if launch.net != "host" and _host_network(launch):
            raise OSError(1, "refused: the command would have the host's network")
        # private propagation first, so nothing we mount leaks back to the host
        libc.mount(None, "/", None, libc.MS_REC | libc.MS_PRIVATE)
        mount_overlay(launch, launch.target)
        if launch.net != "host" and launch.netns is None:
            libc.loopback_up()          # a namespace of our own (a joined one has it up)
        if launch.jail is not None:
            jail.build(launch.jail, launch.newroot)
        for path in () if launch.jail is not None else launch.hide:
            # the session's records and layers: an empty read-only directory from inside
            libc.mount("tmpfs", path, "tmpfs", libc.MS_RDONLY | libc.MS_NOSUID | libc.MS_NODEV |
                       libc.MS_NOEXEC, "size=4k,mode=000")
        limits.apply_rlimits(launch.rlimits)
        launch.hardening.apply()
        pid = executor.spawn_command(launch, launch.cwd, errw)
        os.close(errw)
        for fd in (0, 1, 2):
            os.close(fd)
        os._exit(executor.reap_until(pid))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        executor.report_and_exit(errw, exc)


def launch(spec):
    """Run one command over the layer stack; return an Outcome or raise LaunchError."""
    libc.libc()       # load before cloning, so no child pays for it
    if spec.net == "proxy" and spec.netns is None:
        raise LaunchError("net proxy needs the session's network namespace (netns.ensure)")
    # The child is a copy of us. It must be dumpable until we have written its id maps (we
    # open its /proc files) and our hooks have seen it; from then on neither it nor we may
    # be: a command running as our uid must not read our environment through /proc.
    libc.prctl(libc.PR_SET_DUMPABLE, 1)
    spec.host = executor.host_facts()       # what the command's namespaces must differ from
    errr, errw = os.pipe2(os.O_CLOEXEC)
    down_r, down_w = os.pipe2(os.O_CLOEXEC)
    joiner = None
    if spec.netns is not None:
        pid, joiner = _start_joined(spec, errr, errw, down_r, down_w)
        map_ids = None                      # the holder's user namespace has its maps
    else:
        try:
            pid = libc.clone_namespaces(namespaces(spec))
        except OSError as exc:
            for fd in (errr, errw, down_r, down_w):
                os.close(fd)
            raise LaunchError(f"cannot create namespaces: {exc.strerror}") from None
        if pid == 0:
            os.close(errr)
            os.close(down_w)
            _init_process(spec, errw, down_r)
        os.close(errw)
        os.close(down_r)

        def map_ids():
            try:
                _write_id_maps(pid)
            except OSError as exc:
                raise LaunchError(f"cannot map ids into the user namespace: {exc.strerror}") from None
    try:
        outcome = executor.hand_over(pid, spec, errr, down_w, terminate, prepare=map_ids)
    finally:
        if joiner is not None:
            _reap(joiner)                   # J: long gone, reaped off the start's path
    if outcome.attestation is not None:
        outcome.attestation = {"backend": NAME, **outcome.attestation}
    return outcome


def _start_joined(spec, errr, errw, down_r, down_w):
    """Fork J, which joins the holder's user + network namespaces (setns needs a
    single-threaded process: a fresh fork is one) and clones the command's init into new
    mount + PID (+IPC/UTS) namespaces as a child of ours (CLONE_PARENT), tells us its pid and
    exits. Returns (init's pid, J's pid): J is reaped later, so its exit (tearing down its
    copy of our address space) runs beside the command's start, not before it. Raises
    LaunchError (every fd closed) if there is no init."""
    pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
    try:
        j = libc.clone_namespaces(0)         # a plain fork, without Python's at-fork work
    except OSError as exc:
        for fd in (errr, errw, down_r, down_w, pid_r, pid_w):
            os.close(fd)
        raise LaunchError(f"cannot fork: {exc.strerror}") from None
    if j == 0:
        try:
            os.close(errr)
            os.close(down_w)
            os.close(pid_r)
            user_fd, net_fd = spec.netns
            libc.setns(user_fd, libc.CLONE_NEWUSER)      # first: its caps let us join its net
            libc.setns(net_fd, libc.CLONE_NEWNET)
            pid = libc.clone_namespaces(namespaces(spec) | libc.CLONE_PARENT)
            if pid == 0:
                os.close(pid_w)
                _init_process(spec, errw, down_r)
            os.write(pid_w, pid.to_bytes(4, "little"))
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
            executor.report_and_exit(errw, exc)
    os.close(errw)
    os.close(down_r)
    os.close(pid_w)
    said = b""
    try:
        while len(said) < 4:                  # init's pid, or EOF: J failed (and exited)
            chunk = os.read(pid_r, 4 - len(said))
            if not chunk:
                break
            said += chunk
    finally:
        os.close(pid_r)
    if len(said) != 4:
        _reap(j)
        error = executor.read_all(errr).decode("utf-8", "replace")
        os.close(down_w)
        raise LaunchError(f"cannot join the session's network namespace: {error or 'its starter died'}")
    return int.from_bytes(said, "little"), j


def _reap(pid):
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def terminate(pid):
    """End a command and everything it started: PID 1 dies, and its namespace with it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def probe():
    """(available, reason): really run `true` over an overlay in throwaway namespaces."""
    if not hasattr(os, "pidfd_open"):
        return False, "Python without os.pidfd_open"
    import tempfile          # the probe only: never on the per-command path
    with tempfile.TemporaryDirectory(prefix="overlord-probe-") as tmp:
        dirs = {n: os.path.join(tmp, n) for n in ("lower", "upper", "work")}
        for d in dirs.values():
            os.mkdir(d)
        spec = executor.Launch(target=dirs["lower"], lowers=[dirs["lower"]], upper=dirs["upper"],
                               work=dirs["work"], argv=["true"], cwd="/",
                               env={"PATH": executor.DEFAULT_PATH},
                               hardening=harden.prepare())
        try:
            outcome = launch(spec)
            error = None if outcome.exit_code == 0 else f"probe exited {outcome.exit_code}"
        except (LaunchError, OSError) as exc:
            error = str(exc)
        finally:
            executor.make_removable(dirs["work"])
    if error:
        if "unshare" in error or "map ids" in error:
            return False, f"unprivileged user namespaces are not allowed here ({error})"
        return False, f"overlayfs cannot be mounted in a user namespace ({error})"
    api = "new mount API" if has_new_mount_api() else "mount(2)"
    return True, f"user+mount+pid namespaces, overlay over the target, {api}"


def has_new_mount_api():
    """lowerdir+ for fsconfig arrived in Linux 6.8."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 8)


def caveat(grants=None):
    """What a face must add after a run on this backend: nothing (OVERLORD_HOME is a tmpfs in
    every command's mount namespace)."""
    return None
