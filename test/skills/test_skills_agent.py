"""Skills in a real agent session (scripted model), on the kernel backend (jailed) and on the
fuse backend (unjailed): the catalogue the model is told and the session records, a project
skill shadowing a machine skill entirely, every load a skill_load event, project skills read
inside the session (one just written loads; a symlink is refused, not followed), machine files
confined to their folder, the policy cap at catalogue and at load time, and a skill authored in
the transaction offered after commit and not after rollback."""
import hashlib

from skilllib import aovl, call, machine, of_type, project, results, skill_md, tree  # noqa: F401


def skill(name, file=None):
    return {"name": "skill", "input": dict({"name": name}, **({"file": file} if file else {}))}


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def run(aovl, target, tmp_path, calls, *flags, check=True, **kw):
    sid, proc = aovl.scripted(target, tmp_path, [{"tool_calls": calls}, {"text": "done"}], *flags, **kw)
    if check:
        assert proc.returncode == 0, (proc.out, proc.err)
    return sid


def contents(aovl, sid):
    """[(is_error, content)] of the tool results, in call order."""
    return [(r["result"]["is_error"], r["result"]["content"]) for r in aovl.results(sid)]


def test_catalogue_shadowing_and_load_events(aovl, home, target, tmp_path):
    machine(home, "python-testing", description="machine testing rules",
            body="MACHINE-BODY-7f3a\n", files={"checklist.md": "MACHINE-CHECKLIST"})
    machine(home, "release-notes", description="write release notes", when="a release is due",
            body="RELEASE-BODY-1c2d\n", files={"template.md": "TEMPLATE-5b6c", "deep/a/b.txt": "B"})
    text = skill_md("python-testing", "the project's own testing rules", "PROJECT-BODY-9e8d\n")
    project(target, "python-testing", text=text, files={"fixtures/data.txt": "PROJECT-DATA"})
    project(target, "broken", text="no front matter\n")
    before = tree(target)
    sid = run(aovl, target, tmp_path, [
        skill("python-testing"),
        skill("python-testing", file="checklist.md"),
        skill("python-testing", file="fixtures/data.txt"),
        call("read_file", path=".overlord/skills/python-testing/fixtures/data.txt"),
        skill("release-notes"),
        skill("release-notes", file="template.md"),
        skill("release-notes", file="../python-testing/SKILL.md"),
        skill("release-notes", file="/etc/passwd"),
        skill("nope"),
        skill("../../etc"),
    ])
    system, meta = aovl.system(sid), aovl.meta(sid)
    prompt = system["prompt"]
    assert "- python-testing (project): the project's own testing rules" in prompt
    assert "- release-notes (machine): write release notes (when: a release is due)" in prompt
    for body in ("BODY", "machine testing rules", "TEMPLATE", "CHECKLIST", "PROJECT-DATA"):
        assert body not in prompt, body
    offered = system["skills"]["offered"]
    assert [(s["name"], s["source"]) for s in offered] == [("python-testing", "project"),
                                                          ("release-notes", "machine")]
    assert offered[0]["sha256"] == sha(text) and meta["skills"] == system["skills"]
    (warning,) = system["skills"]["warnings"]
    assert warning.startswith(f"{target}/.overlord/skills/broken/SKILL.md: no front matter")
    assert "skill" in [t["name"] for t in system["tools"]]

    got = contents(aovl, sid)
    assert not got[0][0] and "PROJECT-BODY-9e8d" in got[0][1] and "MACHINE-BODY" not in got[0][1]
    assert "fixtures/data.txt  (12 bytes)" in got[0][1] and "checklist.md" not in got[0][1]
    assert "read_file at .overlord/skills/python-testing/PATH" in got[0][1]
    assert got[1][0] and "no such file" in got[1][1]                   # shadowed entirely
    assert got[2] == (False, "[skill python-testing (project): fixtures/data.txt]\nPROJECT-DATA")
    assert got[3] == (False, "PROJECT-DATA")
    assert not got[4][0] and "RELEASE-BODY-1c2d" in got[4][1]
    assert "template.md  (13 bytes)" in got[4][1] and "deep/a/b.txt  (1 bytes)" in got[4][1]
    assert got[5] == (False, "[skill release-notes (machine): template.md]\nTEMPLATE-5b6c")
    assert got[6][0] and "not a path inside the skill's folder" in got[6][1]
    assert got[7][0] and "not a path inside the skill's folder" in got[7][1]
    assert got[8][0] and "no skill named 'nope' was offered" in got[8][1]
    assert got[9][0] and "contains '/'" in got[9][1]

    loads = aovl.loads(sid)
    assert [(e["name"], e["source"], e.get("file")) for e in loads] == [
        ("python-testing", "project", None), ("python-testing", "project", "fixtures/data.txt"),
        ("release-notes", "machine", None), ("release-notes", "machine", "template.md")]
    assert loads[0]["sha256"] == sha(text) and loads[0]["files"] == ["fixtures/data.txt"]
    assert loads[2]["files"] == ["deep/a/b.txt", "template.md"] and loads[2]["turn"] == 1
    calls = [e["call"] for e in of_type(aovl.events(sid), "tool_call")]
    assert [e["call"] for e in loads] == [calls[0], calls[2], calls[4], calls[5]]
    assert aovl.diff(sid) == [] and tree(target) == before


def test_a_skill_written_in_the_session_loads_and_a_symlink_is_refused(aovl, home, target, tmp_path):
    machine(home, "anchor")
    fresh = skill_md("fresh", "written just now", "FRESH-BODY\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-OUTSIDE\n")
    sid = run(aovl, target, tmp_path, [
        call("write_file", path=".overlord/skills/fresh/SKILL.md", content=fresh),
        skill("fresh"),
        call("shell", command=f"mkdir -p .overlord/skills/evil .overlord/skills/inner "
                              f".overlord/skills/misnamed && "
                              f"ln -s {secret} .overlord/skills/evil/SKILL.md && "
                              "ln -s ../fresh/SKILL.md .overlord/skills/inner/SKILL.md && "
                              "ln -s ../fresh .overlord/skills/dirlink && "
                              "cp .overlord/skills/fresh/SKILL.md .overlord/skills/misnamed/"),
        skill("evil"),
        skill("inner"),
        skill("dirlink"),
        skill("misnamed"),
        call("write_file", path=".overlord/skills/bad/SKILL.md", content="no front matter"),
        skill("bad"),
    ])
    got = contents(aovl, sid)
    assert got[1][0] is False and "FRESH-BODY" in got[1][1]
    for i in (3, 4, 5):
        assert got[i][0] and "refused" in got[i][1], got[i]
        assert "SECRET-OUTSIDE" not in got[i][1] and "FRESH-BODY" not in got[i][1]
    assert "leads outside the project root" in got[3][1]
    assert "passes through a symlink" in got[4][1] and "passes through a symlink" in got[5][1]
    assert got[6][0] and "names itself 'fresh', not 'misnamed'" in got[6][1]
    assert got[8][0] and "malformed: no front matter" in got[8][1]
    (load,) = aovl.loads(sid)
    assert load["name"] == "fresh" and load["source"] == "project" and load["sha256"] == sha(fresh)
    assert ("added", ".overlord/skills/fresh/SKILL.md") in aovl.diff(sid)


def test_authored_in_the_transaction_offered_after_commit_not_after_rollback(aovl, home, target, tmp_path):
    machine(home, "anchor")
    kept = skill_md("kept", "a skill the agent wrote", "KEPT-BODY\n")
    sid = run(aovl, target, tmp_path, [call("write_file", path=".overlord/skills/kept/SKILL.md",
                                            content=kept)])
    assert ("added", ".overlord/skills/kept/SKILL.md") in aovl.diff(sid)
    assert not (target / ".overlord").exists()            # a pending diff, not yet the folder's
    (w,) = [r for r in aovl.results(sid) if r["tool"] == "write_file"]
    assert aovl.caused_by(sid)[".overlord/skills/kept/SKILL.md"]["call"] == w["call"]
    aovl("commit", sid, check=0)
    assert (target / ".overlord/skills/kept/SKILL.md").read_text() == kept

    dropped = skill_md("dropped", "a skill that is rolled back", "DROPPED\n")
    sid2 = run(aovl, target, tmp_path, [
        call("write_file", path=".overlord/skills/dropped/SKILL.md", content=dropped),
        skill("kept")])
    offered = {s["name"]: s for s in aovl.system(sid2)["skills"]["offered"]}
    assert offered["kept"]["source"] == "project" and offered["kept"]["sha256"] == sha(kept)
    assert "- kept (project): a skill the agent wrote" in aovl.system(sid2)["prompt"]
    assert "dropped" not in offered
    assert contents(aovl, sid2)[1][0] is False and "KEPT-BODY" in contents(aovl, sid2)[1][1]
    aovl("rollback", sid2, check=0)

    sid3 = run(aovl, target, tmp_path, [])
    names = [s["name"] for s in aovl.system(sid3)["skills"]["offered"]]
    assert names == ["anchor", "kept"] and "dropped" not in aovl.system(sid3)["prompt"]
    assert not (target / ".overlord/skills/dropped").exists()


def test_the_policy_caps_the_catalogue_and_every_load(aovl, home, target, tmp_path):
    machine(home, "alpha", body="ALPHA-BODY\n")
    machine(home, "beta", body="BETA-BODY\n")
    project(target, "local", body="LOCAL-BODY\n")
    aovl.set_policy(tmp_path, {"default": {"skills": ["alpha"]}})
    turns = [{"tool_calls": [skill("alpha"), skill("beta")]},
             {"text": "first run done"},
             {"tool_calls": [skill("alpha"), skill("local")]},
             {"text": "resumed run done"}]
    sid, proc = aovl.scripted(target, tmp_path, turns)
    assert proc.returncode == 0, proc.err
    assert [s["name"] for s in aovl.system(sid)["skills"]["offered"]] == ["alpha", "local"]
    assert "beta" not in aovl.system(sid)["prompt"]
    got = contents(aovl, sid)
    assert not got[0][0] and "ALPHA-BODY" in got[0][1]
    assert got[1][0] and "no skill named 'beta' was offered" in got[1][1]
    # the policy changes while the session is open: the next load re-reads it
    aovl.set_policy(tmp_path, {"default": {"skills": []}})
    proc = aovl("resume", sid, "--note", "go on")
    assert proc.returncode == 0, proc.err
    got = contents(aovl, sid)
    assert got[2][0] and "the policy no longer allows this machine skill" in got[2][1]
    assert "skills: [] (none)" in got[2][1] and "ALPHA-BODY" not in got[2][1]
    assert not got[3][0] and "LOCAL-BODY" in got[3][1]           # the cap is on machine skills
    assert [(e["name"], e["source"]) for e in aovl.loads(sid)] == [("alpha", "machine"),
                                                                   ("local", "project")]
    aovl("rollback", sid, check=0)
    sid2 = run(aovl, target, tmp_path, [])
    assert [s["name"] for s in aovl.system(sid2)["skills"]["offered"]] == ["local"]
