"""`overlord policy show|check|set`: parse, call overlord.ops, render."""
import json

from overlord import ops
from overlord.cli import render as R
from overlord.text import jsonable


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("policy", help="per-folder policy: show the effective rule, check or set it",
                       description="OVERLORD_HOME/policy.json: what sessions on a folder may be "
                       "granted (jail, net, timeout, limits) and what a commit to it must satisfy "
                       "(allow_force, require_review, protect, checks). docs/POLICY.md has the keys.")
    ps = p.add_subparsers(dest="policy_command", metavar="ACTION", parser_class=type(p))
    ps.required = True
    s = ps.add_parser("show", help="the effective rule for a folder, and where each value came from",
                      description="One line per key: the value in force for the folder and its "
                      "source (built-in, default, or targets[/path], the longest containing target "
                      "first).")
    s.add_argument("-t", "--target", metavar="DIR", help="the folder (default: .)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    c = ps.add_parser("check", help="validate a policy file (default: the live one)",
                      description="Validate FILE (default: OVERLORD_HOME/policy.json): exit 0 "
                      "when it is usable, 1 with one line naming the problem.")
    c.add_argument("file", nargs="?", metavar="FILE", help="the file to validate")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    t = ps.add_parser("set", help="validate FILE, then install it as the live policy",
                      description="Validate FILE and install it atomically as "
                      "OVERLORD_HOME/policy.json (0600); the change goes on the audit chain "
                      "(policy.change).")
    t.add_argument("file", metavar="FILE", help="the new policy")
    t.add_argument("--json", action="store_true", help="machine-readable output")


def _value(value):
    if value is None:
        return "-"
    if isinstance(value, str):
        return R.escape_text(value)
    return R.escape_text(json.dumps(value, ensure_ascii=False))


def cmd_policy(args):
    return {"show": _show, "check": _check, "set": _set}[args.policy_command](args)


def _show(args):
    view = ops.policy_show(args.target)
    if args.json:
        R.dump_json(jsonable({"target": view.target, "file": view.file, "exists": view.exists,
                              "sha256": view.sha256, "matched": view.matched, "rule": view.rule,
                              "sources": view.sources}))
        return 0
    rows = []
    for key, value in view.rule.items():
        where = view.sources[key]
        if isinstance(where, dict):
            rows.extend((f"{key}.{inner}", _value(value[inner]), R.escape_path(where[inner]))
                        for inner in sorted(value))
            if not value:
                rows.append((key, "-", "built-in"))
        else:
            rows.append((key, _value(value), R.escape_path(where)))
    print(f"policy for {R.escape_path(view.target)}: "
          + (f"{R.escape_path(view.file)} (sha256 {view.sha256[:12]})" if view.exists
             else f"no policy file ({R.escape_path(view.file)}): built-in values"))
    print(R.table(rows))
    return 0


def _check(args):
    result = ops.policy_check(args.file)
    if args.json:
        R.dump_json(jsonable(dict(result, ok=True)))
        return 0
    n = len(result["targets"])
    what = f"{n} target{'' if n == 1 else 's'}" if result["exists"] else "no file: built-in values"
    print(f"ok  {R.escape_path(result['file'])}  ({what})")
    return 0


def _set(args):
    result = ops.policy_set(args.file)
    if args.json:
        R.dump_json(jsonable(result))
        return 0
    if result["changed"]:
        print(f"installed {R.escape_path(result['file'])} (sha256 {result['sha256'][:12]})")
    else:
        print(f"unchanged {R.escape_path(result['file'])} (sha256 {result['sha256'][:12]})")
    return 0


COMMANDS = {"policy": cmd_policy}
