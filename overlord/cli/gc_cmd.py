"""`overlord gc [--dry-run] [--keep-days N] [--keep-last N] [--json]`: retention.

Prunes finished session records older than --keep-days (the newest --keep-last committed
kept regardless), the objects and packs no remaining record names, packs a crash left without
their index, lock files nobody holds, stale holds, temp files and cgroups left behind. Never a
pending or running session, a held one, the audit log, the ledger or any key. docs/RETENTION.md.
"""
from overlord.cli import render as R
from overlord.errors import UsageError


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser(
        "gc", help="prune old finished records and what nothing refers to any more",
        description="Remove finished sessions (committed, rolled-back, timed-out, unchanged, "
        "imported) that finished more than --keep-days ago from OVERLORD_HOME/sessions (the "
        "newest --keep-last committed sessions stay whatever their age), then the objects and "
        "packs under OVERLORD_HOME/objects that no remaining record names (blame, revert and "
        "the kept diff go on working for every kept session), packs left without an index by "
        "an undone commit, lock files in OVERLORD_HOME/locks nobody holds, stale holds, temp "
        "files and cgroups a crash left. Never a pending or running session, one a bundle "
        "import holds, the audit log, the ledger, keys or the memory journal. A run is audited "
        "(gc.run, with its counts and bytes); --dry-run changes nothing and is not audited. "
        "packaging/overlord-gc.timer runs it nightly. docs/RETENTION.md.")
    p.add_argument("--dry-run", action="store_true",
                   help="list exactly what would go, with sizes; change nothing")
    p.add_argument("--keep-days", metavar="N", default=None,
                   help="keep finished sessions younger than N days (default 30; 0: none)")
    p.add_argument("--keep-last", metavar="N", default=None,
                   help="keep the newest N committed sessions regardless of age (default 10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _number(value, flag):
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise UsageError(f"{flag} must be a whole number, 0 or more, not {value!r}")
    return int(text)


def cmd_gc(args):
    from overlord import ops
    report = ops.gc(dry_run=args.dry_run, keep_days=_number(args.keep_days, "--keep-days"),
                    keep_last=_number(args.keep_last, "--keep-last"))
    if args.json:
        R.dump_json(report)
        return 0
    verb = "would remove" if report["dry_run"] else "removed"
    e = R.escape_text
    rows = []
    for s in report["sessions"]:
        age = "-" if s.get("age_days") is None else f"{s['age_days']:.1f}d"
        rows.append(("session", s["sid"], s["state"], age, _size(s["bytes"]),
                     R.escape_path(s["target"] or "-")))
    for o in report["objects"]:
        rows.append(("object", R.short(o["sha"]), "loose", "-", _size(o["bytes"]), ""))
    for k in report["packs"]:
        rows.append(("pack", k["name"], k["why"], "-", _size(k["bytes"]), ""))
    for kind, key in (("lock", "locks"), ("hold", "holds"), ("temp", "tmp")):
        for i in report[key]:
            rows.append((kind, e(i["name"]), "stale", "-", _size(i["bytes"]), ""))
    for c in report["cgroups"]:
        rows.append(("cgroup", c["sid"], "left", "-", "-", R.escape_path(c["path"])))
    if rows:
        print(R.table([("WHAT", "NAME", "STATE", "AGE", "SIZE", "TARGET")] + rows))
    counts, sizes = report["counts"], report["bytes"]
    parts = [f"{counts[k]} {k}" for k in ("sessions", "objects", "packs", "locks", "holds",
                                          "tmp", "cgroups") if counts[k]]
    print(f"gc: {verb} {', '.join(parts) or 'nothing'} ({_size(sizes['total'])}); "
          f"keep-days {report['keep_days']}, keep-last {report['keep_last']}")
    kept = report.get("kept") or {}
    if kept:
        print("kept: " + ", ".join(f"{n} {why}" for why, n in sorted(kept.items())))
    if report.get("objects_deferred"):
        print(f"objects not pruned: {report['objects_deferred']}")
    for note in report.get("notes") or ():
        print(f"note: {e(note)}")
    for s in report.get("skipped") or ():
        print(f"skipped {s['kind']} {e(str(s['name']))}: {e(s['why'])}")
    return 0


COMMANDS = {"gc": cmd_gc}
