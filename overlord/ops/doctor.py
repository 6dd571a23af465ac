"""Listing sessions and what this host can do."""
import dataclasses
import json
import os
import socket

from overlord.linux import libc
from overlord.errors import OverlordError
from overlord.ops.audit import audit_status
from overlord.sandbox import backends, fuse, harden, limits
from overlord.sandbox import trace_ebpf
from overlord.txn import store
from overlord.txn.session import MAX_SAVEPOINTS
from overlord import hosttools


# -- listing and diagnostics ----------------------------------------------------------------------


def host_tool(name):
    """Where a program OVERLORD runs itself on the host is (overlord/hosttools.py), or None."""
    return hosttools.find(name)


def sessions():
    return store.list_metas()


@dataclasses.dataclass
class DoctorReport:
    backends: dict            # name -> (available, reason)
    active: str
    tools: dict               # name -> path or None
    home: str
    in_jail: bool
    containment: dict         # layer -> (available, what it means here)
    coarse: list = dataclasses.field(default_factory=list)   # [(sid, what got coarser)]
    fuse_containment: tuple = None   # (OVERLORD_HOME hidden, in words) where fuse is available
    audit: dict = None        # the chain's verify report (ops.audit_status), or {"error": ...}
    daemon: dict = None       # daemon_status(): {"socket", "running", "pid", "detail"}
    connectors: dict = None   # connectors_status(): {"file", "servers", "approval"} or {"file", "error"}


def doctor():
    probes = backends.probe_all()
    forced = os.environ.get("OVERLORD_TEST_BACKEND")
    if forced in probes and probes[forced][0]:
        active = forced
    else:
        active = next((n for n, (ok, _) in probes.items() if ok), None)
    tools = {t: hosttools.find(t) for t in ("fuse-overlayfs", "fusermount3", "strace", "bpftrace", "git")}
    return DoctorReport(probes, active, tools, store.home(), os.environ.get("OVERLORD_JAIL") == "1",
                        containment_layers(probes["kernel"][0], tools), coarse_sessions(),
                        fuse_containment(probes["fuse"][0]), audit_status(), daemon_status(),
                        connectors_status())


def connectors_status():
    """mcp.json as the agent will read it: how many servers, the approval mode, or what is
    wrong with the file (a damaged one refuses every connector)."""
    from overlord.agent.connectors import config
    try:
        cfg = config.load()
    except OverlordError as exc:
        return {"file": config.path(), "error": str(exc)}
    return {"file": config.path(), "servers": sorted(cfg.servers), "approval": cfg.approval}


# -- the daemon -----------------------------------------------------------------------------------

def daemon_socket():
    """Where `overlord daemon` listens (and a client connects) unless told: OVERLORD_SOCKET,
    else OVERLORD_HOME/overlordd.sock."""
    return os.path.abspath(os.environ.get("OVERLORD_SOCKET")
                           or os.path.join(store.home(), "overlordd.sock"))


def daemon_ping(path, timeout=1.0):
    """The reply a daemon on `path` gives to ping (a dict), or None when nothing listens there
    (no file, a stale socket). OSError for anything else (refused by file mode, no reply)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(timeout)
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        s.sendall(b'{"id":"ping","op":"ping"}\n')
        data = b""
        while not data.endswith(b"\n") and len(data) < 1 << 16:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    try:
        reply = json.loads(data)
    except ValueError:
        raise OSError(f"not a daemon's reply: {data[:60]!r}") from None
    if not isinstance(reply, dict):
        raise OSError("not a daemon's reply")
    return reply


def daemon_status(path=None):
    """{"socket", "running", "pid", "detail"}: whether a daemon answers ping on the socket
    (one connect and one line; at most a second when something there does not answer)."""
    path = path or daemon_socket()
    try:
        reply = daemon_ping(path)
    except OSError as exc:
        return {"socket": path, "running": False, "pid": None,
                "detail": f"no answer ({exc.strerror or exc})"}
    if reply is None:
        detail = "a stale socket file, nobody listening" if os.path.lexists(path) else "no socket"
        return {"socket": path, "running": False, "pid": None, "detail": detail}
    if not reply.get("ok"):
        return {"socket": path, "running": True, "pid": None,
                "detail": f"refused: {reply.get('error')}"}
    return {"socket": path, "running": True, "pid": reply.get("pid"),
            "detail": f"version {reply.get('version')}"}


def fuse_containment(available):
    """Whether a fuse command can reach OVERLORD_HOME on this host, said plainly."""
    if not available:
        return None
    level, why = fuse.containment()
    return level == fuse.HIDDEN, fuse.describe(level, why)


def coarse_sessions():
    """Open sessions where attribution got coarser than one savepoint per command."""
    out = []
    for meta in store.list_metas():
        if meta.get("state") not in store.OPEN_STATES:
            continue
        top = meta["layers"][-1] if meta.get("layers") else {}
        if top.get("coarse"):
            out.append((meta["sid"], f"at the {MAX_SAVEPOINTS}-savepoint limit: "
                        f"{len(top.get('causes', []))} causes share @{len(meta['layers']) - 1}"))
        if meta.get("pinned"):
            out.append((meta["sid"], f"the fuse mount was pinned after {len(meta['pinned'])} "
                        "command(s): later writes may share a savepoint"))
    return out


TUNNELS = "CONNECT tunnels are recorded by host, port and bytes; they cannot be held"


def proxy_status(kernel_ok):
    """(available, in words) of recorded egress (--net proxy) on this host."""
    if not kernel_ok:
        return False, f"needs the kernel backend; the fuse backend refuses --net proxy ({TUNNELS})"
    try:
        from overlord.sandbox import netns, netproxy  # noqa: F401 - present is what is asked
    except ImportError:
        return False, f"this installation has no recording proxy (overlord.sandbox.netns, netproxy); {TUNNELS}"
    return True, (f"an empty network namespace whose only way out is a recording HTTP proxy on "
                  f"127.0.0.1:{netns.PROXY_PORT}: every connection on the session's egress log, "
                  f"--net-allow refuses other hosts, --hold-writes holds plain-HTTP writes; {TUNNELS}")


def containment_layers(kernel_ok, tools):
    """What each grant will mean on this host."""
    kind, why = limits.cgroup_kind()
    unenforced = limits.not_enforced({}, kind)
    try:
        harden.prepare()
        seccomp_row = (True, f"filter for {libc.machine()}: mount, unshare, bpf, ptrace, ... refused")
    except OSError as exc:
        seccomp_row = (False, exc.strerror)
    ebpf_ok, ebpf_why = trace_ebpf.available()
    return {
        "jail": (kernel_ok, "pivot_root jail on the kernel backend" if kernel_ok
                 else "needs the kernel backend; the fuse backend refuses --jail"),
        "net none": (kernel_ok, "a private, empty network namespace" if kernel_ok
                     else "needs the kernel backend; the fuse backend refuses --net none"),
        "net proxy": proxy_status(kernel_ok),
        "hardening": seccomp_row,
        "rlimits": (True, "processes, file size, open files" +
                    ("" if kind else ", data segment (memory)") + " in every command"),
        "cgroup": (kind is not None, f"cgroup {kind}: memory, pids, cpu around each session"
                   if kind else f"none ({why}); not enforced: {', '.join(unenforced)}"),
        "disk watch": (True, "each command's layer measured while it runs (exit 122 past the grant)"),
        "savepoints": (True, f"one per writing command up to {MAX_SAVEPOINTS} (the kernel's overlay "
                       "stack); past it the top savepoint absorbs commands and records each cause; on the "
                       "fuse backend a process that pins the mount may make one coarser, recorded on it"),
        "trace strace": (bool(tools.get("strace")), tools.get("strace") or "strace is not installed"),
        "trace ebpf": (ebpf_ok, ebpf_why),
    }
