"""The agent's subcommands (agent, resume, transcript, keys, models): parse, call
overlord.ops, render."""

COMMANDS = {}


def add_parsers(sub):
    """Register the agent's subcommands on the main parser's subparsers."""
