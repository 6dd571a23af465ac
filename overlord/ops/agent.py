"""The built-in agent as operations: agent, resume, transcript, keys, models.

An agent run is a session like any other: opened on the target with the agent's grants (jailed
and offline unless told otherwise), every tool call one command in it (ops.exec_capture), each
writing call its own savepoint stamped {kind: agent, turn, tool, call, summary}. The endpoint
and knobs are recorded on the session's meta (never the key, nor a credential header's value),
so a resume calls the same model the same way.

A session started for an account (issue 15) records its `owner` (meta "owner", None for the
CLI) in the same save as the agent settings: its keys are that account's first (agent/keys.py),
its notes that account's (agent/memory.py), on the first run and on every resume.

Cost: every run (first and resumed) has a meter (trust/cost.Meter(sid, target, owner)): each
model call checked against the budget lines before it is made and charged to the ledger after
(agent/loop.py); a stop is the done reason "budget". AgentResult carries the session's
running total (`cost`) and the stop (`budget`). A run that leaves the session pending with
changes is the audit act `session.needs_review` (by "agent", the number of changes, the done
reason): webhooks tell a person that work waits for them.
"""
import contextlib
import dataclasses
import os
import pwd
import socket

from overlord.agent import keys as key_store
from overlord.agent import denials, memory, prompt, providers, skills, tools
from overlord.agent import transcript as T
from overlord.agent.cancel import Cancel
from overlord.agent.loop import Loop
from overlord.agent.providers.base import Endpoint, ProviderError
from overlord.agent.providers.common import SECRET_HINTS
from overlord.errors import NotFound, OverlordError, UsageError
from overlord.sandbox import backends
from overlord.sandbox import limits as grant_limits
from overlord.trust.protect import own_source
from overlord.txn import store
from overlord.ops.execute import command_cwd, exec_capture, run
from overlord.ops.grants import check_net_grants, resolve_target, validate_grants
from overlord.trust import audit, cost, policy
from overlord.ops.decide import rollback
from overlord.ops.review import get_session
from overlord.ops import connectors as hands_ops
from overlord.ops.home import valid_user

DEFAULT_CALL_TIMEOUT = 600          # seconds a tool call may run, unless --timeout
UNASKED = {"jail": True, "net": "none", "timeout": DEFAULT_CALL_TIMEOUT}   # the agent's own defaults
KNOBS = ("max_tokens", "temperature", "top_p", "stop", "effort", "thinking", "api", "stream",
         "fallbacks", "azure_api_version")
CONTINUE = "Continue from where you stopped."


@dataclasses.dataclass
class AgentResult:
    sid: str
    reason: str            # the done reason (loop.DONE_REASONS)
    turns: int
    usage: dict
    changes: list          # the session's plan: what commit would do
    message: str = None    # what went wrong, for error / max_turns / budget
    cost: dict = None      # the session's running total (trust/cost.session_total's shape)
    budget: dict = None    # the budget stop {key, limit, spent, source, kind, message}, or None


# -- endpoints ---------------------------------------------------------------------------------

def endpoint(provider=None, model=None, base_url=None, headers=None, knobs=None, script=None,
             need_key=True, owner=None):
    """An Endpoint from flags: the provider's default base URL, the key from the store or the
    environment (refused here, before anything opens, when a provider needs one); owner: an
    account's own key first (agent/keys.get)."""
    provider = provider or os.environ.get("OVERLORD_PROVIDER") or "anthropic"
    providers.get(provider)                      # an unknown name is a usage error
    knobs = {k: v for k, v in (knobs or {}).items() if v is not None}
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise UsageError(f"unknown generation setting(s): {', '.join(unknown)}")
    if provider == "scripted":
        if not script:
            raise UsageError("the scripted provider needs --script FILE")
        script = os.path.abspath(script)
    model = model or os.environ.get("OVERLORD_MODEL")
    ep = Endpoint(provider, model=model, base_url=base_url or providers.default_base_url(provider),
                  headers=dict(headers or {}), script=script, **knobs)
    if need_key and provider not in ("scripted",):
        ep.api_key = _key_for(provider, ep.base_url, owner)
        if not ep.api_key and provider != "openai-compatible":
            raise OverlordError(f"no key for {provider}: set {key_store.ENV[provider]} or run "
                                f"`overlord keys set {provider}`")
    return ep


def _key_for(provider, base_url, owner=None):
    """The key for a call to base_url: key_store's resolution. For an owner (an account), the
    machine's shared key -- the environment's or the machine's keys.json, not the account's
    own -- goes only to the provider's own endpoint (its built-in default URL): any other URL
    is one the account chose, and would read the key off a listener of its own; refused here,
    before any connection. owner None (the CLI, the launch token) is as it always was."""
    key, source = key_store.resolve(provider, owner)
    if owner is not None and key and source in ("env", "store", "vault"):
        own = providers.default_base_url(provider)
        if base_url and (not own or base_url.rstrip("/") != own.rstrip("/")):
            url = "".join(c if c.isprintable() else "?" for c in base_url)[:300]
            raise OverlordError(f"the machine's shared key goes only to {provider}'s own "
                                f"endpoint; set your own key (Settings) for {url}",
                                http_status=403)
    return key


def _recordable(ep):
    """The endpoint as the session records it: no key, no credential header's value."""
    rec = ep.record()
    rec["headers"] = {k: (None if any(h in k.lower() for h in SECRET_HINTS) else v)
                      for k, v in (ep.headers or {}).items()}
    return rec


def _recorded_endpoint(rec, headers, owner=None):
    fields = {k: v for k, v in rec.items() if k in {f.name for f in dataclasses.fields(Endpoint)}}
    merged = dict(fields.get("headers") or {})
    merged.update(headers or {})
    missing = [k for k, v in merged.items() if v is None]
    if missing:
        raise OverlordError(f"the session's endpoint used the header {missing[0]}, a credential "
                            f"that is not recorded: pass it again with --header '{missing[0]}: ...'")
    fields["headers"] = merged
    ep = Endpoint(**fields)
    if ep.provider != "scripted":
        ep.api_key = _key_for(ep.provider, ep.base_url, owner)
        if not ep.api_key and ep.provider != "openai-compatible":
            raise OverlordError(f"no key for {ep.provider}: set {key_store.ENV[ep.provider]} or "
                                f"run `overlord keys set {ep.provider}`")
    return ep


def _served_model(ep):
    if ep.provider == "scripted":
        try:
            return providers.get("scripted").load(ep.script)[0]
        except ProviderError as exc:
            raise OverlordError(str(exc)) from None
    if not ep.model:
        raise UsageError(f"pass --model (`overlord models --provider {ep.provider}` lists them)")
    return ep.model


# -- agent and resume --------------------------------------------------------------------------

def agent(task, target=None, *, provider=None, model=None, base_url=None, headers=None,
          knobs=None, script=None, system=None, max_turns=None, context_window=None, jail=None,
          net=None, timeout=None, limits=None, backend=None, trace=None, audit=False, stack=False,
          on_event=None, on_delta=None, cancel=None, broker=None, connectors=None,
          connector_shell=False, approver=None, owner=None, net_allow=None, hold_writes=None):
    """Open a session on target and run the agent on task in it. Returns AgentResult; the
    session is left pending for review whatever the done reason. jail, net, timeout, limits:
    None is unasked (the agent's defaults, held to the target's policy: UNASKED).
    net_allow (host entries, netallow.parse) and hold_writes (bool) mean something only with
    net "proxy" (the recording proxy) and are refused with any other network, before anything
    opens (grants.check_net_grants); the agent never picks proxy by itself.
    connectors: the names of the connectors granted (ops.connectors); approver(request,
    cancel) -> Decision answers the approval gate (None: nobody to ask, so `ask` denies).
    owner: the account the session is for (its keys, its notes; recorded on the meta), None
    for the CLI; a name that is not an account name is refused before anything opens."""
    _check_owner(owner)
    if audit and jail is False:
        raise UsageError("--audit needs the jail: there is nothing to audit without one")
    task = prompt.audit_task(task) if audit else (task or "").strip()
    if not task:
        raise UsageError("give the agent a task")
    if max_turns is not None and max_turns < 1:
        raise UsageError("--max-turns must be at least 1")
    if context_window is not None and context_window < 1000:
        raise UsageError("--context-window must be at least 1000 tokens")
    ep = endpoint(provider, model, base_url, headers, knobs, script, owner=owner)
    served = _served_model(ep)
    asked = validate_grants(net_grants({"jail": jail, "net": net, "timeout": timeout or None,
                                        "limits": limits}, net_allow, hold_writes), "agent")
    grants = policy.cap_grants(resolve_target(target), asked, UNASKED)
    check_net_grants(grants)             # --net-allow / --hold-writes without --net proxy
    held = hands_ops.grant(resolve_target(target), connectors, connector_shell, brokered=bool(broker))
    jail, net = grants["jail"], grants["net"]
    _check_backend(backends.choose(backend), jail, net)
    opened = run(["true"], target=target, backend=backend, grants=grants, trace=trace, stack=stack,
                 cause={"kind": "agent", "event": "open"}, broker=broker)
    session = get_session(opened.sid)
    settings = {"endpoint": _recordable(ep), "model": served, "max_turns": max_turns,
                "context_window": context_window, "system": system, "audit": bool(audit)}
    session.meta.update(command=f"agent: {_oneline(task if not audit else 'containment audit')}",
                        agent=settings, task=_oneline(task, 200), owner=owner)
    if audit:
        session.meta["audit"] = True
    if held:
        session.meta["connectors"] = held
    told = memory.gather(session.target, owner)
    offered = skills.catalogue(session.target, policy.rule(session.target)["skills"])
    session.meta.update(memory=told.record(), skills=offered.record())
    session.save()
    situation = prompt.Situation(
        provider=ep.provider, model=served, base_url=ep.base_url, target=session.target,
        jailed=bool(jail), backend=session.meta["backend"], net=net,
        net_allow=tuple(grants.get("net_allow") or ()), hold_writes=bool(grants.get("hold_writes")),
        call_timeout=grants["timeout"],
        limits=grant_limits.effective(grants.get("limits")), operator=_operator(),
        own_source=own_source(session.target), audit=bool(audit),
        connectors=tuple(held["names"]) if held else ())
    cancel = cancel if isinstance(cancel, Cancel) else Cancel(cancel)
    try:
        with T.writer(session.dir, "run the agent in"):
            record = T.Transcript(session.dir, on_event)
            with _hands(session, held, record, approver, cancel) as (hands, specs, started):
                record.record("system", prompt=prompt.system_prompt(
                    situation, system, sections=(told.text, offered.text)),
                    tools=_toolbox(session, record, None).specs + specs,
                    memory=dict(told.record(), text=told.text), skills=offered.record())
                if started:
                    record.record("connectors", **started)
                record.record("task", text=task, message={"role": "user", "content": task},
                              audit=bool(audit))
                return _drive(session, ep, record, max_turns, context_window, on_delta, cancel, hands)
    except hands_ops.StartRefused:
        rollback(session.sid)            # nothing ran in it: the session goes, the line stays
        raise


@contextlib.contextmanager
def _hands(session, held, record, approver, cancel):
    """(hands, the tool specs they offer, the `connectors` event) for a run; closed after."""
    if not held:
        yield None, [], None
        return
    hands = hands_ops.Hands(session, held, record, approver, cancel)
    try:
        specs, started = hands.start()
        yield hands, specs, started
    finally:
        hands.close()


def resume(sid, note=None, *, headers=None, max_turns=None, on_event=None, on_delta=None,
           cancel=None, approver=None):
    """Reopen an agent session on its surviving stack: rebuild the conversation from the
    transcript, deliver the note as the next user turn, continue. The key is the session
    owner's (meta "owner"; none: the CLI's resolution)."""
    session = get_session(sid)
    settings = session.meta.get("agent")
    if not settings or not T.exists(session.dir):
        raise OverlordError(f"session {sid} was not opened by the agent: nothing to resume")
    if session.meta["state"] not in store.OPEN_STATES:
        raise OverlordError(f"cannot resume session {sid}: it is {session.meta['state']}")
    if session.meta.get("limit"):
        raise OverlordError(f"cannot resume session {sid}: it crossed its {session.meta['limit']} "
                            "grant and can run nothing more")
    policy.hold(session.target, session.meta["grants"], sid=sid)   # before anything is recorded
    held = hands_ops.regrant(session)
    ep = _recorded_endpoint(settings["endpoint"], headers, session.meta.get("owner"))
    cancel = cancel if isinstance(cancel, Cancel) else Cancel(cancel)
    with T.writer(session.dir, "resume"), _hands(session, held, None, approver, cancel) as \
            (hands, specs, started):
        _check_rebuild(session)
        record = T.Transcript(session.dir, on_event)
        if hands:
            hands.record = record
        conv = record.conversation
        offered = _toolbox(session, record, None).specs + specs
        if offered != conv.tools:     # the servers (or this version) offer other tools today
            record.record("tools", tools=offered)
        if started:
            record.record("connectors", **started)
        events = T.read(session.dir)
        for call in T.unanswered(conv.messages):
            since = max((i for i, e in enumerate(events) if e.get("type") == "tool_call"
                         and e.get("call") == call["id"]), default=len(events))
            told = T.connector_fate(events[since:], call, "The previous run stopped before this "
                                    "call returned.") or \
                "Not run: the previous run stopped before this call returned."
            record.record("tool_result", turn=conv.turn, call=call["id"], tool=call["name"],
                          result=T.result(call, told), exit_code=None, layer=None,
                          paths=None, truncated=False, timed_out=False, cancelled=False, ms=0,
                          not_run=True)
        text = (note or "").strip() or (CONTINUE if conv.messages and
                                        conv.messages[-1].get("role") == "assistant" else None)
        acted = T.untold_external(events)
        if acted:
            said = "; ".join(f"{a.get('server')}:{a.get('tool')} (fingerprint {a.get('fingerprint')})"
                             for a in acted)
            text = (f"[OVERLORD: the rewind undid the files' changes, not these connector calls, "
                    f"which had already acted outside the sandbox: {said}. Check before you "
                    f"repeat any of them.]" + (f"\n\n{text}" if text else ""))
        record.record("resume", note=note, message={"role": "user", "content": text} if text else None)
        turns = max_turns or settings.get("max_turns")
        return _drive(session, ep, record, turns, settings.get("context_window"), on_delta, cancel,
                      hands)


def _check_rebuild(session):
    """The replayed transcript must give the last recorded request exactly (its digest)."""
    events = T.read(session.dir)
    last = max((i for i, e in enumerate(events) if e.get("type") == "request"), default=None)
    if last is None:
        return
    conv = T.replay(events[:last])
    if conv.digest() != events[last].get("sha256"):
        raise OverlordError(f"the transcript of session {session.sid} does not rebuild its last "
                            "request; the record is damaged")


def _drive(session, ep, record, max_turns, context_window, on_delta, cancel, hands=None):
    sid = session.sid

    toolbox = _toolbox(session, record, cancel)
    meter = cost.Meter(sid, session.target, session.meta.get("owner"))
    loop = Loop(providers.get(ep.provider), ep, toolbox, record, cancel, max_turns=max_turns,
                context_window=context_window, on_delta=on_delta,
                limit_crossed=lambda: bool(store.load_meta(sid).get("limit")),
                touched=lambda layer: _touched(session, layer), connectors=hands, meter=meter)
    with cancel.signals():
        done = loop.run()
    after = get_session(sid)
    plan = after.plan()
    if after.meta.get("state") in store.OPEN_STATES and plan:
        audit.append("session.needs_review", sid=sid, target=after.target, by="agent",
                     changes=len(plan), reason=done.reason)
    return AgentResult(sid, done.reason, done.turns, done.usage, plan, done.message,
                       done.cost, done.budget)


def session_cost(sid):
    """The session's running cost total (trust/cost.session_total: calls, tokens, usd,
    unpriced models ...), zeros when nothing was charged to it."""
    get_session(sid)                 # an unknown session is NotFound, not zeros
    return cost.session_total(sid)


def _toolbox(session, record, cancel):
    """The agent's hands in the session: the six tools, remember and skill, the denial check."""
    sid = session.sid

    def run_one(argv, data, cause, timeout, cap):
        return exec_capture(sid, argv, input=data, cause=cause, timeout=timeout, cap=cap,
                            wait=True, cancel=cancel.event if cancel else None)
    extras = memory.tools(session, record) + \
        skills.tools(session, record, skills.from_record(session.meta.get("skills")))
    return tools.Toolbox(run_one, session.target,
                         os.path.relpath(session.target, command_cwd(session.target)),
                         timeout=session.meta["grants"].get("timeout"), extras=extras,
                         explain=denials.explainer(session))


def _touched(session, layer):
    return sorted({r["path"] for r in store.read_jsonl(session.path("provenance.jsonl"))
                   if r.get("layer") == layer})


def _check_owner(owner):
    """None (the CLI), or an account name (ops.home.valid_user); anything else is refused."""
    if owner is not None and not valid_user(owner):
        raise UsageError(f"not an account name: {owner!r}")


def _check_backend(mod, jail, net):
    if mod.NAME == "kernel":
        return
    if jail:
        ok, why = backends.probe("kernel")     # pinned in a threaded server (web)
        which = f"which is unavailable here ({why})" if not ok else f"not the {mod.NAME} backend"
        raise OverlordError(f"the agent runs jailed, and the jail needs the kernel backend, {which}; "
                            "pass --no-jail to run it in the transaction without the jail")
    if net in ("none", "proxy"):
        raise OverlordError(f"--net {net} needs the kernel backend; on the {mod.NAME} backend pass "
                            "--net host as well")


def net_grants(grants, net_allow=None, hold_writes=None):
    """grants with the recording proxy's two keys added as asked: None (or an empty list, or
    hold_writes False) is unasked and adds nothing."""
    out = dict(grants)
    if net_allow is not None and (not isinstance(net_allow, (list, tuple)) or net_allow):
        out["net_allow"] = list(net_allow) if isinstance(net_allow, tuple) else net_allow
    if hold_writes is not None and hold_writes is not False:
        out["hold_writes"] = hold_writes
    return out


def _operator():
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    return f"{name} (uid {uid}) on {socket.gethostname()}"


def _oneline(text, n=60):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


# -- records, keys, models ----------------------------------------------------------------------

def transcript(sid):
    """The session's transcript events, oldest first."""
    session = get_session(sid)
    if not T.exists(session.dir):
        raise NotFound(f"session {sid} has no transcript (it was not an agent session)")
    return T.read(session.dir)


def keys_set(provider, key, owner=None):
    """Store (or, key None/"", remove) a provider key: the machine's, or an account's own."""
    key_store.set(provider, key, owner)


def keys_list(owner=None):
    """{provider: "own" | "env" | "store" | "vault" | None}: where the key owner's sessions
    use comes from ("own" only for an owner; "vault": no key in any file or the environment,
    and a resolver is configured, so secret://providers/<provider> is asked at use), never
    the key (and the resolver is not run to say so)."""
    return key_store.listing(owner)


def models(provider=None, base_url=None, headers=None, api=None, azure_api_version=None,
           script=None, owner=None):
    """What the endpoint serves right now: [{"id", "name"}] (with owner's key, when one)."""
    ep = endpoint(provider, None, base_url, headers,
                  {"api": api, "azure_api_version": azure_api_version}, script, owner=owner)
    try:
        return providers.get(ep.provider).list_models(ep)
    except ProviderError as exc:
        raise OverlordError(str(exc)) from None
