"""Red team, the kernel surface: mounts, namespaces, chroot, io_uring, file handles, keys, bpf
and the rest of the seccomp policy, each tried from inside the jail and, as the positive
control, the same program on the host (in a user + mount namespace of its own where the call
needs privilege an ordinary user lacks, so the control holds as root and as a user alike)."""
import os
import platform

from rtlib import jail_fixture  # noqa: F401  (the `jail` fixture)

ROOT = os.geteuid() == 0
USERNS = ["/usr/bin/unshare", "--user", "--map-root-user", "--mount"]


MOUNT_GAMES = """
    scratch = ARGS[0]
    libc = LIBC
    def mount(src, dst, fstype, flags, data=None):
        if libc.mount(src, dst, fstype, ctypes.c_ulong(flags), data) != 0:
            raise OSError(ctypes.get_errno(), "mount")
    def umount2(path, flags):
        if libc.umount2(path, flags) != 0:
            raise OSError(ctypes.get_errno(), "umount2")
    MS_BIND, MS_REMOUNT, MS_RDONLY, MNT_DETACH = 4096, 32, 1, 2
    os.makedirs(scratch + "/a", exist_ok=True)
    os.makedirs(scratch + "/b", exist_ok=True)
    s = scratch.encode()
    OUT["tmpfs"] = attempt(mount, b"rt", s + b"/a", b"tmpfs", 0)
    OUT["bind"] = attempt(mount, s + b"/a", s + b"/b", None, MS_BIND)
    OUT["umount bind"] = attempt(umount2, s + b"/b", MNT_DETACH)
    OUT["umount tmpfs"] = attempt(umount2, s + b"/a", 0)
    if ARGS[1] == "jail":
        OUT["bind /"] = attempt(mount, b"/", s + b"/b", None, MS_BIND)
        OUT["remount /usr rw"] = attempt(mount, None, b"/usr", None, MS_REMOUNT | MS_BIND)
        OUT["umount /proc"] = attempt(umount2, b"/proc", 0)
        OUT["detach /proc"] = attempt(umount2, b"/proc", MNT_DETACH)
        OUT["detach target"] = attempt(umount2, ARGS[2].encode(), MNT_DETACH)
        OUT["proc still mounted"] = any(l.split()[4] == "/proc"
                                        for l in read("/proc/self/mountinfo").decode().splitlines())
"""


def test_mount_games(jail, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    control = jail.host_py(MOUNT_GAMES, scratch, "host", wrap=USERNS)
    assert set(control.values()) == {"OK"}, control
    res = jail.py(MOUNT_GAMES, "/tmp/rt-scratch", "jail", jail.target)
    assert res.rt.pop("proc still mounted") is True, res
    assert set(res.rt.values()) == {"EPERM"}, res
    # and the mount(8) tools, setuid or not, fare no better
    tools = jail.sh("mkdir -p /tmp/m; mount -t tmpfs rt /tmp/m; echo mount=$?; "
                    "umount /proc; echo umount=$?; test -e /proc/self/status && echo proc-ok")
    assert "mount=0" not in tools.out and "umount=0" not in tools.out, tools
    assert "proc-ok" in tools.out, tools


NAMESPACES = """
    import struct
    CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
        0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
    def in_child(fn):
        # each attempt in a throwaway child, so one that works changes nothing here
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, fn().encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        return os.read(r, 64).decode()
    def unshare(flags):
        return lambda: raw(NR["unshare"], flags)
    def clone_raw(flags):
        def go():
            ctypes.set_errno(0)
            pid = LIBC.syscall(ctypes.c_long(NR["clone"]), ctypes.c_long(flags | 17),
                               ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
            if pid == 0:
                os._exit(0)
            if pid < 0:
                return ename(ctypes.get_errno())
            os.waitpid(pid, 0)
            return "OK"
        return go
    def clone3(flags):
        def go():
            args = struct.pack("QQQQQQQQ", flags, 0, 0, 0, 17, 0, 0, 0)   # exit_signal SIGCHLD
            buf = ctypes.create_string_buffer(args, len(args))
            ctypes.set_errno(0)
            pid = LIBC.syscall(ctypes.c_long(NR["clone3"]), buf, ctypes.c_long(len(args)))
            if pid == 0:
                os._exit(0)
            if pid < 0:
                return ename(ctypes.get_errno())
            os.waitpid(pid, 0)
            return "OK"
        return go
    OUT["unshare user"] = in_child(unshare(CLONE_NEWUSER))
    OUT["unshare user+mount"] = in_child(unshare(CLONE_NEWUSER | CLONE_NEWNS))
    OUT["unshare user+net"] = in_child(unshare(CLONE_NEWUSER | CLONE_NEWNET))
    OUT["unshare user+pid+uts+ipc"] = in_child(unshare(CLONE_NEWUSER | CLONE_NEWPID |
                                                       CLONE_NEWUTS | CLONE_NEWIPC))
    OUT["clone user"] = in_child(clone_raw(CLONE_NEWUSER))
    OUT["clone user+mount"] = in_child(clone_raw(CLONE_NEWUSER | CLONE_NEWNS))
    OUT["clone3 user"] = in_child(clone3(CLONE_NEWUSER))
    OUT["clone3 plain"] = in_child(clone3(0))
"""


def test_nested_namespaces(jail):
    control = jail.host_py(NAMESPACES)
    assert set(control.values()) == {"OK"}, control            # userns work on this host
    res = jail.py(NAMESPACES)
    want = {k: "EPERM" for k in control}
    want.update({"clone3 user": "ENOSYS", "clone3 plain": "ENOSYS"})   # callers fall back to clone
    assert res.rt == want, res
    tool = jail.sh("unshare -U true; echo unshare=$?")
    assert "unshare=0" not in tool.out, tool


def test_chroot(jail):
    code = """
        def chroot_in_child(path):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, attempt(os.chroot, path).encode())
                os._exit(0)
            os.close(w)
            os.waitpid(pid, 0)
            return os.read(r, 64).decode()
        OUT["/tmp"] = chroot_in_child("/tmp")
        OUT["target"] = chroot_in_child(ARGS[0])
        OUT["/"] = chroot_in_child("/")
    """
    control = jail.host_py(code, jail.target, wrap=USERNS)
    assert set(control.values()) == {"OK"}, control
    res = jail.py(code, jail.target)
    assert res.rt == {"/tmp": "EPERM", "target": "EPERM", "/": "EPERM"}, res


def test_io_uring(jail):
    code = """
        params = (ctypes.c_ubyte * 120)()
        ctypes.set_errno(0)
        fd = LIBC.syscall(ctypes.c_long(NR["io_uring_setup"]), ctypes.c_long(8), params)
        OUT["setup"] = "OK" if fd >= 0 else ename(ctypes.get_errno())
        if fd >= 0:
            os.close(fd)
        OUT["enter"] = raw(NR["io_uring_enter"], 0, 1, 0, 0, 0, 0)
        OUT["register"] = raw(NR["io_uring_register"], 0, 0, 0, 0)
    """
    disabled = int(open("/proc/sys/kernel/io_uring_disabled").read()) \
        if os.path.exists("/proc/sys/kernel/io_uring_disabled") else 0
    control = jail.host_py(code)
    assert control["setup"] == ("OK" if disabled == 0 else "EPERM"), control
    assert control["enter"] != "EPERM" and control["register"] != "EPERM", control
    res = jail.py(code)
    assert res.rt == {"setup": "EPERM", "enter": "EPERM", "register": "EPERM"}, res


def test_open_by_handle_at(jail):
    """The 'shocker' escape: a file handle decoded against a mount of the target's opens any
    inode of that filesystem — the host's whole disk, past every bind."""
    code = """
        class Handle(ctypes.Structure):
            _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int),
                        ("f_handle", ctypes.c_ubyte * 128)]
        fh, mount_id = Handle(bytes=128), ctypes.c_int()
        where = ARGS[0].encode()
        r = LIBC.name_to_handle_at(-100, where, ctypes.byref(fh), ctypes.byref(mount_id), 0)
        OUT["name_to_handle_at"] = "OK" if r == 0 else ename(ctypes.get_errno())
        mfd = os.open(ARGS[0], os.O_RDONLY | os.O_DIRECTORY)
        ctypes.set_errno(0)
        fd = LIBC.open_by_handle_at(mfd, ctypes.byref(fh), os.O_RDONLY)
        OUT["open_by_handle_at"] = "OK" if fd >= 0 else ename(ctypes.get_errno())
        # a forged handle (ext4's root inode) against the same mount
        forged = Handle(bytes=8, type=1)
        forged.f_handle[0] = 2
        ctypes.set_errno(0)
        fd2 = LIBC.open_by_handle_at(mfd, ctypes.byref(forged), os.O_RDONLY)
        OUT["forged"] = "OK" if fd2 >= 0 else ename(ctypes.get_errno())
    """
    # control: root on the host opens by handle; to anyone else the kernel itself says no
    # (it needs CAP_DAC_READ_SEARCH over the filesystem, which no user namespace grants here)
    control = jail.host_py(code, jail.target)
    assert control["name_to_handle_at"] == "OK", control
    assert control["open_by_handle_at"] == ("OK" if ROOT else "EPERM"), control
    res = jail.py(code, "/tmp")
    assert res.rt["open_by_handle_at"] == "EPERM" and res.rt["forged"] == "EPERM", res


def test_keyrings(jail):
    code = """
        KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -2, -3, -4
        KEYCTL_GET_KEYRING_ID, KEYCTL_DESCRIBE = 0, 6
        OUT["add_key"] = raw(NR["add_key"], b"user", b"rt-" + MARKER.encode(), b"payload", 7,
                             KEY_SPEC_PROCESS_KEYRING)
        OUT["keyctl session"] = raw(NR["keyctl"], KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)
        OUT["keyctl user"] = raw(NR["keyctl"], KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0)
        OUT["request_key"] = raw(NR["request_key"], b"user", b"rt-absent-" + MARKER.encode(), 0, 0)
    """
    control = jail.host_py(code)
    assert control == {"add_key": "OK", "keyctl session": "OK", "keyctl user": "OK",
                       "request_key": "ENOKEY"}, control
    res = jail.py(code)
    assert set(res.rt.values()) == {"EPERM"} and len(res.rt) == 4, res


def test_bpf(jail):
    code = """
        BPF_MAP_CREATE, BPF_PROG_LOAD, BPF_OBJ_GET_INFO_BY_FD = 0, 5, 15
        attr = (ctypes.c_ubyte * 128)()
        struct.pack_into("IIII", attr, 0, 2, 4, 4, 1)           # an array map, 1 x u32
        ctypes.set_errno(0)
        fd = LIBC.syscall(ctypes.c_long(NR["bpf"]), ctypes.c_long(BPF_MAP_CREATE), attr,
                          ctypes.c_long(128))
        OUT["map_create"] = "OK" if fd >= 0 else ename(ctypes.get_errno())
        if fd >= 0:
            os.close(fd)
        insns = (ctypes.c_ubyte * 16)(*(struct.pack("<BBhi", 0xb7, 0, 0, 0) +   # r0 = 0
                                        struct.pack("<BBhi", 0x95, 0, 0, 0)))   # exit
        license = ctypes.create_string_buffer(b"GPL")
        prog = (ctypes.c_ubyte * 128)()
        struct.pack_into("IIQQ", prog, 0, 1, 2, ctypes.addressof(insns),
                         ctypes.addressof(license))                 # a socket filter
        OUT["prog_load"] = raw(NR["bpf"], BPF_PROG_LOAD, prog, 128)
        info = (ctypes.c_ubyte * 128)()
        struct.pack_into("i", info, 0, -1)
        OUT["get_info"] = raw(NR["bpf"], BPF_OBJ_GET_INFO_BY_FD, info, 128)
    """
    control = jail.host_py(code)
    assert control["get_info"] in ("EBADF", "EBADFD"), control   # the call reaches the kernel
    if ROOT:
        assert control["map_create"] == "OK", control
    res = jail.py(code)
    assert res.rt == {"map_create": "EPERM", "prog_load": "EPERM", "get_info": "EPERM"}, res


# One raw call per syscall the filter refuses, with arguments the kernel itself rejects
# harmlessly (NULL or unmapped pointers, bad descriptors, invalid flags and magic numbers):
# nothing is mounted, loaded, swapped or rebooted, on the host or in the jail.
SECCOMP_TABLE = """
    BAD = 1        # an unmapped address
    CALLS = {
        "mount": ("mount", 0, 0, 0, 0, 0),
        "umount2": ("umount2", 0, 0xffff),
        "pivot_root": ("pivot_root", 0, 0),
        "chroot": ("chroot", 0),
        "unshare": ("unshare", 0x1),
        "setns": ("setns", -1, 0),
        "bpf": ("bpf", 9999, 0, 0),
        "keyctl": ("keyctl", 9999, 0, 0, 0, 0),
        "add_key": ("add_key", 0, 0, 0, 0, 0),
        "request_key": ("request_key", 0, 0, 0, 0),
        "init_module": ("init_module", 0, 0, 0),
        "finit_module": ("finit_module", -1, 0, 0),
        "delete_module": ("delete_module", 0, 0),
        "kexec_load": ("kexec_load", 0, 1000, 0, 0xfff0),
        "kexec_file_load": ("kexec_file_load", -1, -1, 0, 0, 0xfffffff0),
        "io_uring_setup": ("io_uring_setup", 0, 0),
        "io_uring_enter": ("io_uring_enter", -1, 0, 0, 0, 0, 0),
        "io_uring_register": ("io_uring_register", -1, 0, 0, 0),
        "open_by_handle_at": ("open_by_handle_at", -1, 0, 0),
        "perf_event_open": ("perf_event_open", 0, 0, -1, -1, 0),
        "userfaultfd": ("userfaultfd", 0x1 | 0x10),
        "ptrace": ("ptrace", 2, os.getpid(), 0, 0),
        "reboot": ("reboot", 0, 0, 0, 0),                   # no magic: EINVAL, never a reboot
        "swapon": ("swapon", 0, 0x40000000),
        "swapoff": ("swapoff", 0),
        "acct": ("acct", BAD),
        "quotactl": ("quotactl", 0xffffffff, 0, 0, 0),
        "quotactl_fd": ("quotactl_fd", -1, 0xffffffff, 0, 0),
        "syslog": ("syslog", 9999, 0, 0),
        "open_tree": ("open_tree", -1, 0, 0xffffffff),
        "move_mount": ("move_mount", -1, 0, -1, 0, 0xffffffff),
        "fsopen": ("fsopen", 0, 0xffff),
        "fsconfig": ("fsconfig", -1, 0xffff, 0, 0, 0),
        "fsmount": ("fsmount", -1, 0xffff, 0),
        "fspick": ("fspick", -1, 0, 0xffff),
        "mount_setattr": ("mount_setattr", -1, 0, 0xffffffff, 0, 0),
        "clone NEWUSER": ("clone", 0x10000000 | 0x200, 0, 0, 0, 0),   # with CLONE_FS: EINVAL
        "clone NEWNS": ("clone", 0x00020000 | 0x200, 0, 0, 0, 0),
        "clone NEWNET": ("clone", 0x40000000 | 0x10000000 | 0x200, 0, 0, 0, 0),
        "clone3": ("clone3", 0, 0),
        "ioctl TIOCSTI": ("ioctl", -1, 0x5412, 0),
        "ioctl TIOCLINUX": ("ioctl", -1, 0x541C, 0),
    }
    for label, (name, *args) in CALLS.items():
        OUT[label] = raw(NR[name], *args)
    if platform.machine() == "x86_64":
        OUT["x32 getpid"] = raw(0x40000000 | 39)
"""
# Refused by the host kernel to anyone without the capability in the initial namespace,
# before it looks at an argument: for an ordinary user's control these answer EPERM (or
# ENOSYS where the kernel lacks the feature) even in a namespace of its own.
INIT_CAPABILITY = {"init_module", "finit_module", "delete_module", "kexec_load",
                   "kexec_file_load", "swapoff", "acct", "syslog"}


def test_seccomp_refuses_every_listed_syscall(jail):
    if ROOT:
        control = jail.host_py(SECCOMP_TABLE)
    else:   # own user, mount and pid namespaces: every namespaced capability check passes
        control = jail.host_py(SECCOMP_TABLE, wrap=USERNS + ["--pid", "--fork"])
    for label, result in control.items():
        if not ROOT and label in INIT_CAPABILITY:
            assert result in ("EPERM", "ENOSYS"), (label, result)
        else:
            assert result not in ("EPERM", "OK"), (label, result)
    res = jail.py(SECCOMP_TABLE)
    want = {label: "EPERM" for label in control}
    want["clone3"] = "ENOSYS"
    assert res.rt == want, res


def test_foreign_syscall_abi_is_killed(jail):
    """An i386 syscall (int 0x80) from a 64-bit process: the filter's arch check kills it."""
    assert platform.machine() == "x86_64", "the i386 ABI probe is x86_64 machine code"
    code = """
        import mmap
        buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3")    # mov eax, 20 (getpid); int 0x80; ret
        fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
        print("calling", flush=True)
        OUT["i386 getpid"] = fn() == os.getpid()
    """
    control = jail.host_py(code)
    assert control == {"i386 getpid": True}, control
    res = jail.py(code, check=None)
    assert res.code == 128 + 31 and res.rt is None, res            # SIGSYS, nothing after
    assert "calling" in res.out
