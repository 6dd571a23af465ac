"""Grants: --timeout kills the whole tree and leaves a reviewable session; --manifest sets grants
and flags override it; containment grants a backend cannot honour are refused, not ignored."""
import json
import os
import re
import time
import uuid

import pytest

from conftest import SESSION_RE, state_of

SID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")


def marker():
    """A unique sleep duration: `sleep <marker>` is findable in /proc and in no other test."""
    return "30.%06d" % (uuid.uuid4().int % 1000000)


def sleepers(mark):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if mark.encode() in argv and any(a.endswith(b"sleep") for a in argv[:2]):
            found.append(int(name))
    return found


def session_dirs(home):
    d = home / "sessions"
    return sorted(n for n in os.listdir(d) if SID_RE.match(n)) if d.is_dir() else []


def assert_timed_out_and_reviewable(ovl, target, sid, proc, started, mark):
    elapsed = time.monotonic() - started
    assert proc.returncode == 124, (proc.returncode, proc.out, proc.err)
    assert elapsed < 10, f"--timeout 1 took {elapsed:.1f}s"
    assert sid, proc.out
    assert sleepers(mark) == [], f"sleep {mark} survived the timeout"
    assert state_of(ovl, sid) == "timed-out"
    assert ovl.diff(sid) == [("added", "before.txt")]
    ovl("commit", sid, check=0)
    assert (target / "before.txt").read_text() == "written\n"
    assert state_of(ovl, sid) == "committed"


@pytest.mark.parametrize("shape", ["background", "setsid", "double-fork-setsid", "ignores-term"])
def test_timeout_kills_the_whole_tree(ovl, target, shape):
    m = marker()
    body = {
        "background": f"sleep {m} & sleep {m}",
        "setsid": f"setsid sleep {m} & sleep {m}",
        "double-fork-setsid": f"(setsid sleep {m} &); sleep {m}",
        "ignores-term": f"trap '' TERM INT HUP; (trap '' TERM INT HUP; setsid sleep {m} &); sleep {m}",
    }[shape]
    started = time.monotonic()
    sid, proc = ovl.sh(target, f"echo written > before.txt; {body}", flags=["--timeout", "1"],
                       check=None)
    assert_timed_out_and_reviewable(ovl, target, sid, proc, started, m)


def test_timeout_in_manifest(ovl, target, tmp_path):
    cap = tmp_path / "cap.json"
    cap.write_text(json.dumps({"timeout": 1}))
    m = marker()
    started = time.monotonic()
    sid, proc = ovl.sh(target, f"echo written > before.txt; sleep {m} & sleep {m}",
                       flags=["--manifest", cap], check=None)
    assert "timed out" in proc.out.splitlines()[-1]
    assert_timed_out_and_reviewable(ovl, target, sid, proc, started, m)


def test_flags_override_the_manifest(ovl, target, tmp_path):
    cap = tmp_path / "cap.json"
    cap.write_text(json.dumps({"timeout": 1}))
    sid, proc = ovl.sh(target, "sleep 2; echo done; echo ok > ok.txt",
                       flags=["--manifest", cap, "--timeout", "30"], check=0)
    assert "done" in proc.out.splitlines()
    assert state_of(ovl, sid) == "pending"
    assert ovl.diff(sid) == [("added", "ok.txt")]


def test_a_command_that_finishes_in_time_is_not_timed_out(ovl, target):
    sid, proc = ovl.sh(target, "echo quick; echo q > q.txt", flags=["--timeout", "20"], check=0)
    assert "timed out" not in proc.out
    assert state_of(ovl, sid) == "pending"


def test_background_child_does_not_outlive_a_normal_run(ovl, target):
    m = marker()
    started = time.monotonic()
    sid, _ = ovl.sh(target, f"setsid sleep {m} & sleep {m} & echo bye", check=0)
    assert time.monotonic() - started < 20
    assert sleepers(m) == [], f"sleep {m} outlived its session"
    assert sid


GRANTS = {
    "manifest-jail": ({"jail": True}, [], ("jail",)),
    "manifest-net-none": ({"net": "none"}, [], ("net",)),
    "flag-jail": (None, ["--jail"], ("jail",)),
    "flag-net-none": (None, ["--net", "none"], ("net",)),
    "manifest-both": ({"jail": True, "net": "none", "timeout": 5}, [], ("jail", "net")),
    "flag-over-manifest-net": ({"net": "host"}, ["--net", "none"], ("net",)),
}


@pytest.mark.parametrize("name", sorted(GRANTS))
def test_containment_grants_are_honoured_by_kernel_and_refused_by_fuse(ovl, home, target, tmp_path, name):
    """The kernel backend honours jail and net=none; the cooperative fuse backend refuses them
    (one clear line, nothing ran, no session) rather than pretending."""
    manifest, flags, words = GRANTS[name]
    flags = list(flags)
    if manifest is not None:
        cap = tmp_path / "cap.json"
        cap.write_text(json.dumps(manifest))
        flags += ["--manifest", str(cap)]
    other = tmp_path / "other"
    other.mkdir()
    ovl.sh(other, "echo x > x.txt")          # some state a refused run must not disturb
    before = session_dirs(home)
    made = f"jail-ran-{uuid.uuid4().hex[:8]}"
    proc = ovl("run", "-t", target, *flags, "--", "touch", made)
    if ovl.backend == "kernel":
        assert proc.returncode == 0, (proc.out, proc.err)
        sid = SESSION_RE.search(proc.out).group(1)
        assert ovl.diff(sid) == [("added", made)]
        assert not (target / made).exists()
        return
    assert proc.returncode == 1, (proc.returncode, proc.out, proc.err)
    lines = proc.err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err
    assert any(w in lines[0] for w in words), lines[0]
    assert not SESSION_RE.search(proc.out)
    assert session_dirs(home) == before
    assert not list(home.glob(f"sessions/**/{made}"))
    assert not (target / made).exists()


def test_net_host_is_granted(ovl, target, tmp_path):
    cap = tmp_path / "cap.json"
    cap.write_text(json.dumps({"net": "host"}))
    sid, proc = ovl.sh(target, "echo ok > ok.txt", flags=["--manifest", cap], check=0)
    assert ovl.diff(sid) == [("added", "ok.txt")]


def test_a_timeout_or_limit_the_clock_or_cgroup_cannot_take_is_a_usage_error(ovl, target):
    """NaN, inf and a pids value past PID_MAX_LIMIT used to crash the command half-way."""
    sid, _ = ovl.run(target, "sh", "-c", "echo a > a.txt")
    for value in ("nan", "inf", "1e400"):
        r = ovl("exec", sid, "--timeout", value, "--", "true", check=2)
        assert "timeout must be a positive number" in r.err and "Traceback" not in r.err
    r = ovl("run", "-t", target, "--stack", "--limit", "pids=99999999", "--", "true", check=2)
    assert "pids must be at most 4194304" in r.err
    assert ovl.diff(sid) == [("added", "a.txt")]
