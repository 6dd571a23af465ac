"""What the agent is told before message one: `overlord memory show` prints exactly the memory
text of the system prompt; the session records its digest, sources and text; each source is
capped with the newest part kept and the cut said; OVERLORD.md is read only from a regular file,
never through a symlink."""
import json
import os

from memlib import aovl, done, kmem, sha  # noqa: F401
from overlord.agent import memory as M


def _show(ovl, target):
    proc = ovl("memory", "show", "-t", target, check=0)
    assert proc.returncode == 0, proc.err
    return proc


def test_show_prints_exactly_what_the_system_prompt_gets(aovl, target, tmp_path):
    (target / "OVERLORD.md").write_text("# notes\n- run tests with `make check`\n")
    aovl("memory", "user", "--add", "I prefer short answers", check=0)
    shown = _show(aovl, target)
    sid, proc = aovl.scripted(target, tmp_path, [done()])
    assert proc.returncode == 0, proc.err
    told = aovl.system(sid)["memory"]
    assert shown.out == told["text"] + "\n"
    assert "make check" in told["text"] and "I prefer short answers" in told["text"]
    assert told["text"] in aovl.system(sid)["prompt"]
    meta = aovl.meta(sid)["memory"]
    assert meta["sha256"] == told["sha256"] == sha(told["text"])
    assert meta["sources"] == told["sources"]
    by = {s["name"]: s for s in meta["sources"]}
    assert by["project"]["sha256"] == sha((target / "OVERLORD.md").read_bytes())
    assert by["project"]["sha256_of"] == by["user"]["sha256_of"] == "file"
    assert by["user"]["sha256"] == sha(aovl.memory_md())
    assert by["journal"]["sha256"] is None and by["journal"]["shown"] == 0
    data = json.loads(aovl("memory", "show", "-t", target, "--json", check=0).out)
    assert data == {"text": told["text"], "sha256": told["sha256"], "sources": told["sources"]}
    assert f"memory sha256 {told['sha256']}" in shown.err


def test_nothing_to_tell_is_an_empty_section(kmem, target, tmp_path):
    proc = _show(kmem, target)
    assert proc.out == "" and "nothing to tell" in proc.err
    sid, _ = kmem.scripted(target, tmp_path, [done()])
    told = kmem.system(sid)["memory"]
    assert told["text"] == "" and told["sha256"] == sha("")
    assert "# Memory" not in kmem.system(sid)["prompt"]


def test_each_source_is_capped_newest_kept_and_the_cut_said(kmem, target, home, tmp_path):
    lines = [f"project line {i:05d} " + "x" * 40 for i in range(600)]       # ~33 KB
    (target / "OVERLORD.md").write_text("\n".join(lines) + "\n")
    user = [f"user line {i:05d} " + "y" * 40 for i in range(300)]            # ~16 KB
    (home / "memory.md").write_text("\n".join(user) + "\n")
    os.makedirs(os.path.dirname(M.journal_path(str(target))), exist_ok=True)
    with open(M.journal_path(str(target)), "w") as f:
        for i in range(200):
            f.write(json.dumps({"sid": f"s{i:04d}", "at": 1.0e9 + i, "task": f"task {i:04d}",
                                "claim": "did it", "files": ["a.txt"], "changes": 1}) + "\n")
    data = json.loads(kmem("memory", "show", "-t", target, "--json", check=0).out)
    text, by = data["text"], {s["name"]: s for s in data["sources"]}
    for name, first, last in (("project", lines[0], lines[-1]), ("user", user[0], user[-1])):
        s = by[name]
        assert s["shown"] <= M.CAPS[name] < s["bytes"] and s["cut"] == s["bytes"] - s["shown"]
        assert last in text and first not in text
        assert f"[older notes cut: {s['cut']} bytes]" in text
    # the tail starts on a whole line: the first line shown is complete
    block = text.split(f"[older notes cut: {by['project']['cut']} bytes]\n")[1]
    assert block.startswith(M.FENCE + "project line ") and block.split("\n")[0][len(M.FENCE):] in lines
    assert by["project"]["sha256_of"] == "window" and by["project"]["read"][1] == by["project"]["bytes"]
    assert by["project"]["read"][1] - by["project"]["read"][0] <= M.CAPS["project"] + M.MARGIN
    j = by["journal"]
    assert j["shown"] <= M.CAPS["journal"] < j["bytes"] and j["entries"] == 200
    assert 0 < j["entries_shown"] < 200
    assert "task \"task 0199\"" in text and "task \"task 0000\"" not in text
    assert f"[older notes cut: {j['cut']} bytes]" in text
    # what the agent is told is the same, and it records the cut
    sid, _ = kmem.scripted(target, tmp_path, [done()])
    assert kmem.system(sid)["memory"]["text"] == text
    assert {s["name"]: s["cut"] for s in kmem.meta(sid)["memory"]["sources"]} == \
        {k: v["cut"] for k, v in by.items()}


def test_a_symlinked_overlord_md_is_never_followed(aovl, target, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE\n")
    os.symlink(secret, target / "OVERLORD.md")
    proc = _show(aovl, target)
    assert "TOP-SECRET-VALUE" not in proc.out
    assert "OVERLORD.md is a symbolic link: not read" in proc.out
    sid, proc = aovl.scripted(target, tmp_path, [done()])
    told = aovl.system(sid)["memory"]
    assert "TOP-SECRET-VALUE" not in aovl.system(sid)["prompt"]
    project = next(s for s in told["sources"] if s["name"] == "project")
    assert project["sha256"] is None and "symbolic link" in project["warning"]


def test_a_fifo_or_directory_overlord_md_is_said_not_read(kmem, target):
    os.mkfifo(target / "OVERLORD.md")          # a reader that followed it would hang here
    proc = kmem("memory", "show", "-t", target, check=0, timeout=30)
    assert proc.returncode == 0 and "OVERLORD.md is not a regular file: not read" in proc.out
    os.unlink(target / "OVERLORD.md")
    os.mkdir(target / "OVERLORD.md")
    assert "is not a regular file" in _show(kmem, target).out


def test_show_of_a_bad_target_is_one_line(kmem, tmp_path):
    proc = kmem("memory", "show", "-t", tmp_path / "nope", check=2)
    assert proc.err.startswith("overlord: target does not exist") and proc.err.count("\n") == 1
