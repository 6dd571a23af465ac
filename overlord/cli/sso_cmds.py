"""`overlord sso set|show|test|off`: single sign-on (OpenID Connect) for `overlord ui`.

The client secret is read from stdin (`--client-secret-stdin`: one line, or a prompt at a
terminal), never from the command line, where `ps` and shell history would keep it. docs/AUTH.md.
"""
import argparse
import sys

from overlord.cli import render as R
from overlord.errors import UsageError

ROLES = ("admin", "operator", "viewer")


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("sso", help="single sign-on (OpenID Connect) for the workspace",
                       description="Sign people in to `overlord ui` through an OpenID Connect "
                       "provider: authorization code with PKCE, state bound to the browser, "
                       "nonce; the ID token's signature is verified (RS256, ES256) against the "
                       "provider's keys and the identity confirmed by its userinfo. Accounts are "
                       "made at first sign-in for a verified e-mail at an allowed domain (or a "
                       "listed address), named by the e-mail. OVERLORD_HOME/sso.json (0600). "
                       "docs/AUTH.md.")
    ps = p.add_subparsers(dest="sso_command", metavar="ACTION", parser_class=type(p))
    ps.required = True
    s = ps.add_parser("set", help="name the provider, the client and who may sign in",
                      description="Store the provider (its issuer URL: https://, or http:// for "
                      "a loopback host), the client id and secret (read from stdin), and the "
                      "provisioning rules: e-mail domains allowed, addresses made admin or "
                      "viewer, a groups claim mapped to roles, the default role (operator). "
                      "Replaces the whole configuration; without --client-secret-stdin the "
                      "stored secret is kept (same issuer and client id). Audited sso.config.")
    s.add_argument("--issuer", required=True, metavar="URL", help="the provider's issuer URL, "
                   "exactly as its ID tokens name it")
    s.add_argument("--client-id", required=True, metavar="ID", help="this server's client id")
    s.add_argument("--client-secret-stdin", action="store_true",
                   help="read the client secret from stdin (one line; a prompt at a terminal)")
    s.add_argument("--client-secret", nargs="?", const="", default=None,
                   help=argparse.SUPPRESS)        # refused: a secret on argv is a leaked secret
    s.add_argument("--domain", action="append", default=[], metavar="D",
                   help="an e-mail domain whose verified addresses may sign in; repeatable")
    s.add_argument("--admin", action="append", default=[], metavar="EMAIL",
                   help="an address made admin at first sign-in; repeatable")
    s.add_argument("--viewer", action="append", default=[], metavar="EMAIL",
                   help="an address made viewer at first sign-in; repeatable")
    s.add_argument("--role-claim", metavar="CLAIM", help="the claim listing the person's "
                   "groups (e.g. groups)")
    s.add_argument("--role-map", action="append", default=[], metavar="GROUP=ROLE",
                   help=f"a group of --role-claim and the role it gives ({', '.join(ROLES)}); "
                   "repeatable, the highest role wins")
    s.add_argument("--default-role", choices=ROLES, help="the role otherwise (default: operator)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    w = ps.add_parser("show", help="the configuration (the client secret never shown)",
                      description="The stored configuration, the client secret masked.")
    w.add_argument("--json", action="store_true", help="machine-readable output")
    t = ps.add_parser("test", help="fetch the provider's discovery document and keys",
                      description="Fetch /.well-known/openid-configuration and the key set "
                      "(JWKS) now, and say what was found: endpoints, keys, algorithms.")
    t.add_argument("--json", action="store_true", help="machine-readable output")
    ps.add_parser("off", help="turn single sign-on off (accounts stay)",
                  description="Remove sso.json. Accounts made by single sign-on stay (remove "
                  "them with `overlord users rm`); they cannot sign in until it is set again.")


def _secret_from_stdin():
    if sys.stdin is None:
        raise UsageError("no client secret on stdin")
    if sys.stdin.isatty():
        import getpass                  # (termios): only a prompt needs it
        text = getpass.getpass("client secret: ")
    else:
        text = sys.stdin.readline()
        if sys.stdin.read(1):
            raise UsageError("the client secret is one line on stdin")
    text = text.rstrip("\r\n")
    if not text.strip():
        raise UsageError("no client secret on stdin (pipe it in, or type it at the prompt)")
    return text


def _role_map(items):
    out = {}
    for item in items:
        group, eq, role = item.rpartition("=")
        if not eq or not group:
            raise UsageError(f"--role-map takes GROUP=ROLE, not {item!r}")
        if role not in ROLES:
            raise UsageError(f"--role-map {item!r}: the role is one of {', '.join(ROLES)}")
        if group in out and out[group] != role:
            raise UsageError(f"--role-map names {group!r} twice")
        out[group] = role
    return out


def _lines(conf):
    if not conf.get("enabled"):
        return ["single sign-on is off (overlord sso set)"]
    e = R.escape_text
    rmap = conf.get("role_map") or {}
    return [f"issuer         {e(conf['issuer'])}",
            f"client id      {e(conf['client_id'])}",
            "client secret  set (not shown)",
            f"domains        {e(', '.join(conf['domains'])) or '(none: only listed addresses)'}",
            f"admins         {e(', '.join(conf['admins'])) or '-'}",
            f"viewers        {e(', '.join(conf['viewers'])) or '-'}",
            f"role claim     {e(conf['role_claim'] or '-')}"
            + (" (" + e(", ".join(f"{g}={r}" for g, r in sorted(rmap.items()))) + ")"
               if rmap else ""),
            f"default role   {conf['default_role']}",
            f"scopes         {e(conf['scopes'])}"]


def cmd_sso(args):
    from overlord.ops import sso
    c = args.sso_command
    if c == "set":
        if args.client_secret is not None:
            raise UsageError("the client secret is never taken from the command line: "
                             "pipe it to --client-secret-stdin")
        secret = _secret_from_stdin() if args.client_secret_stdin else None
        conf = sso.configure(args.issuer, args.client_id, secret, domains=args.domain,
                             admins=args.admin, viewers=args.viewer, role_claim=args.role_claim,
                             role_map=_role_map(args.role_map), default_role=args.default_role,
                             by=R.cli_actor())
        if args.json:
            R.dump_json(conf)
            return 0
        print("single sign-on set (check the provider with: overlord sso test)")
        print("\n".join(_lines(conf)))
        if not conf["domains"] and not conf["admins"] and not conf["viewers"]:
            print("overlord: note: no --domain, --admin or --viewer: nobody new can sign in",
                  file=sys.stderr)
        return 0
    if c == "show":
        conf = sso.public()
        if args.json:
            R.dump_json(conf)
        else:
            print("\n".join(_lines(conf)))
        return 0
    if c == "test":
        found = sso.test()
        if args.json:
            R.dump_json(found)
            return 0
        e = R.escape_text
        print(f"issuer         {e(found['issuer'])}: discovery answered")
        for key in ("authorization_endpoint", "token_endpoint", "userinfo_endpoint"):
            print(f"{key.split('_')[0]:<14} {e(found[key])}")
        print(f"keys           {found['jwks_keys']} in the key set, {found['usable_keys']} usable")
        print(f"algorithms     {e(', '.join(found['algs'])) or '(not said)'}")
        if not found["usable_keys"] or (found["algs"] and not found["supported"]):
            print("overlord: the provider signs with nothing this server verifies "
                  f"(only {', '.join(sso.ALGS)} with an RSA >= 2048 or P-256 key)",
                  file=sys.stderr)
            return 1
        print("ok")
        return 0
    if sso.off(by=R.cli_actor()):
        print("single sign-on is off (accounts it made stay; overlord users rm removes them)")
    else:
        print("single sign-on was not on")
    return 0


COMMANDS = {"sso": cmd_sso}
