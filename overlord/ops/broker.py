"""The broker: what a harness may do, through the daemon, the MCP server or a hook.

A person at the terminal is trusted with the folders they name; a harness is not. Every
request a harness makes goes through one facade, Broker, so no face can forget a check:

- a session is opened only on a folder an entry of policy `targets` covers (the `default`
  rule alone admits nothing; no policy file, nothing): deny by default, naming the file and
  the key to add;
- unasked grants are jailed and offline (the agent's own defaults); a request looser than the
  rule is refused naming it; timeout is a cap and limits are ceilings (policy.cap); a harness
  may ask for the recording proxy (net "proxy", with net_allow and hold_writes) where the rule
  allows it -- never given unasked -- and net_allow / hold_writes without it are refused as
  bad input (grants.check_net_grants), before anything opens;
- every act on an existing session re-checks that a rule covers its folder and that today's
  policy still gives the grants it runs under (policy.hold); a session a person opened (it
  has no `broker` record) is a harness's to look at, never to change;
- commit keeps policy's allow_force and require_review (ops.clearance), and never takes the
  flags only a person at the terminal may pass (allow_privileged).

Refusals are errors.Denied (403). The session records who asked: meta["broker"] = {"face",
"client"}, also on its session.open audit line.
"""
import dataclasses
import os
import shlex
import time

from overlord.agent import tools as agent_tools
from overlord.errors import Denied, OverlordError, UsageError
from overlord.ops import countersign, decide, execute, history
from overlord.ops.check import check as _check
from overlord.ops.revert import revert as _revert
from overlord.ops.review import blame as _blame, diff as _diff, get_session, log as _log
from overlord.ops.doctor import sessions as _sessions
from overlord.ops.grants import (GRANT_KEYS, MAX_TIMEOUT, check_net_grants, resolve_target,
                                 validate_grants)
from overlord.text import escape_path
from overlord.trust import audit, policy
from overlord.txn import locks, store

FACES = ("daemon", "mcp", "hook")
CLIENT_MAX = 200                      # characters of a peer's self-given name that are kept
BROKERED = {"jail": True, "net": "none"}   # what a harness gets unasked
TOOLS = ("read_file", "write_file", "edit_file", "list_dir", "search")
TOOL_SPECS = [s for s in agent_tools.SPECS if s["name"] in TOOLS]
ToolOutcome = agent_tools.Outcome


@dataclasses.dataclass(frozen=True)
class Caller:
    face: str                  # "daemon", "mcp" or "hook"
    client: str = None         # the peer's own name for itself (MCP clientInfo.name): untrusted

    def __post_init__(self):
        if self.face not in FACES:
            raise ValueError(f"unknown face {self.face!r}")
        if self.client is not None:
            if not isinstance(self.client, str):
                raise UsageError("client must be a string")
            object.__setattr__(self, "client", self.client[:CLIENT_MAX])

    def record(self):
        return {"face": self.face, "client": self.client}


def covered(rule):
    """Whether an entry of policy `targets` covers the rule's folder."""
    return any(name.startswith("targets[") for name in rule.chain)


class Broker:
    """The operations a harness may call, each held to policy (see the module's doc)."""

    def __init__(self, caller):
        self.caller = caller

    # -- checks --------------------------------------------------------------------------------

    def _rule(self, target):
        try:
            rule = policy.rule(target)
        except OverlordError as exc:
            raise Denied(f"{exc}; brokered sessions are denied until it is fixed") from None
        if not covered(rule):
            raise Denied(
                f"policy {escape_path(policy.policy_path())} has no target covering "
                f"{escape_path(target)}: brokered sessions are denied by default; add "
                f'"targets": {{"{escape_path(target)}": {{...}}}} to it '
                "(docs/POLICY.md; `overlord policy set FILE` installs it)")
        return rule

    def _admit(self, target, grants, defaults=BROKERED):
        """(target, grants, rule) for a new session, or Denied."""
        target = resolve_target(target)
        self._rule(target)
        grants = _grants(grants)
        try:
            held, rule = policy.cap(target, grants, defaults)
        except OverlordError as exc:
            raise Denied(str(exc)) from None
        check_net_grants(held)        # the proxy's keys with another network: bad input (400)
        return target, held, rule

    def _session(self, sid, runs=False, timeout=None, changes=False):
        """The session sid, once policy covers its folder -- for an act that changes it
        (changes, or runs), once a harness opened it: a person's own session is theirs to
        change, a harness may only look at it -- and, for an act that runs something under its
        grants (runs; timeout: that command's own), once today's policy still gives them. (A
        harness never opens a traced session, so a person's `--trace strace`, which lets the
        session's commands ptrace, is out of its reach with the rest of their session.)"""
        session = get_session(_sid(sid))
        self._rule(session.target)
        if (changes or runs) and not session.meta.get("broker"):
            raise Denied(f"session {session.sid} was opened by a person, not through a harness "
                         "(daemon, MCP server, hook): a brokered caller may look at it, not "
                         "change it")
        if runs and session.meta["state"] in store.OPEN_STATES:
            self._hold(session, timeout)
        return session

    def _hold(self, session, timeout=None):
        try:
            policy.hold(session.target, session.meta["grants"], timeout, session.sid)
        except OverlordError as exc:
            raise Denied(str(exc)) from None

    def _cause(self, argv, call):
        if call is None:
            return {"kind": "command", "command": shlex.join(argv), "via": self.caller.face}
        name, call_id = _call(call)
        shown = argv[2] if len(argv) == 3 and argv[1] == "-c" else shlex.join(argv)
        return {"kind": self.caller.face, "tool": str(name), "call": str(call_id),
                "client": self.caller.client, "summary": f"{name}({_oneline(shown)})"}

    # -- opening and running -------------------------------------------------------------------

    def open(self, target=None, grants=None, stack=False, wait=False, backend=None):
        """A pending session on target, no command of the caller's run in it."""
        target, held, _ = self._admit(target, grants)
        return execute.run(["true"], target=target, backend=_backend(backend), grants=held,
                           stack=_flag(stack, "stack"), wait=_flag(wait, "wait"),
                           cause={"kind": "open", "via": self.caller.face},
                           close_if_unchanged=False, broker=self.caller.record())

    def run(self, target, argv, grants=None, stdin=None, on_output=None, cancel=None,
            stack=False, wait=False, backend=None):
        """open + one command, its output streamed to on_output (see exec)."""
        argv = _argv(argv)
        target, held, _ = self._admit(target, grants)
        res, _, _, _ = execute.captured(
            lambda stdio: execute.run(argv, target=target, backend=_backend(backend), grants=held,
                                      stack=_flag(stack, "stack"), wait=_flag(wait, "wait"),
                                      cause=self._cause(argv, None), stdio=stdio, cancel=cancel,
                                      broker=self.caller.record()),
            _stdin(stdin), 0, on_output)
        return res

    def exec(self, sid, argv, stdin=None, timeout=None, on_output=None, cancel=None, call=None,
             wait=True):
        """One command in a pending session: its own savepoint; output to on_output(stream,
        bytes) as it arrives; cancel (a threading.Event) kills it, the session stays pending."""
        return self._capture(sid, argv, stdin, timeout, call, 0, cancel, on_output, wait)

    def capture(self, sid, argv, stdin=None, timeout=None, call=None, cap=32 << 10, cancel=None):
        """exec with the output kept (head and tail, cap bytes per stream): ops.Captured."""
        return self._capture(sid, argv, stdin, timeout, call, cap, cancel, None, True)

    def _capture(self, sid, argv, stdin, timeout, call, cap, cancel, on_output, wait):
        argv, timeout, cap = _argv(argv), _timeout(timeout), _cap(cap)
        cause = self._cause(argv, call)
        session = self._session(sid, runs=True, timeout=timeout)
        return execute.exec_capture(session.sid, argv, input=_stdin(stdin), cause=cause,
                                    timeout=timeout, wait=_flag(wait, "wait"), cap=cap,
                                    cancel=cancel, on_output=on_output)

    def tool(self, sid, name, args, call=None, cancel=None):
        """One of the built-in agent's file tools, in the session's sandbox: ToolOutcome."""
        if name not in TOOLS:
            raise UsageError(f"unknown tool {name!r} (tools: {', '.join(TOOLS)})")
        if not isinstance(args, dict):
            raise UsageError(f"{name}: the arguments must be an object")
        why = agent_tools.check_input(name, args)
        if why:
            raise UsageError(why)
        call_id = _call(call)[1] if call is not None else None
        session = self._session(sid, runs=True)
        cause = {"kind": self.caller.face, "tool": name, "call": None if call_id is None else str(call_id),
                 "client": self.caller.client, "summary": agent_tools.summary(name, args)}

        def run_one(argv, data, cause, timeout, cap):
            return execute.exec_capture(session.sid, argv, input=data, cause=cause,
                                        timeout=timeout, cap=cap, wait=True, cancel=cancel)
        box = agent_tools.Toolbox(run_one, session.target,
                                  os.path.relpath(session.target, execute.command_cwd(session.target)),
                                  timeout=session.meta["grants"].get("timeout"))
        return box.call(name, args, cause)

    # -- looking -------------------------------------------------------------------------------

    # Reading a session is an act on it too: only where a rule covers its folder.

    def diff(self, sid):
        return _diff(self._session(sid).sid)

    def log(self, sid):
        return _log(self._session(sid).sid)

    def savepoints(self, sid):
        return history.savepoints(self._session(sid).sid)

    def compare(self, a, b):
        return history.compare(self._session(a).sid, self._session(b).sid)

    def blame(self, path):
        if not isinstance(path, str) or "\0" in path:
            raise UsageError("path must be a string")
        self._rule(os.path.realpath(path))
        return _blame(path)

    def check(self, sid, only=(), drop=()):
        return _check(self._session(sid).sid, _sels(only), _sels(drop))

    def sessions(self):
        """The sessions on folders a rule covers (another folder's are none of a harness's
        business: their commands, their targets)."""
        try:
            pol = policy.load()
        except OverlordError as exc:
            raise Denied(f"{exc}; brokered sessions are denied until it is fixed") from None
        return [m for m in _sessions() if covered(pol.rule(m["target"]))]

    def audit_head(self):
        head = audit.head()
        return {"seq": head["seq"], "mac": head["hash"]}

    # -- changing a session ----------------------------------------------------------------------

    def rewind(self, sid, to):
        return history.rewind(self._session(sid, changes=True).sid, _int(to, "to"))

    def fork(self, sid, at):
        new = history.fork(self._session(sid, runs=True).sid, _int(at, "at"))
        forked = get_session(new)              # it copied the original's record of who asked
        forked.meta["broker"] = self.caller.record()
        forked.save()
        return new

    def rollback(self, sid):
        return decide.rollback(self._session(sid, changes=True).sid)

    def revert(self, sid, stack=False, backend=None, grants=None):
        """ops.revert, its new session opened as open() opens one: the broker's unasked
        grants (or `grants`) held to the rule, and who asked."""
        session = self._session(sid)
        _, held, rule = self._admit(session.target, grants)
        return _revert(session.sid, stack=_flag(stack, "stack"), backend=_backend(backend),
                       grants=held, policy_origin=rule.origin(), broker=self.caller.record())

    def commit(self, sid, force=False, merge=False, only=(), drop=(), countersigned=False):
        """ops.commit, held to policy: allow_force and require_review apply as for anyone."""
        session = self._session(sid, changes=True)
        return decide.commit(session.sid, force=_flag(force, "force"), merge=_flag(merge, "merge"),
                             only=_sels(only), drop=_sels(drop),
                             countersigned=_flag(countersigned, "countersigned"))

    def review(self, sid, **kw):
        """ops.review -- with a reviewer the caller cannot script: its verdict countersigns
        commits (require_review), so `script` or a `base_url` the caller serves would make
        the harness its own second model."""
        for key in ("script", "base_url"):
            if kw.get(key) is not None:
                raise Denied(f"{key} chooses where the reviewer's verdict comes from, and that "
                             "verdict countersigns commits: the reviewer is a person's choice "
                             "(`overlord review`), not a brokered caller's")
        return countersign.review(self._session(sid, changes=True).sid, **kw)

    def request_review(self, sid):
        """Mark the session as waiting for a person; the audit act session.needs_review."""
        session = self._session(sid, changes=True)
        with locks.TargetLock(session.target, wait=True):    # after any command running in it
            session = get_session(session.sid)
            if session.meta["state"] not in store.OPEN_STATES:
                raise OverlordError(f"session {session.sid} is {session.meta['state']}: "
                                    "there is nothing to review")
            asked = dict(self.caller.record(), ts=time.time())
            session.meta["needs_review"] = asked
            session.save()
            audit.append("session.needs_review", sid=session.sid, target=session.target,
                         face=asked["face"], client=asked["client"])
        return {"sid": session.sid, "needs_review": asked}

    # -- the agent -----------------------------------------------------------------------------

    def agent(self, task, target=None, **kw):
        _agent = _agent_ops()
        _no_person_flags(kw)
        _no_key_elsewhere(kw)
        target, _, _ = self._admit(target, _agent.net_grants(
            {k: kw.get(k) for k in ("jail", "net", "timeout", "limits")},
            kw.get("net_allow"), kw.get("hold_writes")), _agent.UNASKED)
        return _agent.agent(task, target, broker=self.caller.record(), **kw)

    def resume(self, sid, note=None, **kw):
        _agent = _agent_ops()
        _no_person_flags(kw)
        session = self._session(sid, runs=True)
        if session.meta.get("broker"):     # a harness chose this endpoint: a key stored since stays home
            ep = (session.meta.get("agent") or {}).get("endpoint") or {}
            _no_key_elsewhere({"provider": ep.get("provider"), "base_url": ep.get("base_url")})
        return _agent.resume(session.sid, note, **kw)

    def models(self, **kw):
        _no_key_elsewhere(kw)
        return _agent_ops().models(**kw)


def _agent_ops():
    """The module overlord.ops.agent, imported on first use (`ops.agent` is the operation)."""
    import importlib
    return importlib.import_module("overlord.ops.agent")


# -- argument checks: a harness's arguments arrive as JSON, whatever their types --------------

def _grants(grants):
    if grants is None:
        return {}
    if not isinstance(grants, dict):
        raise UsageError("grants must be an object")
    unknown = sorted(set(grants) - set(GRANT_KEYS))
    if unknown:
        raise UsageError(f"grants: unknown key {unknown[0]!r} (known: {', '.join(sorted(GRANT_KEYS))})")
    return validate_grants(grants, "grants")


def _sid(sid):
    if not isinstance(sid, str):
        raise UsageError("session must be a session id string")
    return store.check_sid(sid)


def _argv(argv):
    if (not isinstance(argv, list) or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise UsageError("argv must be a non-empty list of strings without NUL bytes")
    return argv


def _stdin(data):
    if data is None:
        return b""
    if isinstance(data, str):
        return data.encode("utf-8", "surrogateescape")
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    raise UsageError("stdin must be a string")


def _timeout(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT:
        raise UsageError(f"timeout must be a positive number of seconds (at most {MAX_TIMEOUT})")
    return value


def _call(call):
    """(tool name, call id) of a harness's tool call: two strings (an id may be a number)."""
    if (isinstance(call, (list, tuple)) and len(call) == 2 and isinstance(call[0], str)
            and call[0] and isinstance(call[1], (str, int)) and not isinstance(call[1], bool)):
        return call[0], str(call[1])
    raise UsageError("call must be [tool name, call id]")


CAP_MAX = 64 << 20


def _cap(value):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= CAP_MAX:
        raise UsageError(f"cap must be a whole number of bytes from 0 to {CAP_MAX}")
    return value


def _int(value, name):
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be a savepoint number")
    return value


def _flag(value, name):
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be true or false")
    return value


def _sels(value):
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UsageError("only/drop must be lists of selectors")


def _backend(value):
    if value is not None and value not in ("kernel", "fuse"):
        raise UsageError("backend must be kernel or fuse")
    return value


def _no_key_elsewhere(kw):
    """A provider's stored key goes only to the provider's own endpoint: a brokered caller's
    base_url would have the daemon send the person's key to wherever the caller names."""
    url = kw.get("base_url")
    if url is None:
        return
    from overlord.agent import keys, providers
    provider = kw.get("provider") or os.environ.get("OVERLORD_PROVIDER") or "anthropic"
    if provider == "scripted" or provider not in keys.ENV:
        return
    # listing: where a key would come from, without running a vault resolver to find out
    if keys.listing()[provider] and url != providers.default_base_url(provider):
        raise Denied(f"base_url: a brokered caller may not send the stored {provider} key to "
                     "an endpoint of its choosing; a person sets the endpoint at the terminal")


def _no_person_flags(kw):
    for key in ("trace", "pty_slave", "on_child", "allow_privileged", "approver"):
        if kw.get(key) is not None:
            raise Denied(f"{key} is for a person at the terminal, not a brokered caller")


def _oneline(text, n=60):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."
