"""Every consequential act of the service layer lands on the audit chain, once, in order, with
its session and target, from whichever face performed it -- and the chain verifies after."""
import json
import os
import pwd

from conftest import SESSION_RE


def chain(home):
    path = home / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def acts(home, sid=None):
    return [(x["action"], x.get("sid")) for x in chain(home) if sid is None or x.get("sid") == sid]


def test_the_life_of_a_session_is_on_the_chain(ovl, home, target):
    sid, _ = ovl.sh(target, "echo one > hello.txt")
    ovl("exec", sid, "--", "sh", "-c", "echo two > b.txt", check=0)
    ovl("exec", sid, "--", "sh", "-c", "echo three > c.txt", check=0)
    ovl("rewind", sid, "--to", "1", check=0)
    fork = SESSION_RE.search(ovl("fork", sid, "--at", "0", check=0).out).group(1)
    ovl("rollback", fork, check=0)
    ovl("commit", sid, check=0)
    revert = SESSION_RE.search(ovl("revert", sid, check=0).out).group(1)
    ovl("rollback", revert, check=0)
    assert acts(home) == [("session.open", sid), ("session.rewind", sid), ("session.fork", fork),
                          ("session.rollback", fork), ("session.commit", sid),
                          ("session.revert", revert), ("session.rollback", revert)]
    lines = chain(home)
    assert [x["seq"] for x in lines] == list(range(1, len(lines) + 1))
    me = f"{os.getuid()}:{pwd.getpwuid(os.getuid()).pw_name}"
    assert {x["actor"] for x in lines} == {me}
    assert all(x["target"] == str(target) for x in lines)
    opened = lines[0]
    assert opened["backend"] == ovl.backend and opened["command"] == "sh -c 'echo one > hello.txt'"
    assert opened["attestation"]["backend"] == ovl.backend
    assert lines[1]["to"] == 1 and lines[1]["dropped"] == 1
    assert lines[2]["forked_from"] == sid and lines[2]["at"] == 0
    assert lines[4]["changes"] == 2 and lines[5]["reverts"] == sid
    assert ovl("audit", "verify", check=0).out.startswith("signed")


def test_a_refused_commit_says_why(ovl, home, target):
    sid, _ = ovl.sh(target, "echo mine > hello.txt")
    (target / "hello.txt").write_text("theirs\n")           # drift
    err = ovl("commit", sid, check=1).err
    line = chain(home)[-1]
    assert line["action"] == "session.commit_refused" and line["sid"] == sid
    assert line["reason"] == err.removeprefix("overlord: ").strip()


def test_timeout_and_limit_are_acts(ovl, home, target):
    sid, _ = ovl.sh(target, "echo x > a; sleep 30", flags=("--timeout", "0.5"), check=None)
    assert acts(home, sid) == [("session.open", sid), ("session.timeout", sid)]
    assert chain(home)[-1]["timeout"] == 0.5
    ovl("rollback", sid, check=0)
    sid, _ = ovl.sh(target, "head -c 3000000 /dev/zero > big", flags=("--limit", "disk_mb=1"),
                    check=None)
    limit = [x for x in chain(home) if x["action"] == "session.limit"]
    assert [(x["sid"], x["grant"], x["value"]) for x in limit] == [(sid, "disk_mb", 1)]


def test_a_command_that_changes_nothing_still_opened_a_session(ovl, home, target):
    proc = ovl("run", "-t", target, "--", "true", check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    assert acts(home) == [("session.open", sid)]


def test_a_bad_key_refuses_the_act_and_names_the_file(ovl, home, target):
    sid, _ = ovl.sh(target, "echo mine > hello.txt")
    key = home / "audit.key"
    os.chmod(key, 0o644)
    before = (target / "hello.txt").read_text()
    err = ovl("commit", sid, check=1).err
    assert str(key) in err and err.count("\n") == 1
    assert (target / "hello.txt").read_text() == before
    err = ovl("run", "-t", target, "--stack", "--", "true", check=1).err
    assert str(key) in err


def test_a_fork_carries_no_verdict_and_attests_its_own_first_command(ovl, home, target, tmp_path):
    sid, _ = ovl.sh(target, "echo one > hello.txt")
    script = tmp_path / "approve.json"
    script.write_text(json.dumps({"model": "reviewer-1", "turns": [
        {"tool_calls": [{"name": "approve", "input": {"reason": "fine"}}]}]}))
    ovl("review", sid, "--provider", "scripted", "--script", script, check=0)
    fork = SESSION_RE.search(ovl("fork", sid, "--at", "0", check=0).out).group(1)
    meta = json.loads((home / "sessions" / fork / "meta.json").read_text())
    assert "reviews" not in meta and "attestation" not in meta
    ovl("rollback", sid, check=0)
    err = ovl("commit", fork, "--countersigned", check=1).err
    assert "none on record" in err
    ovl("exec", fork, "--", "true", check=0)
    assert acts(home, fork) == [("session.fork", fork), ("session.commit_refused", fork),
                                ("session.open", fork)]
    line = [x for x in chain(home) if x.get("sid") == fork][-1]
    assert line["attestation"]["backend"] == ovl.backend
