"""Placeholder (issue 15): filled in by its owner. add_parsers(sub) registers nothing yet."""


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""


COMMANDS = {}
