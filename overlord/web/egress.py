"""What a session on the recorded network (`--net proxy`) talked to, and its held requests.

    GET    /api/session/<sid>/egress      ops.egress_report(sid), rebuilt for the page

Whoever may see the session may read it (roles.SEE, as the dossier). Commit's choice of held
requests (`release`: the ids to send, the rest dropped) is a field of POST .../commit
(api.commit, with release_ids and commit_outcome from here).

Every string in a line was chosen by the sandboxed program or a remote server (the host, the
path, the method, a header, the body's preview): each is rebuilt here field by field and type
by type, made printable (overlord.text: a control character or a bidi override shows as its
escape, it cannot hide or reorder what the person reads), and the pages insert it as text,
never as HTML. A held request's headers are masked here as well as below (credentials as
`***`), and its body never leaves as bytes: only its size and the short preview.
"""
import re

from overlord import ops
from overlord import text as T
from overlord.errors import OverlordError, UsageError

SHOWN = 2000                  # connections per answer: the newest (summary counts them all)
HELD_ID = re.compile(r"\Ah[0-9]{4,9}\Z")
MAX_RELEASE = 10000
MASK = "***"
SECRET_HEADERS = ("authorization", "proxy-authorization", "cookie", "set-cookie")
SECRET_HINTS = ("token", "secret", "key", "password", "auth")
TEXT_CAP = 2048               # a path or a preview as shown (the log caps paths at 2 KiB too)
HELD_STATES = ("held", "released", "dropped", "failed")


def report(app, req, sid):
    """{sid, net, recorded, allow, hold_writes, connections, shown, held, summary}: the
    session's egress log (newest SHOWN lines) and its held requests. A session on another
    network has none: `recorded` is false and the lists are empty."""
    return view(sid)


def view(sid):
    meta = ops.get_session(sid).meta
    grants = meta.get("grants") or {}
    net = grants.get("net") or "host"
    if net != "proxy":
        return {"sid": sid, "net": _text(net), "recorded": False, "allow": [],
                "hold_writes": False, "connections": [], "shown": 0, "held": [],
                "summary": {"connections": 0, "refused": 0, "bytes_up": 0, "bytes_down": 0,
                            "held": 0}}
    raw = ops.egress_report(sid)
    lines = [c for c in raw.get("connections") or () if isinstance(c, dict)]
    held = [held_row(r) for r in raw.get("held") or () if isinstance(r, dict)]
    summary = raw.get("summary") if isinstance(raw.get("summary"), dict) else {}
    return {"sid": sid, "net": "proxy", "recorded": True,
            "allow": [_text(a) for a in raw.get("allow") or grants.get("net_allow") or ()
                      if isinstance(a, str)],
            "hold_writes": bool(raw.get("hold_writes", grants.get("hold_writes"))),
            "connections": [connection_row(c) for c in lines[-SHOWN:]],
            "shown": min(len(lines), SHOWN),
            "held": held,
            "summary": {"connections": _int(summary.get("connections"), len(lines)),
                        "refused": _int(summary.get("refused"),
                                        sum(1 for c in lines if c.get("allowed") is False)),
                        "bytes_up": _int(summary.get("bytes_up"), 0),
                        "bytes_down": _int(summary.get("bytes_down"), 0),
                        "held": _int(summary.get("held"), len(held))}}


def connection_row(c):
    """One egress.jsonl line as the table shows it (every field typed, every string printable)."""
    return {"ts": _num(c.get("ts")), "host": _text(c.get("host")), "port": _int(c.get("port")),
            "method": _text(c.get("method")), "path": _text(c.get("path")),
            "allowed": c.get("allowed") is True, "status": _int(c.get("status")),
            "bytes_up": _int(c.get("bytes_up"), 0), "bytes_down": _int(c.get("bytes_down"), 0),
            "duration_ms": _num(c.get("duration_ms")), "layer": _int(c.get("layer")),
            "cause": _text(c.get("cause")), "reason": _text(c.get("reason")),
            "held": _text(c.get("held"))}


def held_row(r):
    """A held request as the Commit list shows it: what would be sent (method, url, size),
    its headers masked, a preview of the body, its state and, once released, its status."""
    headers = []
    for pair in r.get("headers") or ():
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str):
            name = pair[0]
            value = MASK if secret(name) else pair[1] if isinstance(pair[1], str) else ""
            headers.append([_text(name), _text(value)])
    preview = next((r[k] for k in ("body_preview", "preview", "body")
                    if isinstance(r.get(k), str)), None)
    state = r.get("state") if r.get("state") in HELD_STATES else "held"
    return {"id": _text(r.get("id")), "ts": _num(r.get("ts")), "method": _text(r.get("method")),
            "url": _text(r.get("url")), "host": _text(r.get("host")), "port": _int(r.get("port")),
            "path": _text(r.get("path")), "headers": headers, "preview": _text(preview),
            "bytes": _int(r.get("bytes"), 0), "layer": _int(r.get("layer")),
            "cause": _text(r.get("cause")), "state": state, "status": _int(r.get("status")),
            "error": _text(r.get("error")), "released_at": _num(r.get("released_at"))}


def secret(name):
    low = name.lower()
    return low in SECRET_HEADERS or any(h in low for h in SECRET_HINTS)


def release_ids(body):
    """Commit's `release` field: absent (None: no choice made, ops' default -- none sent, all
    dropped), true (every held request, in order), or a list of held ids (the rest dropped)."""
    if "release" not in body:
        return None
    value = body["release"]
    if value is True or value is False:
        return value
    if not isinstance(value, list) or len(value) > MAX_RELEASE or \
            not all(isinstance(v, str) and HELD_ID.match(v) for v in value):
        raise UsageError("release is true (every held request) or a list of held request ids "
                         "(h0001, h0002, ...); the rest are dropped")
    return list(dict.fromkeys(value))


def check_release(sid, ids):
    """Before anything lands: every id named is a request this session holds now."""
    if not isinstance(ids, list) or not ids:
        return
    held = {r["id"] for r in view(sid)["held"] if r["state"] == "held"}
    missing = [i for i in ids if i not in held]
    if missing:
        raise UsageError(f"session {sid} holds no request {missing[0]} (waiting to be sent): "
                         "nothing was committed")


def commit_outcome(sid, before):
    """What the commit did with the held requests: {released: [{id, method, url, state,
    status, error}], dropped: [ids]}, read back from the records after it; None when the
    session held none."""
    if not before:
        return None
    try:
        after = {r["id"]: r for r in view(sid)["held"]}
    except (OverlordError, OSError, ValueError):
        return None
    out = {"released": [], "dropped": []}
    for rid in before:
        r = after.get(rid)
        if r is None:
            continue
        if r["state"] in ("released", "failed"):
            out["released"].append({k: r[k] for k in ("id", "method", "url", "state", "status",
                                                      "error")})
        elif r["state"] == "dropped":
            out["dropped"].append(rid)
    return out


def waiting(sid):
    """The ids of the requests the session holds now ([] for none, or when unreadable)."""
    try:
        return [r["id"] for r in view(sid)["held"] if r["state"] == "held"]
    except (OverlordError, OSError, ValueError, AttributeError):
        return []


def _text(value):
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    value = T.escape_path(value) if value else ""
    return value if len(value) <= TEXT_CAP else value[:TEXT_CAP] + "\u2026"


def _int(value, default=None):
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _num(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if value == value and abs(value) != float("inf") else None
