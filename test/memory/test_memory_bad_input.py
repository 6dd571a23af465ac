"""Bad input to remember is a clean tool error and writes nothing (no savepoint, no proposal);
`overlord memory user` changes your notes only by a person's act, each on the audit chain."""
import json
import os
import stat
import sys

from memlib import aovl, call, done, kmem, of_type, results, sha  # noqa: F401
from overlord.agent import memory as M


def test_bad_notes_are_clean_tool_errors_and_nothing_is_written(aovl, target, tmp_path):
    big = "n" * (M.NOTE_CAP + 1)
    wide = "é" * (M.NOTE_CAP // 2 + 1)          # under the cap in characters, over it in bytes
    bad = [call("remember", scope="project", note=big),
           call("remember", scope="user", note=big),
           call("remember", scope="user", note=wide),
           call("remember", scope="team", note="a note"),
           call("remember", scope="project", note=""),
           call("remember", scope="user", note="  \n\t "),
           call("remember", scope="project", note="nul\x00byte"),
           call("remember", scope="project"),
           call("remember", scope="project", note=7)]
    sid, proc = aovl.scripted(target, tmp_path, [{"tool_calls": bad}, done()])
    assert proc.returncode == 0, proc.err
    res = list(results(aovl.events(sid)).values())
    assert len(res) == len(bad)
    assert all(r["result"]["is_error"] and r["layer"] is None for r in res), res
    said = [r["result"]["content"] for r in res]
    assert f"at most {M.NOTE_CAP}" in said[0] and f"at most {M.NOTE_CAP}" in said[1]
    assert f"{len(wide.encode())} bytes" in said[2]
    assert "unknown scope 'team'" in said[3]
    assert "empty" in said[4] and "empty" in said[5] and "NUL" in said[6]
    assert "missing required input 'note'" in said[7] and "must be a string" in said[8]
    assert all("nothing was written" in s for s in said[:7])
    assert of_type(aovl.events(sid), "memory_proposal") == []
    assert aovl.diff(sid) == [] and aovl.memory_md() is None


def test_a_note_of_exactly_the_cap_is_kept(kmem, target, tmp_path):
    note = "k" * M.NOTE_CAP
    sid, _ = kmem.scripted(target, tmp_path, [
        {"tool_calls": [call("remember", scope="project", note=note),
                        call("remember", scope="user", note=note)]}, done()])
    res = list(results(kmem.events(sid)).values())
    assert [r["result"]["is_error"] for r in res] == [False, False]
    assert kmem.diff(sid) == [("added", "OVERLORD.md")]
    assert of_type(kmem.events(sid), "memory_proposal")[0]["note"] == note


def test_user_add_set_and_edit_are_audited(kmem, tmp_path, home):
    proc = kmem("memory", "user", check=0)
    assert proc.out.startswith("no notes yet")
    kmem("memory", "user", "--add", "Likes tabs", check=0)
    kmem("memory", "user", "--add", "Second\nline", check=0)
    assert kmem.memory_md() == b"- Likes tabs\n- Second\n  line\n"
    assert stat.S_IMODE(os.stat(home / "memory.md").st_mode) == 0o600
    assert kmem("memory", "user", check=0).out == "- Likes tabs\n- Second\n  line\n"
    new = tmp_path / "notes.md"
    new.write_text("# me\n- fresh start")
    kmem("memory", "user", "--set-from", new, check=0)
    assert kmem.memory_md() == b"# me\n- fresh start\n"
    editor = tmp_path / "editor.py"
    editor.write_text("import sys\nopen(sys.argv[1], 'a').write('- edited\\n')\n")
    kmem("memory", "user", "--edit", env={"VISUAL": "", "EDITOR": f"{sys.executable} {editor}"}, check=0)
    assert kmem.memory_md() == b"# me\n- fresh start\n- edited\n"
    edits = kmem.audit("memory.edit")
    assert [e["how"] for e in edits] == ["add", "add", "set", "set"]
    assert edits[-1]["sha256"] == sha(kmem.memory_md()) and edits[-1]["bytes"] == len(kmem.memory_md())
    assert all(e["by"].startswith("cli:") for e in edits)
    assert "Likes tabs" not in json.dumps(edits)
    view = json.loads(kmem("memory", "user", "--json", check=0).out)
    assert view["text"] == "# me\n- fresh start\n- edited\n" and view["cap"] == M.CAPS["user"]
    assert kmem("audit", "verify", check=0).returncode == 0


def test_user_notes_bad_input_is_one_line_and_changes_nothing(kmem, tmp_path, home, target):
    kmem("memory", "user", "--add", "Keep me", check=0)
    before = kmem.memory_md()
    for args in (["--add", ""], ["--add", "   "], ["--set-from", tmp_path / "missing.md"]):
        proc = kmem("memory", "user", *args, check=None)
        assert proc.returncode != 0 and proc.err.startswith("overlord: ") and proc.err.count("\n") == 1
    proc = kmem("memory", "user", "--edit", env={"VISUAL": "", "EDITOR": ""}, check=None)
    assert proc.returncode != 0 and "EDITOR" in proc.err
    assert kmem.memory_md() == before and len(kmem.audit("memory.edit")) == 1
    # a symlink where your notes live is neither followed nor replaced
    elsewhere = tmp_path / "elsewhere.md"
    elsewhere.write_text("- not yours\n")
    os.unlink(home / "memory.md")
    os.symlink(elsewhere, home / "memory.md")
    proc = kmem("memory", "user", "--add", "x", check=None)
    assert proc.returncode != 0 and "symbolic link" in proc.err
    assert os.path.islink(home / "memory.md") and elsewhere.read_text() == "- not yours\n"
    shown = kmem("memory", "show", "-t", target, check=0).out
    assert "not yours" not in shown and "memory.md) is a symbolic link: not read" in shown
