"""`overlord egress SID [--json]`: what a `--net proxy` session talked to (docs/EGRESS.md)."""
from overlord.cli import render as R
from overlord.cli.render import SID_HELP


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser(
        "egress", help="what a --net proxy session talked to, and its held requests",
        description="Every connection a --net proxy session's commands made through OVERLORD's "
        "proxy, oldest first: time, host, port, method (CONNECT for a tunnel, whose path and "
        "content stay unseen), path (plain HTTP), allowed, the status the proxy answered, bytes "
        "up and down, milliseconds and the command (@layer and cause) that made it; then the "
        "requests --hold-writes held (credentials masked), which commit --release-held / "
        "--release ID sends and commit or rollback otherwise drops. docs/EGRESS.md.")
    p.add_argument("sid", metavar="SID", help=SID_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_egress(args):
    from overlord import ops
    report = ops.egress_report(args.sid)
    if args.json:
        from overlord.text import jsonable
        R.dump_json(jsonable(report))
        return 0
    s = report["summary"]
    allow = ", ".join(R.escape_path(a) for a in report["allow"]) or "any public host (recorded)"
    grant = f"net {report['net']}"
    if report["net"] == "proxy":
        grant += f"; allow {allow}" + ("; writes held" if report["hold_writes"] else "")
    print(f"egress of {report['sid']} ({grant}): {s['connections']} connection"
          f"{'' if s['connections'] == 1 else 's'}, {s['refused']} refused, "
          f"{s['bytes_up']} bytes up, {s['bytes_down']} bytes down")
    if report["connections"]:
        print(R.table(R.egress_rows(report["connections"])))
    elif report["net"] != "proxy":
        print(f"(nothing recorded: the session's network is {report['net']}, not proxy)")
    if report["held"]:
        counts = [f"{s[k]} {k}" for k in ("held", "released", "dropped", "failed") if s.get(k)]
        print("")
        print(f"HELD REQUESTS ({', '.join(counts)})")
        for line in R.held_lines(report["held"]):
            print(line)
        if s["held"]:
            print(f"(overlord commit {report['sid']} --release-held sends them in order, "
                  "--release ID chooses; commit or rollback otherwise drops them)")
    return 0


COMMANDS = {"egress": cmd_egress}
