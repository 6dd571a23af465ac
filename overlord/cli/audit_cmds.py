"""`overlord audit ...`: verify, show, key, checkpoint, witness, witness-serve. Parse, call
overlord.ops.audit, render; every byte that came from a record is escaped."""
import json
import sys

from overlord import ops
from overlord.cli import render as R
from overlord.errors import UsageError
from overlord.text import jsonable

SHOWN = ("seq", "ts", "actor", "action", "sid", "target", "mac")   # the columns; the rest: details


def add_parsers(sub):
    """Register `overlord audit` and its actions on the main parser's subparsers."""
    a = sub.add_parser("audit", help="the keyed audit chain: verify, show, checkpoint, witness",
                       description="OVERLORD_HOME/audit.jsonl holds one HMAC-chained line per "
                       "consequential act (docs/AUDIT.md). Verify it, read it, pin its head, or "
                       "hand the head to an off-box witness.")
    s = a.add_subparsers(dest="audit_command", metavar="ACTION", parser_class=type(a))
    s.required = True

    v = s.add_parser("verify", help="walk the chain; exit 1 naming the first bad line",
                     description="Check every line's seq and mac. Prints signed or UNSIGNED, the "
                     "line count and the head {seq, hash}; exits 0 when the chain holds, 1 naming "
                     "the first bad line (edited, deleted, reordered, inserted, MACs stripped) "
                     "or when a pin or the witness's head is no longer carried.")
    v.add_argument("--pin", metavar="FILE", help="a {seq, hash} from `audit checkpoint FILE`: "
                   "the log must still carry that line unchanged")
    v.add_argument("--witness", action="store_true", help="also check the head the configured "
                   "witness holds (its mac, and that the log carries it)")
    v.add_argument("--json", action="store_true", help="machine-readable output")

    sh = s.add_parser("show", help="the recorded acts, as a table",
                      description="The chain's lines, oldest first (verify checks them; show "
                      "only reads).")
    sh.add_argument("--since", type=int, metavar="SEQ", help="from this seq on (inclusive)")
    sh.add_argument("--action", metavar="A", help="only this act (e.g. session.commit), or a "
                    "noun for all its acts (e.g. session)")
    sh.add_argument("--json", action="store_true", help="the lines as JSON")

    k = s.add_parser("key", help="where the audit key is (copy it off-box)",
                     description="The key file's path. Keep a copy off this machine: with it "
                     "anyone can check the chain, and without it a lost key cannot be replaced.")
    k.add_argument("--json", action="store_true", help="machine-readable output")

    c = s.add_parser("checkpoint", help="record a checkpoint and print the head {seq, hash}",
                     description="Append an audit.checkpoint act and emit the head that includes "
                     "it as {\"seq\": N, \"hash\": \"<that line's mac>\"}, to FILE or stdout. "
                     "`audit verify --pin FILE` later proves the log still carries it.")
    c.add_argument("file", nargs="?", metavar="FILE", help="write the pin here (default: stdout)")
    c.add_argument("--send", action="store_true", help="also POST the signed head to the witness")

    w = s.add_parser("witness", help="configure the off-box witness (or show it)",
                     description="Set the URL of an append-only receiver of signed heads "
                     "(docs/AUDIT.md: the protocol). Without URL, show the configuration.")
    w.add_argument("url", nargs="?", metavar="URL", help="http:// or https://")
    w.add_argument("--auto", action="store_true", help="send the head after every act "
                   "(throttled to one POST a second, off the act's path)")
    w.add_argument("--json", action="store_true", help="machine-readable output")

    ws = s.add_parser("witness-serve", help="run the reference witness receiver",
                      description="Keep the highest head POSTed to it in FILE (written "
                      "atomically), refuse (409) a lower seq, serve the head on GET.")
    ws.add_argument("--bind", required=True, metavar="HOST:PORT", help="e.g. 127.0.0.1:8750 "
                    "(port 0: any free port, printed)")
    ws.add_argument("--store", required=True, metavar="FILE", help="where the head is kept")
    ws.add_argument("--key", metavar="FILE", help="a copy of the audit key: refuse (403) a head "
                    "whose mac does not verify")


def _dump(data):
    R.dump_json(jsonable(data))


def _head_text(head):
    return json.dumps({"seq": head["seq"], "hash": head["hash"]})


def signed_word(report):
    """`signed`, or a loud `UNSIGNED (...)` saying why nothing is proven."""
    if report["signed"]:
        return "signed"
    if not report["lines"]:
        return "UNSIGNED (empty: no act recorded yet; the first act makes the key)"
    return "UNSIGNED (no audit key: the lines carry no MAC, only their seq order is checked)"


def _broken(bad):
    return f"BROKEN at line {bad['line']} (seq {bad['seq']}): {R.escape_text(bad['why'])}"


def doctor_line(report):
    """doctor's audit line: signed/UNSIGNED, the line count, ok or the first bad line."""
    if report is None or "error" in report:
        return "audit chain: cannot be checked (" + R.escape_text(str((report or {}).get("error"))) + ")"
    bad = report["bad"]
    state = "ok" if bad is None else _broken(bad)
    word = "signed" if report["signed"] else "UNSIGNED"
    return f"audit chain: {word}, {report['lines']} line{'s' if report['lines'] != 1 else ''}, {state}"


def cmd_verify(args):
    report = ops.audit_verify(pin=args.pin, use_witness=args.witness)
    if args.json:
        _dump(report)
    else:
        print(signed_word(report))
        print(f"lines: {report['lines']}")
        print(f"head: {_head_text(report['head'])}")
        bad = report["bad"]
        print("chain: ok" if bad is None else f"chain: {_broken(bad)}")
        for part in ("pin", "witness"):
            got = report[part]
            if got is not None:
                print(f"{part}: seq {got['seq']} carried" if got["ok"] else
                      f"{part}: seq {got['seq']} NOT carried: {R.escape_text(got['why'])}")
    if report["ok"]:
        return 0
    bad = report["bad"]
    if bad is not None:
        why = f"line {bad['line']} (seq {bad['seq']}): {bad['why']}"
    else:
        part = "pin" if report["pin"] and not report["pin"]["ok"] else "witness"
        why = f"the {part}'s seq {report[part]['seq']}: {report[part]['why']}"
    sys.stderr.write(R.error_line(f"audit chain does not hold at {why}") + "\n")
    return 1


def _details(entry):
    rest = {k: v for k, v in entry.items() if k not in SHOWN}
    return json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":")) if rest else ""


def _cell(value):
    return "-" if value is None else R.escape_text(str(value)).replace("\t", "\\t")


def cmd_show(args):
    rows = ops.audit_show(since=args.since, action=args.action)
    if args.json:
        _dump(rows)
        return 0
    table = [("SEQ", "TIME", "ACTOR", "ACTION", "SID", "TARGET", "DETAILS")]
    for e in rows:
        ts = e.get("ts")
        table.append((_cell(e.get("seq")), R.when(ts) if isinstance(ts, (int, float)) else _cell(ts),
                      _cell(e.get("actor")), _cell(e.get("action")), _cell(e.get("sid")),
                      _cell(e.get("target")), _cell(_details(e))))
    if len(table) > 1:
        print(R.table(table))
    return 0


def cmd_key(args):
    info = ops.audit_key()
    if args.json:
        _dump(info)
    else:
        print(R.escape_path(info["path"]) + ("" if info["exists"] else
                                             "  (not made yet: the first act makes it)"))
    return 0


def cmd_checkpoint(args):
    out = ops.audit_checkpoint(args.file, send=args.send)
    if not args.file:
        print(_head_text(out))
    if args.send:
        sys.stderr.write(f"sent seq {out['seq']} to the witness {R.escape_text(out['sent'])}\n")
    return 0


def cmd_witness(args):
    if args.url is None and args.auto:
        raise UsageError("--auto needs the witness URL")
    conf = ops.audit_witness(args.url, auto=args.auto)
    if args.json:
        _dump(conf)
        return 0
    if conf is None:
        print("no witness configured")
        return 0
    print(f"witness: {R.escape_text(conf['url'])}" + ("  (auto: after every act)" if conf["auto"] else ""))
    sent = conf.get("last_sent")
    if args.url is None and sent:
        state = f"error: {R.escape_text(str(sent['error']))}" if sent.get("error") else "ok"
        print(f"last sent: seq {sent.get('seq')} at {R.when(sent.get('ts'))} ({state})")
    return 0


def cmd_witness_serve(args):
    def ready(url):
        print(f"witness listening on {url} (store {R.escape_path(args.store)})", flush=True)
    return ops.audit_witness_serve(args.bind, args.store, key_file=args.key, on_ready=ready)


ACTIONS = {"verify": cmd_verify, "show": cmd_show, "key": cmd_key, "checkpoint": cmd_checkpoint,
           "witness": cmd_witness, "witness-serve": cmd_witness_serve}


def cmd_audit(args):
    return ACTIONS[args.audit_command](args)


COMMANDS = {"audit": cmd_audit}
