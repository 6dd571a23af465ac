"""The countersignature: a second model reviews a pending session; its verdicts and their standing.

review() refuses before any model is called: an unknown session, one that is not pending or
timed-out, an unknown provider or a missing key, a reviewer whose provider:model is the
agent's own (unless same_model: the verdict then records it), selectors that match nothing, an
audit chain that cannot be written. Then, holding the session's review lock for the whole
review (one at a time; for an agent session also its writer lock, so no resume or rewind runs
meanwhile), it builds the plan, its fingerprint and the dossier from one reading of the layers
under the target lock (no command seals a savepoint in between), serves read_file from that
same view, and records the verdict on session.meta["reviews"] and as the audit act
`review.verdict`. A command that writes during the review makes the verdict stale at once: it
is bound to the fingerprint of what the reviewer was shown.

Every review call is on the cost ledger (kind "review", the reviewed session's sid, the
account of the owner who asked) and checked against the budget lines before it is made
(trust/cost.Meter, agent/reviewer.py): a stop is the verdict "no-verdict" with a reason
naming the line, a `budget` event in review.jsonl and `budget` on the verdict's record. The
verdict carries `cost`: that review's own calls.
"""
import contextlib
import dataclasses
import errno
import fcntl
import os

from overlord.agent import dossier as D
from overlord.agent import providers, ratelimit
from overlord.agent import reviewer as RV
from overlord.agent import transcript as T
from overlord.errors import OverlordError, UsageError
from overlord.ops import patch
from overlord.ops.agent import _recordable, _served_model, endpoint
from overlord.ops.grants import require_target
from overlord.ops.review import describe, get_session
from overlord.trust import audit, cost, gate, policy
from overlord.trust import verdict as V
from overlord.txn import changes as C
from overlord.txn import history, locks, store
from overlord.txn import layers as L
from overlord.txn.session import Session

LOCK = "review.lock"


@dataclasses.dataclass
class Standing:
    approval: dict = None         # the newest fresh approval on a complete view: countersigns
    rejection: dict = None        # the newest fresh rejection: blocks a commit unless --force
    unsigned: dict = None         # an approval on record that its signed line does not bear out


def standing(session, fingerprint):
    """What the session's verdicts say about committing the plan with this fingerprint. An
    approval counts only when the audit chain carries its review.verdict line, signed, saying
    the same (session, number, verdict, fingerprint, complete view, selection)."""
    approval, rejection = V.standing(session.meta.get("reviews"), fingerprint)
    if approval is not None and not _on_chain(session.sid, approval):
        return Standing(None, rejection, unsigned=approval)
    return Standing(approval, rejection)


def _on_chain(sid, verdict):
    where = verdict.get("audit") or {}
    try:
        line = audit.attested(where.get("seq"), where.get("offset"))
    except OverlordError:
        return False
    return (line.get("action") == "review.verdict" and line.get("sid") == sid
            and line.get("n") == verdict.get("n") and line.get("verdict") == verdict.get("verdict")
            and line.get("fingerprint") == verdict.get("fingerprint")
            and line.get("partial") is False
            and V.canonical(line.get("selection")) == V.canonical(verdict.get("selection")))


def reviews(sid):
    """Every verdict on record, oldest first, each with "fresh": whether it binds the plan of
    its own selection as the session stands now (False once that selection matches nothing)."""
    session = get_session(sid)
    out = [dict(v) for v in session.meta.get("reviews") or ()]
    if not out:
        return out
    staged = session.meta["state"] in store.OPEN_STATES
    if staged:
        require_target(session.target, session.meta.get("target_id"))
    prints = {}
    for v in out:
        key = V.canonical(v.get("selection"))
        if key not in prints:
            prints[key] = _current_fingerprint(session, v.get("selection")) if staged else None
        v["fresh"] = V.fresh(v, prints[key])
    return out


def _current_fingerprint(session, selection):
    sel = selection or {}
    try:
        chosen = history.select(session, sel.get("only") or (), sel.get("drop") or ())
    except UsageError:
        return None
    if chosen is not None and not chosen:
        return None
    return V.fingerprint_plan(session.target, session.plan(chosen))


def review(sid, *, provider=None, model=None, base_url=None, headers=None, knobs=None, script=None,
           api=None, azure_api_version=None, same_model=False, only=(), drop=(), on_event=None,
           owner=None):
    """Have a second model review the session's pending change; returns the verdict (the
    record session.meta["reviews"] keeps, see trust/verdict.py). owner: the account asking
    (its own key first; the machine's shared key only to the provider's own endpoint --
    ops.agent.endpoint), None for the CLI."""
    session = get_session(sid)
    _require_open(session)
    knobs = dict(knobs or {})
    for key, value in (("api", api), ("azure_api_version", azure_api_version)):
        if value is not None:
            knobs[key] = value
    history.select_some(session, only, drop, "review")    # a bad selection before any key
    ep = endpoint(provider, model, base_url, headers, knobs, script, owner=owner)
    reviewer = V.model_id(ep.provider, _served_model(ep))
    agent = V.agent_model(session.meta)
    if agent is not None and reviewer == agent and not same_model:
        raise OverlordError(f"the reviewer {reviewer} is this session's own agent model: the "
                            "second model must be another one (--same-model reviews with it "
                            "anyway, and the verdict records that)")
    require_target(session.target, session.meta.get("target_id"))
    selection = V.selection(only, drop)
    audit.ready()
    with _one_review(session), T.exclusive(session.dir, "review"):
        with locks.TargetLock(session.target):
            session = get_session(sid)
            _require_open(session)
            chosen = history.select_some(session, only, drop, "review")
            view = L.stack(session.read_layers(chosen))
            plan = C.plan(view, session.target, session.dialect, session.recorded(chosen))
            rows = V.rows(session.target, plan)
            fingerprint = V.fingerprint_rows(rows)
            findings = gate.scan(session.target, plan, policy.rule(session.target)["checks"])
            number = _next_number(session)
            target = session.target
            dossier = D.build(session, plan, rows, fingerprint,
                              render=lambda ch: patch.render(target, ch, describe(ch)),
                              findings=findings, selection=selection, number=number)
        record = RV.Record(V.review_path(session.dir), number, on_event)
        record("start", reviewer=reviewer, agent=agent, same_model=reviewer == agent,
               fingerprint=fingerprint, selection=selection, unseen=dossier.unseen,
               system=RV.system_prompt(dossier.nonce), dossier=dossier.text,
               endpoint=_recordable(ep))
        try:
            outcome = RV.Review(providers.get(ep.provider), ep, RV.View(target, view), dossier,
                                record, on_headers=ratelimit.record,
                                meter=cost.Meter(sid, target, owner)).run()
        except BaseException as exc:
            record("aborted", why=type(exc).__name__)
            raise
        verdict = V.record(number, outcome.verdict, outcome.reason, outcome.paths, fingerprint,
                           selection, dossier.unseen, outcome.read, reviewer, agent,
                           reviewer == agent, outcome.turns)
        verdict["cost"] = outcome.cost
        if outcome.budget:
            verdict["budget"] = outcome.budget
        record("verdict", verdict=verdict, usage=outcome.usage)
        # on the chain first: the session's record of a verdict counts only with its signed
        # line (standing() reads that line back), so an edit of meta.json countersigns nothing
        line, offset = audit.append_located(
            "review.verdict", sid=sid, target=target, n=number, verdict=verdict["verdict"],
            fingerprint=fingerprint, partial=verdict["partial"], reviewer=reviewer,
            same_model=verdict["same_model"], agent=agent, selection=selection)
        verdict["audit"] = {"seq": line["seq"], "offset": offset}
        with locks.TargetLock(target, wait=True):
            fresh = Session.load(sid)
            fresh.meta.setdefault("reviews", []).append(verdict)
            fresh.save()
    return verdict


def _require_open(session):
    state = session.meta["state"]
    if state not in store.OPEN_STATES:
        raise OverlordError(f"cannot review session {session.sid}: it is {state} (only a pending "
                            "change can be reviewed)")


def _next_number(session):
    """One more than every review on record or begun in review.jsonl (a review cut short by
    Ctrl-C leaves a start there and no verdict: its number is not given again)."""
    begun = sum(1 for e in store.read_jsonl(V.review_path(session.dir)) if e.get("type") == "start")
    return max(len(session.meta.get("reviews") or ()), begun) + 1


@contextlib.contextmanager
def _one_review(session):
    fd = os.open(session.path(LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OverlordError(f"session {session.sid} is being reviewed already: wait "
                                    "for that verdict") from None
            raise
        yield
    finally:
        os.close(fd)
