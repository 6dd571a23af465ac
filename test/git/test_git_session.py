"""git inside a session on a normal clone: status, add, commit, checkout -b, stash, a hook and
gc, jailed and not; `overlord commit` replays it so that `git fsck --full` passes and `git log`
shows the commits, branches and stash; diff and log group the files under .git/ in one line."""
import json
import os
import subprocess

import pytest

from conftest import require_backend
from gitlib import EMAIL, NAME, _git, g, gm, git_lines, policy, snapshot  # noqa: F401

WORK = ("git status --short > status.out && echo b > b.txt && git add b.txt && "
        "git commit -q -m two && git checkout -q -b feat && echo c > c.txt && git add c.txt && "
        "git stash -q && git log --format=%an%x09%ae%x09%s -1 main > who.out && "
        "git gc -q && git count-objects -v > count.out")


def test_git_in_a_session_commits_onto_the_real_repository(gm, tmp_path):
    g, flags = gm
    repo = g.repo(tmp_path / "repo", {"a.txt": "a\n"})
    hooks = os.path.join(repo, ".git", "hooks", "pre-commit")
    with open(hooks, "w") as f:
        f.write("#!/bin/sh\necho ran >> \"$(git rev-parse --show-toplevel)/hook.out\"\n")
    os.chmod(hooks, 0o755)
    policy(g.ovl.home, secrets="warn")          # the gc's pack is held to checks.secrets
    main_before = g.rev(repo, "main")
    before = snapshot(repo)
    sid, proc = g.run(repo, WORK, flags)
    assert sid and proc.returncode == 0, (proc.out, proc.err)
    assert snapshot(repo) == before                       # nothing landed before commit

    # one line for everything under .git/, no object file listed
    diff = g("diff", sid, check=0).out
    lines = git_lines(diff)
    assert len(lines) == 1 and ".git/" not in diff.replace(lines[0], ""), diff
    line = lines[0]
    assert f"refs/heads/main moved {main_before[:7]} → " in line, line
    assert "new branch feat at " in line and "stash saved at " in line, line
    assert "HEAD refs/heads/main → refs/heads/feat" in line and "1 pack added" in line, line
    assert "index changed" in line, line
    for name in ("added  b.txt", "added  hook.out", "added  status.out"):
        assert name in diff.splitlines(), diff
    log = g("log", sid, check=0).out
    assert git_lines(log) == lines, log

    # --json keeps every path and adds the summary
    rows = json.loads(g("diff", "--json", sid, check=0).out)
    git_rows = [r for r in rows if r.get("class") == "git"]
    assert git_rows and all(r["path"].startswith(".git") for r in git_rows)
    assert all("class" not in r for r in rows if not r["path"].startswith(".git"))
    data = json.loads(g("log", "--json", sid, check=0).out)
    repo_summary, = data["git"]["repos"]
    refs = {r["name"]: r for r in repo_summary["refs"]}
    assert refs["refs/heads/main"]["before"] == main_before
    assert refs["refs/heads/main"]["change"] == "moved"
    assert refs["refs/heads/feat"]["change"] == "created" and refs["refs/stash"]["change"] == "created"
    assert repo_summary["line"] == line

    proc = g("commit", sid, check=0)
    assert proc.returncode == 0, (proc.out, proc.err)
    g.fsck(repo)
    assert g.git(repo, "log", "--format=%s", "main").splitlines() == ["two", "init"]
    assert g.rev(repo, "main") == refs["refs/heads/main"]["after"]
    assert g.git(repo, "branch", "--format=%(refname:short)").splitlines() == ["feat", "main"]
    assert g.git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "feat"
    assert g.git(repo, "stash", "list").startswith("stash@{0}: WIP on feat")
    assert g.git(repo, "stash", "show", "--name-only") == "c.txt"
    assert g.git(repo, "status", "--porcelain", "-uno") == ""      # index and tree agree
    with open(os.path.join(repo, "hook.out")) as f:
        assert f.read() == "ran\n"                                 # the pre-commit hook ran
    with open(os.path.join(repo, "who.out")) as f:
        assert f.read() == f"{NAME}\t{EMAIL}\ttwo\n"               # the operator's identity
    with open(os.path.join(repo, "count.out")) as f:
        assert "count: 0\n" in f.read()                            # gc packed the loose ones
    assert not os.listdir(os.path.join(repo, ".git", "refs", "heads"))   # packed by gc
    # the committed log still says it in one line
    assert git_lines(g("log", sid, check=0).out) == lines


def test_the_repository_s_own_identity_wins_in_the_jail(gm, tmp_path):
    g, flags = gm
    repo = g.repo(tmp_path / "repo")
    g.git(repo, "config", "user.name", "Repo Person")
    g.git(repo, "config", "user.email", "repo@example.org")
    sid, proc = g.run(repo, "echo x > x && git add x && git commit -q -m x && "
                            "git log -1 --format=%an%x09%ae > who.out", flags)
    assert proc.returncode == 0, (proc.out, proc.err)
    g("commit", sid, check=0)
    with open(os.path.join(repo, "who.out")) as f:
        assert f.read() == "Repo Person\trepo@example.org\n"
    g.fsck(repo)


@pytest.mark.second_user
def test_the_jail_trusts_a_repository_another_user_owns(tmp_path, home):
    """Inside the jail git's ownership check guards nothing (what the repository's config
    runs, runs jailed): safe.directory names the target in the jail's own git config. (The
    jail is the kernel backend's; making a tree another user owns needs root.)"""
    require_backend("kernel")
    g = _git(tmp_path, home, "kernel")
    repo = g.repo(tmp_path / "repo")
    for base, dirs, files in os.walk(repo):
        for name in dirs + files + [""]:
            os.lchown(os.path.join(base, name), 4242, 4242)
    assert "dubious ownership" in g.git(repo, "status", check=False).stderr
    # (root holds no capability in the jail: it reads this tree, but cannot write it)
    _, proc = g.run(repo, "git status --porcelain=v2 --branch && git log --format=%s", ["--jail"])
    assert proc.returncode == 0 and "dubious" not in proc.err, (proc.out, proc.err)
    assert "# branch.head main" in proc.out and "\ninit\n" in proc.out, proc.out


def test_a_session_that_only_reads_git_changes_at_most_the_index(gm, tmp_path):
    g, flags = gm
    repo = g.repo(tmp_path / "repo", {"a": "1\n"})
    sid, proc = g.run(repo, "git log --oneline > log.out; git diff --stat; git status", flags)
    assert proc.returncode == 0, (proc.out, proc.err)
    diff = g("diff", sid, check=0).out
    assert git_lines(diff) in ([], ["git: index changed"]), diff
    assert "added  log.out" in diff.splitlines()
    g("commit", sid, check=0)
    g.fsck(repo)


MODES = "find .git inner/.git -type f -path '*/objects/*' -exec stat -c '%n %a' {} + | sort"


def test_hard_links_and_read_only_objects_survive_the_replay(gm, tmp_path):
    """Loose objects and packs are 0444; a clone inside the session copies them into a
    second repository (--no-hardlinks: an overlay reports another inode number for a new
    link to a copied-up file, which git's clone --local refuses, see docs/GIT.md), and a
    file there is hard-linked; a repack deletes them from the first."""
    g, flags = gm
    repo = g.repo(tmp_path / "repo", {f"f{i}": f"{i}\n" for i in range(5)})
    policy(g.ovl.home, secrets="warn")
    sid, proc = g.run(repo, "git clone -q --no-hardlinks . inner && echo z > z && git add z && "
                            "git commit -q -m z && git repack -q -a -d && git prune && "
                            "ln inner/.git/HEAD inner/.git/HEAD.link && "
                            f"{MODES} > modes.out", flags)
    assert proc.returncode == 0, (proc.out, proc.err)
    lines = git_lines(g("diff", sid, check=0).out)
    assert [line.split(":")[0] for line in lines] == ["git", "git (inner/.git)"], lines
    assert "loose objects removed" in lines[0] or "loose object removed" in lines[0], lines
    proc = g("commit", sid, check=0)
    assert proc.returncode == 0, (proc.out, proc.err)
    g.fsck(repo)
    g.fsck(os.path.join(repo, "inner"))
    assert g.git(os.path.join(repo, "inner"), "log", "--format=%s") == "init"
    with open(os.path.join(repo, "inner", ".git", "HEAD.link")) as f:
        assert f.read() == "ref: refs/heads/main\n"
    assert g.git(repo, "log", "--format=%s", "-1") == "z"
    with open(os.path.join(repo, "modes.out")) as f:
        seen = f.read()
    assert " 444\n" in seen, seen                       # read-only objects and packs among them
    assert subprocess.run(["sh", "-c", MODES], cwd=repo, capture_output=True,
                          text=True).stdout == seen       # as the session left them


def test_a_repository_made_in_the_session(gm, tmp_path):
    """`git init` where there was none: a new repository, its hooks by name (the samples
    git never runs are counted with the rest), committed whole."""
    g, flags = gm
    target = tmp_path / "t"
    target.mkdir()
    (target / "a").write_text("a\n")
    policy(g.ovl.home, git_exec="warn")                  # the hook needs no countersignature here
    sid, proc = g.run(str(target), "git init -q -b main && git add a && git commit -q -m first && "
                                   "printf '#!/bin/sh\\n' > .git/hooks/post-commit && "
                                   "chmod +x .git/hooks/post-commit", flags)
    assert proc.returncode == 0, (proc.out, proc.err)
    line, = git_lines(g("diff", sid).out)
    assert line.startswith("git: new repository, 3 objects, new branch main at "), line
    assert "config added, hook post-commit added, " in line and ".sample" not in line, line
    patch = g("diff", "--patch", sid).out
    assert "+++ b/.git/hooks/post-commit" in patch and "+++ b/.git/config" in patch, patch
    assert "objects/" not in patch, patch                  # the storage is summarized, not shown
    proc = g("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    g.fsck(str(target))
    assert g.git(str(target), "log", "--format=%s") == "first"
