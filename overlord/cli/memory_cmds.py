"""`overlord memory show|user|journal|accept`: parse, call overlord.ops, render.  (issue 14: being built)"""


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""


COMMANDS = {}
