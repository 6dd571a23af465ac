"""remember {scope: "project"}: a note appended to OVERLORD.md inside the session, its own
savepoint stamped with the call's cause -- committed, dropped, rewound or rolled back with
everything else; never written through a symlink."""
import os

from memlib import aovl, call, done, kmem, results, tree  # noqa: F401

NOTE = "tests: run `make check` before committing"


def _run(ovl, target, tmp_path, note=NOTE):
    """write_file (@0), remember (@1), done: (sid, remember's call id)."""
    sid, proc = ovl.scripted(target, tmp_path, [
        {"tool_calls": [call("write_file", path="a.txt", content="alpha\n")]},
        {"tool_calls": [call("remember", scope="project", note=note)]},
        done("I wrote a.txt and noted how to test.")])
    assert proc.returncode == 0, proc.err
    res = [r for r in results(ovl.events(sid)).values() if r["tool"] == "remember"]
    assert len(res) == 1 and not res[0]["result"]["is_error"], res
    return sid, res[0]


def test_the_note_is_its_own_savepoint_with_the_calls_cause(aovl, target, tmp_path):
    (target / "OVERLORD.md").write_text("# notes\n- no trailing newline here")
    before = tree(target)
    sid, res = _run(aovl, target, tmp_path)
    assert res["layer"] == 1 and res["paths"] == ["OVERLORD.md"]
    assert "savepoint @1" in res["result"]["content"] and "commits" in res["result"]["content"]
    cause = aovl.caused_by(sid)["OVERLORD.md"]
    assert cause["tool"] == "remember" and cause["call"] == res["call"] and cause["turn"] == 2
    assert NOTE in cause["summary"]
    assert tree(target) == before                 # nothing reached the real folder yet
    shown = aovl("exec", sid, "--", "cat", "OVERLORD.md", check=0).out
    assert shown == f"# notes\n- no trailing newline here\n- {NOTE}\n"
    aovl("commit", sid, check=0)
    assert (target / "OVERLORD.md").read_text() == shown
    assert (target / "a.txt").read_text() == "alpha\n"


def test_rewind_drops_the_note(aovl, target, tmp_path):
    sid, _ = _run(aovl, target, tmp_path)
    assert ("added", "OVERLORD.md") in aovl.diff(sid)
    proc = aovl("rewind", sid, "--to", "0", check=0)
    assert proc.returncode == 0, proc.err
    assert aovl.diff(sid) == [("added", "a.txt")]
    aovl("commit", sid, check=0)
    assert not (target / "OVERLORD.md").exists() and (target / "a.txt").exists()


def test_commit_drop_call_leaves_the_note_out(aovl, target, tmp_path):
    (target / "OVERLORD.md").write_text("- old note\n")
    sid, res = _run(aovl, target, tmp_path)
    proc = aovl("commit", sid, "--drop", f"call:{res['call']}", check=0)
    assert proc.returncode == 0, proc.err
    assert (target / "OVERLORD.md").read_text() == "- old note\n"
    assert (target / "a.txt").read_text() == "alpha\n"


def test_rollback_leaves_the_real_notes_untouched(aovl, target, tmp_path):
    (target / "OVERLORD.md").write_text("- old note\n")
    before = tree(target)
    sid, _ = _run(aovl, target, tmp_path)
    aovl("rollback", sid, check=0)
    assert tree(target) == before


def test_a_planted_symlink_is_refused_and_nothing_is_written(aovl, target, tmp_path):
    """Planted inside the session (pointing outside the root, or inside it): remember refuses
    both; planted in the real folder: gather does not follow it and remember refuses it."""
    sid, proc = aovl.scripted(target, tmp_path, [
        {"tool_calls": [call("shell", command="ln -s ../outside.txt OVERLORD.md")]},
        {"tool_calls": [call("remember", scope="project", note="one")]},
        {"tool_calls": [call("shell", command="rm OVERLORD.md && ln -s sub/a.txt OVERLORD.md")]},
        {"tool_calls": [call("remember", scope="project", note="two")]},
        done()])
    assert proc.returncode == 0, proc.err
    res = [r for r in results(aovl.events(sid)).values() if r["tool"] == "remember"]
    assert [r["result"]["is_error"] for r in res] == [True, True]
    assert "leads outside the project root" in res[0]["result"]["content"]
    assert "is a symbolic link" in res[1]["result"]["content"]
    assert all(r["layer"] is None and "nothing was written" in r["result"]["content"] for r in res)
    assert aovl("exec", sid, "--", "cat", "sub/a.txt", check=0).out == "a\n"
    aovl("rollback", sid, check=0)

    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    os.symlink("../outside.txt", target / "OVERLORD.md")
    sid, proc = aovl.scripted(target, tmp_path, [
        {"tool_calls": [call("remember", scope="project", note="three")]}, done()])
    res = [r for r in results(aovl.events(sid)).values() if r["tool"] == "remember"][0]
    assert res["result"]["is_error"] and res["layer"] is None
    assert "outside\n" not in aovl.system(sid)["prompt"].split("# Memory", 1)[-1]
    assert "symbolic link: not read" in aovl.system(sid)["memory"]["text"]
    assert aovl.diff(sid) == []
    assert outside.read_text() == "outside\n"


def test_a_note_is_a_markdown_item_on_its_own_line(kmem, target, tmp_path):
    sid, res = _run(kmem, target, tmp_path, note="  first line\nsecond line  ")
    assert kmem("exec", sid, "--", "cat", "OVERLORD.md", check=0).out == \
        "- first line\n  second line\n"
