"""The JSON API: the same calls the pages make and scripts make (with a Bearer token).

Every function here takes the App and a Request and returns JSON-able data; it calls
overlord.ops and nothing below it. Who may call which is overlord/web/roles.py's, checked
before these run; what a listing returns is filtered here to what the principal may see
(req.principal), and the settings, keys and notes are the principal's own (app.settings_for). Errors are OverlordError (their http_status: 400 for a
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
from overlord.errors import NotFound, OverlordError, UsageError
from overlord.ops import mcp_config
from overlord.ops import patch as diffs
from overlord.web import egress
from overlord.web import roles as R
from overlord.web import settings as S

OPEN_STATES = ("pending", "timed-out")
PRIVILEGED_FLAG = "--allow-privileged-modes"
PRIVILEGED_BODY = "allow_privileged_modes"
META_KEYS = ("sid", "state", "target", "backend", "command", "created", "finished", "committed",
             "rolled_back", "exit_code", "grants", "enforcement", "trace", "forked_from", "audit",
             "interrupted", "forced", "merged", "committed_layers", "limit", "rewinds", "pinned",
             "merge_base", "allowed_privileged", "reverts", "clearance", "connectors", "owner")
FORCE_OVERRIDES = "--force overrides"
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
    return {"sessions": register(app, req.principal)}


def register(app, principal=None):
    """The register: every session the principal may see, newest first (concurrent requests
    share the reading; each is filtered to its own principal)."""
    def read():
        metas = sorted(ops.sessions(), key=lambda m: (m.get("created") or 0, m["sid"]), reverse=True)
        return [session_row(m, app) for m in metas]
    rows = _shared.run(("register",), read)
    return rows if principal is None else R.visible(principal, rows)


def session_row(meta, app):
    agent = meta.get("agent") or {}
    return {"sid": meta["sid"], "state": meta.get("state"), "target": meta.get("target"),
            "backend": meta.get("backend"), "command": meta.get("command"),
            "created": meta.get("created"), "exit_code": meta.get("exit_code"),
            "layers": len(meta.get("layers") or []), "chat": bool(agent),
            "model": agent.get("model"), "running": app.chats.running(meta["sid"]),
            "grants": meta.get("grants"), "owner": meta.get("owner")}


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
    """The dossier, encoded; concurrent requests for one session (by one account: its second
    model is its own) share the work."""
    store = app.settings_for(req.principal)
    return _shared.run(("dossier", sid, R.owner_name(req.principal)),
                       lambda: Encoded(encode(dossier(app, sid, store))))


def dossier(app, sid, store=None):
    """The dossier: meta, the manifest (changes with before -> after hashes, causes and any
    metadata change in words), the savepoint chain, a unified diff per file (while staged, of
    the plan; once committed, of what the commit kept), the content gate's findings (`checks`,
    while staged), every second-model verdict (`reviews`, each `fresh` or not) and the review
    under way (`reviewing`). After a partial commit, `changes` is what was committed and
    `dropped` what the commit left out (never offered to blame: it is not in the folder).
    `cost`: the session's running total (agent turns, compactions, reviews: docs/COST.md)."""
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
        "diffs": [_file_diff(meta["target"], ch) for ch in changes] if staged else
                 _committed_diffs(sid, kept) if meta.get("state") == "committed" else [],
        "checks": _checks(sid) if staged else None,
        "reviews": _reviews(sid, meta, staged),
        "reviewing": app.reviews.status(sid),
        "countersign": _countersign(store or app.settings, meta),
        "external": _external(sid),
        "git": _git(sid, changes if staged else None),
        "cost": _cost(sid),
    }


def _cost(sid):
    """The session's running cost total (ops.session_cost: calls, tokens, usd, unpriced), or
    None when the ledger's totals cannot be read."""
    try:
        return ops.session_cost(sid)
    except (OverlordError, OSError, ValueError):
        return None


def _git(sid, changes):
    """What the session does to the folder's git repositories, one summary per repository
    (ops.git_summary: {paths, left_out, repos: [{dir, line, ...}]}), or None: nothing under a
    .git/ changed, or it cannot be said (the inspector then lists those paths one by one)."""
    try:
        return ops.git_summary(sid, changes)
    except (OverlordError, OSError, ValueError):
        return None


def _external(sid):
    """The connector calls (outside the sandbox, not undone by Discard), or None when the
    audit chain that holds them cannot be read."""
    try:
        return ops.external_actions(sid)
    except OverlordError:
        return None


def _committed_diffs(sid, rows):
    """ops.committed_diff, with each change's metadata in words as the staged diffs have it."""
    details = {r["path"]: r["details"] for r in rows}
    out = []
    for d in ops.committed_diff(sid):
        words = detail_words({k: v for k, v in (details.get(d["path"]) or {}).items()
                              if k not in TYPE_KEYS}, d["kind"])
        d["notes"], d["privileged"] = words, []
        out.append(d)
    return out


def _checks(sid):
    """The content gate over the staged change (`check --json`'s shape, docs/JSON.md), or
    {error, findings: []} when it cannot be run (a broken policy file refuses it)."""
    try:
        return ops.check(sid).as_dict()
    except OverlordError as exc:
        return {"error": str(exc), "findings": []}


def _reviews(sid, meta, staged):
    """Every verdict on record, oldest first; while staged each says whether it still binds
    (`fresh`). Once decided nothing binds any more: `fresh` is None."""
    if staged:
        try:
            return ops.reviews(sid)
        except OverlordError:
            pass
    return [dict(v, fresh=None) for v in meta.get("reviews") or ()]


def agent_model(meta):
    """"provider:model" the agent recorded (None for a `run` session)."""
    agent = meta.get("agent") or {}
    provider = (agent.get("endpoint") or {}).get("provider")
    return f"{provider}:{agent.get('model')}" if provider and agent.get("model") else None


def _countersign(store, meta):
    """The second model Settings name, and whether it is this session's own agent model."""
    who = S.reviewer(store.load()["countersign"])
    agent = agent_model(meta)
    return {"reviewer": who, "agent": agent, "same_as_agent": bool(who and who == agent)}


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
    """Commit (or the savepoints chosen: `only` / `drop` selectors). `release`: the held
    requests of a recorded-network session to send once the tree lands (a list of ids, or
    true for all); the rest are dropped, and `held` in the answer says what was sent (each
    one's status) and what was dropped. A session that adds a
    setuid or setgid bit, a file capability or an ACL is refused unless the body says
    `allow_privileged_modes: true`; the refusal lists those paths (`privileged`)."""
    body = req.body or {}
    force, merge = _flag(body, "force"), _flag(body, "merge")
    allow = _flag(body, PRIVILEGED_BODY)
    only, drop = _selectors(body, "only"), _selectors(body, "drop")
    countersigned = _flag(body, "countersigned")
    release = egress.release_ids(body)
    _not_running(app, sid, "commit")
    egress.check_release(sid, release)
    held = egress.waiting(sid)
    more = {} if release is None else {"release_held": release}
    try:
        result = ops.commit(sid, force=force, merge=merge, only=only, drop=drop,
                            allow_privileged=allow, countersigned=countersigned, **more)
    except OverlordError as exc:
        if is_privileged_refusal(exc):
            exc.privileged_paths = _privileged(sid, getattr(exc, "privileged", None) or ())
        raise
    app.chats.reset(sid)
    left_out = [r.path for r in ops.log(sid) if was_dropped(r)] if only or drop else []
    signed = getattr(result, "countersigned", None)
    return {"sid": sid, "state": "committed", "merged": result.merged,
            "changes": [{"path": ch.path, "kind": ch.kind} for ch in result.changes],
            "dropped": left_out,
            "findings": [f.as_dict() for f in getattr(result, "findings", None) or ()],
            "countersigned": {"review": signed.get("n"), "reviewer": signed.get("reviewer")}
            if signed else None,
            "held": egress.commit_outcome(sid, held)}


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
    if FORCE_OVERRIDES in body["error"]:
        body["error"] = body["error"].replace(FORCE_OVERRIDES, "force: true overrides")
        body["forceable"] = True          # a fresh rejection: the person may commit over it
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
    """A new session from savepoint `at`, owned by whoever forked it (the launch token: the
    source's owner)."""
    at = _index(req.body, "at")
    return {"sid": ops.fork(sid, at, owner=R.owner_name(req.principal)), "from": sid, "at": at}


def revert(app, req, sid):
    """Stage the undo of a committed session as a new pending session (ops.revert), owned by
    whoever asked for it."""
    return {"sid": ops.revert(sid, owner=R.owner_name(req.principal)), "reverts": sid}


def check(app, req, sid):
    """The content gate over the staged change (what Commit will be told)."""
    return ops.check(sid).as_dict()


# -- the countersignature: a second model reviews the staged change -------------------------------

def review(app, req, sid):
    """Start a review by the second model named under Settings -> Countersignature. Refused
    (never another model guessed) when that is the agent's own provider:model, unless the
    body says `same_model: true` -- the person ticked the box that says so, and the verdict
    records it."""
    body = req.body or {}
    same = _flag(body, "same_model")
    only, drop = _selectors(body, "only"), _selectors(body, "drop")
    meta = ops.get_session(sid).meta
    if meta.get("state") not in OPEN_STATES:
        raise OverlordError(f"cannot review session {sid}: it is {meta.get('state')}; only a "
                            "staged change can be reviewed")
    _not_running(app, sid, "review")
    store = app.settings_for(req.principal)
    cs = store.load()["countersign"]
    who = S.reviewer(cs)
    if who is None:
        raise S.Invalid("cs_provider", "name the second model under Settings \u2192 "
                                       "Countersignature first")
    agent = agent_model(meta)
    if who == agent and not same:
        raise OverlordError(f"the second model must not be the one that made the change: "
                            f"{agent} is this session's agent. Name another under Settings "
                            "\u2192 Countersignature (or tick \"review with the agent's own "
                            "model\", and the verdict will say so)")
    demo = cs["provider"] == S.DEMO
    prof = store.profile(cs["provider"])
    knobs = prof.get("knobs") or {}
    own = _owner_kw(req)     # its key; the shared one to its own endpoint

    def call():
        try:
            return ops.review(sid, provider=cs["provider"], model=cs["model"] or None,
                              base_url=cs["base_url"] or None, headers=cs["headers"] or None,
                              knobs={}, script=S.DEMO_REVIEW_SCRIPT if demo else None,
                              api=knobs.get("api"), azure_api_version=knobs.get("azure_api_version"),
                              same_model=same, only=only, drop=drop, **own)
        except OverlordError as exc:        # the CLI's words for a missing key, as Settings has it
            words = str(exc).replace(f"run `overlord keys set {cs['provider']}`",
                                     "add it under Settings \u2192 Countersignature")
            raise OverlordError(words, http_status=exc.http_status) from None
    return {"sid": sid, "reviewing": app.reviews.start(sid, who, call)}


def reviews(app, req, sid):
    """What the pages poll while a review runs: the run, and every verdict."""
    meta = ops.get_session(sid).meta
    staged = meta.get("state") in OPEN_STATES
    return {"sid": sid, "reviewing": app.reviews.status(sid),
            "reviews": _reviews(sid, meta, staged)}


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
    # only the folders of sessions this principal may see are read at all: a file of another
    # operator's folder is as unknown as one OVERLORD never saw (404, never its text)
    every = ops.sessions()
    metas = R.visible(req.principal, every)
    try:
        sheet = ops.blame(path, metas)
    except UsageError as exc:
        if len(metas) < len(every) and "is not inside any target" in str(exc):
            raise NotFound(f"no blame for {path}: not a file of a folder you may see") from None
        raise
    return visible_blame(req.principal, sheet)


def visible_blame(principal, sheet):
    """The blame sheet with the lines of sessions the principal may not see dropped; a file
    whose every session line is another's is as if it had no blame (404)."""
    sids = {ln["owner"]["sid"] for ln in sheet.get("lines") or () if isinstance(ln.get("owner"), dict)}
    if not sids:
        return sheet
    seen = {m["sid"] for m in R.visible(principal, [m for m in ops.sessions() if m["sid"] in sids])}
    if seen == sids:
        return sheet
    if not seen:
        raise NotFound(f"no blame for {sheet.get('path')}: no session you may see wrote it")
    lines = [ln for ln in sheet["lines"]
             if not isinstance(ln.get("owner"), dict) or ln["owner"]["sid"] in seen]
    return dict(sheet, lines=lines, hidden=len(sheet["lines"]) - len(lines))


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

def _owner_kw(req):
    """owner=NAME for an account's call (its keys, its notes); nothing for the launch token
    (the machine's, as before accounts)."""
    owner = R.owner_name(req.principal)
    return {"owner": owner} if owner else {}


def get_settings(app, req):
    """Your settings (an account's own ui.json) and where each provider's key comes from:
    your own ("own"), the environment, or the machine's shared key ("store")."""
    own = _owner_kw(req)
    data = app.settings_for(req.principal).public(ops.keys_list(**own))
    data["backends"] = app.backends
    data["providers"] = list(S.PROVIDERS)
    return data


def put_settings(app, req):
    """Change your settings; a key given is stored as yours (an account's keys.json)."""
    if req.body is None:
        raise UsageError("send the settings to change as a JSON object")
    own = _owner_kw(req)
    for key in app.settings_for(req.principal).update(req.body):
        ops.keys_set(*key, **own)
    return get_settings(app, req)


def models(app, req):
    """?provider=P[&base_url=U][&role=countersign]: the models the endpoint serves now. For
    the countersignature, its own endpoint and headers (and the demo's reviewer script)."""
    store = app.settings_for(req.principal)
    cfg = store.load()
    provider = req.query.get("provider") or cfg["provider"]
    prof = dict(store.profile(provider))
    second = req.query.get("role") == "countersign"
    if second and cfg["countersign"]["provider"] == provider:
        prof.update(base_url=cfg["countersign"]["base_url"], headers=cfg["countersign"]["headers"])
    base_url = req.query.get("base_url") or prof["base_url"] or None
    if base_url:
        S.check_profile({"base_url": base_url}, S.empty_profile(), provider)
    knobs = prof.get("knobs") or {}
    if provider == S.DEMO:
        script = S.DEMO_REVIEW_SCRIPT if second else S.DEMO_SCRIPT
        return {"provider": provider, "models": ops.models(provider, script=script)}
    listed = ops.models(provider, base_url=base_url, headers=prof["headers"] or None,
                        api=knobs.get("api"), azure_api_version=knobs.get("azure_api_version"),
                        **_owner_kw(req))
    return {"provider": provider, "models": listed}


# -- conversations ------------------------------------------------------------------------------------

def chats(app, req):
    return {"chats": app.chats.listing(req.principal)}


def start_chat(app, req):
    """A new conversation with your settings, owned by you (its keys and notes are yours)."""
    return app.chats.start(req.body or {}, app.settings_for(req.principal),
                           R.owner_name(req.principal))


def chat(app, req, sid):
    """A conversation, and whether this principal may write in it (`may_write`)."""
    return app.chats.detail(sid, req.principal)


def chat_message(app, req, sid):
    return app.chats.message(sid, req.body or {})


def chat_cancel(app, req, sid):
    return app.chats.cancel(sid)


def chat_approval(app, req, sid):
    """{call, fingerprint, allow}: decide the call waiting at the approval gate (409 when
    nothing waits, when it names another call, or when that call was decided already)."""
    return app.chats.decide(sid, req.body or {}, who=R.owner_name(req.principal))


# -- connectors ---------------------------------------------------------------------------------------

SERVER_SHOWN = ("name", "transport", "command", "args", "url")


def connectors(app, req):
    """The configured connectors: `connectors` for the welcome screen's checkboxes, `servers`
    (the command line or the URL, masked) for Settings, and the approval mode; nothing secret.
    They are configured with `overlord mcp`, not here."""
    listed = mcp_config.mcp_list()
    return {"connectors": ops.connector_list(), "approval": listed["approval"],
            "servers": [{k: s[k] for k in SERVER_SHOWN if k in s} for s in listed["servers"]]}


# -- the audit log ------------------------------------------------------------------------------------

AUDIT_SHOWN = 500             # newest lines per answer; ?since= pages further back


def may_read_audit(principal):
    """The one place that decides who reads the audit log: the launch token's holder while no
    account exists, then administrators and viewers (roles.AUDIT, the route's rule, says the
    same before this runs)."""
    return principal is not None and principal.role in ("admin", "viewer")


def audit(app, req):
    """?since=SEQ&action=A: the chain's lines (newest AUDIT_SHOWN of those matching) and the
    verify result (signed / UNSIGNED, lines, head, ok or the first bad line)."""
    if not may_read_audit(req.principal):
        raise OverlordError("the audit log is for administrators", http_status=403)
    raw = req.query.get("since", "")
    if raw and not raw.isdigit():
        raise UsageError("since takes a seq (a number)")
    action = req.query.get("action") or None
    if action is not None and (len(action) > 100 or not all(c.isalnum() or c in "._-" for c in action)):
        raise UsageError("action is an audit action name (e.g. session.commit) or its noun (session)")
    records = ops.audit_show(since=int(raw) if raw else None, action=action)
    return {"verify": ops.audit_status(), "records": records[-AUDIT_SHOWN:], "total": len(records),
            "more": len(records) > AUDIT_SHOWN}


# -- memory: your notes, the folder's notes and journal, a conversation's proposals ---------------

def _folder(app, req):
    """?folder=DIR (an existing absolute folder), else the working folder Settings name."""
    folder = req.query.get("folder")
    return S.check_folder(folder if folder else app.settings_for(req.principal).load()["folder"])


def memory_user(app, req):
    """Your notes (OVERLORD_HOME/memory.md; an account's users/<name>/memory.md): {path, text,
    bytes, cap}; cap is what the agent is told of them (the newest part, when they are longer)."""
    return ops.memory_user(**_owner_kw(req))


def put_memory_user(app, req):
    """{text}: replace your notes (an audited edit, by "workspace")."""
    text = (req.body or {}).get("text")
    if req.body is None or not isinstance(text, str):
        raise S.Invalid("text", "send your notes as {\"text\": \"...\"}")
    if "\0" in text:
        raise S.Invalid("text", "your notes must be text (a NUL byte is not)")
    own = _owner_kw(req)
    ops.memory_user_set(text, by="workspace", **own)
    return ops.memory_user(**own)


def memory_folder(app, req):
    """?folder=DIR: what the agent would be told before message one there (exactly
    `overlord memory show`), with its sources, and the folder's journal of committed work."""
    folder = _folder(app, req)
    told = ops.memory_show(folder, **_owner_kw(req))
    return {"folder": folder, "text": told.get("text", ""), "sha256": told.get("sha256"),
            "sources": told.get("sources") or [],
            "journal": R.visible(req.principal, ops.memory_journal(folder))}


def chat_memory(app, req, sid):
    """A conversation's proposed notes, each with whether (and by whom) it was saved."""
    return {"sid": sid, "proposals": ops.memory_proposals(sid)}


def chat_memory_accept(app, req, sid):
    """{ids: [N, ...]} or {all: true}: save proposed notes into your notes, by "workspace".
    Allowed while the agent is still running: the acceptance is recorded beside the run."""
    return app.chats.accept_memory(sid, req.body or {})


# -- skills: the catalogue for a folder; machine skills added and removed by a person -------------

def skills(app, req):
    """?folder=DIR: every skill a conversation there could be offered -- project and machine,
    which are shadowed, which the policy allows -- and the warnings (malformed SKILL.md)."""
    folder = _folder(app, req)
    listed = ops.skills_list(folder)
    return {"folder": folder, "skills": listed.get("skills") or [],
            "warnings": listed.get("warnings") or []}


def skill(app, req, name):
    """One skill: its SKILL.md text and its files (?folder=DIR for a project skill)."""
    return ops.skill_show(name, _folder(app, req))


def skill_add(app, req):
    """{path}: install the skill folder at that path on this machine as a machine skill."""
    path = (req.body or {}).get("path")
    if not isinstance(path, str) or not path.strip() or "\0" in path or len(path) > 4096:
        raise S.Invalid("path", "name the skill's folder (a path on this machine, holding SKILL.md)")
    path = os.path.expanduser(path.strip())
    if not os.path.isabs(path):
        raise S.Invalid("path", "the skill's folder must be an absolute path")
    added = ops.skill_add(path, by="workspace")
    return {"added": added}


def skill_remove(app, req, name):
    """Remove a machine skill (a project skill is a file of its folder: not removed here)."""
    return {"removed": ops.skill_remove(name, by="workspace")}
