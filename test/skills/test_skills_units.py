"""The SKILL.md format and the catalogue, host-side: what is offered (names and descriptions
only), shadowing, the policy cap, warnings naming the file, and symlinks refused at every
component of the path -- without a session."""
import os

import pytest

from skilllib import machine, make_skill, project, skill_md  # noqa: F401
from overlord.agent import skills as S


@pytest.mark.parametrize("text, why", [
    ("no front matter here\n", "no front matter"),
    ("---\ndescription: x\n---\n", "no `name`"),
    ("---\nname: a/b\ndescription: x\n---\n", "contains '/'"),
    ("---\nname: Upper\ndescription: x\n---\n", "is not a skill name"),
    ("---\nname: -lead\ndescription: x\n---\n", "is not a skill name"),
    ("---\nname: " + "a" * 65 + "\ndescription: x\n---\n", "is not a skill name"),
    ("---\nname: ok\n---\n", "no `description`"),
    ("---\nname: ok\ndescription: x\n", "no closing '---'"),
    ("---\nname: ok\nname: ok\ndescription: x\n---\n", "given twice"),
    ("---\nname: ok\ndescription: >\n  folded\n---\n", "must be one line"),
    ("---\nname: ok\ndescription: one\n  two\n---\n", "must be one line"),
    ("---\nname ok\ndescription: x\n---\n", "line 2 is not `key: value`"),
])
def test_malformed_front_matter_says_why(text, why):
    with pytest.raises(S.Malformed, match=why.replace("(", r"\(").replace(")", r"\)")):
        S.parse(text.encode())


def test_front_matter_that_is_accepted():
    head = S.parse(("\ufeff---\r\nname: py-1\r\ndescription: \"Quoted: yes\"\r\nlicense: MIT\r\n"
                    "allowed-tools:\r\n  - Bash\r\n# a comment\r\nwhen: tests fail\r\n---\r\nbody\r\n").encode())
    assert head == {"name": "py-1", "description": "Quoted: yes", "when": "tests fail"}
    long = S.parse(skill_md("x", "d" * 500).encode())
    assert len(long["description"]) == S.LINE_CAP and long["description"].endswith("...")
    with pytest.raises(S.Malformed, match="not UTF-8"):
        S.parse(b"---\nname: x\ndescription: \xff\n---\n")
    with pytest.raises(S.Malformed, match="larger than 64 KiB"):
        S.parse(skill_md("x", "d", "b" * (S.SKILL_MAX + 1)).encode())


def test_catalogue_names_and_descriptions_only_and_a_project_skill_shadows(home, target):
    machine(home, "python-testing", description="machine testing", body="MACHINE-BODY-7f3a\n",
            files={"machine-only.txt": "m"})
    machine(home, "release-notes", description="write release notes", when="a release is due",
            body="RELEASE-BODY-1c2d\n")
    project(target, "python-testing", description="the project's own testing rules",
            body="PROJECT-BODY-9e8d\n", files={"project-only.txt": "p"})
    offered = S.catalogue(str(target), "*")
    by = {s["name"]: s for s in offered.skills}
    assert sorted(by) == ["python-testing", "release-notes"]
    assert by["python-testing"]["source"] == "project"
    assert by["python-testing"]["description"] == "the project's own testing rules"
    assert by["release-notes"] == {"name": "release-notes", "description": "write release notes",
                                   "when": "a release is due", "source": "machine",
                                   "sha256": by["release-notes"]["sha256"]}
    for body in ("MACHINE-BODY", "RELEASE-BODY", "PROJECT-BODY", "machine testing"):
        assert body not in offered.text
    assert "- python-testing (project): the project's own testing rules" in offered.text
    assert "- release-notes (machine): write release notes (when: a release is due)" in offered.text
    assert "`skill` tool" in offered.text and offered.warnings == []
    again = S.from_record(offered.record())
    assert again.skills == offered.skills and again.text == offered.text


def test_the_policy_caps_machine_skills_not_project_skills(home, target):
    machine(home, "alpha")
    machine(home, "beta")
    project(target, "gamma")
    names = lambda allowed: [s["name"] for s in S.catalogue(str(target), allowed).skills]  # noqa: E731
    assert names("*") == ["alpha", "beta", "gamma"]
    assert names(["beta", "not-installed"]) == ["beta", "gamma"]
    assert names([]) == ["gamma"]
    (target / ".overlord").rename(target / "elsewhere")
    assert S.catalogue(str(target), []) == S.Offered()
    assert S.catalogue(str(target), []).text == ""


def test_malformed_skills_are_skipped_with_a_warning_naming_the_file(home, target):
    machine(home, "good")
    machine(home, "bad-machine", text="no front matter\n")
    project(target, "noname", text="---\ndescription: x\n---\n")
    project(target, "slash", text=skill_md("a/b", "x"))
    project(target, "mismatch", text=skill_md("other", "x"))
    (target / ".overlord" / "skills" / "Bad Folder").mkdir()
    (target / ".overlord" / "skills" / "empty").mkdir()
    (target / ".overlord" / "skills" / "README.md").write_text("not a skill folder")
    offered = S.catalogue(str(target), "*")
    assert [s["name"] for s in offered.skills] == ["good"]
    p = str(target / ".overlord" / "skills")
    want = [f"{p}/Bad Folder: the name 'Bad Folder' is not a skill name",
            f"{p}/empty/SKILL.md does not exist; skipped",
            f"{p}/mismatch/SKILL.md: its name 'other' is not its folder's name 'mismatch'",
            f"{p}/noname/SKILL.md: no `name` in the front matter; skipped",
            f"{p}/slash/SKILL.md: the name 'a/b' contains '/'; skipped",
            f"{home}/skills/bad-machine/SKILL.md: no front matter"]
    assert len(offered.warnings) == len(want), offered.warnings
    for w, line in zip(want, offered.warnings):
        assert line.startswith(w), (w, line)


def test_a_broken_project_folder_still_shadows_the_machine_skill(home, target):
    machine(home, "lint", body="machine lint\n")
    project(target, "lint", text="broken\n")
    offered = S.catalogue(str(target), "*")
    assert offered.skills == []
    assert any("lint/SKILL.md: no front matter" in w for w in offered.warnings)
    assert any("machine skill 'lint' is shadowed" in w for w in offered.warnings)


def test_symlinks_are_refused_at_every_component(home, target, tmp_path):
    elsewhere = make_skill(tmp_path / "elsewhere", "linked", description="SECRET-DESCRIPTION")
    skills = target / ".overlord" / "skills"
    skills.mkdir(parents=True)
    os.symlink(elsewhere, skills / "linked")                      # the skill folder
    d = skills / "file-link"
    d.mkdir()
    os.symlink(elsewhere / "SKILL.md", d / "SKILL.md")             # SKILL.md itself
    make_skill(skills, "fine")
    offered = S.catalogue(str(target), "*")
    assert [s["name"] for s in offered.skills] == ["fine"]
    assert "SECRET-DESCRIPTION" not in offered.text + "".join(offered.warnings)
    assert any(w.startswith(f"{d}/SKILL.md is a symlink") for w in offered.warnings)
    assert any(w.startswith(f"{skills}/linked is a symlink") for w in offered.warnings)
    # the `skills` folder, then `.overlord` itself
    other = tmp_path / "other-target"
    (other / ".overlord").mkdir(parents=True)
    os.symlink(elsewhere.parent, other / ".overlord" / "skills")
    got = S.catalogue(str(other), "*")
    assert got.skills == [] and "is a symlink" in got.warnings[0]
    third = tmp_path / "third"
    third.mkdir()
    os.symlink(other / ".overlord", third / ".overlord")
    got = S.catalogue(str(third), "*")
    assert got.skills == [] and got.warnings[0].startswith(f"{third}/.overlord is a symlink")
    # and a machine skill planted as a link by hand
    (home / "skills").mkdir(exist_ok=True)
    os.symlink(elsewhere, home / "skills" / "linked")
    assert S.catalogue(str(target), "*").skills == offered.skills


def test_no_skills_no_tool():
    assert S.tools(None, None, S.Offered()) == []
    (tool,) = S.tools(None, None, S.Offered([{"name": "a", "description": "d", "when": None,
                                               "source": "machine", "sha256": "0" * 64}]))
    assert tool.spec["name"] == "skill" and tool.spec["input_schema"]["required"] == ["name"]
