"""The decision: commit (by cause, merged, crash-atomic) or roll back; and crash recovery."""
import dataclasses
import time

from overlord.errors import OverlordError, UsageError
from overlord.sandbox import limits
from overlord.txn import changes as C
from overlord.txn import commit as K
from overlord.txn import gitdir, history, locks, objects, replay, retain, store
from overlord.txn import layers as L
from overlord.txn.session import Session, remove_tree
from overlord.ops import clearance
from overlord.ops.grants import require_target
from overlord.ops.review import get_session
from overlord.trust import audit
from overlord.agent import memory
from overlord import hosttools


# -- decide ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class CommitResult:
    sid: str
    changes: list
    merged: list
    findings: list = dataclasses.field(default_factory=list)   # the gate's, below `block`
    countersigned: dict = None    # the approval that countersigned it, if one was needed
    released: list = dataclasses.field(default_factory=list)  # held requests sent (ops.release_held rows)
    dropped_held: list = dataclasses.field(default_factory=list)   # held request ids dropped
    egress_error: str = None      # the tree landed, but releasing/dropping failed: why


def commit(sid, force=False, merge=False, only=(), drop=(), allow_privileged=False,
           countersigned=False, release_held=False):
    """Replay the session (or the savepoints chosen by cause) onto the real tree.
    allow_privileged: the person accepts setuid/setgid bits, file capabilities and ACLs for
    other principals that the session adds (refused otherwise; recorded when allowed).
    countersigned: refuse unless a fresh, complete second-model approval is on record.
    Policy, the content gate and the verdicts are checked by ops.clearance; every refusal
    after the session is found is on the audit chain (session.commit_refused).
    release_held (a --net proxy --hold-writes session's held requests, docs/EGRESS.md): False
    drops them all; True sends them all, in id order; a list of ids sends those (in id order)
    and drops the rest. An id that is not waiting is refused before anything lands; the
    requests go out only once the tree has landed (a refused or failed commit sends none)."""
    session = get_session(sid)
    state = session.meta["state"]
    if state not in store.OPEN_STATES:
        raise OverlordError(f"cannot commit session {sid}: it is {state}")
    chosen_held = _chosen_held(session, release_held)
    audit.ready()          # a chain that cannot be written refuses the act, never skips it
    try:
        result, cleared = _commit(session, force, merge, only, drop, allow_privileged,
                                  countersigned)
    except UsageError:
        raise
    except OverlordError as exc:
        audit.append("session.commit_refused", sid=sid, target=session.target, reason=str(exc))
        raise
    audit.append("session.commit", sid=sid, target=session.target, changes=len(result.changes),
                 forced=bool(session.meta.get("forced")), merged=result.merged,
                 layers=session.meta.get("committed_layers"), **cleared.record())
    result.findings, result.countersigned = cleared.findings, cleared.approval
    memory.journal_commit(get_session(sid))     # an agent session's line in the folder's journal
    _settle_held(sid, chosen_held, result)
    return result


def _chosen_held(session, release_held):
    """The held ids a commit will send ([] for none), checked before anything lands."""
    from overlord.ops import egress
    if release_held is False or release_held is None:
        return []
    if release_held is True:
        return egress.waiting_ids(session)
    if isinstance(release_held, str) or not isinstance(release_held, (list, tuple)):
        raise UsageError("release_held is true, false or a list of held request ids")
    return egress.check_ids(session, list(release_held))


def _settle_held(sid, chosen, result):
    """After the tree landed: send the chosen held requests, drop the rest. The commit stands
    whatever happens here; a failure is carried on the result, not raised."""
    from overlord.ops import egress
    try:
        if chosen:
            result.released = egress.release_held(sid, chosen)
        result.dropped_held = egress.drop_held(sid)
    except (OSError, OverlordError, ValueError) as exc:
        result.egress_error = str(exc)


def _commit(session, force, merge, only, drop, allow_privileged, countersigned):
    sid = session.sid
    require_target(session.target, session.meta.get("target_id"))
    if merge and not session.meta.get("merge_base"):
        raise UsageError(f"commit --merge needs a session opened with --merge-base ({sid} was not)")
    if merge and not hosttools.find("git"):
        raise OverlordError("commit --merge needs git (git merge-file); install git")
    chosen = history.select_some(session, only, drop, "commit")
    with locks.TargetLock(session.target):
        layers = session.read_layers(chosen)
        view = L.stack(layers)
        records = session.provenance()
        recorded = session.recorded(chosen, records)
        plan = C.plan(view, session.target, session.dialect, recorded)
        history.require_class(plan, chosen)
        git = gitdir.summarize(session.target, plan, session.left_out())   # kept for `log`
        privileged = K.privileged(plan)
        if privileged and not allow_privileged:
            K.refuse_privileged(privileged)
        cleared = clearance.clear(session, plan, force=force, countersigned=countersigned)
        drifts = K.check_drift(session, view, records, layers)
        merged = {}
        if drifts and merge:
            hard = [d for d in drifts if not d.forceable]
            K.refuse_if_drift(hard, force=False)
            merged = K.three_way(session, drifts, view)
            cleared.refuse_merge(merged)
            drifts = []
        K.refuse_if_drift(drifts, force, merge_base=session.meta.get("merge_base"))
        session.drop_flat()          # its hard links would keep files from moving into place
        keeper = objects.Keeper(sid)

        def done(bfd, steps):
            """The tree is committed and the journal says so: record it before the journal
            goes, then keep what was replaced while the backup still holds it."""
            session.meta.update(state="committed", committed=time.time(),
                                forced=bool(force and drifts), merged=sorted(merged),
                                committed_layers=sorted(chosen) if chosen is not None else None)
            if isinstance(chosen, history.Chosen):
                session.meta["committed_classes"] = chosen.classes()
            session.meta["git_summary"] = git
            if privileged:
                session.meta["allowed_privileged"] = [{"path": p, "adds": why}
                                                      for p, why in privileged]
            session.meta["clearance"] = cleared.record()
            session.save()
            _keep_record(session, chosen, keeper, bfd, steps, after, records)
        try:
            after = retain.written(keeper, view, merged, records)
            replay.replay(sid, session.target, view, merged, consume=_may_move(session),
                          on_done=done, recorded=recorded,
                          dialect=session.dialect)
        except BaseException:
            keeper.abandon()
            raise
    _drop_working_files(session)
    return CommitResult(sid, plan, sorted(merged)), cleared


def _may_move(session):
    """May commit move the layer's files into the tree (no copy)? Not where a command that was
    contained could have handed an open fd on one to a process outside: a jail with the
    host's network (an abstract unix socket) on the kernel backend. fuse-overlayfs stands
    between a command and the layer (its handles die with the mount); a jail with --net none
    has no channel out, nor --net proxy (its one way out is TCP to the proxy's back, which
    carries no fds; the session's namespace holds no one else's unix sockets); an unjailed
    command was never contained."""
    grants = session.meta.get("grants") or {}
    return (session.dialect == "fuse" or not grants.get("jail")
            or grants.get("net") in ("none", "proxy"))


def _keep_record(session, chosen, keeper, bfd, steps, after, records):
    """The committed record (before/after of every path) and its objects. The commit already
    stands: a failure here costs blame and revert their detail, never the commit."""
    before = None
    try:
        before = retain.replaced(keeper, bfd, steps)
        retain.layer_versions(keeper, session, chosen, records)
        retain.base_copies(keeper, session)
        keeper.finish()
    except OSError:
        pass
    try:
        retain.save(session, before, after, keeper)
    except OSError:
        pass


def rollback(sid):
    session = get_session(sid)
    with locks.TargetLock(session.target):     # never under a command still running in it
        session = get_session(session.sid)
        state = session.meta["state"]
        if state not in store.OPEN_STATES:
            raise OverlordError(f"cannot roll back session {sid}: it is {state}")
        session.meta.update(state="rolled-back", rolled_back=time.time())
        session.save()
        _drop_working_files(session)
        audit.append("session.rollback", sid=sid, target=session.target)
    from overlord.ops import egress
    try:
        dropped = egress.drop_held(sid)       # a rolled-back session's held requests never go
    except (OSError, OverlordError, ValueError):
        dropped = None       # the rollback stands; its held records stay unsent ("held")
    if dropped:
        session.meta["dropped_held"] = dropped
    return session.meta


def _drop_working_files(session):
    """Keep the small record (meta, provenance, syscalls); drop layers, scratch dirs and the
    session's cgroup."""
    limits.Cgroup(session.sid, None).remove()
    for name in ("layers", "flat", "upper", "work", "merged", "base"):
        remove_tree(session.path(name))


def recover():
    """Settle any commit a crash interrupted: undo it if it was not finished, or complete the
    bookkeeping if it was. Every overlord command calls this first; it costs one listdir."""
    for data in replay.pending_journals():
        try:
            with locks.TargetLock(data["target"], wait=True):
                if data["state"] == "done":
                    session = Session.load(data["sid"])
                    if session.meta["state"] != "committed":
                        session.meta.update(state="committed", committed=time.time(), recovered=True)
                        session.save()
                        audit.append("session.commit", sid=session.sid, target=session.target,
                                     recovered=True)
                    replay.settle(data)
                    _drop_working_files(session)
                    memory.journal_commit(session)     # unless the commit wrote it before the crash
                else:
                    replay.undo(data)
                    _note_restored(Session.load(data["sid"]), data)
        except (OSError, OverlordError):
            continue


def _note_restored(session, data):
    """Undoing a commit renames the originals back, which moves their ctime: remember the
    restored (inode, ctime) so the retried commit does not mistake our own undo for drift."""
    restored = {}
    for step in data["steps"]:
        st = C.lstat_or_none(C.real_path(data["target"], step["path"]))
        if st is not None and step["existed"] and st.st_ino == step["ino"]:
            restored[step["path"]] = [st.st_ino, st.st_ctime_ns]
    store.write_json_atomic(session.path("restored.json"), restored)
