"""Google Gemini REST (generativelanguage.googleapis.com), header x-goog-api-key.

Streaming: POST {base}/v1beta/models/<m>:streamGenerateContent?alt=sse (each SSE event is a
GenerateContentResponse); --no-stream: POST .../models/<m>:generateContent. Models:
GET {base}/v1beta/models. Tools go as functionDeclarations with parametersJsonSchema; calls come
back as whole functionCall parts and results go as functionResponse parts.

Gemini gives calls no id we can rely on, so each call gets one here: the turn number, its index
and a digest of the conversation so far -- deterministic (a resume sees the same ids) and never
repeated within a conversation. Every part of the model's turn, thought parts and
thoughtSignature included, is kept in Reply.state and replayed verbatim, as the API requires.

Stop reasons:

    | finishReason / promptFeedback                         | normalized |
    |-------------------------------------------------------|------------|
    | STOP (no functionCall)                                | end_turn   |
    | STOP with functionCall parts                          | tool_use   |
    | MAX_TOKENS                                            | max_tokens |
    | SAFETY, RECITATION, BLOCKLIST, PROHIBITED_CONTENT,    | refusal    |
    | SPII, IMAGE_SAFETY, LANGUAGE, promptFeedback.blockReason |         |
    | MALFORMED_FUNCTION_CALL, UNEXPECTED_TOOL_CALL         | tool_use, one malformed call |
    | OTHER, anything else                                  | end_turn   |

refusal_category is the lower-cased finish or block reason.

Knobs, each sent only when set, inside generationConfig: --max-tokens -> maxOutputTokens,
--temperature, --top-p -> topP, --stop -> stopSequences, --effort -> thinkingConfig.thinkingLevel
(Gemini 3 and later; thinkingBudget on gemini-2.x), --thinking summarized ->
thinkingConfig.includeThoughts, --thinking off -> thinkingLevel "minimal" (thinkingBudget 0 on 2.x).
"""
import copy
import urllib.parse

from overlord.agent.providers import common, http
from overlord.agent.providers.base import ProviderError, Reply, ToolCall

BASE = "https://generativelanguage.googleapis.com"
REFUSALS = ("SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
            "LANGUAGE")
BAD_CALLS = ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL")
LEVELS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
BUDGETS = {"low": 1024, "medium": 8192, "high": 24576, "xhigh": 32768, "max": 32768}


def _model(endpoint):
    model = common.need_model(endpoint)
    return model[len("models/"):] if model.startswith("models/") else model


def _contents(messages):
    out, calls = [], {}            # calls: our id -> (name, Gemini's own id or None)
    for m in messages:
        role = m.get("role")
        if role == "user":
            parts = [{"text": m["content"]}] if m.get("content") else []
        elif role == "assistant":
            state = common.own_state(m, "gemini")
            if state:
                parts = copy.deepcopy(state["parts"])
                for c in state.get("calls") or []:
                    calls[c["id"]] = (c["name"], c.get("gid"))
            else:
                parts = [{"text": m["text"]}] if m.get("text") else []
                for c in m.get("tool_calls") or []:
                    parts.append({"functionCall": {"name": c["name"], "args": c.get("input") or {}}})
                    calls[c["id"]] = (c["name"], None)
        elif role == "tool":
            parts = []
            for r in m.get("results") or []:
                if r["call_id"] not in calls:     # a call the model never validly made
                    parts.append({"text": f"[{r.get('name') or 'tool'} call {r['call_id']}] "
                                          + common.result_text(r)})
                    continue
                name, gid = calls[r["call_id"]]
                key = "error" if r.get("is_error") else "output"
                response = {"name": name, "response": {key: r.get("content") or ""}}
                if gid:
                    response["id"] = gid
                parts.append({"functionResponse": response})
        else:
            raise ProviderError(f"gemini: unknown message role {role!r}")
        api_role = "model" if role == "assistant" else "user"
        if not parts:
            continue
        if out and out[-1]["role"] == api_role:
            out[-1]["parts"].extend(parts)
        else:
            out.append({"role": api_role, "parts": parts})
    return out


def _thinking(endpoint, model):
    old = model.startswith("gemini-2")
    config = {}
    if endpoint.effort:
        if old:
            config["thinkingBudget"] = BUDGETS.get(endpoint.effort, 8192)
        else:
            config["thinkingLevel"] = LEVELS.get(endpoint.effort, endpoint.effort)
    elif endpoint.thinking == "off":
        config["thinkingBudget" if old else "thinkingLevel"] = 0 if old else "minimal"
    if endpoint.thinking == "summarized":
        config["includeThoughts"] = True
    return config


def request_body(endpoint, system, messages, tools):
    model = _model(endpoint)
    body = {"contents": _contents(messages)}
    if system:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    if tools:
        body["tools"] = [{"functionDeclarations": [
            {"name": t["name"], "description": t.get("description", ""),
             "parametersJsonSchema": t["input_schema"]} for t in tools]}]
    config = common.knobs(maxOutputTokens=endpoint.max_tokens, temperature=endpoint.temperature,
                          topP=endpoint.top_p, stopSequences=endpoint.stop or None)
    thinking = _thinking(endpoint, model)
    if thinking:
        config["thinkingConfig"] = thinking
    if config:
        body["generationConfig"] = config
    return body


class _Turn:
    """The model's turn as it streams in: parts (text fragments merged), finish, usage."""

    def __init__(self, emit):
        self.emit, self.parts, self.open = emit, [], None
        self.finish = self.finish_message = self.blocked = self.model = None
        self.usage = {}

    def add(self, data):
        if data.get("error"):
            err = data["error"]
            status = err.get("status") or err.get("code") or "error"
            raise ProviderError(f"gemini: {status}: {err.get('message') or ''}",
                                retryable=status in ("UNAVAILABLE", "INTERNAL", 503, 500))
        self.model = data.get("modelVersion") or self.model
        self.usage = data.get("usageMetadata") or self.usage
        feedback = data.get("promptFeedback") or {}
        if feedback.get("blockReason"):
            self.blocked = feedback["blockReason"]
        for cand in (data.get("candidates") or [])[:1]:
            for part in (cand.get("content") or {}).get("parts") or []:
                self.part(part)
            if cand.get("finishReason"):
                self.finish, self.finish_message = cand["finishReason"], cand.get("finishMessage")

    def part(self, part):
        """Stream fragments of one text (or thought) join into one part; a thoughtSignature stays
        on the part it came with (an empty text part carrying only a signature joins the text
        before it) and closes it. Any other part is kept as it came."""
        if "text" not in part or not set(part) <= {"text", "thought", "thoughtSignature"}:
            self.open = None
            self.parts.append(copy.deepcopy(part))
            return
        thought, sig = bool(part.get("thought")), part.get("thoughtSignature")
        self.emit("thinking" if thought else "text", part["text"])
        joins = self.open is not None and (
            bool(self.open.get("thought")) == thought or (not part["text"] and sig))
        if not joins:
            self.parts.append(dict(part))
            self.open = None if sig else self.parts[-1]
            return
        self.open["text"] += part["text"]
        if sig:
            self.open["thoughtSignature"] = sig
            self.open = None


def _reply(turn, messages):
    calls_parts = [p["functionCall"] for p in turn.parts if "functionCall" in p]
    ids = common.call_ids(messages, "call", len(calls_parts) + 1)
    calls, state_calls = [], []
    for i, fc in enumerate(calls_parts):
        args = fc.get("args")
        value, why = (args, None) if isinstance(args, dict) else common.tool_input(args)
        calls.append(ToolCall(ids[i], fc.get("name"), value, why))
        state_calls.append({"id": ids[i], "name": fc.get("name"), "gid": fc.get("id")})
    finish = turn.finish
    category = None
    if turn.blocked:
        stop, raw, category = "refusal", f"blocked:{turn.blocked}", turn.blocked.lower()
    elif finish == "MAX_TOKENS":
        stop, raw = "max_tokens", finish
    elif finish in REFUSALS:
        stop, raw, category = "refusal", finish, finish.lower()
    elif finish in BAD_CALLS:
        why = f"the model produced an unusable function call ({finish}): {turn.finish_message or ''}"
        calls.append(ToolCall(ids[-1], "", {}, why.strip()))
        stop, raw = "tool_use", finish
    else:
        stop, raw = ("tool_use" if calls else "end_turn"), finish
    text = "".join(p.get("text", "") for p in turn.parts if "text" in p and not p.get("thought"))
    u = turn.usage
    prompt = (u.get("promptTokenCount") or 0) + (u.get("toolUsePromptTokenCount") or 0)
    thoughts = u.get("thoughtsTokenCount")
    return Reply(
        text=text, tool_calls=calls, stop_reason=stop,
        usage=common.usage(prompt, (u.get("candidatesTokenCount") or 0) + (thoughts or 0),
                           u.get("cachedContentTokenCount"), None, thoughts, prompt),
        model=turn.model, raw_stop=raw, refusal_category=category,
        state={"provider": "gemini", "parts": turn.parts, "calls": state_calls})


def complete(endpoint, system, messages, tools, on_delta=None, on_headers=None, cancel=None):
    base = common.base_url(endpoint, BASE)
    model = urllib.parse.quote(_model(endpoint), safe="")
    body = request_body(endpoint, system, messages, tools)
    if endpoint.stream:
        url = f"{base}/v1beta/models/{model}:streamGenerateContent?alt=sse"
    else:
        url = f"{base}/v1beta/models/{model}:generateContent"

    def read(resp, emit):
        turn = _Turn(emit)
        if endpoint.stream:
            for ev in resp.events():
                turn.add(common.loads(ev.data))
            if turn.finish is None and turn.blocked is None:
                raise http.Dropped("the stream ended before a finishReason")
        else:
            turn.add(resp.json())
        return _reply(turn, messages)

    headers = common.headers(endpoint, {"x-goog-api-key": endpoint.api_key})
    return http.call("gemini", "POST", url, headers, body, read, on_delta=on_delta,
                     on_headers=on_headers, secrets=common.secrets(endpoint), cancel=cancel)


def list_models(endpoint, cancel=None):
    base = common.base_url(endpoint, BASE)
    headers = common.headers(endpoint, {"x-goog-api-key": endpoint.api_key})
    models, token = [], None
    while True:
        query = "?pageSize=1000" + (f"&pageToken={urllib.parse.quote(token)}" if token else "")
        page = http.call("gemini", "GET", f"{base}/v1beta/models{query}", headers, None,
                         lambda resp, emit: resp.json(), secrets=common.secrets(endpoint),
                         cancel=cancel)
        for m in page.get("models") or []:
            methods = m.get("supportedGenerationMethods")
            if methods is not None and "generateContent" not in methods:
                continue
            mid = m.get("name", "")
            mid = mid[len("models/"):] if mid.startswith("models/") else mid
            models.append({"id": mid, "name": m.get("displayName") or mid})
        token = page.get("nextPageToken")
        if not token:
            return models
