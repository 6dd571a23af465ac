"""Red team, the filesystem: the target is the only host tree a jailed command can reach, and
only through the overlay; everything else of the host does not exist or is read-only."""
import os

from conftest import SESSION_RE
from rtlib import CANARY, OVERLAYFS_MAGIC, PY
from rtlib import jail_fixture  # noqa: F401  (the `jail` fixture)

NOT_THERE = "ENOENT"


def test_symlink_in_target_to_a_host_file(jail):
    os.symlink(jail.canary, jail.target / "leak")                        # absolute
    os.symlink(os.path.relpath(jail.canary, jail.target), jail.target / "leak-rel")
    jail.rebaseline()
    code = """
        for name in ("leak", "leak-rel"):
            OUT[name + ":read"] = attempt(read, name)
            OUT[name + ":append"] = attempt(lambda: open(name, "ab").write(b"pwned"))
            OUT[name + ":trunc"] = attempt(lambda: open(name, "wb").close())
    """
    control = jail.host_py("OUT['read'] = read(ARGS[0]).decode()", jail.target / "leak")
    assert control["read"] == CANARY.decode()
    res = jail.py(code)
    assert res.rt == {f"{n}:{op}": NOT_THERE for n in ("leak", "leak-rel")
                      for op in ("read", "append", "trunc")}, res


def test_symlink_in_target_to_a_host_directory(jail):
    os.symlink(jail.outside, jail.target / "out")
    os.symlink(jail.operator, jail.target / "home-link")
    jail.rebaseline()
    code = """
        for name in ("out", "home-link"):
            OUT[name + ":list"] = attempt(os.listdir, name)
            OUT[name + ":create"] = attempt(lambda: open(name + "/pwned", "xb").close())
            OUT[name + ":mkdir"] = attempt(os.mkdir, name + "/pwned-dir")
            OUT[name + ":rename"] = attempt(os.rename, "hello.txt", name + "/stolen")
    """
    control = jail.host_py("OUT['ls'] = sorted(os.listdir(ARGS[0]))", jail.target / "out")
    assert control["ls"] == ["canary.txt"]
    res = jail.py(code)
    assert set(res.rt.values()) == {NOT_THERE}, res


def test_symlink_planted_inside_to_operator_home(jail):
    code = """
        os.symlink(ARGS[0], "planted-abs")
        os.symlink("../operator/.ssh/id_ed25519", "planted-rel")
        os.symlink("/proc/self/root" + ARGS[0], "planted-proc")
        for name in ("planted-abs", "planted-rel", "planted-proc"):
            OUT[name] = attempt(read, name)
    """
    control = jail.host_py("OUT['read'] = read(ARGS[0]).decode()", jail.secret_key)
    assert control["read"] == CANARY.decode()
    res = jail.py(code, jail.secret_key)
    assert res.rt == {"planted-abs": NOT_THERE, "planted-rel": NOT_THERE,
                      "planted-proc": NOT_THERE}, res
    # the links are a change under review, nothing more
    assert ("added", "planted-abs") in jail.ovl.diff(res.sid)
    assert not os.path.lexists(jail.target / "planted-abs")


def test_dotdot_traversal_out_of_the_target(jail):
    code = """
        target = ARGS[0]
        os.chdir(target)
        OUT["rel"] = attempt(read, "../outside/canary.txt")
        OUT["abs"] = attempt(read, target + "/../outside/canary.txt")
        OUT["deep"] = attempt(read, "../" * 40 + ARGS[1].lstrip("/"))
        OUT["parent"] = sorted(os.listdir(".."))
        OUT["above-root-is-root"] = sorted(os.listdir("../" * 40)) == sorted(os.listdir("/"))
        OUT["openat-parent"] = attempt(os.open, "../outside", os.O_RDONLY | os.O_DIRECTORY)
    """
    control = jail.host_py("os.chdir(ARGS[0]); OUT['rel'] = read('../outside/canary.txt').decode()",
                           jail.target, jail.canary)
    assert control["rel"] == CANARY.decode()
    res = jail.py(code, jail.target, jail.canary)
    assert res.rt == {"rel": NOT_THERE, "abs": NOT_THERE, "deep": NOT_THERE,
                      "parent": ["target"], "above-root-is-root": True,
                      "openat-parent": NOT_THERE}, res


def test_operator_home_and_host_trees_do_not_exist(jail):
    paths = [jail.operator, jail.secret_key, jail.outside, jail.canary, jail.home,
             os.path.expanduser("~"), "/root", "/home", "/mnt", "/media", "/srv", "/run",
             "/var", "/boot", "/sys", "/lost+found"]
    # (the way down to the target exists inside, whatever tree the test's tmp dir is in)
    paths = [p for p in paths if not str(jail.target).startswith(str(p).rstrip("/") + "/")]
    code = """
        for p in ARGS:
            OUT[p] = attempt(os.lstat, p)
    """
    on_host = [p for p in paths if os.path.lexists(p)]
    assert {str(jail.operator), str(jail.secret_key), str(jail.canary), str(jail.home)} <= \
        set(map(str, on_host))
    res = jail.py(code, *paths)
    assert res.rt == {str(p): NOT_THERE for p in paths}, res


def test_writing_the_system_tree(jail):
    """Create, link, chmod, touch, rename and unlink in the host's system tree. Every attempt
    is made so that it changes nothing even where it is allowed (same mode, same times, a
    rename onto itself, a name that does not exist) or makes only a new file the test
    removes again: a broken jail must show up as a failure, not as a damaged host."""
    name = "rt-" + jail.marker
    made = [f"/usr/bin/{name}", f"/etc/{name}", f"/opt/{name}", f"/{name}", f"/usr/lib/{name}",
            f"/etc/{name}.link"]
    code = """
        name = "rt-" + MARKER
        def create(p):
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        OUT["create /usr/bin"] = attempt(create, "/usr/bin/" + name)
        OUT["create /etc"] = attempt(create, "/etc/" + name)
        OUT["create /opt"] = attempt(create, "/opt/" + name)
        OUT["create /"] = attempt(create, "/" + name)
        OUT["create /dev"] = attempt(create, "/dev/" + name)
        OUT["mkdir /usr/lib"] = attempt(os.mkdir, "/usr/lib/" + name)
        OUT["link /etc/passwd"] = attempt(os.link, "/etc/passwd", f"/etc/{name}.link")
        st = os.stat("/etc/passwd")
        OUT["chmod /etc/passwd"] = attempt(os.chmod, "/etc/passwd", st.st_mode & 0o7777)
        OUT["utime /etc/passwd"] = attempt(os.utime, "/etc/passwd",
                                           ns=(st.st_atime_ns, st.st_mtime_ns))
        OUT["rename /etc/hostname"] = attempt(os.rename, "/etc/hostname", "/etc/hostname")
        OUT["unlink /usr/bin"] = attempt(os.unlink, f"/usr/bin/{name}.absent")
        OUT["append /etc/passwd"] = attempt(lambda: open("/etc/passwd", "ab").close())
        OUT["ro"] = {d: bool(os.statvfs(d).f_flag & os.ST_RDONLY)
                     for d in ("/", "/usr", "/etc", "/opt", "/dev")}
    """
    control = jail.host_py("OUT['ro'] = bool(os.statvfs('/usr').f_flag & os.ST_RDONLY); "
                           "OUT['w'] = os.access('/etc/passwd', os.W_OK)")
    assert control["ro"] is False
    assert control["w"] is (os.geteuid() == 0)
    before = {p: os.lstat(p) for p in ("/etc/passwd", "/etc/hostname", "/usr/bin/env")}
    try:
        res = jail.py(code)
    finally:
        escaped = [p for p in made if os.path.lexists(p)]
        for p in escaped:
            (os.rmdir if os.path.isdir(p) else os.unlink)(p)
    assert escaped == [], f"written on the host: {escaped}"
    ro = res.rt.pop("ro")
    assert ro == {"/": True, "/usr": True, "/etc": True, "/opt": True, "/dev": True}, res
    # every write meets the read-only mount; an ordinary user may meet a root-owned file's
    # mode first (appending to /etc/passwd checks permission before the mount)
    refusals = {"EROFS"} | ({"EACCES"} if os.geteuid() != 0 else set())
    assert set(res.rt.values()) <= refusals and "EROFS" in res.rt.values(), res
    for p, st in before.items():
        now = os.lstat(p)
        assert (now.st_mtime_ns, now.st_size, now.st_ino, now.st_mode) == \
            (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)


def test_shadow_files_are_masked(jail):
    files = [p for p in ("/etc/shadow", "/etc/gshadow") if os.path.isfile(p)]
    assert files and all(os.stat(p).st_size > 0 for p in files)     # control: there is a secret
    code = """
        for p in ARGS:
            OUT[p] = [os.stat(p).st_size, attempt(read, p)]
    """
    res = jail.py(code, *files)
    assert res.rt == {p: [0, "OK"] for p in files}, res


def test_private_tmp_and_shm_do_not_reach_the_host(jail):
    code = """
        for d in ("/tmp", "/dev/shm"):
            with open(f"{d}/rt-{MARKER}", "w") as f:
                f.write("dropped")
            OUT[d] = sorted(os.listdir(d))
    """
    control = jail.host_py("OUT['w'] = [os.access(d, os.W_OK) for d in ('/tmp', '/dev/shm')]")
    assert control["w"] == [True, True]
    name = f"rt-{jail.marker}"
    try:
        res = jail.py(code)
    finally:
        escaped = [p for p in (f"/tmp/{name}", f"/dev/shm/{name}") if os.path.lexists(p)]
        for p in escaped:
            os.unlink(p)
    assert escaped == [], f"written on the host: {escaped}"
    assert name in res.rt["/tmp"] and res.rt["/dev/shm"] == [name], res
    # the jail's /tmp holds nothing of the host's: at most the way down to the target, and
    # the jail's own git config (HOME=/tmp: your user.name/email, safe.directory -- gitdir)
    allowed = {str(jail.target).split("/")[2]} if str(jail.target).startswith("/tmp/") else set()
    allowed.add(".gitconfig")
    assert set(res.rt["/tmp"]) - {name} <= allowed, res


def test_session_records_cannot_be_reached_or_forged(jail, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    earlier = SESSION_RE.search(jail.ovl("run", "-t", other, "--", "sh", "-c", "echo x > x.txt",
                                         check=0).out).group(1)
    edir = jail.session_dir(earlier)
    assert (edir / "meta.json").is_file() and (edir / "provenance.jsonl").is_file()   # control
    records = {n: (edir / n).read_bytes() for n in ("meta.json", "provenance.jsonl")}
    before = {n: os.stat(edir / n).st_mtime_ns for n in records}
    code = """
        home, earlier = ARGS
        mine = None
        for line in read("/proc/self/mountinfo").decode().splitlines():
            for opt in line.split(" - ")[-1].split()[-1].split(","):
                if opt.startswith("upperdir="):
                    mine = os.path.dirname(opt[len("upperdir="):])
        OUT["found-own-record-path"] = mine is not None
        for label, p in (("home", home), ("sessions", home + "/sessions"),
                         ("earlier-meta", f"{home}/sessions/{earlier}/meta.json"),
                         ("earlier-prov", f"{home}/sessions/{earlier}/provenance.jsonl"),
                         ("own-meta", f"{mine}/meta.json")):
            OUT[label + ":stat"] = attempt(os.stat, p)
            OUT[label + ":write"] = attempt(lambda: open(p, "r+b").write(b"{}"))
        # forging a record where the real one would be lands, at most, in the private /tmp
        forged = {"state": "committed", "forged": MARKER}
        def forge():
            os.makedirs(mine, exist_ok=True)
            with open(mine + "/meta.json", "w") as f:
                json.dump(forged, f)
        attempt(forge)
    """
    res = jail.py(code, jail.home, earlier)
    assert res.rt.pop("found-own-record-path") is True, res
    assert set(res.rt.values()) == {"ENOENT"}, res
    assert {n: (edir / n).read_bytes() for n in records} == records
    assert {n: os.stat(edir / n).st_mtime_ns for n in records} == before
    meta = jail.meta(res.sid)
    assert meta["state"] == "unchanged" and "forged" not in meta     # it changed nothing
    listed = jail.ovl("sessions", check=0).out
    assert earlier in listed and res.sid in listed


OVERLAY_PROBE = """
    import ctypes
    class Statfs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]
    target = ARGS[0]
    row = [l for l in read("/proc/self/mountinfo").decode().splitlines()
           if l.split()[4] == target]
    opts = row[-1].split(" - ")[1].split()[2].split(",")
    paths = {}
    for opt in opts:
        key, _, value = opt.partition("=")
        if key in ("upperdir", "workdir"):
            paths[key] = [value]
        elif key in ("lowerdir", "lowerdir+"):
            paths.setdefault("lower", []).extend(value.split(":"))
    OUT["keys"] = sorted(paths)
    for key, values in paths.items():
        for p in values:
            if p == target:     # the real tree is the bottom layer: seen only merged
                sf = Statfs()
                LIBC.statfs(p.encode(), ctypes.byref(sf))
                OUT[key + ":target"] = "overlay" if sf.f_type == int(ARGS[1]) else hex(sf.f_type)
            else:
                OUT[key + ":" + p] = attempt(os.listdir, p)
                OUT[key + ":" + p + " write"] = attempt(lambda: open(p + "/x", "w").close())
    with open("written-inside.txt", "w") as f:
        f.write("to the upper layer")
"""


def test_overlay_upper_work_and_lower_dirs_are_unreachable(jail):
    """The mount table names the session's layer directories (by design); none of them may
    be reachable. A first command seals a layer, so the attack runs over a real stack."""
    first = jail.sh("echo one > first.txt")
    res = jail.exec(first.sid, [PY, "-c", jail.program(OVERLAY_PROBE), jail.marker, jail.target,
                                OVERLAYFS_MAGIC], check=0)
    assert res.rt is not None, res
    assert {"upperdir", "workdir", "lower"} <= set(res.rt.pop("keys")), res
    assert res.rt.pop("lower:target") == "overlay", res
    layers = [k for k in res.rt if k.startswith("lower:") and not k.endswith(" write")]
    upper = [k for k in res.rt if k.startswith("upperdir:") and not k.endswith(" write")]
    work = [k for k in res.rt if k.startswith("workdir:") and not k.endswith(" write")]
    assert layers and upper and work, res
    assert set(res.rt.values()) == {NOT_THERE}, res
    # control: those paths are the host's, in the session's record directory: the sealed
    # layer holds the first command's file, and the attack's write went to the upper layer
    host = {k.split(":", 1)[1] for k in layers + upper + work}
    sdir = jail.session_dir(first.sid)
    assert all(p.startswith(str(sdir) + "/") for p in host), host
    assert any(os.path.isfile(os.path.join(p, "first.txt")) for p in host), host
    diff = jail.ovl.diff(first.sid)
    assert ("added", "first.txt") in diff and ("added", "written-inside.txt") in diff
    assert not (jail.target / "written-inside.txt").exists()


def test_host_sysctl_writes(jail):
    """Writable host sysctls from a jail are a way out (kernel.core_pattern and
    kernel.modprobe name programs the host kernel runs as root). Only open(O_WRONLY) is
    tried: nothing is ever written."""
    knobs = ["/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname",
             "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
             "/proc/sys/vm/drop_caches", "/proc/sys/fs/file-max", "/proc/sys/kernel/pid_max"]
    knobs = [k for k in knobs if os.path.exists(k)]
    code = """
        def open_for_write(p):
            os.close(os.open(p, os.O_WRONLY))    # closed unwritten
        for p in ARGS:
            OUT[p] = attempt(open_for_write, p)
        OUT["/sys"] = attempt(os.lstat, "/sys")
        OUT["/proc/sysrq-trigger"] = attempt(open_for_write, "/proc/sysrq-trigger")
        OUT["sethostname"] = raw(NR["sethostname"], b"rt-pwned", 8)
        OUT["setdomainname"] = raw(NR["setdomainname"], b"rt-pwned", 8)
    """
    readable = [k for k in knobs if os.access(k, os.R_OK)]
    values = {k: open(k).read() for k in readable}
    control = jail.host_py("""
        OUT["open"] = attempt(lambda: os.close(os.open(ARGS[0], os.O_WRONLY)))
        OUT["sys"] = os.path.isdir("/sys/kernel")
    """, "/proc/sys/kernel/hostname")
    assert control["open"] == ("OK" if os.geteuid() == 0 else "EACCES")
    assert control["sys"] is True
    uts_control = jail.host_py("OUT['sethostname'] = raw(NR['sethostname'], b'rt-private', 10)",
                               wrap=["/usr/bin/unshare", "-Uru"])
    assert uts_control["sethostname"] == "OK"     # the call works where the caller owns the name
    res = jail.py(code, *knobs)
    assert res.rt.pop("/sys") == "ENOENT", res
    assert res.rt.pop("sethostname") == "EPERM" and res.rt.pop("setdomainname") == "EPERM", res
    assert res.rt.pop("/proc/sysrq-trigger") in ("ENOENT", "EACCES", "EROFS"), res
    writable = {k: v for k, v in res.rt.items() if v not in ("EACCES", "EROFS")}
    assert writable == {}, f"host sysctls open for writing inside the jail: {writable}"
    assert {k: open(k).read() for k in readable} == values


def test_mknod_device_forgery(jail):
    code = """
        import stat
        for where in (ARGS[0], "/tmp", "/dev/shm"):
            OUT["chr " + where] = attempt(os.mknod, f"{where}/rt-mem", stat.S_IFCHR | 0o666,
                                          os.makedev(1, 1))      # /dev/mem
            OUT["blk " + where] = attempt(os.mknod, f"{where}/rt-disk", stat.S_IFBLK | 0o666,
                                          os.makedev(8, 0))      # the first SCSI disk
    """
    control = jail.host_py("""
        import stat
        p = ARGS[0] + "/rt-null"
        OUT["mknod"] = attempt(os.mknod, p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        if OUT["mknod"] == "OK":
            os.unlink(p)
    """, jail.tmp)
    # control: root on the host forges devices; an ordinary user is refused by the kernel alike
    assert control["mknod"] == ("OK" if os.geteuid() == 0 else "EPERM")
    try:
        res = jail.py(code, jail.target, untouched=False)
    finally:
        escaped = [f"{d}/{n}" for d in ("/tmp", "/dev/shm", jail.target)
                   for n in ("rt-mem", "rt-disk") if os.path.lexists(f"{d}/{n}")]
        for p in escaped:
            os.unlink(p)
    jail.assert_host_untouched()
    assert escaped == [], f"device nodes on the host: {escaped}"
    assert set(res.rt.values()) == {"EPERM"}, res
    assert jail.ovl.diff(res.sid) == []


def test_only_harmless_devices_exist(jail):
    dangerous = ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda",
                 "/dev/nvme0n1", "/dev/fuse", "/dev/net/tun", "/dev/loop-control", "/dev/tty0",
                 "/dev/console", "/dev/cpu", "/dev/disk", "/dev/mapper/control"]
    assert any(os.path.exists(p) for p in dangerous)          # control: the host has some
    code = """
        OUT["dev"] = sorted(os.listdir("/dev"))
        for p in ARGS:
            OUT[p] = attempt(os.lstat, p)
    """
    res = jail.py(code, *dangerous)
    listing = res.rt.pop("dev")
    assert set(listing) <= {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx",
                            "shm", "fd", "stdin", "stdout", "stderr"}, listing
    assert res.rt == {p: NOT_THERE for p in dangerous}, res
