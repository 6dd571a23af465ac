"""Retention: `overlord gc` plans what finished records, objects, packs, locks and leftovers
may go (trust/retention.py), and removes them unless it is a dry run. docs/RETENTION.md."""
from overlord.trust import audit, retention


def gc(dry_run=False, keep_days=None, keep_last=None, now=None):
    """The report: {"dry_run", "keep_days", "keep_last", kinds..., "counts", "bytes",
    "kept", "notes", "skipped", "objects_deferred"}. A dry run changes nothing and is not
    audited (it is a read, like `overlord sessions`); a run appends `gc.run` with the counts
    and bytes removed. Bad keep values: UsageError before anything is read."""
    keep_days, keep_last = retention.check_keep(keep_days, keep_last)
    if not dry_run:
        audit.ready()           # a chain that cannot be written refuses the act, never skips it
    plan = retention.plan(keep_days=keep_days, keep_last=keep_last, now=now)
    report = plan.as_dict()
    report.update(dry_run=bool(dry_run), skipped=[])
    if dry_run:
        return report
    removed, skipped = retention.prune(plan)
    for kind in retention.Plan.KINDS:
        report[kind] = removed[kind]
    report["skipped"] = skipped
    counts = {k: len(removed[k]) for k in retention.Plan.KINDS}
    sizes = {k: sum(i.get("bytes", 0) for i in removed[k]) for k in retention.Plan.KINDS}
    sizes["total"] = sum(sizes.values())
    report.update(counts=counts, bytes=sizes)
    audit.append("gc.run", keep_days=keep_days, keep_last=keep_last, counts=counts,
                 bytes=sizes["total"], skipped=len(skipped),
                 sessions=[s["sid"] for s in removed["sessions"]][:100])
    return report
