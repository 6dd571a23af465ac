"""The JSON API: the same calls the pages make and scripts make (with a Bearer token).

Every function here takes the App and a Request and returns JSON-able data; it calls
overlord.ops and nothing below it. Errors are OverlordError (their http_status: 400 for a
malformed request, 404 for what does not exist, 409 for a refusal) or settings.Invalid (400,
naming the field).
"""
import base64
import binascii
import json
import os
import threading

from overlord import ops
from overlord import text as T
from overlord.errors import OverlordError, UsageError
from overlord.ops import patch as diffs
from overlord.web import settings as S

OPEN_STATES = ("pending", "timed-out")
PRIVILEGED_FLAG = "--allow-privileged-modes"
PRIVILEGED_BODY = "allow_privileged_modes"
META_KEYS = ("sid", "state", "target", "backend", "command", "created", "finished", "committed",
             "rolled_back", "exit_code", "grants", "enforcement", "trace", "forked_from", "audit",
             "interrupted", "forced", "merged", "committed_layers", "limit", "rewinds", "pinned",
             "merge_base", "allowed_privileged")
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


def encode(data):
    """JSON as UTF-8 bytes with no lone surrogate in it (strict parsers refuse them). A name
    that is not valid UTF-8 (a path, a target, a command) comes as its escaped form plus
    `<key>_b64`, its exact bytes (overlord.text.path_fields); in prose and lists, escaped."""
    try:
        return json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(T.jsonable(data), ensure_ascii=False).encode("utf-8")


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
    return _shared.run(("dossier", sid), lambda: Encoded(encode(dossier(app, sid))))


def dossier(app, sid):
    """The dossier: meta, the manifest (changes with before -> after hashes, causes and any
    metadata change in words), the savepoint chain and, while the change is staged, a unified
    diff per file. After a partial commit, `changes` is what was committed and `dropped` what
    the commit left out (never offered to blame: it is not in the folder)."""
    meta = ops.get_session(sid).meta
    records = ops.log(sid)
    staged = meta.get("state") in OPEN_STATES
    changes = ops.diff(sid) if staged else []
    by_path = {ch.path: ch for ch in changes}
    agent = meta.get("agent") or {}
    endpoint = dict(agent.get("endpoint") or {})
    endpoint.pop("script", None)
    kept, dropped = [], []
    for r in records:
        ch = by_path.get(r.path)
        details = getattr(r, "details", None) or (getattr(ch, "details", None) if ch else None) or {}
        row = {"path": r.path, "kind": r.kind, "layer": r.layer, "before": r.before,
               "after": r.after, "cause": r.caused_by, "details": details,
               "notes": detail_words(details, r.kind), "privileged": list(details.get("privileged") or ())}
        (dropped if was_dropped(r) else kept).append(row)
    return {
        "meta": {k: meta.get(k) for k in META_KEYS},
        "agent": {"model": agent.get("model"), "provider": endpoint.get("provider"),
                  "endpoint": endpoint, "max_turns": agent.get("max_turns"),
                  "audit": bool(agent.get("audit"))} if agent else None,
        "running": app.chats.running(sid),
        "staged": staged,
        "changes": kept,
        "dropped": dropped,
        "savepoints": ops.savepoints(sid),
        "diffs": [_file_diff(meta["target"], ch) for ch in changes],
    }


def was_dropped(record):
    """Whether a committed session's record (ops.log) is a change its commit left out."""
    return bool(getattr(record, "dropped", False))


TYPE_KEYS = ("type", "before_type", "link", "rdev")


def _file_diff(target, change):
    """ops.patch's diff of one change, with its metadata in words: a special file says which
    (the patch only knows "a special file"), a metadata-only change says what changed."""
    out = diffs.file_diff(target, change)
    details = getattr(change, "details", None) or {}
    words = detail_words({k: v for k, v in details.items()
                          if k not in TYPE_KEYS and k != "metadata_only"}, change.kind)
    out["notes"], out["privileged"] = words, list(details.get("privileged") or ())
    if details.get("type") in SPECIAL_TYPES and (out["summary"] or "").startswith("a special file"):
        out["summary"] = detail_words({k: details[k] for k in TYPE_KEYS if k in details})[0]
    if words and details.get("metadata_only"):
        out["summary"] = "metadata only: " + ", ".join(words)
    return out


SPECIAL_TYPES = ("fifo", "socket", "char-device", "block-device")


def detail_words(details, kind=None):
    """A change's `details` as the phrases the pages show beside the path (the one vocabulary
    every face uses: ops.change_words)."""
    return ops.change_words(details, kind, arrow="\u2192")


def _not_running(app, sid, what):
    if app.chats.running(sid):
        raise OverlordError(f"cannot {what} while the agent is working in this session: press "
                            "Stop first")


def commit(app, req, sid):
    """Commit (or the savepoints chosen: `only` / `drop` selectors). A session that adds a
    setuid or setgid bit, a file capability or an ACL is refused unless the body says
    `allow_privileged_modes: true`; the refusal lists those paths (`privileged`)."""
    body = req.body or {}
    force, merge = _flag(body, "force"), _flag(body, "merge")
    allow = _flag(body, PRIVILEGED_BODY)
    only, drop = _selectors(body, "only"), _selectors(body, "drop")
    _not_running(app, sid, "commit")
    try:
        result = ops.commit(sid, force=force, merge=merge, only=only, drop=drop,
                            allow_privileged=allow)
    except OverlordError as exc:
        if is_privileged_refusal(exc):
            exc.privileged_paths = _privileged(sid, getattr(exc, "privileged", None) or ())
        raise
    app.chats.reset(sid)
    left_out = [r.path for r in ops.log(sid) if was_dropped(r)] if only or drop else []
    return {"sid": sid, "state": "committed", "merged": result.merged,
            "changes": [{"path": ch.path, "kind": ch.kind} for ch in result.changes],
            "dropped": left_out}


def is_privileged_refusal(exc):
    return PRIVILEGED_FLAG in str(exc) or bool(getattr(exc, "privileged", None))


def _privileged(sid, found):
    """[{path, adds: [...], notes: [...]}] for the refusal's (path, [what]) pairs, with each
    change's metadata in words."""
    try:
        details = {ch.path: ch.details for ch in ops.diff(sid)}
    except OverlordError:
        details = {}
    return [{"path": path, "adds": list(what), "notes": detail_words(details.get(path))}
            for path, what in found]


def refusal(exc):
    """An OverlordError as the JSON body of its answer: the line, and what the page needs to
    say it in words -- the drifts, or the privileged modes and the body flag that allows them."""
    body = {"error": str(exc)}
    drifts = drift_words(exc)
    if drifts:
        body["drifts"] = drifts
    if is_privileged_refusal(exc):
        body["error"] = str(exc).replace(PRIVILEGED_FLAG, PRIVILEGED_BODY)
        body["privileged"] = getattr(exc, "privileged_paths", None) or []
        body["override"] = PRIVILEGED_BODY
    return body


def rollback(app, req, sid):
    _not_running(app, sid, "discard (roll back)")
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
    """?path=<a file of a known folder>, or ?path_b64= for a name that is not UTF-8."""
    path = req.query.get("path")
    if req.query.get("path_b64"):
        try:
            path = os.fsdecode(base64.b64decode(req.query["path_b64"], validate=True))
        except (binascii.Error, ValueError):
            raise UsageError("path_b64 is not base64") from None
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
    if provider == S.DEMO:
        return {"provider": provider, "models": ops.models(provider, script=S.DEMO_SCRIPT)}
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
