"""Shared fixtures: a temporary OVERLORD_HOME, a temporary target, and the `ovl` CLI runner."""
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SESSION_RE = re.compile(r"^session (\d{8}-\d{6}-[0-9a-f]{6})\b", re.M)


@pytest.fixture
def home(tmp_path, monkeypatch):
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("OVERLORD_HOME", str(path))
    return path


@pytest.fixture
def target(tmp_path):
    t = tmp_path / "target"
    t.mkdir()
    (t / "hello.txt").write_text("hello\n")
    (t / "sub").mkdir()
    (t / "sub" / "a.txt").write_text("a\n")
    return t


class Ovl:
    """Runs the real CLI (`python3 -m overlord`) with the test's environment."""

    def __init__(self, home, backend=None):
        self.home, self.backend = home, backend

    def env(self, extra=None):
        env = dict(os.environ, OVERLORD_HOME=str(self.home), PYTHONPATH=REPO)
        if self.backend:
            env["OVERLORD_TEST_BACKEND"] = self.backend
        env.update(extra or {})
        return env

    def __call__(self, *args, input=None, cwd=None, env=None, timeout=120, check=None):
        proc = subprocess.run([sys.executable, "-m", "overlord", *map(str, args)], input=input,
                              cwd=cwd, env=self.env(env), capture_output=True, timeout=timeout)
        proc.out = proc.stdout.decode("utf-8", "replace")
        proc.err = proc.stderr.decode("utf-8", "replace")
        if check is not None:
            assert proc.returncode == check, (proc.returncode, proc.out, proc.err)
        return proc

    def run(self, target, *cmd, flags=(), check=0, **kw):
        """`overlord run -t target [flags] -- cmd`; returns (sid, proc)."""
        proc = self("run", "-t", target, *flags, "--", *cmd, check=check, **kw)
        m = SESSION_RE.search(proc.out)
        return (m.group(1) if m else None), proc

    def sh(self, target, script, **kw):
        return self.run(target, "sh", "-c", script, **kw)

    def diff(self, sid):
        """[(kind, path)] of `overlord diff`, sorted; the `  (words)` note (types, modes,
        link targets) that may follow a path is left out (see diff_words)."""
        return sorted((kind, path) for kind, path, _ in self.diff_words(sid))

    def diff_words(self, sid):
        """[(kind, path, words or None)] of `overlord diff`, in its order."""
        proc = self("diff", sid, check=0)
        return [split_diff_line(line) for line in proc.out.splitlines()]


DIFF_WORDS_RE = re.compile(r"^(.*)  \((.*)\)$")


def split_diff_line(line):
    """`kind  path` or `kind  path  (words)` -> (kind, path, words or None)."""
    kind, _, rest = line.partition("  ")
    m = DIFF_WORDS_RE.match(rest)
    return (kind, m.group(1), m.group(2)) if m else (kind, rest, None)


def state_of(ovl, sid):
    """The state `overlord sessions` reports for a session, or None."""
    for line in ovl("sessions", check=0).out.splitlines():
        fields = line.split()
        if fields and fields[0] == sid:
            return fields[1]
    return None


def backend_params():
    forced = os.environ.get("OVERLORD_TEST_BACKEND")
    return [forced] if forced else ["kernel", "fuse"]


def require_backend(name):
    """Skip when this host truly lacks the backend; with OVERLORD_REQUIRE_BACKENDS set (CI)
    that is a failure instead."""
    from overlord.sandbox import backends
    ok, why = backends.get(name).probe()
    if not ok:
        if os.environ.get("OVERLORD_REQUIRE_BACKENDS"):
            pytest.fail(f"{name} backend unavailable on a host that must have it: {why}")
        pytest.skip(f"{name} backend unavailable here: {why}")


def require_tool(name):
    """Skip when this host lacks a runtime tool (git, strace); under OVERLORD_REQUIRE_BACKENDS
    (CI, which installs them) that is a failure instead."""
    import shutil
    if not shutil.which(name):
        if os.environ.get("OVERLORD_REQUIRE_BACKENDS"):
            pytest.fail(f"{name} is not installed on a host that must have it")
        pytest.skip(f"{name} is not installed")


def tree(root):
    """{relative path: bytes} of a directory, to prove a tree was not touched."""
    out = {}
    for base, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            p = os.path.join(base, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = os.readlink(p).encode()
            else:
                with open(p, "rb") as f:
                    out[rel] = f.read()
    return out


@pytest.fixture(params=backend_params())
def backend(request):
    """Each engine test runs on every backend; an unavailable one skips (fails on CI)."""
    require_backend(request.param)
    return request.param


@pytest.fixture
def ovl(home, backend):
    return Ovl(home, backend)
