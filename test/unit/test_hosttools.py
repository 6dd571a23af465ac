"""The programs OVERLORD runs itself on the host come from the system's directories when the
installed launcher started it (-I -S), never from a PATH the caller chose; otherwise from PATH."""
import os
import subprocess
import sys

from conftest import REPO

PROBE = ("import sys; sys.path.insert(0, %r); from overlord import hosttools; "
         "print(hosttools.launched(), hosttools.find('git'), hosttools.find('openssl'), "
         "hosttools.find('fuse-overlayfs'))" % REPO)


def fake_tools(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("git", "openssl", "fuse-overlayfs"):
        (bindir / name).write_text("#!/bin/sh\ntouch %s/ran\n" % tmp_path)
        (bindir / name).chmod(0o755)
    return bindir


def probe(flags, path):
    env = dict(os.environ, PATH=path)
    out = subprocess.run([sys.executable, *flags, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    return out


def test_under_the_launchers_flags_a_tool_earlier_on_path_is_never_chosen(tmp_path):
    bindir = fake_tools(tmp_path)
    launched, *found = probe(["-I", "-S"], f"{bindir}:{os.environ['PATH']}")
    assert launched == "True"
    assert not any(p.startswith(str(bindir)) for p in found), found
    assert all(p == "None" or os.path.dirname(p) in
               ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
               for p in found), found


def test_from_a_checkout_the_callers_path_is_used(tmp_path):
    bindir = fake_tools(tmp_path)
    launched, *found = probe([], f"{bindir}:{os.environ['PATH']}")
    assert launched == "False"
    assert found == [str(bindir / n) for n in ("git", "openssl", "fuse-overlayfs")]
