"""Targets whose git directory lies outside them -- a linked worktree (`.git` is a file:
`gitdir: /main/.git/worktrees/wt`, its common dir /main/.git) and a submodule checkout (its git
dir in the superproject's .git/modules) -- and broken repositories as targets.

Jailed (kernel backend) the external git directories are bound read-only at their real paths:
git status/log/diff work, a write fails with EROFS, the host's git dir never moves. Unjailed,
git would write them outside the transaction: the session is refused, with one line."""
import json
import os

import pytest

from conftest import require_backend
from gitlib import _git, g, git_lines, meta, snapshot  # noqa: F401


@pytest.fixture
def kg(tmp_path, home):
    """Git with the kernel backend (the jail is its own)."""
    require_backend("kernel")
    return _git(tmp_path, home, "kernel")


def worktree(g, tmp_path):
    main = g.repo(tmp_path / "main", {"a.txt": "a\n"})
    wt = str(tmp_path / "wt")
    g.git(main, "worktree", "add", "-q", "-b", "topic", wt)
    return main, wt


def submodule(g, tmp_path):
    lib = g.repo(tmp_path / "lib", {"lib.txt": "lib\n"})
    sup = g.repo(tmp_path / "super", {"s.txt": "s\n"})
    g.git(sup, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib, "sub")
    g.git(sup, "commit", "-q", "-m", "sub")
    return sup, os.path.join(sup, "sub")


def test_a_jailed_session_reads_a_linked_worktree_and_cannot_write_its_git_dir(kg, tmp_path):
    main, wt = worktree(kg, tmp_path)
    with open(os.path.join(wt, ".git")) as f:
        assert f.read().startswith(f"gitdir: {main}/.git/worktrees/wt")
    host = snapshot(os.path.join(main, ".git"))
    script = ("git status --porcelain --branch && git log --format=%s && echo b >> a.txt && "
              "git diff --stat && git commit -q -am two; echo commit=$?; "
              "touch ../main/.git/worktrees/wt/probe; echo write=$?")
    sid, proc = kg.run(wt, script, ["--jail"])
    assert proc.returncode == 0, (proc.out, proc.err)
    assert "## topic" in proc.out and "\ninit\n" in proc.out, proc.out
    assert "a.txt | 1 +" in proc.out, proc.out                          # git diff worked
    assert "commit=128" in proc.out and "Read-only file system" in proc.err, (proc.out, proc.err)
    assert "write=1" in proc.out, proc.out
    assert snapshot(os.path.join(main, ".git")) == host                  # never written
    # the record says which directories are read-only (the denials read it)
    record = meta(kg, sid)["git"]
    assert record["kind"] == "worktree" and record["readonly"] == [f"{main}/.git"], record
    assert {e["role"] for e in record["external"]} == {"git dir", "common dir"}
    assert kg("diff", sid).out.splitlines() == ["modified  a.txt"]
    proc = kg("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert snapshot(os.path.join(main, ".git")) == host
    assert kg.git(wt, "status", "--porcelain") == "M a.txt"


def test_an_unjailed_session_on_a_linked_worktree_is_refused(g, tmp_path):
    main, wt = worktree(g, tmp_path)
    before = snapshot(tmp_path)
    proc = g("run", "-t", wt, "--", "git", "commit", "--allow-empty", "-m", "x")
    assert proc.returncode == 1 and proc.out == "", (proc.out, proc.err)
    line, = proc.err.splitlines()
    assert line.startswith("overlord: the target is a linked worktree whose git directory "
                           f"{main}/.git lies outside it"), line
    assert "--jail" in line and f"target the main repository {main}" in line, line
    assert snapshot(tmp_path) == before
    assert g("sessions").out == ""                                       # nothing opened


def test_a_submodule_with_its_git_dir_outside_the_target(g, tmp_path):
    sup, sub = submodule(g, tmp_path)
    gitdir = os.path.join(sup, ".git", "modules", "sub")
    proc = g("run", "-t", sub, "--", "true")
    assert proc.returncode == 1 and f"a submodule whose git directory {gitdir}" in proc.err, proc.err
    if g.backend != "kernel":
        return                          # (no jail on fuse: the refusal is the whole story)
    host = snapshot(gitdir)
    sid, proc = g.run(sub, "git log --format=%s && git status --porcelain && echo x > new && "
                           "git add new; echo add=$?", ["--jail"])
    assert proc.returncode == 0 and "\ninit\n" in "\n" + proc.out, (proc.out, proc.err)
    assert "add=128" in proc.out and "Read-only file system" in proc.err, (proc.out, proc.err)
    assert snapshot(gitdir) == host
    assert meta(g, sid)["git"]["readonly"] == [gitdir]
    g("commit", sid)
    assert os.path.exists(os.path.join(sub, "new"))


def test_a_gitdir_file_naming_a_strangers_repository_binds_nothing(kg, tmp_path):
    """A `.git` file is data in the tree (a session could have written it): it names another
    repository, whose git dir does not name this tree back -- never bound into the jail."""
    other = kg.repo(tmp_path / "secret", {"key.txt": "secret\n"})
    target = tmp_path / "t"
    target.mkdir()
    (target / ".git").write_text(f"gitdir: {other}/.git\n")
    sid, proc = kg.run(str(target), f"ls {other}/.git/HEAD; git log 2>&1 | head -1; echo x > x",
                       ["--jail"])
    assert proc.returncode == 0, (proc.out, proc.err)
    assert "No such file" in proc.err and "not a git repository" in proc.out, (proc.out, proc.err)
    record = meta(kg, sid)["git"]
    assert record["readonly"] == [] and "names no worktree" in record["problem"], record
    proc = kg("run", "-t", str(target), "--stack", "--", "true")     # unjailed: git would use it
    assert proc.returncode == 1 and "lies outside it" in proc.err, proc.err


@pytest.mark.parametrize("broken", ["nowhere", "garbage-head"])
def test_a_broken_repository_as_target(g, tmp_path, broken):
    """diff, log and commit still work; the git summary says what is wrong, no traceback."""
    target = tmp_path / "t"
    if broken == "nowhere":
        target.mkdir()
        (target / ".git").write_text("gitdir: /nowhere/at/all\n")
        script = "git status; echo x > x.txt; echo 'gitdir: /elsewhere' > .git"
    else:
        g.repo(target)
        (target / ".git" / "HEAD").write_text("garbage\n")
        script = "git status; echo x > x.txt; echo more > .git/description; : > .git/index.lock"
    sid, proc = g.run(str(target), script)
    assert proc.returncode == 0 and "Traceback" not in proc.err, (proc.out, proc.err)
    for args in (("diff", sid), ("log", sid), ("diff", "--patch", sid), ("log", "--json", sid),
                 ("diff", "--json", sid)):
        proc = g(*args)
        assert proc.returncode == 0 and proc.err == "", (args, proc.out, proc.err)
    line, = git_lines(g("diff", sid).out)
    if broken == "nowhere":
        assert line == "git: .git changed, .git points to /elsewhere, which is not a directory", line
    else:
        assert "HEAD is unreadable" in line and "1 other file" in line, line
        assert "lock file .git/index.lock left out" in line, line
    if broken == "nowhere":      # a .git file rewritten sends git elsewhere: the gate holds it
        proc = g("commit", sid)
        assert proc.returncode == 1 and "git_exec in .git" in proc.err, proc.err
        (g.ovl.home / "policy.json").write_text('{"default": {"checks": {"git_exec": "warn"}}}')
    proc = g("commit", sid)
    assert proc.returncode == 0, (proc.out, proc.err)
    assert (target / "x.txt").read_text() == "x\n"
    assert git_lines(g("log", sid).out) == [line]
    assert json.loads(g("log", "--json", sid).out)["git"]["repos"][0]["line"] == line


def test_the_summary_costs_the_change_not_the_repository(g, tmp_path, monkeypatch):
    """A repository with 2000 loose objects and 600 loose refs; a session that moves one ref:
    summarizing opens a handful of files, never a listing of objects or refs."""
    repo = g.repo(tmp_path / "repo", {f"d{i // 100}/f{i}": f"{i}\n" for i in range(2000)})
    head = g.rev(repo, "HEAD")
    for i in range(600):
        with open(os.path.join(repo, ".git", "refs", "tags", f"t{i}"), "w") as f:
            f.write(head + "\n")
    assert len(g.git(repo, "tag").split()) == 600
    sid, _ = g.run(repo, "echo x > x && git add x && git commit -q -m x")
    from overlord import ops
    from overlord.txn import gitdir
    monkeypatch.setenv("OVERLORD_HOME", str(g.ovl.home))
    changes = ops.diff(sid)
    opened, listed = [], []
    real_open, real_listdir = os.open, os.listdir
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    monkeypatch.setattr(os, "listdir", lambda *a, **k: listed.append(a) or real_listdir(*a, **k))
    summary = gitdir.summarize(str(repo), changes)
    monkeypatch.undo()
    assert summary["repos"][0]["refs"][0]["name"] == "refs/heads/main"
    assert not listed, listed
    assert len(opened) < 40, len(opened)            # a few components per ref file read
