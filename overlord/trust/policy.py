"""Policy: OVERLORD_HOME/policy.json, what a folder's sessions may be granted and what a commit
to it must satisfy. Re-read on every use (a change is seen at once).

    {"default": RULE, "targets": {"/abs/path": RULE, ...}}

The effective rule for a folder is resolved key by key: the longest target whose path contains
the folder (on path components: /srv/app never covers /srv/apple) gives the keys it sets, each
shorter containing target the keys the longer ones left out, then `default`, then the built-in
value. Object-valued keys (limits, checks) resolve the same way per inner key. `Rule.source(key)`
says where each value came from: "built-in", "default" or "targets[/srv/app]".

A file that cannot be read or parsed, or holds an unknown key, a value of the wrong type or a
relative target path, raises OverlordError("policy PATH: what") naming the key: every operation
it governs refuses rather than running as if there were no policy. A missing file is the empty
policy (built-in values only). Each new content digest the service layer sees is an audit act
(policy.change); OVERLORD_HOME/policy.seen keeps the digest last recorded.
"""
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import stat

from overlord.errors import OverlordError, UsageError
from overlord.sandbox import limits as grant_limits
from overlord.sandbox import netallow
from overlord.text import escape_path
from overlord.trust import audit, checks, protect
from overlord.txn import store

FILE, SEEN = store.POLICY_FILE, "policy.seen"
NETS = ("none", "proxy", "host")          # tightest first: proxy is recorded egress
SEVERITIES = checks.LEVELS                # the content gate's: one table of checks
CHECK_DEFAULTS = checks.DEFAULTS
BUILT_IN, DEFAULT = "built-in", "default"


class Bad(Exception):
    """A value that does not fit its key: the message says what it must be, following the
    key's name (" must be ...", ".secrets must be ...", ": unknown check ...")."""


# -- the key table: one line per key ----------------------------------------------------

def _bool(value):
    if not isinstance(value, bool):
        raise Bad(f" must be true or false, not {_shown(value)}")
    return value


def _net(value):
    if value not in NETS:
        raise Bad(f" must be one of {', '.join(map(json.dumps, NETS))}, not {_shown(value)}")
    return value


def _allowlist(value):
    """A cap on a proxy session's allowlist: netallow entries, at least one (an empty list
    would read as "no allowlist", i.e. every public host)."""
    if not isinstance(value, list):
        raise Bad(f" must be a list of host names (pypi.org, *.pypi.org, 10.0.0.5), "
                  f"not {_shown(value)}")
    if not value:
        raise Bad(" must name at least one host (leave the key out for no cap)")
    try:
        return netallow.parse(value)
    except ValueError as exc:
        raise Bad(f": {escape_path(str(exc))}") from None


def _seconds(value):
    if not _number(value) or value <= 0:
        raise Bad(f" must be a number of seconds > 0, not {_shown(value)}")
    return value


def _limits(value):
    if not isinstance(value, dict):
        raise Bad(f" must be an object of limit: whole number, not {_shown(value)}")
    for name in value:
        try:
            grant_limits.validate({name: value[name]}, "limits")
        except UsageError as exc:
            what = str(exc).split(": ", 1)[-1]
            raise Bad(f": {what}" if name not in grant_limits.DEFAULTS else
                      f".{name} {what.split(' ', 1)[-1]}") from None
    return dict(value)


def _globs(value):
    if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
        raise Bad(f" must be a list of glob strings, not {_shown(value)}")
    if any(g.startswith("/") for g in value):
        raise Bad(" must hold globs relative to the target (no leading /)")
    for glob in value:
        try:
            protect.check_glob(glob)
        except ValueError as exc:
            raise Bad(f": {exc}") from None
    return list(value)


def _checks(value):
    if not isinstance(value, dict):
        raise Bad(f" must be an object ({', '.join(CHECK_DEFAULTS)}), not {_shown(value)}")
    for name, v in value.items():
        if name not in CHECK_DEFAULTS:
            raise Bad(f": unknown check {_shown(name)} (known: {', '.join(CHECK_DEFAULTS)})")
        if name == "size_mb":
            if not _number(v) or v <= 0:
                raise Bad(f".size_mb must be a number of MiB > 0, not {_shown(v)}")
        elif v not in SEVERITIES:
            raise Bad(f".{name} must be one of {', '.join(SEVERITIES)}, not {_shown(v)}")
    return dict(value)


def _names(what):
    """A checker for a list of names, or "*" (every one there is)."""
    def check(value):
        if value == "*":
            return value
        if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
            raise Bad(f' must be "*" or a list of {what} names, not {_shown(value)}')
        return list(value)
    return check


_servers = _names("connector")

BUDGET_LINES = ("session_tokens", "session_usd", "day_usd", "month_usd")   # trust/cost.LINES


def _budget(value):
    """Budget lines (trust/cost.py): session_tokens a whole number >= 0, the *_usd a finite
    number of USD >= 0."""
    if not isinstance(value, dict):
        raise Bad(f" must be an object of {', '.join(BUDGET_LINES)}, not {_shown(value)}")
    for name, v in value.items():
        if name not in BUDGET_LINES:
            raise Bad(f": unknown budget line {_shown(name)} (known: {', '.join(BUDGET_LINES)})")
        if name == "session_tokens":
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise Bad(f".{name} must be a whole number of tokens >= 0, not {_shown(v)}")
        elif not _number(v) or v < 0:
            raise Bad(f".{name} must be a finite number of USD >= 0, not {_shown(v)}")
    return dict(value)


@dataclasses.dataclass(frozen=True)
class Key:
    check: object              # value -> the value kept; raises Bad
    default: object            # the built-in value
    merged: bool = False       # an object resolved per inner key


KEYS = {
    "jail": Key(_bool, None),                   # true forces the jail
    "net": Key(_net, None),                     # the loosest network allowed
    "net_allow": Key(_allowlist, None),         # caps a proxy session's allowlist (None: no cap)
    "timeout": Key(_seconds, None),             # a cap on a command's seconds
    "limits": Key(_limits, {}, merged=True),    # ceilings on the resource grants
    "allow_force": Key(_bool, True),            # commit --force allowed
    "require_review": Key(_bool, False),        # every commit needs a fresh complete approval
    "protect": Key(_globs, []),                 # paths whose change needs an approval
    "checks": Key(_checks, CHECK_DEFAULTS, merged=True),   # content-gate severities
    "connectors": Key(_servers, None),          # the connectors a session may be granted (None: any)
    "connector_shell": Key(_bool, False),       # shell-shaped connector tools may be granted
    "distrust_hints": Key(_servers, []),        # servers whose readOnlyHint is not believed
    "skills": Key(_names("skill"), "*"),        # the machine skills a session is offered
    "budget": Key(_budget, {}, merged=True),    # spending lines (trust/cost.py); {} when none
}


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:                  # json.loads takes NaN and Infinity: NaN > cap is False, so no cap at all
        return math.isfinite(value)
    except OverflowError:                   # an int no float holds
        return False


def _shown(value):
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return escape_path(text if len(text) <= 40 else text[:37] + "...")


# -- the effective rule ------------------------------------------------------------------------

class Rule:
    """Effective values for one folder; rule[key], rule.get(key), rule.source(key)."""

    def __init__(self, target, values, sources, chain, sha256, path):
        self.target, self.values, self.sources = target, values, sources
        self.chain, self.sha256, self.path = chain, sha256, path   # chain: rule names, most specific first

    def __getitem__(self, key):
        return self.values[key]

    def get(self, key, default=None):
        return self.values.get(key, default)

    def source(self, key):
        """Where key's value came from. For limits/checks, "checks.secrets" names one inner
        key; "checks" the most specific rule that set any of them."""
        name, _, inner = key.partition(".")
        if name not in KEYS:
            raise KeyError(key)
        got = self.sources[name]
        if not isinstance(got, dict):
            return got
        if inner:
            return got.get(inner, BUILT_IN)
        return next((r for r in self.chain if r in got.values()), BUILT_IN)

    def origin(self):
        """What a session or an audit act records about the rule it was held to."""
        return {"source": self.chain[0] if self.chain else BUILT_IN, "sha256": self.sha256}

    def as_dict(self):
        return {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                for k, v in self.values.items()}


@dataclasses.dataclass
class Policy:
    path: str
    sha256: str = None          # of the file's bytes; None when there is no file
    default: dict = dataclasses.field(default_factory=dict)
    targets: dict = dataclasses.field(default_factory=dict)    # normalized path -> RULE

    def rule(self, target):
        target = os.path.realpath(target)
        chain = [(name, rule) for name, rule in self._covering(target)]
        if self.default:
            chain.append((DEFAULT, self.default))
        values, sources = {}, {}
        for key, spec in KEYS.items():
            if spec.merged:
                merged, where = dict(spec.default), {k: BUILT_IN for k in spec.default}
                for name, rule in reversed(chain):
                    for inner, v in (rule.get(key) or {}).items():
                        merged[inner], where[inner] = v, name
                values[key], sources[key] = merged, where
                continue
            found = next(((name, rule[key]) for name, rule in chain if key in rule), None)
            sources[key], values[key] = found or (BUILT_IN, _copy(spec.default))
        return Rule(target, values, sources, [n for n, _ in chain], self.sha256, self.path)

    def _covering(self, target):
        """(name, RULE) of every target that contains `target`, the longest first. A target's
        path is matched as written and as it resolves (a symlinked /srv still covers)."""
        found = []
        for path, rule in self.targets.items():
            depths = [_depth(c) for c in {path, os.path.realpath(path)} if _contains(c, target)]
            if depths:
                found.append((max(depths), path, rule))
        found.sort(key=lambda f: (-f[0], f[1]))
        return [(f"targets[{path}]", rule) for _, path, rule in found]


def _copy(value):
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _contains(root, path):
    return root == "/" or path == root or path.startswith(root + "/")


def _depth(path):
    return 0 if path == "/" else path.count("/")


# -- reading and validating --------------------------------------------------------------------

policy_path = store.policy_path


_parsed = {}          # sha256 -> (path, Policy): the file is read each time, parsed once


def load(path=None):
    """The policy now in force (path: validate another file instead; nothing is recorded for
    it). Raises OverlordError("policy PATH: what") when it cannot be used."""
    live = path is None
    path = os.path.abspath(path or policy_path())
    data = _read(path, trusted=live or path == policy_path())
    digest = hashlib.sha256(data).hexdigest() if data is not None else None
    if live:
        notice(digest)
    if data is None:
        return Policy(path)
    hit = _parsed.get(digest)
    if hit and hit[0] == path:
        return hit[1]
    pol = parse(data, path, digest)
    _parsed.clear()
    _parsed[digest] = (path, pol)
    return pol


def rule(target):
    """The effective Rule for target (a real, absolute directory path)."""
    return load().rule(target)


def parse(data, path, digest=None):
    """A Policy from the file's bytes; OverlordError naming the first problem."""
    def bad(what):
        return OverlordError(f"policy {escape_path(path)}: {what}")
    try:
        return _parse(data, path, digest, bad)
    except RecursionError:            # [[[[... past the interpreter's stack, anywhere in it
        raise bad("nested too deeply") from None


def _parse(data, path, digest, bad):
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise bad("not UTF-8 text") from None
    except _Duplicate as dup:
        raise bad(f"the key {_shown(dup.args[0])} appears twice") from None
    except ValueError as exc:
        raise bad(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise bad('must be a JSON object: {"default": RULE, "targets": {"/abs/path": RULE}}')
    unknown = sorted(set(doc) - {"default", "targets"})
    if unknown:
        raise bad(f"unknown key {_shown(unknown[0])} (known: default, targets)")
    pol = Policy(path, digest, _rule(doc.get("default", {}), DEFAULT, bad))
    targets = doc.get("targets", {})
    if not isinstance(targets, dict):
        raise bad(f"targets must be an object of \"/abs/path\": RULE, not {_shown(targets)}")
    written = {}
    for raw, body in targets.items():
        if not raw.startswith("/"):
            raise bad(f"targets: {_shown(raw)} is not an absolute path")
        norm = os.path.normpath(raw)
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        if norm in written:
            raise bad(f"targets: {_shown(written[norm])} and {_shown(raw)} name the same folder")
        written[norm] = raw
        pol.targets[norm] = _rule(body, f"targets[{escape_path(raw)}]", bad)
    return pol


def _rule(body, name, bad):
    if not isinstance(body, dict):
        raise bad(f"{name} must be an object of rule keys, not {_shown(body)}")
    out = {}
    for key, value in body.items():
        spec = KEYS.get(key)
        if spec is None:
            raise bad(f"{name}: unknown key {_shown(key)} (known: {', '.join(KEYS)})")
        try:
            out[key] = spec.check(value)
        except Bad as exc:
            raise bad(f"{name}.{key}{exc}") from None
    return out


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


MAX_BYTES = 1 << 20         # a policy is a few KiB; a bigger file is refused, never read whole


def _read(path, trusted=True):
    """The file's bytes, or None when there is none. Opened non-blocking and refused unless a
    regular file of at most MAX_BYTES (a FIFO or a device planted there cannot hang a
    command). trusted (the live policy): also never through a symlink, and only when owned by
    the user (or root) and writable by no one else -- a policy someone else can write governs
    nothing. Another file (`policy check FILE`, `policy set FILE`) is the one the user named."""
    if trusted:
        opened = audit.open_owned(path, os.O_RDONLY, _untrusted, 0o022, "write",
                                  fix=f"chmod go-w {escape_path(path)}", root_ok=True)
        if opened is None:
            return None
        fd, st = opened
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _unreadable(path, exc) from None
        st = None
    try:
        st = st or os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OverlordError(f"policy {escape_path(path)}: not a regular file")
        data = b""
        while True:               # to its end, never past MAX_BYTES (the file may be growing)
            if max(st.st_size, len(data)) > MAX_BYTES:
                raise OverlordError(f"policy {escape_path(path)}: is {max(st.st_size, len(data))}"
                                    f" bytes, over the {MAX_BYTES >> 20} MiB a policy may be")
            chunk = os.read(fd, MAX_BYTES + 1 - len(data))
            if not chunk:
                return data
            data += chunk
    except OSError as exc:
        raise _unreadable(path, exc) from None
    finally:
        os.close(fd)


def _untrusted(path, what):
    hint = " (`overlord policy set FILE` installs one of yours)" if "symlink" in what \
        or "owned by" in what else ""
    return OverlordError(f"policy {escape_path(path)}: {what}{hint}")


def _unreadable(path, exc):
    return OverlordError(f"policy {escape_path(path)}: cannot read it: {exc.strerror}")


# -- installing, and the audit act -------------------------------------------------------------

def install(source):
    """Validate the policy file at `source`, then make it the live policy atomically (0600).
    Returns (old sha256, new sha256); the change is on the audit chain before this returns."""
    source = os.path.abspath(source)
    data = _read(source, trusted=False)
    if data is None:
        raise OverlordError(f"policy {escape_path(source)}: no such file")
    parse(data, source)
    store.ensure_home()
    dest = policy_path()
    tmp = f"{dest}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    new = hashlib.sha256(data).hexdigest()
    audit.ready()                 # installed only where the change can be recorded
    try:
        with _seen_lock() as seen:
            old = seen.read()
            try:                      # even a broken live file may be replaced
                live = _read(dest)
                live = hashlib.sha256(live).hexdigest() if live is not None else None
            except OverlordError:     # one no one may trust (a FIFO, a link, writable by
                live = old            # others) governed nothing: not an act of its own
            if live != old:                       # changed behind our back: its own act first
                _record(seen, old, live, via="noticed")
                old = live
            try:
                os.rename(tmp, dest)
            except OSError as exc:
                raise OverlordError(f"policy {escape_path(dest)}: cannot replace it: "
                                    f"{exc.strerror}") from None
            if new != old:
                _record(seen, old, new, via="policy set")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return old, new


def notice(digest):
    """Record a new policy digest on the audit chain (policy.change), once per change, however
    many processes see it first."""
    try:
        with open(os.path.join(store.home(), SEEN), encoding="ascii") as f:
            if (f.read().strip() or None) == digest:
                return                              # the common case: no lock, no write
    except FileNotFoundError:
        if digest is None:
            return
    except (OSError, ValueError):
        pass
    store.ensure_home()
    with _seen_lock() as seen:
        old = seen.read()
        if old != digest:
            _record(seen, old, digest, via="noticed")


def _record(seen, old, new, via):
    audit.append("policy.change", old_sha256=old, new_sha256=new, via=via, file=policy_path())
    seen.write(new)


class _seen_lock:
    """OVERLORD_HOME/policy.seen under flock: the digest last recorded."""

    def __enter__(self):
        self.fd = os.open(os.path.join(store.home(), SEEN),
                          os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def read(self):
        os.lseek(self.fd, 0, os.SEEK_SET)
        text = os.read(self.fd, 200).decode("ascii", "replace").strip()
        return text or None

    def write(self, digest):
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, (digest or "").encode() + b"\n", 0)
        os.fsync(self.fd)

    def __exit__(self, *exc):
        os.close(self.fd)


# -- capping a session's grants ----------------------------------------------------------------

def cap_grants(target, grants, defaults=None):
    """grants held to the policy for target (see cap)."""
    return cap(target, grants, defaults)[0]


def cap(target, grants, defaults=None):
    """(grants, rule): the requested grants held to target's policy. A request looser than
    policy is refused naming the rule; an omitted value takes the tighter of the caller's
    default (`defaults`: what it would grant unasked, e.g. the agent's jail) and the policy's.
    `grants` holds only what was asked for (an absent key is omitted)."""
    pol = rule(target)
    defaults = defaults or {}
    out = dict(grants or {})
    _refuse_looser(pol, out, "this request asked for")

    if pol["jail"]:
        out["jail"] = True
    elif "jail" not in out and "jail" in defaults:
        out["jail"] = defaults["jail"]

    allowed = pol["net"]
    if "net" not in out:
        value = min((v for v in (defaults.get("net"), allowed) if v), key=NETS.index, default=None)
        if value:
            out["net"] = value
    ceiling = pol["net_allow"]
    if ceiling and out.get("net") == "proxy":
        if out.get("net_allow"):
            _refuse_wider(pol, out["net_allow"], "this request asked for")
        else:
            out["net_allow"] = list(ceiling)      # a proxy session under a cap gets the cap
        # recorded with the grants: the proxy holds every connection to the cap too, so a
        # wildcard cap never becomes a non-public address through an entry named below it
        out["net_cap"] = list(ceiling)

    cap_s = pol["timeout"]
    if out.get("timeout") is None:
        unasked = defaults.get("timeout")
        value = min(unasked, cap_s) if unasked and cap_s else unasked or cap_s
        if value:
            out["timeout"] = value

    ceilings = {k: v for k, v in pol["limits"].items() if v}     # a ceiling of 0 caps nothing
    if ceilings:
        asked_limits = dict(out.get("limits") or {})
        unasked = grant_limits.effective(defaults.get("limits"))
        for name, ceiling in ceilings.items():
            if name not in asked_limits:
                asked_limits[name] = min(unasked[name], ceiling) if unasked[name] else ceiling
        out["limits"] = asked_limits
    return out, pol


def hold(target, grants, timeout=None, sid=None):
    """The rule in force now for target, once a session opened with `grants` (its recorded
    ones) may run one more command under it (timeout: this command's own --timeout, which
    then bounds it instead of the session's). A grant looser than today's policy is refused
    naming the rule -- never tightened in passing: a session runs under the grants it was
    opened (and attested) with, or not at all."""
    pol = rule(target)
    if timeout:
        _refuse_looser(pol, {"timeout": timeout}, "this request asked for")
    _refuse_looser(pol, {"jail": bool(grants.get("jail")), "net": grants.get("net", "host"),
                         "net_allow": grants.get("net_allow") or [],
                         "timeout": timeout or grants.get("timeout"),
                         "limits": grant_limits.effective(grants.get("limits"))},
                   f"session {sid} was opened with", unbounded=True,
                   then="; roll it back (or commit it) and open a new one under today's policy")
    return pol


def _refuse_looser(pol, grants, asked, unbounded=False, then=""):
    """OverlordError naming the first grant in `grants` looser than the rule pol, its value
    introduced by `asked`. An absent key is an omitted one -- unless unbounded (a session's
    recorded grants), where no timeout is no bound at all."""
    def refuse(key, rule_words, value):
        raise OverlordError(f"policy {pol.source(key)} {rule_words}; {asked} {value}{then}")

    if pol["jail"] and grants.get("jail") is False:
        refuse("jail", "forces jail: true", "jail: false")
    allowed = pol["net"]
    if allowed and "net" in grants and NETS.index(grants["net"]) > NETS.index(allowed):
        refuse("net", f"allows at most net: {allowed}", f"net: {grants['net']}")
    if pol["net_allow"] and grants.get("net") == "proxy" and (grants.get("net_allow") or unbounded):
        _refuse_wider(pol, grants["net_allow"], asked, then)
    cap_s, asked_s = pol["timeout"], grants.get("timeout")
    if cap_s and asked_s is not None and asked_s > cap_s:
        refuse("timeout", f"caps timeout at {cap_s:g} s", f"timeout: {asked_s:g}")
    if cap_s and asked_s is None and unbounded:
        refuse("timeout", f"caps timeout at {cap_s:g} s", "no timeout")
    limits = grants.get("limits") or {}
    for name, ceiling in sorted(pol["limits"].items()):       # a ceiling of 0 caps nothing
        key, value = f"limits.{name}", limits.get(name)
        if ceiling and value == 0:
            refuse(key, f"caps {key} at {ceiling}", f"{key}: 0 (unlimited)")
        if ceiling and value is not None and value > ceiling:
            refuse(key, f"caps {key} at {ceiling}", f"{key}: {value}")


def _refuse_wider(pol, entries, asked, then=""):
    """OverlordError when a proxy session's allowlist reaches past the policy's net_allow cap
    (an empty list, every public host, reaches past any cap)."""
    ceiling = pol["net_allow"]
    wider = next((e for e in entries if not netallow.within(e, ceiling)), None)
    if entries and wider is None:
        return
    value = f"net_allow: {escape_path(wider)}" if entries else "no net_allow (every public host)"
    raise OverlordError(f"policy {pol.source('net_allow')} caps net_allow at "
                        f"{', '.join(ceiling)}; {asked} {value}{then}")
