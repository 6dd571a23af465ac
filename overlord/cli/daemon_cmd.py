"""`overlord daemon`: the policy-brokered resident broker on a unix socket (docs/DAEMON.md)."""


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser(
        "daemon", help="serve harnesses on a unix socket, held to policy.json",
        description="Serve the operations of docs/DAEMON.md on a unix socket (mode 0600; only "
        "your own user and root are served) for the SDK (overlord_client.py) and other "
        "harnesses. Every session it opens or acts on is bound by OVERLORD_HOME/policy.json: a "
        "folder no `targets` entry covers is denied. Runs until SIGTERM or Ctrl-C; "
        "packaging/overlordd.service runs it as a systemd user unit.")
    p.add_argument("--socket", metavar="PATH", help="listen here (default: $OVERLORD_SOCKET, "
                   "else OVERLORD_HOME/overlordd.sock)")


def cmd_daemon(args):
    from overlord.daemon import server
    return server.serve(args.socket)


COMMANDS = {"daemon": cmd_daemon}
