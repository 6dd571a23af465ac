"""Turning results into text a person reads, or JSON a script reads."""
import json
import os
import sys
import time

from overlord.text import (cause_text, escape_block, escape_path, escape_text,  # noqa: F401
                           finding_line)                                       # (re-exported)

# What a command may have left a terminal in, undone: attributes (SGR 0: colours, SGR 8 hidden
# text), the G0 character set shifted in and set to ASCII (SI, ESC ( B: no line-drawing glyphs),
# insert mode off, autowrap and the cursor back on.
TERMINAL_RESET = "\x1b[0m\x0f\x1b(B\x1b[4l\x1b[?7h\x1b[?25h"

# What SID means in every --help.
SID_HELP = ("a session id as `overlord sessions` lists it, e.g. 20261201-074714-3fa2c1, or "
            "`last` for the newest session")


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


def git_lines(summary):
    """The git summary (ops.git_summary) as lines, one per repository, escaped: ref names and
    paths came from the session."""
    return [escape_text(repo.get("line", "")) for repo in (summary or {}).get("repos", ())]


def git_notable(summary):
    """The paths under .git/ a person reads whole (config, hooks): what runs on the host once
    committed."""
    out = set()
    for repo in (summary or {}).get("repos", ()):
        for item in repo.get("config", []) + repo.get("hooks", []):
            out.add(f"{repo['dir']}/{item['path']}")
    return out


def git_count(n):
    """A summary that only counts paths (the dropped part of a partial commit)."""
    return {"repos": [{"line": f"git: {n} path{'s' if n != 1 else ''} under .git/"}]} if n else None


def grouped(lines, summary):
    """[(path class, line)] with the git-class lines replaced by the summary's lines, at the
    place of the first of them (at the end when only left-out lock files are said)."""
    out, said = [], False
    for cls, text in lines:
        if cls != "git":
            out.append(text)
        elif not said:
            out.extend(git_lines(summary))
            said = True
    if not said:
        out.extend(git_lines(summary))
    return out


def owner_text(owner, width=60):
    """A blame owner in one cell: origin / drift / unknown, or session @layer and cause.
    The cause (a command line, a model's call id) is escaped: a command or a model chose it."""
    if isinstance(owner, str):
        return escape_path(owner)
    brief = {k: v for k, v in owner.items() if k not in ("summary", "imported")}  # the call id says which
    imported = owner.get("imported")
    whose = (f" [imported from {imported.get('from')}{'' if imported.get('verified') else ', UNVERIFIED'}]"
             if isinstance(imported, dict) else "")
    text = escape_path(f"{owner['sid']} @{owner['layer']} {cause_text(brief)}".rstrip() + whose)
    return text if len(text) <= width else text[:width - 1] + "…"


def session_cause(meta):
    """The last column of `sessions`: what made the session (escaped), `fork of SID@N` for a
    fork."""
    fork = meta.get("forked_from")
    if fork:
        return f"fork of {escape_path(str(fork.get('sid')))}@{fork.get('at')}"
    return escape_path(meta["command"]) if meta.get("command") else "-"


def exit_text(code, timed_out=False, limit=None):
    """`exit N`, with why OVERLORD ended the command: `exit 124 (timed out)`,
    `exit 122 (disk grant of 5 MiB reached)`. limit: (grant name, value) the command crossed."""
    if timed_out:
        return f"exit {code} (timed out)"
    if limit and limit[0] == "disk_mb":
        return f"exit {code} (disk grant of {limit[1]} MiB reached)"
    if limit:
        return f"exit {code} ({limit[0]} grant of {limit[1]} reached)"
    return f"exit {code}"


def error_line(exc):
    """`overlord: <what went wrong>` on one line: a message may quote a path or a reason a
    command or a model chose, so every control character in it is escaped."""
    return "overlord: " + escape_text(str(exc)).replace("\t", "\\t")


def own_line_prefix(stream):
    """What to write before OVERLORD's own line on stream once a command has had the terminal:
    on a terminal, the reset above and a fresh line (so SGR 8, colours or a trailing CR in
    the command's output cannot hide or overwrite the line); elsewhere (a pipe, a file) nothing,
    so scripts read exactly the lines they expect.

    The fresh line costs no blank line: a row of spaces as wide as the terminal wraps only when
    the cursor is past column 0, then CR and erase-to-end-of-line clean up what it drew."""
    try:
        if not stream.isatty():
            return ""
        columns = os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return ""
    return TERMINAL_RESET + " " * columns + "\r\x1b[K"


def cli_actor():
    """Who acts, for the record, when a person acts at the CLI: cli:<the OS user>."""
    import pwd
    try:
        name = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        name = str(os.getuid())
    return f"cli:{name}"


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


# -- recorded egress (docs/EGRESS.md) ---------------------------------------------------------
# Every host, path, method, header and reason below was chosen by a sandboxed program or a
# remote server: each is escaped, and cut to a cell's width where a table holds it.

def _cell(value, width=None):
    if value is None or value == "":
        return "-"
    text = escape_path(str(value))
    if width and len(text) > width:
        text = text[:width - 1] + "…"
    return text


def _ms(value):
    return f"{value:.0f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def egress_rows(connections):
    """The connection table of `overlord egress`: a header row, then one row per line of the
    session's egress.jsonl."""
    rows = [("TIME", "HOST", "PORT", "METHOD", "PATH", "ALLOWED", "STATUS", "UP", "DOWN", "MS",
             "CMD")]
    for c in connections:
        ts = c.get("ts")
        stamp = (time.strftime("%H:%M:%S", time.localtime(ts))
                 if isinstance(ts, (int, float)) and not isinstance(ts, bool) else "-")
        allowed = {True: "yes", False: "REFUSED"}.get(c.get("allowed"), "-")
        if c.get("held"):
            allowed = f"held {_cell(c['held'], 12)}"
        layer, cause = c.get("layer"), c.get("cause")
        cmd = (f"@{layer} " if isinstance(layer, int) and not isinstance(layer, bool) else "") \
            + (_cell(cause, 50) if cause else "")
        rows.append((stamp, _cell(c.get("host"), 60), _cell(c.get("port")),
                     _cell(c.get("method"), 12), _cell(c.get("path"), 60), allowed,
                     _cell(c.get("status")), _cell(c.get("bytes_up")), _cell(c.get("bytes_down")),
                     _ms(c.get("duration_ms")), cmd.strip() or "-"))
    return rows


def held_lines(held):
    """The HELD REQUESTS block: per masked held record (overlord.sandbox.egress.masked), a line
    `ID  METHOD  URL  STATE[ STATUS]` and its headers (credentials masked) and body indented."""
    out = []
    for r in held:
        state = _cell(r.get("state"))
        if r.get("status") is not None:
            state += f" {_cell(r.get('status'))}"
        if r.get("error"):
            state += f" ({_cell(r.get('error'), 120)})"
        out.append(f"{_cell(r.get('id'), 16)}  {_cell(r.get('method'), 12)}  "
                   f"{_cell(r.get('url'), 200)}  {state}")
        for header in r.get("headers") or ():
            if isinstance(header, (list, tuple)) and len(header) == 2:
                out.append(f"    {_cell(header[0], 80)}: {_cell(header[1], 200)}")
        body = r.get("body") if r.get("body") is not None else r.get("body_preview")
        size = r.get("bytes")
        if body or size:
            shown = f" {_cell(body, 200)}" if body else ""
            out.append(f"    body ({_cell(size)} bytes){shown}")
    return out


def held_outcome_lines(released, dropped):
    """What commit (or rollback) did with the held requests: one line per request sent, with
    the status it got (or why it failed), then one line for the ones dropped."""
    out = []
    for r in released or ():
        got = (f"-> {_cell(r.get('status'))}" if r.get("status") is not None
               else f"failed: {_cell(r.get('error'), 200)}")
        where = r.get("url") or f"{r.get('host') or ''}{r.get('path') or ''}"
        out.append(f"released {_cell(r.get('id'), 16)}  {_cell(r.get('method'), 12)}  "
                   f"{_cell(where, 200)}  {got}")
    dropped = list(dropped or ())
    if dropped:
        n = len(dropped)
        out.append(f"dropped {n} held request{'s' if n != 1 else ''}: "
                   + ", ".join(_cell(i, 16) for i in dropped))
    return out
