"""What a `--net proxy` session talked to, and its held requests (docs/EGRESS.md).

The records live in the session's directory, written by the proxy (overlord/sandbox/netproxy.py)
and read and changed through overlord/sandbox/egress.py: `egress.jsonl` (one line per
connection) and `held/<id>.json` (one per held request). A held request goes out only once
its session is committed (`commit --release-held` / `--release ID`, via ops.commit); the rest
are dropped at commit or rollback. Each release is an audit act `egress.release`, each drop
`egress.drop`; connections stay on the session's log, never on the chain.
"""
import os

from overlord.errors import OverlordError, UsageError
from overlord.ops.review import get_session
from overlord.trust import audit

WAITING = "held"          # a held record's state until it is released or dropped


def _egress():
    from overlord.sandbox import egress
    return egress


def _grants(session):
    return session.meta.get("grants") or {}


def _log(session):
    if not os.path.exists(session.path("egress.jsonl")):
        return []
    return list(_egress().read_log(session.dir))


def _held(session):
    if not os.path.isdir(session.path("held")):
        return []
    return list(_egress().held(session.dir))


def egress_report(sid):
    """{"sid", "net", "allow", "hold_writes", "connections": [log lines, in order],
    "held": [held records, credentials masked, id order], "summary": {"connections",
    "refused", "bytes_up", "bytes_down", "held" (waiting), "released", "dropped", "failed"}}.
    Any session (a session without --net proxy has nothing to show, and says so by its net)."""
    session = get_session(sid)
    grants = _grants(session)
    connections = _log(session)
    held = _held(session)
    states = [r.get("state") for r in held]

    def total(key):
        return sum(c.get(key) for c in connections if isinstance(c.get(key), int)
                   and not isinstance(c.get(key), bool))
    summary = {"connections": len(connections),
               "refused": sum(1 for c in connections if c.get("allowed") is False),
               "bytes_up": total("bytes_up"), "bytes_down": total("bytes_down"),
               "held": states.count(WAITING), "released": states.count("released"),
               "dropped": states.count("dropped"), "failed": states.count("failed")}
    return {"sid": session.sid, "net": grants.get("net", "host"),
            "allow": list(grants.get("net_allow") or []),
            "hold_writes": bool(grants.get("hold_writes")), "state": session.meta["state"],
            "connections": connections, "held": [_egress().masked(r) for r in held],
            "summary": summary}


def held_waiting(sid):
    """How many of a session's held requests still wait for its commit (0 when none): what
    `diff` and the dossier say."""
    session = get_session(sid)
    held = session.path("held")
    if not os.path.isdir(held):
        return 0
    return sum(1 for r in _held(session) if r.get("state") == WAITING)


def waiting_ids(session):
    """The ids of the session's held requests still waiting, in id order."""
    return [r["id"] for r in _held(session) if r.get("state") == WAITING]


def check_ids(session, ids, verb="release"):
    """ids (a list) as the waiting ids they name, in id order; UsageError naming the first
    one that is not a waiting held request of this session (nothing released or dropped)."""
    waiting = waiting_ids(session)
    known = {r["id"]: r.get("state") for r in _held(session)}
    for i in ids:
        if i not in waiting:
            why = (f"it is {known[i]}" if i in known else
                   "there is no such held request" if waiting or known else
                   "the session holds no requests")
            shown = repr(i) if isinstance(i, str) and i.isprintable() and len(i) < 40 else "an id"
            raise UsageError(f"cannot {verb} {shown} of session {session.sid}: {why}"
                             + (f" (waiting: {', '.join(waiting)})" if waiting else ""))
    return [i for i in waiting if i in set(ids)]


def release_held(sid, ids=None):
    """Send the session's held requests (ids: those, else every waiting one), in id order,
    each checked against the session's allowlist again; one audit act egress.release per
    request. Only a committed session's requests go out: a hold is released with its tree.
    Returns [{"id", "method", "host", "path", "url", "state", "status", "error"}]."""
    session = get_session(sid)
    if session.meta["state"] != "committed":
        raise OverlordError(f"session {sid} is {session.meta['state']}: held requests are "
                            f"released when it is committed (overlord commit {sid} "
                            "--release-held)")
    chosen = waiting_ids(session) if ids is None else check_ids(session, list(ids))
    if not chosen:
        return []
    audit.ready()            # each send is recorded: a chain that cannot be written sends none
    grants = _grants(session)
    results = _egress().release(session.dir, chosen, allow=list(grants.get("net_allow") or ()),
                                cap=grants.get("net_cap"))
    given = {}
    for got in results or ():
        if isinstance(got, str):
            given[got] = {}
        elif _field(got, "id") is not None:
            given[_field(got, "id")] = got
    now = {r["id"]: r for r in _held(session)}        # what release recorded, read back
    out = []
    for hid in chosen:
        rec = dict(now.get(hid) or {})
        if rec.get("state") == WAITING and hid not in given:
            continue                     # not attempted (release stopped before it)
        for key in ("state", "status", "error"):
            value = _field(given.get(hid), key)
            if value is not None:
                rec[key] = value
        row = {k: rec.get(k) for k in ("method", "host", "path", "url", "state", "status",
                                       "error")}
        row["id"] = hid
        audit.append("egress.release", sid=session.sid, id=hid, method=row["method"],
                     host=row["host"], path=row["path"], status=row["status"],
                     error=row["error"])
        out.append(row)
    return out


def drop_held(sid, ids=None):
    """Drop the session's held requests (ids: those, else every waiting one): never sent.
    One audit act egress.drop (sid, ids) when any was dropped. Returns the ids dropped."""
    session = get_session(sid)
    chosen = waiting_ids(session) if ids is None else check_ids(session, list(ids), "drop")
    if not chosen:
        return []
    audit.ready()
    dropped = list(_egress().drop(session.dir, chosen) or ())
    if dropped:
        audit.append("egress.drop", sid=session.sid, ids=dropped)
    return dropped


def _field(value, key):
    if isinstance(value, dict):
        return value.get(key)
    return getattr(value, key, None)
