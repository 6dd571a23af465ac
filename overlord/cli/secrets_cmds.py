"""`overlord secrets set-command|show|test|off`: secret://NAME references resolved by a command.

The resolver's configuration lives in OVERLORD_HOME/secrets.json (0600); docs/VAULT.md.
"""
import sys

from overlord.cli import render as R


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser(
        "secrets", help="secret://NAME references resolved by a vault command",
        description="Anywhere OVERLORD stores a secret (a provider key, a connector's env or "
        "header value, the SSO client secret, a webhook secret) the value may be "
        "secret://NAME, resolved at the moment of use by a command you configure: run "
        "without a shell, {name} replaced inside one argument, stdout the secret, cached "
        "in memory for --ttl seconds, every run audited (never the value). With a resolver "
        "and no provider key anywhere, providers/<provider> is asked for. Configuration: "
        "OVERLORD_HOME/secrets.json (0600). docs/VAULT.md.")
    ps = p.add_subparsers(dest="secrets_command", metavar="ACTION", parser_class=type(p))
    ps.required = True
    s = ps.add_parser(
        "set-command", help="set the resolver command ('CMD ... {name}')",
        description="Set the command that prints a secret, e.g. "
        "'vault kv get -field=value secret/overlord/{name}' or 'pass show {name}'. It is "
        "split like a shell would (quotes kept) once, now, and later run without a shell; "
        "{name} must appear inside an argument. The program must exist (on PATH, or a path). "
        "Audited secret.config with the program's name and the argument count only.")
    s.add_argument("resolver", metavar="'CMD {name}'", help="the resolver command, quoted")
    s.add_argument("--ttl", metavar="SECONDS", default=None,
                   help="how long a resolved value is kept in memory (default 300; 0 = never)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    w = ps.add_parser("show", help="the resolver command and the cache time",
                      description="The configured command (as stored), its program and ttl.")
    w.add_argument("--json", action="store_true", help="machine-readable output")
    t = ps.add_parser("test", help="resolve NAME now and print its length (never the value)",
                      description="Run the resolver for NAME (not from any cache) and print "
                      "how many characters the secret has -- never the secret. Audited "
                      "secret.resolve like any use.")
    t.add_argument("name", metavar="NAME", help="a secret name, e.g. providers/anthropic")
    t.add_argument("--json", action="store_true", help="machine-readable output")
    ps.add_parser("off", help="remove the resolver (references stop resolving)",
                  description="Remove secrets.json. Stored secret://NAME values then fail with "
                  "a clean error naming the reference until a command is set again. Audited "
                  "secret.config.")


def _lines(conf):
    if not conf["configured"]:
        return ["no resolver is set (overlord secrets set-command 'CMD {name}')"]
    import shlex
    ttl = conf["ttl"]
    return [f"command  {R.escape_text(shlex.join(conf['command']))}",
            f"program  {R.escape_text(conf['program'])}",
            f"ttl      {ttl} s" + (" (every use runs the command)" if ttl == 0 else ""),
            f"config   {R.escape_path(conf['path'])}"]


def cmd_secrets(args):
    from overlord import ops
    c = args.secrets_command
    if c == "set-command":
        conf = ops.secrets_set_command(args.resolver, ttl=args.ttl)
        if args.json:
            R.dump_json(conf)
            return 0
        print("resolver set (check it with: overlord secrets test NAME)")
        print("\n".join(_lines(conf)))
        return 0
    if c == "show":
        conf = ops.secrets_show()
        if args.json:
            R.dump_json(conf)
        else:
            print("\n".join(_lines(conf)))
        return 0
    if c == "test":
        found = ops.secrets_test(args.name)
        if args.json:
            R.dump_json(found)
        else:
            n = found["length"]
            print(f"secret://{R.escape_text(found['name'])}: {n} character{'s' if n != 1 else ''}")
        return 0
    if ops.secrets_off():
        print("resolver removed (secret:// references no longer resolve)")
    else:
        print("no resolver was set", file=sys.stderr)
    return 0


COMMANDS = {"secrets": cmd_secrets}
