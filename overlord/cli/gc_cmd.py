"""Placeholder (issue 16): its owner fills it in."""


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""


COMMANDS = {}
