"""Grants (manifest and flags) and targets: what a session may do, and where."""
import json
import os
import stat

from overlord.errors import OverlordError, UsageError
from overlord.sandbox import jail, limits, netallow
from overlord.text import escape_path
from overlord.txn import store

GRANT_KEYS = {"jail": bool, "net": str, "timeout": (int, float), "merge_base": bool, "limits": dict,
              "net_allow": list, "hold_writes": bool, "net_cap": list}
NET_VALUES = ("host", "none", "proxy")
MAX_TIMEOUT = 10 ** 9     # seconds: past this a "timeout" is none (and NaN, inf, 10**400 break the clock)


# -- grants -----------------------------------------------------------------------------------

def load_manifest(path):
    """Grants from a JSON manifest; unknown keys and broken JSON are refused."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"manifest not found: {path}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"manifest {path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read manifest {path}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise UsageError(f"manifest {path} must be a JSON object")
    unknown = sorted(set(data) - set(GRANT_KEYS))
    if unknown:
        raise UsageError(f"manifest {path}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(GRANT_KEYS)})")
    return validate_grants(data, f"manifest {path}")


def validate_grants(grants, where="grants"):
    out = {}
    for key, value in grants.items():
        if value is None:
            continue
        kind = GRANT_KEYS[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise UsageError(f"{where}: {key} has the wrong type ({type(value).__name__})")
        if key == "net" and value not in NET_VALUES:
            raise UsageError(f"{where}: net must be one of {', '.join(NET_VALUES)}")
        if key == "timeout" and not 0 < value <= MAX_TIMEOUT:     # NaN fails every comparison
            raise UsageError(f"{where}: timeout must be a positive number of seconds "
                             f"(at most {MAX_TIMEOUT})")
        if key == "limits":
            value = limits.validate(value, f"{where}: limits")
        if key in ("net_allow", "net_cap"):
            try:
                value = netallow.parse(value, f"{where}: {key}")
            except ValueError as exc:
                raise UsageError(f"{where}: {exc}" if not str(exc).startswith(where) else str(exc)) from None
        out[key] = value
    return out


def parse_net_allow(values, where="--net-allow"):
    """Allowlist entries a face was given, each checked and normalised, de-duplicated in
    order; UsageError naming `where` and what is wrong (netallow's words)."""
    try:
        return netallow.parse(list(values or ()) if isinstance(values, (list, tuple)) else values,
                              where)
    except ValueError as exc:
        text = str(exc)
        raise UsageError(text if text.startswith(where) else f"{where}: {text}") from None


def merge_grants(manifest, flags, limit_flags=()):
    """Flags override the manifest (each --limit key over the manifest's value for it)."""
    grants = dict(manifest or {})
    grants.update(validate_grants(flags, "flags"))
    if limit_flags:
        grants["limits"] = limits.parse(limit_flags, grants.get("limits"))
    return grants


# -- targets ----------------------------------------------------------------------------------

def resolve_target(target):
    if target is None:
        target = os.getcwd()
    if not os.path.exists(target):
        raise UsageError(f"target does not exist: {target}")
    real = os.path.realpath(target)
    if not os.path.isdir(real):
        raise UsageError(f"target is not a directory: {target}")
    if real == "/":
        raise UsageError("the filesystem root cannot be a target")
    home = os.path.realpath(store.home())
    if _inside(home, real) or _inside(real, home):
        raise UsageError(f"target {real} and OVERLORD_HOME {home} overlap; choose a target "
                         "that neither contains nor lies inside OVERLORD_HOME")
    return real


def target_id(target):
    """What identifies the target directory itself: [device, inode]."""
    st = os.lstat(target)
    return [st.st_dev, st.st_ino]


def require_target(target, ident=None):
    """A session's target must still be the directory it was opened on before anything reads
    or writes the real tree through it (diff, log, exec, commit); once it is gone -- or
    another directory stands at its path (a re-clone, a rename) -- the session can only be
    rolled back. ident: target_id() when the session opened."""
    shown = escape_path(target)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        raise OverlordError(f"the target {shown} no longer exists") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OverlordError(f"the target {shown} is no longer a directory")
    if ident and [st.st_dev, st.st_ino] != list(ident):
        raise OverlordError(f"the target {shown} is another directory than the one the session "
                            "opened on (replaced since); roll the session back")


def crossed_grant(meta):
    """(grant, granted value) a session's command crossed and was ended for, e.g.
    ("disk_mb", 5); None when it crossed none."""
    name = meta.get("limit")
    if not name:
        return None
    return name, limits.effective((meta.get("grants") or {}).get("limits")).get(name)


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_net_grants(grants):
    """--net-allow and --hold-writes only mean something to the recording proxy."""
    if grants.get("net") != "proxy":
        for key, flag in (("net_allow", "--net-allow"), ("hold_writes", "--hold-writes")):
            if grants.get(key):
                raise UsageError(f"{flag} needs --net proxy (this session's network is "
                                 f"{grants.get('net', 'host')})")


def _check_backend_grants(backend, grants, target):
    """A backend that cannot honour a containment grant refuses it; it never pretends."""
    check_net_grants(grants)
    if backend.NAME != "kernel":
        if grants.get("jail"):
            raise OverlordError(f"--jail needs the kernel backend; the {backend.NAME} backend is "
                                "cooperative and refuses rather than running unjailed")
        if grants.get("net") in ("none", "proxy"):
            raise OverlordError(f"--net {grants['net']} needs the kernel backend; the "
                                f"{backend.NAME} backend refuses rather than running with the "
                                "network")
    if grants.get("jail"):
        jail.plan(target, grants.get("net", "host"))      # refuses a target it cannot jail
    from overlord.txn import gitdir
    gitdir.refuse_unjailed(target, grants)     # git would write a git dir outside the target
