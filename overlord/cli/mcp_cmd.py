"""`overlord mcp serve`: OVERLORD as a Model Context Protocol server (overlord/mcp/, docs/MCP.md).

Parse, then hand over to the server; the server imports nothing until the command runs.
"""
import os

from overlord.errors import UsageError


def add_parsers(sub):
    """Register `overlord mcp` and its action on the main parser's subparsers."""
    m = sub.add_parser("mcp", help="OVERLORD as an MCP server for agent harnesses",
                       description="Serve OVERLORD's sessions to an MCP client (Claude Code, "
                       "Codex, ...): its shell and file tools then run inside a transaction a "
                       "person reviews and commits (docs/MCP.md).")
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


def cmd_mcp(args):
    from overlord.mcp import server
    target = os.path.abspath(args.target or ".")
    if not os.path.isdir(target):
        raise UsageError(f"-t {args.target}: not a directory")
    return server.serve(target, args.http)


COMMANDS = {"mcp": cmd_mcp}
