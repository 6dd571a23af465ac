"""The agent's record: `transcript.jsonl` in the session directory, one event a line.

This module is the one reader and writer of that file. Every event has `type` and `at`; the
ones that change what the model sees carry the exact neutral message (or tool result), so the
conversation is rebuilt by replaying the events through `apply()` -- the same function the
running loop uses, so a resume sees exactly what the model saw:

    system       {prompt, tools, memory, skills}  the system prompt and tool list, as sent;
                                                  memory {text, sha256, sources} and skills
                                                  {offered, warnings}: what it was built from
    task         {text, message, audit}           the operator's task (a user message)
    request      {turn, messages, sha256}         a model call: how many messages it carried
                                                  and a digest of (system, messages, tools)
    assistant    {turn, message, stop_reason, raw_stop, usage, model, thinking, refusal_category}
    tool_call    {turn, call, tool, input, summary}
    tool_result  {turn, call, tool, result, exit_code, layer, paths, truncated, timed_out, ms}
    error        {turn, message}
    compaction   {message, kept, dropped, tokens, window, note, usage}
    resume       {note, message}                  message is None when there was no note to say
    rewind       {to, dropped_events, archive, results, external}   external: the connector
                                                  calls the cut dropped that had been sent
    fork         {from, savepoint}
    done         {reason, turns, usage, message}
    tools        {tools}                          the tool list changed (a resume whose connectors
                                                  now offer other tools): the next requests carry it
    connectors   {servers, errors}                the granted connectors: each server's revision and
                                                  tools (offered name, read-only claim, withheld)
    approval_requested {turn, call, server, tool, offered, input, fingerprint, readonly_claim}
    approval     {turn, call, fingerprint, allow, by, note, mode}   every gate decision, and who made it
    connector_error {turn, call, server, message}  a server that failed a call (crashed, hung, ...)

A connector call's tool_call and tool_result also carry `connector`: {server, tool, fingerprint}
(+ sha256 and size of the result).

A rewind to @N cuts the file where the world was @N (see cut_point) and archives the tail; a
fork copies the cut. One writer at a time: a running agent holds `agent.lock`, and a rewind
is refused while it does.
"""
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time

from overlord.agent.connectors import names
from overlord.errors import OverlordError
from overlord.txn import store

NAME = "transcript.jsonl"
LOCK = "agent.lock"
# events whose `message` joins the conversation
SPOKEN = ("task", "assistant", "resume")


def path(session_dir):
    return os.path.join(session_dir, NAME)


def exists(session_dir):
    return os.path.exists(path(session_dir))


def read(session_dir):
    return store.read_jsonl(path(session_dir))


class Transcript:
    """Appends events to one session's transcript; `conversation` follows along."""

    def __init__(self, session_dir, on_event=None):
        self.dir, self.on_event = session_dir, on_event
        self.conversation = replay(read(session_dir))

    def record(self, kind, /, **fields):
        event = {"type": kind, "at": round(time.time(), 3), **fields}
        line = json.dumps(event, sort_keys=True)
        store.append_jsonl(path(self.dir), [event])
        # what is applied is what a later replay will read back: the JSON, not our objects
        event = json.loads(line)
        apply(self.conversation, event)
        if self.on_event:
            self.on_event(event)
        return event


# -- the conversation as the model sees it ----------------------------------------------------

class Conversation:
    """What replaying a transcript gives: the next request's parts and where the run stands."""

    def __init__(self):
        self.system, self.tools, self.messages = "", [], []
        self.turn = 0                  # the last model call's turn number
        self.context_tokens = 0        # what that call filled of the context window
        self.task = None

    def digest(self):
        return request_digest(self.system, self.messages, self.tools)


def request_digest(system, messages, tools):
    data = json.dumps({"system": system, "messages": messages, "tools": tools}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def replay(events):
    conv = Conversation()
    for event in events:
        apply(conv, event)
    return conv


def apply(conv, event):
    """Fold one event into the conversation."""
    kind = event.get("type")
    if kind == "system":
        conv.system, conv.tools = event["prompt"], event["tools"]
    elif kind == "tools":
        conv.tools = event["tools"]
    elif kind in SPOKEN and event.get("message") is not None:
        conv.messages.append(event["message"])
        if kind == "task":
            conv.task = event.get("text")
    if kind == "tool_result":
        add_result(conv.messages, event["result"])
    elif kind == "rewind":
        for result in event.get("results") or []:
            add_result(conv.messages, result)
    elif kind == "compaction":
        kept = conv.messages[len(conv.messages) - event["kept"]:] if event["kept"] else []
        conv.messages = [event["message"]] + kept
    if kind in ("request", "assistant") and event.get("turn"):
        conv.turn = max(conv.turn, event["turn"])
    if kind == "assistant":
        conv.context_tokens = (event.get("usage") or {}).get("context_tokens") or 0
    elif kind == "compaction":
        conv.context_tokens = 0


def add_result(messages, result):
    """Tool results of one turn share one tool message, right after the assistant's calls."""
    if messages and messages[-1].get("role") == "tool":
        messages[-1]["results"].append(result)
    else:
        messages.append({"role": "tool", "results": [result]})


def unanswered(messages):
    """The calls of the last assistant message that have no result yet."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            answered = set()
            for m in messages[i + 1:]:
                answered |= {r["call_id"] for r in m.get("results") or []}
            return [c for c in messages[i].get("tool_calls") or [] if c["id"] not in answered]
    return []


def result(call, content, is_error=True):
    return {"call_id": call["id"], "name": call["name"], "content": content, "is_error": is_error}


# -- one writer at a time ---------------------------------------------------------------------

@contextlib.contextmanager
def writer(session_dir, what):
    """Held by a running agent for its whole run and by a rewind; the second is refused."""
    fd = os.open(os.path.join(session_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                sid = os.path.basename(session_dir)
                raise OverlordError(f"cannot {what} session {sid}: an agent is running in it "
                                    "(stop it with Ctrl-C first)") from None
            raise
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive(session_dir, what):
    """writer() for a session the agent ran in; nothing for any other session."""
    if not exists(session_dir):
        yield
        return
    with writer(session_dir, what):
        yield


# -- cutting at a savepoint (rewind, fork) -----------------------------------------------------

def cut_point(events, to):
    """(index, results) -- keep events[:index] to match a world rewound to savepoint @to.

    The turn that produced the first savepoint above @to is dropped with everything after it.
    When that same turn also sealed a kept savepoint, it cannot go whole: it is cut just before
    the call that wrote above @to, and its later calls get results saying they were undone."""
    first = next((i for i, e in enumerate(events) if e.get("type") == "tool_result"
                  and e.get("layer") is not None and e["layer"] > to), None)
    if first is None:
        return len(events), []
    turn = events[first].get("turn")
    kept_in_turn = any(e.get("type") == "tool_result" and e.get("turn") == turn
                       and e.get("layer") is not None and e["layer"] <= to for e in events[:first])
    if not kept_in_turn:
        start = next(i for i, e in enumerate(events) if e.get("turn") == turn
                     and e.get("type") in ("request", "assistant", "tool_call", "tool_result"))
        return start, []
    start = next(i for i in range(first, -1, -1) if events[i].get("type") == "tool_call"
                 and events[i].get("call") == events[first].get("call"))
    why = (f"Rewound: the operator rewound the session to savepoint @{to}, which undid this "
           "call and everything after it.")
    pending = unanswered(replay(events[:start]).messages)
    return start, [result(call, connector_fate(events[start:], call, f"The operator rewound the "
                                               f"session to savepoint @{to}.") or why)
                   for call in pending]


def connector_fate(events, call, why):
    """What to tell the model of a connector call left without a result (why: what stopped
    it), or None for a call of the built-in tools: whether the gate let it out -- then it may
    have acted in the world, which nothing here undoes -- or not. events: from the call on."""
    if not call["name"].startswith(names.PREFIX):
        return None
    for ev in events:
        if ev.get("type") == "approval" and ev.get("call") == call["id"]:
            if not ev.get("allow"):
                break
            return (f"{why} This connector call had already been sent to its server: it may have "
                    "acted in the world, and neither a rewind nor a rollback undoes that. Check "
                    "before you repeat it.")
    return f"Not run: {why} This connector call was never sent to its server."


def cut_for_rewind(session_dir, to):
    """Cut the transcript at @to; the dropped tail goes to an archive beside it."""
    if not exists(session_dir):
        return None
    events = read(session_dir)
    index, results = cut_point(events, to)
    tail = events[index:]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    archive = f"transcript-rewound-{stamp}-{to}.jsonl"
    _write(os.path.join(session_dir, archive), tail)
    event = {"type": "rewind", "at": round(time.time(), 3), "to": to,
             "dropped_events": len(tail), "archive": archive, "results": results,
             "external": sent_connector_calls(tail)}
    _write(path(session_dir), events[:index] + [event])
    return event


def sent_connector_calls(events):
    """The connector calls among events the gate let out: [{server, tool, fingerprint}]."""
    allowed = {(e.get("call"), e.get("fingerprint")) for e in events
               if e.get("type") == "approval" and e.get("allow")}
    return [dict(e["connector"]) for e in events if e.get("type") == "tool_call"
            and isinstance(e.get("connector"), dict)
            and (e.get("call"), e["connector"].get("fingerprint")) in allowed]


def untold_external(events):
    """Connector calls rewound out of the conversation since the last user turn: the model
    no longer sees them, but they acted in the world (the next user turn says so)."""
    last = max((i for i, e in enumerate(events) if e.get("type") in SPOKEN and e.get("message")
                and e["message"].get("role") == "user"), default=-1)
    return [x for e in events[last + 1:] if e.get("type") == "rewind" for x in e.get("external") or []]


def copy_for_fork(session_dir, new_dir, at, sid):
    """The new session's transcript: the source's, cut at @at, and a fork event."""
    if not exists(session_dir):
        return
    events = read(session_dir)
    index, results = cut_point(events, at)
    kept = events[:index]
    if results:
        kept.append({"type": "rewind", "at": round(time.time(), 3), "to": at,
                     "dropped_events": 0, "archive": None, "results": results})
    kept.append({"type": "fork", "at": round(time.time(), 3), "from": sid, "savepoint": at})
    _write(path(new_dir), kept)


def _write(target, events):
    tmp = f"{target}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in events))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.rename(tmp, target)
