"""`overlord webhooks add|list|test|rm|base-url|deliveries`: tell a channel when an audited act
happens (overlord/trust/notify.py through overlord.ops). docs/WEBHOOKS.md.

A signing secret is read from stdin (`--secret-stdin`: one line, or a prompt at a terminal),
never from the command line, where `ps` and shell history would keep it."""
import argparse
import sys

from overlord import ops
from overlord.cli import render as R
from overlord.errors import UsageError

FORMATS = ("slack", "json")              # notify.FORMATS (not imported here: start-up cost)
DEFAULT_ON = ("session.needs_review", "connector.approval_requested")
WHERE = ("OVERLORD_HOME/webhooks.json (0600) holds the hooks; the spool and the delivery log "
         "are under OVERLORD_HOME/notify/. docs/WEBHOOKS.md.")


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("webhooks", help="notifications: POST audited acts to Slack or any URL",
                       description="Webhooks subscribe to audited acts (default: "
                       "session.needs_review, an agent finished with changes waiting for a "
                       "person, and connector.approval_requested, an external action waiting "
                       "at the approval gate; `--on '*'` for every act). Delivery is off the "
                       "act's path: a spool and one background sender, three attempts with "
                       "backoff (a 4xx tried once), outcomes in a small delivery log. Targets on "
                       "loopback, link-local or private addresses are refused at send time "
                       "unless --allow-private. " + WHERE)
    ps = p.add_subparsers(dest="webhooks_command", metavar="ACTION", parser_class=type(p))
    ps.required = True
    a = ps.add_parser("add", help="add a webhook",
                      description="Add a webhook NAME posting to URL (http:// or https://). "
                      "Format slack posts {\"text\": ...} (Slack-compatible incoming webhooks "
                      "render it), json posts the audit entry plus \"text\". With "
                      "--secret-stdin every request carries X-Overlord-Signature: "
                      "t=<unix>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">; the secret may be "
                      "secret://NAME, resolved by the vault at send time. Audited webhook.add "
                      "(never the secret). " + WHERE)
    a.add_argument("name", metavar="NAME", help="the hook's name (letters, digits, _ . -)")
    a.add_argument("url", metavar="URL", help="where to POST (http:// or https://)")
    a.add_argument("--format", dest="fmt", choices=FORMATS, default="slack",
                   help="slack (default): {\"text\"}; json: the audit entry plus \"text\"")
    a.add_argument("--secret-stdin", action="store_true",
                   help="read the signing secret from stdin (one line; a prompt at a terminal)")
    a.add_argument("--secret", nargs="?", const="", default=None,
                   help=argparse.SUPPRESS)        # refused: a secret on argv is a leaked secret
    a.add_argument("--on", action="append", default=[], metavar="ACTION",
                   help="an audited act to post (e.g. session.commit, budget.stop) or '*' for "
                   "every act; repeatable (default: " + ", ".join(DEFAULT_ON) + ")")
    a.add_argument("--allow-private", action="store_true",
                   help="allow a target on loopback, link-local or private addresses")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    ls = ps.add_parser("list", help="the webhooks (secrets never shown)",
                       description="One line per webhook: name, format, acts, host, signed or "
                       "not; the base URL links use; how many deliveries wait. " + WHERE)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    t = ps.add_parser("test", help="send a test message now and say what happened",
                      description="POST a test message (act webhook.test) to the webhook now, "
                      "one attempt, and report the answer; the outcome goes to the delivery log "
                      "and the audit chain. Exit 1 when it was not delivered.")
    t.add_argument("name", metavar="NAME")
    t.add_argument("--json", action="store_true", help="machine-readable output")
    rm = ps.add_parser("rm", help="remove a webhook",
                       description="Remove the webhook; deliveries still spooled for it are "
                       "dropped. Audited webhook.remove.")
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--json", action="store_true", help="machine-readable output")
    b = ps.add_parser("base-url", help="the workspace address links point at",
                      description="Set the address of `overlord ui` as people reach it (e.g. "
                      "https://overlord.example.com); messages about a session then end with "
                      "<URL>/?sid=SID, which opens the conversation. --clear removes it. "
                      "Without arguments: show it. Audited webhook.base_url.")
    b.add_argument("url", metavar="URL", nargs="?")
    b.add_argument("--clear", action="store_true", help="remove the base URL")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    d = ps.add_parser("deliveries", help="recent delivery outcomes, newest first",
                      description="The delivery log (OVERLORD_HOME/notify/deliveries.jsonl, the "
                      "last 500 kept): when, which webhook, which act, attempts, the HTTP status "
                      "or why it failed. Never a secret or a URL's path.")
    d.add_argument("-n", "--limit", type=int, default=50, metavar="N",
                   help="how many (default 50, at most 500)")
    d.add_argument("--json", action="store_true", help="machine-readable output")


def _secret_from_stdin():
    if sys.stdin is None:
        raise UsageError("no secret on stdin")
    if sys.stdin.isatty():
        import getpass                  # (termios): only a prompt needs it
        text = getpass.getpass("webhook secret: ")
    else:
        text = sys.stdin.readline()
        if sys.stdin.read(1):
            raise UsageError("the webhook secret is one line on stdin")
    text = text.rstrip("\r\n")
    if not text.strip():
        raise UsageError("no webhook secret on stdin (pipe it in, or type it at the prompt)")
    return text


def _on_text(on):
    return ",".join(on) if on else "-"


def _signed(hook):
    s = hook.get("secret")
    return "unsigned" if s is None else ("signed" if s == "set" else f"signed ({s})")


def _hook_line(h):
    e = R.escape_text
    return [e(h["name"]), h["format"], e(_on_text(h["on"])), e(h["url"]), _signed(h)
            + (", private ok" if h["allow_private"] else "")]


def _outcome_text(o):
    e = R.escape_text
    if o.get("ok"):
        what = f"delivered (HTTP {o.get('status')})"
    else:
        what = "FAILED: " + e(str(o.get("error") or f"HTTP {o.get('status')}"))
    tries = o.get("attempts") or 0
    return f"{what}, {tries} attempt{'s' if tries != 1 else ''}"


def cmd_webhooks(args):
    c = args.webhooks_command
    e = R.escape_text
    if c == "add":
        if args.secret is not None:
            raise UsageError("a webhook secret is never taken from the command line: "
                             "pipe it to --secret-stdin")
        secret = _secret_from_stdin() if args.secret_stdin else None
        hook = ops.webhook_add(args.name, args.url, fmt=args.fmt, on=args.on, secret=secret,
                               allow_private=args.allow_private)
        if args.json:
            R.dump_json(hook)
            return 0
        print(f"webhook {e(hook['name'])} added: {hook['format']} to {e(hook['url'])}, "
              f"{_signed(hook)}")
        print(f"on       {e(_on_text(hook['on']))}")
        print(f"check it with: overlord webhooks test {e(hook['name'])}")
        return 0
    if c == "list":
        data = ops.webhook_list()
        if args.json:
            R.dump_json(data)
            return 0
        if not data["hooks"]:
            print("no webhooks (overlord webhooks add NAME URL)")
        else:
            print(R.table([["NAME", "FORMAT", "ON", "URL", "SIGNING"]]
                          + [_hook_line(h) for h in data["hooks"]]))
        print(f"base URL: {e(data['base_url']) if data['base_url'] else '(none: messages carry no link; overlord webhooks base-url URL)'}")
        if data["queued"]:
            print(f"{data['queued']} deliver{'ies' if data['queued'] != 1 else 'y'} waiting")
        return 0
    if c == "test":
        outcome = ops.webhook_test(args.name)
        if args.json:
            R.dump_json(outcome)
        else:
            print(f"webhook {e(args.name)} ({e(outcome.get('host') or '?')}): "
                  f"{_outcome_text(outcome)}")
        return 0 if outcome["ok"] else 1
    if c == "rm":
        done = ops.webhook_remove(args.name)
        if args.json:
            R.dump_json(done)
        else:
            print(f"webhook {e(args.name)} removed")
        return 0
    if c == "base-url":
        if args.clear and args.url:
            raise UsageError("base-url takes a URL or --clear, not both")
        if args.clear or args.url:
            data = ops.webhook_base_url(None if args.clear else args.url)
        else:
            data = {"base_url": ops.webhook_list()["base_url"]}
        if args.json:
            R.dump_json(data)
        elif data["base_url"]:
            print(f"base URL: {e(data['base_url'])} (links: {e(data['base_url'])}/?sid=SID)")
        else:
            print("no base URL (messages carry no link)")
        return 0
    rows = ops.webhook_deliveries(args.limit)
    if args.json:
        R.dump_json(rows)
        return 0
    if not rows:
        print("no deliveries yet")
        return 0
    print(R.table([["WHEN", "WEBHOOK", "ACT", "SESSION", "OUTCOME"]]
                  + [[R.when(o.get("ts")), e(str(o.get("hook"))),
                      e(str(o.get("action"))) + (" (test)" if o.get("test") else ""),
                      e(str(o.get("sid") or "-")), _outcome_text(o)] for o in rows]))
    return 0


COMMANDS = {"webhooks": cmd_webhooks}
