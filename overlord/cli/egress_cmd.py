"""`overlord egress SID [--json]`: what a `--net proxy` session talked to (docs/EGRESS.md)."""


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers (issue 17: filled in
    by its owner)."""


COMMANDS = {}
