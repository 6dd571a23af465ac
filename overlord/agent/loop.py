"""The turn loop: call the model, stream its reply, run its tool calls, until it is done.

One turn is one model call. Its reply ends in a normalized stop reason (providers/base.py):
  end_turn     the model is done               -> done end_turn
  tool_use     run the calls, then call again
  max_tokens   cut off: its tool calls never run -> done max_tokens
  refusal      declined: its tool calls never run -> done refusal
and the run also ends with max_turns (this run's budget of calls), cancelled (Ctrl-C), limit
(the session crossed its disk grant), budget (a cost line -- session_tokens, session_usd,
day_usd, month_usd -- was reached: trust/cost.py) or error (a provider call that failed for
good, or a call the cost ledger could not record).

Cost: with a meter (trust/cost.Meter), every provider call -- each turn, each compaction
note -- is checked against the budget lines BEFORE it is made and charged to the ledger
after it returns. A stop ends the run with done reason "budget", a `budget` transcript event
{key, limit, spent, source, kind, message} and the audit act `budget.stop`; nothing is
called, and the work so far stays in the transaction. The `done` event carries `cost`, the
session's running total (meter.total()).

Every step is a transcript event, written before the next step starts; the conversation the
model sees is the transcript replayed (transcript.apply), so a resume continues exactly here.
Tool calls that will never run still get a result (an error saying why), so the history stays
one a provider accepts.
"""
import dataclasses
import time

from overlord.agent import compaction, ratelimit, tools
from overlord.agent.cancel import Cancelled
from overlord.agent.providers.base import ProviderError
from overlord.agent.transcript import request_digest, result, unanswered
from overlord.errors import OverlordError
from overlord.trust import audit

DONE_REASONS = ("end_turn", "max_turns", "max_tokens", "refusal", "cancelled", "limit", "budget",
                "error")
DEFAULT_MAX_TURNS = 50
NOT_RUN = {
    "max_tokens": "Not run: the reply was cut off at max_tokens, so its tool calls were not executed.",
    "refusal": "Not run: the reply was declined by a safety classifier, so its tool calls were not executed.",
    "cancelled": "Not run: the operator cancelled the run (Ctrl-C) before this call.",
    "limit": "Not run: the session crossed its disk grant and can run nothing more.",
    "budget": "Not run: the run stopped at a cost budget line before this call.",
}


def check_budget(meter, kind, emit):
    """Before a provider call: None (go on), or the budget stop as a dict {key, limit, spent,
    source, kind, message} -- recorded with emit("budget", **stop) (the transcript's or the
    review record's) and audited as `budget.stop`. No meter: never a stop."""
    if meter is None:
        return None
    stop = meter.check(kind)
    if stop is None:
        return None
    said = {"key": stop.key, "limit": stop.limit, "spent": stop.spent, "source": stop.source,
            "kind": kind, "message": stop.message}
    emit("budget", **said)
    audit.append("budget.stop", sid=meter.sid, target=meter.target, key=stop.key,
                 limit=stop.limit, spent=stop.spent, source=stop.source, kind=kind)
    return said


def charge(meter, kind, endpoint, reply):
    """After a provider call: its ledger line (None without a meter). The model is the one
    the reply names, else the endpoint's, priced no lower than the one asked for; OverlordError/OSError when the ledger cannot be
    written (the caller stops: a call it cannot count is one no budget would see)."""
    if meter is None:
        return None
    return meter.charge(kind, endpoint.provider, reply.model or endpoint.model, reply.usage or {},
                        requested=endpoint.model)   # the reply's model id never makes it cheaper


@dataclasses.dataclass
class Done:
    reason: str
    turns: int
    usage: dict
    message: str = None
    cost: dict = None         # the session's running total (meter.total()), None without a meter
    budget: dict = None       # the budget stop (check_budget's dict) when reason is "budget"


class Loop:
    """provider: a module with complete(); toolbox: tools.Toolbox; record: transcript.Transcript;
    cancel: cancel.Cancel; limit_crossed(): whether the session crossed a grant;
    touched(layer): the paths a savepoint changed; meter: trust/cost.Meter (None: no budget,
    no ledger)."""

    def __init__(self, provider, endpoint, toolbox, record, cancel, max_turns=None,
                 context_window=None, on_delta=None, limit_crossed=lambda: False,
                 touched=lambda layer: [], connectors=None, meter=None):
        self.provider, self.endpoint, self.toolbox, self.record = provider, endpoint, toolbox, record
        self.connectors = connectors      # ops.connectors.Hands: the tools outside the sandbox
        self.cancel, self.max_turns = cancel, max_turns or DEFAULT_MAX_TURNS
        self.window = context_window or compaction.DEFAULT_WINDOW
        self.on_delta, self.limit_crossed, self.touched = on_delta, limit_crossed, touched
        self.usage, self.turns = {}, 0
        self.meter, self.budget = meter, None

    @property
    def conv(self):
        return self.record.conversation

    def run(self):
        try:
            reason, message = self._turns()
        except Cancelled:
            reason, message = "cancelled", None
        self._answer_all(NOT_RUN.get(reason, "Not run: the run stopped before this call."))
        cost = self._total()
        extra = {"budget": self.budget} if self.budget else {}
        self.record.record("done", reason=reason, turns=self.turns, usage=self.usage, message=message,
                           cost=cost, **extra)
        return Done(reason, self.turns, self.usage, message, cost, self.budget)

    def _total(self):
        if self.meter is None:
            return None
        try:
            return self.meter.total()
        except (OverlordError, OSError):
            return None

    def _check(self, kind):
        """("budget", message) when the budget stops this call, ("error", message) when the
        lines cannot be read (a damaged cost.json: refused, never guessed), else None."""
        try:
            stop = check_budget(self.meter, kind, self.record.record)
        except (OverlordError, OSError) as exc:
            message = f"the cost budget could not be checked before the {kind} call: {exc}"
            self.record.record("error", turn=self.conv.turn, message=message)
            return "error", message
        if stop is None:
            return None
        self.budget = stop
        return "budget", stop["message"]

    def _charge(self, kind, reply):
        """("error", message) when the ledger could not record the call, else None."""
        try:
            charge(self.meter, kind, self.endpoint, reply)
        except (OverlordError, OSError) as exc:
            message = f"the cost ledger could not record the {kind} call: {exc}"
            self.record.record("error", turn=self.conv.turn, message=message)
            return "error", message
        return None

    def _turns(self):
        while True:
            if self.cancel.is_set():
                return "cancelled", None
            if self.turns >= self.max_turns:
                return "max_turns", f"stopped after {self.turns} turns (--max-turns)"
            if compaction.due(self.conv.context_tokens, self.window):
                stopped = self._compact()
                if stopped:
                    return stopped
            stopped = self._check("turn")
            if stopped:
                return stopped
            try:
                reply = self._call()
            except ProviderError as exc:
                self.record.record("error", turn=self.conv.turn, message=str(exc))
                return "error", str(exc)
            stopped = self._charge("turn", reply)
            if stopped:
                return stopped
            if reply.stop_reason in ("max_tokens", "refusal"):
                self._answer_all(NOT_RUN[reply.stop_reason])
                return reply.stop_reason, None
            if not reply.tool_calls:
                return "end_turn", None
            stopped = self._run_calls(reply.tool_calls)
            if stopped:
                return stopped

    def _call(self):
        """One model call: record the request, stream the reply, record the reply."""
        turn = self.conv.turn + 1
        conv = self.conv
        self.record.record("request", turn=turn, messages=len(conv.messages),
                           sha256=request_digest(conv.system, conv.messages, conv.tools))
        thinking = []

        def on_delta(kind, text):
            if kind == "thinking":
                thinking.append(text)
            elif kind == "restart":
                thinking.clear()
            if self.on_delta:
                self.on_delta(kind, text)
        self.turns += 1
        with self.cancel.interruptible():
            reply = self.provider.complete(self.endpoint, conv.system, conv.messages, conv.tools,
                                           on_delta=on_delta, on_headers=self._headers,
                                           cancel=self.cancel)
        self._count(reply.usage)
        calls = [{"id": c.id, "name": c.name, "input": c.input} for c in reply.tool_calls]
        message = {"role": "assistant", "text": reply.text, "tool_calls": calls, "state": reply.state}
        self.record.record("assistant", turn=turn, message=message, stop_reason=reply.stop_reason,
                           raw_stop=reply.raw_stop, usage=reply.usage, model=reply.model,
                           refusal_category=reply.refusal_category, thinking="".join(thinking) or None,
                           malformed={c.id: c.malformed for c in reply.tool_calls if c.malformed} or None)
        return reply

    def _headers(self, provider, headers):
        ratelimit.record(provider, headers)

    def _count(self, usage):
        for key, value in (usage or {}).items():
            if isinstance(value, (int, float)) and key != "context_tokens":
                self.usage[key] = self.usage.get(key, 0) + value

    def _run_calls(self, calls):
        """Run a reply's calls in order; (done reason, message) if the run must stop, else None."""
        turn = self.conv.turn
        for call in calls:
            if self.cancel.is_set():
                return "cancelled", None
            if self.limit_crossed():
                return "limit", "the session crossed its disk grant"
            name, args = call.name, call.input
            hands = self.connectors if self.connectors and self.connectors.owns(name) else None
            problem = call.malformed and f"malformed tool input, not run: {call.malformed}"
            if hands:
                problem = problem or hands.check_input(name, args)
                summary, extra = hands.summary(name, args), {"connector": hands.describe(name, args)}
            else:
                problem = problem or (self.connectors and self.connectors.unknown(name)) or \
                    self.toolbox.check_input(name, args)
                summary, extra = self.toolbox.summary(name, args), {}
            self.record.record("tool_call", turn=turn, call=call.id, tool=name, input=args,
                               summary=summary, refused=problem, **extra)
            if problem:
                self._result(turn, call, tools.Outcome(problem, is_error=True), 0)
                continue
            started = time.monotonic()
            if hands:      # outside the sandbox: gated, audited, never raising for the server
                self._result(turn, call, tools.unforged(hands.call(name, args, turn, call.id)),
                             time.monotonic() - started)
                if self.cancel.is_set():
                    return "cancelled", None
                continue
            cause = {"kind": "agent", "turn": turn, "tool": name, "call": call.id, "summary": summary}
            try:
                outcome = self.toolbox.call(name, args, cause)
            except OverlordError as exc:       # the session itself refused (limit, state, ...)
                refused = getattr(self.toolbox, "refused", None)     # with the denial, if any
                self._result(turn, call, refused(name, args, exc) if refused else
                             tools.Outcome(f"Not run: {exc}", is_error=True), 0)
                self.record.record("error", turn=turn, message=str(exc))
                return ("limit" if self.limit_crossed() else "error"), str(exc)
            if self.cancel.is_set():
                outcome.is_error, outcome.cancelled = True, True
                outcome.content = ("Cancelled: the operator stopped the run (Ctrl-C) while this "
                                   "call ran; its process tree was killed.\n" + outcome.content)
            self._result(turn, call, outcome, time.monotonic() - started)
        if self.cancel.is_set():
            return "cancelled", None
        if self.limit_crossed():
            return "limit", "the session crossed its disk grant"
        return None

    def _result(self, turn, call, outcome, seconds):
        res = result({"id": call.id, "name": call.name}, outcome.content, outcome.is_error)
        self.record.record("tool_result", turn=turn, call=call.id, tool=call.name, result=res,
                           exit_code=outcome.exit_code, layer=outcome.layer,
                           paths=self.touched(outcome.layer) if outcome.layer is not None else [],
                           truncated=outcome.truncated,
                           timed_out=outcome.timed_out, cancelled=outcome.cancelled,
                           ms=int(seconds * 1000),
                           **({"connector": outcome.connector} if outcome.connector else {}),
                           **({"denial": outcome.denial} if outcome.denial else {}))

    def _answer_all(self, why):
        """Give every call still without a result one saying it never ran."""
        for call in unanswered(self.conv.messages):
            self.record.record("tool_result", turn=self.conv.turn, call=call["id"], tool=call["name"],
                               result=result(call, why), exit_code=None, layer=None, paths=None,
                               truncated=False, timed_out=False, cancelled=False, ms=0, not_run=True)

    def _compact(self):
        """Write the handover note and cut; (done reason, message) when the run must stop
        instead (the budget refuses the note's call), else None."""
        conv = self.conv
        parts = compaction.split(conv.messages)
        if parts is None:
            return None
        stopped = self._check("compaction")
        if stopped:
            return stopped
        dropped, kept = parts
        ask = conv.messages + [{"role": "user", "content": compaction.REQUEST}]
        tokens = conv.context_tokens
        with self.cancel.interruptible():
            try:
                reply = self.provider.complete(self.endpoint, conv.system, ask, conv.tools,
                                               on_headers=self._headers, cancel=self.cancel)
                note, usage = reply.text, reply.usage
            except ProviderError as exc:
                note, usage, reply = "", {"error": str(exc)}, None
        self._count(usage)
        note = note.strip() or compaction.fallback_note(dropped)
        self.record.record("compaction", message=compaction.handover_message(conv.task, note, dropped),
                           kept=len(kept), dropped=len(dropped), tokens=tokens, window=self.window,
                           note=note, usage=usage)
        return self._charge("compaction", reply) if reply is not None else None
