"""Policy as operations: the effective rule for a folder, validating a file, installing one."""
import dataclasses
import os

from overlord.errors import UsageError
from overlord.trust import policy
from overlord.ops.grants import resolve_target


@dataclasses.dataclass
class PolicyView:
    target: str
    file: str              # the live policy file
    exists: bool
    sha256: str            # of the live file, None when there is none
    matched: list          # the rules that apply, most specific first: "targets[/srv]", "default"
    rule: dict             # key -> effective value
    sources: dict          # key -> "built-in" | "default" | "targets[...]"; limits/checks per inner key


def policy_show(target=None):
    """The effective rule for target (default: the current directory) and where each value
    came from."""
    target = resolve_target(target)
    rule = policy.rule(target)
    return PolicyView(target, rule.path, rule.sha256 is not None, rule.sha256, list(rule.chain),
                      rule.as_dict(), {k: (dict(v) if isinstance(v, dict) else v)
                                       for k, v in rule.sources.items()})


def policy_check(path=None):
    """Validate a policy file (default: the live one). Returns {"file", "exists", "sha256",
    "targets"}; raises OverlordError("policy PATH: what") for the first problem."""
    if path is not None and not os.path.exists(path):
        raise UsageError(f"no such policy file: {path}")
    pol = policy.load(path)
    return {"file": pol.path, "exists": pol.sha256 is not None, "sha256": pol.sha256,
            "targets": sorted(pol.targets)}


def policy_set(path):
    """Validate the file at path, then make it the live policy (atomically, on the audit
    chain as policy.change). Returns {"file", "old_sha256", "sha256", "changed"}."""
    if not os.path.exists(path):
        raise UsageError(f"no such policy file: {path}")
    old, new = policy.install(path)
    return {"file": policy.policy_path(), "old_sha256": old, "sha256": new, "changed": old != new}


def policy_cap_preview(target, grants):
    """The grants a session on target asking for `grants` would get, held to the policy in
    force; OverlordError naming the rule when one is looser. Opens and records nothing: a face
    asks before it warns about what it was asked for (`agent --no-jail`)."""
    return policy.cap_grants(resolve_target(target), grants)
