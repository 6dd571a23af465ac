"""Fake model endpoints on 127.0.0.1: one per wire protocol, speaking it as the published API
references describe, and checking every request they receive.

Sources (the wire formats were taken from these references, not from any SDK's code):
  - Anthropic Messages API: https://docs.anthropic.com/en/api/messages,
    https://docs.anthropic.com/en/docs/build-with-claude/streaming (event sequence, input_json_delta,
    thinking_delta, signature_delta, ping, error), .../extended-thinking and .../adaptive-thinking
    (thinking blocks passed back unmodified with tool use), .../effort (output_config.effort),
    https://platform.claude.com/docs/en/build-with-claude/refusals-and-fallback (stop_reason
    refusal, stop_details, `fallbacks: "default"` + anthropic-beta server-side-fallback-2026-07-01,
    the "fallback" content block), https://docs.anthropic.com/en/api/models-list.
  - OpenAI Responses API: https://platform.openai.com/docs/api-reference/responses (create,
    streaming events response.output_item.added/done, response.output_text.delta,
    response.function_call_arguments.delta/done, response.reasoning_summary_text.delta,
    response.completed/incomplete/failed, error), .../guides/reasoning (encrypted reasoning items
    with store: false and include reasoning.encrypted_content), .../api-reference/models/list.
  - OpenAI Chat Completions: https://platform.openai.com/docs/api-reference/chat (chunk objects,
    tool_calls deltas keyed by index, finish_reason, stream_options.include_usage, [DONE]).
  - Azure OpenAI: https://learn.microsoft.com/azure/ai-services/openai/reference (deployments path,
    api-version query, api-key header).
  - Gemini: https://ai.google.dev/api/generate-content (streamGenerateContent?alt=sse,
    GenerateContentResponse, finishReason, usageMetadata, promptFeedback),
    https://ai.google.dev/gemini-api/docs/function-calling and .../thinking (functionCall /
    functionResponse parts, thought parts, thoughtSignature returned with its part),
    https://ai.google.dev/api/models (models.list).

A fake answers from a queue (`queue(answer, ...)`); a request that breaks the protocol gets the
provider's own 400 error shape and is written to `problems`, which every test asserts is empty.
`allowed` names the optional knobs a test has set: any other optional field is an unset knob that
was sent anyway, and counts as a problem.
"""
import itertools
import json
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

KEY = "sk-test-Secret-9f8e7d6c5b4a39281706"


@pytest.fixture
def quick(monkeypatch, tmp_path):
    """Instant retries (sleeps recorded), two retries, no proxy, a private OVERLORD_HOME."""
    from overlord.agent.providers import http
    slept = []
    monkeypatch.setattr(http, "sleep", slept.append)
    monkeypatch.setenv("OVERLORD_PROVIDER_RETRIES", "2")
    monkeypatch.setenv("OVERLORD_PROVIDER_TIMEOUT", "5")
    monkeypatch.delenv("OVERLORD_RETRY_SCALE", raising=False)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OVERLORD_HOME", str(tmp_path / "home"))
    return slept


# ---------------------------------------------------------------- the server and its answers

def sse_text(events):
    """SSE wire text for [(event name or None, payload dict or str)]."""
    out = []
    for name, payload in events:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        out.append((f"event: {name}\n" if name else "") + "".join(f"data: {l}\n" for l in data.split("\n")) + "\n")
    return out


class Answer:
    """One planned response: a JSON body, or an SSE stream (optionally cut), after an optional stall.

    cut=("chunk", n): the connection dies n bytes into the stream, inside a chunk (a broken
    transfer); cut=("eof", n): the HTTP response ends cleanly but the stream text stops n bytes in.
    """

    def __init__(self, status=200, body=None, events=None, headers=None, cut=None, stall=0):
        self.status, self.body, self.events = status, body, events
        self.headers, self.cut, self.stall = headers or {}, cut, stall

    def cut_in(self, k, mode="chunk"):
        """Cut this stream 12 bytes into its k-th event (a negative k counts from the end)."""
        chunks = sse_text(self.events)
        k = k % len(chunks)
        self.cut = (mode, len("".join(chunks[:k]).encode()) + 12)
        return self

    def send(self, h):
        if self.stall:
            time.sleep(self.stall)
        if self.events is None:
            data = json.dumps(self.body).encode()
            h.send_response(self.status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            for k, v in self.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
            return
        h.send_response(self.status)
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("cache-control", "no-cache")
        h.send_header("transfer-encoding", "chunked")
        for k, v in self.headers.items():
            h.send_header(k, v)
        h.end_headers()
        chunks = [c.encode() for c in sse_text(self.events)]
        if self.cut:
            mode, n = self.cut
            data = b"".join(chunks)
            if mode == "chunk":         # promise the whole stream, deliver part, drop the line
                h.wfile.write(b"%x\r\n" % len(data) + data[:n])
                h.wfile.flush()
                h.close_connection = True
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            chunks = [data[:n]]
        for c in chunks:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _serve(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = "<not JSON>"
        split = urllib.parse.urlsplit(self.path)
        req = {"method": self.command, "path": split.path,
               "query": dict(urllib.parse.parse_qsl(split.query)),
               "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
        try:
            self.server.fake.handle(req).send(self)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_POST = _serve


class Fake:
    """A fake endpoint: a queue of answers, a record of requests, a list of protocol problems."""

    def __init__(self, key=KEY):
        self.key, self.plan, self.requests, self.problems = key, [], [], []
        self.allowed, self.ids = set(), itertools.count(1)
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.fake = self
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def queue(self, *answers):
        self.plan.extend(answers)
        return self

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def body(self, n=-1):
        return self.requests[n]["body"]

    def handle(self, req):
        problems = self.check(req)
        with self._lock:
            self.requests.append(req)
            self.problems.extend(problems)
            if problems:
                return Answer(400, self.error(400, "; ".join(problems)))
            if not self.plan:
                self.problems.append(f"unplanned request {req['method']} {req['path']}")
                return Answer(500, self.error(500, "no answer planned"))
            return self.plan.pop(0)

    def error(self, status, message, kind="invalid_request_error"):
        raise NotImplementedError

    def check(self, req):
        raise NotImplementedError

    def extra_fields(self, body, base, where="body"):
        extra = sorted(set(body) - set(base) - self.allowed)
        return [f"unset knobs sent in {where}: {', '.join(extra)}"] if extra else []


def strict_json(raw):
    """What the API's own JSON parser makes of a tool input: an object, or {} (no NaN)."""
    def refuse(name):
        raise ValueError(name)
    try:
        value = json.loads(raw, parse_constant=refuse) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def pieces(text, n=5):
    """Fragments the way a stream delivers them (the first one empty, as APIs often send)."""
    return [""] + [text[i:i + n] for i in range(0, len(text), n)]


# ---------------------------------------------------------------- Anthropic Messages API

class AnthropicFake(Fake):
    MODEL = "claude-test-5"
    VERSION = "2023-06-01"
    BETA = "server-side-fallback-2026-07-01"

    def __init__(self, key=KEY):
        super().__init__(key)
        self.issued = {}          # tool_use id -> the assistant content blocks that carried it

    def error(self, status, message, kind=None):
        kind = kind or {400: "invalid_request_error", 401: "authentication_error",
                        429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def check(self, req):
        p, h, b = [], req["headers"], req["body"]
        if h.get("x-api-key") != self.key:
            p.append("x-api-key missing or wrong")
        if "authorization" in h:
            p.append("an Authorization header was sent to the Messages API")
        if h.get("anthropic-version") != self.VERSION:
            p.append("anthropic-version must be 2023-06-01")
        if req["path"] == "/v1/models" and req["method"] == "GET":
            return p
        if req["path"] != "/v1/messages" or req["method"] != "POST":
            return p + [f"no such route {req['method']} {req['path']}"]
        if not isinstance(b, dict):
            return p + ["body is not a JSON object"]
        p += self.extra_fields(b, {"model", "messages", "max_tokens", "system", "tools", "stream"})
        if not isinstance(b.get("max_tokens"), int):
            p.append("max_tokens (required) missing")
        if "thinking" in b and b["thinking"] not in ({"type": "adaptive", "display": "summarized"},
                                                     {"type": "disabled"}):
            p.append(f"bad thinking {b['thinking']}")
        if "output_config" in b and (b["output_config"] or {}).get("effort") not in (
                "low", "medium", "high", "xhigh", "max"):
            p.append(f"bad output_config {b['output_config']}")
        betas = h.get("anthropic-beta", "")
        if "fallbacks" in b and (b["fallbacks"] != "default" or self.BETA not in betas):
            p.append("fallbacks needs the value 'default' and the server-side-fallback beta header")
        if "fallbacks" not in b and self.BETA in betas:
            p.append("fallback beta header without fallbacks")
        for t in b.get("tools") or []:
            if set(t) - {"name", "description", "input_schema"} or "input_schema" not in t:
                p.append(f"bad tool {t}")
        return p + self._check_messages(b.get("messages"))

    def _check_messages(self, messages):
        p, prev_tools = [], set()
        if not messages or messages[0].get("role") != "user":
            return ["messages must start with a user turn"]
        for n, m in enumerate(messages):
            if n and m["role"] == messages[n - 1]["role"]:
                p.append(f"message {n}: two {m['role']} turns in a row")
            content = m.get("content")
            if not isinstance(content, list) or not content:
                p.append(f"message {n}: empty content")
                continue
            blocks = [{k: v for k, v in bl.items() if k != "cache_control"} for bl in content]
            for bl in blocks:
                if bl.get("type") == "text" and not bl.get("text"):
                    p.append(f"message {n}: text content blocks must be non-empty")
                if bl.get("type") == "tool_result" and bl.get("tool_use_id") not in prev_tools:
                    p.append(f"message {n}: tool_result for unknown tool_use {bl.get('tool_use_id')}")
            if m["role"] == "assistant":
                prev_tools = {bl["id"] for bl in blocks if bl.get("type") == "tool_use"}
                for tid in prev_tools & set(self.issued):
                    if blocks != self.issued[tid]:
                        p.append(f"message {n}: the assistant turn with {tid} was not passed back "
                                 "unmodified (thinking blocks and signatures must be)")
            else:
                types = [bl.get("type") for bl in blocks]
                if "tool_result" in types:
                    last = len(types) - 1 - types[::-1].index("tool_result")
                    if any(t != "tool_result" for t in types[:last]):
                        p.append(f"message {n}: tool_result blocks must come first")
        return p

    def turn(self, text="", thinking=None, calls=(), stop=None, usage=None, category=None,
             model=None, fallback=None, redacted=False):
        """A streamed message. calls: (name, dict input) or (name, raw JSON text)."""
        model = model or self.MODEL
        usage = usage or {"input_tokens": 25, "output_tokens": 12, "cache_read_input_tokens": 7,
                          "cache_creation_input_tokens": 3}
        ev = [("message_start", {"type": "message_start", "message": {
            "id": f"msg_{next(self.ids)}", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}}})]
        blocks, i = [], 0

        def block(start, deltas, final):
            nonlocal i
            ev.append(("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": start}))
            if i == 0:
                ev.append(("ping", {"type": "ping"}))
            for d in deltas:
                ev.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}))
            ev.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
            blocks.append(final)
            i += 1

        if thinking is not None:
            sig = f"EqQBCkgIARAB{next(self.ids)}GAIiQJ" + "x" * 40
            block({"type": "thinking", "thinking": "", "signature": ""},
                  [{"type": "thinking_delta", "thinking": t} for t in pieces(thinking)[1:]]
                  + [{"type": "signature_delta", "signature": sig}],
                  {"type": "thinking", "thinking": thinking, "signature": sig})
        if redacted:
            block({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}, [],
                  {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"})
        if fallback:
            fb = {"type": "fallback", "from": {"model": model}, "to": {"model": fallback}}
            block(fb, [], fb)
        if text:
            block({"type": "text", "text": ""},
                  [{"type": "text_delta", "text": t} for t in pieces(text)[1:]],
                  {"type": "text", "text": text})
        ids = []
        for name, inp in calls:
            tid = f"toolu_{next(self.ids):04d}"
            raw = inp if isinstance(inp, str) else json.dumps(inp)
            parsed = strict_json(raw)
            block({"type": "tool_use", "id": tid, "name": name, "input": {}},
                  [{"type": "input_json_delta", "partial_json": t} for t in pieces(raw, 7)],
                  {"type": "tool_use", "id": tid, "name": name, "input": parsed})
            ids.append(tid)
        for tid in ids:
            self.issued[tid] = blocks
        stop = stop or ("tool_use" if calls else "end_turn")
        details = {"type": "refusal", "category": category, "explanation": "declined"} \
            if stop == "refusal" else None
        ev.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop, "stop_sequence": None,
                                               "stop_details": details},
                                     "usage": {"output_tokens": usage["output_tokens"]}}))
        ev.append(("message_stop", {"type": "message_stop"}))
        return Answer(events=ev, headers={"anthropic-ratelimit-requests-remaining": "49",
                                          "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:00Z"})

    def message(self, text="", calls=(), stop=None, thinking=None):
        """A non-streamed Message object."""
        content = []
        if thinking:
            content.append({"type": "thinking", "thinking": thinking, "signature": "sig-nostream"})
        if text:
            content.append({"type": "text", "text": text})
        for name, inp in calls:
            tid = f"toolu_{next(self.ids):04d}"
            content.append({"type": "tool_use", "id": tid, "name": name, "input": inp})
        for bl in content:
            if bl["type"] == "tool_use":
                self.issued[bl["id"]] = content
        return Answer(body={"id": f"msg_{next(self.ids)}", "type": "message", "role": "assistant",
                            "model": self.MODEL, "content": content,
                            "stop_reason": stop or ("tool_use" if calls else "end_turn"),
                            "stop_sequence": None,
                            "usage": {"input_tokens": 30, "output_tokens": 9}})

    def models(self):
        return Answer(body={"data": [
            {"type": "model", "id": "claude-test-5", "display_name": "Claude Test 5",
             "created_at": "2026-01-01T00:00:00Z"},
            {"type": "model", "id": "claude-test-4", "display_name": "Claude Test 4",
             "created_at": "2025-01-01T00:00:00Z"}],
            "has_more": False, "first_id": "claude-test-5", "last_id": "claude-test-4"})


# ---------------------------------------------------------------- OpenAI Responses API

class ResponsesFake(Fake):
    MODEL = "gpt-test-5"

    def __init__(self, key=KEY, path="/responses", auth="bearer", query=None):
        super().__init__(key)
        self.path, self.auth, self.query = path, auth, query or {}
        self.issued = {}           # call_id -> encrypted reasoning that came before it

    def error(self, status, message, kind="invalid_request_error"):
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def check_auth(self, h):
        p = []
        if self.auth == "bearer" and h.get("authorization") != f"Bearer {self.key}":
            p.append("Authorization: Bearer <key> missing or wrong")
        if self.auth == "api-key":
            if h.get("api-key") != self.key:
                p.append("api-key header missing or wrong")
            if "authorization" in h:
                p.append("Authorization header sent to Azure with an api-key")
        if self.auth is None and "authorization" in h:
            p.append("an Authorization header was sent without a key")
        return p

    def check(self, req):
        p = self.check_auth(req["headers"])
        for k, v in self.query.items():
            if req["query"].get(k) != v:
                p.append(f"query {k} must be {v}")
        if req["method"] == "GET" and req["path"].endswith("/models"):
            return p
        if req["path"] != self.path or req["method"] != "POST":
            return p + [f"no such route {req['method']} {req['path']}"]
        b = req["body"]
        if not isinstance(b, dict):
            return p + ["body is not a JSON object"]
        p += self.extra_fields(b, {"model", "input", "instructions", "tools", "store", "stream", "include"})
        if b.get("store") is not False:
            p.append("store must be false")
        if "include" in b and b["include"] != ["reasoning.encrypted_content"]:
            p.append(f"bad include {b['include']}")
        if "reasoning" in b and (set(b["reasoning"]) - {"effort", "summary"}):
            p.append(f"bad reasoning {b['reasoning']}")
        for t in b.get("tools") or []:
            if t.get("type") != "function" or not isinstance(t.get("strict"), bool) or "parameters" not in t:
                p.append(f"bad tool {t}")
        return p + self._check_input(b.get("input"))

    def _check_input(self, items):
        p, calls, since_user = [], set(), []
        for n, it in enumerate(items or []):
            if "id" in it:
                p.append(f"input {n}: Item with id '{it['id']}' not found. Items are not persisted "
                         "when `store` is set to false.")
            kind = it.get("type", "message")
            if kind == "message" and it.get("role") == "user":
                since_user = []
            elif kind == "reasoning":
                if not it.get("encrypted_content") or "summary" not in it:
                    p.append(f"input {n}: reasoning item without encrypted_content/summary")
                since_user.append(it.get("encrypted_content"))
            elif kind == "function_call":
                calls.add(it.get("call_id"))
                want = self.issued.get(it.get("call_id"))
                if want and want not in since_user:
                    p.append(f"input {n}: function_call {it['call_id']} replayed without the "
                             "encrypted reasoning item that produced it")
            elif kind == "function_call_output":
                if it.get("call_id") not in calls:
                    p.append(f"input {n}: No tool call found for function call output with "
                             f"call_id {it.get('call_id')}")
        return p

    def _response(self, status, output, usage, reason=None):
        r = {"id": f"resp_{next(self.ids)}", "object": "response", "created_at": 1767225600,
             "status": status, "model": self.MODEL, "output": output, "store": False,
             "incomplete_details": {"reason": reason} if reason else None, "error": None,
             "usage": usage}
        return r

    def turn(self, text="", reasoning=None, calls=(), incomplete=None, refusal=None, usage=None,
             stream=True):
        usage = usage or {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 16},
                          "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 8},
                          "total_tokens": 60}
        seq = itertools.count()
        ev, output = [], []

        def e(kind, **fields):
            ev.append((kind, {"type": kind, "sequence_number": next(seq), **fields}))

        e("response.created", response=self._response("in_progress", [], None))
        e("response.in_progress", response=self._response("in_progress", [], None))
        enc = None
        if reasoning is not None:
            i, rid, enc = len(output), f"rs_{next(self.ids)}", f"gAAAAABenc{next(self.ids)}=="
            e("response.output_item.added", output_index=i,
              item={"id": rid, "type": "reasoning", "summary": []})
            e("response.reasoning_summary_part.added", item_id=rid, output_index=i, summary_index=0,
              part={"type": "summary_text", "text": ""})
            for t in pieces(reasoning)[1:]:
                e("response.reasoning_summary_text.delta", item_id=rid, output_index=i,
                  summary_index=0, delta=t)
            e("response.reasoning_summary_text.done", item_id=rid, output_index=i, summary_index=0,
              text=reasoning)
            item = {"id": rid, "type": "reasoning", "encrypted_content": enc,
                    "summary": [{"type": "summary_text", "text": reasoning}]}
            e("response.output_item.done", output_index=i, item=item)
            output.append(item)
        if text or refusal:
            i, mid = len(output), f"msg_{next(self.ids)}"
            e("response.output_item.added", output_index=i, item={
                "id": mid, "type": "message", "status": "in_progress", "role": "assistant", "content": []})
            kind, field = ("refusal", "refusal") if refusal else ("output_text", "text")
            said = refusal or text
            e("response.content_part.added", item_id=mid, output_index=i, content_index=0,
              part={"type": kind, field: "", **({"annotations": []} if kind == "output_text" else {})})
            for t in pieces(said)[1:]:
                e(f"response.{'refusal' if refusal else 'output_text'}.delta", item_id=mid,
                  output_index=i, content_index=0, delta=t)
            part = {"type": kind, field: said, **({"annotations": []} if kind == "output_text" else {})}
            e(f"response.{'refusal' if refusal else 'output_text'}.done", item_id=mid,
              output_index=i, content_index=0, **({"refusal": said} if refusal else {"text": said}))
            e("response.content_part.done", item_id=mid, output_index=i, content_index=0, part=part)
            item = {"id": mid, "type": "message", "status": "completed", "role": "assistant",
                    "content": [part]}
            e("response.output_item.done", output_index=i, item=item)
            output.append(item)
        for name, inp in calls:
            i, fid, cid = len(output), f"fc_{next(self.ids)}", f"call_{next(self.ids)}"
            raw = inp if isinstance(inp, str) else json.dumps(inp)
            e("response.output_item.added", output_index=i, item={
                "id": fid, "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": cid, "name": name})
            for t in pieces(raw, 7)[1:]:
                e("response.function_call_arguments.delta", item_id=fid, output_index=i, delta=t)
            e("response.function_call_arguments.done", item_id=fid, output_index=i, arguments=raw)
            item = {"id": fid, "type": "function_call", "status": "completed", "arguments": raw,
                    "call_id": cid, "name": name}
            e("response.output_item.done", output_index=i, item=item)
            output.append(item)
            if enc:
                self.issued[cid] = enc
        if incomplete:
            e("response.incomplete", response=self._response("incomplete", output, usage, incomplete))
        else:
            e("response.completed", response=self._response("completed", output, usage))
        if not stream:
            return Answer(body=ev[-1][1]["response"])
        return Answer(events=ev, headers={"x-ratelimit-remaining-requests": "99",
                                          "x-ratelimit-remaining-tokens": "150000"})

    def models(self):
        return Answer(body={"object": "list", "data": [
            {"id": "gpt-test-5", "object": "model", "created": 1767225600, "owned_by": "system"},
            {"id": "gpt-test-5-mini", "object": "model", "created": 1767225600, "owned_by": "system"}]})


# ---------------------------------------------------------------- Chat Completions (OpenAI, Azure, compatible)

class ChatFake(ResponsesFake):
    """Chat Completions. path/auth/query select the flavour (OpenAI, Azure, a compatible server)."""

    def __init__(self, key=KEY, path="/chat/completions", auth="bearer", query=None,
                 tokens_field="max_completion_tokens"):
        super().__init__(key, path, auth, query)
        self.tokens_field = tokens_field

    def check(self, req):
        p = self.check_auth(req["headers"])
        for k, v in self.query.items():
            if req["query"].get(k) != v:
                p.append(f"query {k} must be {v}")
        if req["method"] == "GET" and req["path"].endswith("/models"):
            return p
        if req["path"] != self.path or req["method"] != "POST":
            return p + [f"no such route {req['method']} {req['path']}"]
        b = req["body"]
        if not isinstance(b, dict):
            return p + ["body is not a JSON object"]
        p += self.extra_fields(b, {"model", "messages", "tools", "stream", "stream_options"})
        if b.get("stream") and b.get("stream_options") != {"include_usage": True}:
            p.append("stream_options.include_usage not asked for")
        if "max_tokens" in b and "max_completion_tokens" in b:
            p.append("both max_tokens and max_completion_tokens")
        for t in b.get("tools") or []:
            if t.get("type") != "function" or "name" not in (t.get("function") or {}):
                p.append(f"bad tool {t}")
        ids = set()
        for n, m in enumerate(b.get("messages") or []):
            if m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                p.append(f"message {n}: bad role")
            if m.get("role") == "assistant":
                ids = set()
                for tc in m.get("tool_calls") or []:
                    ids.add(tc.get("id"))
                    try:
                        json.loads(tc["function"]["arguments"])
                    except (KeyError, TypeError, ValueError):
                        p.append(f"message {n}: tool call arguments must be a JSON string")
            if m.get("role") == "tool" and m.get("tool_call_id") not in ids:
                p.append(f"message {n}: tool message for unknown tool_call_id {m.get('tool_call_id')}")
        return p

    def turn(self, text="", calls=(), finish=None, refusal=None, reasoning=None, usage=None,
             stream=True, ids=True, done=True):
        usage = usage or {"prompt_tokens": 33, "completion_tokens": 11, "total_tokens": 44,
                          "prompt_tokens_details": {"cached_tokens": 5},
                          "completion_tokens_details": {"reasoning_tokens": 3}}
        cid = f"chatcmpl-{next(self.ids)}"

        def chunk(delta, finish=None, **extra):
            return (None, {"id": cid, "object": "chat.completion.chunk", "created": 1767225600,
                           "model": self.MODEL, "system_fingerprint": "fp_test",
                           "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                        "finish_reason": finish}], **extra})
        ev = [chunk({"role": "assistant", "content": "", "refusal": None})]
        for t in pieces(reasoning or "")[1:]:
            ev.append(chunk({"reasoning_content": t}))
        for t in pieces(text)[1:]:
            ev.append(chunk({"content": t}))
        for t in pieces(refusal or "")[1:]:
            ev.append(chunk({"refusal": t}))
        tool_calls = []
        for n, (name, inp) in enumerate(calls):
            raw = inp if isinstance(inp, str) else json.dumps(inp)
            tid = f"call_{next(self.ids)}"
            first = {"index": n, "type": "function", "function": {"name": name, "arguments": ""}}
            if ids:
                first["id"] = tid
            ev.append(chunk({"tool_calls": [first]}))
            for t in pieces(raw, 6)[1:]:
                ev.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": t}}]}))
            tool_calls.append({"id": tid, "type": "function", "function": {"name": name, "arguments": raw}})
        finish = finish or ("tool_calls" if calls else "stop")
        ev.append(chunk({}, finish))
        ev.append((None, {"id": cid, "object": "chat.completion.chunk", "created": 1767225600,
                          "model": self.MODEL, "choices": [], "usage": usage}))
        if done:
            ev.append((None, "[DONE]"))
        if not stream:
            msg = {"role": "assistant", "content": text or None, "refusal": refusal}
            if tool_calls:
                msg["tool_calls"] = tool_calls
            return Answer(body={"id": cid, "object": "chat.completion", "created": 1767225600,
                                "model": self.MODEL, "choices": [{"index": 0, "message": msg,
                                                                  "finish_reason": finish}],
                                "usage": usage})
        return Answer(events=ev, headers={"x-ratelimit-remaining-requests": "98"})


# ---------------------------------------------------------------- Gemini

class GeminiFake(Fake):
    MODEL = "gemini-test-3"

    def __init__(self, key=KEY):
        super().__init__(key)
        self.issued = {}        # (name, args json) -> the thoughtSignatures issued on such a call

    def error(self, status, message, kind=None):
        return {"error": {"code": status, "message": message,
                          "status": {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED",
                                     429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                                     503: "UNAVAILABLE"}.get(status, "UNKNOWN")}}

    def check(self, req):
        p, h = [], req["headers"]
        if h.get("x-goog-api-key") != self.key:
            p.append("x-goog-api-key missing or wrong")
        if "key" in req["query"]:
            p.append("the key travelled in the URL")
        if req["method"] == "GET" and req["path"] == "/v1beta/models":
            return p
        stream = f"/v1beta/models/{self.MODEL}:streamGenerateContent"
        plain = f"/v1beta/models/{self.MODEL}:generateContent"
        if req["path"] == stream and req["query"].get("alt") != "sse":
            p.append("streamGenerateContent without alt=sse")
        if req["path"] not in (stream, plain) or req["method"] != "POST":
            return p + [f"no such route {req['method']} {req['path']}"]
        b = req["body"]
        if not isinstance(b, dict):
            return p + ["body is not a JSON object"]
        p += self.extra_fields(b, {"contents", "systemInstruction", "tools", "generationConfig"}, "body")
        p += self.extra_fields(b.get("generationConfig") or {}, set(), "generationConfig")
        for t in b.get("tools") or []:
            for fd in t.get("functionDeclarations") or []:
                if "parameters" in fd and "parametersJsonSchema" in fd:
                    p.append("parameters and parametersJsonSchema are mutually exclusive")
        prev_calls = []
        for n, c in enumerate(b.get("contents") or []):
            if c.get("role") not in ("user", "model"):
                p.append(f"content {n}: bad role {c.get('role')}")
            parts = c.get("parts") or []
            if not parts:
                p.append(f"content {n}: no parts")
            if c.get("role") == "model":
                prev_calls = [pt for pt in parts if "functionCall" in pt]
                for pt in prev_calls:
                    fc = pt["functionCall"]
                    want = self.issued.get((fc["name"], json.dumps(fc.get("args"), sort_keys=True)))
                    if want and pt.get("thoughtSignature") not in want:
                        p.append(f"content {n}: function call {fc['name']} is missing a thought "
                                 "signature")
            else:
                responses = [pt["functionResponse"] for pt in parts if "functionResponse" in pt]
                if responses and [r["name"] for r in responses] != \
                        [pc["functionCall"]["name"] for pc in prev_calls]:
                    p.append(f"content {n}: function responses do not answer the function calls")
        return p

    def turn(self, text="", thought=None, calls=(), finish="STOP", usage=None, blocked=None,
             stream=True):
        usage = usage or {"promptTokenCount": 50, "candidatesTokenCount": 14, "totalTokenCount": 70,
                          "thoughtsTokenCount": 6, "cachedContentTokenCount": 20}
        rid = f"resp-{next(self.ids)}"

        def chunk(parts, finish=None, final=False):
            cand = {"content": {"parts": parts, "role": "model"}, "index": 0}
            if finish:
                cand["finishReason"] = finish
                if finish == "MALFORMED_FUNCTION_CALL":
                    cand["finishMessage"] = "Malformed function call: write_file(path="
            out = {"candidates": [cand], "modelVersion": self.MODEL, "responseId": rid}
            out["usageMetadata"] = usage if final else {"promptTokenCount": usage["promptTokenCount"],
                                                        "totalTokenCount": usage["promptTokenCount"]}
            return (None, out)
        if blocked:
            ev = [(None, {"promptFeedback": {"blockReason": blocked}, "usageMetadata": usage,
                          "modelVersion": self.MODEL, "responseId": rid})]
            return Answer(events=ev) if stream else Answer(body=ev[0][1])
        ev, all_parts = [], []
        for t in pieces(thought or "", 12)[1:]:
            ev.append(chunk([{"text": t, "thought": True}]))
            all_parts.append({"text": t, "thought": True})
        for t in pieces(text, 8)[1:]:
            ev.append(chunk([{"text": t}]))
            all_parts.append({"text": t})
        call_parts = []
        for n, (name, args) in enumerate(calls):
            part = {"functionCall": {"name": name, "args": args}}
            if n == 0:    # Gemini 3: the first call of a turn carries the signature
                part["thoughtSignature"] = f"CiQB{next(self.ids)}sig=="
                self.issued.setdefault((name, json.dumps(args, sort_keys=True)), set()).add(
                    part["thoughtSignature"])
            call_parts.append(part)
        if call_parts:
            ev.append(chunk(call_parts))
            all_parts += call_parts
        sig_part = {"text": "", "thoughtSignature": f"CiQBtext{next(self.ids)}=="}
        ev.append(chunk([sig_part] if not call_parts and thought else [], finish, final=True))
        if not stream:
            merged = ev[-1][1]
            merged["candidates"][0]["content"]["parts"] = all_parts
            return Answer(body=merged)
        return Answer(events=ev)

    def models(self):
        return Answer(body={"models": [
            {"name": f"models/{self.MODEL}", "displayName": "Gemini Test 3",
             "supportedGenerationMethods": ["generateContent", "countTokens"]},
            {"name": "models/text-embedding-test", "displayName": "Embedding",
             "supportedGenerationMethods": ["embedContent"]}]})
