"""Provenance: one hashed, attributed record per change, and the --trace syscall flight recorder
that the traced command can neither see nor touch; the command's environment is allowlisted."""
import hashlib
import json
import re
import shlex
import uuid

import pytest

from conftest import SESSION_RE


def sha(data):
    return hashlib.sha256(data).hexdigest()


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_provenance_has_one_record_per_change(ovl, home, target):
    argv = ["sh", "-c", "printf 'more\\n' >> hello.txt; printf 'new\\n' > new.txt; rm sub/a.txt"]
    sid, _ = ovl.run(target, *argv)
    recs = read_jsonl(home / "sessions" / sid / "provenance.jsonl")
    by_path = {r["path"]: r for r in recs}
    assert len(recs) == len(by_path) == 3, recs
    want = {"hello.txt": ("modified", sha(b"hello\n"), sha(b"hello\nmore\n")),
            "new.txt": ("added", None, sha(b"new\n")),
            "sub/a.txt": ("deleted", sha(b"a\n"), None)}
    for path, (kind, before, after) in want.items():
        r = by_path[path]
        assert (r["kind"], r["before"], r["after"]) == (kind, before, after), r
        assert r["layer"] == 0
        assert r["caused_by"]["command"] == shlex.join(argv), r["caused_by"]
    # the diff and the provenance agree
    assert sorted((k, p) for p, (k, _, _) in want.items()) == ovl.diff(sid)


def test_provenance_survives_commit_and_rollback(ovl, home, target):
    marker = uuid.uuid4().hex[:8]
    sid, _ = ovl.sh(target, f"echo {marker} > kept.txt")
    ovl("commit", sid, check=0)
    recs = read_jsonl(home / "sessions" / sid / "provenance.jsonl")
    assert [(r["path"], r["kind"], r["after"]) for r in recs] == \
        [("kept.txt", "added", sha(f"{marker}\n".encode()))]
    assert marker in recs[0]["caused_by"]["command"]
    log = json.loads(ovl("log", "--json", sid, check=0).stdout)
    assert [(c["path"], c["after"]) for c in log["changes"]] == [("kept.txt", sha(f"{marker}\n".encode()))]

    sid2, _ = ovl.sh(target, "rm kept.txt")
    ovl("rollback", sid2, check=0)
    recs2 = read_jsonl(home / "sessions" / sid2 / "provenance.jsonl")
    assert [(r["path"], r["kind"], r["before"], r["after"]) for r in recs2] == \
        [("kept.txt", "deleted", sha(f"{marker}\n".encode()), None)]


def test_a_run_that_writes_nothing_has_no_provenance(ovl, home, target):
    sid, _ = ovl.sh(target, "cat hello.txt >/dev/null")
    path = home / "sessions" / sid / "provenance.jsonl"
    assert not path.exists() or read_jsonl(path) == []
    assert ovl("diff", sid, check=0).out == ""


# -- the flight recorder -----------------------------------------------------------------------

TRACE_FORMS = {
    "bare": ["--trace", "--"],
    "strace": ["--trace", "strace", "--"],
    "equals": ["--trace=strace", "--"],
    "before-target": None,          # run --trace -t T -- cmd
}


@pytest.mark.parametrize("form", sorted(TRACE_FORMS))
def test_trace_records_syscalls(ovl, home, target, form):
    marker = uuid.uuid4().hex[:10]
    cmd = ["sh", "-c", f"echo traced > traced-{marker}.txt; true {marker}"]
    if TRACE_FORMS[form] is None:
        proc = ovl("run", "--trace", "-t", target, "--", *cmd, check=0)
    else:
        proc = ovl("run", "-t", target, *TRACE_FORMS[form], *cmd, check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    recs = read_jsonl(home / "sessions" / sid / "syscalls.jsonl")
    assert recs
    for r in recs:
        assert isinstance(r["pid"], int) and isinstance(r["ts"], float) and r["syscall"], r
    writes = [r for r in recs if r.get("write") is True and f"traced-{marker}.txt" in r.get("path", "")]
    assert writes, "the file write is not in the flight record"
    execs = [r for r in recs if r["syscall"] in ("execve", "execveat") and marker in r.get("args", "")]
    assert execs, "the user's command's execve is not in the flight record"
    log = ovl("log", sid, check=0).out
    m = re.search(r"^syscalls: (\d+)", log, re.M)
    assert m and int(m.group(1)) > 0, log
    assert int(m.group(1)) == len(recs)
    assert json.loads(ovl("log", "--json", sid, check=0).stdout)["syscalls"] == len(recs)
    assert ovl.diff(sid) == [("added", f"traced-{marker}.txt")]


def test_untraced_run_has_no_flight_record(ovl, home, target):
    sid, _ = ovl.sh(target, "echo x > x.txt")
    assert not (home / "sessions" / sid / "syscalls.jsonl").exists()
    assert "syscalls:" not in ovl("log", sid, check=0).out


def test_trace_followed_by_a_word_takes_it_as_the_command(ovl, home, target):
    marker = uuid.uuid4().hex[:10]
    proc = ovl("run", "-t", target, "--trace", "echo", marker, check=0)
    assert proc.out.splitlines()[0] == marker, proc.out
    sid = SESSION_RE.search(proc.out).group(1)
    recs = read_jsonl(home / "sessions" / sid / "syscalls.jsonl")
    assert any(r["syscall"] == "execve" and marker in r.get("args", "") for r in recs)

    proc = ovl("run", "-t", target, "--stack", "--trace", "true", check=0)
    sid2 = SESSION_RE.search(proc.out).group(1)
    log = ovl("log", sid2, check=0).out
    assert re.search(r"^syscalls: [1-9]\d*", log, re.M), log


def test_trace_without_a_command_is_a_usage_error(ovl, home, target):
    proc = ovl("run", "-t", target, "--trace")
    assert proc.returncode == 2, (proc.returncode, proc.err)
    assert proc.err.startswith("overlord: ") and "Traceback" not in proc.err


FD_PROBE = ("for n in 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 63 255; do "
            "[ -e /proc/self/fd/$n ] && echo \"open fd $n -> $(readlink /proc/self/fd/$n)\"; "
            "done; echo probe-done")


@pytest.mark.parametrize("trace", [True, False])
def test_the_command_holds_only_stdio(ovl, target, trace):
    flags = ["--trace"] if trace else []
    _, proc = ovl.sh(target, FD_PROBE, flags=flags)
    assert "probe-done" in proc.out
    assert "open fd" not in proc.out, proc.out


def test_traced_command_cannot_see_the_trace_pipe_via_ls(ovl, target):
    """`ls -l /proc/self/fd` inside a traced run: beyond 0-2 only ls's own directory handle."""
    _, proc = ovl.run(target, "ls", "-l", "/proc/self/fd", flags=["--trace"])
    extra = []
    for line in proc.out.splitlines():
        m = re.search(r"\s(\d+) -> (.*)$", line)
        if m and int(m.group(1)) > 2 and not re.fullmatch(r"/proc/\d+/fd", m.group(2)):
            extra.append(line)
    assert re.search(r"\s2 -> ", proc.out), proc.out
    assert extra == [], proc.out


@pytest.mark.parametrize("trace", [True, False])
def test_the_command_environment_is_allowlisted(ovl, target, trace):
    secret = f"secret-{uuid.uuid4().hex}"
    env = {"ANTHROPIC_API_KEY": secret, "OPENAI_API_KEY": secret, "MY_TOKEN": secret,
           "LANG": "C.UTF-8"}
    flags = ["--trace"] if trace else []
    _, proc = ovl.sh(target, "env; echo env-done", flags=flags, env=env)
    assert "env-done" in proc.out
    names = {line.split("=", 1)[0] for line in proc.out.splitlines() if "=" in line}
    assert "OVERLORD_HOME" not in names, proc.out
    assert not names & {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "MY_TOKEN"}, proc.out
    assert secret not in proc.out
    assert "PATH" in names
