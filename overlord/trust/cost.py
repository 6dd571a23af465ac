"""What the models cost: prices, the ledger, running totals and budget lines (docs/COST.md).

One writer of three records under OVERLORD_HOME:

    ledger.jsonl          one JSON line per model call (turn, compaction, review), appended
                          whole and fsynced, mode 0600: the record of truth
    spend.json            a cache of running totals {"offset": ledger bytes covered,
                          "day": {"YYYY-MM-DD": {scope: usd}}, "month": {"YYYY-MM": {scope: usd}}}
                          (UTC; scopes "*" the machine, "account:<name>", "target:<sha256[:32]>")
    sessions/<sid>/cost.json
                          a session's running total {"offset", "calls", "input_tokens",
                          "output_tokens", "cache_read_tokens", "cache_write_tokens", "tokens",
                          "usd", "unpriced": [models]}
    cost.json             prices and budget lines (0600): {"prices": {model: {input, output,
                          cache_read, cache_write}}, "budget": {LINES}, "accounts": {name: {LINES}}}

Charging holds an flock on OVERLORD_HOME/ledger.lock: append the line (fsync), then fold every
ledger line between spend.json's offset and the new end into the session files (first) and
spend.json (last), each written by atomic rename. Normally that is the one line just written;
after a crash between the append and the folds, the lines missed too. A session file counts
every line of its session that starts before its own offset, so a line is never counted twice.
A spend.json or session file that cannot be parsed (or claims more of the ledger than there is)
is rebuilt from the ledger, not trusted; a damaged ledger line is skipped in totals and reports.

Checking a budget is O(1) in the ledger's size: spend.json + the session's file + a stat of the
ledger (under a shared flock, so a half-done fold is never seen); lines past spend.json's offset
(a writer that crashed before its fold) are folded in memory.

Tokens: the ledger's input_tokens is the prompt's uncached part. Anthropic reports it so;
OpenAI (chat and responses, Azure, OpenAI-compatible servers) and Gemini count cached tokens
inside their prompt figure, so for those providers cache_read_tokens is subtracted once here
(INPUT_INCLUDES_CACHE) -- never priced twice. A usage dict may say so itself with
"cache_included": true/false. A session's "tokens" = input + output + cache_read + cache_write.

Prices are USD per million tokens. A model matches its own entry, else the longest listed
prefix (dated ids match their family). Cache reads and writes are priced by their own rates; a
component with tokens but no rate leaves the call priced in part: "usd" is what could be priced
(a lower bound, so a dollar budget still counts it), "priced" false and "unpriced_parts" names
the components. A model with no price at all: "usd" null, "priced" false. Either way the
session's "unpriced" lists the model, and tokens are always counted.
"""
import copy
import dataclasses
import datetime
import errno
import fcntl
import functools
import hashlib
import json
import math
import os
import stat
import time

from overlord.errors import OverlordError, UsageError
from overlord.text import escape_path
from overlord.txn import store

LEDGER, SPEND, CONFIG, LOCK, SESSION_FILE = "ledger.jsonl", "spend.json", "cost.json", \
    "ledger.lock", "cost.json"
KINDS = ("turn", "compaction", "review")
PARTS = ("input", "output", "cache_read", "cache_write")
TOKEN_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
LINES = ("session_tokens", "session_usd", "day_usd", "month_usd")
INPUT_INCLUDES_CACHE = ("openai", "azure", "openai-compatible", "gemini")
KEEP_DAYS, KEEP_MONTHS = 3, 3          # spend.json keeps recent periods only (a report reads the ledger)

# List prices, USD per million tokens, as the providers published them (checked 2025-11; the
# cache_write rate is Anthropic's 5-minute cache write; OpenAI and Gemini bill no cache write and
# report none; Gemini 2.5 Pro at its <=200k-token prompt tier). cost.json overrides any of them.
DEFAULT_PRICES = {
    "claude-opus-4-5": (5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-1": (15.00, 75.00, 1.50, 18.75),
    "claude-opus-4": (15.00, 75.00, 1.50, 18.75),
    "claude-sonnet-4-5": (3.00, 15.00, 0.30, 3.75),
    "claude-sonnet-4": (3.00, 15.00, 0.30, 3.75),
    "claude-3-7-sonnet": (3.00, 15.00, 0.30, 3.75),
    "claude-haiku-4-5": (1.00, 5.00, 0.10, 1.25),
    "claude-3-5-haiku": (0.80, 4.00, 0.08, 1.00),
    "gpt-5": (1.25, 10.00, 0.125, 0.0),
    "gpt-5-mini": (0.25, 2.00, 0.025, 0.0),
    "gpt-5-nano": (0.05, 0.40, 0.005, 0.0),
    "gpt-4.1": (2.00, 8.00, 0.50, 0.0),
    "gpt-4.1-mini": (0.40, 1.60, 0.10, 0.0),
    "gpt-4.1-nano": (0.10, 0.40, 0.025, 0.0),
    "gpt-4o": (2.50, 10.00, 1.25, 0.0),
    "gpt-4o-mini": (0.15, 0.60, 0.075, 0.0),
    "o1": (15.00, 60.00, 7.50, 0.0),
    "o3": (2.00, 8.00, 0.50, 0.0),
    "o3-mini": (1.10, 4.40, 0.55, 0.0),
    "o4-mini": (1.10, 4.40, 0.275, 0.0),
    "gemini-2.5-pro": (1.25, 10.00, 0.31, 0.0),
    "gemini-2.5-flash": (0.30, 2.50, 0.075, 0.0),
    "gemini-2.5-flash-lite": (0.10, 0.40, 0.025, 0.0),
}
MAX_MODEL = 200
MAX_PRICE = 1e6                 # USD per million tokens: a price above it is a typo, refused
MAX_CALL_TOKENS = 10 ** 9       # per kind per call: far past any context window, far below 2**53


# -- small helpers ------------------------------------------------------------------------------

_homes = {}         # an absolute OVERLORD_HOME -> {name: its path} (no abspath/join per call)


def _path(name):
    env = os.environ.get("OVERLORD_HOME")
    if not env or not env.startswith("/"):         # relative, jailed or ~: as store says, each time
        return os.path.join(store.home(), name)
    paths = _homes.get(env)
    if paths is None:
        if len(_homes) > 64:
            _homes.clear()
        paths = _homes[env] = {"": store.home()}
    elif len(paths) > 4096:
        paths.clear()
        paths[""] = store.home()
    got = paths.get(name)
    if got is None:
        got = paths[name] = os.path.join(paths[""], name)
    return got


def _finite(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _now():
    return time.time()


def _iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@functools.lru_cache(maxsize=4096)
def target_scope(target):
    return "target:" + hashlib.sha256(os.fsencode(target)).hexdigest()[:32]


def money(usd):
    """$2.03, $0.0421: cents above a dollar, four places below."""
    if usd is None:
        return "unpriced"
    return f"${usd:,.2f}" if abs(usd) >= 1 else f"${usd:.4f}"


def _shown(value):
    text = value if isinstance(value, str) else json.dumps(value)
    return escape_path(text if len(text) <= 60 else text[:57] + "...")


class _Locked:
    """An flock on OVERLORD_HOME/ledger.lock (exclusive for writers, shared for readers)."""

    def __init__(self, shared=False):
        self.mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX

    def __enter__(self):
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.fd = os.open(_path(LOCK), flags, 0o600)
        except FileNotFoundError:
            store.ensure_home()
            self.fd = os.open(_path(LOCK), flags, 0o600)
        fcntl.flock(self.fd, self.mode)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


# -- cost.json: prices and budget lines ---------------------------------------------------------

def _config_error(path, what):
    return OverlordError(f"cost {escape_path(path)}: {what}")


def _load_config():
    """cost.json as {"prices", "budget", "accounts"} (empty when there is none). A file that is
    not ours, is writable by others or does not parse raises OverlordError: its lines are not
    guessed at. The caller's own copy (it may change it)."""
    return copy.deepcopy(_config())


_EMPTY_CONFIG = {"prices": {}, "budget": {}, "accounts": {}}


def _config():
    """cost.json as _load_config reads it, shared: never to be changed by the caller. Opened
    and checked (ours, not writable by others) and read every time; parsed and validated only
    when its bytes differ from the last ones parsed at that path."""
    from overlord.trust import audit
    path = _path(CONFIG)
    opened = audit.open_owned(path, os.O_RDONLY, _config_error, 0o022, "write",
                              fix="chmod 600 it", root_ok=True)
    if opened is None:
        return _EMPTY_CONFIG
    fd, st = opened
    try:
        data = b""
        while len(data) <= 1 << 22:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    hit = _config_cache.get(path)
    if hit is not None and hit[0] == data:
        return hit[1]
    empty = _EMPTY_CONFIG
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _config_error(path, f"not valid JSON ({exc}); fix or remove it") from None
    if not isinstance(doc, dict):
        raise _config_error(path, "must be a JSON object")
    out = {}
    for key in empty:
        value = doc.get(key, {})
        if not isinstance(value, dict):
            raise _config_error(path, f"{key} must be an object")
        out[key] = value
    for model, p in out["prices"].items():
        try:
            _check_price_entry(p)
        except UsageError as exc:
            raise _config_error(path, f"prices[{_shown(model)}]: {exc}") from None
    try:
        check_lines(out["budget"], "budget")
        for name, lines in out["accounts"].items():
            check_lines(lines, f"accounts[{_shown(name)}]")
    except UsageError as exc:
        raise _config_error(path, str(exc)) from None
    if len(_config_cache) > 16:
        _config_cache.clear()
    _config_cache[path] = (data, out)
    return out


_config_cache = {}       # cost.json's path -> (the bytes last parsed there, the doc)


def _save_config(doc):
    store.ensure_home()
    store.write_json_atomic(_path(CONFIG), doc, mode=0o600, indent=2)


def _check_price_entry(p):
    if not isinstance(p, dict):
        raise UsageError("must be an object {input, output, cache_read, cache_write}")
    for k in p:
        if k not in PARTS:
            raise UsageError(f"unknown price {_shown(k)} (known: {', '.join(PARTS)})")
    for k in ("input", "output"):
        if k not in p:
            raise UsageError(f"needs an {k} price")
    for k, v in p.items():
        if v is None and k in ("cache_read", "cache_write"):
            continue
        if not _finite(v) or v < 0 or v > MAX_PRICE:
            raise UsageError(f"{k} must be a finite number of USD per million tokens from 0 to "
                             f"{MAX_PRICE:,.0f}, not {_shown(v)}")


def check_model(model):
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL \
            or any(c.isspace() or not c.isprintable() for c in model):
        raise UsageError(f"not a model id: {_shown(model)} (printable, no spaces, up to "
                         f"{MAX_MODEL} characters)")
    return model


def check_lines(lines, where="budget"):
    """Budget lines {key: value}: session_tokens a whole number >= 0, the *_usd finite >= 0;
    an unknown key refused. Returns a copy."""
    if not isinstance(lines, dict):
        raise UsageError(f"{where} must be an object of {', '.join(LINES)}")
    out = {}
    for key, value in lines.items():
        if key not in LINES:
            raise UsageError(f"{where}: unknown budget line {_shown(key)} (known: {', '.join(LINES)})")
        if key == "session_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{where}.{key} must be a whole number of tokens >= 0, not "
                                 f"{_shown(value)}")
        elif not _finite(value) or value < 0:
            raise UsageError(f"{where}.{key} must be a finite number of USD >= 0, not {_shown(value)}")
        out[key] = value
    return out


def _entry(values):
    return dict(zip(PARTS, values))


_DEFAULTS = {m: dict(_entry(v), source="default") for m, v in DEFAULT_PRICES.items()}


def prices(config=None):
    """{model: {input, output, cache_read, cache_write, "source": "default"|"cost.json"}}."""
    out = dict(_DEFAULTS)
    for model, p in (_load_config() if config is None else config)["prices"].items():
        out[model] = dict({k: p.get(k) for k in PARTS}, source="cost.json")
    return out


_table_cache = [None, None]      # [the config doc, prices(that doc)]: a charge's price table


def _table():
    """prices() of cost.json as it is now, shared (never changed by the caller)."""
    config = _config()
    if _table_cache[0] is not config:
        _table_cache[1] = prices(config)
        _table_cache[0] = config
    return _table_cache[1]


def price(model, table=None):
    """The price entry for model (exact id, else the longest listed prefix), with "match" (the
    entry's name) and "source"; None when unpriced."""
    table = prices() if table is None else table
    if not isinstance(model, str) or not model:
        return None
    name = model if model in table else max((m for m in table if model.startswith(m)),
                                             key=len, default=None)
    if name is None:
        return None
    return dict(table[name], match=name)


def set_price(model, input, output, cache_read=None, cache_write=None):
    """Set (replace) cost.json's price for model; audited as cost.price. Returns the entry."""
    from overlord.trust import audit
    check_model(model)
    entry = {"input": input, "output": output}
    if cache_read is not None:
        entry["cache_read"] = cache_read
    if cache_write is not None:
        entry["cache_write"] = cache_write
    _check_price_entry(entry)
    audit.ready()
    with _Locked():
        doc = _load_config()
        doc["prices"][model] = entry
        _save_config(doc)
    audit.append("cost.price", model=model, **entry)
    return dict(entry)


def _scope_doc(doc, scope):
    if scope == "config":
        return doc["budget"]
    if isinstance(scope, str) and scope.startswith("account:") and len(scope) > 8:
        return doc["accounts"].setdefault(scope[8:], {})
    raise UsageError(f"not a budget scope: {_shown(scope)} (config or account:NAME)")


def budget(scope="config"):
    """The lines set for a scope ("config" or "account:NAME")."""
    doc = _load_config()
    return dict(_scope_doc(doc, scope))


def set_budget(scope="config", clear=(), **lines):
    """Set lines for a scope: a value replaces the line (0 is a line of zero: nothing may be
    spent), None leaves it, a key in `clear` removes it. Audited as cost.budget. Returns the
    scope's lines after."""
    from overlord.trust import audit
    given = {k: v for k, v in lines.items() if v is not None}
    check_lines(given, "budget")
    for key in clear:
        if key not in LINES:
            raise UsageError(f"unknown budget line {_shown(key)} (known: {', '.join(LINES)})")
    both = sorted(set(given) & set(clear))
    if both:
        raise UsageError(f"{both[0]} is both set and cleared")
    _scope_doc({"budget": {}, "accounts": {}}, scope)           # a bad scope, before anything
    audit.ready()
    with _Locked():
        doc = _load_config()
        mine = _scope_doc(doc, scope)
        mine.update(given)
        for key in clear:
            mine.pop(key, None)
        if scope != "config" and not mine:
            doc["accounts"].pop(scope[8:], None)
        after = dict(mine)
        _save_config(doc)
    audit.append("cost.budget", scope=scope, set=given, cleared=sorted(clear))
    return after


# -- pricing one call ---------------------------------------------------------------------------

def _count(value):
    """A token count as the ledger keeps it: a whole number from 0 to MAX_CALL_TOKENS (a
    reply claiming 1e308 tokens is counted at the ceiling -- never as inf, never as 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return MAX_CALL_TOKENS if value > 0 else 0       # +inf at the ceiling; nan, -inf none
    if value >= MAX_CALL_TOKENS:
        return MAX_CALL_TOKENS
    return max(0, int(value))


def normalize(provider, usage):
    """The four token counts of a normalized provider usage dict (providers/common.usage), the
    prompt's cached part taken out of input_tokens for the providers that count it inside."""
    usage = usage if isinstance(usage, dict) else {}
    out = {k: _count(usage.get(k)) for k in TOKEN_KEYS}
    included = usage.get("cache_included")
    if not isinstance(included, bool):
        included = provider in INPUT_INCLUDES_CACHE
    if included:
        out["input_tokens"] = max(0, out["input_tokens"] - out["cache_read_tokens"]
                                  - out["cache_write_tokens"])
    return out


def priced(model, counts, table=None):
    """(usd or None, priced: bool, unpriced_parts: [part])."""
    p = price(model, table)
    if p is None:
        return None, False, [k for k in PARTS if counts[f"{k}_tokens"]] or list(PARTS)
    usd, missing = 0.0, []
    for part in PARTS:
        n = counts[f"{part}_tokens"]
        if not n:
            continue
        rate = p.get(part)
        if rate is None:
            missing.append(part)
            continue
        usd += n * rate / 1e6
    return round(usd, 10), not missing, missing


def line_for(sid, target, owner, kind, provider, model, usage, ts=None, table=None,
             requested=None):
    """The ledger line one call writes (not written). model: the id the reply named;
    requested: the id the call asked for. The reply's id is a string the provider (or anything
    between) chooses, so it cannot make a call cheaper than the model asked for: when both are
    priced the dearer price is used, when only one is, that one; "priced_as" then names the
    price entry used."""
    if kind not in KINDS:
        raise ValueError(f"unknown ledger kind {kind!r} (one of {', '.join(KINDS)})")
    table = prices() if table is None else table
    counts = normalize(provider, usage)
    usd, ok, missing = priced(model, counts, table)
    as_ = None
    if isinstance(requested, str) and requested and requested != model:
        r_usd, r_ok, r_missing = priced(requested, counts, table)
        if r_usd is not None and (usd is None or r_usd > usd):
            usd, ok, missing, as_ = r_usd, r_ok, r_missing, price(requested, table)["match"]
    if usd is not None and not _finite(usd):
        raise ValueError("a call priced at a non-finite amount")      # cannot happen: clamped
    line = {"ts": _iso(_now() if ts is None else ts), "sid": sid, "account": owner,
            "kind": kind, "provider": provider, "model": model, **counts,
            "usd": usd, "priced": ok, "target": os.fspath(target) if target is not None else None}
    if as_ is not None:
        line["priced_as"] = as_
    if missing and usd is not None:
        line["unpriced_parts"] = missing
    return line


# -- totals -------------------------------------------------------------------------------------

def _zero():
    return {"offset": 0, "calls": 0, "input_tokens": 0, "output_tokens": 0,
            "cache_read_tokens": 0, "cache_write_tokens": 0, "tokens": 0, "usd": 0.0,
            "unpriced": []}


def _add_session(tot, line):
    tot["calls"] += 1
    n = 0
    for k in TOKEN_KEYS:
        v = _count(line.get(k))
        tot[k] += v
        n += v
    tot["tokens"] += n
    if _finite(line.get("usd")):
        tot["usd"] = tot["usd"] + line["usd"]
    if not line.get("priced") and isinstance(line.get("model"), str) \
            and line["model"] not in tot["unpriced"]:
        tot["unpriced"] = sorted(tot["unpriced"] + [line["model"]])


def _scopes(line):
    out = ["*"]
    if isinstance(line.get("account"), str) and line["account"]:
        out.append("account:" + line["account"])
    if isinstance(line.get("target"), str) and line["target"]:
        out.append(target_scope(line["target"]))
    return out


def _period(line):
    ts = line.get("ts")
    if not isinstance(ts, str) or len(ts) < 10:
        return None, None
    return ts[:10], ts[:7]


def _add_spend(spend, line, touched=None):
    usd = line.get("usd")
    if not _finite(usd) or not usd:
        return
    day, month = _period(line)
    if day is None:
        return
    per_day = spend["day"].get(day)
    if per_day is None:
        per_day = spend["day"][day] = {}
    per_month = spend["month"].get(month)
    if per_month is None:
        per_month = spend["month"][month] = {}
    for scope in _scopes(line):
        per_day[scope] = per_day.get(scope, 0.0) + usd
        per_month[scope] = per_month.get(scope, 0.0) + usd
        if touched is not None:
            touched.append((per_day, scope))
            touched.append((per_month, scope))


_kept = {}          # today's date -> (the days, the months spend.json keeps)


def _keep(now=None):
    when = _now() if now is None else now
    key = time.strftime("%Y-%m-%d", time.gmtime(when))
    if key not in _kept:
        today = datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
        days = {(today - datetime.timedelta(days=i)).strftime("%Y-%m-%d") for i in range(KEEP_DAYS)}
        months, y, m = set(), today.year, today.month
        for _ in range(KEEP_MONTHS):
            months.add(f"{y:04d}-{m:02d}")
            y, m = (y, m - 1) if m > 1 else (y - 1, 12)
        _kept.clear()
        _kept[key] = (days, months)
    return _kept[key]


def _trim(spend, now=None):
    days, months = _keep(now)
    spend["day"] = {k: v for k, v in spend["day"].items() if k in days}
    spend["month"] = {k: v for k, v in spend["month"].items() if k in months}


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _amount(value):
    return _finite(value) and value >= 0


def _valid_spend(doc):
    """A spend.json whose every figure could have come from the ledger (an offset, finite
    sums >= 0); anything else is rebuilt, however well sealed."""
    if not isinstance(doc, dict) or not _whole(doc.get("offset")):
        return False
    for period in ("day", "month"):
        table = doc.get(period)
        if not isinstance(table, dict):
            return False
        for scopes in table.values():
            if not isinstance(scopes, dict):
                return False
            for v in scopes.values():
                if not (type(v) is float and 0.0 <= v < math.inf) and not _amount(v):
                    return False
    return True


def _valid_session(doc):
    if not isinstance(doc, dict) or not _whole(doc.get("offset")):
        return False
    if not all(_whole(doc.get(k)) for k in ("calls", "tokens") + TOKEN_KEYS):
        return False
    if doc["tokens"] != sum(doc[k] for k in TOKEN_KEYS):
        return False
    return _amount(doc.get("usd")) and isinstance(doc.get("unpriced"), list) \
        and all(isinstance(m, str) for m in doc["unpriced"])


def _fresh(doc):
    """A copy of a cache's doc deep enough to fold into (spend: period -> day -> scope)."""
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            v = {kk: dict(vv) if isinstance(vv, dict) else vv for kk, vv in v.items()}
        elif isinstance(v, list):
            v = list(v)
        out[k] = v
    return out


_parsed = {}        # a cache file's path -> (the bytes last read or written there, their doc)


def _remember(path, data, doc):
    if len(_parsed) > 256:
        _parsed.clear()
    _parsed[path] = [data, _fresh(doc), None]       # None: not yet validated


def _read_json(path, valid=None):
    """(a cache's doc, state): state "ok", "missing" or "damaged" (unreadable, not a regular
    file of ours, not JSON, or its digest does not match: a torn write). The file is opened,
    checked and read every time; its bytes are unsealed and parsed only when they differ from
    the last ones this process read or wrote at that path. The doc is the caller's own.
    valid: a check of the doc (run once per bytes read); a doc failing it is "damaged"."""
    try:
        fd = _open_cache(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, "missing"
    except OSError:
        return None, "damaged"
    if fd is None:
        return None, "damaged"
    try:
        data = b""
        while len(data) < 1 << 24:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        hit = _parsed.get(path)
        if hit is None or hit[0] != data:
            doc = _unsealed(data)
            if doc is None:
                return None, "damaged"
            _remember(path, data, doc)
            hit = _parsed[path]
    except (OSError, ValueError, UnicodeDecodeError):
        return None, "damaged"
    finally:
        os.close(fd)
    if valid is not None:
        if hit[2] is None:
            hit[2] = bool(valid(hit[1]))
        if not hit[2]:
            return None, "damaged"
    return _fresh(hit[1]), "ok"


def _ledger_fd():
    try:
        return os.open(_path(LEDGER), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None


def _boundary_ok(fd, offset, size):
    """offset is within the ledger and at a line's start."""
    if offset > size:
        return False
    return offset == 0 or os.pread(fd, 1, offset - 1) == b"\n"


_decode = json.JSONDecoder().decode


class _Lines:
    """The whole ledger lines in [start, end) of fd, read in 1 MiB chunks and yielded as
    (offset, line dict) one at a time (a million lines are never held at once); damaged lines
    skipped. After the loop, .upto is the offset after the last whole line."""

    def __init__(self, fd, start, end):
        self.fd, self.start, self.end, self.upto = fd, start, end, start

    def __iter__(self):
        pos, rest = self.start, b""
        while pos < self.end:
            data = os.pread(self.fd, min(1 << 20, self.end - pos), pos)
            if not data:
                break
            buf = rest + data
            base = pos - len(rest)
            pos += len(data)
            at = 0
            while True:
                nl = buf.find(b"\n", at)
                if nl < 0:
                    break
                try:
                    rec = _decode(buf[at:nl].decode("utf-8"))
                except ValueError:              # UnicodeDecodeError too
                    rec = None
                if isinstance(rec, dict):
                    yield base + at, rec
                at = nl + 1
                self.upto = base + at
            rest = buf[at:]


_SEAL = b'{"sha256":"'            # a cache begins {"sha256":"<32 hex>", then the rest of its JSON


def _sealed(doc):
    """The cache's bytes: its JSON with the digest of that JSON first."""
    body = json.dumps({k: v for k, v in doc.items() if k != "sha256"}, sort_keys=True,
                      separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest()[:32].encode()
    return _SEAL + digest + b'",' + body[1:] + b"\n"


def _unsealed(data):
    """The doc of a cache's bytes, or None unless the digest matches what follows it."""
    head = len(_SEAL) + 32
    if not data.startswith(_SEAL) or data[head:head + 2] != b'",':
        return None
    body = b"{" + data[head + 2:].rstrip(b"\n")
    if hashlib.sha256(body).hexdigest()[:32].encode() != data[len(_SEAL):head]:
        return None
    doc = json.loads(body.decode("utf-8"))
    return doc if isinstance(doc, dict) else None


def _open_cache(path, flags):
    """A cache file opened never through a symlink, never blocking on a FIFO; None when it is
    not a regular file of ours (the writer replaces it; a reader rebuilds)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def _write_cache(path, doc):
    """A rebuildable cache rewritten in place under the exclusive lock (readers hold the shared
    one, so none sees it half-written), mode 0600, no fsync: the ledger it is folded from is
    the durable record. It carries its own digest, so a write a crash cut short reads as
    damaged and is rebuilt from the ledger -- never trusted. (In place rather than by rename:
    a rename over the old file costs as much as the fsync of the ledger line itself.)"""
    data = _sealed(doc)
    for attempt in (0, 1):
        try:
            fd = _open_cache(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            if attempt or exc.errno not in (errno.ELOOP, errno.EACCES, errno.ENXIO):
                raise
            fd = None
        if fd is not None:
            break
        os.unlink(path)                  # a symlink, a FIFO or someone else's file: not ours
    try:
        os.fchmod(fd, 0o600)
        view, at = memoryview(data), 0
        while at < len(data):
            at += os.pwrite(fd, view[at:], at)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    _remember(path, data, {k: v for k, v in doc.items() if k != "sha256"})   # as it reads back


def _session_dir(sid):
    """store.session_dir(sid) (the id checked), its path kept per OVERLORD_HOME."""
    return _path("sessions/" + store.check_sid(sid))


def _session_path(sid):
    return _path("sessions/" + store.check_sid(sid) + "/" + SESSION_FILE)


def _rebuild_session(fd, sid, end):
    tot = _zero()
    if fd is not None:
        for _, line in _Lines(fd, 0, end):
            if line.get("sid") == sid:
                _add_session(tot, line)
    tot["offset"], tot["usd"] = end, round(tot["usd"], 10)
    return tot


def _load_session(fd, sid, size):
    """A session's cost doc as recorded (zeros when none), rebuilt from the ledger when damaged
    or when it claims past the ledger's end. (doc, rebuilt: bool)."""
    doc, state = _read_json(_session_path(sid), _valid_session)
    if state == "missing":
        return _zero(), False
    if state == "ok" and (fd is None and doc["offset"] == 0 or
                                                  fd is not None and _boundary_ok(fd, doc["offset"], size)):
        return doc, False
    return _rebuild_session(fd, sid, size), True


def _load_spend(fd, size):
    """(spend.json as recorded, True), or (the empty cache at offset 0, False) when it is
    missing, damaged or claims past the ledger's end: the fold then rebuilds it from the whole
    ledger."""
    doc, state = _read_json(_path(SPEND), _valid_spend)
    if state == "ok" and (fd is None and doc["offset"] == 0 or
                                                fd is not None and _boundary_ok(fd, doc["offset"], size)):
        return doc, True
    return {"offset": 0, "day": {}, "month": {}}, size == 0


def _fold(spend, sessions, fd, end, load_session):
    """Fold the ledger lines from spend's offset to end into spend and the session docs
    (sessions: sid -> doc, loaded through load_session(sid) on first sight). Returns the
    offset folded to."""
    lines = _Lines(fd, spend["offset"], end) if fd is not None else ()
    # a short fold (a charge: its own line) rounds the sums it changed; the others were
    # rounded when the cache was written. A long one (a rebuild) rounds them all at the end.
    touched = [] if fd is not None and end - spend["offset"] <= 1 << 16 else None
    unseen = object()
    for at, line in lines:
        _add_spend(spend, line, touched)
        sid = line.get("sid")
        if isinstance(sid, str):
            doc = sessions.get(sid, unseen)
            if doc is unseen:
                doc = sessions[sid] = load_session(sid) if store.SID_RE.match(sid) else None
            if doc is not None and at >= doc["offset"]:
                _add_session(doc, line)
    upto = lines.upto if fd is not None else spend["offset"]
    spend["offset"] = upto
    _round(spend, sessions, touched)
    return upto


def _round(spend, sessions, touched=None):
    """Sums kept to 1e-10 (folded unrounded: a rebuild adds a million lines). touched: the
    (per-period table, scope) sums changed, when only those need it."""
    if touched is not None:
        for per, scope in touched:
            per[scope] = round(per[scope], 10)
    else:
        for period in ("day", "month"):
            for per in spend[period].values():
                for scope, usd in per.items():
                    per[scope] = round(usd, 10)
    for doc in sessions.values():
        if doc is not None:
            doc["usd"] = round(doc["usd"], 10)


def _append(fd_w, line):
    """Append one whole line (terminating a torn last line first), fsynced; strict JSON (a
    non-finite number is refused before anything is written)."""
    data = (json.dumps(line, sort_keys=True, allow_nan=False) + "\n").encode()
    size = os.fstat(fd_w).st_size
    if size and os.pread(fd_w, 1, size - 1) != b"\n":
        data = b"\n" + data                     # a crash's fragment stays one damaged line
    store.write_all(fd_w, data)
    os.fsync(fd_w)


def _settle(fd, before, end, want=None):
    """Under the exclusive lock: fold the ledger from spend.json's offset to end into spend and
    the session files (want: a session whose file is loaded -- rebuilt when damaged -- and
    written whatever the fold finds), then write them: sessions first, spend.json last (see
    the module docstring). before: the ledger's size the caches were checked against.
    Returns (spend, {sid: doc})."""
    spend = _load_spend(fd, before)[0]
    sessions = {}

    def load(sid):
        if not os.path.isdir(_session_dir(sid)):
            return None                     # no record to keep a total on
        return _load_session(fd, sid, before)[0]
    if want is not None:
        sessions[want] = load(want)
    upto = _fold(spend, sessions, fd, end, load)
    for sid, doc in sessions.items():
        if doc is not None:
            doc["offset"] = max(upto, doc["offset"])
            try:
                _write_cache(_session_path(sid), doc)
            except FileNotFoundError:       # the session was removed meanwhile
                pass
    _trim(spend)
    _write_cache(_path(SPEND), spend)
    return spend, sessions


def record(line):
    """Append a ledger line and fold the totals (see the module docstring). Returns the line."""
    with _Locked():
        path = _path(LEDGER)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            before = os.fstat(fd).st_size
            _append(fd, line)
            _settle(fd, before, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    return line


def _repair(sid):
    """Rebuild what a check found untrustworthy (a damaged spend.json or session file), under
    the exclusive lock, so the next check is O(1) again."""
    with _Locked():
        fd = _ledger_fd()
        if fd is None:
            return {"offset": 0, "day": {}, "month": {}}, _zero()
        try:
            size = os.fstat(fd).st_size
            spend, sessions = _settle(fd, size, size, want=sid)
            doc = sessions.get(sid) if sid is not None else None
            if sid is not None and doc is None:         # no session record: not kept on disk
                doc = _rebuild_session(fd, sid, size)
            return spend, doc
        finally:
            os.close(fd)


def _snapshot(sid=None):
    """(spend, session doc or None) as of now, O(1): under a shared lock, the caches plus any
    lines past spend.json's offset folded in memory. A cache that cannot be trusted is rebuilt
    from the ledger (and written) instead."""
    with _Locked(shared=True):
        fd = _ledger_fd()
        try:
            size = os.fstat(fd).st_size if fd is not None else 0
            spend, trusted = _load_spend(fd, size)
            sessions, rebuilt = {}, False
            if sid is not None:
                sessions[sid], rebuilt = _load_session(fd, sid, size)
            if trusted and not rebuilt and fd is not None and spend["offset"] < size:
                _fold(spend, sessions, fd, size, lambda s: _load_session(fd, s, size)[0])
        finally:
            if fd is not None:
                os.close(fd)
    if not trusted or rebuilt:
        return _repair(sid)
    return spend, sessions.get(sid)


def _public(doc):
    out = {k: v for k, v in doc.items() if k != "offset"}
    out["usd"] = round(out["usd"], 10)
    return out


def session_total(sid):
    """A session's running total (zeros when it has made no call)."""
    store.check_sid(sid)
    return _public(_snapshot(sid)[1])


# -- budgets ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Stop:
    """A budget line reached: the call it was checked before is not made."""
    key: str
    limit: float
    spent: float
    source: str
    scope: str

    @property
    def message(self):
        if self.key == "session_tokens":
            lim, spent = f"{self.limit:,} tokens", f"{self.spent:,} tokens"
        else:
            lim, spent = money(self.limit), money(self.spent)
        return f"the {self.key} budget of {lim} ({self.source}) is reached: {spent} spent"

    def as_dict(self):
        return {"key": self.key, "limit": self.limit, "spent": self.spent,
                "source": self.source, "scope": self.scope, "message": self.message}


def _policy_lines(target):
    """policy.rule(target)'s budget lines [(key, limit, source)]. The policy as _policy() has
    it; the rule is worked out again whenever the policy's bytes, the target as it resolves or
    any of the policy's folders as they resolve differ from the last time (what Policy.rule
    reads). Shared: never changed by the caller."""
    if target is None:
        return []
    pol = _policy()
    real = os.path.realpath(target)
    key = (pol.path, pol.sha256, real, tuple((p, os.path.realpath(p)) for p in pol.targets))
    got = _rule_cache.get(key)
    if got is None:
        rule = pol.rule(real)
        lines = rule.get("budget") or {}
        got = [(k, v, f"policy: {rule.source('budget.' + k)}") for k, v in sorted(lines.items())]
        if len(_rule_cache) > 256:
            _rule_cache.clear()
        _rule_cache[key] = got
    return got


_rule_cache = {}        # (policy path, its sha256, target, its folders resolved) -> lines


def _stamp(path):
    """What says a file is the one last read: its inode, size, times, mode and owner (any
    write, chmod, chown or rename changes one; none followed through a symlink)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode,
            st.st_uid)


def _policy():
    """policy.load(): the live policy, loaded (read, checked, digested, a change noticed on the
    audit chain) again whenever policy.json's stamp differs from the one it was last loaded
    under -- the stamp taken before and after the load, kept only when both agree."""
    from overlord.trust import policy
    path = _path(store.POLICY_FILE)
    before = _stamp(path)
    hit = _policies.get(path)
    if before is not None and hit is not None and hit[0] == before:
        return hit[1]
    pol = policy.load()
    if before is not None and pol.path == path and _stamp(path) == before:
        if len(_policies) > 16:
            _policies.clear()
        _policies[path] = (before, pol)
    else:
        _policies.pop(path, None)
    return pol


_policies = {}          # policy.json's path -> (its stamp, the Policy loaded under it)


def budget_lines(target, owner, config=None, plines=None):
    """Every budget line that applies to a session on target owned by owner:
    {key: [{"limit", "source", "scope"}, ...]} (keys with no line left out). source: "config",
    "policy: targets[/srv/app]" (or "policy: default"), "account: NAME"; scope: "session" for
    the session_* lines, else where the spend is counted ("*", "account:NAME", "target:...")."""
    config = _config() if config is None else config
    found = [(k, v, "config", "*") for k, v in sorted(config["budget"].items())]
    tscope = target_scope(os.fspath(target)) if target is not None else None
    plines = _policy_lines(target) if plines is None else plines
    found += [(k, v, src, tscope) for k, v, src in plines]
    if owner:
        acct = config["accounts"].get(owner) or {}
        found += [(k, v, f"account: {owner}", f"account:{owner}") for k, v in sorted(acct.items())]
    out = {}
    for key, limit, source, scope in found:
        if key not in LINES:
            continue
        out.setdefault(key, []).append({"limit": limit, "source": source,
                                        "scope": "session" if key.startswith("session_") else scope})
    return out


def _today(now=None):
    t = time.gmtime(_now() if now is None else now)
    return time.strftime("%Y-%m-%d", t), time.strftime("%Y-%m", t)


def _spent(key, scope, spend, session, now=None):
    if key == "session_tokens":
        return session["tokens"] if session else 0
    if key == "session_usd":
        return round(session["usd"], 10) if session else 0.0
    day, month = _today(now)
    table, period = (spend["day"], day) if key == "day_usd" else (spend["month"], month)
    return round((table.get(period) or {}).get(scope, 0.0), 10)


def _evaluate(lines, spend, session, now=None):
    """(the most restrictive line reached as a Stop, or None). Per key the line with the least
    headroom (limit - spent in its scope) wins; across keys the least headroom relative to the
    limit (a zero line first). A stop when headroom <= 0."""
    best = None
    for key, per in lines.items():
        for ln in per:
            spent = _spent(key, ln["scope"], spend, session, now)
            room = ln["limit"] - spent
            if room > 0:
                continue
            rel = room / ln["limit"] if ln["limit"] else -math.inf
            rank = (rel, room)
            if best is None or rank < best[0]:
                best = (rank, Stop(key, ln["limit"], spent, ln["source"], ln["scope"]))
    return best[1] if best else None


def check(sid, target, owner):
    """None, or the Stop for the most restrictive budget line this session has reached."""
    return Meter(sid, target, owner).check()


class Meter:
    """One session's budget check and ledger charge (agent loop, compaction, reviewer)."""

    def __init__(self, sid, target, owner):
        self.sid = store.check_sid(sid) if sid is not None else None
        self.target = os.path.realpath(target) if target is not None else None
        self.owner = owner or None
        self._lines = None      # (config doc, policy lines, budget_lines of them): see check

    def check(self, kind="turn"):
        """The Stop for the most restrictive line reached, or None: O(1) in the ledger."""
        config, plines = _config(), _policy_lines(self.target)
        memo = self._lines
        if memo is None or memo[0] is not config or memo[1] is not plines:
            memo = self._lines = (config, plines, budget_lines(self.target, self.owner, config,
                                                               plines))
        lines = memo[2]
        if not lines:
            return None
        spend, session = _snapshot(self.sid)
        return _evaluate(lines, spend, session)

    def charge(self, kind, provider, model, usage, requested=None):
        """Write the call's ledger line and fold it into the totals; returns the line. model:
        the id the reply named (else the one asked for); requested: the id the call asked for
        (the reply's id never makes a call cheaper than that: see line_for). Prices from a
        cost.json that cannot be used fall back to the defaults (the spend happened either
        way)."""
        try:
            table = _table()
        except OverlordError:
            table = _DEFAULTS
        line = line_for(self.sid, self.target, self.owner, kind, provider, model, usage,
                        table=table, requested=requested)
        return record(line)

    def total(self):
        """The session's running total (zeros before its first call)."""
        if self.sid is None:
            return _public(_zero())
        return _public(_snapshot(self.sid)[1])


def meter_view(owner=None, now=None):
    """Spend today and this month against the most restrictive day_usd / month_usd line of the
    machine's config and owner's account: {"day": {"spent", "limit", "source", "scope"},
    "month": {...}}; limit and source None when no line is set (spent: the owner's, else the
    machine's)."""
    lines = budget_lines(None, owner)
    spend, _ = _snapshot(None)
    out = {}
    for period, key in (("day", "day_usd"), ("month", "month_usd")):
        best = None
        for ln in lines.get(key, []):
            spent = _spent(key, ln["scope"], spend, None, now)
            rank = ln["limit"] - spent
            if best is None or rank < best[0]:
                best = (rank, {"spent": round(spent, 10), "limit": ln["limit"],
                               "source": ln["source"], "scope": ln["scope"]})
        if best is None:
            scope = f"account:{owner}" if owner else "*"
            best = (0, {"spent": round(_spent(key, scope, spend, None, now), 10), "limit": None,
                        "source": None, "scope": scope})
        out[period] = best[1]
    return out


# -- reports (these read the whole ledger) ------------------------------------------------------

BY = ("model", "account", "day", "session", "month", "kind", "provider")


def parse_since(since, now=None):
    """YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ or Nd (the last N days) -> the ISO prefix compared."""
    if since is None:
        return None
    s = str(since).strip()
    if s.endswith("d") and s[:-1].isdigit():
        days = int(s[:-1])
        if days > 100000:
            raise UsageError(f"--since {_shown(s)}: too many days")
        return _iso((_now() if now is None else now) - days * 86400)
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m"):
        try:
            datetime.datetime.strptime(s, fmt)
            return s
        except ValueError:
            continue
    raise UsageError(f"--since {_shown(s)}: not a date (YYYY-MM-DD, YYYY-MM, "
                     "YYYY-MM-DDTHH:MM:SSZ or Nd)")


def ledger_lines():
    """Every readable ledger line (damaged ones skipped)."""
    fd = _ledger_fd()
    if fd is None:
        return
    try:
        yield from (line for _, line in _Lines(fd, 0, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def report(by="model", since=None):
    """[{"key", "calls", tokens..., "tokens", "usd", "unpriced_calls"}] grouped by `by`, the
    costliest first."""
    if by not in BY:
        raise UsageError(f"--by {_shown(by)}: one of {', '.join(BY)}")
    start = parse_since(since)
    rows = {}
    for line in ledger_lines():
        ts = line.get("ts")
        if not isinstance(ts, str):
            continue
        if start is not None and ts < start:
            continue
        key = {"model": line.get("model"), "account": line.get("account"), "day": ts[:10],
               "month": ts[:7], "session": line.get("sid"), "kind": line.get("kind"),
               "provider": line.get("provider")}[by]
        key = key if isinstance(key, str) else None
        row = rows.get(key)
        if row is None:
            row = rows[key] = {"key": key, "calls": 0, **{k: 0 for k in TOKEN_KEYS},
                               "tokens": 0, "usd": 0.0, "unpriced_calls": 0}
        row["calls"] += 1
        for k in TOKEN_KEYS:
            v = _count(line.get(k))
            row[k] += v
            row["tokens"] += v
        if _finite(line.get("usd")):
            row["usd"] += line["usd"]
        if not line.get("priced"):
            row["unpriced_calls"] += 1
    out = list(rows.values())
    for row in out:
        row["usd"] = round(row["usd"], 10)
    if by in ("day", "month"):
        out.sort(key=lambda r: r["key"] or "")
    else:
        out.sort(key=lambda r: (-r["usd"], -r["tokens"], r["key"] or ""))
    return out
