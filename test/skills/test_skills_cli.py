"""`overlord skills list|show|add|new|rm` through the real CLI: what each prints and its --json,
the bad input (a path without SKILL.md, a malformed SKILL.md, a name clash, a symlink in the
way) refused with one line `overlord: ...` and nothing changed, and the audit acts skill.add /
skill.remove on a chain that verifies."""
import json
import os

import pytest

from skilllib import REPO_SKILLS, machine, make_skill, project, skill_md, snapshot, sovl, tree  # noqa: F401


def one_line_refusal(proc, code=None):
    lines = proc.err.strip().splitlines()
    assert proc.returncode != 0 and (code is None or proc.returncode == code), (proc.returncode, proc.err)
    assert len(lines) == 1 and lines[0].startswith("overlord: ") and "Traceback" not in proc.err, proc.err
    return lines[0]


def test_add_list_show_rm_the_shipped_skills(sovl, home, target):
    add = sovl("skills", "add", REPO_SKILLS / "python-testing", check=0)
    assert add.out.startswith("installed machine skill python-testing (sha256 ")
    got = json.loads(sovl("skills", "add", REPO_SKILLS / "release-notes" / "SKILL.md", "--json",
                          check=0).out)
    assert got["name"] == "release-notes" and got["files"] == ["template.md"]
    assert (home / "skills" / "release-notes" / "template.md").read_bytes() == \
        (REPO_SKILLS / "release-notes" / "template.md").read_bytes()
    listed = sovl("skills", "list", check=0).out
    assert "python-testing  machine  installed  Write, run and fix pytest tests" in listed
    view = json.loads(sovl("skills", "list", "--json", check=0).out)
    assert [s["name"] for s in view["skills"]] == ["python-testing", "release-notes"]
    (row,) = [s for s in view["skills"] if s["name"] == "python-testing"]
    assert row["files"] == [{"path": "checklist.md", "size": os.path.getsize(
        REPO_SKILLS / "python-testing" / "checklist.md")}]
    assert row["allowed"] is None and row["shadowed"] is False and row["source"] == "machine"
    shown = sovl("skills", "show", "python-testing", check=0).out
    assert "## 1. Find how this project runs its tests" in shown and "checklist.md" in shown
    data = json.loads(sovl("skills", "show", "release-notes", "--json", check=0).out)
    assert data["text"] == (REPO_SKILLS / "release-notes" / "SKILL.md").read_text()
    rm = sovl("skills", "rm", "python-testing", check=0)
    assert rm.out.startswith("removed machine skill python-testing")
    assert not (home / "skills" / "python-testing").exists()
    assert json.loads(sovl("skills", "rm", "release-notes", "--json", check=0).out)["name"] == "release-notes"
    assert sovl("skills", "list", check=0).out.splitlines()[1] == "no skills"
    # on the chain, with the SKILL.md digest and who did it; the chain verifies
    adds, rms = sovl.acts("skill.add"), sovl.acts("skill.remove")
    assert [a["name"] for a in adds] == ["python-testing", "release-notes"]
    assert [a["name"] for a in rms] == ["python-testing", "release-notes"]
    assert adds[0]["sha256"] == rms[0]["sha256"] == data_sha(REPO_SKILLS / "python-testing" / "SKILL.md")
    assert adds[0]["by"].startswith("cli:") and adds[0]["files"] == 2
    sovl("audit", "verify", check=0)


def data_sha(path):
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_list_for_a_folder_shadowing_policy_and_warnings(sovl, home, target, tmp_path):
    machine(home, "alpha", description="machine alpha")
    machine(home, "beta", description="machine beta")
    machine(home, "lint")
    project(target, "alpha", description="project alpha", files={"notes/x.txt": "x"})
    project(target, "bad", text="no front matter\n")
    sovl.set_policy(tmp_path, {"default": {"skills": ["alpha"]}})
    out = sovl("skills", "list", "-t", target, check=0).out.splitlines()
    assert out[0] == f"skills for {target} (policy skills: [alpha])"
    rows = [line.split()[:3] for line in out[2:5]]
    assert rows == [["alpha", "project", "offered"], ["alpha", "machine", "shadowed"],
                    ["beta", "machine", "not"]]
    assert out[5].startswith("lint") and "not allowed" in out[5]
    assert out[6] == (f"warning: {target}/.overlord/skills/bad/SKILL.md: no front matter (the file "
                      "must begin with a '---' line); skipped")
    view = json.loads(sovl("skills", "list", "-t", target, "--json", check=0).out)
    assert view["policy"] == ["alpha"] and len(view["warnings"]) == 1
    (p,) = [s for s in view["skills"] if s["source"] == "project"]
    assert p["files"] == [{"path": "notes/x.txt", "size": 1}] and p["offered"]
    shown = json.loads(sovl("skills", "show", "alpha", "-t", target, "--json", check=0).out)
    assert shown["source"] == "project" and "project alpha" in shown["text"]
    assert "not allowed" in sovl("skills", "show", "beta", "-t", target, check=0).out.splitlines()[0]
    line = one_line_refusal(sovl("skills", "show", "bad", "-t", target))
    assert "bad/SKILL.md: no front matter" in line
    one_line_refusal(sovl("skills", "show", "nothing-here", "-t", target))


def test_add_refuses_bad_input_and_changes_nothing(sovl, home, tmp_path):
    machine(home, "taken")
    sovl("skills", "list", check=0)
    before = snapshot(home)
    no_md = tmp_path / "no-md"
    no_md.mkdir()
    (no_md / "README.md").write_text("hi")
    cases = {
        "holds no SKILL.md": no_md,
        "does not exist": tmp_path / "missing",
        "no front matter": make_skill(tmp_path / "a", "x", text="just text\n"),
        "no `name`": make_skill(tmp_path / "b", "x", text="---\ndescription: d\n---\n"),
        "contains '/'": make_skill(tmp_path / "c", "x", text=skill_md("evil/../../x", "d")),
        "already installed": make_skill(tmp_path / "d", "taken", description="another one"),
        "is a symlink": make_skill(tmp_path / "e", "linky"),
        "is not a skill folder": make_skill(tmp_path / "f", "filed") / "SKILL.md.txt",
    }
    os.symlink("/etc/passwd", cases["is a symlink"] / "passwd")
    (cases["is not a skill folder"]).write_text("x")
    for why, path in cases.items():
        line = one_line_refusal(sovl("skills", "add", path))
        assert why in line, (why, line)
        assert snapshot(home) == before, why
    assert not os.path.exists(home / "skills" / "x") and not list((home / "skills").glob(".*"))


def test_rm_refuses_bad_input(sovl, home):
    assert "no machine skill named 'ghost'" in one_line_refusal(sovl("skills", "rm", "ghost"))
    assert "contains '/'" in one_line_refusal(sovl("skills", "rm", "../sessions"), code=2)
    assert "is not a skill name" in one_line_refusal(sovl("skills", "rm", ".."), code=2)


def test_new_scaffolds_a_project_skill_and_refuses_what_is_in_the_way(sovl, home, target, tmp_path):
    done = json.loads(sovl("skills", "new", "deploy", "-t", target, "-d", "How we deploy",
                           "--json", check=0).out)
    md = target / ".overlord" / "skills" / "deploy" / "SKILL.md"
    assert done["path"] == str(md)
    listed = json.loads(sovl("skills", "list", "-t", target, "--json", check=0).out)
    assert [(s["name"], s["source"], s["description"]) for s in listed["skills"]] == \
        [("deploy", "project", "How we deploy")] and listed["warnings"] == []
    out = sovl("skills", "new", "other", "-t", target, check=0).out
    assert out.startswith(f"created {target}/.overlord/skills/other/SKILL.md")
    before = tree(target)
    assert "already exists" in one_line_refusal(sovl("skills", "new", "deploy", "-t", target))
    assert "contains '/'" in one_line_refusal(sovl("skills", "new", "a/b", "-t", target), code=2)
    assert "longer than 300" in one_line_refusal(sovl("skills", "new", "c", "-t", target, "-d", "x" * 301))
    assert tree(target) == before and md.read_text().startswith("---\nname: deploy\ndescription: How we deploy\n")
    # a symlink on the way is refused, not followed: nothing is written where it points
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(outside, linked / ".overlord")
    line = one_line_refusal(sovl("skills", "new", "x", "-t", linked))
    assert f"{linked}/.overlord is a symlink" in line and list(outside.iterdir()) == []


def test_a_skill_the_cli_prints_is_escaped(sovl, home):
    machine(home, "esc", description="bell \x07 and \x1b[31mred")
    out = sovl("skills", "list", check=0).out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[31mred" in out
