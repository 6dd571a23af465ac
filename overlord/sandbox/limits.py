"""Resource grants: what a session may consume of the machine.

Enforced in layers, each where the host provides it:
  rlimits   in every command, both backends: processes, file size, open files, and the data
            segment (memory) where no cgroup can hold it;
  cgroup    around each command, created before it starts so every process is born inside
            (cgroup v2 on a subtree we may write, or v1 as root): memory, pids, cpu;
  disk      the layer a command writes is measured while it runs; crossing the grant ends
            the command (exit 122) and the session's ability to run anything.
What the host cannot enforce is reported (doctor, the session record), never pretended.
"""
import functools
import os
import resource
import time

from overlord.errors import UsageError

MiB = 1 << 20
DEFAULTS = {"memory_mb": 4096, "pids": 512, "cpu_pct": 200, "disk_mb": 8192, "fsize_mb": 4096,
            "nofile": 4096}
DISK_EXIT = 122
V1_ROOT = "/sys/fs/cgroup"


def parse(items, base=None):
    """--limit key=N (repeatable) over a manifest's limits; 0 means unlimited."""
    out = dict(base or {})
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--limit takes key=N, not {item!r}")
        try:
            out[key] = int(value)
        except ValueError:
            raise UsageError(f"--limit {key}: not a whole number: {value!r}") from None
    return validate(out)


MOST = {"pids": 1 << 22}        # PID_MAX_LIMIT (pids.max refuses more); the others 2**31


def validate(limits, where="limits"):
    if not isinstance(limits, dict):
        raise UsageError(f"{where} must be an object of key: number")
    for key, value in limits.items():
        if key not in DEFAULTS:
            raise UsageError(f"{where}: unknown limit {key!r} (known: {', '.join(DEFAULTS)})")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UsageError(f"{where}: {key} must be a whole number >= 0 (0 = unlimited)")
        most = MOST.get(key, 1 << 31)
        if value > most:          # the cgroup refuses it: the first command would crash
            raise UsageError(f"{where}: {key} must be at most {most} (0 = unlimited)")
    return dict(limits)


def effective(limits):
    return dict(DEFAULTS, **(limits or {}))


def rlimits(limits, cgroup_memory, disk_left=0):
    """[(resource, value)] to set in the process that starts the command. No single file may
    outgrow what is left of the disk grant (plus a little, so the crossing is seen and
    recorded), so one big write stops at once."""
    lim = effective(limits)
    out = []
    if lim["pids"]:
        out.append((resource.RLIMIT_NPROC, lim["pids"]))
    sizes = [v for v in (lim["fsize_mb"] * MiB, disk_left and disk_left + MiB) if v]
    if sizes:
        out.append((resource.RLIMIT_FSIZE, min(sizes)))
    if lim["nofile"]:
        out.append((resource.RLIMIT_NOFILE, lim["nofile"]))
    if lim["memory_mb"] and not cgroup_memory:
        out.append((resource.RLIMIT_DATA, lim["memory_mb"] * MiB))
    return out


def apply_rlimits(pairs):
    for res, value in pairs:
        soft, hard = resource.getrlimit(res)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(res, (value, value))


# -- cgroups ----------------------------------------------------------------------------------

def _writable(path):
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


@functools.lru_cache(maxsize=1)
def cgroup_kind():
    """'v2', 'v1' or None, with the reason when None (once per process: it does not change)."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        base = _v2_base()
        if base:
            return "v2", base
        return None, "cgroup v2 without a subtree this user may write (no delegation)"
    if all(_writable(os.path.join(V1_ROOT, c)) for c in ("memory", "pids", "cpu")):
        return "v1", V1_ROOT
    return None, "cgroup v1 controllers are not writable by this user"


def _v2_base():
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            if line.startswith("0::"):
                own = os.path.join("/sys/fs/cgroup", line[3:].strip().lstrip("/"))
                parent = os.path.dirname(own)
                for cand in (own, parent):
                    controllers = os.path.join(cand, "cgroup.subtree_control")
                    if _writable(cand) and os.access(controllers, os.W_OK):
                        return cand
    return None


class Cgroup:
    """One cgroup (per controller on v1) around a session: made before its first command
    starts, joined by each command's first process before it may run, removed with the
    session's working files. One command runs at a time, so its limits bind each command."""

    def __init__(self, name, limits):
        self.kind, self.base = cgroup_kind()
        self.name = name
        self.limits = effective(limits)
        if self.kind == "v1":
            self.paths = [os.path.join(self.base, c, "overlord", name) for c in ("memory", "pids", "cpu")]
        elif self.kind == "v2":
            self.paths = [os.path.join(self.base, f"overlord-{name}")]
        else:
            self.paths = []

    @property
    def memory(self):
        return self.kind is not None and bool(self.limits["memory_mb"])

    def create(self):
        if self.kind is None or all(os.path.isdir(p) for p in self.paths):
            return
        lim = self.limits
        if self.kind == "v1":
            settings = {"memory": {"memory.limit_in_bytes": lim["memory_mb"] * MiB if lim["memory_mb"] else -1},
                        "pids": {"pids.max": lim["pids"] or "max"},
                        "cpu": {"cpu.cfs_period_us": 100000,
                                "cpu.cfs_quota_us": lim["cpu_pct"] * 1000 if lim["cpu_pct"] else -1}}
            for path, values in zip(self.paths, settings.values()):
                os.makedirs(path, exist_ok=True)
                for key, value in values.items():
                    _write(os.path.join(path, key), value)
        else:
            path = self.paths[0]
            os.makedirs(path, exist_ok=True)
            _write(os.path.join(path, "memory.max"), lim["memory_mb"] * MiB if lim["memory_mb"] else "max")
            _write(os.path.join(path, "pids.max"), lim["pids"] or "max")
            _write(os.path.join(path, "cpu.max"),
                   f"{lim['cpu_pct'] * 1000} 100000" if lim["cpu_pct"] else "max 100000")

    def add(self, pid):
        for path in self.paths:
            _write(os.path.join(path, "cgroup.procs"), pid)

    def enter(self):
        """Move this (single-threaded, launching) process into the cgroup once: every command
        it then starts is born inside, and moving a process — which costs a kernel RCU
        sync, about half a millisecond per controller — is paid once per session, not per
        command. leave() moves it back."""
        global _entered
        if self.kind is None or _entered == self.name:
            return
        if _entered is None:
            _saved_cgroups.update(_own_cgroups())
        self.add(os.getpid())
        _entered = self.name

    def leave(self):
        global _entered
        if _entered != self.name:
            return
        for path in _saved_cgroups.values():
            _write(os.path.join(path, "cgroup.procs"), os.getpid())
        _entered = None

    def remove(self):
        self.leave()
        for path in self.paths:
            for _ in range(10):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # the last processes may still be being torn down; a cgroup some other
                    # process still holds is left for `overlord gc`
                    time.sleep(0.005)


_entered = None          # the session whose cgroup this process is in, if any
_saved_cgroups = {}      # controller -> the cgroup directory this process came from


def _own_cgroups():
    out = {}
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                if c in ("memory", "pids", "cpu"):
                    out[c] = os.path.join(V1_ROOT, c, path.lstrip("/"))
                elif c == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                    out[""] = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
    return out


def _write(path, value):
    try:
        with open(path, "w") as f:
            f.write(f"{value}\n")
    except OSError:
        if not path.endswith(("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us")):
            raise


def not_enforced(limits, kind):
    """The grants this host cannot hold, to say so rather than pretend."""
    lim = effective(limits)
    out = []
    if kind is None:
        if lim["cpu_pct"]:
            out.append("cpu_pct (no cgroup)")
        if lim["memory_mb"]:
            out.append("memory_mb (data segment rlimit only, no cgroup)")
        if lim["pids"] and os.getuid() != 0:
            out.append("pids (per-user rlimit only, no cgroup)")
    return out


# -- the disk grant -----------------------------------------------------------------------------

def layer_bytes(path):
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


class DiskWatch:
    """Measures the upper layer while a command runs (polled by the launch's wait loop, no
    thread); past the grant, calls on_cross once."""

    def __init__(self, upper, budget_bytes, on_cross):
        self.upper, self.budget, self.on_cross = upper, budget_bytes, on_cross
        self.crossed = False
        self.next_due = 0.0

    def poll(self):
        """Measure, but never spend more than about 5% of the time measuring: a layer of
        many files is walked less often."""
        now = time.monotonic()
        if not self.budget or self.crossed or now < self.next_due:
            return
        used = layer_bytes(self.upper)
        self.next_due = now + 20 * (time.monotonic() - now)
        if used > self.budget:
            self.crossed = True
            self.on_cross()

    def stop(self):
        """After the command: a last measure (a fill between two polls is caught too)."""
        if self.budget and not self.crossed and layer_bytes(self.upper) > self.budget:
            self.crossed = True
        return self.crossed
