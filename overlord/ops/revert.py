"""Revert: undo a committed session by staging its inverse as a new pending session."""
import os
import shlex
import time

from overlord.errors import OverlordError, UsageError
from overlord.ops.execute import _create_session, refuse_if_pending
from overlord.ops.grants import _check_backend_grants
from overlord.ops.home import valid_user
from overlord.ops.review import get_session
from overlord.sandbox import backends
from overlord.text import escape_path
from overlord.trust import audit
from overlord.txn import locks, retain
from overlord.txn import revert as txn_revert
from overlord.txn.session import remove_tree


def revert(sid, stack=False, backend=None, grants=None, policy_origin=None, broker=None,
           owner=None):
    """A new pending session whose one savepoint puts back what session sid replaced.
    Refused, staging nothing, if any path it touched changed again since. grants,
    policy_origin, broker: what the new session runs under and records (ops.Broker's; a
    person's revert opens with none, as `overlord run` unasked). owner: the account the new
    session is for (meta "owner"); None keeps the reverted session's (a CLI session's: none)."""
    if owner is not None and not valid_user(owner):
        raise UsageError(f"not an account name: {owner!r}")
    session = get_session(sid)
    state = session.meta["state"]
    if state != "committed":
        raise OverlordError(f"cannot revert session {sid}: it is {state}; only a committed "
                            "session can be reverted")
    if session.meta.get("imported"):
        raise OverlordError(f"cannot revert session {sid}: it is a record imported from "
                            f"{session.meta['imported'].get('from') or 'another machine'}, whose "
                            "commit did not happen here")
    record = retain.load(session)
    if record is None or not record.get("complete"):
        raise OverlordError(f"cannot revert session {sid}: its commit left no complete record "
                            "of what it replaced")
    target = session.target
    if not os.path.isdir(target):
        raise OverlordError(f"cannot revert session {sid}: its target {target} is gone")
    mod = backends.choose(backend)
    _check_backend_grants(mod, grants or {}, target)
    argv = ["overlord", "revert", sid]
    with locks.TargetLock(target):
        refuse_if_pending(target, stack)
        conflicts, contents = txn_revert.check(record, target)
        if conflicts:
            shown = "; ".join(f"{escape_path(p)}: {why}" for p, why in conflicts[:5])
            more = f" (and {len(conflicts) - 5} more)" if len(conflicts) > 5 else ""
            raise OverlordError(f"cannot revert session {sid}: {len(conflicts)} path"
                                f"{'' if len(conflicts) == 1 else 's'} changed since it was "
                                f"committed: {shown}{more}; nothing was staged")
        new = _create_session(target, mod, dict(grants or {}), argv, None, policy_origin, broker)
        try:
            upper, _ = new.prepare_upper()
            txn_revert.stage(upper, record, target, contents, new.dialect)
            index = new.seal({"kind": "revert", "of": sid, "command": shlex.join(argv)})
        except BaseException:
            remove_tree(new.dir)
            raise
        new.meta.update(state="pending", exit_code=0, finished=time.time(), reverts=sid)
        owner = owner if owner is not None else session.meta.get("owner")
        if owner is not None:
            new.meta["owner"] = owner
        if index is None:
            remove_tree(new.dir)
            raise OverlordError(f"nothing to revert: session {sid} changed nothing that is still there")
        new.save()
    audit.append("session.revert", sid=new.sid, target=target, reverts=sid,
                 **({} if owner is None else {"owner": owner}))
    return new.sid
