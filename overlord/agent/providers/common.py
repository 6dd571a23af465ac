"""Small pieces every wire adapter shares: strict tool input, knobs, headers, ids, state."""
import hashlib
import json

from overlord.agent.providers.base import ProviderError
from overlord.agent.providers.http import Dropped

SECRET_HINTS = ("auth", "key", "token", "secret", "cookie")


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def tool_input(text):
    """(input dict, None) for a streamed tool input, or ({}, why) when it is not a JSON object.

    Strict: NaN/Infinity, trailing garbage and non-objects are refused. An empty input is {}
    (a tool that takes no arguments streams nothing).
    """
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}, None
    if not isinstance(text, str):
        return {}, f"tool input is not a JSON object: {snippet(text)}"
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except ValueError as e:
        return {}, f"tool input is not valid JSON ({e}): {snippet(text)}"
    if not isinstance(value, dict):
        return {}, f"tool input is not a JSON object: {snippet(text)}"
    return value, None


def snippet(text, n=120):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


def loads(data):
    """An event's JSON payload; a garbled one counts as a broken stream (retried)."""
    try:
        return json.loads(data)
    except ValueError:
        raise Dropped(f"garbled event: {snippet(data, 60)}") from None


def knobs(**pairs):
    """The pairs whose value is set: an unset knob is never sent."""
    return {k: v for k, v in pairs.items() if v is not None}


def need_model(endpoint):
    if not endpoint.model:
        raise ProviderError(f"{endpoint.provider}: no model given (pass --model)")
    return endpoint.model


def base_url(endpoint, default):
    url = endpoint.base_url or default
    if not url:
        raise ProviderError(f"{endpoint.provider}: no base URL given (pass --base-url)")
    return url.rstrip("/")


def headers(endpoint, own):
    """Our headers, then the endpoint's extra headers over them (names compared case-blind)."""
    out = {k.lower(): v for k, v in own.items() if v is not None}
    for k, v in (endpoint.headers or {}).items():
        out[k.lower()] = v
    return out


def secrets(endpoint):
    """What must never appear in an error: the key and any credential-like extra header."""
    found = [endpoint.api_key] if endpoint.api_key else []
    for k, v in (endpoint.headers or {}).items():
        if any(h in k.lower() for h in SECRET_HINTS) and v:
            found.append(str(v))
            found.extend(p for p in str(v).split() if len(p) >= 8)   # "Bearer <token>"
    return found


def own_state(message, provider):
    """A message's opaque state if this provider wrote it, else None (never replay another's)."""
    state = message.get("state")
    if isinstance(state, dict) and state.get("provider") == provider:
        return state
    return None


def result_text(result):
    text = result.get("content")
    text = text if isinstance(text, str) else json.dumps(text)
    return ("Error: " + text) if result.get("is_error") else text


def usage(input_tokens=None, output_tokens=None, cache_read=None, cache_write=None,
          reasoning=None, context=None):
    """Normalized usage. context_tokens is what the prompt filled of the window (cache included)."""
    out = {"input_tokens": input_tokens or 0, "output_tokens": output_tokens or 0}
    extra = knobs(cache_read_tokens=cache_read, cache_write_tokens=cache_write,
                  reasoning_tokens=reasoning)
    out.update(extra)
    out["context_tokens"] = context if context is not None else out["input_tokens"]
    return out


def call_ids(messages, prefix, count):
    """`count` call ids for the next turn, deterministic and unique across the conversation:
    the turn number plus a digest of everything said so far (so a dropped, compacted history
    cannot bring an old id back)."""
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()
    return [f"{prefix}_{turn}_{i}_{digest[:8]}" for i in range(count)]


def strict_ok(schema):
    """Whether a JSON schema already meets OpenAI's strict mode (every object closed and every
    property required); only then is strict asked for, never by rewriting the tool's schema."""
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or []) != set(props):
            return False
        return all(strict_ok(v) for v in props.values())
    if "items" in schema:
        return strict_ok(schema["items"])
    return True
