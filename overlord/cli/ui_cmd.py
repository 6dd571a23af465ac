"""`overlord ui`: the workspace and the console, served on 127.0.0.1."""


def add_parsers(sub):
    p = sub.add_parser(
        "ui", help="the chat workspace (/) and the console (/console) on 127.0.0.1",
        description="Serve the workspace (a chat with the agent, one conversation per "
        "transaction) and the console (the register of sessions and their dossiers) on "
        "127.0.0.1. Prints the launch link, http://127.0.0.1:PORT/?token=...: the token (kept in "
        "OVERLORD_HOME/ui.token, mode 0600) is what proves you are the operator; scripts send "
        "it as 'Authorization: Bearer <token>'.")
    p.add_argument("--port", type=int, default=7777, metavar="N",
                   help="the port (default 7777; 0 picks a free one)")
    p.add_argument("--folder", metavar="DIR", help="the working folder new conversations use "
                   "until Settings names another (default: the current directory)")


def cmd_ui(args):
    from overlord.web import server
    return server.serve(port=args.port, folder=args.folder)


COMMANDS = {"ui": cmd_ui}
