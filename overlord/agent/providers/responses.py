"""The OpenAI Responses API wire (POST .../responses), shared by openai, azure and compatible servers.

Always stateless: `store: false`, and when the model reasons, `include:
["reasoning.encrypted_content"]`, so each reasoning item comes back encrypted and is replayed (from
Reply.state) ahead of the function_call items it produced; then come the function_call_output
items. Replayed items carry no `id`: with store false the server keeps nothing to look an id up in.

Stop reasons:

    | Responses API outcome                            | normalized |
    |--------------------------------------------------|------------|
    | status completed, no function_call item          | end_turn   |
    | status completed, function_call items            | tool_use   |
    | a refusal content part in a message item         | refusal    |
    | incomplete, incomplete_details.reason            |            |
    |   max_output_tokens                              | max_tokens |
    |   content_filter                                 | refusal    |
    | incomplete, any other reason                     | max_tokens |

Knobs, each sent only when set: --max-tokens -> max_output_tokens, --temperature, --top-p,
--effort -> reasoning.effort (max is sent as xhigh), --thinking summarized -> reasoning.summary
"auto", --thinking off -> reasoning.effort "none" (unless --effort is given). The Responses API
has no stop sequences: --stop is refused with a line saying to use --api chat.
"""
import json
import re

from overlord.agent.providers import common, http
from overlord.agent.providers.base import ProviderError, Reply, ToolCall

EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}
REASONING_MODEL = re.compile(r"^(o\d|gpt-5|codex)", re.I)
RETRYABLE_CODES = ("server_error", "rate_limit_exceeded", "overloaded", "server_is_overloaded")


def reasons(endpoint, reasoning):
    """Whether to ask for encrypted reasoning: the call reasons (by knob or by model family)."""
    if reasoning.get("effort") == "none":
        return False
    return bool(reasoning) or bool(REASONING_MODEL.match(endpoint.model or ""))


def _input(name, messages):
    items = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            items.append({"role": "user", "content": m.get("content") or ""})
        elif role == "assistant":
            state = common.own_state(m, f"{name}:responses")
            if state:
                items.extend(dict(i) for i in state["items"])
                continue
            if m.get("text"):
                items.append({"role": "assistant", "content": m["text"]})
            for c in m.get("tool_calls") or []:
                items.append({"type": "function_call", "call_id": c["id"], "name": c["name"],
                              "arguments": json.dumps(c.get("input") or {})})
        elif role == "tool":
            for r in m.get("results") or []:
                items.append({"type": "function_call_output", "call_id": r["call_id"],
                              "output": common.result_text(r)})
        else:
            raise ProviderError(f"{name}: unknown message role {role!r}")
    return items


def request_body(wire, endpoint, system, messages, tools):
    if endpoint.stop:
        raise ProviderError(f"{wire.name}: the Responses API takes no stop sequences; "
                            "use --api chat for --stop")
    body = {"model": wire.model(endpoint), "input": _input(wire.name, messages), "store": False}
    if system:
        body["instructions"] = system
    if tools:
        body["tools"] = [{"type": "function", "name": t["name"],
                          "description": t.get("description", ""), "parameters": t["input_schema"],
                          "strict": wire.strict and common.strict_ok(t["input_schema"])} for t in tools]
    reasoning = {}
    if endpoint.effort:
        reasoning["effort"] = EFFORTS.get(endpoint.effort, endpoint.effort)
    elif endpoint.thinking == "off":
        reasoning["effort"] = "none"
    if endpoint.thinking == "summarized":
        reasoning["summary"] = "auto"
    if reasoning:
        body["reasoning"] = reasoning
    if reasons(endpoint, reasoning):
        body["include"] = ["reasoning.encrypted_content"]
    body.update(common.knobs(max_output_tokens=endpoint.max_tokens,
                             temperature=endpoint.temperature, top_p=endpoint.top_p))
    if endpoint.stream:
        body["stream"] = True
    return body


def _inband(name, error, default="error"):
    error = error or {}
    code = error.get("code") or error.get("type") or default
    return ProviderError(f"{name}: {code}: {error.get('message') or ''}",
                         retryable=code in RETRYABLE_CODES)


def read_stream(name):
    def read(resp, emit):
        items, args, final = {}, {}, None
        for ev in resp.events():
            data = common.loads(ev.data)
            kind = data.get("type") or ev.event
            index = data.get("output_index")
            if kind == "response.output_item.added":
                items[index] = dict(data.get("item") or {})
            elif kind == "response.output_text.delta":
                emit("text", data.get("delta", ""))
            elif kind == "response.refusal.delta":
                emit("text", data.get("delta", ""))
            elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
                emit("thinking", data.get("delta", ""))
            elif kind == "response.function_call_arguments.delta":
                args[index] = args.get(index, "") + data.get("delta", "")
            elif kind == "response.function_call_arguments.done":
                args[index] = data.get("arguments", args.get(index, ""))
            elif kind == "response.output_item.done":
                items[index] = dict(data.get("item") or {})
            elif kind in ("response.completed", "response.incomplete"):
                final = data.get("response") or {}
                break
            elif kind == "response.failed":
                raise _inband(name, (data.get("response") or {}).get("error"), "failed")
            elif kind == "error":
                raise _inband(name, data.get("error") or data)
        if final is None:
            raise http.Dropped("the stream ended before response.completed")
        output = final.get("output") or []
        if not output:             # fall back on the items the stream itself delivered
            for i in sorted(items):
                if items[i].get("type") == "function_call" and i in args:
                    items[i].setdefault("arguments", args[i])
                output.append(items[i])
        return reply(name, final, output)
    return read


def read_json(name):
    def read(resp, emit):
        final = resp.json()
        if final.get("error"):
            raise _inband(name, final["error"])
        for item in final.get("output") or []:
            if item.get("type") == "reasoning":
                emit("thinking", "".join(s.get("text", "") for s in item.get("summary") or []))
            elif item.get("type") == "message":
                for part in item.get("content") or []:
                    emit("text", part.get("text") or part.get("refusal") or "")
        return reply(name, final, final.get("output") or [])
    return read


def reply(name, final, output):
    text, calls, replay, refused = [], [], [], False
    for item in output:
        kind = item.get("type")
        if kind == "message":
            said = []
            for part in item.get("content") or []:
                if part.get("type") == "refusal":
                    refused = True
                    said.append(part.get("refusal", ""))
                else:
                    said.append(part.get("text", ""))
            text.extend(said)
            if "".join(said):
                replay.append({"role": "assistant", "content": "".join(said)})
        elif kind == "function_call":
            value, why = common.tool_input(item.get("arguments"))
            calls.append(ToolCall(item.get("call_id"), item.get("name"), value, why))
            replay.append({"type": "function_call", "call_id": item.get("call_id"),
                           "name": item.get("name"), "arguments": item.get("arguments") or ""})
        elif kind == "reasoning" and item.get("encrypted_content"):
            replay.append({"type": "reasoning", "summary": item.get("summary") or [],
                           "encrypted_content": item["encrypted_content"]})
    status = final.get("status")
    why = (final.get("incomplete_details") or {}).get("reason")
    if status == "incomplete":
        stop = "refusal" if why == "content_filter" else "max_tokens"
        raw = f"incomplete:{why}"
    elif refused:
        stop, raw = "refusal", "refusal"
    else:
        stop, raw = ("tool_use" if calls else "end_turn"), status
    u = final.get("usage") or {}
    return Reply(
        text="".join(text), tool_calls=calls, stop_reason=stop,
        usage=common.usage(u.get("input_tokens"), u.get("output_tokens"),
                           (u.get("input_tokens_details") or {}).get("cached_tokens"), None,
                           (u.get("output_tokens_details") or {}).get("reasoning_tokens")),
        model=final.get("model"), raw_stop=raw,
        refusal_category=("content_filter" if why == "content_filter" else None),
        state={"provider": f"{name}:responses", "items": replay})


def complete(wire, endpoint, system, messages, tools, on_delta=None, on_headers=None,
             cancel=None):
    body = request_body(wire, endpoint, system, messages, tools)
    read = read_stream(wire.name) if endpoint.stream else read_json(wire.name)
    return http.call(wire.name, "POST", wire.url(endpoint, "responses"), wire.headers(endpoint),
                     body, read, on_delta=on_delta, on_headers=on_headers,
                     secrets=common.secrets(endpoint), cancel=cancel)
