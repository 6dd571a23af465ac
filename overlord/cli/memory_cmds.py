"""`overlord memory show|user|journal|proposals|accept`: parse, call overlord.ops, render.

`memory show` writes exactly the text an agent session on the folder would be told before
message one on stdout (escaped for the terminal only where a byte would act on it: control
characters other than newline and tab), and what it was built from on stderr, so
`overlord memory show > told.txt` keeps the text alone."""
import os
import sys

from overlord import ops
from overlord.cli import render as R
from overlord.errors import UsageError
from overlord.text import jsonable


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("memory", help="what the agent is told before message one; accept its notes",
                       description="Three sources go into an agent's system prompt, each capped "
                       "(newest kept, the cut said): OVERLORD.md at the folder's root (the agent "
                       "extends it inside the session with `remember`), your notes "
                       "(OVERLORD_HOME/memory.md: the agent only proposes, you accept) and the "
                       "folder's journal of committed agent sessions. docs/MEMORY.md.")
    ps = p.add_subparsers(dest="memory_command", metavar="ACTION", parser_class=type(p))
    ps.required = True
    s = ps.add_parser("show", help="exactly the memory text an agent on the folder is told",
                      description="Print the memory section an agent session opened on DIR now "
                      "would get in its system prompt (stdout), and its sources, sizes, cuts "
                      "and sha256 (stderr).")
    s.add_argument("-t", "--target", metavar="DIR", help="the folder (default: .)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    u = ps.add_parser("user", help="show or change your notes (OVERLORD_HOME/memory.md)",
                      description="Without an option: print your notes. Each change is atomic "
                      "and goes on the audit chain (memory.edit, with its sha256 and size).")
    g = u.add_mutually_exclusive_group()
    g.add_argument("--add", metavar="NOTE", help="append one note (a list item)")
    g.add_argument("--edit", action="store_true", help="edit them in $VISUAL / $EDITOR")
    g.add_argument("--set-from", metavar="FILE", help="replace them with FILE's text ('-': stdin)")
    u.add_argument("--json", action="store_true", help="machine-readable output")
    j = ps.add_parser("journal", help="the folder's journal of committed agent sessions",
                      description="One line per committed agent session on DIR, oldest first: "
                      "the task, the files committed, and what the model said it did (its own "
                      "claim, not verified). Rolled-back and plain `run` sessions leave none.")
    j.add_argument("-t", "--target", metavar="DIR", help="the folder (default: .)")
    j.add_argument("--json", action="store_true", help="machine-readable output")
    q = ps.add_parser("proposals", help="the notes an agent proposed in a session",
                      description="Each `remember {scope: user}` of the session: its id, whether "
                      "it was accepted (and by whom), the note.")
    q.add_argument("sid", metavar="SID", help=R.SID_HELP)
    q.add_argument("--json", action="store_true", help="machine-readable output")
    a = ps.add_parser("accept", help="append an agent's proposed notes to your notes",
                      description="Append the session's proposals N... (or --all) to "
                      "OVERLORD_HOME/memory.md; recorded in the session's transcript "
                      "(memory_accepted) and on the audit chain (memory.accept). A proposal "
                      "already accepted is said and skipped; an id the session never proposed "
                      "changes nothing.")
    a.add_argument("sid", metavar="SID", help=R.SID_HELP)
    a.add_argument("ids", nargs="*", metavar="N", help="proposal ids")
    a.add_argument("--all", action="store_true", help="every proposal of the session")
    a.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_memory(args):
    return {"show": _show, "user": _user, "journal": _journal, "proposals": _proposals,
            "accept": _accept}[args.memory_command](args)


def _show(args):
    told = ops.memory_show(args.target)
    if args.json:
        R.dump_json(jsonable(told))
        return 0
    if told["text"]:
        sys.stdout.write(R.escape_block(told["text"]) + "\n")
        sys.stdout.flush()
    lines = [f"memory sha256 {told['sha256']}" + ("" if told["text"] else " (nothing to tell)")]
    for s in told["sources"]:
        if s.get("warning"):
            state = "not read: " + R.escape_text(s["warning"])
        elif s["sha256"] is None:
            state = "none"
        else:
            state = f"{s['bytes']} bytes, {s['shown']} shown (cap {s['cap']})"
            if s["cut"]:
                state += f", {s['cut']} older bytes cut"
            if s["name"] == "journal":
                state += f", {s.get('entries_shown')} of {s.get('entries')} entries"
            state += f", sha256 {s['sha256'][:12]}"
            if s.get("sha256_of") == "window":
                state += f" (of the last {s['read'][1] - s['read'][0]} bytes, all that was read)"
        lines.append(f"  {s['name']:<8} {R.escape_path(s['path'])}: {state}")
    sys.stderr.write("\n".join(lines) + "\n")
    return 0


def _user(args):
    if args.add is not None:
        view = ops.memory_user_add(args.add, by=R.cli_actor())
        said = "added a note to"
    elif args.set_from is not None:
        view = ops.memory_user_set(_read_from(args.set_from), by=R.cli_actor())
        said = "replaced"
    elif args.edit:
        view, said = _edit()
    else:
        view, said = ops.memory_user(), None
    if args.json:
        R.dump_json(jsonable(view))
        return 0
    if said:
        print(f"{said} {R.escape_path(view['path'])} ({view['bytes']} bytes, sha256 "
              f"{view['sha256'][:12] if view['sha256'] else '-'})")
        return 0
    if not view["exists"]:
        print(f"no notes yet ({R.escape_path(view['path'])}); add one with "
              "`overlord memory user --add NOTE`")
        return 0
    text = view["text"]
    sys.stdout.write(R.escape_block(text) + ("" if text.endswith("\n") or not text else "\n"))
    if view["bytes"] > view["cap"]:
        sys.stderr.write(f"{view['bytes']} bytes: an agent is told the newest {view['cap']}\n")
    return 0


def _read_from(name):
    try:
        if name == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(name, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror}") from None
    return data.decode("utf-8", "surrogateescape")


def _edit():
    import shlex
    import subprocess
    import tempfile
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
    if not editor:
        raise UsageError("set $VISUAL or $EDITOR to edit your notes (or use --set-from FILE)")
    before = ops.memory_user()
    fd, path = tempfile.mkstemp(prefix="overlord-memory-", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(before["text"])
        if subprocess.call(shlex.split(editor) + [path]) != 0:
            raise UsageError("the editor failed: your notes are unchanged")
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
    finally:
        os.unlink(path)
    if text == before["text"]:
        return before, "unchanged"
    return ops.memory_user_set(text, by=R.cli_actor()), "saved"


def _journal(args):
    entries = ops.memory_journal(args.target)
    if args.json:
        R.dump_json(jsonable(entries))
        return 0
    if not entries:
        print("no journal entries: no agent session has been committed in this folder")
    for e in entries:
        print(_entry(e))
    return 0


def _entry(e):
    """`SID  2026-09-16 12:00 UTC  task: ...  files (N): "a", "b"  claim (the model's own): ...`,
    every byte the model or a path chose escaped; each path quoted (a quote in it as \\")."""
    import time
    at = e.get("at")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at)) if isinstance(at, (int, float)) else "?"
    files = ['"' + R.escape_path(str(p)).replace('"', '\\"') + '"' for p in e.get("files") or []]
    n = e.get("changes") if isinstance(e.get("changes"), int) else len(files)
    named = ", ".join(files) + (f", +{n - len(files)} more" if n > len(files) else "")
    claim = " ".join(str(e.get("claim") or "").split())
    return "  ".join([R.escape_text(str(e.get("sid"))), when,
                      "task: " + R.escape_text(" ".join(str(e.get("task") or "").split())),
                      f"files ({n}): {named or '-'}",
                      "claim (the model's own, not verified): " + (R.escape_text(claim) or "-")])


def _proposals(args):
    rows = ops.memory_proposals(args.sid)
    if args.json:
        R.dump_json(jsonable(rows))
        return 0
    if not rows:
        print(f"session {args.sid} proposed no notes")
    for p in rows:
        state = f"accepted by {p['by'] or '?'}" if p["accepted"] else "proposed"
        where = f"turn {p['turn']} {p['call']}" if p.get("turn") is not None else "-"
        print(f"{p['id']}  {state}  {R.escape_text(where)}  {_note(p['note'])}")
    return 0


def _accept(args):
    rows = ops.memory_accept(args.sid, ids=args.ids, all=args.all, by=R.cli_actor())
    if args.json:
        R.dump_json(jsonable(rows))
        return 0
    for r in rows:
        note = _note(r["note"])
        if r["accepted"]:
            print(f"accepted {r['id']}: {note}")
        else:
            print(f"skipped {r['id']}: {r['skipped']}: {note}")
    return 0


def _note(note):
    """A proposed note as it is saved: its first line, each later line on a line of its own,
    indented; every line escaped (a control character cannot act on the terminal, nor a line
    break the note hides pose as a line of the listing)."""
    lines = note.splitlines() or [""]          # the lines memory.as_item saves
    return R.escape_text(lines[0]) + "".join("\n    " + R.escape_text(line) for line in lines[1:])


COMMANDS = {"memory": cmd_memory}
