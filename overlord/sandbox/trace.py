"""The syscall flight recorder: strace output, read from a pipe, parsed into records."""
import json
import os
import re
import threading

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(.*)$")
WRITE_SYSCALLS = {"unlink", "unlinkat", "rename", "renameat", "renameat2", "mkdir", "mkdirat",
                  "rmdir", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat",
                  "truncate", "ftruncate", "creat", "mknod", "mknodat"}
OPEN_SYSCALLS = {"open", "openat", "openat2"}
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")


def parse_line(line):
    m = LINE.match(line.strip())
    if not m:
        return None
    pid, ts, name, args, ret, _rest = m.groups()
    rec = {"pid": int(pid), "ts": float(ts), "syscall": name, "args": args,
           "ret": None if ret == "?" else int(ret)}
    paths = re.findall(r'"((?:[^"\\]|\\.)*)"', args)
    if paths:
        rec["path"] = paths[0] if name not in ("execve", "execveat") else paths[0]
    if name in WRITE_SYSCALLS or (name in OPEN_SYSCALLS and any(f in args for f in WRITE_FLAGS)):
        rec["write"] = True
    if name in ("execve", "execveat"):
        rec["kind"] = "exec"
    elif name == "connect":
        rec["kind"] = "connect"
    return rec


class Recorder:
    """Drains the strace pipe on a thread (strace blocks if nobody reads) into a JSONL file.

    The first traced exec is OVERLORD's own fd-closing shell; its records are dropped.
    """

    def __init__(self, out_path):
        self.out_path = out_path
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        self.count = 0
        self.thread = None

    def start(self):
        os.close(self.write_fd)
        self.write_fd = None
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self):
        wrapper_pid, wrapper_done = None, False
        with os.fdopen(self.read_fd, "r", errors="replace") as src, \
                open(self.out_path, "a", encoding="utf-8") as out:
            for line in src:
                rec = parse_line(line)
                if rec is None:
                    continue
                if wrapper_pid is None:
                    wrapper_pid = rec["pid"]
                if not wrapper_done and rec["pid"] == wrapper_pid:
                    if rec["syscall"] == "execve" and "overlord-trace" not in rec["args"] and rec["ret"] == 0:
                        wrapper_done = True
                    else:
                        continue
                out.write(json.dumps(rec, sort_keys=True) + "\n")
                self.count += 1
            out.flush()
            os.fsync(out.fileno())

    def finish(self):
        if self.write_fd is not None:
            os.close(self.write_fd)
        if self.thread:
            self.thread.join(timeout=30)
        return self.count
