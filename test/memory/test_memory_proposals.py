"""remember {scope: "user"} only proposes: a memory_proposal event, never a write to
OVERLORD_HOME/memory.md. A person accepts (`overlord memory accept SID N... | --all`): the note
is appended, the transcript records memory_accepted, the audit chain memory.accept (digests,
never the note), and the chain still verifies. A bad id changes nothing; twice is said."""
import json

from memlib import aovl, call, done, kmem, of_type, results, sha  # noqa: F401
from overlord.agent import memory as M

NOTES = ["Prefers answers without preamble", "Works in UTC; dates in ISO 8601"]


def _propose(ovl, target, tmp_path):
    sid, proc = ovl.scripted(target, tmp_path, [
        {"tool_calls": [call("remember", scope="user", note=NOTES[0])]},
        {"tool_calls": [call("remember", scope="user", note=NOTES[1])]},
        done()])
    assert proc.returncode == 0, proc.err
    return sid


def test_a_user_note_is_only_proposed(aovl, target, tmp_path):
    sid = _propose(aovl, target, tmp_path)
    events = aovl.events(sid)
    props = of_type(events, "memory_proposal")
    res = [r for r in results(events).values() if r["tool"] == "remember"]
    assert [(p["id"], p["note"], p["turn"], p["call"], p["sha256"]) for p in props] == \
        [(1, NOTES[0], 1, res[0]["call"], sha(NOTES[0])), (2, NOTES[1], 2, res[1]["call"], sha(NOTES[1]))]
    assert all("only a proposal" in r["result"]["content"] and r["layer"] is None for r in res)
    assert f"overlord memory accept {sid} 1" in res[0]["result"]["content"]
    assert aovl.memory_md() is None and aovl.diff(sid) == []
    assert aovl.audit("memory") == []
    listed = json.loads(aovl("memory", "proposals", sid, "--json", check=0).out)
    assert [(p["id"], p["accepted"]) for p in listed] == [(1, False), (2, False)]


def test_accept_appends_records_and_audits(aovl, target, tmp_path):
    sid = _propose(aovl, target, tmp_path)
    aovl("memory", "user", "--add", "Has a cat", check=0)
    proc = aovl("memory", "accept", sid, "2", check=0)
    assert proc.returncode == 0 and proc.out == f"accepted 2: {NOTES[1]}\n", proc.err
    assert aovl.memory_md() == f"- Has a cat\n- {NOTES[1]}\n".encode()
    accepted = of_type(aovl.events(sid), "memory_accepted")
    assert len(accepted) == 1 and accepted[0]["ids"] == [2]
    assert accepted[0]["by"].startswith("cli:") and accepted[0]["sha256"] == sha(f"- {NOTES[1]}\n")
    acts = aovl.audit("memory.accept")
    assert len(acts) == 1 and acts[0]["sid"] == sid and acts[0]["ids"] == [2]
    assert acts[0]["sha256"] == accepted[0]["sha256"] and acts[0]["by"] == accepted[0]["by"]
    assert NOTES[1] not in json.dumps(acts)           # the chain keeps digests, not the note
    # twice: said, not duplicated; --all takes the rest
    proc = aovl("memory", "accept", sid, "2", check=0)
    assert proc.returncode == 0 and proc.out.startswith("skipped 2: already accepted")
    proc = aovl("memory", "accept", sid, "--all", check=0)
    assert proc.out.splitlines() == [f"accepted 1: {NOTES[0]}", proc.out.splitlines()[1]]
    assert proc.out.splitlines()[1].startswith("skipped 2: already accepted")
    assert aovl.memory_md() == f"- Has a cat\n- {NOTES[1]}\n- {NOTES[0]}\n".encode()
    assert len(of_type(aovl.events(sid), "memory_accepted")) == 2
    assert len(aovl.audit("memory.accept")) == 2
    listed = json.loads(aovl("memory", "proposals", sid, "--json", check=0).out)
    assert all(p["accepted"] and p["by"].startswith("cli:") for p in listed)
    verify = aovl("audit", "verify", check=0)
    assert verify.returncode == 0, (verify.out, verify.err)
    # what the next session is told includes the accepted notes
    assert NOTES[0] in aovl("memory", "show", "-t", target, check=0).out


def test_a_bad_id_is_one_line_and_changes_nothing(kmem, target, tmp_path, home):
    sid = _propose(kmem, target, tmp_path)
    kmem("memory", "user", "--add", "Has a cat", check=0)
    before = (kmem.memory_md(), (home / "sessions" / sid / "transcript.jsonl").read_bytes(),
              len(kmem.audit("memory")))
    for args in (["1", "7"], ["x"], ["--all", "1"], []):
        proc = kmem("memory", "accept", sid, *args, check=None)
        assert proc.returncode != 0 and proc.out == "", (args, proc.out)
        assert proc.err.startswith("overlord: ") and proc.err.count("\n") == 1, proc.err
    assert "no memory proposal 7" in kmem("memory", "accept", sid, "1", "7").err
    after = (kmem.memory_md(), (home / "sessions" / sid / "transcript.jsonl").read_bytes(),
             len(kmem.audit("memory")))
    assert after == before
    plain, _ = kmem.sh(target, "echo x > x.txt", flags=("--stack",))
    for who, said in ((plain, "not an agent session"), ("20260101-000000-abcdef", "no such session")):
        proc = kmem("memory", "accept", who, "1", check=None)
        assert proc.returncode != 0 and proc.err.startswith("overlord: ") and said in proc.err


def test_accept_works_on_a_session_that_was_rolled_back(kmem, target, tmp_path):
    """Your notes are not part of the transaction: a proposal outlives the session's files."""
    sid = _propose(kmem, target, tmp_path)
    kmem("rollback", sid, check=0)
    kmem("memory", "accept", sid, "1", check=0)
    assert kmem.memory_md() == f"- {NOTES[0]}\n".encode()


def test_an_acceptance_a_rewind_cut_still_counts(kmem, target, tmp_path):
    """The acceptance is appended at the transcript's end; a rewind that keeps the proposal
    but cuts the acceptance (it goes to the archive) does not make it acceptable twice, and a
    later proposal never reuses the id of one the rewind cut."""
    sid, _ = kmem.scripted(target, tmp_path, [
        {"tool_calls": [call("write_file", path="a.txt", content="a\n")]},
        {"tool_calls": [call("remember", scope="user", note=NOTES[0])]},
        {"tool_calls": [call("write_file", path="b.txt", content="b\n")]},
        {"tool_calls": [call("remember", scope="user", note=NOTES[1])]},
        done()])
    kmem("memory", "accept", sid, "1", check=0)
    kmem("rewind", sid, "--to", "0", check=0)
    events = kmem.events(sid)
    assert [p["id"] for p in of_type(events, "memory_proposal")] == [1]
    assert of_type(events, "memory_accepted") == []
    proc = kmem("memory", "accept", sid, "1", check=0)
    assert proc.out.startswith("skipped 1: already accepted")
    assert kmem.memory_md() == f"- {NOTES[0]}\n".encode()
    assert "no memory proposal 2" in kmem("memory", "accept", sid, "2", check=None).err
    assert M.next_proposal_id(str(kmem.home / "sessions" / sid)) == 3


def test_a_note_already_in_your_notes_is_not_added_twice(kmem, target, tmp_path):
    sid = _propose(kmem, target, tmp_path)
    kmem("memory", "user", "--add", NOTES[0], check=0)
    proc = kmem("memory", "accept", sid, "1", check=0)
    assert proc.out == f"skipped 1: already in your notes: {NOTES[0]}\n"
    assert kmem.memory_md() == f"- {NOTES[0]}\n".encode()
    assert of_type(kmem.events(sid), "memory_accepted") == [] and kmem.audit("memory.accept") == []
