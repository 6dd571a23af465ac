"""The command line: parse, make one call into overlord.ops, render, map errors to exit codes."""
import argparse
import os
import sys

from overlord import __version__, ops
from overlord.cli import agent_cmds
from overlord.cli import ui_cmd
from overlord.cli import render as R
from overlord.errors import OverlordError, UsageError

TRACE_VALUES = ("strace", "ebpf")


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


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


def _sid_command(sub, name, help, json=False, **kw):
    """A subcommand that takes a session id (and, for reports, --json)."""
    p = sub.add_parser(name, help=help, **kw)
    p.add_argument("sid")
    if json:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def build_parser():
    p = Parser(prog="overlord", description="Transactional, attributed execution over a "
               "directory: run, review the change, commit or roll back.")
    p.add_argument("--version", action="version", version=f"overlord {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    r = sub.add_parser("run", help="run a command in a new transactional session",
                       description="Run CMD over a writable copy of the target; nothing touches "
                       "the real tree until commit. Prints 'session <sid>' after the command's "
                       "own output and passes its exit status through (124 on timeout).")
    r.add_argument("-t", "--target", metavar="DIR", help="the tree to work on (default: .)")
    r.add_argument("--backend", choices=("kernel", "fuse"), help="force a backend")
    r.add_argument("--timeout", type=float, metavar="S", help="kill the whole process tree after S seconds")
    r.add_argument("--manifest", metavar="FILE", help="grants from a JSON file (flags override)")
    r.add_argument("--merge-base", action="store_true", default=None,
                   help="keep base copies of touched files so commit --merge can three-way merge")
    r.add_argument("--jail", action="store_true", default=None, help="pivot_root jail (kernel backend)")
    r.add_argument("--net", choices=("none", "host"), help="network grant")
    r.add_argument("--limit", action="append", metavar="KEY=N", default=[],
                   help="resource grant (memory_mb, pids, cpu_pct, disk_mb, fsize_mb, nofile; "
                   "0 = unlimited); repeatable")
    r.add_argument("--trace", metavar="strace|ebpf", help="record syscalls (default recorder: strace)")
    r.add_argument("--wait", action="store_true", help="queue behind a session executing on the target")
    r.add_argument("--stack", action="store_true", help="open even though another session is pending here")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")

    s = sub.add_parser("shell", help="an interactive transactional shell",
                       description="An interactive shell over a writable copy of the target, on a "
                       "real pty. The whole shell is one savepoint. Driven from stdin when stdin "
                       "is not a terminal. Prints the session and a summary on exit.")
    s.add_argument("-t", "--target", metavar="DIR", help="the tree to work on (default: .)")
    s.add_argument("--backend", choices=("kernel", "fuse"), help="force a backend")
    s.add_argument("--stack", action="store_true", help="open even though another session is pending here")
    s.add_argument("--wait", action="store_true", help="queue behind a session executing on the target")

    ss = sub.add_parser("sessions", help="list sessions with state, target and cause")
    ss.add_argument("--json", action="store_true", help="machine-readable output")

    _sid_command(sub, "diff", "what a session changed: added / modified / deleted / replaced-dir",
                 json=True)
    _sid_command(sub, "log", "per-change sha256 before -> after, layer and cause", json=True)

    ex = _sid_command(sub, "exec", "run another command inside a pending session",
                      description="Run CMD inside a pending session, over its current stack. A "
                      "command that writes seals a new savepoint stamped with its command line; "
                      "one that writes nothing adds none. Its exit status is passed through.")
    ex.add_argument("--timeout", type=float, metavar="S", help="kill the command after S seconds")
    ex.add_argument("--wait", action="store_true", help="queue behind a command executing on the target")

    _sid_command(sub, "savepoints", "the layer stack: one savepoint per command that wrote", json=True)
    rw = _sid_command(sub, "rewind", "discard every savepoint above @N")
    rw.add_argument("--to", required=True, metavar="N", help="the savepoint to keep as the top")
    fk = _sid_command(sub, "fork", "a second continuation of a savepoint, as a new session")
    fk.add_argument("--at", required=True, metavar="N", help="the savepoint to fork from")

    cp = sub.add_parser("compare", help="where two sessions diverge, per path")
    cp.add_argument("a")
    cp.add_argument("b")
    cp.add_argument("--json", action="store_true", help="machine-readable output")

    c = _sid_command(sub, "commit", "verify no external drift, replay onto the real tree")
    c.add_argument("--only", action="append", default=[], metavar="SEL",
                   help="replay only these savepoints: layer:N, layer:A-B, turn:N, tool:NAME, call:ID")
    c.add_argument("--drop", action="append", default=[], metavar="SEL",
                   help="replay all but these savepoints (same selectors)")
    c.add_argument("--force", action="store_true", help="commit despite ordinary drift")
    c.add_argument("--merge", action="store_true", help="three-way merge non-overlapping drift "
                   "(needs a session run with --merge-base)")

    _sid_command(sub, "rollback", "discard a session; the target stays byte-identical")

    rv = _sid_command(sub, "revert", "stage the undo of a committed session as a new pending "
                      "session (review it, then commit it)")
    rv.add_argument("--stack", action="store_true", help="open even though another session is pending here")

    bl = sub.add_parser("blame", help="each line of a file with the session, turn and tool call "
                        "that produced it", description="Each line of a committed file with its "
                        "owner: the session, savepoint and cause that first produced it; 'origin' "
                        "for lines older than the record, 'drift' for lines changed outside "
                        "OVERLORD since the last commit.")
    bl.add_argument("path")
    bl.add_argument("--json", action="store_true", help="machine-readable output")

    dr = sub.add_parser("doctor", help="which backends can run here, and why not")
    dr.add_argument("--json", action="store_true", help="machine-readable output")
    agent_cmds.add_parsers(sub)
    ui_cmd.add_parser(sub)
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return dispatch(argv)
    except OverlordError as exc:
        print(f"overlord: {exc}", file=sys.stderr)
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
        print(f"overlord: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug still gets one line, not a traceback
        if os.environ.get("OVERLORD_DEBUG"):
            raise
        print(f"overlord: internal error: {type(exc).__name__}: {exc} "
              "(set OVERLORD_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1


def dispatch(argv):
    head, cmd = _split_command(_normalize_trace(argv))
    args = build_parser().parse_args(head)
    if args.command is None:
        build_parser().print_help()
        return 2
    ops.recover()
    if args.command == "run":
        if cmd is None:
            cmd = [a for a in (args.cmd or []) if a != "--"]
        elif args.cmd:
            raise UsageError(f"unexpected arguments before --: {' '.join(args.cmd)}")
        return cmd_run(args, cmd)
    if args.command == "exec":
        if not cmd:
            raise UsageError("missing command after --")
        return ops.exec_in(args.sid, cmd, timeout=args.timeout, wait=args.wait).exit_code
    if cmd is not None:
        raise UsageError(f"'{args.command}' takes no command after --")
    return {**COMMANDS, **agent_cmds.COMMANDS, **ui_cmd.COMMANDS}[args.command](args)


def _grants(args):
    manifest = ops.load_manifest(args.manifest) if getattr(args, "manifest", None) else {}
    flags = {"jail": getattr(args, "jail", None), "net": getattr(args, "net", None),
             "timeout": getattr(args, "timeout", None), "merge_base": getattr(args, "merge_base", None)}
    return ops.merge_grants(manifest, flags, getattr(args, "limit", ()))


def cmd_run(args, cmd):
    if not cmd:
        raise UsageError("missing command after --")
    result = ops.run(cmd, target=args.target, backend=args.backend, grants=_grants(args),
                     trace=args.trace, wait=args.wait, stack=args.stack)
    _print_session_line(result)
    return result.exit_code


def _print_session_line(result):
    sys.stdout.flush()
    extra = " (timed out)" if result.timed_out else ""
    print(f"session {result.sid}  {result.state}  {R.summarize(result.changes)}; "
          f"exit {result.exit_code}{extra}", flush=True)


def cmd_shell(args):
    from overlord.cli.shell import run_shell
    result = run_shell(args)
    _print_session_line(result)
    return result.exit_code


def cmd_sessions(args):
    metas = ops.sessions()
    if args.json:
        R.dump_json([{k: m.get(k) for k in ("sid", "state", "target", "backend", "command",
                                            "created", "exit_code", "grants")} |
                     {"layers": len(m.get("layers", []))} for m in metas])
        return 0
    rows = [(m["sid"], m.get("state", "?"), m.get("backend", "?"), R.escape_path(m.get("target", "")),
             R.escape_path(m.get("command", "")) or "-") for m in metas]
    if rows:
        print(R.table(rows))
    return 0


def cmd_diff(args):
    changes = ops.diff(args.sid)
    if args.json:
        R.dump_json([{"path": ch.path, "kind": ch.kind, "layer": ch.layer} for ch in changes])
        return 0
    for ch in changes:
        print(f"{ch.kind}  {R.escape_path(ch.path)}")
    return 0


def cmd_log(args):
    records = ops.log(args.sid)
    meta = ops.get_session(args.sid).meta
    count = len(ops.syscalls(args.sid)) if meta.get("trace") else None
    if args.json:
        R.dump_json({"sid": args.sid, "syscalls": count, "changes": [
            {"path": r.path, "kind": r.kind, "before": r.before, "after": r.after,
             "layer": r.layer, "caused_by": r.caused_by} for r in records]})
        return 0
    for r in records:
        print(f"{r.kind}  {R.escape_path(r.path)}  {R.short(r.before)} -> {R.short(r.after)}")
    if count is not None:
        print(f"syscalls: {count} recorded")
    return 0


def cmd_commit(args):
    result = ops.commit(args.sid, force=args.force, merge=args.merge, only=args.only, drop=args.drop)
    merged = f", {len(result.merged)} merged" if result.merged else ""
    print(f"committed {args.sid}: {R.summarize(result.changes)}{merged}")
    return 0


def cmd_revert(args):
    print(f"session {ops.revert(args.sid, stack=args.stack)}")
    return 0


def cmd_rollback(args):
    ops.rollback(args.sid)
    print(f"rolled back {args.sid}")
    return 0


def _savepoint_number(value, flag):
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{flag} takes a savepoint number, not {value!r}") from None


def cmd_savepoints(args):
    points = ops.savepoints(args.sid)
    if args.json:
        R.dump_json(points)
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
    print(f"session {ops.fork(args.sid, _savepoint_number(args.at, '--at'))}")
    return 0


def cmd_compare(args):
    rows = ops.compare(args.a, args.b)
    if args.json:
        R.dump_json([{"path": p, "status": status} for p, status in rows])
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
        R.dump_json({"backends": {n: {"available": ok, "reason": why} for n, (ok, why) in
                                  report.backends.items()},
                     "active": report.active, "tools": report.tools, "home": report.home,
                     "in_jail": report.in_jail,
                     "containment": {n: {"available": ok, "detail": d}
                                     for n, (ok, d) in report.containment.items()},
                     "coarse": [{"sid": sid, "detail": d} for sid, d in report.coarse]})
        return 0
    if report.in_jail:
        print("inside an OVERLORD jail: backends read as blocked because a jail cannot be nested")
    for name, (ok, why) in report.backends.items():
        print(f"{name} backend ({why}): available" if ok else f"{name} backend: unavailable ({why})")
    print(f"active backend: {report.active or 'none'}")
    for name, (ok, detail) in report.containment.items():
        print(f"{name}: {'yes' if ok else 'no'} ({detail})")
    for tool, path in report.tools.items():
        print(f"{tool}: {path or 'not found'}")
    print(f"home: {R.escape_path(report.home)}")
    for sid, detail in report.coarse:
        print(f"coarser savepoints in {sid}: {detail}")
    return 0 if report.active else 1


COMMANDS = {"savepoints": cmd_savepoints, "rewind": cmd_rewind, "fork": cmd_fork,
            "compare": cmd_compare, "shell": cmd_shell, "sessions": cmd_sessions, "diff": cmd_diff, "log": cmd_log,
            "commit": cmd_commit, "blame": cmd_blame, "revert": cmd_revert, "rollback": cmd_rollback, "doctor": cmd_doctor}
