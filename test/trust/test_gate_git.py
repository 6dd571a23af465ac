"""The content gate on git's own files: a hook or a program-naming config key a session adds is
a git_exec finding (git would run it on the person's machine after commit), git's storage is
not called binary, and a secret committed to git inside the session is found in its object
even when the work tree no longer has it. End to end with `overlord run` + `check` + `commit`
on both backends, the repository made by a real git."""
import json
import secrets
import string
import subprocess

import pytest

from conftest import require_tool
from overlord.trust import gate

GIT = ["git", "-c", "user.name=T", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]


@pytest.fixture
def repo(target):
    require_tool("git")
    subprocess.run([*GIT, "init", "-q", str(target)], check=True)
    (target / "a.txt").write_text("one\n")
    subprocess.run([*GIT, "-C", str(target), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(target), "commit", "-qm", "first"], check=True)
    return target


def policy(home, checks):
    (home / "policy.json").write_text(json.dumps({"default": {"checks": checks}}))


def findings(ovl, sid, code=0):
    proc = ovl("check", sid, "--json", check=code)
    assert "Traceback" not in proc.err
    return json.loads(proc.out)["findings"]


def kinds(found):
    return sorted((f["kind"], f["path"]) for f in found)


G = "git -c user.name=T -c user.email=t@example.com"


def test_an_added_hook_needs_a_countersignature_and_commit_refuses_without_one(ovl, home, repo):
    sid, _ = ovl.sh(repo, "printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/post-checkout && "
                          "chmod +x .git/hooks/post-checkout")
    found = findings(ovl, sid)
    assert kinds(found) == [("git_exec", ".git/hooks/post-checkout")]
    assert found[0]["severity"] == "countersign" and "hook" in found[0]["what"]
    proc = ovl("commit", sid, check=1)
    assert "git_exec" in proc.err and ".git/hooks/post-checkout" in proc.err
    assert not (repo / ".git/hooks/post-checkout").exists()
    policy(home, {"git_exec": "warn"})
    ovl("commit", sid, check=0)
    assert (repo / ".git/hooks/post-checkout").exists()


def test_a_program_naming_config_key_is_named_and_inert_keys_are_not(ovl, repo):
    sid, _ = ovl.sh(repo, f"{G} config core.fsmonitor 'sh -c evil' && {G} config alias.st '!sh -c x'")
    found = findings(ovl, sid)
    assert kinds(found) == [("git_exec", ".git/config")]
    assert "alias.st" in found[0]["what"] and "core.fsmonitor" in found[0]["what"]
    ovl("rollback", sid, check=0)
    sid2, _ = ovl.sh(repo, f"{G} remote add origin https://example.com/r.git && "
                           f"{G} config user.name Someone && {G} branch -q topic && "
                           f"{G} config branch.topic.remote origin")
    assert [f for f in findings(ovl, sid2) if f["kind"] == "git_exec"] == []


def test_a_config_this_cannot_parse_is_a_finding(ovl, repo):
    sid, _ = ovl.sh(repo, "printf '[core] fsmonitor = evil\\n' >> .git/config")
    found = findings(ovl, sid)
    assert kinds(found) == [("git_exec", ".git/config")] and "not parsed" in found[0]["what"]


def test_a_new_nested_repository_is_not_flagged_but_its_hook_is(ovl, repo):
    sid, _ = ovl.sh(repo, f"{G} init -q sub && echo x > sub/f")
    assert [f for f in findings(ovl, sid) if f["kind"] in ("git_exec", "binaries")] == []
    ovl("rollback", sid, check=0)
    sid2, _ = ovl.sh(repo, f"{G} init -q sub2 && printf '#!/bin/sh\\n' > sub2/.git/hooks/pre-commit")
    assert ("git_exec", "sub2/.git/hooks/pre-commit") in kinds(findings(ovl, sid2))


def test_git_storage_is_not_binary_and_a_secret_in_an_object_is_found(ovl, repo):
    key = "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))
    sid, _ = ovl.sh(repo, f"echo 'token = \"{key}\"' > conf.py && {G} add conf.py && "
                          f"{G} commit -qm leak && {G} rm -q conf.py && {G} commit -qm gone")
    found = findings(ovl, sid)
    assert not [f for f in found if f["kind"] == "binaries"], found
    hits = [f for f in found if f["kind"] == "secrets"]
    assert hits and all(f["path"].startswith(".git/objects/") for f in hits)
    assert any("GitHub token" in f["what"] and "git object" in f["what"] for f in hits)
    proc = ovl("check", sid)
    assert key not in proc.out + proc.err and key[4:] not in proc.out + proc.err


def test_a_pack_is_held_to_the_secrets_severity(ovl, repo):
    sid, _ = ovl.sh(repo, f"echo two >> a.txt && {G} commit -qam two && {G} gc -q")
    found = findings(ovl, sid)
    packs = [f for f in found if f["path"].endswith(".pack")]
    assert packs and all(f["kind"] == "secrets" and "pack" in f["what"] for f in packs)
    assert not [f for f in found if f["kind"] == "binaries"]


def test_paths_and_keys_units():
    assert gate.git_exec_path(".git/hooks/pre-push") and gate.git_exec_path("x/.git/config")
    assert gate.git_exec_path(".git/modules/m/hooks/post-merge")
    assert not gate.git_exec_path(".git/hooks/pre-push.sample")
    assert not gate.git_exec_path(".git/refs/heads/main") and not gate.git_exec_path("src/config")
    assert gate._config_entries(b'[remote "o"]\n\turl = u\n') == [("remote.o.url", "u")]
    assert gate._config_entries(b"\x80") is None and gate._config_entries(b"key = v\n") is None
    assert gate._config_entries(b"[core]\n\t# a note \\\n\tfsmonitor = x\n") is None
    # what sends git elsewhere, and a bare repository by its conventional name
    assert gate.git_exec_path(".git/commondir") and gate.git_exec_path(".git/worktrees/w/gitdir")
    assert gate.git_exec_path("docs/.git", "file") and gate.git_exec_path(".git", "symlink")
    assert not gate.git_exec_path("docs/.git", "dir")
    assert gate.git_exec_path(".git/hooks", "symlink") and not gate.git_exec_path(".git/hooks", "dir")
    assert gate.git_exec_path("srv/app.git/hooks/post-receive")


def test_the_real_configs_hooks_path_and_includes_are_held(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text(
        '[core]\n\thooksPath = .husky\n[include]\n\tpath = ../tools/git.inc\n')
    where = gate.Configured(str(tmp_path))
    assert "core.hooksPath .husky" in where.named(".husky/pre-commit")
    assert "includes" in where.named("tools/git.inc")
    assert where.named("src/a.py") is None and where.named(".huskyx/a") is None
