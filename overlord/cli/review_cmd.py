"""`overlord review`: a second model reviews a pending session (or --list its verdicts).

Exit status: 0 when the reviewer gave a verdict, approve or reject alike (the verdict is
printed; it is `commit` that refuses on a rejection or without an approval); 1 when it gave
none (no-verdict: out of turns, the provider failed, the model declined) and on every
refusal before the review (an unknown or decided session, the agent's own model without
--same-model, a missing key); 2 on a usage error (an unknown provider, a bad selector).
"""
import sys

from overlord import ops
from overlord.cli import agent_cmds
from overlord.cli import render as R
from overlord.errors import UsageError
from overlord.text import jsonable

EXIT = {"approve": 0, "reject": 0, "no-verdict": 1}
SAME = "  (the agent's own model: --same-model)"


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser(
        "review", help="a second model reviews a pending change (--list: its verdicts)",
        description="Put a pending session in front of a second model that had no part in it: "
        "it gets a dossier (the task or commands, the grants, the agent's tool calls, the "
        "manifest, the content gate's findings, the diffs, and what the dossier could not show "
        "whole), reads files of the session's view read-only, and approves or rejects. The "
        "verdict is bound to a fingerprint of exactly what it reviewed: a rewind, an exec or "
        "another --only/--drop makes it stale. Exits 0 with a verdict (approve or reject), 1 "
        "without one.")
    p.add_argument("sid", metavar="SID", help=R.SID_HELP)
    agent_cmds._endpoint_flags(p)
    p.add_argument("--model", metavar="M", help="the reviewer's model id (it must differ from "
                   "the agent's, unless --same-model)")
    p.add_argument("--same-model", action="store_true", help="allow the agent's own "
                   "provider:model as the reviewer (the verdict records it)")
    p.add_argument("--only", action="append", default=[], metavar="SEL", help="review only "
                   "these savepoints, as `commit --only SEL` would replay them")
    p.add_argument("--drop", action="append", default=[], metavar="SEL", help="review all but "
                   "these savepoints (same selectors as commit)")
    p.add_argument("--list", action="store_true", help="list every verdict on record, fresh or "
                   "stale, instead of reviewing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    g = p.add_argument_group("generation (each sent only when set)")
    g.add_argument("--max-tokens", type=int, metavar="N", help="the longest reply")
    g.add_argument("--temperature", type=float, metavar="X")
    g.add_argument("--top-p", type=float, metavar="X")
    g.add_argument("--effort", choices=("low", "medium", "high", "xhigh", "max"))
    g.add_argument("--thinking", choices=("summarized", "off"))
    g.add_argument("--no-stream", action="store_true", help="ask for whole replies, not streams")
    g.add_argument("--no-fallbacks", action="store_true", help="anthropic: no server-side "
                   "refusal fallbacks")


REVIEW_FLAGS = ("provider", "base_url", "api", "azure_api_version", "script", "model",
                "max_tokens", "temperature", "top_p", "effort", "thinking")


def cmd_review(args):
    if args.list:
        given = [f for f in REVIEW_FLAGS if getattr(args, f) is not None]
        given += [f for f in ("same_model", "no_stream", "no_fallbacks", "header", "only", "drop")
                  if getattr(args, f)]
        if given:
            raise UsageError(f"review --list takes only --json (not --{given[0].replace('_', '-')})")
        return _list(args)
    knobs = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
             "effort": args.effort, "thinking": args.thinking,
             "stream": False if args.no_stream else None,
             "fallbacks": False if args.no_fallbacks else None}
    verdict = ops.review(args.sid, provider=args.provider, model=args.model,
                         base_url=args.base_url, headers=agent_cmds._headers(args.header),
                         knobs=knobs, script=args.script, api=args.api,
                         azure_api_version=args.azure_api_version, same_model=args.same_model,
                         only=args.only, drop=args.drop,
                         on_event=None if args.json else _progress)
    if args.json:
        R.dump_json(jsonable(dict(verdict, sid=args.sid)))
    else:
        print(_verdict_text(args.sid, verdict))
    return EXIT.get(verdict["verdict"], 1)


def _progress(event):
    """The reviewer's steps, on stderr as they happen (stdout keeps the verdict)."""
    if event.get("type") == "tool_result":
        call = event.get("input") or {}
        what = call.get("path") if event.get("tool") == "read_file" else None
        shown = f"({R.escape_path(str(what))})" if what is not None else ""
        status = "refused" if event.get("is_error") else "ok"
        print(f"[review turn {event.get('turn')}] {R.escape_text(str(event.get('tool')))}{shown}: "
              f"{status}", file=sys.stderr, flush=True)
    elif event.get("type") == "error":
        print(f"overlord: {R.escape_text(str(event.get('message')))}", file=sys.stderr, flush=True)


def _verdict_text(sid, v):
    view = "partial view" if v["partial"] else "complete view"
    head = f"review #{v['n']} of {sid}: {v['verdict']} ({view}, {v['turns']} turn" \
           f"{'' if v['turns'] == 1 else 's'})"
    lines = [head, f"reviewer: {R.escape_text(str(v['reviewer']))}"
             f"{SAME if v['same_model'] else ''}"
             f"   agent: {R.escape_text(str(v['agent'] or '- (a run session)'))}"]
    if v["reason"]:
        lines.append("reason:\n" + agent_cmds._indent(v["reason"]))
    if v["paths"]:
        lines.append("paths: " + ", ".join(R.escape_path(p) for p in v["paths"]))
    if v["unseen"]:
        lines.append("not shown whole in the dossier: " + ", ".join(R.escape_path(p) for p in v["unseen"]))
    if v["read"]:
        lines.append("read whole with read_file: " + ", ".join(R.escape_path(p) for p in v["read"]))
    if v["verdict"] == "approve" and v["partial"]:
        lines.append("this approval saw only part of the change: it does not countersign a commit")
    if isinstance(v.get("cost"), dict):
        lines.append(agent_cmds.cost_line(v["cost"]))
    if isinstance(v.get("budget"), dict):
        lines.append(agent_cmds.budget_line(v["budget"]))
    lines.append(f"fingerprint: {v['fingerprint']}")
    return "\n".join(lines)


def _list(args):
    verdicts = ops.reviews(args.sid)
    if args.json:
        R.dump_json(jsonable(verdicts))
        return 0
    rows = []
    for v in verdicts:
        fresh = "fresh" if v.get("fresh") else "stale"
        reason = " ".join(str(v.get("reason") or "").split())
        reason = reason if len(reason) <= 80 else reason[:79] + "…"
        rows.append((f"#{v['n']}", v["verdict"], fresh, "partial" if v.get("partial") else "complete",
                     R.escape_text(str(v.get("reviewer"))), R.escape_text(reason) or "-"))
    if rows:
        print(R.table(rows))
    return 0


COMMANDS = {"review": cmd_review}
