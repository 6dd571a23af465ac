"""The journal: one line per committed agent session in a folder -- the task, the model's last
words labelled as its own claim, the files committed -- written by the engine at commit time.
None after a rollback, none for a plain `overlord run`; `overlord memory journal` prints it
escaped; the next agent session in the folder is told it."""
import json

from memlib import aovl, call, done, kmem  # noqa: F401
from overlord.agent import memory as M

CLAIM = "I wrote a.txt and b.txt; all tests pass."


def _agent(ovl, target, tmp_path, claim=CLAIM, task="write the two files"):
    sid, proc = ovl.scripted(target, tmp_path, [
        {"tool_calls": [call("write_file", path="a.txt", content="a\n")]},
        {"tool_calls": [call("write_file", path="docs/b.txt", content="b\n")]},
        done(claim)], task=task)
    assert proc.returncode == 0, proc.err
    return sid


def _journal(ovl, target):
    return json.loads(ovl("memory", "journal", "-t", target, "--json", check=0).out)


def test_a_committed_agent_session_leaves_one_line_and_the_next_is_told(aovl, target, tmp_path):
    sid = _agent(aovl, target, tmp_path)
    assert _journal(aovl, target) == []            # pending: nothing yet
    aovl("commit", sid, check=0)
    entries = _journal(aovl, target)
    assert len(entries) == 1
    e = entries[0]
    assert (e["sid"], e["task"], e["claim"], e["target"]) == (sid, "write the two files", CLAIM, str(target))
    assert e["files"] == ["a.txt", "docs", "docs/b.txt"] and e["changes"] == 3
    assert e["at"] == aovl.meta(sid)["committed"]
    out = aovl("memory", "journal", "-t", target, check=0).out
    assert out.count("\n") == 1 and sid in out and "write the two files" in out
    assert f"claim (the model's own, not verified): {CLAIM}" in out
    # the next agent session in the folder is told it, the claim labelled as the model's
    nxt, _ = aovl.scripted(target, tmp_path, [done()])
    text = aovl.system(nxt)["memory"]["text"]
    assert "## Journal" in text and sid in text
    assert f"the model's own claim (not verified): \"{CLAIM}\"" in text
    assert "docs/b.txt" in text


def test_rollback_and_plain_run_leave_no_entry(aovl, target, tmp_path):
    sid = _agent(aovl, target, tmp_path)
    aovl("rollback", sid, check=0)
    run, _ = aovl.sh(target, "echo x > x.txt")
    aovl("commit", run, check=0)
    assert (target / "x.txt").exists()
    assert _journal(aovl, target) == []
    assert aovl("memory", "journal", "-t", target, check=0).out.startswith("no journal entries")
    assert "## Journal" not in aovl("memory", "show", "-t", target, check=0).out


def test_a_partial_commit_names_only_what_was_committed(kmem, target, tmp_path):
    sid = _agent(kmem, target, tmp_path)
    kmem("commit", sid, "--only", "layer:0", check=0)
    (e,) = _journal(kmem, target)
    assert e["files"] == ["a.txt"] and e["changes"] == 1


def test_model_text_is_capped_flattened_and_escaped(kmem, target, tmp_path):
    claim = "\x1b[31mred\x1b[0m\nsecond \"quoted\" line " + "z" * 600
    sid = _agent(kmem, target, tmp_path, claim=claim, task="task with\x1b]0;title\x07 bytes")
    kmem("commit", sid, check=0)
    (e,) = _journal(kmem, target)
    assert len(e["claim"]) == M.CLAIM_CAP and e["claim"].endswith("...")
    assert "\n" not in e["claim"] and e["claim"].startswith("\x1b[31mred\x1b[0m second \"quoted\" line")
    told = kmem("memory", "show", "-t", target, check=0).out       # a quote cannot end the claim
    assert 'the model\'s own claim (not verified): "\\u001b[31mred\\u001b[0m second \\"quoted\\" line' in told
    out = kmem("memory", "journal", "-t", target, check=0).out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[31mred" in out and "\\x1b]0;title\\x07" in out



def test_a_commit_a_crash_cut_short_gets_its_line_from_recovery_once(kmem, home, target, tmp_path, monkeypatch):
    """Killed after the journal of the replay was marked done, before the session record
    said committed: the next command's recovery settles the commit and writes the line; a
    second recovery, or a commit that wrote it already, adds none."""
    import os
    from overlord import ops
    from overlord.txn import replay
    sid = _agent(kmem, target, tmp_path)
    monkeypatch.setenv("OVERLORD_HOME", str(home))
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", "kernel")
    pid = os.fork()
    if pid == 0:
        real_finish = replay.Journal.finish

        def dying_finish(self):
            real_finish(self)
            os._exit(9)
        replay.Journal.finish = dying_finish
        try:
            ops.commit(sid)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    assert not os.path.exists(M.journal_path(str(target)))   # (any CLI command would recover)
    ops.recover()
    assert ops.get_session(sid).meta["state"] == "committed"
    assert [e["sid"] for e in _journal(kmem, target)] == [sid]
    ops.recover()
    M.journal_commit(ops.get_session(sid))
    assert [e["sid"] for e in _journal(kmem, target)] == [sid]
