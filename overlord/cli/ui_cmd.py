"""`overlord ui`: the workspace and the console, served on 127.0.0.1 (or, with accounts and TLS,
beyond loopback)."""


def add_parsers(sub):
    p = sub.add_parser(
        "ui", help="the chat workspace (/) and the console (/console) on 127.0.0.1",
        description="Serve the workspace (a chat with the agent, one conversation per "
        "transaction) and the console (the register of sessions and their dossiers) on "
        "127.0.0.1. Prints the launch link, http://127.0.0.1:PORT/?token=...: the token (kept in "
        "OVERLORD_HOME/ui.token, mode 0600) is what proves you are the operator; scripts send "
        "it as 'Authorization: Bearer <token>'. Once an account exists (overlord users add), "
        "everyone signs in instead. Beyond loopback (--bind an address other than 127.0.0.1 or "
        "::1) the server starts only with accounts and TLS (--tls-cert and --tls-key; "
        "`overlord tls selfsign` makes a pair for a private deployment).")
    p.add_argument("--port", type=int, default=7777, metavar="N",
                   help="the port (default 7777; 0 picks a free one)")
    p.add_argument("--folder", metavar="DIR", help="the working folder new conversations use "
                   "until Settings names another (default: the current directory)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="the address to listen on (default 127.0.0.1; beyond loopback needs "
                   "accounts and TLS)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate "
                   "(chain); with --tls-key")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's PEM key (unencrypted)")
    p.add_argument("--host", action="append", default=[], metavar="NAME", dest="names",
                   help="a name clients reach the server by (repeatable): the Host check allows "
                   "only these and the bound address; the first is the printed link's")
    p.add_argument("--log-json", action="store_true", help="one JSON line a request on stderr "
                   "(time, principal, method, path without its query, status, milliseconds)")
    p.add_argument("--rate-limit", type=int, default=3000, metavar="N",
                   help="requests a minute per client address before a 429 (default 3000; "
                   "0: no limit)")


def cmd_ui(args):
    from overlord.web import server
    return server.serve(port=args.port, host=args.bind, folder=args.folder,
                        tls_cert=args.tls_cert, tls_key=args.tls_key, names=args.names,
                        log_json=args.log_json, rate_limit=args.rate_limit)


COMMANDS = {"ui": cmd_ui}
