"""Savepoints, rewind, fork and compare."""
import os
import shutil
import time

from overlord.agent import transcript as agent_transcript
from overlord.errors import OverlordError, UsageError
from overlord.txn import history, locks, store
from overlord.txn.session import remove_tree
from overlord.ops.execute import _new_session_dir
from overlord.ops.home import valid_user
from overlord.ops.review import _require_layers, get_session
from overlord.trust import audit


FORK_DROPS = ("rewinds", "limit", "exit_code", "flat", "reviews", "clearance", "opened_seq",
              "attestation", "needs_review")


# -- history ------------------------------------------------------------------------------------

def _open_session(sid, what):
    session = get_session(sid)
    if session.meta["state"] not in store.OPEN_STATES:
        raise OverlordError(f"cannot {what} session {sid}: it is {session.meta['state']}")
    return session


def savepoints(sid):
    return history.savepoints(get_session(sid))


def rewind(sid, to):
    """Drop every savepoint above @to (refused while a command runs on the target)."""
    session = _open_session(sid, "rewind")
    history.check_index(session, to)
    with locks.TargetLock(session.target):
        session = get_session(sid)
        # an agent's transcript is cut at the same point (refused while the agent runs)
        with agent_transcript.exclusive(session.dir, "rewind"):
            dropped = history.rewind(session, to)
            if dropped:
                agent_transcript.cut_for_rewind(session.dir, to)
        if dropped:
            audit.append("session.rewind", sid=sid, target=session.target, to=to,
                         dropped=len(dropped))
        return dropped


def fork(sid, at, owner=None):
    """A new pending session on the same snapshot holding a copy of the stack up to @at.
    owner: the account the fork is for (meta "owner"); None keeps the source's (a CLI
    session's: none). A name that is not an account name is refused before anything is made."""
    if owner is not None and not valid_user(owner):
        raise UsageError(f"not an account name: {owner!r}")
    session = _open_session(sid, "fork")
    history.check_index(session, at, "--at")
    new = _new_session_dir()
    try:
        newdir = store.session_dir(new)
        os.mkdir(os.path.join(newdir, "layers"), 0o700)
        if os.path.isdir(session.path("base")):       # --merge-base copies, shared
            shutil.copytree(session.path("base"), os.path.join(newdir, "base"), copy_function=os.link)
        for i, layer in enumerate(session.meta["layers"][:at + 1]):
            session.verify_layer(i)          # never carry a tampered layer into a new session
            history.copy_layer(session.path("layers", layer["dir"]),
                               os.path.join(newdir, "layers", layer["dir"]))
        store.append_jsonl(os.path.join(newdir, "provenance.jsonl"),
                           history.fork_records(session, at))
        agent_transcript.copy_for_fork(session.dir, newdir, at, sid)
        # a fork carries the stack, not the other session's acts: its verdicts bind that
        # session, and its first command attests (and audits the opening of) the fork itself
        meta = {k: v for k, v in session.meta.items() if k not in FORK_DROPS}
        meta.update(sid=new, state="pending", created=time.time(), layers=session.meta["layers"][:at + 1],
                    forked_from={"sid": sid, "at": at}, pid=None)
        if owner is not None:
            meta["owner"] = owner
        store.save_meta(meta)
    except BaseException:
        remove_tree(store.session_dir(new))
        raise
    whose = owner if owner is not None else session.meta.get("owner")
    audit.append("session.fork", sid=new, target=session.target, forked_from=sid, at=at,
                 **({} if whose is None else {"owner": whose}))
    return new


def compare(a, b):
    if a == b:
        raise UsageError("compare needs two different sessions")
    sa, sb = get_session(a), get_session(b)
    for s in (sa, sb):
        _require_layers(s)
    return history.compare(sa, sb)
