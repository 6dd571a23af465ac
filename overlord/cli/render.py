"""Turning results into text a person reads, or JSON a script reads."""
import json
import sys
import time

from overlord.text import escape_block, escape_path, escape_text  # noqa: F401 (re-exported)


def short(digest):
    return digest[:12] if digest else "-"


def dump_json(data):
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def summarize(changes):
    """'3 changes (1 added, 2 modified)' or 'no changes'."""
    if not changes:
        return "no changes"
    counts = {}
    for ch in changes:
        counts[ch.kind] = counts.get(ch.kind, 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in counts.items())
    return f"{len(changes)} change{'s' if len(changes) != 1 else ''} ({parts})"


def cause_text(cause):
    if not cause:
        return ""
    if cause.get("kind") == "command":
        return cause.get("command", "")
    if "turn" in cause or "tool" in cause:
        head = " ".join(str(cause[k]) for k in ("turn", "tool", "call") if cause.get(k) is not None)
        head = f"turn {head}" if "turn" in cause else head
        return f"{head}: {cause['summary']}" if cause.get("summary") else head
    if cause.get("kind") == "revert":
        return f"revert of {cause.get('of')}"
    return cause.get("summary") or json.dumps(cause, sort_keys=True)


def owner_text(owner, width=60):
    """A blame owner in one cell: origin / drift / unknown, or session @layer and cause."""
    if isinstance(owner, str):
        return owner
    brief = {k: v for k, v in owner.items() if k != "summary"}     # the call id says which
    text = f"{owner['sid']} @{owner['layer']} {cause_text(brief)}".rstrip()
    return text if len(text) <= width else text[:width - 1] + "…"


def when(ts):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def table(rows):
    """Left-aligned columns separated by two spaces; the last column is never padded."""
    if not rows:
        return ""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        cells = [str(c).ljust(w) for c, w in zip(r, widths)] + [str(r[-1])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
