"""Explainable denials: when the sandbox refused a tool call, the model is told why.

CONTRACT (issue 14 -- tools.Toolbox calls it):
    explainer(session) -> explain(tool, args, captures) -> Denial | None
    explain.refused(tool, args, captures, exc) -> Denial | None   (a command the session
                                                                   refused to run at all)

A Denial's `line` becomes the first line of the tool result the model reads, and its record()
the `denial` field of the tool_result event (the workspace draws it as its own card).

Every claim rests on evidence, never on a guess (docs/DENIALS.md):
  record   the session's own record: a crossed grant (meta "limit"), the grants, the
           attestation its first command read back (was the seccomp filter loaded, was the
           network namespace private)
  cgroup   the session cgroup's own counters: pids.events `max` (a fork refused at pids.max),
           memory oom_kill (a process the kernel killed at memory.max)
  trace    a --trace strace record of this call: a whiteout mknod/renameat2 that failed, a
           connect that failed while the session has no network (or only the proxy)
  egress   the session's egress.jsonl (net=proxy), the lines written during this call: a
           connection the recording proxy refused (allowed: false, answered 403) -- the
           proxy's refusal by the session's allowlist or the address guard, not a syscall's
  stderr   what a failed command of the call said (exit status not 0), read together with the
           grants and the jail's plan(): an errno message naming a path or a syscall
A stderr pattern alone is never enough: each one is checked against what the session really
was (jailed? net=none? the filter loaded? the path absent from what the jail's plan shows?
a path inside a read-only mount of the plan? the grant non-zero?). The host itself is never
looked at for a path a command printed (the answer would tell the model what the host holds).
What cannot be known is not said: a path under the jail's private /tmp is never "outside the
jail", a relative path is never "read-only", and a failure with no such evidence gets no line.
Under net=proxy a failed direct connection (ENETUNREACH) or a name the sandbox could not resolve
is the namespace's doing and says "use the proxy"; a 403 the proxy answered is said only from
the egress log's own line for it (the words "403 Forbidden" alone could be any server's).
A trace record is read field by field (its strings are the program's). Every pattern is linear
on any line (no nested or unbounded repetition that can backtrack).
"""
import dataclasses
import json
import os
import posixpath
import re

from overlord.linux import seccomp
from overlord.sandbox import jail as jail_mod
from overlord.sandbox import limits as limits_mod
from overlord.text import escape_text
from overlord.txn import store

CAUSES = ("seccomp", "readonly", "outside", "network", "limit", "disk")
MiB = limits_mod.MiB
LIMIT_LABELS = {"fsize_mb": "file size", "nofile": "open files", "pids": "process",
                "memory_mb": "memory"}
WRITABLE = "only the project, /tmp and /dev/shm are writable"
READ_TRACE_CAP = 4 << 20          # at most the last 4 MiB of one call's trace records are read


@dataclasses.dataclass
class Denial:
    cause: str          # seccomp | readonly | outside | network | limit | disk
    line: str           # "blocked by the sandbox: ..." -- the first line of the tool result
    evidence: str = None     # record | cgroup | trace | stderr | egress
    detail: dict = None      # {"syscall"} | {"path"} | {"net"[, "host"]} | {"grant", "value"}

    def record(self):
        out = {"cause": self.cause, "line": self.line}
        if self.evidence:
            out["evidence"] = self.evidence
        out.update(self.detail or {})
        return out


# -- what the session is ------------------------------------------------------------------------

class Facts:
    """What a session's record says about its confinement (read fresh for every call)."""

    def __init__(self, meta):
        self.meta = meta
        grants = meta.get("grants") or {}
        attestation = meta.get("attestation") or {}
        self.target = meta.get("target") or "/"
        self.jailed = bool(grants.get("jail"))
        self.net = grants.get("net", "host")
        self.offline = self.net == "none" and attestation.get("net_namespace") is not False
        self.proxied = self.net == "proxy" and attestation.get("net_namespace") is not False
        self.limits = limits_mod.effective(grants.get("limits"))
        self.seccomp = bool(attestation.get("seccomp_sha256"))
        self.allow_ptrace = meta.get("trace") == "strace"
        self.uid = meta.get("uid")
        self.cgroup = (meta.get("enforcement") or {}).get("cgroup")
        self.crossed = meta.get("limit")
        self.git_readonly = git_readonly(meta.get("git"))
        self._plan = None

    @property
    def plan(self):
        """The jail's mounts, as jail.plan() builds them for this target ([] if unjailed)."""
        if self._plan is None:
            try:
                self._plan = jail_mod.plan(self.target, self.net) if self.jailed else []
            except Exception:        # noqa: BLE001 - no plan, no claim about the jail
                self._plan = []
        return self._plan

    def refused_syscalls(self):
        names = set(seccomp.DENIED)
        if not self.allow_ptrace:
            names.add("ptrace")
        return names if self.seccomp else set()


def git_readonly(record):
    """The git directories outside the target that the jail binds read-only: the git part's
    session.meta["git"]["readonly"] (txn/gitdir.record)."""
    paths = (record or {}).get("readonly") if isinstance(record, dict) else None
    return [posixpath.normpath(p) for p in paths or () if isinstance(p, str) and p.startswith("/")]


def _inside(path, root):
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


# -- the jail's namespace ----------------------------------------------------------------------

def _deepest(facts, path):
    """The jail op whose destination holds path most closely, or None (the jail's own root)."""
    best = None
    for op in facts.plan:
        if _inside(path, op.dest) and (best is None or len(op.dest) > len(best.dest)):
            best = op
    return best


# what the jail's /dev holds (jail._build_dev): anything else named under it is not there
DEV_ENTRIES = frozenset(jail_mod.DEVICES) | {"pts", "ptmx", "shm", "fd", "stdin", "stdout",
                                             "stderr", "console"}


def absent_in_jail(facts, path):
    """The shortest prefix of an absolute path that the jail does not show -- by its plan alone:
    the jail's root and /dev are its own read-only trees holding only what the plan puts there --
    or None when that cannot be said for sure (inside the project, a bind of the host's own tree,
    the private /tmp, /dev/shm, /proc). The host is never looked at: whether the path exists
    outside must not change the answer (the line would tell the model what the host holds)."""
    if not facts.jailed or not facts.plan or not path.startswith("/") or \
            ".." in path.split("/") or "\0" in path:
        return None              # a '..' after a symlink (/bin -> usr/bin) is not lexical
    path = posixpath.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if _inside(path, facts.target):
        return None
    op = _deepest(facts, path)
    if op is not None:
        if op.kind != "dev":
            return None          # the host's own tree (same as outside), or a private tmpfs/proc
        rest = path[len(op.dest):].lstrip("/")
        first = rest.split("/", 1)[0]
        if not first or first in DEV_ENTRIES:
            return None
        return posixpath.join(op.dest, first)
    dests = [o.dest for o in facts.plan]
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts)):
        prefix = "/" + "/".join(parts[:i + 1])
        if any(_inside(d, prefix) for d in dests):
            continue             # a directory the jail made on the way to one of its mounts
        return prefix
    return None


def readonly_in_jail(facts, path):
    """Which read-only part of the jail holds path, or None."""
    path = posixpath.normpath(path)
    if not facts.jailed or not facts.plan or _inside(path, facts.target):
        return None
    for g in facts.git_readonly:
        if _inside(path, g):
            return g
    op = _deepest(facts, path)
    if op is None:
        return "/"
    if op.kind in ("ro-bind", "symlink", "mask", "ro-bind-file"):
        return op.dest
    if op.kind == "proc":
        first = path[len(op.dest):].lstrip("/").split("/", 1)[0]
        return posixpath.join(op.dest, first) if first in jail_mod.PROC_READONLY else None
    if op.kind == "dev":
        first = path[len(op.dest):].lstrip("/").split("/", 1)[0]
        return None if first in ("shm", "pts") else op.dest
    return None                  # tmpfs, the project: writable


# -- reading what a command said ---------------------------------------------------------------

# each quoted run stops at its own opener too (a run of openers is not scanned once each)
_QUOTED = re.compile(r"'([^'\n]+)'|\u2018([^\u2018\u2019\n]+)\u2019|\"([^\"\n]+)\"|`([^'`\n]+)'")
_BARE = re.compile(r"(?<![\w.~\-/])(/[^\s:'\"`\u2018\u2019,;()]*)")


def paths_in(line):
    """The absolute paths a message names: quoted ones first, then bare ones."""
    out = []
    for m in _QUOTED.finditer(line):
        text = next(g for g in m.groups() if g is not None)
        if text.startswith("/"):
            out.append(text)
    for m in _BARE.finditer(_QUOTED.sub(" ", line)):
        text = m.group(1).rstrip(".")
        if text:
            out.append(text)
    return list(dict.fromkeys(out))


PROGRAM = r"^(?:\S*/)?"
# (pattern, syscall): messages of programs that name the refused syscall they made
SECCOMP_MESSAGES = [
    (re.compile(PROGRAM + r"unshare: unshare failed: Operation not permitted"), "unshare"),
    (re.compile(PROGRAM + r"chroot: cannot change root directory to .*: Operation not permitted"), "chroot"),
    (re.compile(PROGRAM + r"pivot_root: failed to change root from .*: Operation not permitted"), "pivot_root"),
    # libmount's words for EPERM from mount(2) (as a user it refuses before any syscall:
    # "must be superuser to use mount" -- no claim then)
    (re.compile(PROGRAM + r"mount: .*: permission denied\.?$"), "mount"),
    (re.compile(PROGRAM + r"nsenter: reassociate to namespace .* failed: Operation not permitted"), "setns"),
    (re.compile(PROGRAM + r"swapon: .*: swapon failed: Operation not permitted"), "swapon"),
    (re.compile(PROGRAM + r"swapoff: .*: swapoff failed: Operation not permitted"), "swapoff"),
    (re.compile(PROGRAM + r"dmesg: read kernel buffer failed: Operation not permitted"), "syslog"),
    (re.compile(PROGRAM + r"strace: [^\n]*?\bPTRACE_[A-Z_]{1,32}\b[^\n]{0,160}?: Operation not permitted$"), "ptrace"),
    (re.compile(r"^ptrace: Operation not permitted"), "ptrace"),
]
# "name(...): Operation not permitted", "name(2) failed: EPERM", "name(...) failed with
# unexpected error 1 (Operation not permitted)": a syscall named as called, for any syscall
# the filter refuses outright (a bare word is not enough: 'reboot' may be a file name)
_GENERIC = re.compile(r"\b([a-z_][a-z_0-9]{0,63})\((?:[^()\n]|\([^()\n]*\))*\)"
                      r"(?:\s{1,8}failed|\s{1,8}error)?(?:\s{1,8}with[^:\n]{0,80}?)?:?\s{0,8}\(?"
                      r"(?:Operation not permitted|EPERM\b)")
_PY_EPERM = re.compile(r"PermissionError: \[Errno 1\] Operation not permitted")
_PY_CALL = re.compile(r"\b(?:os|libc|_?posix)\.([a-z_0-9]+)\(")


def _seccomp_line(facts, lines, i):
    names = facts.refused_syscalls()
    if not names:
        return None
    line = lines[i].strip()
    for pattern, name in SECCOMP_MESSAGES:
        if pattern.search(line) and name in names:
            return name
    if re.search(PROGRAM + r"umount: .*: must be superuser to unmount", line) and facts.uid == 0:
        return "umount2"        # as uid 0 libmount says this only after umount2(2) failed
    for m in _GENERIC.finditer(line):
        if m.group(1) in names:
            return m.group(1)
    if _PY_EPERM.search(line):
        for back in reversed(lines[max(0, i - 4):i]):
            m = _PY_CALL.search(back)
            if m and m.group(1) in names:
                return m.group(1)
    return None


def _seccomp_denial(name, evidence, what=None):
    what = what or f"{name}(2)"
    return Denial("seccomp", f"blocked by the sandbox: {what} is refused by the seccomp filter",
                  evidence, {"syscall": name})


def _readonly(facts, line):
    """EROFS naming an absolute path that a read-only part of the jail's plan holds (or a git
    directory the record says is bound read-only). A relative path gets no line: where the
    program was when it wrote is not known, and the project, /tmp and /dev/shm are writable --
    a program's own words "Read-only file system" there are no evidence of the jail."""
    if "Read-only file system" not in line:
        return None
    for path in paths_in(line):
        if ".." in path.split("/"):
            continue             # not lexical after a symlink: which part it reached is unknown
        where = readonly_in_jail(facts, path)
        if where:
            return _readonly_denial(facts, where)
    return None


def _readonly_denial(facts, where):
    if where in facts.git_readonly:
        return Denial("readonly", f"blocked: {where} is read-only inside the jail (a git "
                      "directory outside the project)", "stderr", {"path": where})
    tail = f" ({WRITABLE})" if where == "/" else ""
    return Denial("readonly", f"blocked: {where} is read-only inside the jail{tail}", "stderr",
                  {"path": where})


_ENOENT = re.compile(r"No such file or directory|\[Errno 2\]|can't cd to|: not found$")


def _outside(facts, line):
    if not facts.jailed or not _ENOENT.search(line):
        return None
    for path in paths_in(line):
        missing = absent_in_jail(facts, path)
        if missing:
            return Denial("outside", f"blocked: {missing} does not exist inside the jail",
                          "stderr", {"path": missing})
    return None


NETWORK_MESSAGES = re.compile(
    r"Network is unreachable|ENETUNREACH|Could not resolve host|Could not resolve hostname|"
    r"Temporary failure in name resolution|Temporary failure resolving|Name or service not known|"
    r"No address associated with hostname|unable to resolve host address|"
    r"nodename nor servname provided|EAI_AGAIN|getaddrinfo ENOTFOUND|"
    r"Failed to establish a new network connection|Couldn't connect to server", re.I)
LOOPBACK = re.compile(r"\b(?:localhost|127\.\d+\.\d+\.\d+|::1)\b")


# net=proxy: the only words that say a program went around the proxy -- a direct connect the
# empty namespace refused, or a name it tried to resolve itself (there is no resolver inside).
# "Connection refused" / "Couldn't connect" are not among them: the proxy itself is on loopback.
PROXY_BYPASS = re.compile(r"Network is unreachable|ENETUNREACH|\[Errno 101\]", re.I)
PROXY_UNRESOLVED = re.compile(
    r"Could not resolve host|Could not resolve hostname|Temporary failure in name resolution|"
    r"Temporary failure resolving|Name or service not known|No address associated with hostname|"
    r"unable to resolve host address|EAI_AGAIN|getaddrinfo ENOTFOUND", re.I)
PROXY_URL = "http://127.0.0.1:3128"


def _network(facts, line):
    if facts.proxied:
        if PROXY_BYPASS.search(line):
            return _network_denial(facts, "stderr")
        if PROXY_UNRESOLVED.search(line):
            return Denial("network", "blocked: names do not resolve inside this session "
                          f"(net=proxy); use the proxy (HTTP_PROXY={PROXY_URL}), which resolves "
                          "them", "stderr", {"net": facts.net})
        return None
    if not facts.offline or not NETWORK_MESSAGES.search(line):
        return None
    if re.search(r"Couldn't connect to server", line, re.I) and LOOPBACK.search(line):
        return None          # nothing listens on this loopback: an ordinary failure
    return _network_denial(facts, "stderr")


def _network_denial(facts, evidence):
    if facts.proxied:
        return Denial("network", "blocked: direct connections are blocked in this session "
                      f"(net=proxy); use the proxy (HTTP_PROXY={PROXY_URL})", evidence,
                      {"net": facts.net})
    return Denial("network", f"blocked: no network in this session (net={facts.net})", evidence,
                  {"net": facts.net})


EGRESS_SHOWN = 200          # characters of a refused host or reason in the line


def from_egress(facts, lines):
    """The proxy's refusal among the egress lines written during the call (net=proxy), or
    None: the first line with allowed false. Host and reason are the command's and the
    resolver's words: escaped and clipped."""
    if facts.net != "proxy":
        return None
    for rec in lines:
        if rec.get("allowed") is not False:
            continue
        host = rec.get("host") if isinstance(rec.get("host"), str) else "?"
        port = rec.get("port") if isinstance(rec.get("port"), int) else None
        reason = rec.get("reason") if isinstance(rec.get("reason"), str) else None
        where = escape_text(host[:EGRESS_SHOWN]) + (f":{port}" if port is not None else "")
        why = f": {escape_text(reason[:EGRESS_SHOWN])}" if reason else ""
        status = rec.get("status") if isinstance(rec.get("status"), int) else 403
        return Denial("network", f"blocked by the proxy: {where} was refused ({status}){why}",
                      "egress", {"net": facts.net, "host": host[:EGRESS_SHOWN]})
    return None


_EFBIG = re.compile(r"File too large|File size limit exceeded|\[Errno 27\]")
_EMFILE = re.compile(r"Too many open files(?! in system)|\[Errno 24\]")
# a fork word, then (anywhere after it on the line) EAGAIN's words: found with str methods and
# one literal alternation each (no nested repetition: linear on any line)
_FORK_WORD = re.compile(r"\bfork|\bclone|\bvfork|pthread_create|can't start new thread|spawn", re.I)
_FORK_ALONE = re.compile(r"Cannot fork|can't fork", re.I)
_EAGAIN_WORDS = ("resource temporarily unavailable", "eagain")


def _fork_refused(line):
    if _FORK_ALONE.search(line):
        return True
    low = line.lower()
    last = max(low.rfind(w) for w in _EAGAIN_WORDS)
    return last > 0 and _FORK_WORD.search(line, 0, last) is not None
_PY_EAGAIN = re.compile(r"BlockingIOError: \[Errno 11\]|RuntimeError: can't start new thread")
_PY_FORK = re.compile(r"\bfork\(|_execute_child|fork_exec|\.start\(\)")
_ENOMEM = re.compile(r"MemoryError|Cannot allocate memory|out of memory|std::bad_alloc|"
                     r"memory exhausted|xmalloc: cannot allocate", re.I)


def _limits(facts, lines, i, meta, captures):
    line = lines[i]
    lim = facts.limits
    if _EFBIG.search(line):
        bound = fsize_bound(meta, captures)
        if bound == "fsize_mb":
            return limit_denial("fsize_mb", lim["fsize_mb"], "stderr")
        if bound == "disk_mb":
            return Denial("disk", f"blocked: a file reached what is left of the disk grant "
                          f"(disk_mb={lim['disk_mb']})", "stderr",
                          {"grant": "disk_mb", "value": lim["disk_mb"]})
    if _EMFILE.search(line) and lim["nofile"]:
        return limit_denial("nofile", lim["nofile"], "stderr")
    if lim["pids"] and facts.uid not in (0, None):      # RLIMIT_NPROC holds a user, not uid 0
        forked = _fork_refused(line) or (_PY_EAGAIN.search(line) and any(
            _PY_FORK.search(b) for b in lines[max(0, i - 6):i]))
        if forked:
            return limit_denial("pids", lim["pids"], "stderr")
    if lim["memory_mb"] and facts.cgroup is None and _ENOMEM.search(line):
        return limit_denial("memory_mb", lim["memory_mb"], "stderr")   # the data rlimit holds it
    return None


def fsize_bound(meta, captures):
    """Which grant set the file size rlimit the call's commands ran under: fsize_mb, disk_mb
    (no file may outgrow what is left of the disk grant), or None (no such limit)."""
    lim = limits_mod.effective((meta.get("grants") or {}).get("limits"))
    sealed = [c.layer for c in captures if getattr(c, "layer", None) is not None]
    layers = meta.get("layers") or []
    before = layers[:min(sealed)] if sealed else layers
    used = sum(layer.get("bytes", 0) for layer in before)
    disk_left = max(1, lim["disk_mb"] * MiB - used) if lim["disk_mb"] else 0
    sizes = {"fsize_mb": lim["fsize_mb"] * MiB, "disk_mb": disk_left and disk_left + MiB}
    sizes = {k: v for k, v in sizes.items() if v}
    if not sizes:
        return None
    return min(sizes, key=lambda k: (sizes[k], k != "fsize_mb"))


def limit_denial(grant, value, evidence, why=""):
    return Denial("limit", f"blocked: the {LIMIT_LABELS[grant]} grant ({grant}={value}) was "
                  f"reached{why}", evidence, {"grant": grant, "value": value})


def disk_denial(facts, grant, evidence):
    value = facts.limits.get(grant)
    if grant == "disk_mb":
        return Denial("disk", f"blocked: the session crossed its disk grant (disk_mb={value}): "
                      "nothing more can run in it", evidence, {"grant": grant, "value": value})
    return Denial("limit", f"blocked: the session crossed its {grant} grant ({grant}={value}): "
                  "nothing more can run in it", evidence, {"grant": grant, "value": value})


def _failed(cap):
    return cap.exit_code not in (0, None) and not cap.timed_out


def from_stderr(facts, captures, meta=None):
    """The first denial a failed command's stderr shows, line by line, or None."""
    meta = meta if meta is not None else facts.meta
    for cap in captures:
        if not _failed(cap):
            continue
        lines = (cap.stderr or b"").decode("utf-8", "replace").splitlines()
        for i, raw in enumerate(lines):
            line = raw.strip()
            name = _seccomp_line(facts, lines, i)
            if name:
                return _seccomp_denial(name, "stderr")
            found = (_readonly(facts, line) or _limits(facts, lines, i, meta, captures)
                     or _network(facts, line) or _outside(facts, line))
            if found:
                return found
    return None


def trace_fields(args):
    """An strace record's argument text split at its top-level commas, each field stripped;
    a quoted string (a path: the traced program chose it, escapes and all) is kept whole and
    never split or read as flags. One pass, linear."""
    fields, depth, start, i, n = [], 0, 0, 0, len(args)
    while i < n:
        c = args[i]
        if c == '"':
            i += 1
            while i < n and args[i] != '"':
                i += 2 if args[i] == "\\" else 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            fields.append(args[start:i].strip())
            start = i + 1
        i += 1
    fields.append(args[start:].strip())
    return fields


def _flags(field):
    """The names of a flags field (A|B|0x4), or none when the field is a string or a struct."""
    if not field or field[0] in '"{[':
        return set()
    return {part.strip() for part in field.split("|")}


def _whiteout_device(fields, mode_at):
    """mknod(path, mode, dev) / mknodat(dirfd, path, mode, dev): a 0/0 character device."""
    if len(fields) != mode_at + 2:
        return False
    return "S_IFCHR" in _flags(fields[mode_at]) and bool(_ZERO_DEV.fullmatch(fields[mode_at + 1]))


_ZERO_DEV = re.compile(r"makedev\(0(?:x0)?,\s?0(?:x0)?\)")


_SA_FAMILY = re.compile(r"\{sa_family=(AF_INET6?)\b")
_LOOPBACK_ADDR = re.compile(r'inet_addr\("127\.|inet_pton\(AF_INET6,\s?"::1"')


def from_trace(facts, records):
    """A denial a --trace strace record of the call shows (records with a return value). Each
    check reads the syscall's own field -- its flags, its mode and device, its address family
    -- never the whole line, whose strings the program chose."""
    for rec in records:
        if rec.get("ret") != -1:
            continue
        name, args = rec.get("syscall"), rec.get("args") or ""
        if not isinstance(args, str):
            continue
        fields = trace_fields(args) if name in ("mknod", "mknodat", "renameat2", "connect") else ()
        if facts.seccomp and name in ("mknod", "mknodat") and \
                _whiteout_device(fields, 1 if name == "mknod" else 2):
            return _seccomp_denial(name, "trace", f"{name}(2) of a 0/0 character device (an "
                                                  "overlay whiteout)")
        if facts.seccomp and name == "renameat2" and len(fields) == 5 and \
                "RENAME_WHITEOUT" in _flags(fields[4]):
            return _seccomp_denial(name, "trace", "renameat2(2) with RENAME_WHITEOUT")
        if (facts.offline or facts.proxied) and name == "connect" and len(fields) >= 2:
            family = _SA_FAMILY.match(fields[1])
            if family and not _LOOPBACK_ADDR.search(fields[1]):
                return _network_denial(facts, "trace")
    return None


def classify(meta, captures, trace=(), counters=None, before=None, egress=()):
    """The denial a call's captured commands show, or None. meta: the session's record after
    the call; before: its record before (for a grant crossed by this call); counters: the
    session cgroup's counter increments during the call {"pids": n, "oom_kill": n}; egress:
    the egress.jsonl lines written during the call (a proxy session's)."""
    facts = Facts(meta)
    if facts.crossed and not (before or {}).get("limit") and any(
            c.exit_code == limits_mod.DISK_EXIT for c in captures):
        return disk_denial(facts, facts.crossed, "record")
    counters = counters or {}
    if counters.get("pids") and facts.limits["pids"]:
        return limit_denial("pids", facts.limits["pids"], "cgroup")
    if counters.get("oom_kill") and facts.limits["memory_mb"]:
        return limit_denial("memory_mb", facts.limits["memory_mb"], "cgroup",
                            ": the kernel killed a process that needed more")
    found = from_stderr(facts, captures, meta)
    if found:
        return found
    refused = from_egress(facts, egress)     # a refused connection: whatever the exit status
    if refused or not any(_failed(c) for c in captures):
        return refused
    return from_trace(facts, trace)


# -- the live explainer ------------------------------------------------------------------------

class Explainer:
    """explain(tool, args, captures) for one session: reads the session's record, its cgroup
    counters and its trace afresh for every call, and remembers where they stood."""

    def __init__(self, session):
        self.sid, self.dir = session.sid, session.dir
        self.meta = dict(session.meta)
        self.counters = self._counters()
        self.trace_at = self._trace_size()
        self.egress_at = self._egress_size()

    def __call__(self, tool, args, captures):
        before = self.meta
        meta = self._meta()
        counters = self._counters()
        grew = {k: max(0, v - self.counters.get(k, 0)) for k, v in counters.items()}
        trace = self._trace() if meta.get("trace") == "strace" else []
        egress = self._egress() if (meta.get("grants") or {}).get("net") == "proxy" else []
        self.meta, self.counters = meta, counters
        return classify(meta, captures, trace, grew, before, egress)

    def refused(self, tool, args, captures, exc):
        """The session refused to run the call's command (exec_in raised): a crossed grant is
        the only refusal that is the sandbox's; the rest (a rolled-back session, a moved
        target, today's policy) say so in their own words."""
        meta = self._meta()
        self.meta = meta
        facts = Facts(meta)
        if facts.crossed:
            return disk_denial(facts, facts.crossed, "record")
        return None

    def _meta(self):
        try:
            with open(os.path.join(self.dir, "meta.json"), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return self.meta

    def _counters(self):
        """The session cgroup's {"pids": refused forks, "oom_kill": processes killed}."""
        kind = (self.meta.get("enforcement") or {}).get("cgroup")
        if kind not in ("v1", "v2"):
            return {}
        group = limits_mod.Cgroup(self.sid, None)      # its paths only: nothing is made
        if group.kind != kind or not group.paths:
            return {}
        if kind == "v1":
            memory, pids_dir = group.paths[0], group.paths[1]
            pids, oom = os.path.join(pids_dir, "pids.events"), os.path.join(memory, "memory.oom_control")
        else:
            pids = os.path.join(group.paths[0], "pids.events")
            oom = os.path.join(group.paths[0], "memory.events")
        out = {}
        for key, path, field in (("pids", pids, "max"), ("oom_kill", oom, "oom_kill")):
            value = _counter(path, field)
            if value is not None:
                out[key] = value
        return out

    def _trace_path(self):
        return os.path.join(self.dir, "syscalls.jsonl")

    def _trace_size(self):
        try:
            return os.path.getsize(self._trace_path())
        except OSError:
            return 0

    def _trace(self):
        """The trace records written since the last call."""
        try:
            with open(self._trace_path(), "rb") as f:
                end = os.fstat(f.fileno()).st_size
                f.seek(max(self.trace_at, end - READ_TRACE_CAP))   # a huge call: its last records
                data = f.read(end - f.tell())
                self.trace_at = end
        except OSError:
            return []
        return store.parse_jsonl(data)

    def _egress_path(self):
        return os.path.join(self.dir, "egress.jsonl")

    def _egress_size(self):
        try:
            return os.path.getsize(self._egress_path())
        except OSError:
            return 0

    def _egress(self):
        """The egress lines appended since the last call, whole lines only (a line still
        being written is read with the next call's)."""
        try:
            with open(self._egress_path(), "rb") as f:
                end = os.fstat(f.fileno()).st_size
                start = max(self.egress_at, end - READ_TRACE_CAP)
                f.seek(start)
                data = f.read(end - start)
        except OSError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self.egress_at = start + len(whole)
        return store.parse_jsonl(whole)


def _counter(path, field):
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == field and value.strip().isdigit():
                    return int(value)
    except OSError:
        return None
    return None


def explainer(session):
    return Explainer(session)
