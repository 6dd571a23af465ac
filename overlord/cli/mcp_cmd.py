"""`overlord mcp`: OVERLORD as a Model Context Protocol server (`serve`: overlord/mcp/,
docs/MCP.md), and the MCP servers OVERLORD's own agent may use as connectors (`add`, `list`,
`test`, `rm`, `approval`: OVERLORD_HOME/mcp.json, docs/CONNECTORS.md).

Parse, then hand over; the server and the connector code import nothing until a command runs.
Everything a server or the config chose is escaped before it is printed, and no secret is:
env and header values come back masked from overlord.ops.mcp_config.
"""
import os
import shlex

from overlord.cli import render as R
from overlord.errors import UsageError

APPROVALS = ("ask", "auto", "readonly")     # = overlord.agent.connectors.config.APPROVALS
APPROVAL_WORDS = {"ask": "actions ask first", "auto": "actions run without asking",
                  "readonly": "actions are refused; only read-only tools run"}
ACTS = {"ask": "acts: asks first", "auto": "acts: runs without asking (approval auto)",
        "readonly": "acts: refused (approval readonly)"}


def add_parsers(sub):
    """Register `overlord mcp` and its action on the main parser's subparsers."""
    m = sub.add_parser("mcp", help="OVERLORD as an MCP server; MCP servers as the agent's connectors",
                       description="`serve`: serve OVERLORD's sessions to an MCP client (Claude "
                       "Code, Codex, ...): its shell and file tools then run inside a transaction "
                       "a person reviews and commits (docs/MCP.md). `add`, `list`, `test`, `rm`, "
                       "`approval`: configure the MCP servers OVERLORD's own agent may be granted "
                       "as connectors (`overlord agent --connector NAME`), kept in "
                       "OVERLORD_HOME/mcp.json (mode 0600; docs/CONNECTORS.md). A connector acts "
                       "outside the sandbox and outside the transaction: actions ask first.")
    s = m.add_subparsers(dest="mcp_command", metavar="ACTION", parser_class=type(m))
    s.required = True
    serve = s.add_parser(
        "serve", help="serve MCP on stdio (or streamable HTTP on loopback)",
        description="Speak MCP (the stateless 2026-07-28 revision and the 2025-11-25 / "
        "2025-06-18 handshake; the client picks) on stdin/stdout, or with --http on "
        "127.0.0.1 behind the UI's launch token. Tools: open_session, exec, read_file, "
        "write_file, edit_file, list_dir, search, diff, savepoints, rewind, request_review, "
        "rollback. There is no commit tool: a person commits. Sessions are brokered: "
        "policy.json must have a `targets` entry covering the folder.")
    serve.add_argument("-t", "--target", metavar="DIR",
                       help="the project open_session opens by default (default: .)")
    serve.add_argument("--http", metavar="127.0.0.1:PORT",
                       help="streamable HTTP on loopback instead of stdio")
    _connector_parsers(s)


def _connector_parsers(s):
    a = s.add_parser(
        "add", help="configure an MCP server as a connector (--command or --url)",
        description="Add a server to OVERLORD_HOME/mcp.json. A stdio server is a command OVERLORD "
        "starts for each session that is granted it; it gets only the --env given here plus "
        "PATH, HOME and LANG, never your environment (no provider key reaches a connector). An "
        "http server is a streamable-HTTP MCP endpoint; --header values (a token) are sent with "
        "every request. Values are stored in the 0600 file and shown masked by `mcp list`. "
        "Example: overlord mcp add github --command npx "
        "--arg -y --arg @modelcontextprotocol/server-github --env GITHUB_TOKEN=ghp_...")
    a.add_argument("name", metavar="NAME",
                   help="the connector's name: a letter or digit, then up to 31 letters, digits "
                   "or '-' (its tools are offered as mcp__NAME__TOOL)")
    how = a.add_mutually_exclusive_group(required=True)
    how.add_argument("--command", dest="program", metavar="CMD",       # not `command`: the
                     help="the program of a stdio server")            # subcommand's dest
    how.add_argument("--url", metavar="URL", help="the http:// or https:// URL of a "
                     "streamable-HTTP server")
    a.add_argument("--arg", dest="args", metavar="A", action="append", default=[],
                   help="an argument to CMD, which may begin with '-' (--arg -y); repeat for each")
    a.parse_known_args = _arg_values_may_start_with_dash(a.parse_known_args)
    a.add_argument("--env", metavar="K=V", action="append", default=[],
                   help="an environment variable for CMD (repeatable)")
    a.add_argument("--header", dest="headers", metavar="'K: V'", action="append", default=[],
                   help="an HTTP header sent to URL, e.g. 'Authorization: Bearer ...' (repeatable)")
    a.add_argument("--replace", action="store_true", help="replace a server of the same name")
    a.add_argument("--json", action="store_true", help="machine-readable output (masked)")

    ls = s.add_parser("list", help="the configured connectors and the approval mode (masked)",
                      description="The approval mode, then one line per configured server: "
                      "its name, transport, command line or URL, and the names of its env "
                      "variables or headers with their values masked. Nothing secret is shown.")
    ls.add_argument("--json", action="store_true", help="machine-readable output (masked)")

    t = s.add_parser("test", help="connect to a connector and list its tools",
                     description="Start (or reach) the server as a session would, and print "
                     "its name and version, the protocol revision it speaks and each tool: the "
                     "name the agent is offered it under, whether it is read-only by the "
                     "server's own claim (readOnlyHint) or acts (and so goes through the "
                     "approval gate), and whether it is withheld as shell-shaped (a session "
                     "needs the connector_shell grant for those). The server's stderr goes to "
                     "OVERLORD_HOME/mcp-test-NAME.log. A server that fails is one line, exit 1.")
    t.add_argument("name", metavar="NAME", help="a name `overlord mcp list` shows")
    t.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="how long the server may take to start (default: 20, as in a session)")
    t.add_argument("--json", action="store_true", help="machine-readable output")

    rm = s.add_parser("rm", help="remove a configured connector",
                      description="Remove a server from OVERLORD_HOME/mcp.json. Sessions that "
                      "were granted it cannot use it when resumed.")
    rm.add_argument("name", metavar="NAME", help="a name `overlord mcp list` shows")

    ap = s.add_parser("approval", help="show or set what a connector action needs: ask|auto|readonly",
                      description="How a connector tool that is not read-only (by the server's "
                      "readOnlyHint) is treated. ask (the default): the run pauses and a person "
                      "allows or denies the exact call (the terminal's prompt, the workspace's "
                      "card; a run with no one to ask is denied). auto: allowed without asking. "
                      "readonly: refused; only read-only tools run. Every decision is recorded. "
                      "Without MODE, print the current one.")
    ap.add_argument("mode", nargs="?", choices=APPROVALS, metavar="MODE",
                    help="ask, auto or readonly")


def _arg_values_may_start_with_dash(parse):
    """`--arg -y` as the spec writes it: argparse would take -y for an option, so each --arg's
    value is joined to it (--arg=-y) before parsing."""
    def parse_known_args(args=None, namespace=None):
        if args is not None:
            args, joined = list(args), []
            while args:
                word = args.pop(0)
                if word == "--":
                    joined += [word, *args]
                    break
                joined.append(f"--arg={args.pop(0)}" if word == "--arg" and args else word)
            args = joined
        return parse(args, namespace)
    return parse_known_args


def cmd_mcp(args):
    if args.mcp_command != "serve":
        return CONNECTOR_ACTIONS[args.mcp_command](args)
    from overlord.mcp import server
    target = os.path.abspath(args.target or ".")
    if not os.path.isdir(target):
        raise UsageError(f"-t {args.target}: not a directory")
    return server.serve(target, args.http)


# -- connectors --------------------------------------------------------------------------------

def _ops():
    from overlord.ops import mcp_config
    return mcp_config


def _add(args):
    server = _ops().mcp_add(args.name, command=args.program, args=args.args, env=args.env,
                            url=args.url, headers=args.headers, replace=args.replace)
    if args.json:
        R.dump_json(server)
        return 0
    print(f"added {server['name']} ({server['transport']}): {_where(server)}")
    return 0


def _list(args):
    listing = _ops().mcp_list()
    if args.json:
        R.dump_json(listing)
        return 0
    mode = listing["approval"]
    print(f"approval: {mode} ({APPROVAL_WORDS[mode]})  [{R.escape_path(listing['file'])}]")
    if not listing["servers"]:
        print("no connectors configured: add one with `overlord mcp add NAME --command CMD` "
              "or `--url URL`")
        return 0
    rows = [("NAME", "TRANSPORT", "COMMAND OR URL", "ENV OR HEADERS")]
    rows += [(s["name"], s["transport"], _where(s), _secrets(s) or "-") for s in listing["servers"]]
    print(R.table(rows))
    return 0


def _where(server):
    """The command line or the URL, escaped (the config chose it)."""
    if server["transport"] == "http":
        return R.escape_text(server["url"])
    return R.escape_text(shlex.join([server["command"], *server["args"]]))


def _secrets(server):
    if server["transport"] == "http":
        return ", ".join(R.escape_text(f"{k}: {v}") for k, v in server["headers"].items())
    return ", ".join(R.escape_text(f"{k}={v}") for k, v in server["env"].items())


def _test(args):
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout: a number of seconds above 0")
    report = _ops().mcp_test(args.name, start_timeout=args.timeout)
    if args.json:
        R.dump_json(report)
        return 0
    info = report["server_info"]
    about = " ".join(R.escape_text(str(info[k])) for k in ("name", "version")
                     if isinstance(info.get(k), (str, int, float)))
    print(f"{report['name']}: {about or '(the server gave no name)'} ({report['transport']})")
    print(f"protocol: {R.escape_text(str(report['version']))} (era: {report['era']})")
    tools = report["tools"]
    acting = sum(1 for t in tools if not t["readonly"])
    withheld = sum(1 for t in tools if t["withheld"])
    print(f"approval: {report['approval']}; {len(tools)} tool{'' if len(tools) == 1 else 's'}: "
          f"{len(tools) - acting} read-only by the server's claim, {acting} acting"
          + (f", {withheld} withheld as shell-shaped" if withheld else ""))
    rows = []
    for t in tools:
        status = "read-only (server's claim)" if t["readonly"] else ACTS[report["approval"]]
        notes = []
        if t["withheld"]:
            notes.append("withheld (shell-shaped)")
        if t["offered"] != f"mcp__{report['name']}__{t['tool']}":
            notes.append(f"tool {R.escape_text(repr(t['tool']))}")
        rows.append(("  " + t["offered"], status, ", ".join(notes)))
    if rows:
        print(R.table(rows))
    return 0


def _rm(args):
    server = _ops().mcp_remove(args.name)
    print(f"removed {server['name']} ({server['transport']}): {_where(server)}")
    return 0


def _approval(args):
    result = _ops().mcp_approval(args.mode)
    mode, was = result["approval"], result["was"]
    change = "" if was is None else f" (was {was})" if was != mode else " (unchanged)"
    print(f"approval: {mode}{change}: {APPROVAL_WORDS[mode]}")
    return 0


CONNECTOR_ACTIONS = {"add": _add, "list": _list, "test": _test, "rm": _rm, "approval": _approval}
COMMANDS = {"mcp": cmd_mcp}
