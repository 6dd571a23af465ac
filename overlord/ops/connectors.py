"""Connectors in a session: what a run may use, the approval gate, and the audit acts that
bind every call into the record (docs/CONNECTORS.md).

A connector acts outside the jail and outside the transaction: a sent e-mail stays sent, and
Discard cannot unsend it. So, unlike the agent's own tools:

- **Granted by name.** A session holds the connectors it was opened with (`--connector`, the
  workspace's checkboxes), each configured in mcp.json and allowed by the folder's policy rule
  (`connectors`: a list or "*"; a brokered session gets none without a rule that names them).
  Shell-shaped tools are withheld unless the session holds `connector_shell`, which the rule
  must allow (`connector_shell: true`).
- **Actions ask first.** A tool whose annotations say readOnlyHint runs without asking -- the
  server's own claim, recorded as such, and distrusted for the servers policy names in
  `distrust_hints`. Anything else goes through the gate, by mcp.json's approval mode: ask (the
  person decides; a run with no one to ask is denied), auto (allowed), readonly (refused).
- **Bound into the record.** Each call is three acts on the keyed audit chain: connector.call
  (a fingerprint of server, tool and canonical arguments), connector.decision (that
  fingerprint, allow or deny, who decided), connector.result (the result's sha256 and size, or
  the error); connector.approval_requested when a person is asked. An approval answers one
  request, so it authorizes exactly one call.

The transcript carries the same story for the model's side: `connectors` (what was offered and
withheld), `approval_requested`, `approval`, `connector_error`, and a `connector` field on the
call's tool_call and tool_result.
"""
import dataclasses
import hashlib
import importlib
import json
import os

from overlord.agent import tools as builtin
from overlord.agent.cancel import Cancelled
from overlord.errors import OverlordError, UsageError
from overlord.text import escape_text
from overlord.trust import audit, policy


class _Lazy:
    """A module of overlord.agent.connectors, imported on first use (an agent run without
    connectors never loads the MCP client)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(f"overlord.agent.connectors.{self._name}"), attr)


mcp_client, mcp_config, names = _Lazy("client"), _Lazy("config"), _Lazy("names")
CALL_TIMEOUT = 120.0              # seconds a connector call may take before it is cancelled
START_TIMEOUT = 20.0              # seconds a server may take to start and answer the handshake


class StartRefused(OverlordError):
    """The granted connectors cannot be offered together (a tool name collision)."""


@dataclasses.dataclass
class ApprovalRequest:
    """One call waiting at the gate: what the person is asked to allow."""
    sid: str
    turn: int
    call: str                     # the model's call id
    server: str
    tool: str
    offered: str                  # the name the model called
    input: dict
    fingerprint: str
    readonly_claim: bool          # the server's annotation said readOnlyHint (and was distrusted)


@dataclasses.dataclass
class Decision:
    allow: bool
    by: str                       # who decided: "terminal (uid:name)", "workspace",
                                  # "mcp.json approval: auto", ...
    note: str = None


def fingerprint(server, tool, arguments):
    """sha256 of the canonical (server, tool, arguments): what an approval and the audit name."""
    data = json.dumps({"server": server, "tool": tool, "arguments": arguments}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()


# -- grants ------------------------------------------------------------------------------------

def grant(target, asked, shell=False, brokered=False):
    """The connectors a session on target may hold: {"names", "shell"}. Every name must be
    configured (UsageError naming the known ones) and allowed by the folder's policy rule
    (OverlordError naming the rule); shell needs the rule's connector_shell."""
    asked = _names(asked)
    if not asked:
        if shell:
            raise UsageError("--connector-shell needs a connector (--connector NAME)")
        return None
    cfg = mcp_config.load()
    for name in asked:
        cfg.get(name)
    rule = policy.rule(target)
    allowed = rule["connectors"]
    if allowed is None and brokered:
        allowed = []              # a harness gets a connector only where a rule names it
    if allowed != "*" and allowed is not None:
        for name in asked:
            if name not in allowed:
                source = rule.source("connectors")
                where = f"policy {source}" if source != policy.BUILT_IN else \
                    "policy (no rule names connectors for this folder; a brokered session gets none)"
                shown = ", ".join(escape_text(str(a)) for a in allowed) or "none"
                raise OverlordError(f"{where} allows connectors: {shown}; this request asked for "
                                    f"{escape_text(name)}", http_status=403)
    if shell and not rule["connector_shell"]:
        raise OverlordError(f"policy {rule.source('connector_shell')} does not allow "
                            "connector_shell (set \"connector_shell\": true in the folder's rule); "
                            "this request asked for --connector-shell", http_status=403)
    return {"names": asked, "shell": bool(shell)}


def regrant(session):
    """A resumed session's connectors, held to today's config and policy (refused otherwise)."""
    held = session.meta.get("connectors")
    if not held:
        return None
    try:
        return grant(session.target, held["names"], held.get("shell"),
                     brokered=bool(session.meta.get("broker")))
    except OverlordError as exc:
        raise type(exc)(f"session {session.sid} was opened with connectors "
                        f"{', '.join(held['names'])}, which it may not use now: {exc}",
                        http_status=exc.http_status) from None


def _names(asked):
    out = []
    for name in asked or ():
        if not isinstance(name, str) or not name:
            raise UsageError("a connector is named by a string")
        if name not in out:
            out.append(name)
    return out


def connector_list():
    """The configured connectors, nothing secret: for the workspace's checkboxes."""
    cfg = mcp_config.load()
    return [{"name": s.name, "transport": s.transport} for s in cfg.servers.values()]


def external_actions(sid):
    """The session's connector calls as the dossier lists them (dossier.external_calls: from
    the audit chain), for a face's inspector; [] for a session that had no connectors."""
    from overlord.agent import dossier
    from overlord.agent import transcript as T
    from overlord.ops.review import get_session
    session = get_session(sid)
    if not session.meta.get("connectors"):
        return []
    return dossier.external_calls(session, T.read(session.dir) if T.exists(session.dir) else [])


def approval_mode():
    return mcp_config.load().approval


# -- the hands ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Offered:
    server: str
    tool: str
    spec: dict                    # the server's tool dict
    readonly: bool                # the server claims readOnlyHint
    trusted: bool                 # and policy believes it


class Hands:
    """The granted connectors of one run: started before the system prompt is recorded (their
    tools are part of what the model is offered), closed when the run ends."""

    def __init__(self, session, held, record, approver, cancel):
        self.session, self.held, self.record = session, held, record
        self.approver, self.cancel = approver, cancel
        self.servers = {}             # name -> config.Server
        self.clients = {}             # name -> Client (None: not connected)
        self.offered = {}             # offered name -> Offered
        self.info = {}                # what the `connectors` event says of each server
        self.withheld = {}            # offered name -> (server, tool) of a shell-shaped tool held back

    # -- start and stop ------------------------------------------------------------------------

    def start(self):
        """Connect to every granted server and list its tools: (tool specs for the model, the
        `connectors` event's fields). A server that fails to start is an error in that event,
        and its tools are not offered: the run goes on without it."""
        cfg = mcp_config.load()
        distrusted = policy.rule(self.session.target)["distrust_hints"]
        listed, errors = {}, {}
        for name in self.held["names"]:
            self.servers[name] = cfg.get(name)
            try:
                client = self._connect(name)
                listed[name] = client.list_tools(cancel=self.cancel, timeout=_start_timeout())
            except mcp_client.ConnectorError as exc:
                errors[name] = str(exc)
                _close_quietly(self.clients.pop(name, None))    # its process and threads end now
                continue
            self.info[name] = {"transport": self.servers[name].transport, "era": client.era,
                               "version": client.version,
                               "server": (client.server_info or {}).get("name"), "tools": []}
        usable = {}
        for name, tools in listed.items():
            keep = []
            for tool in tools:
                withheld = names.shell_shaped(tool) and not self.held.get("shell")
                readonly = _readonly(tool)
                self.info[name]["tools"].append({"tool": tool.get("name"), "readonly": readonly,
                                                 "withheld": withheld})
                if withheld:
                    self.withheld[names.offered(name, tool.get("name"))] = (name, tool.get("name"))
                else:
                    keep.append(tool)
            usable[name] = keep
        try:
            table = names.table({n: [t["name"] for t in ts] for n, ts in usable.items()},
                                set(builtin.BY_NAME))
        except OverlordError as exc:
            raise StartRefused(f"{exc}; the run does not start (remove one of the connectors, "
                               "or ask its server to rename the tool)") from None
        by_pair = {(n, t["name"]): t for n, ts in usable.items() for t in ts}
        specs = []
        for offered_name, (server, tool) in sorted(table.items()):
            spec = by_pair[(server, tool)]
            ro = _readonly(spec)
            trusted = ro and not (distrusted == "*" or server in (distrusted or []))
            self.offered[offered_name] = Offered(server, tool, spec, ro, trusted)
            specs.append(_model_spec(offered_name, server, spec, trusted))
        offered_as = {pair: o for o, pair in table.items()}
        for name, info in self.info.items():
            for row in info["tools"]:
                row["offered"] = offered_as.get((name, row["tool"]))
        return specs, {"servers": self.info, "errors": errors}

    def _connect(self, name):
        client = mcp_client.open(self.servers[name], log=self._log(name), cancel=self.cancel,
                                 start_timeout=_start_timeout())
        self.clients[name] = client
        return client

    def _log(self, name):
        return self.session.path(f"connector-{name}.log")

    def close(self):
        """End every server; quickly when the run was stopped (the person is waiting)."""
        for client in self.clients.values():
            _close_quietly(client, hurry=self.cancel.is_set())
        self.clients = {}

    # -- calls ---------------------------------------------------------------------------------

    def owns(self, name):
        return name in self.offered

    def describe(self, name, args):
        o = self.offered[name]
        return {"server": o.server, "tool": o.tool, "fingerprint": fingerprint(o.server, o.tool, args)}

    def unknown(self, name):
        """Why a name that is not offered cannot run, when it looks like a connector's; None
        leaves it to the built-in tools' check."""
        if name in self.withheld:
            server, tool = self.withheld[name]
            return (f"{name} is withheld: {server}'s tool {tool!r} looks like a shell, and this "
                    "session does not hold the connector_shell grant")
        if name.startswith(names.PREFIX):
            return f"unknown connector tool {name!r} (offered: {', '.join(sorted(self.offered)) or 'none'})"
        return None

    @staticmethod
    def check_input(name, args):
        if not isinstance(args, dict):
            return f"{name}: the input must be a JSON object"
        return None

    def summary(self, name, args):
        o = self.offered[name]
        text = " ".join(json.dumps(args, ensure_ascii=False, sort_keys=True).split())
        return f"{o.server}:{o.tool}({text if len(text) <= 60 else text[:57] + '...'})"

    def call(self, name, args, turn, call_id):
        """Gate, call and record one connector call; an Outcome for the model, never raising
        for what the server, the gate or the record did (a cancel is a cancelled outcome).
        Nothing is sent unless connector.call and an allowing connector.decision are on the
        chain first; a result the chain cannot take is still the model's, and said so."""
        o = self.offered[name]
        where = self.describe(name, args)
        fp = where["fingerprint"]
        try:
            self._act("connector.call", server=o.server, tool=o.tool, fingerprint=fp, turn=turn,
                      call=call_id, readonly_claim=o.readonly)
        except OverlordError as exc:
            return self._outcome(f"Not run: the audit chain cannot record this call: {exc}", where, True)
        try:
            mode, decision = self._decide(o, name, args, turn, call_id, fp)
        except Cancelled:
            mode, decision = "ask", Decision(False, "the operator (stopped the run at the approval gate)")
            self._decided(turn, call_id, fp, decision, mode, quiet=True)
            return self._outcome("Not run: the operator stopped the run while this call waited "
                                 "for approval.", where, True, cancelled=True)
        try:
            self._decided(turn, call_id, fp, decision, mode)
        except OverlordError as exc:
            return self._outcome(f"Not run: the audit chain cannot record the decision: {exc}",
                                 where, True)
        if not decision.allow:
            why = f" ({decision.note})" if decision.note else ""
            return self._outcome(f"Denied: {decision.by} did not allow this call to "
                                 f"{o.server}:{o.tool}{why}. It was not sent to the server.", where, True)
        if fingerprint(o.server, o.tool, args) != fp:       # what is sent is what was approved
            return self._outcome("Not run: the call changed after it was approved.", where, True)
        return self._send(o, args, turn, call_id, where)

    def _act(self, action, **details):
        audit.append(action, sid=self.session.sid, target=self.session.target, **details)

    def _decide(self, o, name, args, turn, call_id, fp):
        """(the approval mode, the Decision). The gate never raises but for a cancel: a config
        that cannot be read or an approver that fails is a denial by nobody."""
        try:
            mode = mcp_config.load().approval
        except OverlordError as exc:
            return "unknown", Decision(False, "nobody", f"mcp.json cannot be read: {exc}")
        if o.trusted:
            return mode, Decision(True, f"readOnlyHint (the {o.server} server's own claim)")
        if mode == "auto":
            return mode, Decision(True, "mcp.json approval: auto")
        if mode == "readonly":
            return mode, Decision(False, "mcp.json approval: readonly",
                                  "only tools the server marks read-only run in this mode")
        if self.approver is None:
            return mode, Decision(False, "nobody", "approval: ask, and this run has no one to ask")
        shown = json.loads(json.dumps(args))           # the approver's own copy: its view is not the call
        request = ApprovalRequest(self.session.sid, turn, call_id, o.server, o.tool, name, shown,
                                  fp, o.readonly)
        self.record.record("approval_requested", turn=turn, call=call_id, server=o.server,
                           tool=o.tool, offered=name, input=args, fingerprint=fp,
                           readonly_claim=o.readonly)
        try:
            self._act("connector.approval_requested", server=o.server, tool=o.tool,
                      fingerprint=fp, call=call_id)
        except OverlordError as exc:
            return mode, Decision(False, "nobody", f"the audit chain cannot record the request: {exc}")
        try:
            decision = self.approver(request, self.cancel)
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - a terminal that hung up is a denial, not a dead run
            return mode, Decision(False, "nobody", f"the approver failed: {type(exc).__name__}: {exc}")
        if not isinstance(decision, Decision):
            return mode, Decision(False, "nobody", "the approver gave no decision")
        return mode, decision

    def _decided(self, turn, call_id, fp, decision, mode, quiet=False):
        """The decision in the transcript, then on the chain (quiet: a failing chain is let go,
        for a call that is not sent anyway)."""
        self.record.record("approval", turn=turn, call=call_id, fingerprint=fp,
                           allow=decision.allow, by=decision.by, note=decision.note, mode=mode)
        try:
            self._act("connector.decision", fingerprint=fp, call=call_id,
                      decision="allow" if decision.allow else "deny", approver=decision.by, mode=mode)
        except OverlordError:
            if not quiet:
                raise

    def _send(self, o, args, turn, call_id, where):
        fp = where["fingerprint"]
        try:
            client = self.clients.get(o.server) or self._connect(o.server)
            result = client.call_tool(o.tool, args, cancel=self.cancel,
                                      timeout=_seconds("OVERLORD_CONNECTOR_TIMEOUT", CALL_TIMEOUT))
        except Cancelled:
            unbound = self._bind(fp, call_id, cancelled=True)
            return self._outcome("Cancelled: the operator stopped the run while this call ran; "
                                 "the server was told to cancel it, but it may have acted already."
                                 + unbound, where, True, cancelled=True)
        except mcp_client.ConnectorError as exc:
            self._drop(o.server)
            self.record.record("connector_error", turn=turn, call=call_id, server=o.server,
                               message=str(exc))
            unbound = self._bind(fp, call_id, error=str(exc))
            return self._outcome(f"Connector error: {exc}" + unbound, where, True)
        unbound = self._bind(fp, call_id, sha256=result.sha256, size=result.size,
                             is_error=result.is_error)
        where = dict(where, sha256=result.sha256, size=result.size)
        return self._outcome(result.text + unbound, where, result.is_error, truncated=result.truncated)

    def _bind(self, fp, call_id, **details):
        """connector.result on the chain; '' when bound, else a note for the model (the call
        acted whatever the chain says: its answer is not lost with the act)."""
        try:
            self._act("connector.result", fingerprint=fp, call=call_id, **details)
        except OverlordError as exc:
            return f"\n[OVERLORD: the audit chain could not record this result: {exc}]"
        return ""

    def _drop(self, server):
        """A server that failed a call is reconnected at its next call."""
        _close_quietly(self.clients.pop(server, None))

    @staticmethod
    def _outcome(content, where, is_error, truncated=False, cancelled=False):
        return builtin.Outcome(content, is_error=is_error, truncated=truncated,
                               cancelled=cancelled, connector=where)


def _close_quietly(client, hurry=False):
    """Close a client (None: not connected); closing a dead server is not the run's failure."""
    if client is None:
        return
    try:
        client.close(hurry=hurry)
    except Exception:  # noqa: BLE001
        pass


def _start_timeout():
    return _seconds("OVERLORD_CONNECTOR_START_TIMEOUT", START_TIMEOUT)


def _seconds(name, default):
    """A timeout from the environment (OVERLORD_CONNECTOR_TIMEOUT, ..._START_TIMEOUT)."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def _readonly(tool):
    ann = tool.get("annotations")
    return isinstance(ann, dict) and ann.get("readOnlyHint") is True


def _model_spec(offered, server, tool, trusted):
    """The tool as the model is offered it: its own description, said to act outside."""
    kind = "read-only, by the server's claim" if trusted else \
        "acts on the world: each call asks the operator first"
    desc = tool.get("description") if isinstance(tool.get("description"), str) else ""
    schema = tool.get("inputSchema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        schema = {"type": "object", "properties": {}}
    schema = {k: v for k, v in schema.items() if k != "$schema"}
    return {"name": offered, "description": f"[connector {server}, outside the sandbox; {kind}] "
            f"{desc}".strip()[:4000], "input_schema": schema}


def log_paths(session):
    """The connector stderr logs a session holds: {server: path}."""
    out = {}
    for entry in sorted(os.listdir(session.dir)):
        if entry.startswith("connector-") and entry.endswith(".log"):
            out[entry[len("connector-"):-len(".log")]] = os.path.join(session.dir, entry)
    return out
