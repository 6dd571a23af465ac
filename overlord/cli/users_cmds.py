"""`overlord users add|list|passwd|role|rm|token|tokens|revoke|budget`: the accounts of the workspace
(overlord/trust/auth.py, through overlord.ops.auth), parsed and rendered here.

A password never comes from the command line (argv is readable by every process on the
machine): it is read from stdin when stdin is not a terminal (one line), else prompted for
twice without echo. A token is printed once, on stdout alone, so `TOKEN=$(overlord users token
alice)` keeps it and nothing else."""
import argparse
import sys

from overlord.cli import cost_cmds
from overlord.cli import render as R
from overlord.errors import NotFound, UsageError
from overlord.text import jsonable

ROLES = ("admin", "operator", "viewer")        # auth.ROLES (not imported here: start-up cost)

NAME_HELP = ("the account: a local name (a lower-case letter, then up to 31 lower-case letters, "
             "digits, '_', '.', '-') or a single sign-on account's e-mail")
ROLE_HELP = ("admin: everything (accounts, policy, connector configuration, every record); "
             "operator: their own conversations and sessions, settings, keys and notes; "
             "viewer: read every record, change nothing")
PASSWORD_NOTE = ("The password is read from stdin when it is not a terminal (one line, e.g. "
                 "`printf '%%s\\n' \"$PW\" | overlord users ...`), else prompted for twice; "
                 "never from the command line. At least 8 characters.")


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("users", help="accounts for the workspace: add, list, roles, tokens",
                       description="Accounts of `overlord ui` (OVERLORD_HOME/users.json, mode "
                       "0600; passwords as scrypt hashes, tokens hashed). The first `users add` "
                       "turns sign-in on -- for a server already running too, from its next "
                       "request: from then on every request names an account (a login or an "
                       "ovl_ token), and the launch token alone no longer suffices. Every change "
                       "is on the audit chain. docs/AUTH.md.")
    ps = p.add_subparsers(dest="users_command", metavar="ACTION", parser_class=type(p))
    ps.required = True
    a = ps.add_parser("add", help="add a local account (the first one turns sign-in on)",
                      description="Add a local account with a role and a password; makes "
                      "OVERLORD_HOME/users/NAME/ for its settings, keys and notes. "
                      + PASSWORD_NOTE)
    a.add_argument("name", metavar="NAME", help=NAME_HELP)
    a.add_argument("--role", required=True, choices=ROLES, help=ROLE_HELP)
    _no_password_here(a)
    ls = ps.add_parser("list", help="the accounts, their roles and token counts",
                       description="One line per account: name, role, local or single sign-on, "
                       "when it was made, how many tokens it has.")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    pw = ps.add_parser("passwd", help="set a local account's password (ends its logins)",
                       description="Set the password of a local account; every login of the "
                       "account ends (its script tokens stay). " + PASSWORD_NOTE)
    pw.add_argument("name", metavar="NAME", help=NAME_HELP)
    _no_password_here(pw)
    r = ps.add_parser("role", help="change an account's role (ends its logins)",
                      description="Change an account's role; every login of the account ends "
                      "(its script tokens stay and speak with the new role).")
    r.add_argument("name", metavar="NAME", help=NAME_HELP)
    r.add_argument("role", metavar="ROLE", choices=ROLES, help=ROLE_HELP)
    rm = ps.add_parser("rm", help="remove an account, its tokens and logins",
                       description="Remove an account: its tokens are revoked and its logins "
                       "end; OVERLORD_HOME/users/NAME/ is kept aside as users/.removed-NAME-"
                       "<time> (never deleted). Sessions it owned stay on the record. Removing "
                       "the last account turns sign-in off.")
    rm.add_argument("name", metavar="NAME", help=NAME_HELP)
    t = ps.add_parser("token", help="mint a script token (ovl_...), shown once",
                      description="Mint a bearer token for scripts (`Authorization: Bearer "
                      "ovl_...`), acting as the account with its current role. The token is "
                      "printed once on stdout (a note saying so goes to stderr); only its "
                      "SHA-256 is kept. Revoke it with `overlord users revoke NAME ID`.")
    t.add_argument("name", metavar="NAME", help=NAME_HELP)
    t.add_argument("--label", metavar="L", help="what the token is for (up to 64 characters)")
    ts = ps.add_parser("tokens", help="an account's tokens (ids and labels, never the tokens)",
                       description="One line per token of the account: its id, label, when it "
                       "was made and last used (to the minute).")
    ts.add_argument("name", metavar="NAME", help=NAME_HELP)
    ts.add_argument("--json", action="store_true", help="machine-readable output")
    rv = ps.add_parser("revoke", help="revoke one token of an account",
                       description="Revoke one token (its id as `overlord users tokens NAME` "
                       "lists it, the part after ovl_ in the token); it is refused from the "
                       "next request on.")
    rv.add_argument("name", metavar="NAME", help=NAME_HELP)
    rv.add_argument("token_id", metavar="TOKEN-ID", help="the token's id (12 hex digits)")
    bu = ps.add_parser("budget", help="an account's budget lines (show, set, clear)",
                       description="The budget lines of one account (OVERLORD_HOME/cost.json, "
                       "accounts): its sessions' tokens and dollars, its dollars per UTC day "
                       "and month across all its sessions. The machine's lines (`overlord cost "
                       "budget`) and the folder's policy rule apply too: of each, the most "
                       "restrictive wins and is named. Without flags: show. Audited "
                       "cost.budget. docs/COST.md.")
    bu.add_argument("name", metavar="NAME", help=NAME_HELP + "; it must exist")
    cost_cmds.budget_flags(bu)


def _no_password_here(parser):
    """Take (hidden) what a password on the command line would be -- `--password X`, a word
    after NAME -- so the refusal can say why without echoing it back (argparse's own error
    would quote it)."""
    parser.add_argument("--password", "--passwd", dest="argv_password", help=argparse.SUPPRESS)
    parser.add_argument("argv_extra", nargs="*", help=argparse.SUPPRESS)


def _refuse_argv_password(args):
    if getattr(args, "argv_password", None) is not None or getattr(args, "argv_extra", None):
        raise UsageError("a password is never taken from the command line (any process on the "
                         "machine may read it there): pipe one line on stdin, or type it at the "
                         "prompt; nothing changed")


def cmd_users(args):
    from overlord.ops import auth
    return {"add": _add, "list": _list, "passwd": _passwd, "role": _role, "rm": _rm,
            "token": _token, "tokens": _tokens, "revoke": _revoke,
            "budget": _budget}[args.users_command](auth, args)


def read_password(prompt):
    """A password from stdin (not a terminal: its first line, without its line ending, \n or
    \r\n) or typed twice at a prompt."""
    stdin = sys.stdin
    if stdin is None:
        raise UsageError("no password: stdin is closed (pipe one line into the command)")
    if not stdin.isatty():
        raw = stdin.buffer.readline(8193) if hasattr(stdin, "buffer") else \
            stdin.readline(8193).encode("utf-8", "surrogateescape")
        if not raw:
            raise UsageError("no password on stdin (one line is read)")
        if len(raw) > 8192:
            raise UsageError("the password line on stdin is too long")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("the password on stdin is not UTF-8 text") from None
        line = line[:-1] if line.endswith("\n") else line
        return line[:-1] if line.endswith("\r") else line
    import getpass
    first = getpass.getpass(f"{prompt}: ")
    second = getpass.getpass("the same again: ")
    if first != second:
        raise UsageError("the two passwords differ: nothing changed")
    return first.rstrip("\r")


def _add(auth, args):
    _refuse_argv_password(args)
    auth.check_local_name(args.name)                 # a bad name is refused before the prompt
    if auth.get(args.name) is not None:
        raise UsageError(f"account {args.name} exists (change it with `overlord users passwd` "
                         "or `overlord users role`)")
    was_on = auth.enabled()
    password = read_password(f"password for {args.name}")
    auth.add(args.name, args.role, password=password, by=R.cli_actor())
    print(f"added {args.name} ({args.role})")
    if not was_on:
        sys.stderr.write("sign-in is on: `overlord ui` asks every request for an account from "
                         "its next request (the launch token alone no longer suffices)\n")
    return 0


def _list(auth, args):
    rows = auth.listing()
    if args.json:
        R.dump_json(jsonable(rows))
        return 0
    if not rows:
        print("no accounts: sign-in is off (the launch token opens the workspace); "
              "`overlord users add NAME --role admin` turns it on")
        return 0
    print(R.table([(r["name"], r["role"], "sso" if r["sso"] else "local",
                    "made " + _when(r["created"]),
                    f"{r['tokens']} token{'s' if r['tokens'] != 1 else ''}")
                   for r in rows]))
    return 0


def _when(ts):
    import time
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts)) if ts else "-"


def _passwd(auth, args):
    _refuse_argv_password(args)
    rec = auth.get(auth.check_name(args.name))
    if rec is None:
        raise NotFound(f"no account {args.name}")
    if rec.get("sso"):
        raise UsageError(f"{args.name} signs in with single sign-on: it has no password")
    password = read_password(f"new password for {args.name}")
    done = auth.passwd(args.name, password, by=R.cli_actor())
    print(f"password changed for {args.name}; {_ended(done['ended'])}")
    return 0


def _ended(n):
    return f"{n} login{'s' if n != 1 else ''} ended" if n else "no login to end"


def _role(auth, args):
    done = auth.set_role(args.name, args.role, by=R.cli_actor())
    if done["was"] == done["role"]:
        print(f"{args.name} is already {args.role}: nothing changed")
    else:
        print(f"{args.name}: {done['was']} -> {done['role']}; {_ended(done['ended'])}")
    return 0


def _rm(auth, args):
    done = auth.remove(args.name, by=R.cli_actor())
    n = done["tokens"]
    line = (f"removed {args.name}: {n} token{'s' if n != 1 else ''} revoked, "
            f"{_ended(done['logins'])}")
    if done["kept"]:
        line += f"; its folder is kept as {R.escape_path(done['kept'])}"
    print(line)
    if not auth.enabled():
        sys.stderr.write("no account is left: sign-in is off (the launch token opens the "
                         "workspace again)\n")
    return 0


def _token(auth, args):
    tid, token = auth.mint_token(args.name, label=args.label, by=R.cli_actor())
    sys.stdout.write(token + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"token {tid} for {args.name}: shown this once, only its hash is kept "
                     f"(revoke it: overlord users revoke {args.name} {tid})\n")
    return 0


def _tokens(auth, args):
    rows = auth.tokens(args.name)
    if args.json:
        R.dump_json(jsonable(rows))
        return 0
    if not rows:
        print(f"{args.name} has no tokens (`overlord users token {args.name}` mints one)")
        return 0
    print(R.table([(r["id"], R.escape_text(r["label"] or "-"), "made " + _when(r["created"]),
                    "used " + _when(r["used"]) if r["used"] else "never used")
                   for r in rows]))
    return 0


def _revoke(auth, args):
    auth.revoke(args.name, args.token_id, by=R.cli_actor())
    print(f"revoked token {args.token_id} of {args.name}")
    return 0


def _budget(auth, args):
    from overlord import ops
    auth.check_name(args.name)
    return cost_cmds.budget_command(ops, f"account:{args.name}", args)


COMMANDS = {"users": cmd_users}
