"""The red team's harness: run an attack inside `overlord run --jail --net none` on the kernel
backend, run the same probe on the host as its positive control, and check the host after.

An attack is a small python3 program (the jail has /usr/bin/python3) appended to PRELUDE: it
records what each attempt returned in OUT (an errno name such as "EPERM", or "OK") and the
harness reads OUT back from the one `RT:{json}` line it prints. Every jailed run is followed by
`assert_host_untouched()`: the canaries outside the target (one beside it, one in an operator
$HOME made for the test) keep their content and mtime, no file appears or goes beside them,
the real target is byte-identical (writes belong to the overlay), and no process whose argv
carries the test's unique marker survives.

The `jail` fixture is imported by the test modules (`from rtlib import jail_fixture`), so no
second conftest module competes with test/conftest.py for the module name `conftest`.
"""
import json
import os
import platform
import subprocess
import sys
import textwrap
import uuid

import pytest

from conftest import SESSION_RE, Ovl

PY = "/usr/bin/python3"            # the interpreter the jail has; the host runs the same one
SECRET = "redteam-secret"
CANARY = b"operator canary: the jail must never read or change this\n"
OVERLAYFS_MAGIC = 0x794C7630

PRELUDE = r'''
import ctypes, errno, json, os, platform, signal, socket, struct, sys
MARKER, ARGS = sys.argv[1], sys.argv[2:]
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
OUT = {}


def ename(n):
    return errno.errorcode.get(n, str(n))


def attempt(fn, *a, **kw):
    """'OK', or the errno name of the OSError the call raised."""
    try:
        fn(*a, **kw)
    except OSError as e:
        return ename(e.errno)
    return "OK"


def raw(nr, *args):
    """A raw syscall: 'OK' for any non-error return, else the errno name."""
    conv = [ctypes.c_char_p(a) if isinstance(a, bytes) else
            a if isinstance(a, (ctypes._SimpleCData, ctypes.Array, ctypes.Structure)) else
            ctypes.c_long(a) for a in args]
    ctypes.set_errno(0)
    r = LIBC.syscall(ctypes.c_long(nr), *conv)
    return "OK" if r != -1 else ename(ctypes.get_errno())


def read(path):
    with open(path, "rb") as f:
        return f.read()


def done():
    print("RT:" + json.dumps(OUT, sort_keys=True), flush=True)
'''

# Syscall numbers, written out here (not taken from overlord.linux.seccomp) so a wrong number in
# the filter cannot hide behind the same wrong number in the test.
SYSCALLS = {
    "x86_64": dict(ioctl=16, clone=56, ptrace=101, syslog=103, pivot_root=155, chroot=161,
                   acct=163, mount=165, umount2=166, swapon=167, swapoff=168, reboot=169,
                   sethostname=170, setdomainname=171, init_module=175, delete_module=176,
                   quotactl=179, kexec_load=246, add_key=248, request_key=249, keyctl=250,
                   unshare=272, perf_event_open=298, name_to_handle_at=303,
                   open_by_handle_at=304, setns=308, finit_module=313, kexec_file_load=320,
                   bpf=321, userfaultfd=323),
    "aarch64": dict(ioctl=29, umount2=39, mount=40, pivot_root=41, chroot=51, quotactl=60,
                    acct=89, unshare=97, kexec_load=104, init_module=105, delete_module=106,
                    syslog=116, ptrace=117, reboot=142, sethostname=161, setdomainname=162,
                    add_key=217, request_key=218, keyctl=219, clone=220, swapon=224,
                    swapoff=225, perf_event_open=241, name_to_handle_at=264,
                    open_by_handle_at=265, setns=268, finit_module=273, bpf=280,
                    userfaultfd=282, kexec_file_load=294),
}
COMMON_SYSCALLS = dict(io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
                       open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432,
                       fspick=433, clone3=435, mount_setattr=442, quotactl_fd=443)


def syscall_numbers():
    machine = platform.machine()
    assert machine in SYSCALLS, f"the red team has no syscall table for {machine}"
    return dict(SYSCALLS[machine], **COMMON_SYSCALLS)


def nr_prelude():
    """PRELUDE plus NR = {name: number} for this machine."""
    return PRELUDE + f"NR = {syscall_numbers()!r}\n"


# -- host state ---------------------------------------------------------------------------------

def tree_state(root):
    """Everything observable about a tree except atimes: names, types, modes, sizes, mtimes,
    file contents and link targets."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            entry = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_uid)
            if os.path.islink(path):
                entry += (os.readlink(path),)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    entry += (f.read(),)
            state[rel] = entry
    st = os.lstat(root)
    state["."] = (st.st_mode, st.st_mtime_ns)
    return state


def pids_with(marker):
    """Live host processes whose argv carries marker."""
    found = []
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def host_pid_count():
    return sum(1 for n in os.listdir("/proc") if n.isdigit())


def parse_rt(text):
    rows = [line[3:] for line in text.splitlines() if line.startswith("RT:")]
    return json.loads(rows[-1]) if rows else None


class Result:
    def __init__(self, proc, sid):
        self.proc, self.sid = proc, sid
        self.code = proc.returncode
        self.out = proc.stdout.decode("utf-8", "replace")
        self.err = proc.stderr.decode("utf-8", "replace")
        self.rt = parse_rt(self.out)

    def __repr__(self):
        return f"<exit {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}>"


class Jail:
    """One test's attacker: runs programs jailed, runs the same programs on the host, and
    checks after every jailed run that nothing outside the overlay moved."""

    def __init__(self, home, target, tmp_path):
        self.ovl = Ovl(home, "kernel")
        self.home, self.target, self.tmp = home, target, tmp_path
        self.marker = f"rt-{uuid.uuid4().hex}"
        self.outside = tmp_path / "outside"             # a host directory beside the target
        self.outside.mkdir()
        self.canary = self.outside / "canary.txt"
        self.canary.write_bytes(CANARY)
        self.operator = tmp_path / "operator"           # the operator's $HOME
        (self.operator / ".ssh").mkdir(parents=True)
        self.secret_key = self.operator / ".ssh" / "id_ed25519"
        self.secret_key.write_bytes(CANARY)
        os.chmod(self.secret_key, 0o600)
        (self.operator / ".bashrc").write_text("export PS1='$ '\n")
        self.rebaseline()

    # -- running ---------------------------------------------------------------------------

    def env(self, extra=None):
        """What the operator's shell holds when it calls OVERLORD: a provider key, the state
        directory, a $HOME of its own. None of it may reach the command."""
        env = {"HOME": str(self.operator), "ANTHROPIC_API_KEY": SECRET,
               "OVERLORD_HOME": str(self.home)}
        env.update(extra or {})
        return env

    def _overlord(self, args, sid=None, check=None, env=None, timeout=180, stdin=None,
                  untouched=True, pass_fds=()):
        proc = subprocess.run([sys.executable, "-m", "overlord", *map(str, args)],
                              env=self.ovl.env(self.env(env)), capture_output=True,
                              timeout=timeout, cwd=str(self.tmp), pass_fds=pass_fds,
                              stdin=subprocess.DEVNULL if stdin is None else stdin)
        if sid is None:
            m = SESSION_RE.search(proc.stdout.decode("utf-8", "replace"))
            sid = m.group(1) if m else None
        res = Result(proc, sid)
        if check is not None:
            assert res.code == check, res
        if untouched:
            self.assert_host_untouched()
        return res

    def run(self, argv, flags=(), jail=True, **kw):
        """`overlord run --jail --net none --stack -t target [flags] -- argv` (--stack: a test
        may run several attacks on its target); then the host is checked."""
        grants = ["--jail", "--net", "none"] if jail else []
        return self._overlord(["run", *grants, "--stack", "-t", self.target, *flags, "--",
                               *argv], **kw)

    def exec(self, sid, argv, **kw):
        """`overlord exec sid -- argv`: one more command in a session, over its layer stack,
        under the grants the session was opened with; then the host is checked."""
        return self._overlord(["exec", sid, "--", *argv], sid=sid, **kw)

    @staticmethod
    def program(code, prelude=None):
        """PRELUDE (with this machine's syscall numbers) + the attack + done()."""
        return (prelude or nr_prelude()) + textwrap.dedent(code) + "\ndone()\n"

    def py(self, code, *args, **kw):
        """Run an attack program jailed (argv: the marker, then args); the Result's .rt is
        its OUT. Expects exit 0 unless told otherwise."""
        kw.setdefault("check", 0)
        res = self.run([PY, "-c", self.program(code), self.marker, *args], **kw)
        if kw["check"] == 0:
            assert res.rt is not None, res
        return res

    def sh(self, script, **kw):
        """Run a shell attack jailed; $0 is the marker."""
        kw.setdefault("check", 0)
        return self.run(["/bin/sh", "-c", script, self.marker], **kw)

    def host_py(self, code, *args, wrap=(), env=None, **kw):
        """The positive control: the same program on the host, as the same user (optionally
        under a wrapper such as `unshare -Urm`). Returns its OUT."""
        proc = subprocess.run([*wrap, PY, "-c", self.program(code), self.marker,
                               *map(str, args)],
                              capture_output=True, timeout=120, cwd=str(self.tmp),
                              env=env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **kw)
        out = parse_rt(proc.stdout.decode("utf-8", "replace"))
        assert out is not None, (proc.returncode, proc.stdout, proc.stderr)
        return out

    # -- checking --------------------------------------------------------------------------

    def _host_state(self):
        return {"outside": tree_state(self.outside), "operator": tree_state(self.operator),
                "target": tree_state(self.target)}

    def rebaseline(self):
        """After the test itself planted something in the target (a symlink out, say)."""
        self.baseline = self._host_state()

    def assert_host_untouched(self):
        now = self._host_state()
        for name in ("outside", "operator", "target"):
            assert now[name] == self.baseline[name], f"the host's {name} tree changed"
        assert self.canary.read_bytes() == CANARY
        assert self.secret_key.read_bytes() == CANARY
        assert pids_with(self.marker) == [], f"a process of the attack ({self.marker}) survived"

    def meta(self, sid):
        with open(self.home / "sessions" / sid / "meta.json", encoding="utf-8") as f:
            return json.load(f)

    def session_dir(self, sid):
        return self.home / "sessions" / sid


_probed = []


def require_kernel_backend():
    """The red team runs only where the jail exists: an unavailable kernel backend is a
    failure of the suite, never a silent pass."""
    from overlord.sandbox import backends
    if not _probed:
        _probed.append(backends.get("kernel").probe())
    ok, why = _probed[0]
    if not ok:
        pytest.fail(f"the kernel backend (and so the jail) is unavailable here: {why}")


@pytest.fixture(name="jail")
def jail_fixture(home, target, tmp_path):
    require_kernel_backend()
    j = Jail(home, target, tmp_path)
    yield j
    assert pids_with(j.marker) == [], f"a process of the attack ({j.marker}) survived"
