"""`--json` as scripts meet it: the run family's one JSON line after the command's output, and
one vocabulary across every command (docs/JSON.md)."""
import base64
import json
import os
import re

import pytest

from conftest import SESSION_RE, require_tool

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
# maps keyed by data, not field names: kinds, backend and tool names, selectors, xattr names...
DATA_KEYS = {"counts", "tools", "backends", "containment", "limits", "env"}
KINDS = {"added", "modified", "deleted", "replaced-dir", "invalid-whiteout"}
RESULT_KEYS = {"sid", "state", "exit_code", "timed_out", "layer", "changes", "counts", "notes",
               "syscalls"}


def strict(raw):
    """Parse as a strict parser would: UTF-8, and no lone surrogate (escaped or not)."""
    text = raw.decode("utf-8")
    assert not re.search(r"\\ud[89a-f][0-9a-f]{2}", text, re.I), f"lone surrogate in {text!r}"
    return json.loads(text)


def last_line(proc):
    """The run family's --json: the last line of stdout is one JSON object."""
    lines = proc.stdout.rstrip(b"\n").split(b"\n")
    return strict(lines[-1]), b"\n".join(lines[:-1])


def field_names(value, path="$"):
    """Every (json path, field name) in value, not descending into maps keyed by data."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path, k
            if k not in DATA_KEYS:
                yield from field_names(v, f"{path}.{k}")
    elif isinstance(value, list):
        for v in value:
            yield from field_names(v, f"{path}[]")


def assert_vocabulary(data, what):
    bad = [(p, k) for p, k in field_names(data) if not SNAKE.match(k)]
    assert not bad, f"{what}: keys that are not snake_case: {bad}"


def check_result(data, sid=None, state=None):
    assert RESULT_KEYS <= set(data), sorted(data)
    if sid:
        assert data["sid"] == sid
    if state:
        assert data["state"] == state
    assert set(data["counts"]) == KINDS
    assert sum(data["counts"].values()) == len(data["changes"])
    for ch in data["changes"]:
        assert {"path", "kind", "layer", "details"} <= set(ch) and ch["kind"] in KINDS, ch
    assert_vocabulary(data, "result")


def test_run_json_is_one_line_after_the_command_output(ovl, target):
    proc = ovl("run", "--json", "-t", target, "--", "sh", "-c",
               "echo out; echo x > x.txt; printf partial; exit 3", check=3)
    data, before = last_line(proc)
    assert before == b"out\npartial", proc.stdout
    assert not SESSION_RE.search(proc.out), "--json replaces the session line"
    check_result(data, state="pending")
    assert data["exit_code"] == 3 and data["timed_out"] is False and data["layer"] == 0
    assert [(c["path"], c["kind"], c["layer"]) for c in data["changes"]] == [("x.txt", "added", 0)]
    assert data["changes"][0]["details"]["type"] == "file"
    assert data["counts"]["added"] == 1
    assert f"unjailed: writes outside {target} are not captured" in data["notes"]
    assert json.loads(ovl("log", "--json", data["sid"], check=0).out)["sid"] == data["sid"]

    proc = ovl("run", "--json", "-t", target, "--stack", "--timeout", "0.5", "--", "sleep", "30",
               check=124)
    data, _ = last_line(proc)
    check_result(data, state="unchanged")
    assert data["timed_out"] is True and data["exit_code"] == 124 and data["layer"] is None


def test_exec_fork_revert_and_shell_json(ovl, target):
    data, _ = last_line(ovl("run", "--json", "-t", target, "--", "sh", "-c", "echo 1 > one", check=0))
    sid = data["sid"]
    proc = ovl("exec", "--json", sid, "--", "sh", "-c", "echo out; echo 2 > two; exit 4", check=4)
    data, before = last_line(proc)
    assert before == b"out"
    check_result(data, sid=sid, state="pending")
    assert data["layer"] == 1 and data["exit_code"] == 4
    assert sorted((c["path"], c["layer"]) for c in data["changes"]) == [("one", 0), ("two", 1)]
    data, _ = last_line(ovl("exec", "--json", sid, "--", "true", check=0))
    assert data["layer"] is None

    data, before = last_line(ovl("fork", "--json", sid, "--at", "0", check=0))
    assert before == b""
    check_result(data, state="pending")
    assert data["sid"] != sid and data["forked_from"] == {"sid": sid, "layer": 0}
    assert [c["path"] for c in data["changes"]] == ["one"]
    ovl("rollback", data["sid"], check=0)

    ovl("commit", sid, check=0)
    data, _ = last_line(ovl("revert", "--json", sid, check=0))
    check_result(data, state="pending")
    assert data["reverts"] == sid and data["layer"] == 0
    assert sorted((c["path"], c["kind"]) for c in data["changes"]) == [("one", "deleted"), ("two", "deleted")]
    ovl("rollback", data["sid"], check=0)

    proc = ovl("shell", "--json", "-t", target, input=b"echo s > s.txt\n", check=0)
    data, _ = last_line(proc)
    check_result(data, state="pending")
    assert [c["path"] for c in data["changes"]] == ["s.txt"]


def test_agent_json(ovl, target, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"model": "scripted-test", "turns": [
        {"tool_calls": [{"name": "write_file", "input": {"path": "a.md", "content": "hi\n"}}]},
        {"text": "done"}]}))
    flags = ["--no-jail", "--net", "host"] if ovl.backend == "fuse" else []
    proc = ovl("agent", "--json", "-t", target, "--provider", "scripted", "--script", script,
               *flags, "write a.md", check=0)
    data, _ = last_line(proc)
    check_result(data, state="pending")
    assert data["exit_code"] == 0 and data["reason"] == "end_turn" and data["turns"] == 2
    assert [(c["path"], c["kind"]) for c in data["changes"]] == [("a.md", "added")]


def test_names_that_are_not_utf8_come_escaped_with_their_bytes(ovl, tmp_path):
    tgt = os.path.join(os.fsencode(str(tmp_path)), b"t\xffg")
    os.mkdir(tgt)
    target = os.fsdecode(tgt)
    script = r'printf x > "$(printf "b\377d")"; ln -s "$(printf "/l\376nk")" link'
    proc = ovl("run", "--json", "-t", target, "--", "sh", "-c", script, check=0)
    data, _ = last_line(proc)
    rows = {base64.b64decode(c["path_b64"]) if "path_b64" in c else os.fsencode(c["path"]): c
            for c in data["changes"]}
    assert set(rows) == {b"b\xffd", b"link"}
    assert rows[b"b\xffd"]["path"] == "b\\xffd"
    details = rows[b"link"]["details"]
    assert base64.b64decode(details["link_b64"]) == b"/l\xfenk" and details["link"] == "/l\\xfenk"
    sid = data["sid"]
    for args in (["diff", "--json", sid], ["log", "--json", sid], ["sessions", "--json"],
                 ["savepoints", "--json", sid], ["diff", "--json", "--patch", sid]):
        out = strict(ovl(*args, check=0).stdout)
        assert_vocabulary(out, args[0])
    sessions = strict(ovl("sessions", "--json", check=0).stdout)
    mine = [s for s in sessions if s["sid"] == sid][0]
    assert base64.b64decode(mine["target_b64"]) == tgt and mine["target"] == os.fsdecode(tgt).replace(
        "\udcff", "\\xff")
    odd, _ = ovl.run(target, "touch", os.fsdecode(b"odd\xffname"), flags=["--stack"])
    sessions = strict(ovl("sessions", "--json", check=0).stdout)
    mine = [s for s in sessions if s["sid"] == odd][0]
    assert base64.b64decode(mine["command_b64"]) == b"touch 'odd\xffname'", mine


def test_one_name_per_concept(ovl, target, home):
    """A savepoint number is `layer`, a cause `caused_by`, in every command; enum values have
    no spaces; every field name is snake_case."""
    sid, _ = ovl.sh(target, "echo a > a.txt")
    ovl("exec", sid, "--", "sh", "-c", "echo b > b.txt", check=0)
    fork = SESSION_RE.search(ovl("fork", sid, "--at", "0", check=0).out).group(1)
    ovl("exec", fork, "--", "sh", "-c", "echo c > c.txt", check=0)

    points = json.loads(ovl("savepoints", "--json", sid, check=0).out)
    assert [p["layer"] for p in points] == [0, 1]
    assert all("n" not in p and "cause" not in p for p in points), points
    assert "echo b > b.txt" in points[1]["caused_by"]["command"]
    log = json.loads(ovl("log", "--json", sid, check=0).out)
    assert {c["path"]: c["layer"] for c in log["changes"]} == {"a.txt": 0, "b.txt": 1}
    assert log["changes"][1]["caused_by"] == points[1]["caused_by"]
    assert set(log) == {"sid", "syscalls", "changes", "dropped"}

    compare = json.loads(ovl("compare", "--json", sid, fork, check=0).out)
    assert {r["path"]: r["status"] for r in compare} == {"a.txt": "same", "b.txt": "only-in-a",
                                                         "c.txt": "only-in-b"}
    sessions = json.loads(ovl("sessions", "--json", check=0).out)
    assert [s for s in sessions if s["sid"] == fork][0]["forked_from"] == {"sid": sid, "layer": 0}
    doctor = json.loads(ovl("doctor", "--json", check=0).out)
    for name, what in (("savepoints", points), ("log", log), ("compare", compare),
                       ("sessions", sessions), ("doctor", doctor),
                       ("diff", json.loads(ovl("diff", "--json", sid, check=0).out))):
        assert_vocabulary(what, name)
    assert all(" " not in name for name in doctor["containment"]), doctor["containment"]
    for s in sessions:
        assert " " not in s["state"]


def test_syscalls_json(ovl, target):
    require_tool("strace")
    sid, _ = ovl.run(target, "sh", "-c", "echo t > t.txt", flags=["--trace"])
    data = strict(ovl("syscalls", "--json", sid, check=0).stdout)
    assert data["syscalls"] == len(data["syscall_records"]) > 0
    assert any(r.get("write") and r.get("path", "").endswith("t.txt") for r in data["syscall_records"])
    log = strict(ovl("log", "--json", "--syscalls", sid, check=0).stdout)
    assert log["syscalls"] == data["syscalls"] and log["syscall_records"] == data["syscall_records"]
    assert_vocabulary(data, "syscalls")
