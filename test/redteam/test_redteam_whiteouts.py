"""Red team, forged overlay whiteouts: a character device numbered 0/0 in a layer reads as a
deletion, and since Linux 5.8 any user may make one (mknod, or renameat2 RENAME_WHITEOUT).
The seccomp filter refuses both with EPERM, on the kernel backend (jailed) and on the fuse
backend (unjailed), whatever the high bits of the arguments the kernel ignores; FIFOs,
sockets and regular files still get made. The positive control runs the same program on the
host, where every forgery succeeds."""
import os
import platform
import subprocess

from conftest import Ovl, require_backend
from rtlib import PRELUDE, PY, Jail, jail_fixture, parse_rt  # noqa: F401  (the `jail` fixture)

# written out here, not taken from overlord.linux.seccomp (see rtlib.SYSCALLS)
NUMBERS = {"x86_64": {"mknod": 133, "mknodat": 259, "renameat2": 316},
           "aarch64": {"mknodat": 33, "renameat2": 276}}

FORGERIES = """
    import shutil, stat, tempfile
    W, AT = NUMS, -100
    def forge(d, tag=""):
        OUT.update({tag + k: v for k, v in forge_in(d).items()})
    def forge_in(d):
        OUT = {}
        def p(name):
            return f"{d}/{name}".encode()
        CHR = stat.S_IFCHR | 0o600
        OUT["mknod 0/0"] = attempt(os.mknod, d + "/wh-a", CHR, os.makedev(0, 0))
        if "mknod" in W:
            OUT["raw mknod 0/0"] = raw(W["mknod"], p("wh-b"), CHR, 0)
            # the kernel reads dev as 32 bits and mode as 16: high bits must not smuggle one past
            OUT["raw mknod dev 1<<32"] = raw(W["mknod"], p("wh-c"), CHR, 1 << 32)
            OUT["raw mknod mode 1<<32"] = raw(W["mknod"], p("wh-d"), (1 << 32) | CHR, 0)
        OUT["raw mknodat 0/0"] = raw(W["mknodat"], AT, p("wh-e"), CHR, 0)
        OUT["raw mknodat dev 1<<32"] = raw(W["mknodat"], AT, p("wh-f"), CHR, 1 << 32)
        OUT["raw mknodat mode 1<<16"] = raw(W["mknodat"], AT, p("wh-g"), (1 << 16) | CHR, 0)
        for n in ("victim", "victim2"):
            open(f"{d}/{n}", "w").close()
        OUT["renameat2 WHITEOUT"] = raw(W["renameat2"], AT, p("victim"), AT, p("moved"), 4)
        OUT["renameat2 WHITEOUT|NOREPLACE"] = raw(W["renameat2"], AT, p("victim2"), AT, p("moved2"), 5)
        OUT["whiteouts left"] = sorted(n for n in os.listdir(d) if os.lstat(f"{d}/{n}").st_rdev == 0
                                       and stat.S_ISCHR(os.lstat(f"{d}/{n}").st_mode))
        return OUT
    forge(ARGS[0])
    # and outside the overlay, where only the filter stands in the way (a jail's private /tmp;
    # the host's /tmp on the unjailed fuse backend)
    scratch = tempfile.mkdtemp(prefix="rt-wh-")
    try:
        forge(scratch, "tmp ")
    finally:
        shutil.rmtree(scratch)
"""

ORDINARY = """
    import stat
    W, d, AT = NUMS, ARGS[0], -100
    OUT["mkfifo"] = attempt(os.mkfifo, d + "/fifo")
    OUT["mknod fifo"] = attempt(os.mknod, d + "/fifo2", stat.S_IFIFO | 0o600)
    OUT["mknod file"] = attempt(os.mknod, d + "/file", stat.S_IFREG | 0o600)
    OUT["mknod file, no type"] = attempt(os.mknod, d + "/file2", 0o600)
    OUT["mknod socket"] = attempt(os.mknod, d + "/sock", stat.S_IFSOCK | 0o600)
    open(d + "/old", "w").close()
    OUT["renameat2 NOREPLACE"] = raw(W["renameat2"], AT, f"{d}/old".encode(), AT,
                                     f"{d}/new".encode(), 1)
"""
MADE = [("added", n) for n in ("fifo", "fifo2", "file", "file2", "new", "sock")]


def program(code):
    return Jail.program(code, prelude=PRELUDE + f"NUMS = {NUMBERS[platform.machine()]!r}\n")


def on_host(code, where):
    """The positive control: the same program on the host, as this user."""
    proc = subprocess.run([PY, "-c", program(code), "rt-control", str(where)],
                          capture_output=True, timeout=120)
    out = parse_rt(proc.stdout.decode("utf-8", "replace"))
    assert out is not None, proc
    return out


def check_control(tmp_path):
    where = tmp_path / "control"
    where.mkdir()
    out = on_host(FORGERIES, where)
    left = out.pop("whiteouts left") + out.pop("tmp whiteouts left")
    assert set(out.values()) == {"OK"}, out           # every forgery works on the host...
    assert len(left) >= 16, left                      # ...and leaves a real 0/0 device
    assert set(on_host(ORDINARY, where).values()) == {"OK"}


def assert_refused(rt):
    left = rt.pop("whiteouts left") + rt.pop("tmp whiteouts left")
    assert set(rt.values()) == {"EPERM"}, rt
    assert left == [], left


def test_whiteout_forgery_is_refused_on_the_kernel_backend(jail, tmp_path):
    check_control(tmp_path)
    res = jail.run([PY, "-c", program(FORGERIES), jail.marker, jail.target], check=0)
    assert_refused(res.rt)
    res = jail.exec(res.sid, [PY, "-c", program(ORDINARY), jail.marker, jail.target], check=0)
    assert set(res.rt.values()) == {"OK"}, res
    assert jail.ovl.diff(res.sid) == sorted(MADE + [("added", "victim"), ("added", "victim2")])


def test_whiteout_forgery_is_refused_on_the_fuse_backend(home, target, tmp_path):
    require_backend("fuse")
    check_control(tmp_path)
    ovl = Ovl(home, "fuse")
    real = sorted(os.listdir(target))
    sid, proc = ovl.run(target, PY, "-c", program(FORGERIES), "rt-fuse", ".")
    assert_refused(parse_rt(proc.out))
    # fuse-overlayfs lived through it: the next command in the session works
    proc = ovl("exec", sid, "--", PY, "-c", program(ORDINARY), "rt-fuse", ".", check=0)
    assert set(parse_rt(proc.out).values()) == {"OK"}, proc.out
    assert ovl.diff(sid) == sorted(MADE + [("added", "victim"), ("added", "victim2")])
    assert sorted(os.listdir(target)) == real
