"""What a commit must satisfy beyond the tree itself: the folder's policy, the content gate,
protected paths and the second model's verdicts. Decided here once, for every face.

The order is the order a person would want to hear it in: what can never land (a gate finding
at `block`), what --force may not override (policy allow_force, protected paths), what needs a
fresh, complete second-model approval (--countersigned, require_review, protected paths, gate
findings at `countersign`), and last a fresh rejection, which only --force overrides.
"""
import dataclasses

from overlord.errors import Conflict
from overlord.text import escape_path
from overlord.trust import gate, policy, protect, verdict


@dataclasses.dataclass
class Clearance:
    rule: object                  # the policy rule for the target (trust.policy.Rule)
    findings: list                # gate findings at warn or countersign (block refused)
    protected: list               # changed paths under protection
    fingerprint: str = None       # of the plan, when a verdict or a rule needed it
    approval: dict = None         # the fresh, complete approval that countersigns
    rejection: dict = None        # a fresh rejection --force overrode
    needs: list = dataclasses.field(default_factory=list)   # why an approval was needed

    def refuse_merge(self, merged):
        """A merge lands bytes no reviewer saw: never under a required approval."""
        if merged and self.needs:
            raise Conflict(f"commit refused: {self.needs[0]} needs an approval of exactly what "
                           f"lands, and --merge would land a three-way merge of "
                           f"{escape_path(sorted(merged)[0])}{_more(sorted(merged))} that no "
                           "reviewer saw; commit without --merge, or review after the outside "
                           "change")

    def record(self):
        """What the audit act and the session record carry about the clearance."""
        out = {"policy": self.rule.origin(), "fingerprint": self.fingerprint}
        if self.approval:
            out["countersigned"] = {"review": self.approval["n"],
                                    "reviewer": self.approval.get("reviewer")}
        if self.rejection:
            out["overrode_rejection"] = self.rejection["n"]
        if self.protected:
            out["protected"] = self.protected[:20]
        if self.findings:
            out["findings"] = [f"{f.severity} {f.kind} {f.path}" for f in self.findings[:20]]
        return out


def clear(session, plan, *, force=False, countersigned=False):
    """Clearance for committing `plan` (the session's plan for the chosen savepoints), or
    Conflict naming the first rule it breaks. Reads the policy file and the verdicts afresh."""
    from overlord.ops.countersign import standing      # it imports ops.review: import late
    target = session.target
    rule = policy.rule(target)
    findings = gate.scan(target, plan, rule["checks"])
    blocking, second, _ = gate.partition(findings)
    if blocking:
        raise Conflict(f"commit refused: the content gate blocks {_finding(blocking[0])}"
                       f"{_more(blocking)} (policy checks.{blocking[0].kind}: block, "
                       f"from {rule.source('checks.' + blocking[0].kind)})")
    shielded = protect.protected(target, plan, rule["protect"])    # a removed dir counts too
    if force and not rule["allow_force"]:
        raise Conflict(f"commit refused: policy forbids --force here (allow_force: false, from "
                       f"{rule.source('allow_force')})")
    if force and shielded:
        raise Conflict(f"commit refused: --force is never allowed for a protected path: "
                       f"{escape_path(shielded[0])}{_more(shielded)}")
    needs = []
    if countersigned:
        needs.append("--countersigned")
    if rule["require_review"]:
        needs.append(f"policy require_review (from {rule.source('require_review')})")
    if shielded:
        needs.append(f"the protected path {escape_path(shielded[0])}{_more(shielded)}")
    if second:
        needs.append(f"the content gate's {_finding(second[0])}{_more(second)}")
    clearance = Clearance(rule, findings, shielded, needs=needs)
    if not needs and not session.meta.get("reviews"):
        return clearance          # nothing to bind: no fingerprint to compute
    clearance.fingerprint = verdict.fingerprint_plan(target, plan)
    held = standing(session, clearance.fingerprint)
    if needs and held.approval is None:
        why = ("the approval on record is not the one the audit chain signed (the record was "
               "edited)" if held.unsigned else _why_none(session, clearance.fingerprint))
        raise Conflict(f"commit refused: {needs[0]} needs a fresh, complete second-model "
                       f"approval ({why}); run `overlord review {session.sid}`")
    if held.rejection is not None:
        if not force:
            raise Conflict(f"commit refused: the second model rejected this change (review "
                           f"#{held.rejection['n']}: {_short(held.rejection.get('reason'))}); "
                           "--force overrides")
        clearance.rejection = held.rejection
    clearance.approval = held.approval if needs else None
    return clearance


def _finding(f):
    where = escape_path(f.path) + (f":{f.line}" if f.line else "")
    return f"{f.kind} in {where} ({f.what})"


def _more(items):
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _short(text, n=120):
    text = " ".join(str(text or "").split())
    text = text if len(text) <= n else text[:n - 1] + "…"
    return escape_path(text)


def _why_none(session, fingerprint):
    """Why no verdict on record countersigns this plan: the person's next step depends on it."""
    reviews = session.meta.get("reviews") or []
    if not reviews:
        return "none on record"
    fresh = [v for v in reviews if v.get("fingerprint") == fingerprint]
    if not fresh:
        return "every verdict on record is stale: the change moved since it was reviewed"
    last = fresh[-1]
    if last.get("verdict") == "approve" and last.get("partial"):
        return "the fresh approval saw only part of the change"
    return f"the fresh verdict is {last.get('verdict')}"
