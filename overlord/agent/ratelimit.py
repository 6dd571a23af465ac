"""What each provider last said about its rate limits, kept in OVERLORD_HOME/ratelimit.json.

record(provider, headers) is the on_headers callback of a provider call: the rate-limit headers
(anthropic-ratelimit-*, x-ratelimit-*, retry-after) are merged into the provider's entry with the
time they were seen. Best effort: a meter that cannot be written never fails a model call.
"""
import json
import os
import time

from overlord.agent import keys
from overlord.txn import store

PREFIXES = ("anthropic-ratelimit-", "x-ratelimit-")
NAMES = ("retry-after", "retry-after-ms")


def path():
    return os.path.join(store.home(), "ratelimit.json")


def load():
    try:
        with open(path(), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record(provider, headers):
    seen = {k.lower(): str(v) for k, v in (headers or {}).items()
            if k.lower().startswith(PREFIXES) or k.lower() in NAMES}
    if not seen:
        return
    try:
        with keys.locked(path()):
            data = load()
            entry = data.get(provider) if isinstance(data.get(provider), dict) else {}
            merged = dict(entry.get("headers") or {})
            merged.update(seen)
            data[provider] = {"headers": merged, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            keys.write_private(path(), data)
    except OSError:
        pass
