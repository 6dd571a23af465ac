"""Git repositories for the git-aware session tests: made, inspected and changed outside
OVERLORD with the real git, under an operator HOME whose .gitconfig names who commits."""
import hashlib
import json
import os
import subprocess

import pytest

from conftest import Ovl, SESSION_RE, backend_params, require_backend, require_tool

NAME, EMAIL = "Op Erator", "op@example.org"


class Git:
    """The person at the keyboard: git outside OVERLORD, and the `overlord` CLI, with one HOME."""

    def __init__(self, home, overlord_home, backend):
        self.home = home
        self.ovl = Ovl(overlord_home, backend)
        self.backend = backend
        self.env = {"HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C",
                    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
                    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}

    def git(self, cwd, *args, check=True):
        env = dict(os.environ, **self.env)
        for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
            env.pop(k, None)
        proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
        if check:
            assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout.strip() if check else proc

    def __call__(self, *args, **kw):
        env = dict(self.env, **kw.pop("env", {}))
        return self.ovl(*args, env=env, **kw)

    def run(self, target, script, flags=(), check=0):
        """`overlord run [flags] -t target -- sh -c script` -> (sid, proc)."""
        proc = self("run", *flags, "-t", target, "--", "sh", "-c", script, check=check)
        m = SESSION_RE.search(proc.out)
        return (m.group(1) if m else None), proc

    def exec(self, sid, script, check=0):
        return self("exec", sid, "--", "sh", "-c", script, check=check)

    def repo(self, path, files=None, branch="main"):
        """A clone-like repository with one commit (no user.* of its own: the operator's)."""
        os.makedirs(path)
        self.git(path, "init", "-q", "-b", branch)
        for name, text in (files or {"README": "hello\n"}).items():
            p = os.path.join(path, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        self.git(path, "add", "-A")
        self.git(path, "commit", "-q", "-m", "init")
        return str(path)

    def fsck(self, path):
        proc = self.git(path, "fsck", "--full", "--strict", check=False)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        return proc

    def rev(self, path, what):
        return self.git(path, "rev-parse", what)


def policy(home, **checks):
    """A policy.json lowering the content gate's checks (a `git gc` pack is held to
    checks.secrets, countersign by default: see docs/GATE.md)."""
    with open(os.path.join(home, "policy.json"), "w") as f:
        json.dump({"default": {"checks": checks}}, f)


def snapshot(root):
    """{relative path: (mode, sha256 or link)} of a tree (to prove it was not touched)."""
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(base, name)
            st = os.lstat(p)
            if os.path.islink(p):
                data = os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    data = hashlib.sha256(f.read()).hexdigest()
            else:
                data = None
            out[os.path.relpath(p, root)] = (st.st_mode, data, st.st_mtime_ns)
    return out


def meta(git, sid):
    with open(os.path.join(git.ovl.home, "sessions", sid, "meta.json")) as f:
        return json.load(f)


def git_lines(text):
    return [line for line in text.splitlines() if line.startswith("git")]


def _git(tmp_path, home, backend):
    require_tool("git")
    operator = tmp_path / "operator"
    operator.mkdir()
    (operator / ".gitconfig").write_text(f"[user]\n\tname = {NAME}\n\temail = {EMAIL}\n")
    return Git(operator, home, backend)


@pytest.fixture
def g(tmp_path, home, backend):
    """Git and OVERLORD on each backend (the `backend` fixture)."""
    return _git(tmp_path, home, backend)


# each backend, and the kernel backend jailed too (fuse refuses --jail)
MODES = [(b, j) for b in backend_params() for j in ((False, True) if b == "kernel" else (False,))]


@pytest.fixture(params=MODES, ids=[f"{b}-{'jail' if j else 'nojail'}" for b, j in MODES])
def gm(request, tmp_path, home):
    """(Git, run flags): each backend unjailed, and the kernel backend jailed."""
    backend, jailed = request.param
    require_backend(backend)
    return _git(tmp_path, home, backend), (["--jail"] if jailed else [])
