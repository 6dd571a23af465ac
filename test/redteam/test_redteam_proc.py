"""Red team, processes: a jailed command sees and signals only its own PID namespace, inherits
no descriptor, no secret and no privilege, and cannot climb out through /proc."""
import json
import os
import signal
import subprocess
import textwrap
import uuid

from rtlib import CANARY, PY, SECRET, pids_with
from rtlib import jail_fixture  # noqa: F401  (the `jail` fixture)

ZERO_CAPS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def host_sleeper(marker):
    """A host process with a marker in its argv, blocked until its stdin closes; returned
    once it runs (its argv is readable in /proc only after its exec completes)."""
    proc = subprocess.Popen([PY, "-c", "import sys; print('up', flush=True); sys.stdin.read()",
                             marker], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    return proc


def status_fields(text, names):
    rows = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {n: rows[n].strip() for n in names}


def test_host_processes_are_invisible(jail):
    mark = "rt-host-" + uuid.uuid4().hex
    sleeper = host_sleeper(mark)
    try:
        assert pids_with(mark) == [sleeper.pid]                  # control: the host sees it
        code = """
            mark, host_pid = ARGS[0], int(ARGS[1])
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            seen = []
            for p in pids:
                if p == os.getpid():        # our own argv names the mark
                    continue
                try:
                    if mark.encode() in read(f"/proc/{p}/cmdline"):
                        seen.append(p)
                except OSError:
                    pass
            OUT["pids"] = pids
            OUT["seen"] = seen
            OUT["status"] = attempt(os.stat, f"/proc/{host_pid}")
            OUT["kill0"] = attempt(os.kill, host_pid, 0)
            OUT["kill"] = attempt(os.kill, host_pid, signal.SIGKILL)
            OUT["pidfd"] = attempt(os.pidfd_open, host_pid)
        """
        res = jail.py(code, mark, sleeper.pid)
        assert res.rt["seen"] == [], res
        assert sleeper.pid not in res.rt["pids"]
        assert len(res.rt["pids"]) <= 3 and res.rt["pids"][0] == 1, res    # init, the command
        assert (res.rt["status"], res.rt["kill0"], res.rt["kill"], res.rt["pidfd"]) == \
            ("ENOENT", "ESRCH", "ESRCH", "ESRCH"), res
        assert sleeper.poll() is None, "the jail killed a host process"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sleeper.returncode == -signal.SIGKILL                 # control: it was killable


SIGNAL_WITNESS = """
import signal, sys
got = []
signal.signal(signal.SIGURG, lambda *_: got.append(1))
print("up", flush=True)
for _ in sys.stdin:             # each line asks: signalled since the last question?
    print("signalled" if got else "untouched", flush=True)
    got.clear()
"""


def test_signal_everything_from_inside_spares_the_host(jail):
    """kill(-1) and killpg() from inside reach only the jail's own processes. The signal is
    SIGURG, which every process ignores unless it asks for it, so a broken PID namespace
    shows up as a failure here, not as a host with every process killed."""
    witness = subprocess.Popen([PY, "-c", SIGNAL_WITNESS, "rt-witness-" + uuid.uuid4().hex],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask():
        witness.stdin.write(b"?\n")
        witness.stdin.flush()
        return witness.stdout.readline().decode().strip()
    try:
        assert witness.stdout.readline() == b"up\n"
        res = jail.py("""
            OUT["kill -1"] = attempt(os.kill, -1, signal.SIGURG)
            OUT["killpg 1"] = attempt(os.killpg, 1, signal.SIGURG)
            OUT["kill witness"] = attempt(os.kill, int(ARGS[0]), signal.SIGURG)
        """, witness.pid)
        after_jail = ask()
        control = jail.host_py("OUT['kill'] = attempt(os.kill, int(ARGS[0]), signal.SIGURG)",
                               witness.pid)
        after_control = ask()
    finally:
        witness.kill()
        witness.wait()
    assert control["kill"] == "OK" and after_control == "signalled"   # the host reaches it
    assert after_jail == "untouched", "a signal from the jail reached a host process"
    assert res.rt["kill witness"] == "ESRCH", res
    assert res.rt["kill -1"] in ("OK", "ESRCH") and res.rt["killpg 1"] in ("ESRCH", "EPERM"), res


PROBE_FDS = ('n=3; while [ $n -lt 1024 ]; do [ -e /proc/self/fd/$n ] && echo "open fd $n"; '
             'n=$((n+1)); done; echo fds-checked')


def leaked_pipe():
    """An inheritable descriptor in the caller, as an operator's shell or tool might leave
    one; the positive control shows the probe finds it in an ordinary child."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    found = subprocess.run(["/bin/sh", "-c", PROBE_FDS], pass_fds=(w,), capture_output=True,
                           text=True, check=True).stdout
    assert f"open fd {w}" in found
    return r, w


def test_no_descriptor_leaks_into_the_command(jail):
    r, w = leaked_pipe()
    try:
        res = jail.sh(PROBE_FDS, pass_fds=(w,))
    finally:
        os.close(r)
        os.close(w)
    assert "fds-checked" in res.out and "open fd" not in res.out, res


def test_no_descriptor_leaks_under_a_trace(jail):
    """With --trace the strace pipe is fd 3 of the wrapper: the command must not hold it,
    nor anything the caller leaked."""
    r, w = leaked_pipe()
    try:
        res = jail.sh(PROBE_FDS, flags=["--trace"], pass_fds=(w,))
    finally:
        os.close(r)
        os.close(w)
    assert "fds-checked" in res.out and "open fd" not in res.out, res
    assert (jail.session_dir(res.sid) / "syscalls.jsonl").stat().st_size > 0   # it was traced


def test_init_process_descriptors_and_memory(jail):
    """PID 1 is a copy of the OVERLORD caller: its descriptors, memory, environment, root and
    executable are the host's, and must all be closed to the command."""
    code = """
        fds = []
        OUT["fd-list"] = attempt(lambda: fds.extend(os.listdir("/proc/1/fd")))
        for fd in fds:
            OUT["fd " + fd] = attempt(os.readlink, "/proc/1/fd/" + fd)
            OUT["open fd " + fd] = attempt(os.open, "/proc/1/fd/" + fd, os.O_RDONLY)
        for name in ("environ", "mem", "maps", "auxv", "syscall", "stack"):
            OUT[name] = attempt(read, "/proc/1/" + name)
        for name in ("root", "cwd", "exe"):
            OUT[name] = attempt(os.readlink, "/proc/1/" + name)
        OUT["exe open"] = attempt(os.open, "/proc/1/exe", os.O_RDONLY)
        OUT["root list"] = attempt(os.listdir, "/proc/1/root/")
    """
    # control: a host process's own links do lead to host files
    control = jail.host_py("OUT['via-root'] = read('/proc/self/root' + ARGS[0]).decode()",
                           jail.canary)
    assert control["via-root"] == CANARY.decode()
    res = jail.py(code)
    denied = {k: v for k, v in res.rt.items() if k != "fd-list"}
    assert denied and set(denied.values()) <= {"EACCES", "EPERM"}, res


def test_proc_pid_root_leads_to_the_jail_root(jail):
    code = """
        canary = ARGS[0]
        jail_root = sorted(os.listdir("/"))
        for p in sorted(p for p in os.listdir("/proc") if p.isdigit()) + ["self", "thread-self"]:
            try:
                listing = sorted(os.listdir(f"/proc/{p}/root"))
            except OSError as e:
                OUT[p] = ename(e.errno)
                continue
            OUT[p] = "jail root" if listing == jail_root else listing
            OUT[p + " canary"] = attempt(read, f"/proc/{p}/root{canary}")
            OUT[p + " ..canary"] = attempt(read, f"/proc/{p}/root/../../..{canary}")
    """
    control = jail.host_py("OUT['via-root'] = read('/proc/self/root' + ARGS[0]).decode()",
                           jail.canary)
    assert control["via-root"] == CANARY.decode()
    res = jail.py(code, jail.canary)
    assert res.rt["1"] in ("EACCES", "jail root"), res
    assert res.rt["self"] == "jail root", res
    for key, value in res.rt.items():
        if key.endswith("canary"):
            assert value == "ENOENT", (key, res)
        else:
            assert value in ("EACCES", "jail root"), (key, res)


def test_proc_self_exe_cannot_overwrite_the_interpreter(jail):
    """runc CVE-2019-5736 shape: reopen /proc/self/exe (and PID 1's) for writing."""
    real = os.path.realpath(PY)
    before = os.stat(real)
    code = """
        OUT["self exe"] = os.readlink("/proc/self/exe")
        OUT["self write"] = attempt(os.open, "/proc/self/exe", os.O_WRONLY)
        OUT["self rdwr"] = attempt(os.open, "/proc/self/exe", os.O_RDWR)
        OUT["init write"] = attempt(os.open, "/proc/1/exe", os.O_WRONLY)
        OUT["path write"] = attempt(os.open, os.path.realpath("/proc/self/exe"), os.O_WRONLY)
    """
    # control: as root the host's interpreter is writable by its owner (nothing is opened);
    # an ordinary user's control is that the file is root's and not theirs to write
    control = jail.host_py("OUT['w'] = os.access(os.path.realpath(ARGS[0]), os.W_OK)", PY)
    assert control["w"] is (os.geteuid() == 0)
    res = jail.py(code)
    assert res.rt.pop("self exe") == real, res
    assert res.rt.pop("init write") == "EACCES", res
    # read-only mount (or a running text); an ordinary user meets the file's own mode first
    refusals = {"EROFS", "ETXTBSY"} | ({"EACCES"} if os.geteuid() != 0 else set())
    assert res.rt and set(res.rt.values()) <= refusals, res
    now = os.stat(real)
    assert (now.st_mtime_ns, now.st_size, now.st_ino) == (before.st_mtime_ns, before.st_size,
                                                          before.st_ino)


def test_environment_and_proc_environ_hold_no_secret(jail):
    needles = [SECRET, str(jail.home), "ANTHROPIC_API_KEY", "OVERLORD_HOME"]
    code = """
        needles = [bytes.fromhex(a).decode() for a in ARGS]     # never in our own argv as such
        OUT["env"] = [n for n in needles if n in json.dumps(dict(os.environ))]
        OUT["leaks"] = []
        OUT["read"] = 0
        for p in [p for p in os.listdir("/proc") if p.isdigit()] + ["self"]:
            for name in ("environ", "cmdline"):
                try:
                    data = read(f"/proc/{p}/{name}").decode("utf-8", "replace")
                except OSError:
                    continue
                OUT["read"] += 1
                OUT["leaks"] += [f"{p}/{name}: {n}" for n in needles if n in data]
    """
    # control: the caller does hold the secret, and a host process it starts would see it
    control = jail.host_py("OUT['env'] = [n for n in ARGS if n in json.dumps(dict(os.environ))]",
                           *needles, env=dict(os.environ, **jail.env()))
    assert control["env"] == needles
    res = jail.py(code, *[n.encode().hex() for n in needles])
    assert res.rt["env"] == [] and res.rt["leaks"] == [], res
    assert res.rt["read"] >= 2, res                       # it did read its own files
    env_out = jail.run(["env"], check=0).out
    assert SECRET not in env_out and str(jail.home) not in env_out
    assert "OVERLORD_JAIL=1" in env_out and "HOME=/tmp" in env_out


def test_capabilities_no_new_privs_and_seccomp(jail):
    fields = ZERO_CAPS + ("NoNewPrivs", "Seccomp")
    code = """
        OUT["self"] = read("/proc/self/status").decode()
        OUT["child"] = __import__("subprocess").run(["cat", "/proc/self/status"],
                                                    capture_output=True, text=True).stdout
    """
    control = jail.host_py("OUT['self'] = read('/proc/self/status').decode()")
    host = status_fields(control["self"], fields)
    assert int(host["CapBnd"], 16) != 0                        # the host's bounding set is full
    if os.geteuid() == 0:
        assert int(host["CapEff"], 16) != 0
    res = jail.py(code)
    want = dict({c: "0000000000000000" for c in ZERO_CAPS}, NoNewPrivs="1", Seccomp="2")
    assert status_fields(res.rt["self"], fields) == want, res
    assert status_fields(res.rt["child"], fields) == want, res


SETUID_PROBE = """
    import subprocess, time
    # su's first words (a password prompt, or an error) go to a pipe that is already full, so
    # whatever it decides it stops there, after exec, holding the credentials exec gave it
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    p = subprocess.Popen([ARGS[0], "root", "-c", "grep -E '^(Uid|CapEff|CapPrm):' /proc/self/status"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=w)
    os.close(w)
    status = None
    deadline = time.monotonic() + 30
    while status is None and p.poll() is None and time.monotonic() < deadline:
        try:
            text = read(f"/proc/{p.pid}/status").decode()
        except OSError:
            continue
        rows = dict(l.split(":", 1) for l in text.splitlines() if ":" in l)
        if rows["Name"].strip() == "su" and rows["State"].split()[0] == "S":
            status = text
    p.kill()
    out = p.communicate()[0].decode()
    text = status or out
    rows = dict(l.split(":", 1) for l in text.splitlines() if ":" in l)
    OUT["uid"] = [int(x) for x in rows["Uid"].split()]
    OUT["capeff"] = int(rows["CapEff"], 16)
    OUT["capprm"] = int(rows["CapPrm"], 16)
    OUT["seen"] = "process" if status else "output"
"""


def test_setuid_binary_gives_no_privilege(jail):
    su = "/usr/bin/su"
    st = os.stat(su)
    assert st.st_uid == 0 and st.st_mode & 0o4000, "the setuid-root su this attack uses"
    me = os.geteuid()
    control = jail.host_py(SETUID_PROBE, su)
    assert control["uid"][1] == 0 and control["capeff"] != 0, control   # it gains on the host
    res = jail.py(SETUID_PROBE, su)
    assert res.rt["uid"][1] == me and res.rt["capeff"] == 0 and res.rt["capprm"] == 0, res


PTRACE_PROBE = """
    PTRACE_PEEKDATA, PTRACE_ATTACH, PTRACE_DETACH, PTRACE_TRACEME = 2, 16, 17, 0
    OUT["peek self"] = raw(NR["ptrace"], PTRACE_PEEKDATA, os.getpid(), 0, 0)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    OUT["attach child"] = raw(NR["ptrace"], PTRACE_ATTACH, child, 0, 0)
    if OUT["attach child"] == "OK":
        os.waitpid(child, 0)
        raw(NR["ptrace"], PTRACE_DETACH, child, 0, 0)
    os.close(w)
    os.waitpid(child, 0)
"""


# Only ever run jailed: on the host these would trace the test runner itself.
JAIL_ONLY_PTRACE = """
OUT["attach parent"] = raw(NR["ptrace"], 16, os.getppid(), 0, 0)
if OUT["attach parent"] == "OK":        # let it go again, or the jail never ends
    os.waitpid(os.getppid(), 0x40000000)      # __WALL
    raw(NR["ptrace"], 17, os.getppid(), 0, 0)
OUT["traceme"] = raw(NR["ptrace"], 0, 0, 0, 0)
"""


def test_ptrace_is_refused(jail):
    # control: on the host a process may trace its own child (and only peek what it traces)
    control = jail.host_py(PTRACE_PROBE)
    assert control["peek self"] == "ESRCH" and control["attach child"] == "OK", control
    # sh stays the python's parent, so there is a live, same-user parent to attach to
    res = jail.run(["/bin/sh", "-c", '"$@"; exit $?', jail.marker, PY, "-c",
                    jail.program(textwrap.dedent(PTRACE_PROBE) + JAIL_ONLY_PTRACE),
                    jail.marker], check=0)
    assert res.rt == {"peek self": "EPERM", "attach child": "EPERM", "attach parent": "EPERM",
                      "traceme": "EPERM"}, res


def test_ptrace_is_allowed_only_under_a_trace(jail):
    """--trace runs strace, which needs ptrace: there the filter lets it through (the command
    is already traced, so it can trace nothing itself) and the record is written."""
    res = jail.py("""
        OUT["peek self"] = raw(NR["ptrace"], 2, os.getpid(), 0, 0)
        OUT["seccomp"] = [l for l in read("/proc/self/status").decode().splitlines()
                          if l.startswith(("Seccomp:", "CapEff:", "NoNewPrivs:"))]
    """, flags=["--trace"])
    assert res.rt["peek self"] == "ESRCH", res
    assert sorted(res.rt["seccomp"]) == ["CapEff:\t0000000000000000", "NoNewPrivs:\t1",
                                         "Seccomp:\t2"], res
    records = [json.loads(line) for line in
               (jail.session_dir(res.sid) / "syscalls.jsonl").read_text().splitlines()]
    assert any(r["syscall"] == "execve" and "python3" in r.get("path", "") for r in records)
    # and without --trace the same call is refused
    assert jail.py("OUT['p'] = raw(NR['ptrace'], 2, os.getpid(), 0, 0)").rt["p"] == "EPERM"


def test_tiocsti_injects_nothing_into_the_terminal(jail):
    """Typing into the caller's terminal (TIOCSTI) or driving the console (TIOCLINUX), from a
    command whose stdin is a terminal it made its controlling one."""
    code = """
        import fcntl, termios
        OUT["ctty"] = attempt(fcntl.ioctl, 0, termios.TIOCSCTTY, 0)
        OUT["sti fd0"] = attempt(fcntl.ioctl, 0, termios.TIOCSTI, b"#")
        def via_dev_tty():
            fd = os.open("/dev/tty", os.O_RDWR)
            try:
                fcntl.ioctl(fd, termios.TIOCSTI, b"#")
            finally:
                os.close(fd)
        OUT["sti /dev/tty"] = attempt(via_dev_tty)
        OUT["linux fd0"] = attempt(fcntl.ioctl, 0, 0x541C, b"\\x0b")
    """
    master, slave = os.openpty()
    try:
        control = jail.host_py(code, stdin=slave, start_new_session=True)
        res = jail.py(code, stdin=slave)
    finally:
        os.close(master)
        os.close(slave)
    # control: on the host the same command may push input into its terminal (an ordinary
    # user's kernel may refuse with EIO when legacy TIOCSTI is off, but not by filter: not EPERM)
    assert control["ctty"] == "OK" and control["sti fd0"] in ("OK", "EIO"), control
    assert control["linux fd0"] != "EPERM", control
    assert res.rt == {"ctty": "OK", "sti fd0": "EPERM", "sti /dev/tty": "EPERM",
                      "linux fd0": "EPERM"}, res
