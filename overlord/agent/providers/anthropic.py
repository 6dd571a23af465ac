"""Anthropic: the native Messages API (POST {base}/v1/messages, GET {base}/v1/models).

Base URL https://api.anthropic.com; headers x-api-key and anthropic-version: 2023-06-01.

Stop reasons:

    | Anthropic stop_reason              | normalized |
    |------------------------------------|------------|
    | end_turn, stop_sequence, pause_turn| end_turn   |
    | tool_use                           | tool_use   |
    | max_tokens                         | max_tokens |
    | model_context_window_exceeded      | max_tokens |
    | refusal                            | refusal    |
    | anything else                      | end_turn   |

refusal_category is stop_details.category ("cyber", "bio", ...) when the API gives one.

Knobs, each sent only when set: --effort -> output_config.effort; --thinking summarized ->
thinking {type: adaptive, display: summarized}; --thinking off -> thinking {type: disabled};
--temperature, --top-p, --stop -> temperature, top_p, stop_sequences. max_tokens is the one
exception: the Messages API requires it, so an unset one is sent as DEFAULT_MAX_TOKENS.

Thinking blocks (with their signatures), redacted_thinking blocks and every other block the API
returned are kept in Reply.state and replayed verbatim as the assistant turn, as the API requires
across tool turns.

Server-side refusal fallbacks (Anthropic docs, "Refusals and fallback"): `fallbacks: "default"`
with the beta header `anthropic-beta: server-side-fallback-2026-07-01` asks the API to re-run a
classifier-declined request on the fallback model Anthropic recommends for the refusal category.
Sent by default only when the base URL is the native endpoint (a gateway may not know the field);
Endpoint.fallbacks=False (--no-fallbacks) turns it off. A model that rejects the field with a 400
naming it is asked once more without. A switch is marked in the stream by a content block of type
"fallback" ({from: {model}, to: {model}}); Reply.model then names the model that answered, and the
hops are kept in Reply.state["fallbacks"]. Nothing already streamed is discarded.
"""
import copy
import urllib.parse

from overlord.agent.providers import common, http
from overlord.agent.providers.base import ProviderError, Reply, ToolCall

BASE = "https://api.anthropic.com"
VERSION = "2023-06-01"
FALLBACK_BETA = "server-side-fallback-2026-07-01"
DEFAULT_MAX_TOKENS = 32000           # streaming
DEFAULT_MAX_TOKENS_NO_STREAM = 16000  # the API refuses long non-streamed calls
STOPS = {"end_turn": "end_turn", "stop_sequence": "end_turn", "pause_turn": "end_turn",
         "tool_use": "tool_use", "max_tokens": "max_tokens",
         "model_context_window_exceeded": "max_tokens", "refusal": "refusal"}
RETRYABLE_ERRORS = ("overloaded_error", "api_error", "rate_limit_error", "timeout_error")


def native(base):
    return urllib.parse.urlsplit(base).hostname == urllib.parse.urlsplit(BASE).hostname


def _headers(endpoint, fallbacks):
    own = {"x-api-key": endpoint.api_key, "anthropic-version": VERSION}
    out = common.headers(endpoint, own)
    if fallbacks:
        betas = [b.strip() for b in out.get("anthropic-beta", "").split(",") if b.strip()]
        out["anthropic-beta"] = ",".join(betas + [FALLBACK_BETA])
    return out


def _messages(messages):
    """Neutral messages -> Messages API turns (consecutive same-role turns merged)."""
    out = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            text = m.get("content")
            content = copy.deepcopy(text) if isinstance(text, list) else (
                [{"type": "text", "text": text}] if text else [])
        elif role == "assistant":
            state = common.own_state(m, "anthropic")
            if state:
                content = copy.deepcopy(state["content"])
            else:
                content = [{"type": "text", "text": m["text"]}] if m.get("text") else []
                content += [{"type": "tool_use", "id": c["id"], "name": c["name"],
                             "input": c.get("input") or {}} for c in m.get("tool_calls") or []]
        elif role == "tool":
            content = []
            for r in m.get("results") or []:
                block = {"type": "tool_result", "tool_use_id": r["call_id"],
                         "content": r.get("content") or ""}
                if r.get("is_error"):
                    block["is_error"] = True
                content.append(block)
        else:
            raise ProviderError(f"anthropic: unknown message role {role!r}")
        api_role = "assistant" if role == "assistant" else "user"
        if not content:
            continue
        if out and out[-1]["role"] == api_role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": api_role, "content": content})
    # Cache the conversation prefix: the last block of the last turn is a breakpoint.
    if out and out[-1]["content"] and out[-1]["content"][-1].get("type") in (
            "text", "tool_result", "tool_use"):
        out[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


def request_body(endpoint, system, messages, tools, fallbacks):
    body = {"model": common.need_model(endpoint), "messages": _messages(messages)}
    default = DEFAULT_MAX_TOKENS if endpoint.stream else DEFAULT_MAX_TOKENS_NO_STREAM
    body["max_tokens"] = endpoint.max_tokens or default
    if system:
        body["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    if tools:
        body["tools"] = [{"name": t["name"], "description": t.get("description", ""),
                          "input_schema": t["input_schema"]} for t in tools]
    body.update(common.knobs(temperature=endpoint.temperature, top_p=endpoint.top_p,
                             stop_sequences=endpoint.stop or None))
    if endpoint.thinking == "summarized":
        body["thinking"] = {"type": "adaptive", "display": "summarized"}
    elif endpoint.thinking == "off":
        body["thinking"] = {"type": "disabled"}
    if endpoint.effort:
        body["output_config"] = {"effort": endpoint.effort}
    if endpoint.stream:
        body["stream"] = True
    if fallbacks:
        body["fallbacks"] = "default"
    return body


def _inband(error):
    kind = (error or {}).get("type") or "error"
    msg = (error or {}).get("message") or ""
    return ProviderError(f"anthropic: {kind}: {msg}", retryable=kind in RETRYABLE_ERRORS)


def _finish_tool(block, raw):
    if not raw and block.get("input"):
        return                     # the whole input came with the block's start
    block["input"], why = common.tool_input(raw)
    if why:
        block["_malformed"] = why


def _read_stream(resp, emit):
    msg = {"content": [], "usage": {}}
    blocks, raw_json, done = {}, {}, False
    for ev in resp.events():
        data = common.loads(ev.data)
        kind = data.get("type") or ev.event
        if kind == "message_start":
            start = data.get("message") or {}
            msg["model"] = start.get("model")
            msg["usage"].update(start.get("usage") or {})
        elif kind == "content_block_start":
            block = dict(data.get("content_block") or {})
            blocks[data["index"]] = block
            if block.get("type") == "tool_use":
                raw_json[data["index"]] = []
            elif block.get("type") == "text":
                emit("text", block.get("text", ""))
            elif block.get("type") == "thinking":
                emit("thinking", block.get("thinking", ""))
        elif kind == "content_block_delta":
            block, delta = blocks.get(data.get("index")), data.get("delta") or {}
            if block is None:
                raise http.Dropped("a delta for a block that never started")
            dt = delta.get("type")
            if dt == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
                emit("text", delta.get("text", ""))
            elif dt == "input_json_delta":
                raw_json.setdefault(data["index"], []).append(delta.get("partial_json", ""))
            elif dt == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
                emit("thinking", delta.get("thinking", ""))
            elif dt == "signature_delta":
                block["signature"] = block.get("signature", "") + delta.get("signature", "")
            elif dt == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "content_block_stop":
            index = data.get("index")
            if index in raw_json:
                _finish_tool(blocks[index], "".join(raw_json.pop(index)))
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            msg["stop_reason"] = delta.get("stop_reason")
            msg["stop_details"] = delta.get("stop_details")
            msg["usage"].update(data.get("usage") or {})
        elif kind == "message_stop":
            done = True
            break
        elif kind == "error":
            raise _inband(data.get("error"))
    if not done:
        raise http.Dropped("the stream ended before message_stop")
    for index, parts in raw_json.items():       # a tool input the stream never closed
        _finish_tool(blocks[index], "".join(parts))
    msg["content"] = [blocks[i] for i in sorted(blocks)]
    return _reply(msg)


def _read_json(resp, emit):
    msg = resp.json()
    if msg.get("type") == "error":
        raise _inband(msg.get("error"))
    for block in msg.get("content") or []:
        if block.get("type") == "thinking":
            emit("thinking", block.get("thinking", ""))
    for block in msg.get("content") or []:
        if block.get("type") == "text":
            emit("text", block.get("text", ""))
    return _reply(msg)


def _reply(msg):
    text, calls, content, hops = [], [], [], []
    model = msg.get("model")
    for block in msg.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text", ""))
            if not block.get("text"):
                continue                   # the API refuses empty text blocks on replay
        elif kind == "tool_use":
            why = block.pop("_malformed", None)
            calls.append(ToolCall(block.get("id"), block.get("name"), block.get("input") or {}, why))
        elif kind == "fallback":
            hops.append({"from": (block.get("from") or {}).get("model"),
                         "to": (block.get("to") or {}).get("model")})
            model = hops[-1]["to"] or model
        content.append(block)
    raw = msg.get("stop_reason")
    details = msg.get("stop_details") or {}
    u = msg.get("usage") or {}
    cache_read, cache_write = u.get("cache_read_input_tokens"), u.get("cache_creation_input_tokens")
    state = {"provider": "anthropic", "content": content}
    if hops:
        state["fallbacks"] = hops
    return Reply(
        text="".join(text), tool_calls=calls, stop_reason=STOPS.get(raw, "end_turn"),
        usage=common.usage(u.get("input_tokens"), u.get("output_tokens"), cache_read, cache_write,
                           context=(u.get("input_tokens") or 0) + (cache_read or 0) + (cache_write or 0)),
        model=model, raw_stop=raw,
        refusal_category=details.get("category") if raw == "refusal" else None, state=state)


def complete(endpoint, system, messages, tools, on_delta=None, on_headers=None, cancel=None):
    base = common.base_url(endpoint, BASE)
    fallbacks = bool(endpoint.fallbacks) and native(base)
    try:
        return _complete(endpoint, base, system, messages, tools, on_delta, on_headers, fallbacks,
                         cancel)
    except ProviderError as e:
        if fallbacks and e.status == 400 and "fallback" in str(e).lower():
            return _complete(endpoint, base, system, messages, tools, on_delta, on_headers, False,
                             cancel)
        raise


def _complete(endpoint, base, system, messages, tools, on_delta, on_headers, fallbacks, cancel):
    body = request_body(endpoint, system, messages, tools, fallbacks)
    read = _read_stream if endpoint.stream else _read_json
    return http.call("anthropic", "POST", base + "/v1/messages", _headers(endpoint, fallbacks), body,
                     read, on_delta=on_delta, on_headers=on_headers,
                     secrets=common.secrets(endpoint), cancel=cancel)


def list_models(endpoint, cancel=None):
    base = common.base_url(endpoint, BASE)
    models, after = [], None
    while True:
        query = "?limit=1000" + (f"&after_id={urllib.parse.quote(after)}" if after else "")
        page = http.call("anthropic", "GET", base + "/v1/models" + query, _headers(endpoint, False),
                         None, lambda resp, emit: resp.json(), secrets=common.secrets(endpoint),
                         cancel=cancel)
        models += [{"id": m["id"], "name": m.get("display_name") or m["id"]}
                   for m in page.get("data") or []]
        if not page.get("has_more") or not page.get("last_id"):
            return models
        after = page["last_id"]
