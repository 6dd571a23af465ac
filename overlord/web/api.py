"""The JSON API: the same calls the pages make and scripts make (with a Bearer token).

Every function here takes the App and a Request and returns JSON-able data; it calls
overlord.ops and nothing below it. Errors are OverlordError (their http_status: 400 for a
malformed request, 404 for what does not exist, 409 for a refusal) or settings.Invalid (400,
naming the field).
"""
import json
import threading

from overlord import ops
from overlord.errors import OverlordError, UsageError
from overlord.web import diffs
from overlord.web import settings as S

OPEN_STATES = ("pending", "timed-out")
META_KEYS = ("sid", "state", "target", "backend", "command", "created", "finished", "committed",
             "rolled_back", "exit_code", "grants", "enforcement", "trace", "forked_from", "audit",
             "interrupted", "forced", "merged", "committed_layers", "limit", "rewinds", "pinned",
             "merge_base")
DRIFT_WORDS = {
    "modified-externally": "was changed outside OVERLORD after this session began",
    "deleted-externally": "was deleted outside OVERLORD after this session began",
    "created-externally": "was created outside OVERLORD after this session began",
    "appeared-after-snapshot": "appeared after this session began, inside a directory the "
                               "commit would replace",
    "via a symlink": "is reached through a symlink in the real folder, which a commit never "
                     "writes through",
    "invalid whiteout": "is an invalid deletion mark in the session",
    "whiteout names the tree root": "is a deletion mark naming the folder itself",
    "overlapping edits": "was changed both here and outside, in the same lines",
}


# -- sessions (the console's register and dossier, the workspace's inspector) --------------------

def sessions(app, req):
    return {"sessions": register(app)}


def register(app):
    """The register: every session, newest first (concurrent requests share the reading)."""
    def read():
        metas = sorted(ops.sessions(), key=lambda m: (m.get("created") or 0, m["sid"]), reverse=True)
        return [session_row(m, app) for m in metas]
    return _shared.run(("register",), read)


def session_row(meta, app):
    agent = meta.get("agent") or {}
    return {"sid": meta["sid"], "state": meta.get("state"), "target": meta.get("target"),
            "backend": meta.get("backend"), "command": meta.get("command"),
            "created": meta.get("created"), "exit_code": meta.get("exit_code"),
            "layers": len(meta.get("layers") or []), "chat": bool(agent),
            "model": agent.get("model"), "running": app.chats.running(meta["sid"]),
            "grants": meta.get("grants")}


class Encoded(bytes):
    """A JSON body already encoded (shared by the requests one computation answered)."""


class Coalesce:
    """Requests for the same thing share one computation -- one that started after each of
    them arrived, so no answer is older than its request (like a group commit). Under load,
    fifty pages asking for the same dossier cost one or two computations, not fifty."""

    def __init__(self):
        self._lock = threading.Lock()
        self._state = {}          # key -> [the running slot, the queued slot or None]

    def run(self, key, compute):
        with self._lock:
            running, queued = self._state.get(key, (None, None))
            if running is None:
                slot, role = _Slot(), "run"
                self._state[key] = [slot, None]
            elif queued is None:
                slot, role = _Slot(), "queue"
                self._state[key][1] = slot
            else:
                slot, role = queued, "wait"
        if role == "wait":
            return slot.get()
        if role == "queue":
            running.done.wait()
            with self._lock:
                self._state[key] = [slot, None]
        try:
            slot.value = compute()
        except BaseException as exc:  # noqa: BLE001 - handed to every request that shared it
            slot.error = exc
        finally:
            with self._lock:
                state = self._state.get(key)
                if state is not None and state[0] is slot and state[1] is None:
                    del self._state[key]
            slot.done.set()
        return slot.get()


class _Slot:
    def __init__(self):
        self.done, self.value, self.error = threading.Event(), None, None

    def get(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


_shared = Coalesce()


def session(app, req, sid):
    """The dossier, encoded; concurrent requests for one session share the work."""
    return _shared.run(("dossier", sid),
                       lambda: Encoded(json.dumps(dossier(app, sid), ensure_ascii=False).encode()))


def dossier(app, sid):
    """The dossier: meta, the manifest (changes with before -> after hashes and causes), the
    savepoint chain and, while the change is staged, a unified diff per file."""
    meta = ops.get_session(sid).meta
    records = ops.log(sid)
    staged = meta.get("state") in OPEN_STATES
    changes = ops.diff(sid) if staged else []
    agent = meta.get("agent") or {}
    endpoint = dict(agent.get("endpoint") or {})
    endpoint.pop("script", None)
    return {
        "meta": {k: meta.get(k) for k in META_KEYS},
        "agent": {"model": agent.get("model"), "provider": endpoint.get("provider"),
                  "endpoint": endpoint, "max_turns": agent.get("max_turns"),
                  "audit": bool(agent.get("audit"))} if agent else None,
        "running": app.chats.running(sid),
        "staged": staged,
        "changes": [{"path": r.path, "kind": r.kind, "layer": r.layer, "before": r.before,
                     "after": r.after, "cause": r.caused_by} for r in records],
        "savepoints": ops.savepoints(sid),
        "diffs": [diffs.file_diff(meta["target"], ch) for ch in changes],
    }


def _not_running(app, sid, what):
    if app.chats.running(sid):
        raise OverlordError(f"cannot {what} while the agent is working in this session: press "
                            "Stop first")


def commit(app, req, sid):
    body = req.body or {}
    force, merge = _flag(body, "force"), _flag(body, "merge")
    only, drop = _selectors(body, "only"), _selectors(body, "drop")
    _not_running(app, sid, "commit")
    result = ops.commit(sid, force=force, merge=merge, only=only, drop=drop)
    app.chats.reset(sid)
    return {"sid": sid, "state": "committed", "merged": result.merged,
            "changes": [{"path": ch.path, "kind": ch.kind} for ch in result.changes]}


def rollback(app, req, sid):
    _not_running(app, sid, "discard")
    ops.rollback(sid)
    app.chats.reset(sid)
    return {"sid": sid, "state": "rolled-back"}


def rewind(app, req, sid):
    to = _index(req.body, "to")
    _not_running(app, sid, "rewind")
    dropped = ops.rewind(sid, to)
    app.chats.reset(sid)
    return {"sid": sid, "to": to, "dropped": len(dropped)}


def fork(app, req, sid):
    at = _index(req.body, "at")
    return {"sid": ops.fork(sid, at), "from": sid, "at": at}


def blame(app, req):
    path = req.query.get("path")
    if not path:
        raise UsageError("blame needs ?path=<a file inside a folder OVERLORD knows>")
    return ops.blame(path)


def drift_words(exc):
    """The refusal's drifts, each in words, for the inspector and the dossier."""
    return [{"path": d.path, "reason": d.reason, "forceable": d.forceable,
             "words": f"{d.path} {DRIFT_WORDS.get(d.reason, d.reason)}"}
            for d in getattr(exc, "drifts", None) or ()]


def _flag(body, name):
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise UsageError(f"{name} is true or false")
    return value


def _selectors(body, name):
    value = body.get(name) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{name} is a list of selectors (layer:N, turn:N, tool:NAME, call:ID)")
    return value


def _index(body, name):
    value = (body or {}).get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} takes a savepoint number")
    return value


# -- settings and models ------------------------------------------------------------------------------

def get_settings(app, req):
    data = app.settings.public(ops.keys_list())
    data["backends"] = app.backends
    data["providers"] = list(S.PROVIDERS)
    return data


def put_settings(app, req):
    if req.body is None:
        raise UsageError("send the settings to change as a JSON object")
    key = app.settings.update(req.body)
    if key:
        ops.keys_set(*key)
    return get_settings(app, req)


def models(app, req):
    provider = req.query.get("provider") or app.settings.load()["provider"]
    prof = app.settings.profile(provider)
    base_url = req.query.get("base_url") or prof["base_url"] or None
    if base_url:
        S.check_profile({"base_url": base_url}, S.empty_profile(), provider)
    knobs = prof.get("knobs") or {}
    listed = ops.models(provider, base_url=base_url, headers=prof["headers"] or None,
                        api=knobs.get("api"), azure_api_version=knobs.get("azure_api_version"))
    return {"provider": provider, "models": listed}


# -- conversations ------------------------------------------------------------------------------------

def chats(app, req):
    return {"chats": app.chats.listing()}


def start_chat(app, req):
    return app.chats.start(req.body or {})


def chat(app, req, sid):
    return app.chats.detail(sid)


def chat_message(app, req, sid):
    return app.chats.message(sid, req.body or {})


def chat_cancel(app, req, sid):
    return app.chats.cancel(sid)
