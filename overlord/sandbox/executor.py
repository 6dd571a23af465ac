"""What both backends share: the launch description, the exec'd child, the reaper, teardown.

The per-command path starts no interpreter: the CLI (or a server's helper) forks, the child
sets up namespaces and mounts, and a grandchild execs the command. Setup errors travel back
to the parent over a close-on-exec pipe, so a failed exec or mount is reported, not guessed;
the same pipe first carries the attestation (what really confined the command, read back).
"""
import ctypes
import dataclasses
import hashlib
import json
import os
import resource
import shutil
import signal
import time

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGCONT)

# What a sandboxed command may inherit from the operator's environment; nothing else
# (no provider key, no token, no OVERLORD_HOME) crosses.
ENV_ALLOW = {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL",
             "COLUMNS", "LINES", "COLORTERM", "NO_COLOR", "EDITOR", "VISUAL", "PAGER"}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_env(environ=None, jailed=False):
    """The command's environment: the allowlist only; in a jail, HOME is the private /tmp
    (the real one does not exist there) and OVERLORD_JAIL=1 says where it runs."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k in ENV_ALLOW or k.startswith("LC_")}
    env.setdefault("PATH", DEFAULT_PATH)
    if jailed:
        env.update(HOME="/tmp", OVERLORD_JAIL="1")
    return env


@dataclasses.dataclass
class Launch:
    """One command to run over a layer stack (lowers are top-most first, the target last)."""

    target: str
    lowers: list
    upper: str
    work: str
    argv: list
    cwd: str
    env: dict
    timeout: float = None
    pty_slave: int = None           # an fd to make the controlling terminal (shell)
    tty_path: str = None            # the pty slave's path as the command's namespace sees it
    trace_fd: int = None            # write end of the strace output pipe
    mount_point: str = None         # where the merged view appears (fuse); the target (kernel)
    hide: tuple = ()                # directories the command must not reach (OVERLORD_HOME)
    hardening: object = None        # harden.Hardening, applied by the process that starts it
    net: str = "host"               # "none"/"proxy": a private, empty network namespace
    netns: tuple = None             # (user, net) namespace fds of the session's holder to join
                                    # (netns.py); None: net none gets a namespace of its own
    jail: list = None               # jail.Op list: pivot_root into it (kernel backend)
    newroot: str = None             # an empty dir to build the jail's root on
    on_child: object = None         # caller-side hook(pid) once the child exists, before it
                                    # may start the command (cgroup, trace reader, watchers)
    rlimits: list = ()              # [(resource, value)] set before the command starts
    watch: object = None            # called every 0.1 s while the command runs (disk grant)
    stdio: tuple = None             # (stdin, stdout, stderr) fds for the command; None: inherit
    host: tuple = None              # host_facts() of the launching process, taken before the clone


@dataclasses.dataclass
class Outcome:
    exit_code: int
    timed_out: bool = False
    pinned: bool = False      # fuse: something still held the mount, so it was detached lazily
    containment: tuple = None  # fuse: (level, why) the starter reached (fuse.NONE/HOST_PROC/HIDDEN)
    attestation: dict = None   # what really confined the command, read back (see attest())


def report_and_exit(errfd, exc, code=126):
    """In a forked child: send one line describing the failure, then leave without cleanup."""
    try:
        msg = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, OSError) and exc.filename:
            msg = f"{msg} ({os.fsdecode(exc.filename)})" if isinstance(exc.filename, (str, bytes)) else msg
        os.write(errfd, msg.encode("utf-8", "replace")[:4000])
    finally:
        os._exit(code)


# -- attestation ---------------------------------------------------------------------------------
# What really confined a command, not what was asked: read back from the kernel by the process
# that starts it, after its last hardening step and immediately before the spawn. The spawn
# (posix_spawn: setsid, signal dispositions, dup2 of fds 0-2) changes none of what is read, so
# the command begins its execve in exactly this state; and since it is read before the command
# exists, nothing the command does can alter it. It travels to the caller at the head of the
# starter's close-on-exec report pipe, which the command never holds.

NAMESPACES = (("net", "net_namespace"), ("ipc", "ipc_namespace"), ("uts", "uts_namespace"),
              ("pid", "pid_namespace"), ("mnt", "mount_namespace"), ("user", "user_namespace"))
STATUS_KEYS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
               "Seccomp_filters")
_BY_NUMBER = {getattr(resource, n): n[len("RLIMIT_"):].lower()      # an alias (OFILE) once
              for n in sorted(dir(resource), reverse=True) if n.startswith("RLIMIT_")}
RLIMITS = tuple(sorted((name, res) for res, name in _BY_NUMBER.items()))
ATTEST_MARK = b"\0attestation:"       # no setup error begins with a NUL


def _ns_inode(name):
    try:
        return os.stat(f"/proc/self/ns/{name}").st_ino
    except OSError:
        return None


_host = {}


def host_facts():
    """In the launching process, before it clones: its namespaces ({name: inode}), its root
    (dev, ino) and the cgroup hierarchy a command's cgroup is named in, to compare with.
    Once per process: OVERLORD never moves itself to other namespaces or another root."""
    pid = os.getpid()
    if pid not in _host:
        root = os.stat("/")
        v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        _host.clear()
        _host[pid] = ({name: _ns_inode(name) for name, _ in NAMESPACES},
                      (root.st_dev, root.st_ino), v2)
    return _host[pid]


def _cgroup_path(v2):
    """The command's cgroup as a /sys/fs/cgroup path (v2, or the v1 memory controller's),
    the way limits.Cgroup names it; None where it is in none."""
    with open("/proc/self/cgroup", "rb") as f:
        lines = f.read().decode("utf-8", "replace").splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (v2 and controllers == "") or (not v2 and "memory" in controllers.split(",")):
            return os.path.join("/sys/fs/cgroup", "" if v2 else "memory", path.lstrip("/")).rstrip("/")
    return None


def attest(launch):
    """Read back what confines this process (see above); returns the dict."""
    with open("/proc/self/status", "rb") as f:
        text = f.read().decode("ascii", "replace")
    status = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
            status[key] = value.strip()
    host_ns, host_root, v2 = launch.host or ({}, None, True)
    root = os.stat("/")
    out = {"jail": host_root is not None and (root.st_dev, root.st_ino) != tuple(host_root)}
    for name, key in NAMESPACES:
        own, theirs = _ns_inode(name), host_ns.get(name)
        out[key] = None if own is None or theirs is None else own != theirs
    out["cgroup"] = _cgroup_path(v2)
    out["rlimits"] = {name: [None if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(res)]
                      for name, res in RLIMITS}
    prog = getattr(launch.hardening, "fprog", None)
    out["seccomp_sha256"] = (hashlib.sha256(ctypes.string_at(prog.filter, prog.len * 8)).hexdigest()
                             if prog is not None and status.get("Seccomp") == "2" else None)
    out["status"] = status
    return out


def send_attestation(launch, fd):
    """attest() and write it as the report pipe's first record."""
    os.write(fd, ATTEST_MARK + json.dumps(attest(launch), separators=(",", ":")).encode() + b"\n")


def attestation_sha256(attestation):
    """sha256 of an attestation's canonical JSON: one per command, cheap to keep."""
    return hashlib.sha256(json.dumps(attestation, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_report(fd):
    """The caller's side of the report pipe: (attestation or None, setup error text)."""
    data = read_all(fd)
    attestation = None
    if data.startswith(ATTEST_MARK):
        head, _, data = data.partition(b"\n")
        attestation = json.loads(head[len(ATTEST_MARK):])
    return attestation, data.decode("utf-8", "replace")


TRACE_FD = 3
TRACE_SYSCALLS = ("execve,execveat,open,openat,openat2,creat,unlink,unlinkat,rename,renameat,"
                  "renameat2,mkdir,mkdirat,rmdir,link,linkat,symlink,symlinkat,chmod,fchmod,"
                  "fchmodat,truncate,ftruncate,connect,mknod,mknodat")


def command_argv(launch):
    """The argv actually exec'd: the command, or strace wrapping it.

    Under strace the first traced exec is a tiny shell that closes the trace pipe before the
    real command starts, so the command cannot forge or read its own flight record.
    """
    if launch.trace_fd is None:
        return list(launch.argv)
    return ["strace", "-f", "-qq", "-ttt", "-s", "256", "-e", "trace=" + TRACE_SYSCALLS,
            "-o", f"/dev/fd/{TRACE_FD}", "--", "/bin/sh", "-c",
            f'exec {TRACE_FD}>&-; exec "$@"', "overlord-trace"] + list(launch.argv)


def spawn_command(launch, cwd, report_fd=None):
    """Start the command (posix_spawn: no second copy of this interpreter) in its own
    session, with only fds 0-2 (and the trace pipe as fd 3) open. Returns its pid. Just
    before the spawn, the attestation goes to report_fd (the close-on-exec report pipe)."""
    os.chdir(cwd)
    trace = launch.trace_fd
    for fd in _open_fds():
        if fd > 2 and fd != trace:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass
    actions = []
    for target_fd, fd in enumerate(launch.stdio or ()):
        if fd is not None:
            actions.append((os.POSIX_SPAWN_DUP2, fd, target_fd))
    if launch.pty_slave is not None:
        # a session leader opening a tty (without O_NOCTTY) makes it its controlling terminal
        actions.append((os.POSIX_SPAWN_OPEN, 0, launch.tty_path, os.O_RDWR, 0))
        actions += [(os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
    if trace is not None:
        if trace == TRACE_FD:
            trace = os.dup(trace)      # dup2 onto itself would keep close-on-exec set
        actions.append((os.POSIX_SPAWN_DUP2, trace, TRACE_FD))
    argv = command_argv(launch)
    exe = shutil.which(argv[0], path=launch.env.get("PATH", DEFAULT_PATH))
    if exe is None:
        if "/" in argv[0] and os.path.isfile(argv[0]):
            raise OSError(13, f"cannot execute {launch.argv[0]}: not executable")
        raise OSError(2, f"command not found: {launch.argv[0]}")
    if report_fd is not None:
        send_attestation(launch, report_fd)
    try:
        return os.posix_spawn(exe, argv, launch.env, file_actions=actions, setsid=True,
                              setsigdef=FORWARDED_SIGNALS + (signal.SIGPIPE, signal.SIGCHLD,
                                                             signal.SIGTTOU, signal.SIGTTIN),
                              setsigmask=[])
    except PermissionError:
        raise OSError(13, f"cannot execute {launch.argv[0]}: permission denied") from None
    except OSError as exc:
        raise OSError(exc.errno, f"cannot execute {launch.argv[0]}: {exc.strerror}") from None


def _open_fds():
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def status_code(status):
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def reap_until(main_pid):
    """Act as init for a command: forward signals to it, reap every orphan, return its code."""
    def forward(sig, _frame):
        try:
            os.killpg(main_pid, sig)
        except OSError:
            pass
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 127
        if pid == main_pid:
            return status_code(status)


def descendants(root):
    """Every live process whose ancestry leads to root (read from /proc)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(root, include_root=False):
    """SIGKILL every descendant of root until none is left (orphans are reparented to root)."""
    for _ in range(100):
        pids = descendants(root)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)
    if include_root:
        try:
            os.kill(root, signal.SIGKILL)
        except OSError:
            pass


def read_all(fd):
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks)


def wait_child(pid, timeout, on_timeout, watch=None, interval=0.1):
    """Wait for a child. Past the timeout call on_timeout() once; every interval call watch()
    (e.g. the disk grant), which may end the child itself. Then reap it."""
    timed_out = False
    if timeout or watch:
        import select
        pidfd = os.pidfd_open(pid)
        try:
            deadline = time.monotonic() + timeout if timeout else None
            while True:
                left = deadline - time.monotonic() if deadline else interval
                if left <= 0:
                    timed_out = True
                    on_timeout()
                    break
                try:
                    ready, _, _ = select.select([pidfd], [], [], min(left, interval) if watch else left)
                except InterruptedError:
                    continue
                if ready:
                    break
                if watch:
                    watch()
        finally:
            os.close(pidfd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status_code(status), timed_out
        except InterruptedError:
            continue


def make_removable(path):
    """Overlay leaves a mode-000 dir in its work dir: open it up so it can be deleted."""
    for root, subdirs, _ in os.walk(path):
        for d in subdirs:
            p = os.path.join(root, d)
            try:
                if not os.path.islink(p):
                    os.chmod(p, 0o700)
            except OSError:
                pass


def supervise(pid, error, timeout, kill_all, signal_target, watch=None):
    """Parent side of a launch: raise a setup error, else wait (forwarding signals)."""
    from overlord.errors import LaunchError
    if error:
        kill_all()
        os.waitpid(pid, 0)
        raise LaunchError(error)

    def forward(sig, _frame):
        try:
            os.kill(signal_target(), sig)
        except OSError:
            pass
    saved = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code, timed_out = wait_child(pid, timeout, kill_all, watch)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return Outcome(124 if timed_out else code, timed_out)


def hand_over(pid, spec, errr, go_w, terminate, prepare=None):
    """The caller's side once the child exists and waits for b"g": prepare it (id maps),
    stop being dumpable (the command runs as our uid and must not read our environment),
    run the caller's hooks (cgroup, recorders), let it go, then supervise it."""
    from overlord.linux import libc
    try:
        if prepare:
            prepare()
        libc.prctl(libc.PR_SET_DUMPABLE, 0)
        if spec.on_child:
            spec.on_child(pid)
        os.write(go_w, b"g")
    except BaseException:
        terminate(pid)
        os.waitpid(pid, 0)
        os.close(errr)
        raise
    finally:
        os.close(go_w)
    attestation, error = read_report(errr)
    outcome = supervise(pid, error, spec.timeout, lambda: terminate(pid), lambda: pid, spec.watch)
    outcome.attestation = attestation
    return outcome
