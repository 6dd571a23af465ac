"""The command line: parse, make one call into overlord.ops, render, map errors to exit codes.

Start-up is paid on every call (a harness hook runs `overlord exec` once per tool call), so a
command imports only what it runs: argparse builds the full parser of the one subcommand named
on the command line, and every other subcommand is registered by its name and help line only
(enough for `overlord --help` and for a usage error). `overlord.ops` loads each operation on
first use.

The face modules in FACE_CLI are imported to learn their subcommands (by `overlord --help` and
by any command that is not one of this module's own), so each keeps its top level light: the
standard library's cheap modules, `overlord.ops`, `overlord.errors`, `overlord.text` and
`overlord.cli.render` only; anything heavier (an `overlord.ops` submodule, the web face, a
provider, ssl, http) is imported inside the command function that needs it. Their
`add_parsers(sub)` is called with `sub` standing for the subparsers: for a subcommand that is
not being run, `sub.add_parser` returns a stand-in that takes every call and builds nothing.
test/unit/test_startup.py holds them to it.
"""
import argparse
import os
import sys

from overlord import __version__, ops
from overlord.cli import render as R
from overlord.errors import OverlordError, UsageError
from overlord.text import jsonable

TRACE_VALUES = ("strace", "ebpf")
NET_CHOICES = ("host", "none", "proxy")      # overlord.ops.grants.NET_VALUES
FACE_CLI = ("agent_cmds", "audit_cmds", "policy_cmds", "check_cmd",   # overlord.cli.NAME, each:
            "review_cmd", "daemon_cmd", "mcp_cmd", "hook_cmd", "ui_cmd",  # add_parsers(sub), COMMANDS
            "memory_cmds", "skills_cmds", "users_cmds", "tls_cmd", "sso_cmds",
            "cost_cmds", "webhooks_cmds", "secrets_cmds", "gc_cmd", "bundle_cmds",
            "egress_cmd")
ALL = None               # build_parser(command=ALL): every subcommand's full parser


def _columns():
    """The width argparse formats help for (shutil.get_terminal_size's columns), without
    importing shutil, which imports bz2, lzma and fnmatch on every command."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class Formatter(argparse.HelpFormatter):
    def __init__(self, prog, **kw):
        kw.setdefault("width", _columns() - 2)
        super().__init__(prog, **kw)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kw)

    def error(self, message):
        raise UsageError(message)


class _Skipped:
    """What `sub.add_parser` returns for a subcommand that is not being run: it takes every
    call a face module makes on a parser (add_argument, add_argument_group, add_subparsers,
    set_defaults, ...) and builds nothing."""

    def __getattr__(self, name):
        return self._ignore

    def __setattr__(self, name, value):      # `ps.required = True`: nothing to set
        pass

    def _ignore(self, *args, **kwargs):
        return self


SKIPPED = _Skipped()


class Subcommands:
    """The subparsers as build_parser hands them to each add_parsers(sub): the subcommand
    being run (or, for ALL, every one) gets its full parser; every other one only its name and
    its line in `overlord --help`."""

    def __init__(self, action, command):
        self.action, self.command, self.names = action, command, []

    def add_parser(self, name, **kw):
        self.names.append(name)
        if self.command is ALL or name == self.command:
            return self.action.add_parser(name, **kw)
        self.action._name_parser_map[name] = SKIPPED
        if "help" in kw:
            self.action._choices_actions.append(
                self.action._ChoicesPseudoAction(name, (), kw["help"]))
        return SKIPPED


def _normalize_trace(argv):
    """--trace takes an optional value, and only 'strace' or 'ebpf' are taken as it."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.extend(argv[i:])
            break
        if arg == "--trace":
            if i + 1 < len(argv) and argv[i + 1] in TRACE_VALUES:
                out.append(f"--trace={argv[i + 1]}")
                i += 2
                continue
            out.append("--trace=strace")
        else:
            out.append(arg)
        i += 1
    return out


def _split_command(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


SID_HELP = R.SID_HELP
EPILOG = ("SID is a session id as `overlord sessions` lists it (e.g. 20261201-074714-3fa2c1), or "
          "`last` for the newest session. Exit status: 0 done, 1 refused, 2 usage error; run, exec "
          "and shell pass the command's own status through (124: timed out, 122: disk grant "
          "reached). `overlord COMMAND --help` tells more.")


class TopHelp(Formatter):
    """`overlord --help`: every subcommand's help on its own line, beside its name (argparse
    measures the names 2 columns short of where it prints them)."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=16)

    def add_argument(self, action):
        super().add_argument(action)
        if action.nargs == argparse.PARSER:
            self._action_max_length = max(self._action_max_length,
                                          max(map(len, action.choices)) + self._current_indent + 4)


class CommandUsage(Formatter):
    """The usage of a subcommand that wraps a command: `... -- CMD [ARG...]` (the command is
    split off at `--` before parsing, so argparse never sees it)."""

    def _format_usage(self, usage, actions, groups, prefix):
        return super()._format_usage(usage, actions, groups, prefix).rstrip("\n") + \
            " -- CMD [ARG...]\n\n"


def _sid_command(sub, name, help, json=False, **kw):
    """A subcommand that takes a session id (and, for reports, --json)."""
    kw.setdefault("description", help[0].upper() + help[1:] + ".")
    p = sub.add_parser(name, help=help, **kw)
    p.add_argument("sid", metavar="SID", help=SID_HELP)
    if json:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _face(name):
    import importlib
    return importlib.import_module(f"overlord.cli.{name}")


def named_command(head):
    """The subcommand the arguments name: the first word that is not an option (the top
    level has no option that takes a value); "" for none."""
    return next((arg for arg in head if not arg.startswith("-")), "")


def build_parser(command=ALL):
    """The parser: with command=ALL every subcommand's full parser (what the tests read),
    else only `command`'s; a command of this module's own imports no face module."""
    p = Parser(prog="overlord", description="Transactional, attributed execution over a "
               "directory: run, review the change, commit or roll back.", epilog=EPILOG,
               formatter_class=TopHelp)
    p.add_argument("--version", action="version", version=f"overlord {__version__}")
    sub = Subcommands(p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser),
                      command)
    _own_parsers(sub)
    if command is ALL or command not in sub.names:
        for name in FACE_CLI:
            _face(name).add_parsers(sub)
    return p


def _net_flags(p):
    """--net, --net-allow, --hold-writes: the network grant of a session opened here
    (docs/EGRESS.md)."""
    p.add_argument("--net", choices=NET_CHOICES, help="network grant: host (the host's), none "
                   "(loopback only), proxy (only through OVERLORD's recording HTTP proxy; kernel "
                   "backend)")
    p.add_argument("--net-allow", action="append", metavar="HOST", default=None,
                   help="with --net proxy: a host the session may reach (pypi.org, '*.pypi.org' "
                   "for names below it, a literal IP); others are refused; repeatable")
    p.add_argument("--hold-writes", action="store_true", default=None,
                   help="with --net proxy: hold plain-HTTP writes (POST, PUT, PATCH, DELETE: "
                   "every request but a bodiless GET/HEAD/OPTIONS/TRACE) until commit "
                   "(commit --release-held sends them)")


def _own_parsers(sub):

    r = sub.add_parser("run", help="run a command in a new transactional session",
                       formatter_class=CommandUsage,
                       description="Run CMD over a writable copy of the target; nothing touches "
                       "the real tree until commit (then review it with diff and log, and commit "
                       "or roll it back). Prints 'session SID' after the command's own output and "
                       "passes its exit status through (124: timed out, 122: disk grant reached).")
    r.add_argument("-t", "--target", metavar="DIR", help="the tree to work on (default: .)")
    r.add_argument("--backend", choices=("kernel", "fuse"), help="force a backend")
    r.add_argument("--timeout", type=float, metavar="S", help="kill the whole process tree after S seconds")
    r.add_argument("--manifest", metavar="FILE", help="grants from a JSON file (flags override)")
    r.add_argument("--merge-base", action="store_true", default=None,
                   help="keep base copies of touched files so commit --merge can three-way merge")
    r.add_argument("--jail", action="store_true", default=None, help="pivot_root jail (kernel backend)")
    _net_flags(r)
    r.add_argument("--limit", action="append", metavar="KEY=N", default=[],
                   help="resource grant (memory_mb, pids, cpu_pct, disk_mb, fsize_mb, nofile; "
                   "0 = unlimited); repeatable")
    r.add_argument("--trace", metavar="strace|ebpf", help="record syscalls (default recorder: strace)")
    r.add_argument("--wait", action="store_true", help="queue behind a session executing on the target")
    r.add_argument("--stack", action="store_true", help="open even though another session is pending here")
    r.add_argument("--json", action="store_true", help="after the command's output, one JSON "
                   "line (sid, state, exit_code, changes, ...) instead of the session line")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    s = sub.add_parser("shell", help="an interactive transactional shell (one savepoint)",
                       description="An interactive shell over a writable copy of the target, on a "
                       "real pty. The whole shell is one savepoint. Driven from stdin when stdin "
                       "is not a terminal. Prints the session and a summary on exit.")
    s.add_argument("-t", "--target", metavar="DIR", help="the tree to work on (default: .)")
    s.add_argument("--backend", choices=("kernel", "fuse"), help="force a backend")
    s.add_argument("--stack", action="store_true", help="open even though another session is pending here")
    s.add_argument("--wait", action="store_true", help="queue behind a session executing on the target")
    s.add_argument("--json", action="store_true", help="on exit, one JSON line instead of the "
                   "session line")
    _net_flags(s)

    ss = sub.add_parser("sessions", help="list sessions with state, target and cause",
                        description="One line per session: SID, state (running, pending, "
                        "timed-out, unchanged, committed, rolled-back), backend, target, and what "
                        "made it (the command, or `fork of SID@N`).")
    ss.add_argument("--json", action="store_true", help="machine-readable output")

    df = _sid_command(sub, "diff", "what a session changed, one line per path", json=True,
                 description="What commit would change in the target, one line per path: added, "
                 "modified, deleted, replaced-dir or invalid-whiteout, then the path.")
    lg = _sid_command(sub, "log", "per change: sha256 before -> after, layer and cause", json=True,
                 description="Per change: the kind, the path, and 12 hex digits of the sha256 "
                 "before (the real tree) -> after (the session), '-' for a missing side; --json "
                 "adds the savepoint and its cause.")

    df.add_argument("--patch", action="store_true", help="unified diffs of the content, like "
                    "git diff (binary and large files summarized)")
    df.add_argument("--only", action="append", default=[], metavar="SEL",
                    help="what `commit --only SEL` would change: layer:N, layer:A-B, turn:N, "
                    "tool:NAME, call:ID")
    df.add_argument("--drop", action="append", default=[], metavar="SEL",
                    help="what `commit --drop SEL` would change (same selectors)")
    lg.add_argument("--syscalls", action="store_true", help="also what --trace recorded, one "
                    "line per syscall")
    sc = _sid_command(sub, "syscalls", "what --trace recorded for a session, one line per syscall",
                      json=True, description="What the session's --trace recorder (strace or "
                      "eBPF) saw, in order: pid, seconds since the first record, syscall, return "
                      "value, path (or arguments), and whether it wrote, exec'd or connected.")

    ex = _sid_command(sub, "exec", "run another command inside a pending session",
                      formatter_class=CommandUsage, description="Run CMD inside a pending session, over its current stack. A "
                      "command that writes seals a new savepoint stamped with its command line; "
                      "one that writes nothing adds none. Its exit status is passed through.")
    ex.add_argument("--timeout", type=float, metavar="S", help="kill the command after S seconds")
    ex.add_argument("--wait", action="store_true", help="queue behind a command executing on the target")
    ex.add_argument("--json", action="store_true", help="after the command's output, one JSON "
                    "line (sid, state, exit_code, layer, changes, ...)")

    _sid_command(sub, "savepoints", "the layer stack: one savepoint per command that wrote", json=True,
                 description="The session's layer stack, oldest first: @N, how many paths it "
                 "holds, and the command or agent tool call that wrote it.")
    rw = _sid_command(sub, "rewind", "discard every savepoint above @N",
                      description="Discard every savepoint above @N; the session stays pending "
                      "with @0..@N (an agent session can then be resumed from there).")
    rw.add_argument("--to", required=True, metavar="N", help="the savepoint to keep as the top")
    fk = _sid_command(sub, "fork", "a second continuation of a savepoint, as a new session",
                      description="A new pending session holding a copy of SID's savepoints "
                      "@0..@N, on the same snapshot; `sessions` lists it as `fork of SID@N`.")
    fk.add_argument("--at", required=True, metavar="N", help="the savepoint to fork from")
    fk.add_argument("--json", action="store_true", help="one JSON line instead of the session line")

    cp = sub.add_parser("compare", help="where two sessions diverge, per path",
                        description="Where two sessions (two continuations of one moment, e.g. "
                        "a fork) diverge: one line per path that differs between them.")
    cp.add_argument("a", metavar="SID_A", help=SID_HELP)
    cp.add_argument("b", metavar="SID_B", help="the other session (same forms)")
    cp.add_argument("--json", action="store_true", help="machine-readable output")

    c = _sid_command(sub, "commit", "check for outside changes, then replay onto the target",
                     description="Check that nothing outside OVERLORD changed the paths the "
                     "session touches (drift), then replay the session onto the real tree, all or "
                     "nothing, even across a crash. Refuses, naming the path, rather than clobber "
                     "an outside change.")
    c.add_argument("--only", action="append", default=[], metavar="SEL",
                   help="replay only these savepoints: layer:N, layer:A-B, turn:N, tool:NAME, call:ID")
    c.add_argument("--drop", action="append", default=[], metavar="SEL",
                   help="replay all but these savepoints (same selectors)")
    c.add_argument("--force", action="store_true", help="commit despite ordinary drift")
    c.add_argument("--merge", action="store_true", help="three-way merge non-overlapping drift "
                   "(needs a session run with --merge-base)")
    c.add_argument("--allow-privileged-modes", action="store_true", help="commit even though the "
                   "session adds a setuid/setgid bit, a file capability or an ACL for another "
                   "user (recorded on the session)")
    c.add_argument("--countersigned", action="store_true", help="refuse unless a fresh, complete "
                   "approval by a second model (`overlord review`) is on record for exactly this change")
    c.add_argument("--release-held", action="store_true", help="once the tree has landed, send "
                   "every request the session held (--hold-writes), in order; without it (or "
                   "--release) they are dropped (`overlord egress SID` lists them)")
    c.add_argument("--release", action="append", default=[], metavar="ID",
                   help="send only this held request (e.g. h0001) once the tree has landed; "
                   "repeatable; the others are dropped")

    _sid_command(sub, "rollback", "roll back: discard a session; the target stays untouched",
                 description="Roll back a session: discard its changes and savepoints. The target "
                 "stays byte-identical; the record stays, as rolled-back.")

    rv = _sid_command(sub, "revert", "stage the undo of a committed session, for review",
                      description="Stage the undo of a committed session as a new pending "
                      "session: review it with diff, then commit it (or roll it back).")
    rv.add_argument("--stack", action="store_true", help="open even though another session is pending here")
    rv.add_argument("--json", action="store_true", help="one JSON line instead of the session line")

    bl = sub.add_parser("blame", help="each line of a file with the session and cause behind it",
                        description="Each line of a committed file with its "
                        "owner: the session, savepoint and cause that first produced it; 'origin' "
                        "for lines older than the record, 'drift' for lines changed outside "
                        "OVERLORD since the last commit.")
    bl.add_argument("path", metavar="FILE", help="a file inside a target OVERLORD committed to")
    bl.add_argument("--json", action="store_true", help="machine-readable output")

    dr = sub.add_parser("doctor", help="which backends can run here, and why not",
                        description="Which backends can run here and why not, what each grant "
                        "(jail, network, limits, trace) means on this host, the tools found, and "
                        "OVERLORD_HOME. Exits 1 when no backend can run.")
    dr.add_argument("--json", action="store_true", help="machine-readable output")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return dispatch(argv)
    except OverlordError as exc:
        print(R.own_line_prefix(sys.stderr) + R.error_line(exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("overlord: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except OSError as exc:
        if os.environ.get("OVERLORD_DEBUG"):
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(R.own_line_prefix(sys.stderr) + R.error_line(f"{exc.strerror or exc}{where}"),
              file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug still gets one line, not a traceback
        if os.environ.get("OVERLORD_DEBUG"):
            raise
        print(R.own_line_prefix(sys.stderr) + R.error_line(f"internal error: {type(exc).__name__}: "
              f"{exc} (set OVERLORD_DEBUG=1 for a traceback)"), file=sys.stderr)
        return 1


def dispatch(argv):
    head, cmd = _split_command(_normalize_trace(argv))
    parser = build_parser(named_command(head))
    args = parser.parse_args(head)
    if args.command is None:
        parser.print_help()
        return 2
    ops.recover()
    _resolve_sids(args)
    if args.command == "run":
        if cmd is None:
            cmd = [a for a in (args.cmd or []) if a != "--"]
        elif args.cmd:
            raise UsageError(f"unexpected arguments before --: {' '.join(args.cmd)}")
        return cmd_run(args, cmd)
    if args.command == "exec":
        if not cmd:
            raise UsageError("missing command after --")
        return cmd_exec(args, cmd)
    if cmd is not None:
        raise UsageError(f"'{args.command}' takes no command after --")
    if args.command in COMMANDS:
        return COMMANDS[args.command](args)
    for name in FACE_CLI:
        module = _face(name)
        if args.command in module.COMMANDS:
            return module.COMMANDS[args.command](args)
    raise UsageError(f"unknown command {args.command!r}")


def _resolve_sids(args):
    """`last` (the newest session) wherever a SID is taken, resolved once, up front, by the
    service layer: every later step sees the real id."""
    for name in ("sid", "a", "b"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            setattr(args, name, ops.resolve_sid(value))


def _grants(args):
    manifest = ops.load_manifest(args.manifest) if getattr(args, "manifest", None) else {}
    flags = {"jail": getattr(args, "jail", None), "net": getattr(args, "net", None),
             "timeout": getattr(args, "timeout", None), "merge_base": getattr(args, "merge_base", None),
             "net_allow": net_allow_flags(getattr(args, "net_allow", None)),
             "hold_writes": getattr(args, "hold_writes", None)}
    grants = ops.merge_grants(manifest, flags, getattr(args, "limit", ()))
    from overlord.ops.grants import check_net_grants
    check_net_grants(grants)        # --net-allow / --hold-writes without --net proxy: one line
    return grants


def net_allow_flags(values):
    """The --net-allow values, each checked (netallow's message, naming the flag), or None
    when none was given."""
    return ops.parse_net_allow(values) if values else None


def cmd_run(args, cmd):
    if not cmd:
        raise UsageError("missing command after --")
    result = ops.run(cmd, target=args.target, backend=args.backend, grants=_grants(args),
                     trace=args.trace, wait=args.wait, stack=args.stack, track_stdout=True)
    _print_session_line(result, args.json)
    return result.exit_code


def _line_start(at_line_start):
    """What to write before OVERLORD's own line on stdout once a command has written there:
    on a terminal, render's reset and fresh line; on a pipe or file, a newline exactly when
    the command's output did not end with one (ops.run tracked it: RunResult.at_line_start)."""
    sys.stdout.flush()
    if sys.stdout.isatty():
        return R.own_line_prefix(sys.stdout)
    return "\n" if at_line_start is False else ""


def _print_session_line(result, as_json=False):
    """`session SID  STATE  SUMMARY; exit N` (or, with --json, one JSON line) on a fresh line
    after the command's output, then the run's notes on stderr."""
    prefix = _line_start(getattr(result, "at_line_start", None))
    if as_json:
        print(prefix + json_line(session_json(
            result.sid, result.state, result.changes, exit_code=result.exit_code,
            timed_out=result.timed_out, layer=getattr(result, "layer", None),
            syscalls=result.syscalls, notes=list(getattr(result, "notes", None) or ()))),
            flush=True)
    else:
        ended = R.exit_text(result.exit_code, result.timed_out,
                            ops.crossed_grant(ops.get_session(result.sid).meta))
        print(f"{prefix}session {result.sid}  {result.state}  "
              f"{R.summarize(result.changes)}; {ended}", flush=True)
    for note in getattr(result, "notes", None) or ():
        print(f"overlord: note: {R.escape_text(str(note))}", file=sys.stderr, flush=True)


# -- JSON: one vocabulary for every command (docs/JSON.md) --------------------------------------

def dump_json(data):
    """A report, indented (sessions, diff, log, savepoints, compare, syscalls)."""
    R.dump_json(jsonable(data))


def json_line(data):
    """The run family's --json: one line, so `| tail -n 1` is the object."""
    import json
    return json.dumps(jsonable(data), sort_keys=True)


def session_json(sid, state, changes, **fields):
    """What run, shell, exec, agent, resume, fork and revert print with --json
    (overlord.ops.shapes, imported here so that `--help` does not)."""
    from overlord.ops.shapes import session_json
    return session_json(sid, state, changes, **fields)


def print_session_json(sid, state, changes, at_line_start=None, **fields):
    """For a face that opened or ran in a session (e.g. agent_cmds): the --json line, on a
    fresh line after whatever the command printed."""
    print(_line_start(at_line_start) + json_line(session_json(sid, state, changes, **fields)),
          flush=True)


def cmd_exec(args, cmd):
    result = ops.exec_in(args.sid, cmd, timeout=args.timeout, wait=args.wait,
                         track_stdout=args.json)
    if args.json:
        session = ops.get_session(args.sid)
        print_session_json(args.sid, session.meta["state"], ops.diff(args.sid),
                           at_line_start=result.at_line_start, exit_code=result.exit_code,
                           timed_out=result.timed_out, layer=result.layer)
    return result.exit_code


def cmd_shell(args):
    from overlord.cli.shell import run_shell
    result = run_shell(args)
    _print_session_line(result, args.json)
    return result.exit_code


def cmd_sessions(args):
    metas = ops.sessions()
    if args.json:
        from overlord.ops.shapes import session_row
        dump_json([session_row(m) for m in metas])
        return 0
    rows = [(m["sid"], m.get("state", "?"), m.get("backend", "?"), R.escape_path(m.get("target", "")),
             R.session_cause(m)) for m in metas]
    if rows:
        print(R.table(rows))
    return 0


def _words(change):
    """`  (link -> /etc/passwd)`: what a change is beyond its kind, or ""."""
    words = ops.describe(change)
    return f"  ({words})" if words else ""


def cmd_diff(args):
    changes = ops.diff(args.sid, args.only, args.drop)
    if args.json:
        from overlord.ops.shapes import change_json
        texts = ops.unified(args.sid, changes) if args.patch else None
        rows = [change_json(ch) for ch in changes]
        for row, ch in zip(rows, changes):
            if ch.path_class:
                row["class"] = ch.path_class        # grouped by `log --json`'s "git"
        for row, text in zip(rows, texts or ()):
            row["patch"] = text
        dump_json(rows)
        _held_note(args.sid)
        return 0
    git = ops.git_summary(args.sid, changes)
    if args.patch:
        # the files under .git/ are summarized, but config and hooks (what runs on the host
        # once committed) keep their patches
        shown = R.git_notable(git)
        patched = [ch for ch in changes if not ch.path_class or ch.path in shown]
        for line in R.git_lines(git):
            print(line)
        sys.stdout.write("".join(ops.unified(args.sid, patched)))
        _held_note(args.sid)
        return 0
    lines = [(ch.path_class, f"{ch.kind}  {R.escape_path(ch.path)}{_words(ch)}") for ch in changes]
    for line in R.grouped(lines, git):
        print(line)
    _held_note(args.sid)
    return 0


def _held_note(sid):
    """On stderr (stdout stays one line per path): the held requests that wait for commit."""
    if not os.path.isdir(ops.get_session(sid).path("held")):
        return              # no held/ directory: no --hold-writes request was ever held
    n = ops.held_waiting(sid)
    if n:
        sys.stdout.flush()
        print(f"overlord: note: {n} held request{'s' if n != 1 else ''} wait{'' if n != 1 else 's'}"
              f" for commit (overlord egress {sid})", file=sys.stderr)


def _log_line(r):
    return f"{r.kind}  {R.escape_path(r.path)}  {R.short(r.before)} -> {R.short(r.after)}{_words(r)}"


def cmd_log(args):
    records = ops.log(args.sid)
    traced = ops.traced(args.sid)
    calls = ops.syscalls(args.sid) if traced else None
    count = len(calls) if traced else None
    kept = [r for r in records if not r.dropped]
    dropped = [r for r in records if r.dropped]
    git = ops.git_summary(args.sid)
    if args.json:
        from overlord.ops.shapes import record_json
        data = {"sid": args.sid, "syscalls": count, "changes": [record_json(r) for r in kept],
                "dropped": [record_json(r) for r in dropped]}
        if git is not None:
            data["git"] = git                         # docs/GIT.md
        for row, r in zip(data["changes"] + data["dropped"], kept + dropped):
            if r.path_class:
                row["class"] = r.path_class
        if args.syscalls:
            data["syscall_records"] = calls
        dump_json(data)
        return 0
    for line in R.grouped([(r.path_class, _log_line(r)) for r in kept], git):
        print(line)
    if dropped:
        print("dropped (not committed):")
        for line in R.grouped([(r.path_class, _log_line(r)) for r in dropped],
                              R.git_count(sum(1 for r in dropped if r.path_class))):
            print(line)
    if count is not None:
        print(f"syscalls: {count} recorded")
        if args.syscalls:
            _print_syscalls(calls)
    elif args.syscalls:
        print("syscalls: not traced (run with --trace to record them)")
    return 0


def cmd_syscalls(args):
    if not ops.traced(args.sid):
        raise OverlordError(f"session {args.sid} was not run with --trace: no syscalls were recorded")
    calls = ops.syscalls(args.sid)
    if args.json:
        dump_json({"sid": args.sid, "syscalls": len(calls), "syscall_records": calls})
        return 0
    _print_syscalls(calls)
    return 0


def _print_syscalls(calls):
    """pid, seconds since the first record, syscall, = return value, what it did (write, exec,
    connect), then the path it named (or its arguments): one line per syscall, escaped."""
    if not calls:
        return
    t0 = calls[0].get("ts") or 0
    rows = []
    for c in calls:
        ts = c.get("ts")
        ret = c.get("ret")
        what = ",".join(w for w in (c.get("kind"), "write" if c.get("write") else None) if w) or "-"
        shown = c.get("path") if c.get("path") is not None else c.get("args", "")
        rows.append((c.get("pid", "?"), f"+{ts - t0:.6f}" if isinstance(ts, (int, float)) else "?",
                     R.escape_path(str(c.get("syscall", "?"))), "=" + ("?" if ret is None else str(ret)),
                     what, R.escape_path(str(shown)) or "-"))
    print(R.table(rows))


def cmd_commit(args):
    if args.release_held and args.release:
        raise UsageError("--release-held sends every held request; --release ID chooses some: "
                         "give one or the other")
    release = True if args.release_held else list(args.release) if args.release else False
    result = ops.commit(args.sid, force=args.force, merge=args.merge, only=args.only, drop=args.drop,
                        allow_privileged=args.allow_privileged_modes,
                        countersigned=args.countersigned, release_held=release)
    for finding in result.findings:
        print(f"overlord: note: {R.finding_line(finding)}", file=sys.stderr)
    merged = f", {len(result.merged)} merged" if result.merged else ""
    signed = (f", countersigned by review #{result.countersigned['n']}"
              if result.countersigned else "")
    print(f"committed {args.sid}: {R.summarize(result.changes)}{merged}{signed}")
    for line in R.held_outcome_lines(result.released, result.dropped_held):
        print(line)
    if result.egress_error:
        print(f"overlord: held requests: {R.escape_text(result.egress_error)}", file=sys.stderr)
        return 1
    return 0


def cmd_revert(args):
    new = ops.revert(args.sid, stack=args.stack)
    if args.json:
        print(json_line(session_json(new, ops.get_session(new).meta["state"], ops.diff(new),
                                     layer=0, reverts=args.sid)))
        return 0
    print(f"session {new}")
    return 0


def cmd_rollback(args):
    meta = ops.rollback(args.sid)
    print(f"rolled back {args.sid}")
    for line in R.held_outcome_lines((), meta.get("dropped_held")):
        print(line)
    return 0


def _savepoint_number(value, flag):
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{flag} takes a savepoint number, not {value!r}") from None


def cmd_savepoints(args):
    points = ops.savepoints(args.sid)
    if args.json:
        from overlord.ops.shapes import savepoint_json
        dump_json([savepoint_json(p) for p in points])
        return 0
    for p in points:
        n = p["paths"]
        shared = (f"  (+{len(p['causes']) - 1} more causes share this savepoint: the stack "
                  "limit was reached)" if p["coarse"] else "")
        if p["pinned"]:
            shared += ("  (a process outside the command still held the mount when it was "
                       "sealed: later writes through it may be in this savepoint)")
        print(f"@{p['n']}  {n} path{'' if n == 1 else 's'}  "
              f"{R.escape_path(R.cause_text(p['cause']))}{shared}")
    return 0


def cmd_rewind(args):
    to = _savepoint_number(args.to, "--to")
    dropped = ops.rewind(args.sid, to)
    print(f"rewound {args.sid} to @{to}: {len(dropped)} savepoint{'' if len(dropped) == 1 else 's'} dropped")
    return 0


def cmd_fork(args):
    at = _savepoint_number(args.at, "--at")
    new = ops.fork(args.sid, at)
    if args.json:
        print(json_line(session_json(new, ops.get_session(new).meta["state"], ops.diff(new),
                                     layer=at, forked_from={"sid": args.sid, "layer": at})))
        return 0
    print(f"session {new}")
    return 0


def cmd_compare(args):
    rows = ops.compare(args.a, args.b)
    if args.json:
        from overlord.ops.shapes import compare_json
        dump_json(compare_json(rows))
        return 0
    for p, status in rows:
        print(f"{status}  {R.escape_path(p)}")
    return 0


def cmd_blame(args):
    result = ops.blame(args.path)
    if args.json:
        R.dump_json(result)
        return 0
    labels = [R.owner_text(line["owner"]) for line in result["lines"]]
    width = max((len(lb) for lb in labels), default=0)
    digits = len(str(len(labels)))
    for lb, line in zip(labels, result["lines"]):
        print(f"{lb.ljust(width)}  {str(line['n']).rjust(digits)}  {R.escape_text(line['text'])}")
    return 0


def cmd_doctor(args):
    report = ops.doctor()
    if args.json:
        dump_json({"backends": {n: {"available": ok, "reason": why} for n, (ok, why) in
                                  report.backends.items()},
                     "active": report.active, "tools": report.tools, "home": report.home,
                     "in_jail": report.in_jail,
                     "containment": {n.replace(" ", "_"): {"available": ok, "detail": d}
                                     for n, (ok, d) in report.containment.items()},
                     "coarse": [{"sid": sid, "detail": d} for sid, d in report.coarse],
                     "fuse_containment": {"hidden": report.fuse_containment[0],
                                          "detail": report.fuse_containment[1]}
                     if report.fuse_containment else None, "audit": report.audit,
                     "daemon": report.daemon, "connectors": report.connectors})
        return 0
    if report.in_jail:
        print("inside an OVERLORD jail: backends read as blocked because a jail cannot be nested")
    for name, (ok, why) in report.backends.items():
        why = R.escape_text(str(why))         # a probe's reason may quote a tool's stderr
        print(f"{name} backend ({why}): available" if ok else f"{name} backend: unavailable ({why})")
    if report.fuse_containment:
        print(f"fuse containment: {report.fuse_containment[1]}")
    print(f"active backend: {report.active or 'none'}")
    for name, (ok, detail) in report.containment.items():
        print(f"{name}: {'yes' if ok else 'no'} ({detail})")
    for tool, path in report.tools.items():
        print(f"{tool}: {R.escape_path(path) if path else 'not found'}")
    print(f"home: {R.escape_path(report.home)}")
    d = report.daemon                # whether a daemon answers ping on the default socket
    if d:
        where = R.escape_path(d["socket"])
        print(f"daemon: running on {where} (pid {d['pid']})" if d["pid"] else
              f"daemon: {'running' if d['running'] else 'not running'} ({where}: "
              f"{R.escape_text(str(d['detail']))})")
    print(_face("audit_cmds").doctor_line(report.audit))
    c = report.connectors
    if c and c.get("error"):
        print(f"connectors: {R.escape_text(c['error'])}")
    elif c:
        names = ", ".join(R.escape_path(n) for n in c["servers"]) or "none configured (overlord mcp add)"
        print(f"connectors: {names}; approval {c['approval']}")
    for sid, detail in report.coarse:
        print(f"coarser savepoints in {sid}: {detail}")
    return 0 if report.active else 1


COMMANDS = {"savepoints": cmd_savepoints, "rewind": cmd_rewind, "fork": cmd_fork,
            "compare": cmd_compare, "shell": cmd_shell, "sessions": cmd_sessions, "diff": cmd_diff, "log": cmd_log,
            "commit": cmd_commit, "syscalls": cmd_syscalls, "blame": cmd_blame, "revert": cmd_revert, "rollback": cmd_rollback, "doctor": cmd_doctor}
