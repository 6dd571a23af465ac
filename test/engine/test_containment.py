"""Containment grants at the CLI: limits, the eBPF recorder, doctor, the jail's own view."""
import json
import os
import shutil
import stat

import pytest

from conftest import REPO, SESSION_RE, Ovl


def sessions_in(home):
    d = home / "sessions"
    return sorted(os.listdir(d)) if d.exists() else []


def one_line_error(proc, code):
    assert proc.returncode == code, (proc.returncode, proc.out, proc.err)
    lines = proc.err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err


@pytest.mark.parametrize("flags", [["--limit", "bogus=1"], ["--limit", "pids=-1"], ["--limit", "pids"],
                                   ["--limit", "pids=many"], ["--net", "sideways"]])
def test_bad_grants_are_refused_before_anything_runs(ovl, home, target, flags):
    proc = ovl("run", "-t", target, *flags, "--", "touch", "ran")
    one_line_error(proc, 2)
    assert sessions_in(home) == [] and not (target / "ran").exists()


def test_manifest_limits_are_checked(ovl, home, target, tmp_path):
    cap = tmp_path / "cap.json"
    cap.write_text(json.dumps({"limits": {"pids": 64, "swap_mb": 1}}))
    proc = ovl("run", "-t", target, "--manifest", cap, "--", "true")
    one_line_error(proc, 2)
    assert "swap_mb" in proc.err and sessions_in(home) == []


def test_rlimits_reach_the_command_and_flags_override_the_manifest(ovl, target, tmp_path):
    cap = tmp_path / "cap.json"
    cap.write_text(json.dumps({"limits": {"pids": 100, "nofile": 64}}))
    sid, proc = ovl.run(target, "bash", "-c", "ulimit -u; ulimit -n; ulimit -f",
                        flags=["--manifest", cap, "--limit", "pids=77", "--limit", "fsize_mb=1"])
    assert proc.out.split()[:3] == ["77", "64", "1024"], proc.out      # bash: -f in KiB
    meta = json.loads((ovl.home / "sessions" / sid / "meta.json").read_text())
    assert meta["grants"]["limits"] == {"pids": 77, "nofile": 64, "fsize_mb": 1}
    assert "enforcement" in meta and meta["enforcement"]["rlimits"] is True


def test_file_size_grant_stops_a_big_write(ovl, target):
    sid, proc = ovl.sh(target, "head -c 3000000 /dev/zero > big; echo rc=$?",
                       flags=["--limit", "fsize_mb=1"])
    assert "rc=0" not in proc.out
    assert (ovl.home / "sessions" / sid).exists()


def test_disk_grant_ends_the_session(ovl, home, target):
    sid, proc = ovl.sh(target, "head -c 5000000 /dev/zero > a; head -c 5000000 /dev/zero > b",
                       flags=["--limit", "disk_mb=3"], check=122)
    meta = json.loads((home / "sessions" / sid / "meta.json").read_text())
    assert meta["limit"] == "disk_mb"
    assert ("added", "a") in ovl.diff(sid)          # what was written stays for review
    ovl("commit", sid, check=0)
    assert (target / "a").exists()


def test_doctor_reports_the_containment_layers(ovl):
    out = ovl("doctor").out
    for layer in ("jail:", "net none:", "hardening:", "rlimits:", "cgroup:", "disk watch:",
                  "trace strace:", "trace ebpf:"):
        assert any(line.startswith(layer) for line in out.splitlines()), (layer, out)
    data = json.loads(ovl("doctor", "--json").out)
    assert data["containment"]["rlimits"]["available"] is True
    assert data["containment"]["jail"]["available"] is (ovl.backend == "kernel" or
                                                        data["backends"]["kernel"]["available"])


def test_ebpf_recorder_records_or_refuses_cleanly(home, target):
    ovl = Ovl(home, "kernel")
    marker = "ebpf-ran"
    proc = ovl("run", "--trace", "ebpf", "-t", target, "--", "sh", "-c", f"echo x > {marker}")
    if os.geteuid() != 0:
        one_line_error(proc, 1)
        assert "root" in proc.err and sessions_in(home) == []
        return
    assert proc.returncode == 0, proc.err
    sid = SESSION_RE.search(proc.out).group(1)
    records = [json.loads(l) for l in (home / "sessions" / sid / "syscalls.jsonl").read_text().splitlines()]
    assert any(r["syscall"] == "execve" and r.get("path", "").endswith("/sh") for r in records)
    assert any(r.get("write") and r.get("path") == marker for r in records)
    assert f"syscalls: {len(records)} recorded" in ovl("log", sid).out


def test_ebpf_recorder_that_cannot_attach_runs_nothing(home, target, tmp_path):
    """A bpftrace that fails: the workload never runs, no process, no session left."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bpftrace").write_text("#!/bin/sh\necho 'ERROR: cannot attach' >&2\nexit 1\n")
    os.chmod(fake / "bpftrace", 0o755)
    ovl = Ovl(home, "kernel")
    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    proc = ovl("run", "--trace", "ebpf", "-t", target, "--", "touch", "workload-ran", env=env)
    one_line_error(proc, 1)
    assert not (target / "workload-ran").exists() and sessions_in(home) == []
    assert not any(home.glob("sessions/*/*/workload-ran"))


def test_jail_hides_the_session_records_even_named_from_mountinfo(home, target):
    ovl = Ovl(home, "kernel")
    probe = ("grep -o 'upperdir=[^,]*' /proc/self/mountinfo | head -1 | cut -d= -f2 > seen.txt; "
             f"ls -d {home} $(cat seen.txt) 2>&1 | tee out.txt; test ! -e {home}")
    sid, proc = ovl.sh(target, probe, flags=["--jail", "--net", "none"])
    assert str(home) in proc.out and "No such file or directory" in proc.out


def test_doctor_inside_a_jail_says_so_first(home, tmp_path):
    target = tmp_path / "proj"
    shutil.copytree(os.path.join(REPO, "overlord"), target / "overlord")
    ovl = Ovl(home, "kernel")
    sid, proc = ovl.run(target, "python3", "-m", "overlord", "doctor", flags=["--jail"], check=None)
    first = proc.out.splitlines()[0]
    assert first.startswith("inside an OVERLORD jail"), proc.out
    assert "kernel backend: unavailable" in proc.out


def test_jail_environment_and_home(home, target):
    ovl = Ovl(home, "kernel")
    sid, proc = ovl.sh(target, "echo HOME=$HOME JAIL=$OVERLORD_JAIL; ls -d /root /home /mnt /srv /run 2>&1 | wc -l",
                       flags=["--jail"], env={"ANTHROPIC_API_KEY": "k"})
    assert "HOME=/tmp JAIL=1" in proc.out
    assert stat.S_ISDIR(os.stat(target).st_mode)
