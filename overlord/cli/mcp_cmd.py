"""(being built in issue 12: see the module's owner in /work/brief/common.md)"""

COMMANDS = {}


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
