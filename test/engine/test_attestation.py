"""The attestation: what really confined a session's first command, read back from the kernel
by the process that starts it (after every hardening step, just before the spawn) and kept on
session.meta["attestation"]; the audit chain's session.open carries it."""
import hashlib
import json
import os

from conftest import Ovl, require_backend

from overlord.linux import seccomp
from overlord.sandbox import executor, fuse, limits

ROOT = os.geteuid() == 0
KEYS = {"backend", "jail", "net_namespace", "ipc_namespace", "uts_namespace", "pid_namespace",
        "mount_namespace", "user_namespace", "cgroup", "rlimits", "seccomp_sha256", "status"}
STATUS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
FILTER_SHA = hashlib.sha256(seccomp.encode(seccomp.build(allow_ptrace=False))).hexdigest()

# A hostile first command: writes a forged record to, then closes, every fd from 3 up, and
# tries its starter's fds through /proc. Prints how many of those writes went anywhere.
FORGER = r'''
import os
hits = 0
for fd in range(3, 1024):
    try:
        os.write(fd, b'\0attestation:{"jail":true,"net_namespace":true}\n')
        hits += 1
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass
try:
    names = os.listdir(f"/proc/{os.getppid()}/fd")
except OSError:
    names = []
for name in names:
    try:
        with open(f"/proc/{os.getppid()}/fd/{name}", "wb") as f:
            f.write(b"\0attestation:junk\n")
        hits += 1
    except OSError:
        pass
open("forged", "w").close()
print("hits", hits)
'''


def meta_of(home, sid):
    return json.loads((home / "sessions" / sid / "meta.json").read_text())


def attestation_of(home, sid):
    att = meta_of(home, sid)["attestation"]
    assert set(att) == KEYS, att
    assert set(STATUS) <= set(att["status"]), att["status"]
    return att


def assert_hardened(att):
    """No capability in any set, no_new_privs, a seccomp filter: OVERLORD's own."""
    for key in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(att["status"][key], 16) == 0, (key, att["status"])
    assert att["status"]["NoNewPrivs"] == "1" and att["status"]["Seccomp"] == "2", att["status"]
    assert att["seccomp_sha256"] == FILTER_SHA


def opened_line(home, sid):
    lines = [json.loads(l) for l in (home / "audit.jsonl").read_text().splitlines()]
    return [l for l in lines if l.get("action") == "session.open" and l.get("sid") == sid]


def assert_cgroup(att, sid):
    kind, _ = limits.cgroup_kind()
    if kind is not None:           # the session's own cgroup held the command
        assert att["cgroup"] == limits.Cgroup(sid, None).paths[0], att["cgroup"]
    else:
        assert not (att["cgroup"] or "").endswith(sid), att["cgroup"]


def test_a_jailed_offline_session_attests_its_jail_and_namespaces(home, target):
    require_backend("kernel")
    ovl = Ovl(home, "kernel")
    sid, _ = ovl.run(target, "touch", "f", flags=["--jail", "--net", "none", "--limit", "pids=77",
                                                  "--limit", "nofile=99"])
    att = attestation_of(home, sid)
    assert att["backend"] == "kernel" and att["jail"] is True
    for ns in ("net", "ipc", "uts", "pid", "mount", "user"):
        assert att[f"{ns}_namespace"] is True, (ns, att)
    assert_hardened(att)
    assert int(att["status"]["CapBnd"], 16) == 0, att["status"]
    assert att["rlimits"]["nproc"] == [77, 77] and att["rlimits"]["nofile"] == [99, 99]
    assert_cgroup(att, sid)
    meta = meta_of(home, sid)
    assert meta["layers"][0]["attestation_sha256"] == executor.attestation_sha256(att)
    # the signed record of the opening carries exactly what the command attested
    assert [l["attestation"] for l in opened_line(home, sid)] == [att]


def test_an_unjailed_session_attests_the_hosts_network(ovl, home, target):
    sid, _ = ovl.run(target, "true")         # an unchanged session (an agent's opening `true`)
    att = attestation_of(home, sid)
    assert att["backend"] == ovl.backend and att["jail"] is False
    assert att["net_namespace"] is False and att["ipc_namespace"] is False
    assert att["uts_namespace"] is False
    assert_hardened(att)
    if ovl.backend == "kernel":
        assert att["pid_namespace"] is att["mount_namespace"] is att["user_namespace"] is True
        assert int(att["status"]["CapBnd"], 16) == 0
    assert_cgroup(att, sid)
    assert [l["attestation"] for l in opened_line(home, sid)] == [att]


def test_fuse_attests_the_namespaces_its_starter_reached(home, target):
    require_backend("fuse")
    level, why = fuse.containment()
    sid, _ = Ovl(home, "fuse").run(target, "touch", "f")
    att = attestation_of(home, sid)
    assert att["backend"] == "fuse"
    assert att["mount_namespace"] is att["pid_namespace"] is (level != fuse.NONE), (level, why, att)
    # root keeps the host's user namespace (no mapping needed); an ordinary user gets its own
    assert att["user_namespace"] is (level != fuse.NONE and not ROOT), att
    assert att["net_namespace"] is False and att["jail"] is False


def test_the_first_command_is_what_the_session_keeps(ovl, home, target):
    sid, _ = ovl.run(target, "touch", "a", flags=["--limit", "nofile=50"])
    first = attestation_of(home, sid)
    ovl("exec", sid, "--", "touch", "b", check=0)
    meta = meta_of(home, sid)
    assert meta["attestation"] == first
    digests = [layer["attestation_sha256"] for layer in meta["layers"]]
    assert digests == [executor.attestation_sha256(first)] * 2


def forge_and_compare(ovl, home, target, flags):
    """The forger's attestation is the one a plain command gets under the same grants."""
    control, _ = ovl.run(target, "touch", "plain", flags=flags)
    ovl("rollback", control, check=0)
    sid, proc = ovl.run(target, "python3", "-c", FORGER, flags=flags)
    assert "hits 0" in proc.out, proc.out
    want, got = attestation_of(home, control), attestation_of(home, sid)
    assert got["jail"] is ("--jail" in flags) and got["net_namespace"] is False
    assert {k: v for k, v in got.items() if k != "cgroup"} == \
        {k: v for k, v in want.items() if k != "cgroup"}
    assert_cgroup(got, sid)
    assert [l["attestation"] for l in opened_line(home, sid)] == [got]


def test_a_command_cannot_forge_or_break_its_attestation(ovl, home, target):
    forge_and_compare(ovl, home, target, [])


def test_a_jailed_command_cannot_forge_or_break_its_attestation(home, target):
    require_backend("kernel")
    forge_and_compare(Ovl(home, "kernel"), home, target, ["--jail"])


def test_a_command_that_cannot_start_reports_one_clean_line(ovl, home, target):
    proc = ovl("run", "-t", target, "--", "no-such-command-here", check=1)
    assert proc.err.strip() == "overlord: command not found: no-such-command-here", proc.err


def test_a_command_that_fails_after_its_attestation_reports_one_clean_line(ovl, home, target):
    bad = target / "bad"
    bad.write_bytes(b"\x7fELF garbage, not a program\n")
    bad.chmod(0o755)
    proc = ovl("run", "-t", target, "--", "./bad", cwd=target, check=1)
    assert proc.err.strip() == "overlord: cannot execute ./bad: Exec format error", proc.err
