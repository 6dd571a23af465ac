"""The content gate as an operation: what `overlord check SID` reports and `commit` enforces.

check(sid) scans the plan of a pending session (or of the savepoints --only/--drop choose)
with the severities of the policy rule for its target (overlord.trust.policy, `checks`).
A finding that blocks refuses the commit; one that needs a countersignature needs a fresh
complete approval; a warning is only shown. Reading only: nothing is recorded.
"""
import dataclasses

from overlord.errors import OverlordError
from overlord.trust import gate, policy
from overlord.txn import history, store
from overlord.ops.grants import require_target
from overlord.ops.review import get_session


@dataclasses.dataclass
class CheckReport:
    sid: str
    findings: list            # [gate.Finding], in plan order
    blocking: list            # the findings whose severity is block
    countersign: list         # ... countersign
    warnings: list            # ... warn
    checks: dict = None       # the effective severities and size_mb the scan used
    sources: dict = None      # where each of them came from ("built-in", "default", "targets[...]")

    @property
    def blocks(self):
        return bool(self.blocking)

    def as_dict(self):
        return {"sid": self.sid, "blocks": self.blocks,
                "findings": [f.as_dict() for f in self.findings],
                "counts": {"block": len(self.blocking), "countersign": len(self.countersign),
                           "warn": len(self.warnings)},
                "checks": dict(self.checks or {}), "sources": dict(self.sources or {})}


def check(sid, only=(), drop=()):
    """CheckReport of a pending session's plan (the savepoints the selectors choose)."""
    session = get_session(sid)
    state = session.meta["state"]
    if state not in store.OPEN_STATES:
        raise OverlordError(f"cannot check session {sid}: it is {state} (its changes are no "
                            "longer staged)")
    require_target(session.target, session.meta.get("target_id"))
    chosen = history.select_some(session, only, drop, "check")
    plan = session.plan(chosen)
    rule = policy.rule(session.target)
    findings = gate.scan(session.target, plan, rule["checks"])
    blocking, countersign, warnings = gate.partition(findings)
    return CheckReport(sid, findings, blocking, countersign, warnings, gate.levels(rule["checks"]),
                       {k: rule.source(f"checks.{k}") for k in gate.DEFAULTS})
