"""The MCP server's tools: each one Broker call, held to policy like every brokered request.

A tool's failure (a refusal by policy, a missing file, a bad argument) is a result with
`isError: true` that the model reads, never a protocol error. Every call passes
call=(tool, JSON-RPC id) and the client's name, so provenance attributes each savepoint to
the MCP client's tool call. There is deliberately no commit tool: the one act that changes
the real tree belongs to a person (`overlord commit`, the console).
"""
import os
import shutil
import sys

from overlord import ops
from overlord.errors import OverlordError
from overlord.ops.shapes import change_json, savepoint_json
from overlord.text import cause_text, escape_path, jsonable

SHELL = "bash" if shutil.which("bash") else "sh"
STAGED = ("Changes are staged in the session (a transaction a person reviews and commits); "
          "nothing reaches the real files until then.")
_SESSION = {"type": "string", "description": "The session id open_session returned."}


def _schema(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


def _session_only(description, **hints):
    return {"description": description, "inputSchema": _schema({"session": _SESSION}, ["session"]),
            "annotations": hints}


OWN = {
    "open_session": {
        "description": "Open an OVERLORD session: a transaction over a project folder in which "
        "exec and the file tools run. Returns the session id every other tool takes. Commands "
        "run jailed and offline unless you ask for less (jail: false, net: \"proxy\" or "
        "\"host\") and policy allows it; a folder policy does not cover is refused. " + STAGED,
        "inputSchema": _schema({
            "target": {"type": "string", "description": "The folder to work on, absolute or "
                       "relative to the server's project (default: the project itself)."},
            "jail": {"type": "boolean", "description": "false: run without the pivot_root jail "
                     "(only where policy allows)."},
            "net": {"type": "string", "enum": ["none", "proxy", "host"], "description":
                    "The commands' network (only what policy allows): \"none\" (the default) "
                    "nothing; \"proxy\" only through a recording HTTP proxy (HTTP_PROXY is set; "
                    "every connection is logged for the person's review; HTTPS is a CONNECT "
                    "tunnel recorded by host, port and bytes); \"host\" the host's network, "
                    "unrecorded."},
            "net_allow": {"type": "array", "items": {"type": "string"}, "description":
                          "With net \"proxy\": the hosts the proxy lets through (\"pypi.org\", "
                          "\"*.github.com\" for the names below it, a literal IP); any other is "
                          "refused with 403. Omitted: any public host, recorded. Private and "
                          "loopback addresses only when named exactly."},
            "hold_writes": {"type": "boolean", "description": "With net \"proxy\": true holds "
                            "every plain-HTTP write (every request but a bodiless GET/HEAD/"
                            "OPTIONS/TRACE; answered 202, not sent) "
                            "until a person releases it at commit; HTTPS tunnels cannot be held."},
            "stack": {"type": "boolean", "description": "true: open even though another session "
                      "is still pending on the folder (each is reviewed on its own)."}}),
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False}},
    "exec": {
        "description": "Run one shell command (bash -c) in the session, at the project root. "
        "Returns the exit code, stdout and stderr. Every command that writes becomes its own "
        "savepoint. Stdin is empty. " + STAGED,
        "inputSchema": _schema({
            "session": _SESSION,
            "command": {"type": "string", "description": "The shell command line."},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "Seconds before "
                        "the command and everything it started are killed (default: the "
                        "session's limit)."}}, ["session", "command"]),
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False}},
    "diff": _session_only("What the session changed so far, one line per path (added, "
                          "modified, deleted, replaced-dir): what a person would commit.",
                          readOnlyHint=True),
    "savepoints": _session_only("The session's savepoints, oldest first: @N, how many paths, "
                                "and the call that made it. rewind drops the ones above @N.",
                                readOnlyHint=True),
    "rewind": {
        "description": "Drop every savepoint above @to: the session is as it was right after "
        "savepoint @to. Cannot be undone (rollback throws the whole session away).",
        "inputSchema": _schema({"session": _SESSION, "to": {
            "type": "integer", "minimum": 0, "description": "The last savepoint to keep (N of "
            "@N in savepoints)."}}, ["session", "to"]),
        "annotations": {"readOnlyHint": False, "destructiveHint": True, "openWorldHint": False}},
    "request_review": _session_only(
        "Say the work is done: marks the session as waiting for a person, who reviews the "
        "change and commits or rolls it back. Call it once, at the end.", readOnlyHint=False,
        destructiveHint=False),
    "rollback": _session_only("Throw the whole session away: none of its changes will reach "
                              "the real files. Cannot be undone.", readOnlyHint=False,
                              destructiveHint=True),
}
ORDER = ("open_session", "exec", "read_file", "write_file", "edit_file", "list_dir", "search",
         "diff", "savepoints", "rewind", "request_review", "rollback")


def _file_tools():
    """The built-in agent's file tools, as the broker offers them: its own schema plus session."""
    out = {}
    for spec in ops.TOOL_SPECS:
        schema = spec["input_schema"]
        reading = spec["name"] in ("read_file", "list_dir", "search")
        out[spec["name"]] = {
            "description": f"{spec['description']} In the session; paths are relative to its "
            "project root." + ("" if reading else " Its own savepoint. " + STAGED),
            "inputSchema": _schema({"session": _SESSION, **schema["properties"]},
                                   ["session", *schema["required"]]),
            "annotations": {"readOnlyHint": reading, "destructiveHint": False,
                            "openWorldHint": False}}
    return out


class Table:
    """The tool list and its calls, for a server whose default project is target."""

    def __init__(self, target):
        self.target = target
        specs = {**OWN, **_file_tools()}
        self.specs = {name: dict(specs[name], name=name) for name in ORDER}

    def listing(self):
        return [{"name": s["name"], "description": s["description"],
                 "inputSchema": s["inputSchema"], "annotations": s["annotations"]}
                for s in self.specs.values()]

    def has(self, name):
        return name in self.specs

    def call(self, name, args, client, call_id, cancel):
        """The CallToolResult of one call: {content, structuredContent, isError}."""
        why = check(self.specs[name]["inputSchema"], args)
        if why:
            return failed(f"{name}: {why}")
        broker = ops.Broker(ops.Caller(face="mcp", client=client))
        try:
            return getattr(self, "_" + name, self._file)(broker, name, args, (name, call_id), cancel)
        except OverlordError as exc:
            return failed(f"overlord: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug must not take the server down
            import traceback
            traceback.print_exc(file=sys.stderr)
            return failed(f"overlord: internal error: {type(exc).__name__}: {exc}")

    # -- the calls ----------------------------------------------------------------------------

    def _open_session(self, b, name, args, call, cancel):
        target = os.path.join(self.target, args.get("target") or ".")
        grants = {k: args[k] for k in ("jail", "net", "net_allow", "hold_writes") if k in args}
        opened = b.open(target=target, grants=grants or None, stack=args.get("stack", False))
        where = ops.get_session(opened.sid).target
        return done(f"session {opened.sid} is open on {escape_path(where)}.\nPass session: "
                    f"\"{opened.sid}\" to exec and the file tools. {STAGED} When the work is "
                    "done, call request_review.", {"session": opened.sid, "target": where})

    def _exec(self, b, name, args, call, cancel):
        sid = args["session"]
        cap = b.capture(sid, [SHELL, "-c", args["command"]], timeout=args.get("timeout"),
                        call=call, cancel=cancel)
        out, err = _text(cap.stdout), _text(cap.stderr)
        lines = [f"timed out: the command and everything it started were killed"
                 if cap.timed_out else f"exit code: {cap.exit_code}"]
        if out:
            lines.append("stdout:\n" + out)
        if err:
            lines.append("stderr:\n" + err)
        if cap.truncated:
            lines.append("[the output was longer than shown: the middle was left out]")
        if cap.layer is not None:
            lines.append(f"[savepoint @{cap.layer}]")
        return done("\n".join(lines), {
            "session": sid, "exit_code": cap.exit_code, "timed_out": cap.timed_out,
            "stdout": out, "stderr": err, "truncated": cap.truncated, "savepoint": cap.layer},
            error=cap.timed_out)

    def _file(self, b, name, args, call, cancel):
        sid = args["session"]
        inputs = {k: v for k, v in args.items() if k != "session"}
        outcome = b.tool(sid, name, inputs, call=call, cancel=cancel)
        return done(outcome.content, {"session": sid, "savepoint": outcome.layer,
                                      "truncated": outcome.truncated}, error=outcome.is_error)

    def _diff(self, b, name, args, call, cancel):
        sid = args["session"]
        changes = b.diff(sid)
        lines = [f"{ch.kind}  {escape_path(ch.path)}" + (f"  ({w})" if (w := ops.describe(ch)) else "")
                 for ch in changes]
        return done("\n".join(lines) or "no changes",
                    {"session": sid, "changes": [change_json(ch) for ch in changes]})

    def _savepoints(self, b, name, args, call, cancel):
        sid = args["session"]
        points = b.savepoints(sid)
        lines = [f"@{p['n']}  {p['paths']} path{'' if p['paths'] == 1 else 's'}  "
                 f"{escape_path(cause_text(p['cause']))}" for p in points]
        return done("\n".join(lines) or "no savepoints yet",
                    {"session": sid, "savepoints": [savepoint_json(p) for p in points]})

    def _rewind(self, b, name, args, call, cancel):
        sid, to = args["session"], args["to"]
        dropped = b.rewind(sid, to)
        return done(f"rewound {sid} to @{to}: {len(dropped)} savepoint"
                    f"{'' if len(dropped) == 1 else 's'} dropped",
                    {"session": sid, "layer": to, "dropped": len(dropped)})

    def _request_review(self, b, name, args, call, cancel):
        asked = b.request_review(args["session"])
        return done(f"session {asked['sid']} is waiting for a person: they review it "
                    f"(overlord diff {asked['sid']}, the console) and commit or roll it back.",
                    {"session": asked["sid"], "needs_review": asked["needs_review"]})

    def _rollback(self, b, name, args, call, cancel):
        sid = args["session"]
        b.rollback(sid)
        return done(f"rolled back {sid}: none of its changes will reach the real files",
                    {"session": sid, "state": "rolled-back"})


def done(text, structured, error=False):
    return {"content": [{"type": "text", "text": text}],
            "structuredContent": jsonable(structured), "isError": bool(error)}


def failed(text):
    return {"content": [{"type": "text", "text": text}], "isError": True}


def check(schema, args):
    """Why args do not fit a tool's input schema (the subset these schemas use), or None."""
    props = schema["properties"]
    for key in schema["required"]:
        if key not in args:
            return f"missing required argument {key!r}"
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            return f"unknown argument {key!r} (arguments: {', '.join(props)})"
        kind = spec.get("type")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "string" and not isinstance(value, str):
            return f"{key} must be a string"
        if kind == "boolean" and not isinstance(value, bool):
            return f"{key} must be true or false"
        if kind == "integer" and not (number and float(value).is_integer()):
            return f"{key} must be an integer"
        if kind == "number" and not number:
            return f"{key} must be a number"
        if kind == "array" and not (isinstance(value, list) and all(
                isinstance(v, str) for v in value)):      # the one item type these schemas use
            return f"{key} must be a list of strings"
        if "enum" in spec and value not in spec["enum"]:
            return f"{key} must be one of {', '.join(map(str, spec['enum']))}"
        if "minimum" in spec and value < spec["minimum"]:
            return f"{key} must be at least {spec['minimum']}"
        if "exclusiveMinimum" in spec and not value > spec["exclusiveMinimum"]:
            return f"{key} must be more than {spec['exclusiveMinimum']}"
        if kind == "integer":
            args[key] = int(value)
    return None


def _text(data):
    return data.decode("utf-8", "replace")
