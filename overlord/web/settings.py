"""The workspace's settings: which provider new conversations use, one profile per provider
(model, endpoint, extra headers, generation knobs), the working folder, the sandbox grants and
the countersignature: the second model (provider, model, endpoint, headers) that reviews a
change before it is committed -- never the agent's own model unless the person says so.
The `scripted` provider is the demo: a script shipped with OVERLORD (overlord/agent/demo.json)
plays the model, so a newcomer sees a whole conversation, its diff and a commit without a key;
as the second model, a script that says it cannot judge a diff (static/demo-review.json) plays
the reviewer, so the check runs end to end and never countersigns anything.

Kept in OVERLORD_HOME/ui-settings.json, mode 0600 (a gateway header may be a credential);
once there are accounts, each account's own in OVERLORD_HOME/users/<name>/ui.json.
API keys are not kept here: they go to the key store through ops.keys_set and are never sent
back. Header values that look like credentials are sent back masked; a masked value written
back keeps the stored one. Every value is checked before anything is stored, and a refusal
names the field it is about, so the page can show it next to that field.
"""
import json
import os
import re
import threading
import urllib.parse

from overlord import ops
from overlord.errors import UsageError

DEMO = "scripted"             # the demo: a bundled script plays the model (no key, no network)
DEMO_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "agent", "demo.json")
DEMO_REVIEW_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static",
                                  "demo-review.json")
DEMO_REVIEWER = "overlord-demo-reviewer"      # the model the demo review script names
PROVIDERS = ("anthropic", "openai", "azure", "openai-compatible", "gemini", DEMO)
LABELS = {"anthropic": "Anthropic", "openai": "OpenAI", "azure": "Azure OpenAI",
          "openai-compatible": "OpenAI-compatible", "gemini": "Gemini",
          DEMO: "Demo (a scripted conversation, no key needed)"}
NEEDS_KEY = ("anthropic", "openai", "azure", "gemini")
MASK = "\u2022" * 8
SECRET_HINTS = ("auth", "key", "token", "secret", "cookie")
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
CHOICES = {"effort": ("low", "medium", "high", "xhigh", "max"), "thinking": ("summarized", "off"),
           "api": ("responses", "chat")}
NETS = ("none", "proxy", "host")    # offline, recorded (the session's proxy), the machine's
NET_ALLOW_CHARS = 64 * 1024   # the allowlist as typed (one host a line, or comma separated)


class Invalid(UsageError):
    """A value refused, with the field it belongs to."""

    def __init__(self, field, message):
        super().__init__(message)
        self.field = field


def home():
    """OVERLORD_HOME, made if missing (the token and these settings live there)."""
    return ops.ensure_home()


def path():
    return os.path.join(ops.home(), "ui-settings.json")


def user_path(name):
    """An account's own settings: OVERLORD_HOME/users/<name>/ui.json (ops.user_dir refuses
    any name that would lead elsewhere)."""
    return os.path.join(ops.user_dir(name), "ui.json")


def defaults(folder):
    return {"provider": "anthropic", "profiles": {p: empty_profile() for p in PROVIDERS},
            "folder": folder, "sandbox": empty_sandbox(),
            "countersign": empty_countersign()}


def empty_sandbox():
    """The tools' grants: jailed and offline. net_allow and hold_writes mean something only
    to the recorded network (net "proxy"): an allowlist (empty: every public host, recorded)
    and whether side-effecting requests wait for the person at Commit."""
    return {"jail": True, "net": "none", "net_allow": [], "hold_writes": False}


def empty_profile():
    return {"model": "", "base_url": "", "headers": {}, "knobs": {}, "system": ""}


def empty_countersign():
    """The second model: unset until the person names one (never guessed)."""
    return {"provider": "", "model": "", "base_url": "", "headers": {}}


class Settings:
    """The stored settings, read and changed under one lock."""

    def __init__(self, default_folder, path=None):
        self.default_folder = default_folder
        self.path = path              # None: the machine's (OVERLORD_HOME/ui-settings.json)
        self._lock = threading.Lock()

    def _read(self):
        """The stored text. An account's file is read inside its folder opened without
        following a link (ops.open_user_dir): users/bob -> alice never reads alice's settings."""
        if self.path is None:
            with open(path(), "rb") as f:
                return f.read()
        fd = ops.open_user_dir(os.path.basename(os.path.dirname(self.path)))
        if fd is None:
            raise FileNotFoundError(self.path)
        try:
            ffd = os.open(os.path.basename(self.path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
        finally:
            os.close(fd)
        with os.fdopen(ffd, "rb") as f:
            return f.read()

    def load(self):
        data = defaults(self.default_folder)
        try:
            stored = json.loads(self._read())
        except (FileNotFoundError, ValueError):
            return data
        if isinstance(stored, dict):
            if stored.get("provider") in PROVIDERS:
                data["provider"] = stored["provider"]
            for name, prof in (stored.get("profiles") or {}).items():
                if name in PROVIDERS and isinstance(prof, dict):
                    data["profiles"][name].update({k: v for k, v in prof.items() if k in empty_profile()})
            if isinstance(stored.get("folder"), str) and stored["folder"]:
                data["folder"] = stored["folder"]
            if isinstance(stored.get("sandbox"), dict):
                data["sandbox"] = stored_sandbox(stored["sandbox"])
            if isinstance(stored.get("countersign"), dict):
                data["countersign"].update({k: v for k, v in stored["countersign"].items()
                                            if k in empty_countersign()})
        return data

    def public(self, keys):
        """The settings as the page sees them: credential header values masked, and where
        each provider's key comes from (never the key)."""
        data = self.load()
        for prof in list(data["profiles"].values()) + [data["countersign"]]:
            prof["headers"] = {k: (MASK if secret_header(k) and v else v)
                               for k, v in prof["headers"].items()}
        data["keys"] = {p: keys.get(p) for p in PROVIDERS}
        data["labels"] = LABELS
        data["needs_key"] = list(NEEDS_KEY)
        data["demo"] = DEMO
        return data

    def update(self, change):
        """Apply a partial change ({provider, profile, folder, sandbox, countersign}); return
        the keys to store, if any were given, as [(provider, key)] -- the caller stores them.
        `countersign_key` is the key of the countersignature's provider."""
        if not isinstance(change, dict):
            raise Invalid(None, "settings must be a JSON object")
        unknown = sorted(set(change) - {"provider", "profile", "folder", "sandbox", "api_key",
                                        "countersign", "countersign_key"})
        if unknown:
            raise Invalid(unknown[0], f"unknown setting {unknown[0]!r}")
        with self._lock:
            data = self.load()
            provider = change.get("provider", data["provider"])
            if provider not in PROVIDERS:
                raise Invalid("provider", f"provider must be one of {', '.join(PROVIDERS)}")
            data["provider"] = provider
            if "profile" in change:
                data["profiles"][provider] = check_profile(change["profile"],
                                                           data["profiles"][provider], provider)
            if "folder" in change:
                data["folder"] = check_folder(change["folder"])
            if "sandbox" in change:
                data["sandbox"] = check_sandbox(change["sandbox"])
            if "countersign" in change:
                data["countersign"] = check_countersign(change["countersign"], data["countersign"])
            keys = [_key(change.get("api_key"), provider, "api_key"),
                    _key(change.get("countersign_key"), data["countersign"]["provider"],
                         "cs_api_key")]
            _write(data, self.path)
        return [k for k in keys if k]

    def profile(self, provider):
        data = self.load()
        if provider not in PROVIDERS:
            raise Invalid("provider", f"provider must be one of {', '.join(PROVIDERS)}")
        return data["profiles"][provider]


def _key(key, provider, field):
    """(provider, key) to store, None when no key was given; refused in words otherwise."""
    if key and provider not in NEEDS_KEY and provider != "openai-compatible":
        raise Invalid(field, f"{LABELS.get(provider, 'no provider')} takes no API key" if provider
                      else "choose the provider the key is for first")
    if key is not None and (not isinstance(key, str) or not key.strip() or
                            len(key) > 4096 or any(c.isspace() for c in key.strip())):
        raise Invalid(field, "an API key is one line of text without spaces")
    return (provider, key.strip()) if key else None


def check_countersign(value, old):
    """The countersignature: {provider, model, base_url, headers}; a refusal names the field
    as the page calls it (cs_provider, cs_model, ...). An empty provider unsets it."""
    if not isinstance(value, dict):
        raise Invalid("cs_provider", "the countersignature must be a JSON object")
    unknown = sorted(set(value) - set(empty_countersign()))
    if unknown:
        raise Invalid(unknown[0], f"unknown countersignature setting {unknown[0]!r}")
    provider = value.get("provider", old.get("provider") or "")
    if provider in (None, ""):
        return empty_countersign()
    if provider not in PROVIDERS:
        raise Invalid("cs_provider", f"provider must be one of {', '.join(PROVIDERS)}")
    try:
        prof = check_profile({k: v for k, v in value.items() if k != "provider"},
                             dict(empty_profile(), **{k: v for k, v in old.items() if k != "provider"}),
                             provider)
    except Invalid as exc:
        raise Invalid(f"cs_{exc.field}", str(exc)) from None
    out = {"provider": provider, **{k: prof[k] for k in ("model", "base_url", "headers")}}
    if provider == DEMO:                  # the script names its own model
        out.update(model=DEMO_REVIEWER, base_url="", headers={})
    return out


def reviewer(cs):
    """"provider:model" of a countersignature, or None while it is unset."""
    return f"{cs['provider']}:{cs['model']}" if cs.get("provider") and cs.get("model") else None


def secret_header(name):
    return any(h in name.lower() for h in SECRET_HINTS)


def check_profile(prof, old, provider):
    if not isinstance(prof, dict):
        raise Invalid("profile", "the profile must be a JSON object")
    out = dict(old)
    unknown = sorted(set(prof) - set(empty_profile()))
    if unknown:
        raise Invalid(unknown[0], f"unknown profile setting {unknown[0]!r}")
    if "model" in prof:
        out["model"] = _text(prof["model"], "model", 200)
    if "system" in prof:
        out["system"] = _text(prof["system"], "system", 20000, lines=True)
    if "base_url" in prof:
        url = _text(prof["base_url"], "base_url", 2000)
        if url:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise Invalid("base_url", "the endpoint must be an http:// or https:// URL")
        elif provider == "azure":
            pass      # AZURE_OPENAI_ENDPOINT may supply it; refused at the call otherwise
        out["base_url"] = url
    if "headers" in prof:
        out["headers"] = _headers(prof["headers"], old.get("headers") or {})
    if "knobs" in prof:
        out["knobs"] = check_knobs(prof["knobs"])
    return out


def _text(value, field, limit, lines=False):
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise Invalid(field, f"{field} must be text of at most {limit} characters")
    if not lines and any(c in value for c in "\r\n\0"):
        raise Invalid(field, f"{field} must be one line")
    return value.strip()


def _headers(value, old):
    if isinstance(value, str):            # "Name: value" lines, as typed
        pairs = {}
        for line in value.splitlines():
            if not line.strip():
                continue
            if ":" not in line:
                raise Invalid("headers", f"a header is 'Name: value', not {line.strip()[:40]!r}")
            k, v = line.split(":", 1)
            pairs[k.strip()] = v.strip()
        value = pairs
    if not isinstance(value, dict) or len(value) > 50:
        raise Invalid("headers", "headers must be at most 50 'Name: value' pairs")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not HEADER_NAME.match(k):
            raise Invalid("headers", f"not a header name: {str(k)[:40]!r}")
        if not isinstance(v, str) or len(v) > 8000 or any(c in v for c in "\r\n\0"):
            raise Invalid("headers", f"the value of {k} must be one line of text")
        out[k] = old.get(k, "") if v == MASK else v
    return out


def check_knobs(knobs):
    """The generation knobs: each sent only when set, so blank means unset."""
    if not isinstance(knobs, dict):
        raise Invalid("knobs", "knobs must be a JSON object")
    out = {}
    for name, value in knobs.items():
        if value in (None, ""):
            continue
        if name == "max_tokens":
            out[name] = _number(value, name, int, 1, 1_000_000)
        elif name == "temperature":
            out[name] = _number(value, name, float, 0.0, 2.0)
        elif name == "top_p":
            out[name] = _number(value, name, float, 0.0, 1.0)
        elif name in CHOICES:
            if value not in CHOICES[name]:
                raise Invalid(name, f"{name} must be one of {', '.join(CHOICES[name])}")
            out[name] = value
        elif name == "stop":
            items = value.splitlines() if isinstance(value, str) else value
            if not isinstance(items, list) or len(items) > 16 or \
                    not all(isinstance(s, str) and 0 < len(s) <= 200 for s in items):
                raise Invalid(name, "stop takes up to 16 sequences, one a line")
            if items:
                out[name] = items
        elif name in ("stream", "fallbacks"):
            if not isinstance(value, bool):
                raise Invalid(name, f"{name} is on or off")
            out[name] = value
        elif name == "azure_api_version":
            out[name] = _text(value, name, 40)
        else:
            raise Invalid(name, f"unknown generation setting {name!r}")
    return out


def _number(value, field, kind, low, high):
    try:
        if isinstance(value, bool):
            raise ValueError
        number = kind(value)
        if kind is int and isinstance(value, float) and value != int(value):
            raise ValueError
    except (TypeError, ValueError):
        raise Invalid(field, f"{field} must be a{'n integer' if kind is int else ' number'}") from None
    if not low <= number <= high:
        raise Invalid(field, f"{field} must be between {low} and {high}")
    return number


def check_folder(folder):
    if not isinstance(folder, str) or not folder.strip():
        raise Invalid("folder", "choose a working folder")
    folder = os.path.expanduser(folder.strip())
    if not os.path.isabs(folder):
        raise Invalid("folder", "the working folder must be an absolute path")
    if not os.path.isdir(folder):
        raise Invalid("folder", f"no such folder: {folder}")
    return os.path.realpath(folder)


def check_sandbox(sandbox):
    """{jail, net, net_allow, hold_writes}, each checked; a refusal names its field. The
    allowlist comes as a list or as typed (one host a line, or comma separated), each entry
    normalised by overlord.sandbox.netallow (the engine's own rule); it and the hold need the
    recorded network, as --net-allow and --hold-writes need --net proxy."""
    if not isinstance(sandbox, dict) or set(sandbox) - set(empty_sandbox()):
        raise Invalid("sandbox", "the sandbox grants are jail (on/off), net (none/proxy/host), "
                                 "net_allow (hosts) and hold_writes (on/off)")
    jail, net = sandbox.get("jail", True), sandbox.get("net", "none")
    if not isinstance(jail, bool):
        raise Invalid("jail", "the jail is on or off")
    if net not in NETS:
        raise Invalid("net", f"network must be one of {', '.join(NETS)}")
    allow = net_allow_entries(sandbox.get("net_allow", []))
    hold = sandbox.get("hold_writes", False)
    if not isinstance(hold, bool):
        raise Invalid("hold_writes", "holding side-effecting requests is on or off")
    if net != "proxy":
        if allow:
            raise Invalid("net_allow", "an allowlist needs the recorded (proxy) network: choose "
                                       "it above, or empty the list")
        if hold:
            raise Invalid("hold_writes", "holding requests needs the recorded (proxy) network: "
                                         "choose it above, or untick the box")
    return {"jail": jail, "net": net, "net_allow": allow, "hold_writes": hold}


def net_allow_entries(value):
    """The allowlist as a list of normalised entries, or Invalid("net_allow") naming the entry
    that is wrong and why (netallow.parse's words)."""
    if value is None:
        return []
    if isinstance(value, str):
        if len(value) > NET_ALLOW_CHARS:
            raise Invalid("net_allow", f"the allowlist is at most {NET_ALLOW_CHARS} characters")
        value = [e.strip() for line in value.splitlines() for e in line.split(",")]
        value = [e for e in value if e]
    if not isinstance(value, list):
        raise Invalid("net_allow", "the allowlist is host names, one a line (or comma separated)")
    try:
        return ops.parse_net_allow(value, "the allowlist")
    except UsageError as exc:
        raise Invalid("net_allow", str(exc).removeprefix("the allowlist: ")) from None


def stored_sandbox(stored):
    """The stored grants as this version keeps them: a record from before the recorded network
    (just jail and net) loads with an empty allowlist and no hold; a value this version does
    not know (hand-edited) falls back to the default rather than reaching ops.agent."""
    out = empty_sandbox()
    try:
        return check_sandbox({k: v for k, v in stored.items() if k in out})
    except Invalid:
        for key in ("jail", "net"):
            if key in stored:
                try:
                    out.update({k: v for k, v in check_sandbox({key: stored[key]}).items()
                                if k == key})
                except Invalid:
                    pass
        return out


def _write(data, where=None):
    """Atomically, 0600 from the moment the file exists (an account's folder made 0700 when
    it is missing, and refused when it is not a folder of ours: ops.ensure_user_dir)."""
    ops.ensure_home()
    if where is not None:
        ops.ensure_user_dir(os.path.basename(os.path.dirname(where)))
    ops.write_private_json(where or path(), data, indent=1)
