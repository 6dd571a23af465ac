"""`overlord hook claude-code`: a Claude Code PreToolUse hook that puts the model's shell in a
session whether or not the model asks for it.

Claude Code runs the hook before each tool call its matcher names, with one JSON object on
stdin (session_id, transcript_path, cwd, permission_mode, hook_event_name, tool_name,
tool_input, tool_use_id), and reads the answer from stdout when the hook exits 0:
{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": ...,
"permissionDecisionReason": ..., "updatedInput": ...}}.

- Bash: allow (`--ask`: ask), with updatedInput the same tool_input whose command is now
      cd -- CWD && OVERLORD_HOME=HOME OVERLORD exec --wait SID -- bash -c -- ORIGINAL
  every word shell-quoted, OVERLORD this very program by its absolute path (never looked up
  on PATH), so the whole original command -- quotes, newlines, `$(...)`, `; overlord commit`
  and all -- is one argument of `bash -c --` (one starting with - or + is no option of
  bash's) inside the session, starting in the session's view of the payload's cwd
  (overlord exec starts where it is run when that is inside the target).
  The session is opened through the broker (face "hook", client "claude-code") on the project
  directory, CLAUDE_PROJECT_DIR or else the payload's cwd, so a policy `targets` entry must
  cover it; the sid is remembered per project in OVERLORD_HOME/hook-claude-code.json (0600)
  and used while the session is open (pending or timed-out), a hook's session on that very
  project as tight (jail, net) as the hook now asks; a new one is opened once it was
  committed or rolled back; when the policy file changed since, the broker looks again.
  A refusal (no `targets` entry, a session of someone else's pending there, ...) and a command
  holding a NUL byte (no argument can carry one) are deny answers whose reason says why.
- Write, Edit, MultiEdit, NotebookEdit: deny, naming the MCP tools that edit inside the same
  session (`overlord mcp serve`, registered with Claude Code).
- any other tool: no opinion (exit 0, nothing on stdout).

Exit status, as Claude Code reads it (0: the answer on stdout; 2: a blocking error, the tool
call is not run and stderr is shown to the model; anything else: a non-blocking error, the
call goes ahead): a payload that is not a JSON object of the documented shape, and any failure
of the hook itself, exit 2 -- a call the hook cannot rewrite is blocked, never let through
outside the session; a payload of another hook event exits 1 (no tool call to guard: that is
a misplaced hook, said once, not a reason to block the prompt or the stop).

Hot path: a Bash call in a remembered session reads the payload, the state file, the session's
record and the policy file's inode -- nothing of the engine (see overlord/ops/peek.py).
"""
import json
import os
import shlex
import sys

from overlord import ops
from overlord.cli import render as R
from overlord.errors import OverlordError

EVENT = "PreToolUse"
FILE_TOOLS = ("Write", "Edit", "MultiEdit", "NotebookEdit")
STATE = "hook-claude-code.json"
CLIENT = "claude-code"


class Bad(Exception):
    """A payload the hook cannot read: exit 2, the call is blocked."""


class Misplaced(Exception):
    """A payload of another hook event: exit 1, nothing to block."""


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("hook", help="harness hooks that run an agent's shell in a session",
                       description="Hooks a harness runs around its agent's tool calls, so the "
                       "agent's shell runs inside an OVERLORD session without the agent choosing "
                       "it. The session is brokered: a policy `targets` entry must cover the "
                       "project folder.")
    hs = p.add_subparsers(dest="hook_command", metavar="HARNESS", parser_class=type(p))
    hs.required = True
    c = hs.add_parser("claude-code", help="Claude Code PreToolUse hook: Bash runs in a session",
                      description="Read Claude Code's PreToolUse hook JSON on stdin and answer "
                      "on stdout: Bash is rewritten to run through `overlord exec SID` in a "
                      "session opened (or reused) for the project directory; Write, Edit, "
                      "MultiEdit and NotebookEdit are denied, naming the MCP tools to use "
                      "instead; other tools get no opinion. Exit 2 (Claude Code blocks the "
                      "call) on a payload it cannot read.")
    c.add_argument("--ask", action="store_true",
                   help="answer ask, not allow: a person approves each rewritten command")
    c.add_argument("--no-jail", action="store_true",
                   help="open sessions without the jail (the fuse backend has none)")
    c.add_argument("--net", choices=("none", "host"),
                   help="the network to ask for (default: none; policy caps it)")


# -- reading the payload ------------------------------------------------------------------------

def read_payload(data):
    """The payload as a dict, or Bad/Misplaced naming what is wrong with it."""
    try:
        payload = json.loads(data)
    except ValueError as exc:      # not UTF-8 or not JSON
        raise Bad(f"the hook input is not JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise Bad(f"the hook input is a JSON {type(payload).__name__}, not an object")
    event = payload.get("hook_event_name")
    if not isinstance(event, str):
        raise Bad("the hook input has no hook_event_name string")
    if event != EVENT:
        raise Misplaced(f"hook claude-code answers {EVENT} only, not {event!r}: "
                        "register it under hooks.PreToolUse")
    if not isinstance(payload.get("tool_name"), str):
        raise Bad("the hook input has no tool_name string")
    if not isinstance(payload.get("tool_input"), dict):
        raise Bad("the hook input's tool_input is not an object")
    cwd = payload.get("cwd")
    if cwd is not None and not (isinstance(cwd, str) and os.path.isabs(cwd)):
        raise Bad("the hook input's cwd is not an absolute path")
    return payload


def project_dir(payload):
    """The folder the session is on: CLAUDE_PROJECT_DIR (Claude Code sets it for its hooks),
    else the payload's cwd."""
    where = os.environ.get("CLAUDE_PROJECT_DIR") or payload.get("cwd")
    if not where or not os.path.isabs(where):
        raise Bad("no project directory: neither CLAUDE_PROJECT_DIR nor the input's cwd is an "
                  "absolute path")
    return os.path.realpath(where)


# -- answers ------------------------------------------------------------------------------------

def answer(decision, reason, updated=None):
    out = {"hookEventName": EVENT, "permissionDecision": decision,
           "permissionDecisionReason": reason}
    if updated is not None:
        out["updatedInput"] = updated
    return {"hookSpecificOutput": out}


def program():
    """The words that start this very overlord again, fixed when the hook runs: an installed
    `overlord` script by its absolute path; under `python -m overlord`, this interpreter
    importing this package from where it is now (-I: no PYTHON* variables, no user site)."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) not in ("__main__.py", "-c", "") and os.path.isfile(script):
        return [os.path.abspath(script)]
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    boot = (f"import sys; sys.path.insert(0, {here!r}); from overlord.cli.main import main; "
            "sys.exit(main())")
    return [sys.executable, "-I", "-c", boot]


def rewrite(command, sid, cwd):
    """The Bash command that runs `command`, whole, inside session sid, starting at cwd."""
    words = " ".join(shlex.quote(w) for w in program())
    return (f"cd -- {shlex.quote(cwd)} && OVERLORD_HOME={shlex.quote(ops.home())} {words} "
            f"exec --wait {shlex.quote(sid)} -- bash -c -- {shlex.quote(command)}")


# -- the session --------------------------------------------------------------------------------

class Sessions:
    """The sid the hook uses per project, remembered in OVERLORD_HOME/hook-claude-code.json."""

    def __init__(self, args):
        self.args = args
        self.path = os.path.join(ops.home(), STATE)

    def _load(self):
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (FileNotFoundError, ValueError):   # none yet, or damaged: rewritten on the next open
            return {}
        projects = data.get("projects") if isinstance(data, dict) else None
        return projects if isinstance(projects, dict) else {}

    def _usable(self, entry, project):
        """The remembered session's record while it can still take commands -- a hook's
        session on this very project, as tight as this hook asks (jail, net) -- else None."""
        if not isinstance(entry, dict) or not isinstance(entry.get("sid"), str):
            return None
        meta = ops.session_record(entry["sid"])
        if (not meta or meta.get("state") not in ops.OPEN_STATES
                or meta.get("target") != project
                or (meta.get("broker") or {}).get("face") != "hook"):
            return None
        granted = meta.get("grants") or {}
        if (not self.args.no_jail and granted.get("jail") is not True) or (
                self.args.net != "host" and granted.get("net") != "none"):
            return None                    # opened looser than this hook now asks
        return meta

    def sid(self, project):
        """The session to use for project: the remembered one while it is open (the broker
        looks again when the policy file changed since), else a new one, opened through the
        broker under a lock so that parallel tool calls share it."""
        entry = self._load().get(project)
        meta = self._usable(entry, project)
        if meta is not None and entry.get("policy") == ops.policy_stamp():
            return _runnable(meta)
        import fcntl
        ops.ensure_home()
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            projects = self._load()
            entry = projects.get(project)
            meta = self._usable(entry, project)
            stamp = ops.policy_stamp()      # before the broker reads the file
            broker = ops.Broker(ops.Caller(face="hook", client=CLIENT))
            if meta is not None:
                if entry.get("policy") != stamp:
                    broker.savepoints(meta["sid"])     # coverage and grants, as of now
            else:
                opened = broker.open(target=project, grants=self._grants())
                meta = ops.session_record(opened.sid)
            projects[project] = {"sid": meta["sid"], "target": meta["target"], "policy": stamp}
            ops.write_private_json(self.path, {"projects": projects}, indent=1)
        finally:
            os.close(fd)
        return _runnable(meta)

    def _grants(self):
        grants = {}
        if self.args.no_jail:
            grants["jail"] = False
        if self.args.net:
            grants["net"] = self.args.net
        return grants or None


def _runnable(meta):
    if meta.get("limit"):
        raise OverlordError(f"session {meta['sid']} crossed its {meta['limit']} grant and can run "
                            f"nothing more; a person reviews it (overlord diff {meta['sid']}), "
                            "then commits or rolls it back")
    return meta["sid"]


# -- the hook -----------------------------------------------------------------------------------

def decide(payload, args):
    """The answer to one PreToolUse call (a dict), or None for no opinion."""
    tool, tool_input = payload["tool_name"], payload["tool_input"]
    if tool == "Bash":
        command = tool_input.get("command")
        if not isinstance(command, str):
            raise Bad("the Bash call's tool_input has no command string")
        if "\0" in command:
            return answer("deny", "OVERLORD: the command holds a NUL byte, which no shell "
                          "argument can carry; it was not run")
    elif tool not in FILE_TOOLS:
        return None
    project = project_dir(payload)
    try:
        sid = Sessions(args).sid(project)
    except OverlordError as exc:
        return answer("deny", f"OVERLORD: the {tool} call was not run, for no session on "
                      f"{project} can take it: {exc}")
    if tool != "Bash":
        return answer("deny", f"OVERLORD: {tool} is not run here: file changes go into "
                      f"session {sid} on {project} through the OVERLORD MCP server's tools "
                      f"mcp__overlord__write_file and mcp__overlord__edit_file (session "
                      f"\"{sid}\", paths relative to {project}); a Bash command runs in that "
                      "session too. The server is registered once with "
                      f"`claude mcp add overlord -- overlord mcp serve -t {project}`.")
    cwd = payload.get("cwd") or project
    updated = dict(tool_input, command=rewrite(command, sid, cwd))
    return answer("ask" if args.ask else "allow",
                  f"runs inside OVERLORD session {sid}; review it with `overlord diff {sid}`",
                  updated)


def cmd_hook(args):
    try:
        result = decide(read_payload(sys.stdin.buffer.read()), args)
    except Misplaced as exc:
        print(R.error_line(exc), file=sys.stderr)
        return 1
    except Bad as exc:
        print(R.error_line(f"hook claude-code: {exc}; the call is blocked"), file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - fail closed: a call the hook could not rewrite is blocked
        if os.environ.get("OVERLORD_DEBUG"):
            raise
        print(R.error_line(f"hook claude-code: {type(exc).__name__}: {exc}; the call is "
                           "blocked"), file=sys.stderr)
        return 2
    if result is not None:
        sys.stdout.write(json.dumps(result) + "\n")
    return 0


COMMANDS = {"hook": cmd_hook}
