"""Red-team review of the installed launcher and install.sh (issue 18).

Installs into throwaway root-owned prefixes under /var/lib/overlord-test/redteam-*, attacks as
uid 65534. A confirmed hole is an xfail(strict) test that passes once it is fixed; a guard is a
plain test."""
import glob
import os
import shutil
import signal
import subprocess
import tempfile

import pytest

import conftest

REPO = conftest.REPO
BASE = "/var/lib/overlord-test"
NOBODY = 65534
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="install.sh installs as root")


@pytest.fixture(scope="module", autouse=True)
def _tools():
    conftest.require_tool("cc")


def _root_dir(tag="redteam-"):
    os.makedirs(BASE, mode=0o755, exist_ok=True)
    path = tempfile.mkdtemp(prefix=tag, dir=BASE)
    os.chmod(path, 0o755)
    return path


def install(prefix, *extra, env=None, umask=None):
    cmd = ["bash", os.path.join(REPO, "packaging/install.sh"), "--prefix", prefix, "--no-deps", *extra]
    return subprocess.run(cmd, env=env or ENV, capture_output=True, text=True, timeout=300,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def as_nobody(argv, env, cwd="/", timeout=120):
    return subprocess.run(argv, env=env, cwd=cwd, user=NOBODY, group=NOBODY, extra_groups=[],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed():
    top = _root_dir()
    prefix = os.path.join(top, "p")
    proc = install(prefix)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield prefix
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def home():
    """A home of uid 65534's own, with a bin/ it puts first on PATH, and a project."""
    top = _root_dir("redteam-home-")
    for d in ("bin", "proj"):
        os.mkdir(os.path.join(top, d))
    for base, dirs, files in os.walk(top):
        for n in [base] + [os.path.join(base, f) for f in files]:
            os.chown(n, NOBODY, NOBODY)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def plant(path, text, mode=0o755):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    os.chown(path, NOBODY, NOBODY)


SPY = """#!/bin/sh
echo "ran uid=$(id -u) $(grep Seccomp: /proc/self/status | tr -s '\\t ' ' ')" >> {marker}
{tail}
"""


def user_env(home, **kw):
    return dict(HOME=home, PATH=f"{home}/bin:/usr/bin:/bin", LANG="C.UTF-8", **kw)


def marker_lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def confined(lines):
    """Every run of the planted program was under a seccomp filter (a session's confinement)."""
    return all("Seccomp: 2" in line for line in lines)


# ---- the engine, under the launcher, running programs of the caller's choosing on the host ----

def test_jail_git_identity_does_not_run_a_git_from_callers_path(installed, home):
    marker = os.path.join(home, "git-ran")
    plant(os.path.join(home, "bin/git"), SPY.format(marker=marker, tail='exec /usr/bin/git "$@"'))
    plant(os.path.join(home, ".gitconfig"), "[include]\n\tpath = other\n[user]\n\tname = x\n", 0o644)
    proc = as_nobody([installed + "/bin/overlord", "run", "--jail", "-t", home + "/proj", "--", "true"],
                     user_env(home), cwd=home + "/proj")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = marker_lines(marker)
    assert not lines or confined(lines), lines


def test_memory_editor_is_not_run_unconfined(installed, home):
    marker = os.path.join(home, "editor-ran")
    plant(os.path.join(home, "bin/myeditor"), SPY.format(marker=marker, tail="exit 0"))
    proc = as_nobody([installed + "/bin/overlord", "memory", "user", "--edit"],
                     user_env(home, VISUAL="myeditor"), cwd=home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = marker_lines(marker)
    with open(os.path.join(REPO, "docs/INSTALL.md")) as f:
        documented = "EDITOR" in f.read()
    assert documented or not lines or confined(lines), lines


@pytest.fixture(scope="module")
def evil_so():
    """A shared library whose constructor appends to a marker, and an OpenSSL config naming it
    as a provider. Positive control: both do load into the interpreter run directly."""
    top = _root_dir("redteam-so-")
    marker = os.path.join(top, "loaded")
    with open(os.path.join(top, "evil.c"), "w") as f:
        f.write('#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) '
                f'{{ FILE *f = fopen("{marker}", "a"); if (f) {{ fputs("loaded\\n", f); fclose(f); }} }}\n')
    so = os.path.join(top, "evil.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", so, os.path.join(top, "evil.c")], check=True)
    cnf = os.path.join(top, "evil.cnf")
    with open(cnf, "w") as f:
        f.write(f"openssl_conf = init\n[init]\nproviders = prov\n[prov]\np = psec\n"
                f"[psec]\nmodule = {so}\nactivate = 1\n")
    os.chmod(marker.rsplit("/", 1)[0], 0o777)        # nobody may write the marker
    py = os.path.realpath("/usr/bin/python3")
    for var, val in (("LD_PRELOAD", so), ("OPENSSL_CONF", cnf)):
        as_nobody([py, "-I", "-S", "-c", "import hashlib, ssl"], {var: val})
        assert marker_lines(marker), f"positive control: {var} loads code into {py} directly"
        os.unlink(marker)
    yield so, cnf, marker
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("var", ["LD_PRELOAD", "LD_AUDIT", "OPENSSL_CONF"])
def test_code_loading_variables_do_not_reach_the_engine(installed, evil_so, var):
    so, cnf, marker = evil_so
    env = dict(ENV, HOME="/nonexistent", **{var: cnf if var == "OPENSSL_CONF" else so})
    proc = as_nobody([installed + "/bin/overlord", "doctor"], env)    # imports hashlib, ssl
    assert "Traceback" not in proc.stderr, proc.stderr
    assert marker_lines(marker) == [], f"{var} loaded code under the launcher"


def test_python_option_in_argv1_is_not_an_interpreter_option(installed, home):
    marker = os.path.join(home, "c-ran")
    proc = as_nobody([installed + "/bin/overlord", "-c", f"open({marker!r}, 'w')"], user_env(home))
    assert proc.returncode != 0 and not os.path.exists(marker)
    assert "Traceback" not in proc.stderr


# ---- install.sh / install.py ----

def test_prefix_under_a_users_directory_is_refused_and_nothing_created():
    top = _root_dir()
    try:
        os.chown(top, NOBODY, NOBODY)
        proc = install(os.path.join(top, "sub/p"))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.startswith("install.sh: ") and "not owned by root" in proc.stderr
        assert os.listdir(top) == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_prefix_through_a_symlink_a_user_owns_is_refused():
    top = _root_dir()
    try:
        mine = os.path.join(top, "mine")
        os.mkdir(mine)
        os.chown(mine, NOBODY, NOBODY)
        os.symlink(mine, os.path.join(top, "link"))
        proc = install(os.path.join(top, "link/p"))
        assert proc.returncode == 1 and "not owned by root" in proc.stderr, proc.stderr
        assert os.listdir(mine) == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def fresh():
    top = _root_dir()
    yield os.path.join(top, "p")
    shutil.rmtree(top, ignore_errors=True)


def test_tampered_manifest_is_refused_by_uninstall(fresh):
    proc = install(fresh)
    assert proc.returncode == 0, proc.stderr
    path = fresh + "/lib/overlord/install-manifest.json"
    import json
    with open(path) as f:
        m = json.load(f)
    before = os.stat("/etc/passwd")
    for evil in ({"files": dict(m["files"], **{"/etc/passwd": "0"})},
                 {"files": dict(m["files"], **{fresh + "/../../../etc/passwd": "0"})},
                 {"dirs": m["dirs"] + ["/etc"]}):
        with open(path, "w") as f:
            json.dump(dict(m, **evil), f)
        proc = install(fresh, "--uninstall")
        assert proc.returncode == 1 and "not removing anything" in proc.stderr, proc.stderr
        assert os.path.exists(fresh + "/bin/overlord")
    assert os.stat("/etc/passwd").st_ino == before.st_ino and os.path.isdir("/etc")


def test_foreign_file_refused_before_anything_moves(fresh):
    os.makedirs(fresh + "/bin")
    with open(fresh + "/bin/overlord", "w") as f:
        f.write("not ours\n")
    proc = install(fresh)
    assert proc.returncode == 1 and "is not OVERLORD's" in proc.stderr, proc.stderr
    assert sorted(os.listdir(fresh)) == ["bin"] and os.listdir(fresh + "/bin") == ["overlord"]
    with open(fresh + "/bin/overlord") as f:
        assert f.read() == "not ours\n"


@pytest.mark.parametrize("umask", [0o077, 0o000])
def test_umask_does_not_change_the_installed_modes(fresh, umask):
    proc = install(fresh, umask=umask)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for base, dirs, files in os.walk(os.path.dirname(fresh)):
        for n in dirs + files:
            st = os.lstat(os.path.join(base, n))
            want = 0o755 if n in dirs or n == "overlord" and base.endswith("/bin") else 0o644
            assert st.st_mode & 0o7777 == want, (os.path.join(base, n), oct(st.st_mode))
    run = as_nobody([fresh + "/bin/overlord", "--version"], dict(ENV, HOME="/nonexistent"))
    assert run.returncode == 0, run.stderr


# Kill install.py itself after some of its placing renames (as SIGKILL, or a plain `kill`).
KILLER = """
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("install", {path!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
real, n = os.rename, [0]
def rename(a, b, *k, **kw):
    if not os.path.basename(b).startswith(".overlord-install-") and "/.overlord-install-" not in b:
        n[0] += 1
        if n[0] == {after}:
            os.kill(os.getpid(), signal.{sig})
    return real(a, b, *k, **kw)
os.rename = rename
sys.exit(mod.main(["--prefix", {prefix!r}, "--python", {python!r}]))
"""


def killed_install(prefix, sig, after=5):
    script = KILLER.format(path=os.path.join(REPO, "packaging/install.py"), after=after, sig=sig,
                           prefix=prefix, python=os.path.realpath("/usr/bin/python3"))
    return subprocess.run([os.path.realpath("/usr/bin/python3"), "-I", "-S", "-c", script],
                          env=ENV, capture_output=True, text=True, timeout=300)


def test_rerun_after_sigkill_mid_placement_recovers(fresh):
    proc = killed_install(fresh, "SIGKILL")
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert os.path.exists(fresh)                         # it did get to place something
    proc = install(fresh)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert glob.glob(fresh + "/.overlord-install-*") == []
    assert glob.glob("/etc/.overlord-install-*") == []


def test_sigterm_mid_placement_leaves_nothing(fresh):
    proc = killed_install(fresh, "SIGTERM")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    left = [os.path.join(b, n) for b, ds, fs in os.walk(os.path.dirname(fresh)) for n in fs]
    assert left == [], left[:5]


def test_sigint_mid_placement_rolls_back(fresh):
    proc = killed_install(fresh, "SIGINT")
    assert proc.returncode != 0
    left = [os.path.join(b, n) for b, ds, fs in os.walk(os.path.dirname(fresh)) for n in fs]
    assert left == [], left[:5]


def test_sigint_mid_placement_says_one_line(fresh):
    proc = killed_install(fresh, "SIGINT")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-300:]
