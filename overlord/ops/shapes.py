"""The JSON shapes every face renders results in (docs/JSON.md): the CLI's --json, the daemon's
replies (docs/DAEMON.md) and the MCP server's structuredContent (docs/MCP.md) share them here.

Light on purpose: the standard library and the `overlord.ops` package's name table only (no
operation is imported), so a face may import it wherever it renders.
"""
from overlord import ops

SAVEPOINT_KEYS = {"n": "layer", "cause": "caused_by"}     # one name per concept (docs/JSON.md)
COMPARE_STATUS = {"only in A": "only-in-a", "only in B": "only-in-b"}   # no spaces in enums
SESSION_KEYS = ("sid", "state", "target", "backend", "command", "created", "exit_code", "grants")


def change_json(ch):
    """One change as every --json carries it: path (+ path_b64), kind, layer, details."""
    return {"path": ch.path, "kind": ch.kind, "layer": ch.layer,
            "details": dict(getattr(ch, "details", None) or {})}


def record_json(r):
    """One provenance record of `log`."""
    return {"path": r.path, "kind": r.kind, "before": r.before, "after": r.after,
            "layer": r.layer, "caused_by": r.caused_by, "details": dict(r.details or {})}


def counts_json(changes):
    counts = {k: 0 for k in ops.KINDS}
    for ch in changes:
        counts[ch.kind] = counts.get(ch.kind, 0) + 1
    return counts


def session_json(sid, state, changes, **fields):
    """What run, shell, exec, agent, resume, fork and revert give with --json: the session,
    its state, what ended the command, and the change summary (the session's whole plan:
    what commit would do). Keys that do not apply to a command are null."""
    out = {"sid": sid, "state": state, "exit_code": None, "timed_out": False, "layer": None,
           "changes": [change_json(ch) for ch in changes], "counts": counts_json(changes),
           "notes": [], "syscalls": None}
    out.update(fields)
    return out


def fork_json(forked_from):
    """meta["forked_from"] ({sid, at}) as {sid, layer}, or None."""
    if not forked_from:
        return None
    return {"sid": forked_from.get("sid"), "layer": forked_from.get("at")}


def session_row(meta):
    """One session of `sessions`, from its meta, with its running cost (session_cost)."""
    return ({k: meta.get(k) for k in SESSION_KEYS} |
            {"layers": len(meta.get("layers", [])), "forked_from": fork_json(meta.get("forked_from")),
             "cost": session_cost(meta.get("sid"))})


COST_ZERO = {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
             "cache_write_tokens": 0, "tokens": 0, "usd": 0.0, "unpriced": []}


def session_cost(sid):
    """trust/cost.session_total(sid) for a listing: one small cost file per session (the
    ledger only when that file is damaged: rebuilt once, by cost). Zeros when the session has
    made no call, and when its cost cannot be read at all: a listing never fails on it."""
    from overlord.trust import cost     # here, not at the top: this module stays light
    try:
        return cost.session_total(sid)
    except Exception:                   # noqa: BLE001 — a damaged ledger/cache/sid: zeros
        return dict(COST_ZERO, unpriced=[])


def savepoint_json(point):
    """One savepoint of ops.savepoints, its keys named as everywhere else (layer, caused_by)."""
    return {SAVEPOINT_KEYS.get(k, k): v for k, v in point.items()}


def compare_json(rows):
    """ops.compare's (path, status) rows, the statuses without spaces."""
    return [{"path": p, "status": COMPARE_STATUS.get(s, s)} for p, s in rows]
