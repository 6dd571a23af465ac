"""Scripted: replays a JSON file of model turns (Endpoint.script). For tests and demos; no network.

The file is either a list of turns or {"model": "<id>", "turns": [...]}. Turn N answers the call
that already holds N assistant messages (a compacted conversation's handover message counts for
the replies it replaced: its "compacted" key), so a resumed conversation picks up where it stopped.
A turn:

    {
      "text": "what the model says",             # streamed through on_delta in small pieces
      "thinking": "optional thinking text",       # streamed as kind "thinking"
      "tool_calls": [                              # optional
        {"name": "write_file", "input": {"path": "a.txt", "content": "hi"}},
        {"name": "shell", "input": "{\\"command\\": "},  # a string: the raw streamed input,
      ],                                           #   parsed strictly (malformed -> ToolCall.malformed)
      "stop_reason": "end_turn | tool_use | max_tokens | refusal",
                                                   # default: tool_use if tool_calls, else end_turn
      "refusal_category": "cyber",                 # optional, with a refusal
      "usage": {"input_tokens": 10, "output_tokens": 5},   # optional
      "error": "message"                           # optional: the call fails with this ProviderError
    }

A call id is "call_<turn>_<index>" unless the tool call gives its own "id".

Stop reasons: the turn's own stop_reason is already normalized.

    | script stop_reason | normalized |
    |--------------------|------------|
    | end_turn           | end_turn   |
    | tool_use           | tool_use   |
    | max_tokens         | max_tokens |
    | refusal            | refusal    |
"""
import json
import os
import re

from overlord.agent.providers import common
from overlord.agent.providers.base import STOP_REASONS, ProviderError, Reply, ToolCall


def load(path):
    if not path:
        raise ProviderError("scripted: no script given (pass --script FILE)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ProviderError(f"scripted: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise ProviderError(f"scripted: {path} is not JSON: {e}") from None
    model, turns = ("scripted", data) if isinstance(data, list) else (
        data.get("model") or "scripted", data.get("turns"))
    if not isinstance(turns, list):
        raise ProviderError(f"scripted: {path} holds no list of turns")
    return model, turns


def _pieces(text):
    return re.findall(r"\S+\s*|\s+", text or "")


def complete(endpoint, system, messages, tools, on_delta=None, on_headers=None, cancel=None):
    check = cancel.check if cancel is not None else (lambda: None)
    check()
    model, turns = load(endpoint.script)
    # replies so far: assistant messages, plus those a compaction's handover stands for
    n = sum(1 if m.get("role") == "assistant" else m.get("compacted", 0) for m in messages)
    if n >= len(turns):
        raise ProviderError(f"scripted: the script has no turn {n + 1} ({len(turns)} turns)")
    turn = turns[n]
    if turn.get("error"):
        raise ProviderError(f"scripted: {turn['error']}")
    emit = on_delta or (lambda kind, text: None)
    for kind in ("thinking", "text"):
        for piece in _pieces(turn.get(kind)):
            check()
            emit(kind, piece)
    calls = []
    for i, c in enumerate(turn.get("tool_calls") or []):
        raw = c.get("input", {})
        value, why = common.tool_input(raw) if isinstance(raw, str) else (raw, None)
        if not isinstance(value, dict):
            value, why = {}, f"tool input is not a JSON object: {common.snippet(json.dumps(raw))}"
        calls.append(ToolCall(c.get("id") or f"call_{n}_{i}", c["name"], value, why))
    check()
    stop = turn.get("stop_reason") or ("tool_use" if calls else "end_turn")
    if stop not in STOP_REASONS:
        raise ProviderError(f"scripted: turn {n + 1} has an unknown stop_reason {stop!r}")
    u = turn.get("usage") or {}
    return Reply(text=turn.get("text") or "", tool_calls=calls, stop_reason=stop,
                 usage=common.usage(u.get("input_tokens"), u.get("output_tokens"),
                                    u.get("cache_read_tokens"), u.get("cache_write_tokens")),
                 model=model, raw_stop=stop, refusal_category=turn.get("refusal_category"))


def list_models(endpoint, cancel=None):
    model = load(endpoint.script)[0] if endpoint.script and os.path.exists(endpoint.script) else "scripted"
    return [{"id": model, "name": model}]
