"""Each denial cause end to end: a jailed agent session on the kernel backend, one tool call the
sandbox refuses, and the model told why in the first line of the result -- on the scripted
provider's path and on the fake Anthropic endpoint's (where the next request must carry the
line). Then the negatives: ordinary failures, and unjailed sessions, get no line."""
import os

import pytest

from denylib import PROVIDERS, agent, assert_no_denial, assert_told, kovl  # noqa: F401
from conftest import require_tool

PY = "/usr/bin/python3"      # inside the jail: the system's python (a pyenv under /root is not there)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_seccomp_refusal_names_the_syscall(kovl, target, tmp_path, provider):
    run = agent(kovl, target, tmp_path, provider, [("shell", {"command": "unshare -U true"})])
    d = assert_told(run, "blocked by the sandbox: unshare(2) is refused by the seccomp filter",
                    "seccomp")
    assert d["syscall"] == "unshare" and d["evidence"] == "stderr"
    assert "unshare failed: Operation not permitted" in run.content()     # its own words follow


@pytest.mark.parametrize("provider", PROVIDERS)
def test_read_only_system_tree(kovl, target, tmp_path, provider):
    run = agent(kovl, target, tmp_path, provider, [
        ("shell", {"command": "touch /usr/overlord-denial-probe"}),
        ("shell", {"command": "mkdir /overlord-denial-probe"})])
    assert_told(run, "blocked: /usr is read-only inside the jail", "readonly")
    d = assert_told(run, "blocked: / is read-only inside the jail (only the project, /tmp and "
                    "/dev/shm are writable)", "readonly", i=1)
    assert d["path"] == "/"
    assert not os.path.exists("/usr/overlord-denial-probe") and not os.path.exists("/overlord-denial-probe")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_path_outside_the_jail(kovl, target, tmp_path, provider):
    assert os.path.isdir("/sys/kernel")          # outside the jail it is there
    run = agent(kovl, target, tmp_path, provider, [("shell", {"command": "ls /sys/kernel"})])
    d = assert_told(run, "blocked: /sys does not exist inside the jail", "outside")
    assert d["path"] == "/sys"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_no_network(kovl, target, tmp_path, provider):
    probe = f"{PY} -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=5)'"
    run = agent(kovl, target, tmp_path, provider, [("shell", {"command": probe})])
    d = assert_told(run, "blocked: no network in this session (net=none)", "network")
    assert d["net"] == "none" and "Network is unreachable" in run.content()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_file_size_grant(kovl, target, tmp_path, provider):
    run = agent(kovl, target, tmp_path, provider,
                [("shell", {"command": "head -c 2000000 /dev/zero > big"})], "--limit", "fsize_mb=1")
    d = assert_told(run, "blocked: the file size grant (fsize_mb=1) was reached", "limit")
    assert (d["grant"], d["value"]) == ("fsize_mb", 1)


def test_file_size_grant_through_write_file(kovl, target, tmp_path):
    run = agent(kovl, target, tmp_path, "scripted",
                [("write_file", {"path": "big.txt", "content": "x" * 1_500_000})],
                "--limit", "fsize_mb=1")
    assert_told(run, "blocked: the file size grant (fsize_mb=1) was reached", "limit")
    assert run.results[0]["result"]["is_error"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_open_files_grant(kovl, target, tmp_path, provider):
    probe = f"{PY} -c 'fs = [open(\"/dev/null\") for _ in range(100)]'"
    run = agent(kovl, target, tmp_path, provider, [("shell", {"command": probe})],
                "--limit", "nofile=32")
    assert_told(run, "blocked: the open files grant (nofile=32) was reached", "limit")


FORKER = """import os, time
for _ in range(400):
    if os.fork() == 0:
        time.sleep(1)
        os._exit(0)
"""


@pytest.mark.parametrize("provider", PROVIDERS)
def test_process_grant(kovl, target, tmp_path, provider):
    (target / "forker.py").write_text(FORKER)
    run = agent(kovl, target, tmp_path, provider, [("shell", {"command": f"{PY} forker.py"})],
                "--limit", "pids=48")
    d = assert_told(run, "blocked: the process grant (pids=48) was reached", "limit")
    # root: the session cgroup's pids.events counted the refused fork; a user without a
    # cgroup: RLIMIT_NPROC, and python's own words (BlockingIOError at os.fork())
    assert d["evidence"] == ("cgroup" if kovl.meta(run.sid)["enforcement"]["cgroup"] else "stderr")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_memory_grant(kovl, target, tmp_path, provider):
    run = agent(kovl, target, tmp_path, provider,
                [("shell", {"command": f"{PY} -c 'b = bytearray(1 << 30)'"})],
                "--limit", "memory_mb=128")
    assert run.proc.returncode == 0, (run.proc.out, run.proc.err)
    line = run.content().split("\n", 1)[0]
    assert line.startswith("blocked: the memory grant (memory_mb=128) was reached"), line
    d = run.denial()
    assert d["cause"] == "limit" and d["line"] == line
    if kovl.meta(run.sid)["enforcement"]["cgroup"]:      # killed at memory.max: its oom_kill counter
        assert d["evidence"] == "cgroup" and run.results[0]["exit_code"] == 137
    else:                                                  # the data rlimit: malloc failed
        assert d["evidence"] == "stderr" and "MemoryError" in run.content()
    if run.requests:
        assert run.told().split("\n", 1)[0] == line


@pytest.mark.parametrize("provider", PROVIDERS)
def test_disk_grant(kovl, target, tmp_path, provider):
    run = agent(kovl, target, tmp_path, provider, [
        ("shell", {"command": "head -c 3000000 /dev/zero > big"}),
        ("shell", {"command": "echo never runs"})], "--limit", "disk_mb=1")
    # crossing the disk grant ends the run: the line is the call's last word, recorded for the
    # transcript and the workspace; no next request is made (resume is refused too)
    d = assert_told(run, "blocked: the session crossed its disk grant (disk_mb=1): nothing "
                    "more can run in it", "disk", next_request=False, rc=run.proc.returncode)
    assert run.proc.returncode != 0 and "done limit" in run.proc.out
    assert (d["grant"], d["value"], d["evidence"]) == ("disk_mb", 1, "record")
    assert run.results[0]["exit_code"] == 122
    assert run.events[-1]["reason"] == "limit"
    if run.requests:
        assert len(run.requests) == 1
    not_run = [e for e in run.events if e["type"] == "tool_result" and e.get("not_run")]
    assert len(not_run) == 1 and "denial" not in not_run[0]      # it says so in its own words


@pytest.mark.parametrize("provider", PROVIDERS)
def test_trace_records_explain_what_stderr_does_not(kovl, target, tmp_path, provider):
    require_tool("strace")
    run = agent(kovl, target, tmp_path, provider, [
        ("shell", {"command": "mknod whiteout c 0 0"}),        # says only "Operation not permitted"
        ("shell", {"command": "getent hosts example.com"}),    # says nothing at all
        ("shell", {"command": "mknod fifo p"})], "--trace", "strace")
    d = assert_told(run, "blocked by the sandbox: mknodat(2) of a 0/0 character device (an overlay "
                    "whiteout) is refused by the seccomp filter", "seccomp")
    assert d["evidence"] == "trace"
    d = assert_told(run, "blocked: no network in this session (net=none)", "network", i=1)
    assert d["evidence"] == "trace"
    assert run.results[2]["exit_code"] == 0 and "denial" not in run.results[2]


def test_a_path_naming_a_flag_earns_no_trace_cause(kovl, target, tmp_path):
    """mv's renameat2(..., "RENAME_WHITEOUT", RENAME_NOREPLACE) fails (EEXIST): the flag is
    only in the path the program chose, so the record's flags field says no whiteout."""
    require_tool("strace")
    run = agent(kovl, target, tmp_path, "scripted", [
        ("shell", {"command": "mkdir -p a RENAME_WHITEOUT/x && mv -T a RENAME_WHITEOUT"})],
        "--trace", "strace")
    assert run.proc.returncode == 0, (run.proc.out, run.proc.err)
    assert run.results[0]["exit_code"] == 1 and "Directory not empty" in run.content(0)
    assert_no_denial(run)


# -- negatives ----------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_ordinary_failures_get_no_line(kovl, target, tmp_path, provider):
    private = tmp_path / "host-only.txt"          # on the host's /tmp; the jail's /tmp is private
    private.write_text("not in the jail\n")
    run = agent(kovl, target, tmp_path, provider, [
        ("shell", {"command": "cat missing.txt"}),
        ("read_file", {"path": "missing.txt"}),
        ("shell", {"command": f"{PY} -c 'assert 1 == 2, \"a failing test\"'"}),
        ("shell", {"command": "ls /usr/share/overlord-no-such-dir"}),
        ("shell", {"command": f"cat {private}"}),
        ("shell", {"command": "ulimit -n 999999"}),         # EPERM, but not the filter's
        ("edit_file", {"path": "hello.txt", "old": "absent", "new": "x"})])
    assert_no_denial(run)
    assert run.results[4]["exit_code"] != 0 and "No such file" in run.content(4)
    assert "Operation not permitted" in run.content(5)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unjailed_sessions_claim_no_jail_cause(kovl, target, tmp_path, provider):
    run = agent(kovl, target, tmp_path, provider, [
        ("shell", {"command": "ls /sys/overlord-no-such-entry"}),      # jailed: "/sys does not exist"
        ("shell", {"command": "unshare -U true"})], "--no-jail")
    assert run.proc.returncode == 0, (run.proc.out, run.proc.err)
    assert "denial" not in run.results[0] and "No such file" in run.content(0)
    # the seccomp filter holds an unjailed session too (its attestation says it was loaded)
    assert_told(run, "blocked by the sandbox: unshare(2) is refused by the seccomp filter",
                "seccomp", i=1)


def test_a_network_message_with_the_network_granted_gets_no_line(kovl, target, tmp_path):
    fake = f"{PY} -c 'raise OSError(101, \"Network is unreachable\")'"
    run = agent(kovl, target, tmp_path, "scripted", [("shell", {"command": fake})], "--net", "host")
    assert_no_denial(run)
    assert "Network is unreachable" in run.content()


@pytest.fixture
def fovl(home):
    from denylib import AgentOvl, require
    require("fuse")
    return AgentOvl(home, "fuse")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_fuse_backend_unjailed(fovl, target, tmp_path, provider):
    """fuse-overlayfs cannot jail: its sessions get the filter's causes, never the jail's."""
    run = agent(fovl, target, tmp_path, provider, [
        ("shell", {"command": "unshare -U true"}),
        ("shell", {"command": "ls /sys/overlord-no-such-entry"})],
        "--no-jail", "--net", "host", "--backend", "fuse")
    assert_told(run, "blocked by the sandbox: unshare(2) is refused by the seccomp filter", "seccomp")
    assert "denial" not in run.results[1] and "No such file" in run.content(1)
    assert fovl.meta(run.sid)["backend"] == "fuse"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_git_directory_the_jail_binds_read_only(kovl, tmp_path, provider):
    """A linked worktree's git directory lies outside the target: the git part binds it
    read-only in the jail (meta["git"]["readonly"]) -- a write there is explained, naming it."""
    require_tool("git")
    import subprocess
    main, wt = tmp_path / "main", tmp_path / "wt"
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q", str(main)], check=True, env=env)
    subprocess.run(["git", "-C", str(main), "commit", "-q", "--allow-empty", "-m", "init"], check=True, env=env)
    subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", str(wt)], check=True, env=env)
    common = os.path.realpath(main / ".git")
    run = agent(kovl, wt, tmp_path, provider, [("shell", {"command": f"touch {common}/overlord-probe"})])
    assert run.proc.returncode == 0, (run.proc.out, run.proc.err)
    readonly = (kovl.meta(run.sid).get("git") or {}).get("readonly") or []
    assert common in readonly, f"the jail binds the worktree's common dir read-only (meta git: {readonly})"
    d = assert_told(run, f"blocked: {common} is read-only inside the jail (a git directory "
                    "outside the project)", "readonly")
    assert d["path"] == common and not os.path.exists(f"{common}/overlord-probe")
