"""The tools inside a real jailed session (scripted model): containment of paths, including
through a symlink an earlier shell call planted; contents over stdin; output caps; which calls
make savepoints; the jail-by-default beacon; timeouts; the backend refusals."""
import os
import time

from agentlib import call, kovl, of_type, require, results, tree, AgentOvl  # noqa: F401


def run_calls(kovl, target, tmp_path, calls, *flags, **kw):
    sid, proc = kovl.scripted(target, tmp_path, [{"tool_calls": calls}, {"text": "done"}], *flags, **kw)
    assert proc.returncode == 0, (proc.out, proc.err)
    events = kovl.events(sid)
    return sid, [results(events)[c["call"]] for c in of_type(events, "tool_call")], proc


def test_paths_that_lead_outside_are_refused(kovl, target, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("operator file\n")
    before = tree(target)
    sid, res, _ = run_calls(kovl, target, tmp_path, [
        call("read_file", path="../outside.txt"),
        call("read_file", path=str(outside)),
        call("write_file", path=str(target / "inside.txt"), content="absolute but inside\n"),
        call("shell", command=f"ln -s /etc etc-link; ln -s .. up; ln -s {outside} out-link"),
        call("read_file", path="etc-link/hostname"),
        call("write_file", path="up/escape.txt", content="x"),
        call("write_file", path="out-link", content="overwritten"),
        call("edit_file", path="out-link", old="operator", new="agent"),
        call("list_dir", path="etc-link"),
        call("search", pattern="root", path="etc-link"),
        call("list_dir", path="."),
    ])
    refused = [0, 1, 4, 5, 6, 7, 8, 9]
    for i in refused:
        r = res[i]["result"]
        assert r["is_error"] and "refused" in r["content"] and "outside the project" in r["content"], (i, r)
        assert res[i]["layer"] is None
    assert not res[2]["result"]["is_error"] and res[3]["exit_code"] == 0
    listing = res[10]["result"]["content"].splitlines()
    assert "etc-link -> /etc" in listing and "inside.txt  20" in listing and "sub/" in listing
    assert outside.read_text() == "operator file\n"
    assert not (tmp_path / "escape.txt").exists()
    assert tree(target) == before
    assert sorted(p for _, p in kovl.diff(sid)) == ["etc-link", "inside.txt", "out-link", "up"]


def test_file_tools_round_trip_large_contents_over_stdin(kovl, target, tmp_path):
    big = "".join(f"line {i} {'x' * 60}\n" for i in range(40000))          # ~2.7 MB: not argv
    sid, res, _ = run_calls(kovl, target, tmp_path, [
        call("write_file", path="deep/dir/big.txt", content=big),
        call("edit_file", path="deep/dir/big.txt", old="line 20000 ", new="LINE 20000 "),
        call("write_file", path="twice.txt", content="x = 1\nx = 1\n"),
        call("edit_file", path="twice.txt", old="x = 1", new="x = 2"),
        call("edit_file", path="twice.txt", old="nope", new=""),
        call("edit_file", path="twice.txt", old="x = 1\nx = 1", new="x = 2"),
        call("shell", command="sha256sum deep/dir/big.txt; cat twice.txt"),
        call("read_file", path="deep/dir/big.txt"),
        call("read_file", path="missing.txt"),
        call("read_file", path="deep"),
    ])
    assert [r["layer"] for r in res[:6]] == [0, 1, 2, None, None, 3]
    assert "occurs 2 times" in res[3]["result"]["content"] and res[3]["result"]["is_error"]
    assert "does not occur" in res[4]["result"]["content"]
    import hashlib
    want = hashlib.sha256(big.replace("line 20000 ", "LINE 20000 ").encode()).hexdigest()
    out = res[6]["result"]["content"]
    assert want in out and "x = 2\n" in out
    head = res[7]["result"]["content"]
    assert res[7]["truncated"] and head.startswith("line 0 ") and "line 39999" in head
    assert "middle was left out" in head and len(head) < 40 << 10
    assert "no such file" in res[8]["result"]["content"]
    assert "is a directory" in res[9]["result"]["content"]


def test_reading_tools_make_no_savepoint_and_search_finds(kovl, target, tmp_path):
    sid, res, _ = run_calls(kovl, target, tmp_path, [
        call("list_dir", path="sub"),
        call("read_file", path="hello.txt"),
        call("search", pattern="^(hel|a)"),
        call("search", pattern="zzz-not-there", path="sub"),
        call("search", pattern="(", path="."),
        call("shell", command="cat hello.txt >/dev/null"),
    ])
    assert all(r["layer"] is None for r in res)
    assert kovl("savepoints", sid, check=0).out == ""
    assert res[0]["result"]["content"] == "a.txt  2"
    assert res[1]["result"]["content"] == "hello\n"
    assert "hello.txt:1:hello" in res[2]["result"]["content"] and "sub/a.txt:1:a" in res[2]["result"]["content"]
    assert res[3]["result"]["content"] == "no matches"
    assert res[4]["result"]["is_error"]


def test_shell_output_is_capped_head_and_tail(kovl, target, tmp_path):
    _, res, _ = run_calls(kovl, target, tmp_path, [
        call("shell", command="seq 1 300000; echo to-stderr >&2; exit 3")])
    r = res[0]
    text = r["result"]["content"]
    assert r["truncated"] and r["exit_code"] == 3 and text.startswith("exit code: 3")
    assert "\n1\n2\n3\n" in text and "300000" in text and "to-stderr" in text
    assert len(text) < 80 << 10


def test_jailed_and_offline_by_default(kovl, target, tmp_path):
    """The beacon: a scripted agent's shell call sees OVERLORD_JAIL=1, HOME=/tmp, no
    OVERLORD_HOME and no network."""
    _, res, _ = run_calls(kovl, target, tmp_path, [call("shell", command=(
        f"echo JAIL=$OVERLORD_JAIL HOME=$HOME; env | grep -c OVERLORD_HOME; "
        f"ls {kovl.home} 2>&1; echo NET: $(tail -n +3 /proc/net/dev | cut -d: -f1)"))])
    text = res[0]["result"]["content"]
    assert "JAIL=1 HOME=/tmp" in text and "\n0\n" in text
    assert "No such file or directory" in text
    assert "NET: lo\n" in text                      # its own network namespace: loopback only


def test_shell_timeout_kills_the_command(kovl, target, tmp_path):
    started = time.monotonic()
    _, res, _ = run_calls(kovl, target, tmp_path, [call("shell", command="sleep 30", timeout=1)])
    assert time.monotonic() - started < 15
    assert res[0]["timed_out"] and res[0]["result"]["is_error"]
    assert "timed out after 1 s" in res[0]["result"]["content"]


def test_tools_work_from_a_subdirectory_cwd(kovl, target, tmp_path):
    sid, res, _ = run_calls(kovl, target, tmp_path, [
        call("write_file", path="sub/new.txt", content="n\n"),
        call("shell", command="pwd; ls sub")], cwd=target / "sub")
    assert res[1]["result"]["content"].split("stdout:\n")[1].startswith(str(target) + "\n")
    assert ("added", "sub/new.txt") in kovl.diff(sid)


def test_no_jail_warns_and_still_stages(kovl, target, tmp_path):
    before = tree(target)
    sid, res, proc = run_calls(kovl, target, tmp_path, [
        call("shell", command="echo JAIL=${OVERLORD_JAIL:-unset}; echo x > made.txt")], "--no-jail")
    assert "WARNING: --no-jail" in proc.err
    assert "JAIL=unset" in res[0]["result"]["content"]
    assert tree(target) == before and kovl.diff(sid) == [("added", "made.txt")]
    system = of_type(kovl.events(sid), "system")[0]["prompt"]
    assert "cooperative, no jail" in system


def test_fuse_backend_refuses_the_jail_and_says_what_to_pass(home, target, tmp_path):
    require("fuse")
    fovl = AgentOvl(home, "fuse")
    _, proc = fovl.scripted(target, tmp_path, [{"text": "hi"}], "--backend", "fuse")
    assert proc.returncode == 1 and "pass --no-jail" in proc.err and "Traceback" not in proc.err
    _, proc = fovl.scripted(target, tmp_path, [{"text": "hi"}], "--backend", "fuse", "--no-jail")
    assert proc.returncode == 1 and "--net host" in proc.err
    assert fovl("sessions", check=0).out == ""             # refused before anything opened
    # cooperative, unjailed, with the network: the tools still work through the overlay
    sid, proc = fovl.scripted(target, tmp_path, [
        {"tool_calls": [call("write_file", path="f.txt", content="fuse\n"),
                        call("read_file", path="f.txt"), call("shell", command="ls")]},
        {"text": "ok"}], "--backend", "fuse", "--no-jail", "--net", "host", cwd=target / "sub")
    assert proc.returncode == 0, proc.err
    res = list(results(fovl.events(sid)).values())
    assert res[1]["result"]["content"] == "fuse\n" and "f.txt" in res[2]["result"]["content"]
    assert fovl.diff(sid) == [("added", "f.txt")] and not (target / "f.txt").exists()


def test_conditions_block_and_the_own_source_clause(kovl, target, tmp_path):
    sid, _, _ = run_calls(kovl, target, tmp_path, [], "--system", "Prefer small commits.")
    system = of_type(kovl.events(sid), "system")[0]
    text = system["prompt"]
    for fact in ("`scripted-test`", "a jail", str(target), "Network: none", "600 s",
                 "Everything is recorded", "Prefer small commits."):
        assert fact in text, fact
    assert "OVERLORD's own source" not in text
    assert [t["name"] for t in system["tools"]] == ["list_dir", "read_file", "write_file",
                                                    "edit_file", "search", "shell", "remember"]
    own = tmp_path / "checkout"
    for rel in ("overlord/ops/__init__.py", "overlord/sandbox/jail.py", "overlord/agent/loop.py"):
        os.makedirs(own / os.path.dirname(rel), exist_ok=True)
        (own / rel).write_text("")
    sid, _, _ = run_calls(kovl, own, tmp_path, [])
    assert "OVERLORD's own source code" in of_type(kovl.events(sid), "system")[0]["prompt"]


def test_audit_preset(kovl, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [{"text": "Every probe held: a clean audit."}],
                              "--audit", task="focus on /proc")
    assert proc.returncode == 0, proc.err
    meta = kovl.meta(sid)
    assert meta["audit"] is True and meta["agent"]["audit"] is True and meta["grants"]["jail"]
    task = of_type(kovl.events(sid), "task")[0]
    assert task["audit"] and "Authorized containment audit" in task["text"]
    assert "failing red-team check" in task["text"] and "clean audit is a result" in task["text"]
    assert task["text"].endswith("focus on /proc")
    _, proc = kovl.scripted(target, tmp_path, [{"text": "x"}], "--audit", "--no-jail")
    assert proc.returncode == 2 and "--audit needs the jail" in proc.err


def test_errors_are_one_line_and_open_nothing(kovl, target, tmp_path):
    proc = kovl("agent", "-t", target, "--provider", "scripted", "--script", tmp_path / "none.json")
    assert proc.returncode == 2 and proc.err.startswith("overlord: give the agent a task")
    proc = kovl("agent", "-t", target, "--provider", "anthropic", "--model", "m", "x",
                env={"ANTHROPIC_API_KEY": ""})
    assert proc.returncode == 1 and "no key for anthropic" in proc.err
    proc = kovl("agent", "-t", target, "--provider", "anthropic", "x")
    assert proc.returncode == 2 and "pass --model" in proc.err
    assert kovl("sessions", check=0).out == ""
    sid, proc = kovl.scripted(target, tmp_path, [{"error": "the endpoint is down"}])
    assert proc.returncode == 1 and "Traceback" not in proc.err
    assert proc.err.strip() == "overlord: scripted: the endpoint is down"
    assert "done error" in proc.out and kovl.events(sid)[-1]["reason"] == "error"


def test_crossing_the_disk_grant_stops_the_run_with_limit(kovl, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [
        {"tool_calls": [call("shell", command="head -c 8000000 /dev/zero > big.bin"),
                        call("write_file", path="after.txt", content="never")]},
        {"text": "unreachable"}], "--limit", "disk_mb=2")
    assert proc.returncode == 1 and "done limit" in proc.out, (proc.out, proc.err)
    res = list(results(kovl.events(sid)).values())
    assert res[1]["not_run"] and "disk grant" in res[1]["result"]["content"]
    assert kovl.meta(sid)["limit"] == "disk_mb" and kovl.events(sid)[-1]["reason"] == "limit"
    proc = kovl("resume", sid, "--note", "again")
    assert proc.returncode == 1 and "crossed its disk_mb grant" in proc.err


def test_a_huge_directory_listing_is_capped(kovl, target, tmp_path):
    _, res, _ = run_calls(kovl, target, tmp_path, [
        call("shell", command="mkdir many && cd many && seq -f 'file-%06g' 1 20000 | xargs touch"),
        call("list_dir", path="many")])
    text = res[1]["result"]["content"]
    assert res[1]["truncated"] and text.endswith("[more entries were left out]")
    assert len(text) < 40 << 10 and "file-" in text and "  0" in text
