"""`overlord cost [--by ...] [--since ...]`, `cost prices`, `cost set-price MODEL ...`, `cost
budget [...]`: what the models cost and the lines spending stops at (overlord/trust/cost.py
through overlord.ops.cost). `overlord users budget NAME` (users_cmds.py) shares the budget flags
below. docs/COST.md."""
import argparse
import math
import re

from overlord.cli import render as R
from overlord.errors import UsageError
from overlord.text import jsonable

BY = ("model", "account", "day", "session", "month", "kind", "provider")
LINES = ("session_tokens", "session_usd", "day_usd", "month_usd")      # trust/cost.LINES
WHERE = ("Prices and lines live in OVERLORD_HOME/cost.json (0600), every model call in "
         "OVERLORD_HOME/ledger.jsonl, running totals in spend.json and sessions/<sid>/cost.json. "
         "docs/COST.md.")
_PRICE = re.compile(r"^\$?\s*([0-9][0-9_]*(?:\.[0-9]+)?|\.[0-9]+)\s*(?:/\s*(?:mtok|m|1m))?$", re.I)
_USD = re.compile(r"^\$?\s*([0-9][0-9_]*(?:\.[0-9]+)?|\.[0-9]+)$")
_TOKENS = re.compile(r"^([0-9][0-9_,]*)$")


def price_arg(text):
    """A price in USD per million tokens: 3, 0.30, $3, 3/MTok. Anything else (other units,
    negative, inf, nan) is refused."""
    m = _PRICE.match(str(text).strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"not a price in USD per million tokens: {text!r} (e.g. 3, 0.30, $3 or 3/MTok; "
            "other units are not taken)")
    value = float(m.group(1).replace("_", ""))
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite price: {text!r}")
    return value


def usd_arg(text):
    m = _USD.match(str(text).strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not an amount of USD >= 0: {text!r} (e.g. 2, 2.50, $5)")
    value = float(m.group(1).replace("_", ""))
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite amount: {text!r}")
    return value


def tokens_arg(text):
    m = _TOKENS.match(str(text).strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens >= 0: {text!r}")
    return int(m.group(1).replace("_", "").replace(",", ""))


def line_arg(text):
    key = str(text).replace("-", "_")
    if key not in LINES:
        raise argparse.ArgumentTypeError(f"unknown budget line {text!r} (one of: "
                                         f"{', '.join(k.replace('_', '-') for k in LINES)})")
    return key


def budget_flags(parser):
    """The flags `cost budget` and `users budget NAME` share."""
    parser.add_argument("--session-tokens", type=tokens_arg, metavar="N",
                        help="tokens one session may use (input + output + cache reads + writes)")
    parser.add_argument("--session-usd", type=usd_arg, metavar="X",
                        help="dollars one session may spend")
    parser.add_argument("--day-usd", type=usd_arg, metavar="X",
                        help="dollars per UTC day (the machine's, or the account's)")
    parser.add_argument("--month-usd", type=usd_arg, metavar="X",
                        help="dollars per UTC month (set it to your provider's monthly cap)")
    parser.add_argument("--clear", nargs="+", type=line_arg, default=[], metavar="KEY",
                        help="remove lines (session-tokens, session-usd, day-usd, month-usd); "
                        "a line of 0 is kept and means nothing may be spent")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("cost", help="what the models cost: the ledger, prices, budget lines",
                       description="Every model call (agent turns, compaction notes, reviews) "
                       "is one ledger line: session, account, provider, model, tokens, dollars. "
                       "Without an action: spend grouped --by model (or account, day, month, "
                       "session, kind, provider), from the whole ledger. " + WHERE)
    p.add_argument("--by", choices=BY, default="model", help="how to group (default: model)")
    p.add_argument("--since", metavar="WHEN", help="only calls from then on: YYYY-MM-DD, "
                   "YYYY-MM, YYYY-MM-DDTHH:MM:SSZ (UTC), or Nd for the last N days")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    ps = p.add_subparsers(dest="cost_command", metavar="ACTION", parser_class=type(p))
    ps.required = False
    pr = ps.add_parser("prices", help="the price table (USD per million tokens)",
                       description="Every listed price, USD per million tokens, and where it "
                       "comes from: the shipped defaults or OVERLORD_HOME/cost.json. A model id "
                       "matches its own entry, else the longest listed prefix (dated ids match "
                       "their family). A model with no entry is counted in tokens and said to be "
                       "unpriced.")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    sp = ps.add_parser("set-price", help="set a model's price in cost.json",
                       description="Set (replace) a model's price in OVERLORD_HOME/cost.json, in "
                       "USD per million tokens (3, 0.30, $3 or 3/MTok). Cache reads and writes "
                       "are priced by their own rates: a call with cache tokens and no rate for "
                       "them is priced in part (and says so). Audited cost.price.")
    sp.add_argument("model", metavar="MODEL", help="the model id, or a prefix of ids "
                    "(claude-sonnet-4-5 prices claude-sonnet-4-5-20250929)")
    sp.add_argument("--input", type=price_arg, required=True, metavar="USD_PER_MTOK",
                    help="uncached input tokens")
    sp.add_argument("--output", type=price_arg, required=True, metavar="USD_PER_MTOK",
                    help="output tokens (reasoning included)")
    sp.add_argument("--cache-read", type=price_arg, metavar="USD_PER_MTOK",
                    help="prompt tokens read from the cache")
    sp.add_argument("--cache-write", type=price_arg, metavar="USD_PER_MTOK",
                    help="prompt tokens written to the cache")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    b = ps.add_parser("budget", help="the machine's budget lines (show, set, clear)",
                      description="The machine-wide budget lines: a conversation is checked "
                      "before every model call and stops (reason budget) at the first line "
                      "reached. Lines also come from the policy rule for the folder "
                      "(\"budget\": {...}) and the account (`overlord users budget NAME`); of "
                      "each, the most restrictive wins and is named. Without flags: show. "
                      "Audited cost.budget. " + WHERE)
    budget_flags(b)


def cmd_cost(args):
    from overlord import ops
    action = getattr(args, "cost_command", None)
    if action == "prices":
        return _prices(ops, args)
    if action == "set-price":
        return _set_price(ops, args)
    if action == "budget":
        return budget_command(ops, "config", args)
    return _report(ops, args)


def _n(n):
    return f"{n:,}"


def _usd(row):
    if row["unpriced_calls"] and row["unpriced_calls"] == row["calls"] and not row["usd"]:
        return "unpriced"
    text = _money(row["usd"])
    if row["unpriced_calls"]:
        text += f" ({row['unpriced_calls']} unpriced)"
    return text


def _money(usd):
    if usd is None:
        return "unpriced"
    return f"${usd:,.2f}" if abs(usd) >= 1 else f"${usd:.4f}"


def _report(ops, args):
    rep = ops.cost_report(by=args.by, since=args.since)
    if args.json:
        R.dump_json(jsonable(rep))
        return 0
    if not rep["rows"]:
        print("no model calls on the ledger" + (f" since {args.since}" if args.since else ""))
        return 0
    head = (args.by.upper(), "CALLS", "INPUT", "OUTPUT", "CACHE-READ", "CACHE-WRITE", "TOKENS",
            "USD")
    rows = [head]
    for r in rep["rows"] + [dict(rep["total"], key="total")]:
        rows.append((R.escape_text(r["key"] if r["key"] is not None else "-"), _n(r["calls"]),
                     _n(r["input_tokens"]), _n(r["output_tokens"]), _n(r["cache_read_tokens"]),
                     _n(r["cache_write_tokens"]), _n(r["tokens"]), _usd(r)))
    print(R.table(rows))
    return 0


def _rate(v):
    return "-" if v is None else f"{v:g}"


def _prices(ops, args):
    rows = ops.cost_prices()
    if args.json:
        R.dump_json(jsonable(rows))
        return 0
    table = [("MODEL", "INPUT", "OUTPUT", "CACHE-READ", "CACHE-WRITE", "SOURCE")]
    table += [(R.escape_text(r["model"]), _rate(r["input"]), _rate(r["output"]),
               _rate(r.get("cache_read")), _rate(r.get("cache_write")), r["source"]) for r in rows]
    print(R.table(table))
    print("USD per million tokens; - : no rate (tokens of that kind leave a call priced in part)")
    return 0


def _set_price(ops, args):
    got = ops.cost_set_price(args.model, args.input, args.output, args.cache_read, args.cache_write)
    if args.json:
        R.dump_json(jsonable(got))
        return 0
    extra = "".join(f", {k.replace('_', ' ')} {_rate(got[k])}" for k in ("cache_read", "cache_write")
                    if k in got)
    print(f"{R.escape_text(args.model)}: input {_rate(got['input'])}, output "
          f"{_rate(got['output'])}{extra} (USD per million tokens, in cost.json)")
    return 0


def _line_text(key, value):
    if value is None:
        return "no line"
    return f"{value:,} tokens" if key == "session_tokens" else _money(value)


def budget_command(ops, scope, args):
    """`cost budget` (scope "config") and `users budget NAME` (scope "account:NAME")."""
    lines = {k: getattr(args, k) for k in LINES}
    clear = list(dict.fromkeys(args.clear or []))
    for key in clear:
        if lines.get(key) is not None:
            raise UsageError(f"--{key.replace('_', '-')} is both set and cleared: nothing changed")
    got = ops.cost_budget(scope, clear=clear, **lines)
    if args.json:
        R.dump_json(jsonable(got))
        return 0
    who = "the machine" if scope == "config" else scope.split(":", 1)[1]
    print(f"budget lines of {R.escape_text(who)}{' now' if got['changed'] else ''}:")
    print(R.table([(f"  {k.replace('_', '-')}", _line_text(k, got["lines"].get(k)))
                   for k in LINES]))
    return 0


COMMANDS = {"cost": cmd_cost}
