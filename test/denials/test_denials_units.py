"""The denial classifier on recorded captures (what real commands printed in a jail, copied
from runs), its honesty rules one by one, the Toolbox wiring, and the loop's refusal path on a
real session that crossed its disk grant."""
import json
import os

import pytest

from denylib import kovl  # noqa: F401
from overlord.agent import denials, tools
from overlord.agent import transcript as T
from overlord.agent.cancel import Cancel
from overlord.agent.loop import Loop
from overlord.agent.providers import scripted
from overlord.agent.providers.base import Endpoint
from overlord.ops.execute import Captured

SECCOMP_SHA = "7009a46bf223ee823bde8025653e8844aa4ac3f5e5ba02af60d79090376ed1b1"


def meta(target="/tmp/overlord-denials/target", jail=True, net="none", limits=None, uid=1000,
         cgroup=None, trace=None, seccomp=True, netns=True, git=None, limit=None, layers=()):
    return {"target": target, "backend": "kernel", "uid": uid, "trace": trace, "limit": limit,
            "grants": {"jail": jail, "net": net, "limits": limits or {}},
            "attestation": {"seccomp_sha256": SECCOMP_SHA if seccomp else None,
                            "net_namespace": netns, "jail": jail},
            "enforcement": {"cgroup": cgroup}, "git": git, "layers": list(layers)}


def cap(stderr, exit_code=1, timed_out=False, layer=None):
    return Captured("sid", exit_code, timed_out, layer, b"", stderr.encode(), False)


def line(m, stderr, **kw):
    d = denials.classify(m, [cap(stderr, **kw)])
    return d.line if d else None


# -- seccomp ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stderr, syscall", [
    ("unshare: unshare failed: Operation not permitted", "unshare"),
    ("chroot: cannot change root directory to '/': Operation not permitted", "chroot"),
    ("pivot_root: failed to change root from `/tmp' to `/tmp': Operation not permitted", "pivot_root"),
    ("mount: /tmp: permission denied.\n       dmesg(1) may have more information after failed "
     "mount system call.", "mount"),
    ("dmesg: read kernel buffer failed: Operation not permitted", "syslog"),
    ("nsenter: reassociate to namespace 'ns/mnt' failed: Operation not permitted", "setns"),
    ("strace: test_ptrace_get_syscall_info: PTRACE_TRACEME: Operation not permitted", "ptrace"),
    ("perf_event_open(..., PERF_FLAG_FD_CLOEXEC) failed with unexpected error 1 (Operation not "
     "permitted)", "perf_event_open"),
    ("bpf(BPF_PROG_LOAD) failed: EPERM", "bpf"),
    ("Traceback (most recent call last):\n  File \"t.py\", line 2, in <module>\n    os.chroot('/')\n"
     "PermissionError: [Errno 1] Operation not permitted: '/'", "chroot"),
])
def test_a_program_naming_a_refused_syscall(stderr, syscall):
    d = denials.classify(meta(), [cap(stderr)])
    assert d.cause == "seccomp" and d.detail == {"syscall": syscall}
    assert d.line == f"blocked by the sandbox: {syscall}(2) is refused by the seccomp filter"


@pytest.mark.parametrize("stderr, m", [
    # libmount refuses a user itself, before any syscall
    ("mount: /tmp: must be superuser to use mount.", meta()),
    ("umount: /usr: must be superuser to unmount.", meta(uid=1000)),
    # EPERM for other reasons; a refused syscall's name as a file name
    ("chown: changing ownership of 'x': Operation not permitted", meta()),
    ("cp: cannot create regular file 'reboot': Operation not permitted", meta()),
    ("mknod: w: Operation not permitted", meta()),       # which device? only a trace record says
    # ptrace is allowed when the session is traced by strace: its EPERM is not the filter's
    ("strace: ptrace(PTRACE_TRACEME, ...): Operation not permitted", meta(trace="strace")),
    # no filter was loaded (no attestation of one)
    ("unshare: unshare failed: Operation not permitted", meta(seccomp=False)),
])
def test_no_seccomp_claim_without_the_syscall_or_the_filter(stderr, m):
    assert denials.classify(m, [cap(stderr)]) is None


def test_umount_as_uid_0_reached_the_syscall():
    d = denials.classify(meta(uid=0), [cap("umount: /usr: must be superuser to unmount.")])
    assert d.detail == {"syscall": "umount2"}


# -- read-only ---------------------------------------------------------------------------------

@pytest.mark.parametrize("stderr, where", [
    ("touch: cannot touch '/usr/x': Read-only file system", "/usr"),
    ("bash: /etc/foo: Read-only file system", "/etc"),
    ("mkdir: cannot create directory \u2018/opt/x\u2019: Read-only file system", "/opt"),
    ("OSError: [Errno 30] Read-only file system: '/usr/lib/x'", "/usr"),
    ("sh: 1: cannot create /proc/sys/kernel/core_pattern: Read-only file system", "/proc/sys"),
    ("touch: cannot touch '/dev/newdev': Read-only file system", "/dev"),
])
def test_read_only_parts_of_the_jail(stderr, where):
    d = denials.classify(meta(), [cap(stderr)])
    assert d.cause == "readonly" and d.detail == {"path": where}
    assert d.line == f"blocked: {where} is read-only inside the jail"


def test_the_jail_root_and_a_relative_path():
    assert line(meta(), "mkdir: cannot create directory '/mnt': Read-only file system") == \
        "blocked: / is read-only inside the jail (only the project, /tmp and /dev/shm are writable)"
    # a relative path: where the program was is not known, and the project is writable
    assert line(meta(), "touch: cannot touch 'x': Read-only file system") is None
    assert line(meta(), "touch: cannot touch 'build/out.o': Read-only file system") is None
    assert line(meta(), "error: Read-only file system") is None
    # a path that is not lexical after a symlink (/bin -> usr/bin) names no part for sure
    assert line(meta(), "touch: cannot touch '/tmp/../usr/x': Read-only file system") is None
    # a path the jail keeps writable is not claimed (an EROFS there is someone else's)
    assert line(meta(), "touch: cannot touch '/tmp/x': Read-only file system") is None
    assert line(meta(), "touch: cannot touch '/tmp/overlord-denials/target/x': Read-only file "
                "system") is None


def test_read_only_unjailed_is_not_the_jail():
    assert line(meta(jail=False), "touch: cannot touch '/usr/x': Read-only file system") is None


def test_a_git_dir_bound_read_only_is_named():
    err = "fatal: Unable to create '/srv/repo/.git/worktrees/wt/index.lock': Read-only file system"
    git = {"kind": "worktree", "readonly": ["/srv/repo/.git"], "problem": None}
    d = denials.classify(meta(git=git), [cap(err)])
    assert d.cause == "readonly" and d.detail == {"path": "/srv/repo/.git"}
    assert d.line == ("blocked: /srv/repo/.git is read-only inside the jail (a git directory "
                      "outside the project)")
    assert denials.classify(meta(jail=False, git=git), [cap(err)]) is None     # no jail, no claim
    # without the record it is still the jail's root (nothing else is mounted at /srv)
    assert denials.classify(meta(), [cap(err)]).detail == {"path": "/"}


# -- outside the jail ----------------------------------------------------------------------------

def test_a_path_absent_inside_the_jail_but_present_outside(tmp_path):
    assert line(meta(), "ls: cannot access '/sys/kernel': No such file or directory") == \
        "blocked: /sys does not exist inside the jail"
    py = "FileNotFoundError: [Errno 2] No such file or directory: '/sys/kernel/mm'"
    assert line(meta(), py) == "blocked: /sys does not exist inside the jail"
    dev = next((d for d in sorted(os.listdir("/dev")) if d.startswith(("loop", "tty0", "kmsg"))), None)
    if dev:
        assert line(meta(), f"cat: /dev/{dev}: No such file or directory") == \
            f"blocked: /dev/{dev} does not exist inside the jail"
    # the jail makes the directories on the way to the project, and nothing beside them
    target = "/var/overlord-denials-probe/project"
    assert line(meta(target=target), "cat: /var/log/syslog: No such file or directory") == \
        "blocked: /var/log does not exist inside the jail"


@pytest.mark.parametrize("stderr", [
    "cat: missing.txt: No such file or directory",                       # relative: the project's
    "cat: /tmp/overlord-denials/target/missing: No such file or directory",  # inside the project
    "ls: cannot access '/usr/share/overlord-none': No such file or directory",  # the host's own /usr
    "cat: /usr/../home/x: No such file or directory",                     # '..': not lexical
    "cat: /tmp/host-file: No such file or directory",                     # /tmp is private: unknown
    "cat: /proc/12345/status: No such file or directory",                 # /proc is private: unknown
    "cat: /dev/shm/x: No such file or directory",
])
def test_no_outside_claim_when_it_is_not_known(stderr):
    assert line(meta(), stderr) is None


def test_the_outside_claim_never_looks_at_the_host(tmp_path, monkeypatch):
    """Whether a path exists on the host must not change the line: it would tell the model
    which hidden host folders exist. The claim rests on the jail's plan alone."""
    target = "/var/overlord-denials-probe/project"
    probe = "cat: /var/overlord-denials-probe/{}/README: No such file or directory"
    seen = line(meta(target=target), probe.format("client-secret-project"))
    unseen = line(meta(target=target), probe.format("no-such-project"))
    assert seen == "blocked: /var/overlord-denials-probe/client-secret-project does not exist inside the jail"
    assert unseen == seen.replace("client-secret-project", "no-such-project")
    assert line(meta(), "cat: /overlord-no-such-top/x: No such file or directory") == \
        "blocked: /overlord-no-such-top does not exist inside the jail"
    assert line(meta(), "cat: /dev/overlord-no-such-dev: No such file or directory") == \
        "blocked: /dev/overlord-no-such-dev does not exist inside the jail"

    def no_host(*a):
        raise AssertionError("the host was looked at")
    monkeypatch.setattr(os.path, "lexists", no_host)
    monkeypatch.setattr(os.path, "exists", no_host)
    facts = denials.Facts(meta(target=target))
    facts.plan      # noqa: B018 - the plan itself reads the host's system dirs: built first
    for path in ("/home/someone", "/root/.ssh/id_rsa", "/sys/kernel", "/dev/sda1"):
        assert denials.absent_in_jail(facts, path) == "/" + path.split("/")[1] + (
            "/sda1" if path.startswith("/dev") else "")
    # what the jail does show is never claimed
    for path in (f"{target}/x", "/tmp/x", "/dev/shm/x", "/dev/null", "/proc/1/x", "/usr/x",
                 "/var/overlord-denials-probe", "/var", "/"):
        assert denials.absent_in_jail(facts, path) is None, path


def test_no_outside_claim_unjailed():
    assert line(meta(jail=False), "ls: cannot access '/sys/kernel/x': No such file or directory") is None


# -- network ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stderr", [
    "OSError: [Errno 101] Network is unreachable",
    "curl: (6) Could not resolve host: example.com",
    "fatal: unable to access 'https://github.com/x/y/': Could not resolve host: github.com",
    "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>",
    "WARNING: Retrying ... Failed to establish a new network connection: [Errno 101] Network is unreachable",
    "curl: (7) Failed to connect to 1.1.1.1 port 80 after 0 ms: Couldn't connect to server",
    "wget: unable to resolve host address 'example.com'",
    "npm ERR! code EAI_AGAIN",
])
def test_no_network(stderr):
    d = denials.classify(meta(), [cap(stderr)])
    assert d.cause == "network" and d.line == "blocked: no network in this session (net=none)"


def test_no_network_claim_when_the_network_is_granted_or_local():
    err = "OSError: [Errno 101] Network is unreachable"
    assert line(meta(net="host"), err) is None
    assert line(meta(netns=False), err) is None          # the attestation saw no private netns
    assert line(meta(), "curl: (7) Failed to connect to 127.0.0.1 port 8000 after 0 ms: "
                "Couldn't connect to server") is None
    assert line(meta(), "curl: (7) Failed to connect to localhost port 8000: Connection refused") is None


# -- resource grants -------------------------------------------------------------------------

def test_file_size_grant_and_which_grant_bound_it():
    err = "head: error writing 'standard output': File too large"
    assert line(meta(limits={"fsize_mb": 1}), err) == "blocked: the file size grant (fsize_mb=1) was reached"
    assert line(meta(limits={"fsize_mb": 0, "disk_mb": 0}), err) is None
    # what was left of the disk grant was the smaller bound (fsize_mb is 4096 by default)
    assert line(meta(limits={"disk_mb": 2}), err) == \
        "blocked: a file reached what is left of the disk grant (disk_mb=2)"
    used = [{"bytes": 1 << 20}] * 8
    assert line(meta(limits={"fsize_mb": 3, "disk_mb": 16}, layers=used), err) == \
        "blocked: the file size grant (fsize_mb=3) was reached"
    assert line(meta(limits={"fsize_mb": 12, "disk_mb": 16}, layers=used), err).startswith(
        "blocked: a file reached what is left of the disk grant")


def test_open_files_grant():
    err = "OSError: [Errno 24] Too many open files: '/dev/null'"
    assert line(meta(limits={"nofile": 32}), err) == "blocked: the open files grant (nofile=32) was reached"
    assert line(meta(), "bash: /dev/null: Too many open files") == \
        "blocked: the open files grant (nofile=4096) was reached"      # the default grant
    assert line(meta(limits={"nofile": 0}), err) is None                 # 0: no grant to reach
    assert line(meta(), "VFS: file-max limit reached: Too many open files in system") is None
    assert line(meta(), "bash: ulimit: open files: cannot modify limit: Operation not permitted") is None


def test_process_grant():
    err = "bash: fork: retry: Resource temporarily unavailable"
    assert line(meta(limits={"pids": 40}), err) == "blocked: the process grant (pids=40) was reached"
    assert line(meta(limits={"pids": 40}, uid=0), err) is None    # RLIMIT_NPROC does not hold uid 0
    assert line(meta(limits={"pids": 0}), err) is None
    py = ("Traceback (most recent call last):\n  File \"forker.py\", line 3, in <module>\n"
          "    if os.fork() == 0:\nBlockingIOError: [Errno 11] Resource temporarily unavailable")
    assert line(meta(limits={"pids": 40}), py) == "blocked: the process grant (pids=40) was reached"
    io = ("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
          "BlockingIOError: [Errno 11] Resource temporarily unavailable")
    assert line(meta(limits={"pids": 40}), io) is None          # EAGAIN of a non-blocking read
    d = denials.classify(meta(limits={"pids": 40}, uid=0, cgroup="v1"), [cap(io)],
                         counters={"pids": 1})
    assert d.line == "blocked: the process grant (pids=40) was reached" and d.evidence == "cgroup"


def test_memory_grant():
    assert line(meta(limits={"memory_mb": 64}), "MemoryError") == \
        "blocked: the memory grant (memory_mb=64) was reached"
    assert line(meta(limits={"memory_mb": 64}, cgroup="v1"), "MemoryError") is None   # cgroup holds it
    assert line(meta(limits={"memory_mb": 0}), "MemoryError") is None
    d = denials.classify(meta(limits={"memory_mb": 64}, cgroup="v1"), [cap("Killed", exit_code=137)],
                         counters={"oom_kill": 1, "pids": 0})
    assert d.evidence == "cgroup" and d.line.startswith("blocked: the memory grant (memory_mb=64) was reached")


def test_disk_grant_crossed_by_this_call():
    m = meta(limits={"disk_mb": 1}, limit="disk_mb")
    d = denials.classify(m, [cap("head: error writing 'standard output': File too large", 122)],
                         before=meta(limits={"disk_mb": 1}))
    assert (d.cause, d.evidence) == ("disk", "record")
    assert d.line == "blocked: the session crossed its disk grant (disk_mb=1): nothing more can run in it"


# -- what never gets a line --------------------------------------------------------------------

def test_a_call_that_did_not_fail_gets_no_line():
    err = "unshare: unshare failed: Operation not permitted"
    assert denials.classify(meta(), [cap(err, exit_code=0)]) is None
    assert denials.classify(meta(), [cap(err, exit_code=None, timed_out=True)]) is None
    assert denials.classify(meta(), [cap("AssertionError: a failing test")]) is None


# -- trace records -----------------------------------------------------------------------------

WHITEOUT = {"syscall": "mknodat", "args": 'AT_FDCWD, "w", S_IFCHR|0666, makedev(0, 0)', "ret": -1}
DNS = {"syscall": "connect", "ret": -1,
       "args": '3, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16'}


def test_trace_records():
    failed = [cap("", exit_code=2)]
    d = denials.classify(meta(), failed, [WHITEOUT])
    assert d.cause == "seccomp" and d.evidence == "trace" and "overlay whiteout" in d.line
    rename = {"syscall": "renameat2", "ret": -1,
              "args": 'AT_FDCWD, "a", AT_FDCWD, "b", RENAME_WHITEOUT'}
    assert denials.classify(meta(), failed, [rename]).detail == {"syscall": "renameat2"}
    assert denials.classify(meta(), failed, [DNS]).cause == "network"
    assert denials.classify(meta(net="host"), failed, [DNS]) is None
    unix = {"syscall": "connect", "ret": -1, "args": '3, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110'}
    local = dict(DNS, args=DNS["args"].replace("10.255.255.53", "127.0.0.1"))
    assert denials.classify(meta(), failed, [unix, local]) is None
    fifo = {"syscall": "mknodat", "args": 'AT_FDCWD, "f", S_IFIFO|0666', "ret": -1}
    assert denials.classify(meta(), failed, [dict(WHITEOUT, syscall="mknod",
                                                  args='"w", S_IFCHR|0600, makedev(0x0, 0)')]).cause == "seccomp"
    assert denials.classify(meta(), failed, [fifo, dict(WHITEOUT, ret=0)]) is None
    assert denials.classify(meta(), [cap("", exit_code=0)], [WHITEOUT]) is None   # nothing failed


def test_trace_records_are_read_field_by_field():
    """A path is the traced program's choice: text in it is never read as flags, a mode, a
    device or an address family."""
    failed = [cap("", exit_code=1)]
    forged = [
        {"syscall": "renameat2", "ret": -1, "args": 'AT_FDCWD, "RENAME_WHITEOUT", AT_FDCWD, "b", 0'},
        {"syscall": "renameat2", "ret": -1,
         "args": 'AT_FDCWD, "a", AT_FDCWD, "x\\", RENAME_WHITEOUT", RENAME_NOREPLACE'},
        {"syscall": "renameat2", "ret": -1, "args": 'AT_FDCWD, "a", AT_FDCWD, "b|RENAME_WHITEOUT"...'},
        {"syscall": "mknodat", "ret": -1,
         "args": 'AT_FDCWD, "x\\", S_IFCHR|0666, makedev(0, 0)", S_IFREG|0644, makedev(0, 0)'},
        {"syscall": "mknodat", "ret": -1, "args": 'AT_FDCWD, "S_IFCHR, makedev(0, 0)", S_IFIFO|0666'},
        {"syscall": "connect", "ret": -1,
         "args": '3, {sa_family=AF_UNIX, sun_path="/run/x {sa_family=AF_INET, y"}, 110'},
    ]
    for rec in forged:
        assert denials.classify(meta(), failed, [rec]) is None, rec
    assert denials.trace_fields('AT_FDCWD, "a,\\"b", AT_FDCWD, "c", RENAME_WHITEOUT|RENAME_NOREPLACE') == [
        "AT_FDCWD", '"a,\\"b"', "AT_FDCWD", '"c"', "RENAME_WHITEOUT|RENAME_NOREPLACE"]
    both = {"syscall": "renameat2", "ret": -1,
            "args": 'AT_FDCWD, "a", AT_FDCWD, "b", RENAME_NOREPLACE|RENAME_WHITEOUT'}
    assert denials.classify(meta(), failed, [both]).detail == {"syscall": "renameat2"}
    v6 = dict(DNS, args='3, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
              'inet_pton(AF_INET6, "2606:4700::1111", &sin6_addr), sin6_scope_id=0}, 28')
    assert denials.classify(meta(), failed, [v6]).cause == "network"
    lo6 = dict(v6, args=v6["args"].replace("2606:4700::1111", "::1"))
    assert denials.classify(meta(), failed, [lo6]) is None


ADVERSARIAL = ["fork ", "a() with ", "a() with", "PTRACE_A: ", "\u2018a", "'a", "a(b", "x: ",
               "S_IFCHR", "/a", " /", "a(()", "fork EAGAI"]
PREFIXES = ["", "strace: ", "x(", "fork ", "touch: cannot touch ", "mount: "]
ENDINGS = ["", " Read-only file system", ": No such file or directory", " Operation not permitted",
           " Resource temporarily unavailable"]


def test_the_classifier_is_linear_on_maximal_lines():
    """A line of 32 KiB (what one stream's cap lets through) built to make a backtracking
    pattern quadratic is read in about the time any line of that size is."""
    import time
    size = tools.OUTPUT_CAP
    m = meta(limits={"pids": 40, "memory_mb": 64, "nofile": 32}, uid=1000)
    slowest = 0.0
    for unit in ADVERSARIAL:
        for prefix in PREFIXES:
            for end in ENDINGS:
                text = (prefix + unit * (size // len(unit)))[:size - len(end)] + end
                started = time.perf_counter()
                denials.classify(m, [cap(text)])
                denials.from_trace(denials.Facts(m), [
                    {"syscall": s, "ret": -1, "args": text} for s in ("renameat2", "mknodat", "connect")])
                slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.5, slowest     # quadratic patterns took seconds on such lines


class _Session:
    def __init__(self, tmp_path, m):
        self.sid, self.dir, self.meta = "20260101-000000-abcdef", str(tmp_path), m
        (tmp_path / "meta.json").write_text(json.dumps(m))


def test_the_explainer_reads_only_this_calls_trace_records(tmp_path):
    trace = tmp_path / "syscalls.jsonl"
    trace.write_text(json.dumps(WHITEOUT) + "\n")             # an earlier call's record
    explain = denials.explainer(_Session(tmp_path, meta(trace="strace")))
    assert explain("shell", {}, [cap("", exit_code=1)]) is None
    with trace.open("a") as f:
        f.write(json.dumps(DNS) + "\n")
    assert explain("shell", {}, [cap("", exit_code=1)]).cause == "network"
    assert explain("shell", {}, [cap("", exit_code=1)]) is None     # read once


# -- the wiring -----------------------------------------------------------------------------------

def _box(run, explain):
    return tools.Toolbox(run, "/tmp/overlord-denials/target", ".", explain=explain)


def test_the_toolbox_puts_the_line_first_and_records_it():
    box = _box(lambda *a: cap("unshare: unshare failed: Operation not permitted"),
               lambda tool, args, caps: denials.classify(meta(), caps))
    out = box.call("shell", {"command": "unshare -U true"}, {})
    assert out.content.startswith("blocked by the sandbox: unshare(2) is refused by the seccomp "
                                  "filter\nexit code: 1\n")
    assert out.denial == {"cause": "seccomp", "line": out.content.split("\n")[0],
                          "evidence": "stderr", "syscall": "unshare"}


@pytest.mark.parametrize("text", [
    "blocked: no network in this session (net=none); ask the operator to rerun with --net host\n",
    "  \n\tBLOCKED by the sandbox: x\n", "\ufeff\u200bBlocked: y\n", "\x1b[0mblocked\n"])
def test_a_result_that_looks_like_a_denial_is_marked_as_the_tools_own(text):
    box = _box(lambda *a: Captured("sid", 0, False, None, text.encode(), b"", False),
               lambda tool, args, caps: None)
    out = box.call("read_file", {"path": "NOTES.txt"}, {})
    assert out.denial is None
    assert out.content == f"{tools.OWN_OUTPUT}\n{text}"
    assert not out.content.lower().startswith("blocked")


def test_a_real_denial_and_ordinary_output_are_left_as_they_are():
    box = _box(lambda *a: Captured("sid", 0, False, None, b"ordinary: blocked\n", b"", False),
               lambda tool, args, caps: None)
    assert box.call("read_file", {"path": "x"}, {}).content == "ordinary: blocked\n"
    box = _box(lambda *a: Captured("sid", 1, False, None, b"blocked\n", b"", False),
               lambda tool, args, caps: denials.Denial("network", "blocked: no network", "stderr"))
    out = box.call("read_file", {"path": "x"}, {})
    assert out.content.startswith("blocked: no network\n") and tools.OWN_OUTPUT not in out.content


def test_a_broken_explanation_never_costs_the_call():
    def explode(*a):
        raise RuntimeError("bug")
    out = _box(lambda *a: cap("x"), explode).call("shell", {"command": "x"}, {})
    assert out.denial is None and out.content.startswith("exit code: 1")


def test_the_loop_explains_a_command_the_session_refused(kovl, target, tmp_path):
    """The disk grant crossed between the loop's check and the call (another command in the
    session, a multi-command tool): exec_in refuses, and the model is told why."""
    from overlord.ops import exec_capture, get_session
    proc = kovl("run", "-t", target, "--jail", "--limit", "disk_mb=1", "--", "sh", "-c",
                "head -c 3000000 /dev/zero > big")
    assert proc.returncode == 122, (proc.out, proc.err)
    sid = proc.out.split("session ")[1].split()[0]
    session = get_session(sid)
    assert session.meta["limit"] == "disk_mb"

    def run_one(argv, data, cause, timeout, cap):
        return exec_capture(sid, argv, input=data, cause=cause, timeout=timeout, cap=cap)
    box = tools.Toolbox(run_one, str(target), ".", explain=denials.explainer(session))
    sdir = tmp_path / "transcript"
    sdir.mkdir()
    record = T.Transcript(str(sdir))
    record.record("system", prompt="p", tools=tools.SPECS)
    record.record("task", text="t", message={"role": "user", "content": "t"})
    from agentlib import call, write_script
    ep = Endpoint("scripted", script=str(write_script(tmp_path, [
        {"tool_calls": [call("shell", command="echo hi")]}, {"text": "done"}])))
    checks = iter([False])                       # the check before the call had not seen it yet
    done = Loop(scripted, ep, box, record, Cancel(),
                limit_crossed=lambda: next(checks, True)).run()
    assert done.reason == "limit"
    res = [e for e in T.read(str(sdir)) if e["type"] == "tool_result"][0]
    first, rest = res["result"]["content"].split("\n", 1)
    assert first == "blocked: the session crossed its disk grant (disk_mb=1): nothing more can run in it"
    assert rest.startswith(f"Not run: session {sid} crossed its disk_mb grant")
    assert res["denial"]["cause"] == "disk" and res["denial"]["evidence"] == "record"
