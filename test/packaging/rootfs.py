"""Fresh Debian roots for the packaging suites: debootstrap once per machine (cached as a
tarball), then a new copy per test, entered like a container (new mount, PID and UTS
namespaces, pivot_root -- not chroot: the kernel refuses a chrooted process a user namespace,
and the kernel backend inside needs one). The host's network is shared (apt, pip), /dev and
/sys are the host's, so the engine inside finds /dev/fuse and the cgroups."""
import fcntl
import os
import shutil
import subprocess

import pytest

SUITE = os.environ.get("OVERLORD_ROOTFS_SUITE", "trixie")      # Debian 13: AppArmor 4.x
MIRROR = os.environ.get("OVERLORD_ROOTFS_MIRROR", "http://deb.debian.org/debian")
CACHE = os.environ.get("OVERLORD_ROOTFS_CACHE", "/var/cache/overlord-test")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = ("debootstrap", "unshare", "pivot_root", "tar")

# Run as PID 1 of the new namespaces: bind the root onto itself, give it /proc, /dev and /sys,
# pivot into it and drop the old root; then the command, as root or (setpriv) another user.
ENTER = r"""set -e
R=$1; shift
mount --make-rprivate /
mount --rbind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount --rbind /sys "$R/sys"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
if [ -n "$APT_CACHE" ]; then mount --bind "$APT_CACHE" "$R/var/cache/apt/archives"; fi
cd "$R"
mkdir -p .oldroot
pivot_root . .oldroot
exec /usr/sbin/chroot . /bin/sh -c 'umount -l /.oldroot && rmdir /.oldroot && exec "$@"' sh "$@"
"""

# What a fresh machine's environment looks like: nothing of this test run's.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive", "TERM": "dumb"}


def require():
    """Root and the tools, or skip; on CI (OVERLORD_REQUIRE_BACKENDS) a missing one fails."""
    strict = os.environ.get("OVERLORD_REQUIRE_BACKENDS")
    if os.geteuid() != 0:
        (pytest.fail if strict else pytest.skip)("a fresh Debian root needs root (debootstrap)")
    for tool in TOOLS:
        if not shutil.which(tool):
            (pytest.fail if strict else pytest.skip)(f"{tool} is not installed")


def pristine(suite=SUITE):
    """The cached tarball of a minbase root of `suite`, made once per machine (under a lock,
    so concurrent runs share it); what is cached is exactly what debootstrap made."""
    require()
    os.makedirs(CACHE, mode=0o755, exist_ok=True)
    tarball = os.path.join(CACHE, f"debootstrap-{suite}-minbase.tar")
    with open(os.path.join(CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(tarball):
            return tarball
        work = os.path.join(CACHE, f".build-{suite}-{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        try:
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", "--cache-dir", _debs(), suite, work, MIRROR],
                capture_output=True, text=True, timeout=1200)
            if proc.returncode:
                pytest.fail(f"debootstrap {suite} failed (exit {proc.returncode}):\n"
                            + proc.stdout[-3000:] + proc.stderr[-3000:])
            subprocess.run(["tar", "-C", work, "-cf", tarball + ".part", "."], check=True)
            os.rename(tarball + ".part", tarball)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tarball


def _debs():
    path = os.path.join(CACHE, "debs")
    os.makedirs(path, exist_ok=True)
    return path


def apt_cache():
    """One archive of downloaded .debs shared by every root, so each package is fetched once."""
    path = os.path.join(CACHE, "apt-archives")
    os.makedirs(os.path.join(path, "partial"), exist_ok=True)
    return path


class Root:
    """A fresh copy of the pristine root at `path` (a directory on the host)."""

    def __init__(self, path):
        self.path = path

    def host(self, inner):
        """The host path of `inner` (an absolute path inside the root)."""
        return os.path.join(self.path, inner.lstrip("/"))

    def run(self, script, user=None, env=None, timeout=900, check=True, input=None):
        """`sh -c script` inside the root, as root or as `user` (a name in the root's passwd,
        with its groups); returns the CompletedProcess (text). check: fail the test, showing
        the output, on a non-zero exit."""
        inner = dict(BASE_ENV, HOME="/root" if user is None else f"/home/{user}")
        inner.update(env or {})
        argv = ["env", "-i"] + [f"{k}={v}" for k, v in inner.items()]
        if user is not None:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"] + argv
        argv += ["/bin/sh", "-c", script]
        outer = dict(os.environ, APT_CACHE=apt_cache())
        proc = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--uts", "--kill-child",
                               "sh", "-c", ENTER, "enter", self.path] + argv,
                              input=input, capture_output=True, text=True, timeout=timeout,
                              env=outer)
        if check and proc.returncode:
            pytest.fail(f"inside the fresh root, exit {proc.returncode}: {script}\n"
                        f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        return proc

    def copy_in(self, src=REPO, dest="/src"):
        """The checkout as it is (uncommitted work too) at `dest`, without what runs leave."""
        target = self.host(dest)
        shutil.copytree(src, target, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "*.egg-info", "build", ".pytest_cache",
            "node_modules", "demo"))
        return dest

    def listing(self, *tops):
        """Every path under `tops` (inside the root), for before/after comparisons."""
        out = set()
        for top in tops:
            base = self.host(top)
            for d, dirs, files in os.walk(base):
                for name in dirs + files:
                    out.add("/" + os.path.relpath(os.path.join(d, name), self.path))
        return out


def fresh(tmp_path, suite=SUITE):
    """A new root at tmp_path/root from the cached tarball, with the host's resolver."""
    tarball = pristine(suite)
    path = os.path.join(str(tmp_path), "root")
    os.makedirs(path)
    subprocess.run(["tar", "-C", path, "-xf", tarball], check=True)
    shutil.copyfile("/etc/resolv.conf", os.path.join(path, "etc/resolv.conf"))
    lists = os.path.join(path, "var/lib/apt/lists")      # debootstrap leaves its Packages file:
    for name in os.listdir(lists):                        # a fresh machine has no package lists
        if os.path.isfile(os.path.join(lists, name)) and name != "lock":
            os.unlink(os.path.join(lists, name))
    return Root(path)
