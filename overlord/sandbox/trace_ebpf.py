"""`--trace ebpf`: the kernel-side syscall recorder (bpftrace; root only).

The probes filter on the session's own user namespace, so they record exactly the processes
of the command, and the command cannot see or fake them. The recorder is attached before the
command may start (the caller holds the child until bpftrace says it is attached); if it
cannot attach, the command never runs. Known limit: a process is recorded from the moment
its syscalls hit the probes; nothing earlier exists for it, because nothing ran earlier.
"""
import json
import os
import signal
import threading

from overlord import hosttools
from overlord.errors import LaunchError

TRACEFS = "/sys/kernel/tracing"
# (syscall, path argument, flags argument or None)
PROBES = (("execve", "filename", None), ("openat", "filename", "flags"), ("open", "filename", "flags"),
          ("creat", "pathname", None), ("unlinkat", "pathname", None), ("unlink", "pathname", None),
          ("mkdirat", "pathname", None), ("mkdir", "pathname", None), ("rmdir", "pathname", None),
          ("renameat2", "newname", None), ("rename", "newname", None), ("symlinkat", "newname", None),
          ("linkat", "newname", None), ("fchmodat", "filename", None), ("truncate", "path", None),
          ("connect", None, None))
WRITES = {"creat", "unlinkat", "unlink", "mkdirat", "mkdir", "rmdir", "renameat2", "rename",
          "symlinkat", "linkat", "fchmodat", "truncate"}
O_ACCMODE, O_CREAT, O_TRUNC, O_APPEND = 3, 0o100, 0o1000, 0o2000


def available():
    """(ok, why): root, bpftrace on PATH, and the kernel's syscall tracepoints."""
    if os.geteuid() != 0:
        return False, "root only (bpftrace loads BPF programs)"
    if not hosttools.find("bpftrace"):
        return False, "bpftrace is not installed (apt-get install bpftrace)"
    if not os.path.isdir(os.path.join(TRACEFS, "events", "syscalls")) and not os.path.ismount(TRACEFS):
        return True, "bpftrace; tracefs will be mounted on first use"
    return True, "bpftrace, filtered on the session's user namespace"


def _ensure_tracefs():
    if os.path.isdir(os.path.join(TRACEFS, "events", "syscalls")):
        return
    import subprocess        # only when tracing: never on an untraced command's path
    mount = hosttools.find("mount") or "/bin/mount"
    subprocess.run([mount, "-t", "tracefs", "nodev", TRACEFS], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    if not os.path.isdir(os.path.join(TRACEFS, "events", "syscalls")):
        raise LaunchError("--trace ebpf: the kernel's syscall tracepoints are not available")


def script(userns_inode):
    lines = []
    cond = f"/curtask->cred->user_ns->ns.inum == {int(userns_inode)}/"
    for name, path_arg, flags_arg in PROBES:
        if not os.path.isdir(os.path.join(TRACEFS, "events", "syscalls", f"sys_enter_{name}")):
            continue
        flags = f"args->{flags_arg}" if flags_arg else "0"
        path = f"str(args->{path_arg})" if path_arg else '""'
        lines.append(f'tracepoint:syscalls:sys_enter_{name} {cond} '
                     f'{{ printf("%d %lld {name} %d %s\\n", pid, nsecs, {flags}, {path}); }}')
    # BEGIN fires once every probe above is attached ("Attaching N probes" comes before)
    lines.append('BEGIN { printf("READY\\n"); }')
    return "\n".join(lines) + "\n"


def parse_line(line):
    parts = line.rstrip("\n").split(" ", 4)
    if len(parts) < 4 or not parts[0].isdigit():
        return None
    pid, ts, name, flags = int(parts[0]), int(parts[1]), parts[2], int(parts[3])
    rec = {"pid": pid, "ts": ts / 1e9, "syscall": name, "recorder": "ebpf"}
    if len(parts) == 5 and parts[4]:
        rec["path"] = parts[4]
    if name in WRITES or (name in ("openat", "open") and
                          (flags & O_ACCMODE or flags & (O_CREAT | O_TRUNC | O_APPEND))):
        rec["write"] = True
    if name == "execve":
        rec["kind"] = "exec"
    elif name == "connect":
        rec["kind"] = "connect"
    return rec


class EbpfRecorder:
    """Attach for one command's user namespace; write syscalls.jsonl when it ends."""

    def __init__(self, out_path):
        self.out_path, self.proc, self.count, self.thread = out_path, None, 0, None

    def attach(self, child_pid):
        """Called with the command's PID 1 held: returns once the probes are attached."""
        _ensure_tracefs()
        self.setup_pid = child_pid          # OVERLORD's own PID 1: its setup is not the command
        inode = os.stat(f"/proc/{child_pid}/ns/user").st_ino
        import subprocess
        bpftrace = hosttools.find("bpftrace") or "bpftrace"
        self.proc = subprocess.Popen([bpftrace, "-e", script(inode)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     errors="replace", start_new_session=True)
        first = self.proc.stdout.readline()
        while first.startswith("Attaching"):
            first = self.proc.stdout.readline()
        if first.strip() != "READY":
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            self.proc.wait()
            msg = " ".join(l for l in err.splitlines() if "RLIMIT_MEMLOCK" not in l).strip()
            raise LaunchError(f"--trace ebpf: bpftrace could not attach: {msg or first.strip()}")
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self):
        with open(self.out_path, "a", encoding="utf-8") as out:
            for line in self.proc.stdout:
                rec = parse_line(line)
                if rec and rec["pid"] != self.setup_pid:
                    out.write(json.dumps(rec, sort_keys=True) + "\n")
                    self.count += 1
            out.flush()
            os.fsync(out.fileno())

    def finish(self):
        if self.proc is None:
            return 0
        import subprocess
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.thread:
            self.thread.join(timeout=10)
        return self.count
