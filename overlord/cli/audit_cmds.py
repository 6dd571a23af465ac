"""CLI subcommands (being written this session)."""

COMMANDS = {}


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
