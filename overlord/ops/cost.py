"""Cost and budgets for the faces (`overlord cost ...`, `overlord users budget`, the web face's
usage meter): overlord/trust/cost.py through the service layer. docs/COST.md."""
import math
import re
import time

from overlord.errors import NotFound, UsageError
from overlord.trust import cost


def cost_report(by="model", since=None):
    """{"by", "since", "rows": [...], "total": {...}} from the whole ledger (trust/cost.report)."""
    rows = cost.report(by, since)
    total = {"calls": 0, **{k: 0 for k in cost.TOKEN_KEYS}, "tokens": 0, "usd": 0.0,
             "unpriced_calls": 0}
    for row in rows:
        for k in total:
            total[k] += row[k]
    total["usd"] = round(total["usd"], 10)
    return {"by": by, "since": since, "rows": rows, "total": total}


def cost_prices():
    """[{"model", "input", "output", "cache_read", "cache_write", "source"}] sorted by model."""
    return [dict(p, model=m) for m, p in sorted(cost.prices().items())]


def cost_set_price(model, input, output, cache_read=None, cache_write=None):
    """Set cost.json's price for model (USD per million tokens); audited cost.price."""
    entry = cost.set_price(model, input, output, cache_read, cache_write)
    return dict(entry, model=model)


def cost_budget(scope="config", clear=(), **lines):
    """The budget lines of a scope ("config" or "account:NAME"; an account must exist). With
    lines or clear: set them first (audited cost.budget). {"scope", "lines", "changed"}."""
    if scope != "config":
        if not isinstance(scope, str) or not scope.startswith("account:"):
            raise UsageError(f"not a budget scope: {scope!r} (config or account:NAME)")
        _account(scope[len("account:"):])
    unknown = sorted(set(lines) - set(cost.LINES))
    if unknown:
        raise UsageError(f"unknown budget line {unknown[0]!r} (known: {', '.join(cost.LINES)})")
    given = {k: v for k, v in lines.items() if v is not None}
    if not given and not clear:
        return {"scope": scope, "lines": cost.budget(scope), "changed": False}
    after = cost.set_budget(scope, clear=tuple(clear), **given)
    return {"scope": scope, "lines": after, "changed": True}


def _account(name):
    from overlord.trust import auth
    auth.check_name(name)
    if auth.get(name) is None:
        raise NotFound(f"no account {name} (`overlord users list` shows them)")
    return name


# -- the usage meter --------------------------------------------------------------------------

GROUPS = ("requests", "tokens", "input_tokens", "output_tokens")
_ANTHROPIC = re.compile(r"^anthropic-ratelimit-(requests|tokens|input-tokens|output-tokens)-"
                        r"(limit|remaining|reset)$")
_OPENAI = re.compile(r"^x-ratelimit-(limit|remaining|reset)-(requests|tokens)$")
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?"
                       r"(?:(\d+(?:\.\d+)?)ms)?$")


def _number(text):
    """An int or float when text is one (finite), else None."""
    t = str(text).strip()
    try:
        return int(t)
    except ValueError:
        pass
    try:
        v = float(t)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _epoch(text):
    """An RFC 3339 / ISO 8601 UTC time as seconds since the epoch, or None."""
    import datetime
    t = str(text).strip()
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _seconds(text):
    """OpenAI's reset durations ("6m0s", "1.5s", "20ms") in seconds, or None."""
    t = str(text).strip()
    if not t:
        return None
    m = _DURATION.match(t)
    if not m or not any(m.groups()):
        return None
    h, mi, s, ms = (float(g) if g else 0.0 for g in m.groups())
    return round(h * 3600 + mi * 60 + s + ms / 1000, 3)


def _value(text):
    n = _number(text)
    return n if n is not None else str(text)


def rate_reading(entry):
    """One provider's ratelimit.json entry in the meter's shape: {"at", "requests": {"limit",
    "remaining", "reset", "reset_seconds"?}, "tokens", "input_tokens", "output_tokens",
    "retry_after"} holding only the groups the provider sent; None when nothing usable."""
    headers = entry.get("headers") if isinstance(entry, dict) else None
    if not isinstance(headers, dict):
        return None
    at = entry.get("at") if isinstance(entry.get("at"), str) else None
    at_epoch = _epoch(at) if at else None
    out = {}
    for name, raw in headers.items():
        if not isinstance(name, str) or not isinstance(raw, (str, int, float)):
            continue
        name = name.lower()
        m = _ANTHROPIC.match(name)
        if m:
            group, field = m.group(1).replace("-", "_"), m.group(2)
        else:
            m = _OPENAI.match(name)
            if not m:
                continue
            field, group = m.group(1), m.group(2)
        slot = out.setdefault(group, {"limit": None, "remaining": None, "reset": None})
        slot[field] = _value(raw)
        if field == "reset":
            secs = None
            if isinstance(slot["reset"], (int, float)):
                secs = slot["reset"]
            else:
                secs = _seconds(raw)
                if secs is None and at_epoch is not None:
                    when = _epoch(raw)
                    secs = round(max(0.0, when - at_epoch), 3) if when is not None else None
            if secs is not None:
                slot["reset_seconds"] = secs
    retry = None
    if "retry-after-ms" in headers:
        n = _number(headers["retry-after-ms"])
        retry = n / 1000 if n is not None else None
    if retry is None and "retry-after" in headers:
        retry = _number(headers["retry-after"])
    if not out and retry is None:
        return None
    reading = {"at": at}
    for group in GROUPS:
        if group in out:
            reading[group] = out[group]
    reading["retry_after"] = retry
    return reading


def usage_meter(owner=None):
    """{"rate": {provider: reading}, "spend": {"day": {"spent", "limit", "source", "scope"},
    "month": {...}}} for the workspace rail: only providers with a real reading in
    ratelimit.json; limit None when no line is set."""
    from overlord.agent import ratelimit
    rate = {}
    for provider, entry in sorted(ratelimit.load().items()):
        reading = rate_reading(entry)
        if reading is not None:
            rate[provider] = reading
    return {"rate": rate, "spend": cost.meter_view(owner), "at": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
