"""The fuse backend (fuse-overlayfs): the clearly-labelled cooperative fallback.

The merged view is mounted at the session's own mount point and the command runs with its
working directory there; writes through absolute paths to the real target are NOT captured.
It refuses containment grants (jail, net) instead of pretending to honour them.
"""
import os
import shutil
import subprocess

from overlord.errors import LaunchError
from overlord.linux import libc
from overlord.sandbox import executor, limits

NAME = "fuse"


def _binaries():
    return shutil.which("fuse-overlayfs"), shutil.which("fusermount3") or shutil.which("fusermount")


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
    return True, f"fuse-overlayfs ({overlayfs}), cooperative: absolute-path writes are not captured"


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
    proc = subprocess.run([overlayfs, "-o", opts, spec.mount_point], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        msg = " ".join(l for l in proc.stderr.splitlines() if "unknown argument ignored" not in l)
        raise LaunchError(f"fuse-overlayfs could not mount the session: {msg.strip() or proc.returncode}")


def unmount(mount_point):
    """Unmount; lazily if something still pins the mount. Returns True when it was lazy: a
    process holding the mount may then still write into the layer being sealed."""
    _, fusermount = _binaries()
    for lazy in (False, True):
        if fusermount:
            proc = subprocess.run([fusermount, "-u", *(["-z"] if lazy else []), mount_point],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            if proc.returncode == 0:
                return lazy
        else:
            try:
                libc.umount2(mount_point, libc.MNT_DETACH if lazy else 0)
                return lazy
            except OSError:
                pass
    raise LaunchError(f"cannot unmount {mount_point}")


def launch(spec):
    """Mount, run the command with its cwd inside the merged view, unmount."""
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


def _translate_cwd(spec):
    rel = os.path.relpath(spec.cwd, spec.target)
    if rel == "." or not rel.startswith(".."):
        return os.path.normpath(os.path.join(spec.mount_point, rel))
    return spec.cwd


def _run(spec):
    errr, errw = os.pipe2(os.O_CLOEXEC)
    down_r, down_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(errr)
            os.close(down_w)
            spec.hardening.scrub()
            libc.prctl(libc.PR_SET_DUMPABLE, 0)
            os.setpgid(0, 0)
            # Orphans are re-parented to us, so the whole tree can be ended with the command.
            libc.prctl(libc.PR_SET_CHILD_SUBREAPER, 1)
            if os.read(down_r, 1) != b"g":       # wait until the caller placed us (cgroup)
                os._exit(125)
            limits.apply_rlimits(spec.rlimits)
            spec.hardening.apply()
            child = executor.spawn_command(spec, _translate_cwd(spec))
            os.close(errw)
            code = executor.reap_until(child)
            executor.kill_tree(os.getpid())
            os._exit(code)
        except BaseException as exc:  # noqa: BLE001
            executor.report_and_exit(errw, exc)
    os.close(errw)
    os.close(down_r)
    return executor.hand_over(pid, spec, errr, down_w, terminate)
