"""`overlord check SID`: the content gate's findings, as commit would judge them."""
from overlord import ops
from overlord.cli import render as R
from overlord.text import jsonable

SEL_HELP = "layer:N, layer:A-B, turn:N, tool:NAME, call:ID (repeatable, or comma-separated)"


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser(
        "check", help="the content gate: secrets, binaries, dependency manifests, size",
        description="What the session adds that the content gate flags: secrets (private key "
        "blocks, cloud and model-provider key shapes, high-entropy values assigned to key/"
        "secret/token/password names), binary files, changed dependency manifests, files over "
        "policy's size_mb. One line per finding: severity (from the policy rule's checks: block "
        "refuses the commit, countersign needs a fresh complete second-model approval, warn "
        "only tells), kind, path:line, what was found; a secret is never shown whole. "
        "docs/GATE.md has the rules.",
        epilog="Exit status: 0 when nothing blocks the commit (countersign and warn findings "
        "included), 1 when a finding blocks it (or on a refusal: an unknown or decided "
        "session), 2 on a usage error.")
    p.add_argument("sid", metavar="SID", help=R.SID_HELP)
    p.add_argument("--only", action="append", default=[], metavar="SEL",
                   help="check only these savepoints: " + SEL_HELP)
    p.add_argument("--drop", action="append", default=[], metavar="SEL",
                   help="check all but these savepoints (same selectors)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_check(args):
    report = ops.check(args.sid, only=args.only, drop=args.drop)
    if args.json:
        R.dump_json(jsonable(report.as_dict()))
        return 1 if report.blocks else 0
    for finding in report.findings:
        print(R.finding_line(finding))
    print(summary(report))
    return 1 if report.blocks else 0


def summary(report):
    """The last line: what the findings mean for a commit."""
    sid = R.escape_path(report.sid)
    if not report.findings:
        return f"check {sid}: no findings"
    parts = []
    if report.blocking:
        parts.append(f"{len(report.blocking)} block{'s' if len(report.blocking) == 1 else ''} "
                     "the commit")
    if report.countersign:
        n = len(report.countersign)
        parts.append(f"{n} need{'s' if n == 1 else ''} a fresh, complete second-model approval")
    if report.warnings:
        n = len(report.warnings)
        parts.append(f"{n} warning{'' if n == 1 else 's'}")
    n = len(report.findings)
    return f"check {sid}: {n} finding{'' if n == 1 else 's'}: {', '.join(parts)}"


COMMANDS = {"check": cmd_check}
