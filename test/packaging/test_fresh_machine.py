"""The fresh-machine proof (issue 18, items 6 and 7), in fresh Debian 13 roots (rootfs.py):
nothing installed but debootstrap's minbase -- no python3, no gcc, no sudo, no package lists.

Machine A: `bash packaging/install.sh` as root from a copy of the checkout (it runs apt-get
update and installs the dependencies itself), then inside: `overlord doctor`, a transactional
run -> diff -> commit as root and as an ordinary user, the second install ("nothing to
change", nothing touched), `--uninstall`, and nothing of the install left behind.

Machine B: the README's first command, verbatim (the first line of its first ```sh block), as
root without sudo (there is none), then as a user with sudo, each from a checkout it owns.

Tests run in file order and build on each other (one machine per module section, made once).
"""
import glob
import os
import re
import shutil

import pytest

import rootfs

SID = r"\d{8}-\d{6}-[0-9a-f]{6}"
DEPS = ("python3", "fuse-overlayfs", "fuse3", "strace", "git", "gcc", "libc6-dev")
CMD = "sh -c 'echo world >> hello.txt; echo new > new.txt'"
# What Debian's python3.13-minimal postinst makes (mkdir -p, for pip's local site) when the
# dependencies are installed: empty directories, not OVERLORD's, left by the uninstall.
PYTHON_LOCAL_SITE = re.compile(r"^/usr/local/lib/python3\.\d+(/dist-packages)?$")
TOPS = ("/usr/local", "/etc/apparmor.d", "/etc/systemd")


def read(root, inner):
    with open(root.host(inner)) as f:
        return f.read()


def stamps(root, tops):
    """(inode, mtime_ns, mode, size) of every path under tops, to prove a run touched nothing."""
    out = {}
    for path in sorted(root.listing(*tops)):
        st = os.lstat(root.host(path))
        out[path] = (st.st_ino, st.st_mtime_ns, st.st_mode, st.st_size)
    return out


def transaction(root, target, user=None):
    """run -t target -> diff -> commit, the target checked before and after the commit."""
    root.run(f"mkdir -p {target} && echo hello > {target}/hello.txt", user=user)
    out = root.run(f"overlord run -t {target} -- {CMD}", user=user).stdout
    m = re.search(rf"^session ({SID})\s+pending\s+2 changes \(1 modified, 1 added\); exit 0$",
                  out, re.M)
    assert m, out
    sid = m.group(1)
    # transactional: the target is untouched until the commit
    assert read(root, f"{target}/hello.txt") == "hello\n"
    assert not os.path.exists(root.host(f"{target}/new.txt"))
    diff = root.run(f"overlord diff {sid}", user=user).stdout
    assert diff.split("\n") == ["modified  hello.txt", "added  new.txt", ""], diff
    out = root.run(f"overlord commit {sid}", user=user).stdout
    assert out == f"committed {sid}: 2 changes (1 modified, 1 added)\n", out
    assert read(root, f"{target}/hello.txt") == "hello\nworld\n"
    assert read(root, f"{target}/new.txt") == "new\n"
    sessions = root.run("overlord sessions", user=user).stdout
    assert re.search(rf"^{sid}\s+committed\s+kernel\s+{re.escape(target)}\s", sessions, re.M), \
        sessions
    return sid


def bare(root):
    """Like a bare Debian container: no package lists (debootstrap leaves the one it used;
    images ship none), no python3, no compiler, no sudo."""
    for path in glob.glob(root.host("/var/lib/apt/lists/*")):
        if os.path.isfile(path):
            os.unlink(path)
    assert not glob.glob(root.host("/var/lib/apt/lists/*Packages*"))
    for tool in ("/usr/bin/python3", "/usr/bin/gcc", "/usr/bin/cc", "/usr/bin/sudo"):
        assert not os.path.lexists(root.host(tool)), tool


# ---------------------------------------------------------------- machine A: install.sh

@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    rootfs.require()
    root = rootfs.fresh(tmp_path_factory.mktemp("fresh-machine"))
    root.copy_in()                                          # the checkout at /src
    bare(root)
    return {"root": root, "pristine": root.listing(*TOPS)}


def test_install(machine):
    root = machine["root"]
    proc = root.run("bash /src/packaging/install.sh")
    out = proc.stdout
    machine["install_out"] = out
    lines = out.splitlines()
    # the first line says what it installs: every dependency (the root has none of them)
    assert lines[0].startswith("deps: ") and set(DEPS) <= set(lines[0].split()), out
    # it fetched the package lists and installed every dependency itself
    for pkg in DEPS:
        status = root.run(f"dpkg-query -W -f='${{Status}}' {pkg}").stdout
        assert status == "install ok installed", (pkg, status)
    bpftrace = root.run("dpkg-query -W -f='${Status}' bpftrace", check=False).stdout
    assert bpftrace == "install ok installed" or \
        "deps: bpftrace is not installed (optional: only --trace ebpf needs it)" in lines, out
    assert re.search(r"^engine: \d+ files for /usr/local/lib/overlord ", out, re.M), out
    assert re.search(r"^launcher: (static|dynamic) ELF for /usr/bin/python3\.\d+$", out, re.M), out
    assert re.search(r"^units: .*overlord-ui\.service", out, re.M), out
    # this kernel has no AppArmor (the root shares the host's): no profile, and a line saying so
    assert "apparmor: not active here (e.g. WSL2, this kernel): no profile needed" in lines, out
    assert not os.path.exists(root.host("/etc/apparmor.d/overlord"))
    assert "manifest: /usr/local/lib/overlord/install-manifest.json" in lines, out
    assert "doctor:" in lines, out
    assert re.search(r"^kernel backend \(.*\): available$", out, re.M), out
    assert proc.stderr == "", proc.stderr
    # it is on PATH as the compiled launcher
    assert root.run("command -v overlord").stdout == "/usr/local/bin/overlord\n"
    with open(root.host("/usr/local/bin/overlord"), "rb") as f:
        assert f.read(4) == b"\x7fELF"
    assert "/usr/local/lib/overlord/main.py" in root.listing("/usr/local")


def test_doctor(machine):
    out = machine["root"].run("overlord doctor").stdout
    assert re.search(r"^kernel backend \(.*\): available$", out, re.M), out
    assert "active backend: kernel" in out.splitlines(), out


def test_transaction_as_root(machine):
    transaction(machine["root"], "/srv/demo")


def test_transaction_as_an_ordinary_user(machine):
    root = machine["root"]
    root.run("useradd -m -s /bin/bash dev")
    assert root.run("id -u", user="dev").stdout.strip() != "0"
    transaction(root, "/home/dev/demo", user="dev")


def test_second_install_changes_nothing(machine):
    root = machine["root"]
    before = stamps(root, TOPS)
    proc = root.run("bash /src/packaging/install.sh")
    assert "nothing to change: OVERLORD at /usr/local is up to date" in proc.stdout.splitlines(), \
        proc.stdout
    assert re.search(r"^deps: .* are installed$", proc.stdout, re.M), proc.stdout
    assert not re.search(r"^deps: .*install ", proc.stdout, re.M), proc.stdout   # no apt run
    assert stamps(root, TOPS) == before


def test_uninstall_leaves_nothing(machine):
    root = machine["root"]
    installed = root.listing(*TOPS)
    assert len(installed - machine["pristine"]) > 10          # the comparison is not vacuous
    homes = root.listing("/root/.overlord", "/home/dev/.overlord")
    assert homes                                             # the sessions above are there
    proc = root.run("bash /src/packaging/install.sh --uninstall")
    assert re.search(r"^uninstall: removed \d+ files", proc.stdout, re.M), proc.stdout
    assert proc.stderr == "", proc.stderr
    after = root.listing(*TOPS)
    assert machine["pristine"] - after == set()              # nothing of the machine's removed
    left = sorted(after - machine["pristine"])
    # only python3's local site (empty directories: anything under them would be listed)
    assert all(PYTHON_LOCAL_SITE.match(p) and os.path.isdir(root.host(p))
               and not os.path.islink(root.host(p)) for p in left), left
    assert root.run("command -v overlord", check=False).stdout == ""
    assert root.run("command -v overlord", check=False).returncode != 0
    # never ~/.overlord: every session record stays
    assert root.listing("/root/.overlord", "/home/dev/.overlord") == homes
    # and a second uninstall has no manifest to go by
    again = root.run("bash /src/packaging/install.sh --uninstall", check=False)
    assert again.returncode != 0
    assert again.stderr.startswith("install.sh: no install manifest at "), again.stderr


# ------------------------------------------------------- machine B: the README's first command

def readme_first_command():
    """The first line of the README's first ```sh block, exactly as a person would paste it."""
    with open(os.path.join(rootfs.REPO, "README.md")) as f:
        text = f.read()
    m = re.search(r"^```sh\n(.*)\n", text, re.M)
    assert m, "README.md has no ```sh block"
    return m.group(1)


COMMITTED = re.compile(rf"^committed {SID}: \d+ changes? \(", re.M)


@pytest.fixture(scope="module")
def readme_machine(tmp_path_factory):
    rootfs.require()
    root = rootfs.fresh(tmp_path_factory.mktemp("readme-machine"))
    root.copy_in()
    bare(root)
    trust_host_cas(root)
    return root


def trust_host_cas(root):
    """The README's command fetches from PyPI (pip install .). Where this host reaches it only
    through a TLS-inspecting proxy, the host trusts that proxy's CA as a local certificate
    (/usr/local/share/ca-certificates); a machine on that network would too, so the root gets
    the same files, and Debian's ca-certificates (installed by the command) adds them to the
    system store pip uses. Nothing else of the host's goes in."""
    src = "/usr/local/share/ca-certificates"
    if not os.path.isdir(src):
        return
    dest = root.host(src)
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith(".crt") and os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))


def test_readme_first_command_as_root_without_sudo(readme_machine):
    root = readme_machine
    line = readme_first_command()
    # pasted into root's shell (bash) in the checkout, verbatim
    proc = root.run('cd /src && exec bash -c "$README_LINE"', env={"README_LINE": line},
                    check=False)
    assert proc.returncode == 0 and COMMITTED.search(proc.stdout), \
        f"{line}\n--- exit {proc.returncode}\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def test_readme_first_command_as_a_user_with_sudo(readme_machine):
    root = readme_machine
    root.run("{ ls /var/lib/apt/lists/*Packages >/dev/null 2>&1 || apt-get update -qq; } && "
             "apt-get install -y -qq --no-install-recommends sudo >/dev/null && "
             "useradd -m -s /bin/bash dev && "
             "echo 'dev ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/dev && "
             "chmod 0440 /etc/sudoers.d/dev")
    root.copy_in(dest="/home/dev/src")
    root.run("chown -R dev:dev /home/dev/src")
    line = readme_first_command()
    proc = root.run('cd /home/dev/src && exec bash -c "$README_LINE"', user="dev",
                    env={"README_LINE": line}, check=False)
    assert proc.returncode == 0 and COMMITTED.search(proc.stdout), \
        f"{line}\n--- exit {proc.returncode}\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
