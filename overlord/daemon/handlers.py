"""The daemon's operations: each request's arguments checked against the op's schema, then one
call of ops.Broker, the result rendered in the shapes of the CLI's --json (docs/JSON.md).

An op is registered with the schema of its arguments, `name=(check, required)`; parse() turns
a request object into (Op, args) or raises UsageError/NotFound before anything runs, so a
malformed request changes nothing. docs/DAEMON.md lists every op.
"""
import base64
import binascii
import dataclasses
import os
import re

from overlord import __version__, ops
from overlord.errors import NotFound, UsageError
from overlord.ops import launcher
from overlord.ops.shapes import (change_json, compare_json, counts_json, record_json,
                                 savepoint_json, session_json, session_row)
from overlord.text import escape_text

SID_RE = re.compile(r"\A\d{8}-\d{6}-[0-9a-f]{6}\Z")
RESERVED = ("id", "op", "client")


@dataclasses.dataclass
class Op:
    name: str
    schema: dict          # argument -> (check, required)
    fn: object            # fn(ctx, args) -> dict
    inline: bool = False  # answered on the reader thread (never blocks: ping, cancels)


OPS = {}
REQ, OPT = True, False


def op(name, inline=False, **schema):
    def register(fn):
        OPS[name] = Op(name, schema, fn, inline)
        return fn
    return register


# -- argument checks ------------------------------------------------------------------------------

def _shown(value):
    text = escape_text(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _check(ok, what):
    """A checker: check(name, value) -> value, or UsageError saying what name must be."""
    def check(name, v):
        if not ok(v):
            raise UsageError(f"{name} must be {what}, not {_shown(v)}")
        return v
    return check


def _text(v):
    """A str an argument or a path can carry: no NUL, no lone surrogate (JSON's "\\ud800")."""
    if not isinstance(v, str) or "\0" in v:
        return False
    try:
        os.fsencode(v)
        return True
    except UnicodeEncodeError:
        return False


string = _check(_text, "a string without NUL characters or lone surrogates")
sid = _check(lambda v: isinstance(v, str) and SID_RE.match(v), "a session id (YYYYMMDD-HHMMSS-xxxxxx)")
boolean = _check(lambda v: isinstance(v, bool), "true or false")
integer = _check(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
seconds = _check(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                 and 0 < v < float("inf"), "a positive number of seconds")
obj = _check(lambda v: isinstance(v, dict), "an object")
strings = _check(lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
                 "a list of strings")
headers = _check(lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str)
                                                       for k, x in v.items()), "an object of strings")
argv = _check(lambda v: isinstance(v, list) and v and all(_text(a) for a in v),
              "a non-empty list of strings without NUL characters or lone surrogates")


def b64(name, v):
    string(name, v)
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise UsageError(f"{name} must be base64") from None


def parse(msg):
    """(Op, args) of a request object, or UsageError (400) / NotFound (404, unknown op)."""
    name = msg.get("op")
    if not isinstance(name, str):
        raise UsageError("a request needs an op: a string")
    found = OPS.get(name)
    if found is None:
        raise NotFound(f"unknown op {_shown(name)} (ops: {', '.join(sorted(OPS))})")
    client = msg.get("client")
    if client is not None and not isinstance(client, str):
        raise UsageError(f"{name}: client must be a string")
    args = {"client": client or None}               # ops.Caller keeps its first 200 characters
    for key, value in msg.items():
        if key in RESERVED or value is None:
            continue
        spec = found.schema.get(key)
        if spec is None:
            takes = ", ".join(found.schema) or "no arguments"
            raise UsageError(f"{name}: unknown argument {_shown(key)} (takes: {takes})")
        try:
            args[key] = spec[0](key, value)
        except UsageError as exc:
            raise UsageError(f"{name}: {exc}") from None
    for key, (_, required) in found.schema.items():
        if required and key not in args:
            raise UsageError(f"{name}: missing argument {key!r}")
    if "stdin" in args and "stdin_b64" in args:
        raise UsageError(f"{name}: give stdin or stdin_b64, not both")
    return found, args


def call(found, args, ctx):
    """found.fn(ctx, args); ctx.broker is the Broker of this caller (made on first use)."""
    ctx.client = args.pop("client", None)
    return found.fn(ctx, args)


def _take(args, *names):
    """The named arguments that were given, as keyword arguments."""
    return {n: args[n] for n in names if n in args}


# -- rendering: the CLI's --json shapes (overlord.ops.shapes) -------------------------------------

def run_json(r):
    return session_json(r.sid, r.state, r.changes, exit_code=r.exit_code, timed_out=r.timed_out,
                        layer=r.layer, syscalls=r.syscalls, notes=[str(n) for n in r.notes or ()])


def agent_json(r):
    """As `overlord agent --json`: cost (the session's running total) and budget (the stop's
    {key, limit, spent, source, kind, message}, or null)."""
    return session_json(r.sid, "pending", r.changes, reason=r.reason, turns=r.turns,
                        usage=r.usage, message=r.message, cost=getattr(r, "cost", None),
                        budget=getattr(r, "budget", None))


# -- output: a command's bytes as events ----------------------------------------------------------

class Output:
    """on_output(stream, bytes) -> output events; UTF-8 text where the bytes are, a character
    split between two reads sent whole with the next one, else the exact bytes as base64."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.held = {"stdout": b"", "stderr": b""}

    def __call__(self, stream, data):
        if not self.ctx.conn.alive:
            return                                 # drained, not sent: the command is cancelled
        data = self.held.get(stream, b"") + data
        cut = _complete(data)
        self.held[stream] = data[cut:]
        if cut:
            self._send(stream, data[:cut])

    def _send(self, stream, data):
        try:
            event = {"kind": "output", "stream": stream, "text": data.decode("utf-8")}
        except UnicodeDecodeError:
            event = {"kind": "output", "stream": stream,
                     "b64": base64.b64encode(data).decode("ascii")}
        self.ctx.emit(event)

    def flush(self):
        for stream, data in self.held.items():
            if data:
                self.held[stream] = b""
                self._send(stream, data)


def _complete(data):
    """Where the last whole UTF-8 character of data ends (an unfinished one held back)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:                  # not a continuation byte: a lead (or ASCII)
            need = 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4 if byte >> 3 == 30 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


def _stdin(args):
    if "stdin_b64" in args:
        return args["stdin_b64"]
    return args.get("stdin")


# -- the ops --------------------------------------------------------------------------------------

@op("ping", inline=True)
def _ping(ctx, args):
    return {"pid": os.getpid(), "uid": os.geteuid(), "version": __version__,
            "socket": ctx.daemon.path}


GRANTED = dict(target=(string, OPT), grants=(obj, OPT), stack=(boolean, OPT),
               wait=(boolean, OPT), backend=(string, OPT))


@op("open", **GRANTED)
def _open(ctx, args):
    return run_json(ctx.broker.open(**_take(args, "target", "grants", "stack", "wait", "backend")))


@op("run", argv=(argv, REQ), stdin=(string, OPT), stdin_b64=(b64, OPT), **GRANTED)
def _run(ctx, args):
    out = Output(ctx)
    with launcher.opening(ctx.running_in):
        r = ctx.broker.run(args.get("target"), args["argv"], stdin=_stdin(args), on_output=out,
                           cancel=ctx.cancel,
                           **_take(args, "grants", "stack", "wait", "backend"))
    out.flush()
    return run_json(r)


@op("exec", sid=(sid, REQ), argv=(argv, REQ), stdin=(string, OPT), stdin_b64=(b64, OPT),
    timeout=(seconds, OPT), wait=(boolean, OPT))
def _exec(ctx, args):
    ctx.running_in(args["sid"])
    out = Output(ctx)
    r = ctx.broker.exec(args["sid"], args["argv"], stdin=_stdin(args), on_output=out,
                        cancel=ctx.cancel, **_take(args, "timeout", "wait"))
    out.flush()
    return {"sid": r.sid, "exit_code": r.exit_code, "timed_out": r.timed_out, "layer": r.layer,
            "state": _state(r.sid), "cancelled": ctx.cancel.is_set()}


def _state(sid):
    try:
        return ops.get_session(sid).meta["state"]
    except (OSError, NotFound):
        return None


@op("close", inline=True, sid=(sid, REQ))
def _close(ctx, args):
    session = ops.get_session(args["sid"])      # NotFound (404) for a session that is not here
    return {"sid": session.sid, "state": session.meta["state"],
            "cancelled": ctx.conn.cancel_in(session.sid)}


@op("diff", sid=(sid, REQ))
def _diff(ctx, args):
    return {"sid": args["sid"], "changes": [change_json(ch) for ch in ctx.broker.diff(args["sid"])]}


@op("log", sid=(sid, REQ))
def _log(ctx, args):
    records = ctx.broker.log(args["sid"])
    return {"sid": args["sid"], "changes": [record_json(r) for r in records if not r.dropped],
            "dropped": [record_json(r) for r in records if r.dropped]}


@op("sessions")
def _sessions(ctx, args):
    return {"sessions": [session_row(m) | {"broker": m.get("broker")}
                         for m in ctx.broker.sessions()]}


@op("savepoints", sid=(sid, REQ))
def _savepoints(ctx, args):
    return {"sid": args["sid"], "savepoints": [savepoint_json(p)
                                               for p in ctx.broker.savepoints(args["sid"])]}


@op("rewind", sid=(sid, REQ), to=(integer, REQ))
def _rewind(ctx, args):
    dropped = ctx.broker.rewind(args["sid"], args["to"])
    return {"sid": args["sid"], "to": args["to"], "dropped": len(dropped)}


@op("fork", sid=(sid, REQ), at=(integer, REQ))
def _fork(ctx, args):
    new = ctx.broker.fork(args["sid"], args["at"])
    return session_json(new, "pending", ctx.broker.diff(new), layer=args["at"],
                        forked_from={"sid": args["sid"], "layer": args["at"]})


@op("compare", a=(sid, REQ), b=(sid, REQ))
def _compare(ctx, args):
    rows = ctx.broker.compare(args["a"], args["b"])
    return {"a": args["a"], "b": args["b"], "rows": compare_json(rows)}


@op("blame", path=(string, REQ))
def _blame(ctx, args):
    return dict(ctx.broker.blame(args["path"]))


@op("revert", sid=(sid, REQ), stack=(boolean, OPT), backend=(string, OPT), grants=(obj, OPT))
def _revert(ctx, args):
    new = ctx.broker.revert(args["sid"], **_take(args, "stack", "backend", "grants"))
    return session_json(new, "pending", ctx.broker.diff(new), layer=0, reverts=args["sid"])


SELECT = dict(only=(strings, OPT), drop=(strings, OPT))


@op("commit", sid=(sid, REQ), force=(boolean, OPT), merge=(boolean, OPT),
    countersigned=(boolean, OPT), **SELECT)
def _commit(ctx, args):
    r = ctx.broker.commit(args["sid"], **_take(args, "force", "merge", "only", "drop",
                                               "countersigned"))
    return {"sid": r.sid, "state": "committed", "changes": [change_json(ch) for ch in r.changes],
            "counts": counts_json(r.changes), "merged": list(r.merged or ()),
            "findings": [f.as_dict() for f in r.findings or ()], "countersigned": r.countersigned}


@op("rollback", sid=(sid, REQ))
def _rollback(ctx, args):
    meta = ctx.broker.rollback(args["sid"])
    return {"sid": args["sid"], "state": meta.get("state", "rolled-back")}


@op("check", sid=(sid, REQ), **SELECT)
def _check(ctx, args):
    return ctx.broker.check(args["sid"], **_take(args, "only", "drop")).as_dict()


ENDPOINT = dict(provider=(string, OPT), model=(string, OPT), base_url=(string, OPT),
                headers=(headers, OPT), knobs=(obj, OPT), script=(string, OPT))


@op("review", sid=(sid, REQ), api=(string, OPT), azure_api_version=(string, OPT),
    same_model=(boolean, OPT), **ENDPOINT, **SELECT)
def _review(ctx, args):
    kw = _take(args, "provider", "model", "base_url", "headers", "knobs", "script", "api",
               "azure_api_version", "same_model", "only", "drop")
    for key in ("only", "drop"):
        if key in kw:
            kw[key] = tuple(kw[key])
    verdict = ctx.broker.review(args["sid"], on_event=lambda ev: ctx.emit(
        {"kind": "review", "event": ev}), **kw)
    return {"sid": args["sid"], "verdict": verdict}


class _Agent:
    """The callbacks of one agent run: events streamed, agent_cancel registered by sid."""

    def __init__(self, ctx, deltas):
        self.ctx, self.deltas, self.sids = ctx, deltas, []

    def opened(self, sid):
        self.sids.append(sid)
        self.ctx.running_in(sid)
        self.ctx.daemon.agent_started(sid, self.ctx.cancel)
        self.ctx.emit({"kind": "session", "sid": sid})

    def on_event(self, event):
        self.ctx.emit({"kind": "agent", "event": event})

    def on_delta(self, kind, text):
        if self.ctx.cancel.is_set():
            raise ops.Cancelled()
        if self.deltas:
            self.ctx.emit({"kind": "delta", "type": kind, "text": text})

    def end(self):
        for sid in self.sids:
            self.ctx.daemon.agent_ended(sid, self.ctx.cancel)


@op("agent", task=(string, REQ), target=(string, OPT), system=(string, OPT),
    max_turns=(integer, OPT), context_window=(integer, OPT), jail=(boolean, OPT),
    net=(string, OPT), net_allow=(strings, OPT), hold_writes=(boolean, OPT),
    timeout=(seconds, OPT), limits=(obj, OPT), backend=(string, OPT),
    audit=(boolean, OPT), stack=(boolean, OPT), deltas=(boolean, OPT), connectors=(strings, OPT),
    connector_shell=(boolean, OPT), **ENDPOINT)
def _agent(ctx, args):
    run = _Agent(ctx, args.pop("deltas", False))
    task, target = args.pop("task"), args.pop("target", None)
    try:
        with launcher.opening(run.opened):
            r = ctx.broker.agent(task, target, on_event=run.on_event, on_delta=run.on_delta,
                                 cancel=ctx.cancel, **args)
    finally:
        run.end()
    return agent_json(r)


@op("agent_cancel", inline=True, sid=(sid, REQ))
def _agent_cancel(ctx, args):
    return {"sid": args["sid"], "stopping": ctx.daemon.cancel_agents(args["sid"])}


@op("resume", sid=(sid, REQ), note=(string, OPT), headers=(headers, OPT),
    max_turns=(integer, OPT), deltas=(boolean, OPT))
def _resume(ctx, args):
    run = _Agent(ctx, args.pop("deltas", False))
    run.opened(args["sid"])
    try:
        r = ctx.broker.resume(args.pop("sid"), args.pop("note", None), on_event=run.on_event,
                              on_delta=run.on_delta, cancel=ctx.cancel, **args)
    finally:
        run.end()
    return agent_json(r)


@op("models", api=(string, OPT), azure_api_version=(string, OPT), provider=(string, OPT),
    base_url=(string, OPT), headers=(headers, OPT), script=(string, OPT))
def _models(ctx, args):
    return {"models": list(ctx.broker.models(**args))}


@op("audit_head")
def _audit_head(ctx, args):
    return dict(ctx.broker.audit_head())


@op("request_review", sid=(sid, REQ))
def _request_review(ctx, args):
    return dict(ctx.broker.request_review(args["sid"]))
