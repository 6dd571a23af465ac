"""Conversations: one conversation is one agent session. The first message opens it
(ops.agent), each later one resumes it (ops.resume); either runs in a thread of its own while
the page follows along over server-sent events.

A Channel is the live side of one conversation: the run in progress (if any) and what it has
said since it started -- transcript events as they are recorded (each with its index in the
transcript), streamed text deltas, and the run's end. A page that connects gets a snapshot
(the transcript as recorded, plus the text streamed so far in the turn under way) and then the
live events from that point, so a reload or a server restart rebuilds the conversation exactly
from its transcript. Rewind, fork, commit and discard reset the channel, and every open page
takes a fresh snapshot.

The approval gate: a connector tool that is not read-only asks before it runs. The run's
approver publishes the request on the channel (an "approval" event, and `pending` in every
snapshot while it waits, so a reload still shows the card) and waits on the channel's
condition until a person decides (POST .../approval: exactly that call and fingerprint, once)
or the run is stopped (the approver raises Cancelled).

Accounts: a conversation started by an account is its own (ops.agent owner=, its settings,
keys and notes); the listing is filtered to what the principal may see, and the detail says
whether it may write (`may_write`). A run's thread carries the request's context, so what it
appends to the audit chain names the account that asked (audit.acting_as).
"""
import contextvars
import re
import secrets
import threading
import time

from overlord import ops
from overlord.errors import NotFound, OverlordError, UsageError
from overlord.ops import auth, launcher
from overlord.web import roles as R
from overlord.web import settings as S

AUDIT = "/audit"
OUTPUT_CHARS = 16000          # a tool's output as the page shows it (the transcript keeps all)
HEARTBEAT = 15.0              # seconds between keep-alive comments on an idle stream
START_WAIT = 120.0            # how long a POST waits for the session to open
MAX_CONNECTORS = 32           # names one conversation may be granted
FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


class Channel:
    def __init__(self, sid):
        self.sid = sid
        self.cond = threading.Condition()
        self.events = []          # [(name, data)] since `offset`
        self.offset = 0           # how many earlier events were dropped (positions are absolute)
        self.run = None           # the Cancel of the run in progress
        self.partial = {"text": "", "thinking": ""}
        self.count = 0            # the transcript's length, as far as this run has written it
        self.last = None          # how the last run here ended
        self.pending = None       # the approval request the run waits on (its view), or None
        self.answer = None        # the decision given for it, until the approver takes it
        self.decided = {}         # request token -> allow, for the requests decided in this run
        self.taken = set()        # transcript positions this face wrote beside the run (a note saved)

    def push(self, name, data):
        """With the lock held: publish one event."""
        self.events.append((name, data))
        self.cond.notify_all()

    @property
    def end(self):
        return self.offset + len(self.events)

    def begin(self, stop, count):
        """With the lock held: a run starts; drop what earlier runs said (slow readers resync)."""
        self.offset, self.events = self.end, []
        self.run, self.count, self.last = stop, count, None
        self.partial = {"text": "", "thinking": ""}
        self.pending, self.answer, self.decided = None, None, {}
        self.taken = set()
        self.push("state", {"running": True})


class Chats:
    def __init__(self, store):
        self.settings = store
        self.channels = {}
        self._lock = threading.Lock()

    def channel(self, sid):
        with self._lock:
            if sid not in self.channels:
                self.channels[sid] = Channel(sid)
            return self.channels[sid]

    def running(self, sid):
        ch = self.channels.get(sid)
        return ch is not None and ch.run is not None

    # -- listing --------------------------------------------------------------------------------

    def listing(self, principal=None):
        metas = [m for m in ops.sessions() if m.get("agent")]
        if principal is not None:
            metas = R.visible(principal, metas)
        out = [self.summary(m) for m in metas]
        return sorted(out, key=lambda c: c["created"] or 0, reverse=True)

    def summary(self, meta):
        agent = meta.get("agent") or {}
        endpoint = agent.get("endpoint") or {}
        title = meta.get("command") or ""
        title = title[len("agent: "):] if title.startswith("agent: ") else title
        ch = self.channels.get(meta["sid"])
        return {"sid": meta["sid"], "title": title or "(untitled)", "state": meta.get("state"),
                "created": meta.get("created"), "target": meta.get("target"),
                "provider": endpoint.get("provider"), "model": agent.get("model"),
                "audit": bool(agent.get("audit")), "grants": meta.get("grants"),
                "connectors": _granted(meta), "owner": meta.get("owner"),
                "running": bool(ch and ch.run), "last": ch.last if ch else None}

    def detail(self, sid, principal=None):
        session = _chat_session(sid)
        ch = self.channel(sid)
        with ch.cond:
            records = ops.transcript(sid)
            partial, pending = _partial(ch, records), ch.pending
        may_write = principal is None or auth.can_change(principal, session.meta)
        return {"chat": self.summary(session.meta), "records": views(records), "partial": partial,
                "pending": pending, "may_write": may_write}

    # -- starting, continuing, stopping ---------------------------------------------------------

    def start(self, body, store=None, owner=None):
        """A new conversation with `store`'s settings (the account's own; the machine's when
        None), owned by `owner` (None: the launch token's, as before accounts)."""
        message = _message(body)
        audit = message == AUDIT or message.startswith(AUDIT + " ")
        task = message[len(AUDIT):].strip() if audit else message
        cfg = (store or self.settings).load()
        provider = body.get("provider") or cfg["provider"]
        if provider not in S.PROVIDERS:
            raise S.Invalid("provider", f"provider must be one of {', '.join(S.PROVIDERS)}")
        prof = cfg["profiles"][provider]
        model = body.get("model") or prof["model"] or None
        if model is None and provider != S.DEMO:
            raise S.Invalid("model", "choose a model in Settings first")
        if model is not None and (not isinstance(model, str) or len(model) > 200):
            raise S.Invalid("model", "model must be a model id")
        folder = S.check_folder(body.get("folder") or cfg["folder"])
        connectors = _connectors(body)
        sandbox = cfg["sandbox"]
        stop = ops.Cancel()
        opened = threading.Event()          # set by the first transcript event, or the end
        box = {"started": opened}

        def on_open(sid):
            ch = self.channel(sid)
            with ch.cond:
                ch.begin(stop, 0)
            box["channel"] = ch

        def work():
            with launcher.opening(on_open):
                self._drive(box, stop, lambda on_event, on_delta: ops.agent(
                    task, target=folder, provider=provider, model=model,
                    script=S.DEMO_SCRIPT if provider == S.DEMO else None,
                    base_url=prof["base_url"] or None, headers=prof["headers"] or None,
                    knobs=prof["knobs"], system=prof["system"] or None, jail=sandbox["jail"],
                    net=sandbox["net"], audit=audit, on_event=on_event, on_delta=on_delta,
                    cancel=stop, connectors=connectors, approver=self.approver,
                    **net_grants(sandbox), **({"owner": owner} if owner else {})))
            opened.set()
        _thread(work)
        opened.wait(START_WAIT)
        if box.get("error") and not box.get("recorded"):
            raise in_settings_words(box["error"])
        if "channel" not in box:
            raise OverlordError("the session did not open in time")
        return {"sid": box["channel"].sid}

    def message(self, sid, body):
        note = _message(body)
        if note == AUDIT or note.startswith(AUDIT + " "):
            raise UsageError("/audit starts a new conversation; this one is already under way")
        _chat_session(sid)
        ch = self.channel(sid)
        stop = ops.Cancel()
        with ch.cond:
            if ch.run is not None:
                raise OverlordError("the agent is still working in this conversation: wait for it "
                                    "or press Stop", http_status=409)
            ch.begin(stop, len(ops.transcript(sid)))
        started = threading.Event()
        box = {"channel": ch, "started": started}

        def work():
            self._drive(box, stop, lambda on_event, on_delta: ops.resume(
                sid, note, on_event=on_event, on_delta=on_delta, cancel=stop,
                approver=self.approver))
            started.set()
        _thread(work)
        started.wait(START_WAIT)
        if "error" in box and not box.get("recorded"):
            raise box["error"]
        return {"sid": sid}

    def cancel(self, sid):
        ch = self.channels.get(sid)
        stop = ch.run if ch else None
        if stop is None:
            return {"stopping": False}
        stop.set()
        with ch.cond:
            ch.cond.notify_all()          # an approver waiting at the gate sees it at once
        return {"stopping": True}

    # -- the approval gate ----------------------------------------------------------------------

    def approver(self, request, cancel):
        """ops' approver for a run of this face: show the request, wait for a person's
        decision (or the run's cancel), return it as an ops.Decision."""
        ch = self.channel(request.sid)
        with ch.cond:
            ch.pending, ch.answer = pending_view(request), None
            ch.push("approval", ch.pending)

        def wake():
            with ch.cond:
                ch.cond.notify_all()
        try:
            with cancel.on_set(wake), ch.cond:
                while ch.answer is None and not cancel.is_set():
                    ch.cond.wait()
                answer = ch.answer
        finally:
            with ch.cond:
                left = ch.pending
                ch.pending, ch.answer = None, None
                if left is not None:      # stopped, not decided: the card goes
                    ch.push("decision", {"call": left["call"], "allow": None})
        if answer is None:
            raise ops.Cancelled()
        return answer

    def decide(self, sid, body, who=None):
        """A person's answer to the pending request: it must name exactly that call and its
        fingerprint (an approval authorizes one call), and a call is decided once."""
        call, fingerprint, allow, token = _decision(body)
        _chat_session(sid)
        ch = self.channel(sid)
        with ch.cond:
            if token in ch.decided:
                was = "allowed" if ch.decided[token] else "denied"
                raise OverlordError(f"call {call} was already {was}: a request is decided once",
                                    http_status=409)
            pending = ch.pending
            if pending is None or ch.answer is not None:
                raise OverlordError("nothing in this conversation is waiting for approval",
                                    http_status=409)
            if call != pending["call"] or fingerprint != pending["fingerprint"] or \
                    token not in (None, pending["request"]):
                raise OverlordError("that is not the call waiting for approval: an approval "
                                    "authorizes exactly one call (its id and fingerprint)",
                                    http_status=409)
            ch.answer = ops.Decision(allow=allow, by="workspace", note=who)
            ch.decided[pending["request"]] = allow
            ch.pending = None
            ch.push("decision", {"call": call, "allow": allow})
        return {"sid": sid, "call": call, "decision": "allow" if allow else "deny"}

    # -- proposed notes: saved by a person, while the agent runs too ---------------------------

    def accept_memory(self, sid, body):
        """{ids: [N, ...]} or {all: true}: ops.memory_accept by "workspace". The acceptance is
        appended to the transcript beside a run in progress (it does not join the
        conversation); its position is kept so the run's own events keep their indices, and
        every open page is told at once (a "record" event)."""
        ids, every = _accept(body)
        _chat_session(sid)
        ch = self.channel(sid)
        with ch.cond:
            before = len(ops.transcript(sid))
            accepted = ops.memory_accept(sid, ids=ids, all=every, by="workspace")
            records = ops.transcript(sid)
            for pos in range(before, len(records)):
                event = records[pos]
                if event.get("type") == "memory_accepted" and event.get("by") == "workspace":
                    if ch.run is not None:
                        ch.taken.add(pos)
                    ch.push("record", view_of(event, pos))
        return {"sid": sid, "accepted": accepted, "proposals": ops.memory_proposals(sid)}

    def _drive(self, box, stop, call):
        """Run the agent (call(on_event, on_delta)) and publish what it does."""
        def on_event(event):
            ch = box["channel"]
            box["recorded"] = True
            if "started" in box:
                box["started"].set()
            with ch.cond:
                while ch.count in ch.taken:         # a line written beside the run (a saved note)
                    ch.count += 1
                index, ch.count = ch.count, ch.count + 1
                if event.get("type") == "assistant":
                    ch.partial = {"text": "", "thinking": ""}
                view = view_of(event, index)
                if view is not None:
                    ch.push("record", view)
                else:
                    ch.cond.notify_all()

        def on_delta(kind, text):
            if stop.is_set():
                raise ops.Cancelled()
            ch = box["channel"]
            with ch.cond:
                if kind == "restart":
                    ch.partial = {"text": "", "thinking": ""}
                    ch.push("restart", {})
                elif kind in ch.partial:
                    ch.partial[kind] += text
                    ch.push("delta", {"kind": kind, "text": text})
        result, error = None, None
        try:
            result = call(on_event, on_delta)
        except OverlordError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - a run's failure is shown, never a dead thread
            error = OverlordError(f"internal error: {type(exc).__name__}: {exc}", http_status=500)
        box["error"] = error
        ch = box.get("channel")
        if ch is None:
            return
        with ch.cond:
            ch.run, ch.pending, ch.answer = None, None, None
            if result is not None:
                ch.last = {"reason": result.reason, "message": result.message, "turns": result.turns,
                           "usage": result.usage}
            else:
                ch.last = {"reason": "error", "message": str(error)}
            ch.push("state", {"running": False, **ch.last, "at": time.time()})

    def reset(self, sid):
        """The session's record changed under the channel (rewind, fork, commit, discard)."""
        ch = self.channels.get(sid)
        if ch is not None:
            with ch.cond:
                ch.push("reset", {})

    # -- the live stream --------------------------------------------------------------------------

    def stream(self, sid, alive=lambda: True):
        """(name, data) pairs for one page: a snapshot, then live events; ("ping", None) when
        idle. Resynchronises (a fresh snapshot) after a reset or when it fell behind."""
        _chat_session(sid)
        ch = self.channel(sid)
        while alive():
            with ch.cond:
                records = ops.transcript(sid)
                seen, pos = len(records), ch.end
                running = ch.run is not None
                partial = _partial(ch, records)
                last, pending = ch.last, ch.pending
            meta = ops.get_session(sid).meta
            yield "snapshot", {"chat": self.summary(meta), "records": views(records),
                               "running": running, "partial": partial, "last": last,
                               "pending": pending}
            resync = False
            while not resync and alive():
                with ch.cond:
                    if pos < ch.offset:
                        resync = True
                        break
                    if pos >= ch.end:
                        ch.cond.wait(HEARTBEAT)
                    batch = ch.events[pos - ch.offset:]
                    pos = ch.end
                if not batch:
                    yield "ping", None
                for name, data in batch:
                    if name == "reset":
                        resync = True
                        break
                    if name == "record" and data["i"] < seen:
                        continue          # already in the snapshot
                    yield name, data


def net_grants(sandbox):
    """ops.agent's recorded-network grants from the settings' sandbox: the allowlist and the
    hold, only for net "proxy" (the engine refuses them otherwise; nothing is passed then)."""
    if sandbox.get("net") != "proxy":
        return {}
    return {"net_allow": list(sandbox.get("net_allow") or ()),
            "hold_writes": bool(sandbox.get("hold_writes"))}


def _thread(work):
    """Run work in a thread of its own, in this request's context (the account it acts for)."""
    ctx = contextvars.copy_context()
    threading.Thread(target=ctx.run, args=(work,), name="overlord-chat", daemon=True).start()


# The engine's refusals name CLI flags; here the same grants are switches in Settings.
FLAG_WORDS = (("pass --no-jail to run it in the transaction without the jail",
               "turn off \"Jail the agent's tools\" in Settings to run it in the transaction "
               "without the jail"),
              ("pass --net host as well", "set the tools' network to host in Settings as well"),
              ("--net none", "an offline network"),
              ("--net proxy", "the recorded (proxy) network"),
              ("--net-allow", "an allowlist"), ("--hold-writes", "holding requests"))


def in_settings_words(exc):
    text = str(exc)
    for flag, words in FLAG_WORDS:
        text = text.replace(flag, words)
    if text == str(exc):
        return exc
    return type(exc)(text, http_status=exc.http_status)


def _partial(ch, records):
    """With the lock held: the text streamed so far in the turn under way, or None. A reply
    already on disk but not yet published (its event is waiting for this lock) ends the turn:
    its text is in the records, not partial any more."""
    if ch.run is None or any(r.get("type") == "assistant" for r in records[ch.count:]):
        return None
    return dict(ch.partial)


def _granted(meta):
    """The connector names a conversation was granted ([] for none)."""
    names = (meta.get("connectors") or {}).get("names") or []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _chat_session(sid):
    session = ops.get_session(sid)
    if not session.meta.get("agent"):
        raise NotFound(f"session {sid} is not a conversation (it was not opened by the agent)")
    return session


def _connectors(body):
    """The connectors a new conversation is granted: a list of names (ops refuses unknown ones)."""
    names = body.get("connectors")
    if names is None:
        return None
    if not isinstance(names, list) or len(names) > MAX_CONNECTORS or \
            not all(isinstance(n, str) and 0 < len(n) <= 64 for n in names):
        raise S.Invalid("connectors", f"connectors is a list of at most {MAX_CONNECTORS} "
                                      "connector names")
    return list(dict.fromkeys(names)) or None


def _decision(body):
    """(call, fingerprint, allow, request token or None) of POST .../approval, each checked."""
    call, fingerprint, allow = body.get("call"), body.get("fingerprint"), body.get("allow")
    token = body.get("request")
    if not isinstance(call, str) or not call or len(call) > 200:
        raise UsageError("call is the id of the tool call waiting for approval")
    if not isinstance(fingerprint, str) or not FINGERPRINT.match(fingerprint):
        raise UsageError("fingerprint is the pending call's fingerprint (64 hex digits)")
    if not isinstance(allow, bool):
        raise UsageError("allow is true or false")
    if token is not None and (not isinstance(token, str) or len(token) > 64):
        raise UsageError("request is the pending request's token")
    return call, fingerprint, allow, token


MAX_IDS = 1000


def _accept(body):
    """(ids or None, all) of POST .../memory/accept, each checked."""
    ids, every = body.get("ids"), body.get("all", False)
    if not isinstance(every, bool):
        raise UsageError("all is true or false")
    if every and ids is not None:
        raise UsageError("send either ids or all: true, not both")
    if not every:
        if not isinstance(ids, list) or not ids or len(ids) > MAX_IDS or \
                not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in ids):
            raise UsageError("ids is a list of proposal numbers (1, 2, ...), or send all: true")
        ids = list(dict.fromkeys(ids))
    return (None if every else ids), every


def pending_view(request):
    """An ops.ApprovalRequest as the page shows it (the exact input: the card prints it all)."""
    return {"sid": request.sid, "turn": request.turn, "call": request.call,
            "server": request.server, "tool": request.tool, "offered": request.offered,
            "input": request.input, "fingerprint": request.fingerprint,
            "readonly_claim": bool(request.readonly_claim), "at": time.time(),
            "request": secrets.token_hex(8)}     # this request, not the model-chosen call id


def _message(body):
    text = body.get("message")
    if not isinstance(text, str) or not text.strip():
        raise S.Invalid("message", "write a message first")
    if len(text) > 100_000:
        raise S.Invalid("message", "a message is at most 100,000 characters")
    return text.strip()


# -- what the page sees of a transcript event -----------------------------------------------------

def views(records):
    out = []
    for i, event in enumerate(records):
        view = view_of(event, i)
        if view is not None:
            out.append(view)
    return out


def view_of(event, index):
    """A transcript event as the page renders it (None: nothing to show)."""
    kind = event.get("type")
    if kind in ("system", "request", "tools"):
        return None
    view = {"i": index, "type": kind, "at": event.get("at")}
    if kind == "task":
        view.update(text=event.get("text"), audit=bool(event.get("audit")))
    elif kind == "resume":
        view.update(note=event.get("note"))
    elif kind == "assistant":
        msg = event.get("message") or {}
        view.update(turn=event.get("turn"), text=msg.get("text") or "",
                    calls=[{"id": c.get("id"), "name": c.get("name")} for c in msg.get("tool_calls") or []],
                    stop_reason=event.get("stop_reason"), model=event.get("model"),
                    thinking=event.get("thinking"), usage=event.get("usage"))
    elif kind == "tool_call":
        view.update({k: event.get(k) for k in ("turn", "call", "tool", "summary", "refused")})
        view["input"] = _short_input(event.get("input"))
        view["connector"] = _connector(event)
    elif kind == "tool_result":
        result = event.get("result") or {}
        content = result.get("content") or ""
        if not isinstance(content, str):
            content = str(content)
        view.update({k: event.get(k) for k in ("turn", "call", "tool", "exit_code", "layer", "paths",
                                               "truncated", "timed_out", "cancelled", "ms", "not_run")})
        view.update(output=content[:OUTPUT_CHARS], clipped=len(content) > OUTPUT_CHARS,
                    is_error=bool(result.get("is_error")), connector=_connector(event),
                    denial=_denial(event.get("denial")))
    elif kind == "memory_proposal":
        # the note is the model's text: the page shows it as text, and Save accepts it
        view.update({k: event.get(k) for k in ("id", "turn", "call", "sha256")})
        view["note"] = event.get("note") if isinstance(event.get("note"), str) else ""
    elif kind == "memory_accepted":
        ids = event.get("ids")
        view.update(ids=[n for n in ids if isinstance(n, int)] if isinstance(ids, list) else [],
                    by=event.get("by") if isinstance(event.get("by"), str) else None,
                    sha256=event.get("sha256"))
    elif kind == "skill_load":
        files = event.get("files")
        files = [f for f in files if isinstance(f, str)] if isinstance(files, list) else []
        view.update({k: event.get(k) for k in ("name", "source", "sha256", "turn", "call")})
        view.update(files=files[:SKILL_FILES], more_files=max(0, len(files) - SKILL_FILES))
    elif kind == "connectors":
        view.update(servers=event.get("servers") or {}, errors=event.get("errors") or [])
    elif kind == "approval_requested":
        # the exact input, whole: the person decides on what will be sent
        view.update({k: event.get(k) for k in ("turn", "call", "server", "tool", "offered", "input",
                                               "fingerprint", "readonly_claim")})
    elif kind == "approval":
        view.update({k: event.get(k) for k in ("turn", "call", "fingerprint", "by", "note", "mode")})
        view["allow"] = bool(event.get("allow"))
    elif kind == "connector_error":
        view.update({k: event.get(k) for k in ("turn", "call", "server")})
        view["message"] = event.get("message") if isinstance(event.get("message"), str) else None
    elif kind == "budget":
        # a cost line reached before a model call (overlord/agent/loop.py check_budget): its
        # own words name the line, its source and what was spent
        view.update({k: event.get(k) for k in ("key", "limit", "spent", "source", "kind")})
        view["message"] = event.get("message") if isinstance(event.get("message"), str) else None
    elif kind in ("error", "done"):
        # the reason a run failed is the point of these: its message is the provider's or the
        # session's own line (`cannot reach 127.0.0.1:11434: connection refused`)
        view.update({k: v for k, v in event.items() if k not in ("type", "at")})
        if not isinstance(view.get("message"), str):
            view["message"] = None
    else:
        view.update({k: v for k, v in event.items() if k not in ("message", "results", "type", "at")})
    return view


SKILL_FILES = 50              # a loaded skill's files as its card lists them
DENIAL_CAUSES = ("seccomp", "readonly", "outside", "network", "limit", "disk")


def _denial(value):
    """A tool result's denial ({cause, line}: the sandbox refused the call), None otherwise."""
    if not isinstance(value, dict) or not isinstance(value.get("line"), str):
        return None
    cause = value.get("cause")
    return {"cause": cause if cause in DENIAL_CAUSES else "other", "line": value["line"][:2000]}


def _connector(event):
    """{server, tool, fingerprint} of a connector's call (a result's also sha256 and size),
    None for a built-in tool."""
    c = event.get("connector")
    if not isinstance(c, dict):
        return None
    out = {k: c.get(k) for k in ("server", "tool", "fingerprint")}
    for k in ("sha256", "size"):
        value = c.get(k, event.get(k))
        if value is not None:
            out[k] = value
    return out


def _short_input(value):
    """A tool call's input for its card: long strings cut (the transcript keeps them whole)."""
    if not isinstance(value, dict):
        return value
    return {k: (v[:4000] + "\u2026" if isinstance(v, str) and len(v) > 4000 else v) for k, v in value.items()}
