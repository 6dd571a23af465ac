"""packaging/install.sh on this host, into throwaway prefixes (root-owned, not world-writable:
/var/lib/overlord-test/install-*), with --no-deps (the host has the dependencies). Each run
uses a copy of the checkout, so an upgrade can change the sources. The fresh-machine proof
(a debootstrap root, with the dependencies installed) is test_fresh_machine.py."""
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

import conftest

REPO = conftest.REPO
BASE = "/var/lib/overlord-test"
PYTHON = os.path.realpath("/usr/bin/python3")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
STEPS = ("deps:", "engine:", "launcher:", "units:", "skills:", "apparmor:", "placed:", "manifest:",
         "doctor:")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="install.sh installs as root")


@pytest.fixture(scope="module", autouse=True)
def _tools():
    conftest.require_tool("cc")


def _root_dir(prefix):
    os.makedirs(BASE, mode=0o755, exist_ok=True)
    path = tempfile.mkdtemp(prefix=prefix, dir=BASE)
    os.chmod(path, 0o755)
    return path


def _remove(path):
    subprocess.run(["chattr", "-R", "-i", path], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def copy_checkout():
    """What install.sh reads from a checkout, copied (no __pycache__)."""
    dest = _root_dir("checkout-")
    skip = shutil.ignore_patterns("__pycache__")
    for name in ("overlord", "packaging", "skills"):
        shutil.copytree(os.path.join(REPO, name), os.path.join(dest, name), ignore=skip)
    shutil.copy(os.path.join(REPO, "overlord_client.py"), dest)
    return dest


@pytest.fixture(scope="module")
def checkout():
    path = copy_checkout()
    yield path
    _remove(path)


@pytest.fixture
def own_checkout():
    path = copy_checkout()
    yield path
    _remove(path)


def _new_prefix():
    return _root_dir("install-")


@pytest.fixture
def prefix():
    path = _new_prefix()
    yield path
    _remove(path)


def install(checkout, *args, env=None, prefix=None, umask=0o022, wrap=(), cwd=None):
    """bash packaging/install.sh [--prefix P --no-deps] args; stdout/stderr as text."""
    cmd = ["bash", os.path.join(checkout, "packaging/install.sh")]
    if prefix:
        cmd += ["--prefix", prefix, "--no-deps"]
    with tempfile.TemporaryDirectory() as home:          # doctor's, unless the test gives one
        full_env = {**ENV, "OVERLORD_HOME": home, **(env or {})}
        return subprocess.run([*wrap, *cmd, *args], env=full_env, capture_output=True, text=True,
                              timeout=300, cwd=cwd, preexec_fn=lambda: os.umask(umask))


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def state(top, dir_mtimes=False):
    """Every entry under top: dirs by mode and owner (and mtime), files also by inode, mtime
    and sha256."""
    out = {}
    for base, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(base, name)
            st = os.lstat(path)
            key = os.path.relpath(path, top)
            if os.path.isdir(path) and not os.path.islink(path):
                out[key] = ("dir", st.st_mode, st.st_uid, st.st_gid) + ((st.st_mtime_ns,) if dir_mtimes else ())
            else:
                out[key] = ("file", st.st_mode, st.st_uid, st.st_gid, st.st_ino, st.st_mtime_ns,
                            sha(path) if os.path.isfile(path) else os.readlink(path))
    return out


def refused(proc, line):
    """One line on stderr, starting `install.sh:`, no traceback, a non-zero exit."""
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [line], (proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def installed(checkout):
    """One install, under umask 077 (the modes must not depend on it), shared by the tests that
    only read it."""
    path = _new_prefix()
    home = tempfile.mkdtemp()
    try:
        proc = install(checkout, prefix=path, umask=0o077, env={"OVERLORD_HOME": home})
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        yield path, proc
    finally:
        _remove(path)
        shutil.rmtree(home)


# ---- a full install ----

def test_layout_owners_modes_and_manifest(installed, checkout):
    prefix, proc = installed
    lib, bindir = prefix + "/lib/overlord", prefix + "/bin"
    lines = proc.stdout.splitlines()
    for step in STEPS:
        assert any(line.startswith(step) for line in lines), (step, proc.stdout)
    assert "apparmor: not active here (e.g. WSL2, this kernel): no profile needed" in lines
    assert proc.stderr == ""

    # the engine: exactly the checkout's .py files, web/static/*, agent/demo.json, each with a
    # checked-hash pyc; nothing else
    want = set()
    for base, dirs, files in os.walk(os.path.join(checkout, "overlord")):
        rel = os.path.relpath(base, checkout)
        want |= {os.path.join(rel, n) for n in files if n.endswith(".py")}
    want |= {"overlord/web/static/" + n for n in os.listdir(checkout + "/overlord/web/static")}
    want.add("overlord/agent/demo.json")
    got = set()
    for base, dirs, files in os.walk(lib + "/overlord"):
        got |= {os.path.relpath(os.path.join(base, n), lib) for n in files if not n.endswith(".pyc")}
    assert got == want
    for rel in want:
        assert sha(os.path.join(lib, rel)) == sha(os.path.join(checkout, rel)), rel
        if rel.endswith(".py"):
            d, name = os.path.split(os.path.join(lib, rel))
            pyc = os.path.join(d, "__pycache__", name[:-3] + ".cpython-%d%d.pyc" % _pyver())
            with open(pyc, "rb") as f:
                assert int.from_bytes(f.read(8)[4:], "little") == 0b11, rel   # checked hash
    assert sha(lib + "/overlord_client.py") == sha(checkout + "/overlord_client.py")
    with open(lib + "/main.py") as f:
        assert f.read() == (
            "# Generated by packaging/install.sh: the entry point of %s/overlord.\n"
            "import sys\n"
            'sys.path.insert(0, "%s")\n'
            'sys.argv[0] = "%s/overlord"\n'
            "from overlord.cli.main import main\n"
            "sys.exit(main())\n") % (bindir, lib, bindir)

    with open(bindir + "/overlord", "rb") as f:
        assert f.read(4) == b"\x7fELF"
    units = sorted(n for n in os.listdir(checkout + "/packaging") if n.endswith((".service", ".timer")))
    assert "overlord-ui.service" in units
    for name in units:
        where = "system" if name == "overlord-ui.service" else "user"
        with open(f"{checkout}/packaging/{name}") as f:
            text = f.read().replace("/usr/local/", prefix + "/")
        with open(f"{prefix}/lib/systemd/{where}/{name}") as f:
            assert f.read() == text, name
    for base, dirs, files in os.walk(checkout + "/skills"):
        for n in files:
            rel = os.path.relpath(os.path.join(base, n), checkout + "/skills")
            assert sha(f"{prefix}/share/overlord/skills/{rel}") == sha(os.path.join(base, n))

    # root's, 0644/0755, whatever the umask (this install ran under 077)
    everything = state(prefix)
    for rel, st in everything.items():
        mode = 0o755 if st[0] == "dir" or rel == "bin/overlord" else 0o644
        assert (st[1] & 0o7777, st[2], st[3]) == (mode, 0, 0), rel

    with open(lib + "/install-manifest.json") as f:
        m = json.load(f)
    assert (m["version"], m["prefix"], m["python"]) == (1, prefix, PYTHON)
    assert m["files"] == {os.path.join(prefix, rel): st[6] for rel, st in everything.items()
                          if st[0] == "file" and rel != "lib/overlord/install-manifest.json"}
    assert sorted(m["dirs"]) == sorted(os.path.join(prefix, r) for r, st in everything.items()
                                       if st[0] == "dir")


@functools.lru_cache(None)
def _pyver():
    out = subprocess.run([PYTHON, "-c", "import sys; print(*sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def test_installed_launcher_runs_doctor_and_a_transaction(installed, tmp_path):
    prefix, proc = installed
    overlord = prefix + "/bin/overlord"
    env = dict(ENV, OVERLORD_HOME=str(tmp_path / "home"))

    def ovl(*args, check=0):
        p = subprocess.run([overlord, *args], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == check, (args, p.stdout, p.stderr)
        return p.stdout

    assert re.search(r"^active backend: (kernel|fuse)$", ovl("doctor"), re.M)
    target = tmp_path / "target"
    target.mkdir()
    (target / "a.txt").write_text("a\n")
    out = ovl("run", "-t", str(target), "--", "sh", "-c", "echo b > b.txt; rm a.txt")
    sid = conftest.SESSION_RE.search(out).group(1)
    assert sorted(os.listdir(target)) == ["a.txt"]
    diff = ovl("diff", sid)
    assert "b.txt" in diff and "a.txt" in diff
    ovl("commit", sid)
    assert sorted(os.listdir(target)) == ["b.txt"]
    assert (target / "b.txt").read_text() == "b\n"


def test_second_run_changes_nothing_and_says_so(installed, checkout):
    prefix, _ = installed
    before = state(prefix, dir_mtimes=True), os.stat(prefix).st_mtime_ns
    proc = install(checkout, prefix=prefix)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert f"nothing to change: OVERLORD at {prefix} is up to date" in proc.stdout.splitlines()
    assert "placed:" not in proc.stdout
    assert (state(prefix, dir_mtimes=True), os.stat(prefix).st_mtime_ns) == before


def test_a_doctor_that_fails_is_reported_not_a_failed_install(checkout, prefix):
    """An interpreter in a group-writable dir: install.sh takes it, the launcher refuses it
    (exit 126), so doctor fails; the install still stands, and says what happened."""
    pydir = _root_dir("python-")
    try:
        os.chmod(pydir, 0o775)
        shutil.copy2(PYTHON, pydir)
        proc = install(checkout, "--python", os.path.join(pydir, os.path.basename(PYTHON)), prefix=prefix)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert "doctor: exit 126 (the install itself is complete: see the lines above)" \
            in proc.stdout.splitlines(), proc.stdout
        assert "overlord: refusing to start: " in proc.stdout
        assert os.path.exists(prefix + "/lib/overlord/install-manifest.json")
    finally:
        shutil.rmtree(pydir)


# ---- upgrades and rollback ----

def _change_sources(checkout):
    """A new subpackage, a changed skill file, a skill gone."""
    os.mkdir(checkout + "/overlord/newpkg")
    with open(checkout + "/overlord/newpkg/__init__.py", "w") as f:
        f.write("X = 1\n")
    with open(checkout + "/skills/release-notes/template.md", "a") as f:
        f.write("\nchanged\n")
    shutil.rmtree(checkout + "/skills/python-testing")


def test_upgrade_replaces_changed_and_removes_what_is_gone(own_checkout, prefix):
    assert install(own_checkout, prefix=prefix).returncode == 0
    before = state(prefix)
    _change_sources(own_checkout)
    proc = install(own_checkout, prefix=prefix)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    after = state(prefix)
    skills = "share/overlord/skills/"
    assert not any(k.startswith(skills + "python-testing") for k in after)
    assert after[skills + "release-notes/template.md"][6] == sha(own_checkout + "/skills/release-notes/template.md")
    assert "lib/overlord/overlord/newpkg/__pycache__" in after
    for rel, st in before.items():                   # what did not change was not touched
        if rel in after and st[0] == "file" and "manifest" not in rel and "template.md" not in rel:
            assert after[rel] == st, rel
    with open(prefix + "/lib/overlord/install-manifest.json") as f:
        m = json.load(f)
    assert not any("python-testing" in p for p in list(m["files"]) + m["dirs"])
    assert prefix + "/lib/overlord/overlord/newpkg/__init__.py" in m["files"]


def test_a_failed_upgrade_restores_the_previous_install(own_checkout, prefix):
    assert install(own_checkout, prefix=prefix).returncode == 0
    _change_sources(own_checkout)
    # the new engine files go in first; then the skills dir, made immutable, refuses its file
    locked = prefix + "/share/overlord/skills/release-notes"
    subprocess.run(["chattr", "+i", locked], check=True)
    before = state(prefix)
    proc = install(own_checkout, prefix=prefix)
    subprocess.run(["chattr", "-i", locked], check=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("install.sh: install failed (") and \
        line.endswith("): everything was restored as it was"), line
    assert "template.md" in line
    assert state(prefix) == before


def test_a_failed_first_install_leaves_nothing(checkout, prefix):
    os.mkdir(prefix + "/share")
    subprocess.run(["chattr", "+i", prefix + "/share"], check=True)
    before = state(prefix)
    proc = install(checkout, prefix=prefix)
    subprocess.run(["chattr", "-i", prefix + "/share"], check=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("install.sh: install failed (") and "share/overlord" in line, line
    assert state(prefix) == before


# ---- uninstall ----

def test_uninstall_restores_the_prefix_and_never_touches_a_home(checkout, prefix, tmp_path):
    os.mkdir(prefix + "/bin")
    with open(prefix + "/bin/other-tool", "w") as f:       # not OVERLORD's: stays
        f.write("#!/bin/sh\n")
    before = state(prefix)
    home = tmp_path / "home"
    home.mkdir()
    (home / "keep.txt").write_text("mine\n")
    assert install(checkout, prefix=prefix, env={"OVERLORD_HOME": str(home)}).returncode == 0
    home_after_install = conftest.tree(home)
    proc = install(checkout, "--uninstall", prefix=prefix, env={"OVERLORD_HOME": str(home)})
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stdout.startswith("uninstall: removed "), proc.stdout
    assert state(prefix) == before
    assert conftest.tree(home) == home_after_install and (home / "keep.txt").exists()


def test_a_prefix_the_install_made_is_removed_by_the_uninstall(checkout, prefix):
    """--prefix naming a directory that does not exist yet: the install creates it (the
    manifest names it among its dirs) and the uninstall removes it again."""
    fresh = prefix + "/new/deeper"
    proc = install(checkout, prefix=fresh)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert fresh in json.load(open(fresh + "/lib/overlord/install-manifest.json"))["dirs"]
    proc = install(checkout, "--uninstall", prefix=fresh)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert os.listdir(prefix) == []


def test_uninstall_without_a_manifest(checkout, prefix):
    before = state(prefix)
    proc = install(checkout, "--uninstall", prefix=prefix)
    refused(proc, f"install.sh: no install manifest at {prefix}/lib/overlord/install-manifest.json:"
                  f" nothing of OVERLORD's to remove")
    assert proc.returncode == 1 and state(prefix) == before


# ---- bad input: one line, a non-zero exit, nothing placed ----

def test_a_foreign_file_at_an_install_path_is_refused(checkout, prefix):
    os.mkdir(prefix + "/bin")
    with open(prefix + "/bin/overlord", "w") as f:        # e.g. pip's console script
        f.write("#!/bin/sh\necho not overlord's launcher\n")
    before = state(prefix)
    proc = install(checkout, prefix=prefix)
    refused(proc, f"install.sh: {prefix}/bin/overlord exists and is not OVERLORD's "
                  f"(no install manifest names it): move it aside first")
    assert state(prefix) == before


def test_not_root(checkout, prefix):
    proc = install(checkout, prefix=prefix,
                   wrap=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    refused(proc, "install.sh: run as root (sudo bash packaging/install.sh)")
    assert os.listdir(prefix) == []


def test_missing_compiler(checkout, prefix):
    proc = install(checkout, prefix=prefix, env={"CC": "/nonexistent/cc"})
    refused(proc, "install.sh: no C compiler (/nonexistent/cc): apt-get install gcc libc6-dev, or set CC")
    assert os.listdir(prefix) == []


def test_unsupported_system_names_exactly_the_missing_dependency(checkout, prefix, tmp_path):
    """A system without apt-get (its os-release says Fedora) and without strace, for real: in
    a private mount namespace, /dev/null (not executable) is bound over apt-get and strace."""
    conftest.require_tool("unshare")
    for tool in ("apt-get", "strace"):
        assert os.path.realpath(shutil.which(tool, path=ENV["PATH"])) == f"/usr/bin/{tool}"
    (tmp_path / "os-release").write_text('ID=fedora\nNAME="Fedora Linux"\n')
    script = ('mount --bind "$1" /etc/os-release && mount --bind /dev/null /usr/bin/apt-get'
              ' && mount --bind /dev/null /usr/bin/strace && shift && exec "$@"')
    wrap = ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            str(tmp_path / "os-release"))
    cmd = ["bash", os.path.join(checkout, "packaging/install.sh"), "--prefix", prefix]
    proc = subprocess.run([*wrap, *cmd], env=dict(ENV), capture_output=True, text=True, timeout=60)
    refused(proc, "install.sh: missing: strace (install them with your package manager, then run again)")
    assert os.listdir(prefix) == []


def test_a_prefix_others_can_write_is_refused(checkout, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    proc = install(checkout, prefix=str(shared / "usr"))
    refused(proc, f"install.sh: {shared} is writable by others (mode 1777): the launcher would "
                  f"refuse to start from under it; choose another --prefix")
    assert os.listdir(shared) == []


def test_an_interpreter_that_is_missing_or_too_old_is_refused(checkout, prefix, tmp_path):
    proc = install(checkout, "--python", "/nonexistent/python3", prefix=prefix)
    refused(proc, "install.sh: no such interpreter: /nonexistent/python3")
    old = tmp_path / "python3.8"
    old.write_text("#!/bin/sh\nexit 1\n")                # what `sys.version_info < (3, 9)` gives
    old.chmod(0o755)
    proc = install(checkout, "--python", str(old), prefix=prefix)
    refused(proc, f"install.sh: {old} is not Python 3.9 or newer (OVERLORD needs 3.9+; --python PATH)")
    assert os.listdir(prefix) == []


@pytest.mark.parametrize("absent", [[], ["strace", "git"]])
def test_apt_runs_only_for_what_dpkg_lacks(checkout, prefix, tmp_path, absent):
    """With apt-get: dpkg-query decides; apt-get update, then install exactly the missing
    packages, or no apt-get at all. apt-get and dpkg-query are stand-ins here (bound over the
    real ones in a private mount namespace): the real path runs in test_fresh_machine.py."""
    conftest.require_tool("unshare")
    log = tmp_path / "apt.log"
    (tmp_path / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (tmp_path / "dpkg-query").write_text(
        '#!/bin/sh\nfor p; do :; done\ncase " %s " in *" $p "*) exit 1;; esac\n'
        'printf "install ok installed"\n' % " ".join(absent))
    for name in ("apt-get", "dpkg-query"):
        (tmp_path / name).chmod(0o755)
    script = ('mount --bind "$1/apt-get" /usr/bin/apt-get && mount --bind "$1/dpkg-query" '
              '/usr/bin/dpkg-query && shift && exec "$@"')
    proc = install(checkout, "--prefix", prefix, wrap=("unshare", "--mount", "--propagation",
                                                       "private", "sh", "-c", script, "sh", str(tmp_path)))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    first = proc.stdout.splitlines()[0]
    if absent:
        assert first == "deps: apt-get install strace git"
        assert log.read_text().splitlines() == [
            "update -qq", "install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 strace git"]
    else:
        assert first == "deps: python3 fuse-overlayfs fuse3 strace git gcc libc6-dev are installed"
        assert not log.exists()


def test_relative_prefix_is_refused(checkout, tmp_path):
    proc = install(checkout, "--prefix", "relative/path", "--no-deps", cwd=tmp_path)
    refused(proc, "install.sh: --prefix must be an absolute path: relative/path (see --help)")
    assert proc.returncode == 2 and os.listdir(tmp_path) == []


def test_unknown_option(checkout):
    proc = install(checkout, "--frobnicate")
    refused(proc, "install.sh: unknown option: --frobnicate (see --help)")
    assert proc.returncode == 2


def test_help_says_what_goes_where(checkout):
    proc = install(checkout, "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    for words in ("PREFIX/lib/overlord/", "PREFIX/bin/overlord", "/usr/local", "--uninstall",
                  "/etc/apparmor.d/overlord", "fuse-overlayfs"):
        assert words in proc.stdout, words
