"""The Chat Completions wire (POST .../chat/completions), shared by openai --api chat, azure and
openai-compatible servers (Ollama, vLLM, LiteLLM, gateways).

Streamed tool calls arrive as deltas keyed by `index`: the first carries id and name, the rest
carry fragments of the JSON arguments. Usage comes in a last chunk (stream_options.include_usage).
A server that sends no call id gets a deterministic one, unique across the conversation.

Stop reasons:

    | finish_reason                    | normalized                               |
    |----------------------------------|------------------------------------------|
    | stop                             | end_turn (tool_use if tool calls came:   |
    |                                  |  some servers say stop for tool calls)   |
    | tool_calls, function_call        | tool_use                                 |
    | length                           | max_tokens                               |
    | content_filter                   | refusal                                  |
    | a `refusal` message              | refusal                                  |
    | anything else                    | end_turn                                 |

Knobs, each sent only when set: --max-tokens (max_completion_tokens for OpenAI and Azure, max_tokens
for compatible servers), --temperature, --top-p, --stop, --effort -> reasoning_effort (max is sent
as xhigh), --thinking off -> reasoning_effort "none" (unless --effort is given). --thinking
summarized has no Chat Completions form; reasoning text a server streams (reasoning_content or
reasoning deltas) is still shown as thinking.
"""
import json

from overlord.agent.providers import common, http
from overlord.agent.providers.base import ProviderError, Reply, ToolCall

EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}
STOPS = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use",
         "length": "max_tokens", "content_filter": "refusal"}


def _messages(system, messages):
    out = [{"role": "system", "content": system}] if system else []
    for m in messages:
        role = m.get("role")
        if role == "user":
            out.append({"role": "user", "content": m.get("content") or ""})
        elif role == "assistant":
            calls = [{"id": c["id"], "type": "function",
                      "function": {"name": c["name"], "arguments": json.dumps(c.get("input") or {})}}
                     for c in m.get("tool_calls") or []]
            msg = {"role": "assistant", "content": m.get("text") or (None if calls else "")}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            out += [{"role": "tool", "tool_call_id": r["call_id"], "content": common.result_text(r)}
                    for r in m.get("results") or []]
        else:
            raise ProviderError(f"chat: unknown message role {role!r}")
    return out


def request_body(wire, endpoint, system, messages, tools):
    body = {"model": wire.model(endpoint), "messages": _messages(system, messages)}
    if tools:
        body["tools"] = []
        for t in tools:
            fn = {"name": t["name"], "description": t.get("description", ""),
                  "parameters": t["input_schema"]}
            if wire.strict and common.strict_ok(t["input_schema"]):
                fn["strict"] = True
            body["tools"].append({"type": "function", "function": fn})
    body.update(common.knobs(temperature=endpoint.temperature, top_p=endpoint.top_p,
                             stop=endpoint.stop or None))
    if endpoint.max_tokens is not None:
        body[wire.max_tokens_field] = endpoint.max_tokens
    if endpoint.effort:
        body["reasoning_effort"] = EFFORTS.get(endpoint.effort, endpoint.effort)
    elif endpoint.thinking == "off":
        body["reasoning_effort"] = "none"
    if endpoint.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _inband(name, error):
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or "error"
        return ProviderError(f"{name}: {code}: {error.get('message') or ''}",
                             retryable=code in ("server_error", "rate_limit_exceeded", 500, 503))
    return ProviderError(f"{name}: {error}")


def read_stream(name, messages):
    def read(resp, emit):
        acc = {"text": [], "refusal": [], "calls": {}, "finish": None, "usage": None, "model": None}
        done = False
        for ev in resp.events():
            if ev.data.strip() == "[DONE]":
                done = True
                break
            data = common.loads(ev.data)
            if data.get("error"):
                raise _inband(name, data["error"])
            acc["model"] = data.get("model") or acc["model"]
            acc["usage"] = data.get("usage") or acc["usage"]
            for choice in data.get("choices") or []:
                _delta(acc, choice, emit)
        if not done and acc["finish"] is None:
            raise http.Dropped("the stream ended before a finish_reason")
        return _reply(name, messages, acc)
    return read


def _delta(acc, choice, emit):
    delta = choice.get("delta") or {}
    if delta.get("content"):
        acc["text"].append(delta["content"])
        emit("text", delta["content"])
    if delta.get("refusal"):
        acc["refusal"].append(delta["refusal"])
        emit("text", delta["refusal"])
    thought = delta.get("reasoning_content") or delta.get("reasoning")
    emit("thinking", thought if isinstance(thought, str) else "")
    for n, tc in enumerate(delta.get("tool_calls") or []):
        slot = acc["calls"].setdefault(tc.get("index", n), {"id": None, "name": "", "args": []})
        slot["id"] = slot["id"] or tc.get("id")
        fn = tc.get("function") or {}
        slot["name"] = slot["name"] or fn.get("name") or ""
        if fn.get("arguments"):
            slot["args"].append(fn["arguments"])
    if choice.get("finish_reason"):
        acc["finish"] = choice["finish_reason"]


def read_json(name, messages):
    def read(resp, emit):
        data = resp.json()
        if data.get("error"):
            raise _inband(name, data["error"])
        choice = (data.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        thought = msg.get("reasoning_content") or msg.get("reasoning")
        emit("thinking", thought if isinstance(thought, str) else "")
        emit("text", msg.get("content") or msg.get("refusal") or "")
        acc = {"text": [msg.get("content") or ""], "refusal": [msg.get("refusal") or ""],
               "finish": choice.get("finish_reason"), "usage": data.get("usage"),
               "model": data.get("model"), "calls": {}}
        for i, tc in enumerate(msg.get("tool_calls") or []):
            fn = tc.get("function") or {}
            acc["calls"][i] = {"id": tc.get("id"), "name": fn.get("name") or "",
                               "args": [fn.get("arguments") or ""]}
        return _reply(name, messages, acc)
    return read


def _reply(name, messages, acc):
    slots = [acc["calls"][i] for i in sorted(acc["calls"])]
    fresh = iter(common.call_ids(messages, "call", len(slots)))
    calls = []
    for slot in slots:
        value, why = common.tool_input("".join(slot["args"]))
        calls.append(ToolCall(slot["id"] or next(fresh), slot["name"], value, why))
    finish, refusal = acc["finish"], "".join(acc["refusal"])
    if refusal:
        stop = "refusal"
    elif finish == "stop" and calls:
        stop = "tool_use"
    else:
        stop = STOPS.get(finish, "end_turn")
    u = acc["usage"] or {}
    return Reply(
        text="".join(acc["text"]) + refusal, tool_calls=calls, stop_reason=stop,
        usage=common.usage(u.get("prompt_tokens"), u.get("completion_tokens"),
                           (u.get("prompt_tokens_details") or {}).get("cached_tokens"), None,
                           (u.get("completion_tokens_details") or {}).get("reasoning_tokens")),
        model=acc["model"], raw_stop=finish or ("refusal" if refusal else None),
        refusal_category=("content_filter" if finish == "content_filter" else None))


def complete(wire, endpoint, system, messages, tools, on_delta=None, on_headers=None,
             cancel=None):
    body = request_body(wire, endpoint, system, messages, tools)
    read = (read_stream if endpoint.stream else read_json)(wire.name, messages)
    return http.call(wire.name, "POST", wire.url(endpoint, "chat"), wire.headers(endpoint), body,
                     read, on_delta=on_delta, on_headers=on_headers,
                     secrets=common.secrets(endpoint), cancel=cancel)
