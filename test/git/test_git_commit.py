"""Committing git's files: `--drop git` / `--only git` (alone and with savepoint selectors),
lock files a killed git left (never committed, said in diff), and drift on a ref or the index
made by a person in the real repository meanwhile (refused, naming the ref)."""
import json
import os

from conftest import state_of
from gitlib import g, git_lines, snapshot  # noqa: F401


def refused(proc, *words):
    assert proc.returncode == 1, (proc.returncode, proc.out, proc.err)
    lines = proc.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


COMMIT = "echo new > a.txt && git commit -q -am two"


def test_drop_git_lands_the_work_tree_only(g, tmp_path):
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    dotgit = snapshot(os.path.join(repo, ".git"))
    sid, _ = g.run(repo, COMMIT)
    proc = g("commit", "--drop", "git", sid, check=0)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert snapshot(os.path.join(repo, ".git")) == dotgit          # .git/ untouched
    with open(os.path.join(repo, "a.txt")) as f:
        assert f.read() == "new\n"
    assert g.git(repo, "log", "--format=%s") == "init"
    assert g.git(repo, "status", "--porcelain") == "M a.txt"       # a change to commit in git
    g.fsck(repo)
    log = g("log", sid, check=0).out
    kept, _, dropped = log.partition("dropped (not committed):\n")
    assert "modified  a.txt" in kept and not git_lines(kept), log
    assert git_lines(dropped) and git_lines(dropped)[0].endswith("under .git/"), log
    data = json.loads(g("log", "--json", sid, check=0).out)
    assert data["dropped"] and all(r["class"] == "git" for r in data["dropped"])
    assert "git" not in data                       # nothing of class git was committed


def test_only_git_lands_the_repository_only(g, tmp_path):
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    # (written a day ago: on the same clock tick as the session's write, with the inode
    # number overlay keeps, git could not tell the two files apart by their stat)
    os.utime(os.path.join(repo, "a.txt"), (1e9, 1e9))
    sid, _ = g.run(repo, COMMIT + " && echo untracked > u.txt")
    proc = g("commit", "--only", "git", sid, check=0)
    assert proc.returncode == 0, (proc.out, proc.err)
    g.fsck(repo)
    assert g.git(repo, "log", "--format=%s").splitlines() == ["two", "init"]
    with open(os.path.join(repo, "a.txt")) as f:
        assert f.read() == "old\n"                  # the work tree file stayed as it was
    assert not os.path.exists(os.path.join(repo, "u.txt"))
    assert g.git(repo, "status", "--porcelain") == "M a.txt"       # git sees the tree behind


def test_class_and_savepoint_selectors_combine(g, tmp_path):
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n", "b.txt": "b\n"})
    sid, _ = g.run(repo, COMMIT)                                   # @0: a.txt + its git commit
    g.exec(sid, "echo bb > b.txt && git commit -q -am three")      # @1: b.txt + its git commit
    proc = g("commit", "--only", "layer:1", "--drop", "git", sid, check=0)
    assert proc.returncode == 0, (proc.out, proc.err)
    with open(os.path.join(repo, "b.txt")) as f:
        assert f.read() == "bb\n"
    with open(os.path.join(repo, "a.txt")) as f:
        assert f.read() == "old\n"
    assert g.git(repo, "log", "--format=%s") == "init"
    g.fsck(repo)


def test_only_git_without_git_changes_is_refused(g, tmp_path):
    repo = g.repo(tmp_path / "repo")
    sid, _ = g.run(repo, "echo x > x.txt")
    before = snapshot(repo)
    proc = g("commit", "--only", "git", sid)
    assert proc.returncode == 2 and "matches no change" in proc.err, (proc.out, proc.err)
    proc = g("commit", "--only", "git", "--drop", "git", sid)
    assert proc.returncode == 2 and proc.err.count("\n") == 1, proc.err
    proc = g("commit", "--only", "gti", sid)
    assert proc.returncode == 2 and "git)" in proc.err, proc.err      # the selector list says git
    assert snapshot(repo) == before and state_of(g.ovl, sid) == "pending"


def test_lock_files_a_killed_git_left_are_never_committed(g, tmp_path):
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    # a git killed mid-write leaves its locks (the kill itself: see the next test)
    sid, _ = g.run(repo, COMMIT + " && : > .git/index.lock && cp .git/refs/heads/main "
                   ".git/refs/heads/main.lock && mkdir -p .git/x.lock && : > .git/x.lock/y")
    diff = g("diff", sid, check=0).out
    line, = git_lines(diff)
    for lock in (".git/index.lock", ".git/refs/heads/main.lock", ".git/x.lock"):
        assert f"lock file {lock} left out (never committed)" in line, line
    rows = json.loads(g("diff", "--json", sid, check=0).out)
    assert not [r for r in rows if ".lock" in r["path"]], rows
    summary = json.loads(g("log", "--json", sid, check=0).out)["git"]
    assert summary["left_out"] == [".git/index.lock", ".git/refs/heads/main.lock", ".git/x.lock"]
    proc = g("commit", sid, check=0)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert not [n for n in os.listdir(os.path.join(repo, ".git")) if n.endswith(".lock")]
    assert not os.path.exists(os.path.join(repo, ".git", "refs", "heads", "main.lock"))
    g.fsck(repo)
    g.git(repo, "commit", "--allow-empty", "-q", "-m", "after")  # git takes its locks again


def test_a_git_killed_while_holding_its_lock(g, tmp_path):
    """A real git, killed (SIGKILL) while it waits in an editor with index.lock held."""
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    script = ("echo new > a.txt && "      # commit -a holds index.lock while the editor runs
              "GIT_EDITOR='kill -9 $PPID #' git commit -q -a; test -e .git/index.lock")
    sid, proc = g.run(repo, script)
    assert proc.returncode == 0, (proc.out, proc.err)          # the lock was left behind
    line, = git_lines(g("diff", sid, check=0).out)
    assert "lock file .git/index.lock left out" in line, line
    g("commit", sid, check=0)
    assert not os.path.exists(os.path.join(repo, ".git", "index.lock"))
    assert g.git(repo, "status", "--porcelain") == "M a.txt"    # the index as it was before
    g.fsck(repo)


def _outside_commit(g, repo, name="outside.txt"):
    with open(os.path.join(repo, name), "w") as f:
        f.write("a person's work\n")
    g.git(repo, "add", name)
    g.git(repo, "commit", "-q", "-m", "outside")
    return g.rev(repo, "HEAD")


def test_a_ref_moved_outside_is_refused_naming_it(g, tmp_path):
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    was = g.rev(repo, "main")
    sid, _ = g.run(repo, COMMIT)
    now = _outside_commit(g, repo)
    before = snapshot(repo)
    line = refused(g("commit", sid),
                   f"refs/heads/main moved outside the session: {was[:7]} → {now[:7]}")
    assert line.index("refs/heads/main moved") < line.index("(and ")   # named first
    assert snapshot(repo) == before and state_of(g.ovl, sid) == "pending"


def test_a_ref_moved_outside_while_it_lives_in_packed_refs(g, tmp_path):
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    g.git(repo, "pack-refs", "--all")
    assert not os.path.exists(os.path.join(repo, ".git", "refs", "heads", "main"))
    was = g.rev(repo, "main")
    sid, _ = g.run(repo, COMMIT)
    now = _outside_commit(g, repo)
    refused(g("commit", sid),
            f"refs/heads/main moved outside the session: {was[:7]} → {now[:7]}")


def test_a_loose_ref_made_outside_for_a_ref_the_session_packed(g, tmp_path):
    """The session packs its refs (gc), a person commits meanwhile (a loose ref the session
    never touched): after a commit that loose ref would hide the session's packed one."""
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    g.git(repo, "pack-refs", "--all")
    was = g.rev(repo, "main")
    sid, _ = g.run(repo, COMMIT + " && git pack-refs --all")
    now = _outside_commit(g, repo)
    refused(g("commit", sid),
            f"refs/heads/main moved outside the session: {was[:7]} → {now[:7]}")


def test_the_index_changed_outside_is_drift(g, tmp_path):
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n", "b.txt": "b\n"})
    sid, _ = g.run(repo, "echo new > a.txt && git add a.txt")
    with open(os.path.join(repo, "b.txt"), "w") as f:
        f.write("a person's\n")
    g.git(repo, "add", "b.txt")
    refused(g("commit", sid), "modified-externally: .git/index", "--force")
    proc = g("commit", "--force", sid)                  # the person's call
    assert proc.returncode == 0, (proc.out, proc.err)
    assert g.git(repo, "diff", "--cached", "--name-only") == "a.txt"
    g.fsck(repo)


def test_a_branch_the_session_made_beside_an_outside_commit_lands(g, tmp_path):
    """Drift is per path: a person's commit on main and the session's new branch do not
    conflict (the session never touched main)."""
    repo = g.repo(tmp_path / "repo", {"a.txt": "old\n"})
    sid, _ = g.run(repo, "git branch topic && git update-ref refs/tags/v1 HEAD")
    now = _outside_commit(g, repo)
    line, = git_lines(g("diff", sid, check=0).out)
    assert "new branch topic at " in line and "new tag v1 at " in line, line
    proc = g("commit", sid, check=0)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert g.rev(repo, "main") == now and g.rev(repo, "topic") == g.rev(repo, "v1")
    g.fsck(repo)
