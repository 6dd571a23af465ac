"""The content gate's table of checks: its kinds, their severities and the built-in values.

Policy validates `checks` against this table without importing the gate itself, whose rules
(a dozen compiled regexes) would otherwise cost every command that reads policy -- each
`exec` -- a couple of milliseconds to build. overlord/trust/gate.py applies the checks.
"""
KINDS = ("secrets", "binaries", "dependencies", "git_exec", "size")
SEVERITIES = ("block", "countersign", "warn")
LEVELS = SEVERITIES + ("off",)
DEFAULTS = {"secrets": "countersign", "binaries": "warn", "dependencies": "warn",
            "git_exec": "countersign", "size_mb": 50}
