"""OVERLORD_HOME/mcp.json: the configured MCP servers and the approval mode.

    {"approval": "ask" | "auto" | "readonly",
     "servers": {NAME: {"command": str, "args": [str], "env": {K: V}}     (stdio)
                 NAME: {"url": "https://host/...", "headers": {K: V}}}}   (streamable HTTP)

The file holds secrets (a server's env and headers), so it is kept like keys.json: read without
following a symlink, refused when group or others may read it or another user owns it, written
atomically (a 0600 temp file, fsync, rename) under a lock, so two concurrent `mcp add` never
lose each other's server. Every value is validated on the way in and on the way out: a damaged
file is one line naming the file and the key, never a half-read config. Nothing here prints a
secret: `Server.masked()` is what a face shows.
"""
import contextlib
import dataclasses
import json
import os
import re
import stat
import urllib.parse

from overlord.agent import keys
from overlord.errors import OverlordError, UsageError
from overlord.txn import store

APPROVALS = ("ask", "auto", "readonly")
DEFAULT_APPROVAL = "ask"
# No "_": the offered tool name's separator is "__" (mcp__<server>__<tool>).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,31}\Z")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
HEADER_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")         # an RFC 9110 token
MAX_BYTES = 1 << 20
STDIO_KEYS, HTTP_KEYS = ("command", "args", "env"), ("url", "headers")
MASK = "••••"
SHOWN = 3                        # leading characters of a long secret shown
LONG = 16                        # a value shorter than this is masked whole


class Invalid(UsageError):
    """A bad value: `field` is its key in mcp.json (name, command, args, env, url, headers);
    the CLI names its flag instead, load() the file."""

    def __init__(self, field, message):
        super().__init__(f"{field}: {message}")
        self.field, self.reason = field, message


def path():
    return os.path.join(store.home(), "mcp.json")


@dataclasses.dataclass(frozen=True)
class Server:
    """One configured server. Exactly one of command (stdio) and url (http)."""
    name: str
    command: str = None
    args: tuple = ()
    env: dict = dataclasses.field(default_factory=dict)
    url: str = None
    headers: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "headers", dict(self.headers))
        _validate(self)

    @property
    def transport(self):
        return "stdio" if self.command is not None else "http"

    def to_json(self):
        """The server's entry in mcp.json (secrets included: for the file only)."""
        if self.transport == "stdio":
            return {"command": self.command, "args": list(self.args), "env": dict(self.env)}
        return {"url": self.url, "headers": dict(self.headers)}

    def masked(self):
        """What a face may show: env and header values masked, a URL's password and query
        values masked; names, the command line and the host in the clear."""
        out = {"name": self.name, "transport": self.transport}
        if self.transport == "stdio":
            out.update(command=self.command, args=list(self.args),
                       env={k: mask(v) for k, v in self.env.items()})
        else:
            out.update(url=mask_url(self.url),
                       headers={k: mask(v) for k, v in self.headers.items()})
        return out


@dataclasses.dataclass
class Config:
    approval: str = DEFAULT_APPROVAL
    servers: dict = dataclasses.field(default_factory=dict)      # name -> Server

    def get(self, name):
        server = self.servers.get(name)
        if server is None:
            raise UsageError(f"no connector named {name!r} in {path()} ({known(self)})")
        return server

    def to_json(self):
        return {"approval": self.approval,
                "servers": {n: s.to_json() for n, s in sorted(self.servers.items())}}


def known(cfg):
    if not cfg.servers:
        return "none is configured; add one with `overlord mcp add NAME --command CMD` or `--url URL`"
    return "configured: " + ", ".join(sorted(cfg.servers))


def mask(value):
    """A secret for display: `abc…(masked)` when long enough that three characters tell
    little, else `••••`; never the value."""
    if not isinstance(value, str) or len(value) < LONG:
        return MASK
    return value[:SHOWN] + "…(masked)"


def mask_url(url):
    """A URL with its userinfo password and query values masked."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = (user.partition(":")[0] + ":" + MASK if ":" in user else user) + "@" + host
    query = "&".join(f"{k}={MASK}" if v else k for k, v in
                     (pair.partition("=")[::2] for pair in parts.query.split("&") if pair))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# -- validation --------------------------------------------------------------------------------

def check_name(name):
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise Invalid("name", f"{name!r} is not a server name (a letter or digit, then up to 31 "
                      "letters, digits or '-'; no '_')")
    return name


def _text(field, value, what):
    if not isinstance(value, str):
        raise Invalid(field, f"{what} must be a string, not {type(value).__name__}")
    if "\0" in value:
        raise Invalid(field, f"{what} contains a NUL byte")
    return value


def _validate(s):
    check_name(s.name)
    if (s.command is None) == (s.url is None):
        raise Invalid("command", "both a command and a url" if s.command is not None else
                      "neither a command (stdio) nor a url (http)")
    if s.command is not None:
        if s.headers:
            raise Invalid("headers", "headers are for a url server, not a command")
        if not _text("command", s.command, "the command").strip():
            raise Invalid("command", "the command is empty")
        for i, arg in enumerate(s.args):
            _text("args", arg, f"argument {i + 1}")
        for key, value in s.env.items():
            if not isinstance(key, str) or not ENV_KEY_RE.match(key):
                raise Invalid("env", f"{key!r} is not an environment variable name "
                              "(letters, digits and '_', not starting with a digit)")
            _text("env", value, f"the value of {key}")          # never the value itself
    else:
        if s.args or s.env:
            raise Invalid("args" if s.args else "env", "args and env are for a command server, "
                          "not a url")
        check_url(s.url)
        for key, value in s.headers.items():
            if not isinstance(key, str) or not HEADER_RE.match(key):
                raise Invalid("headers", f"{key!r} is not a header name")
            _text("headers", value, f"the value of header {key}")
            if any(c in value for c in "\r\n") or value != value.strip():
                raise Invalid("headers", f"the value of header {key} has a line break or "
                              "surrounding space")


def check_url(url):
    _text("url", url, "the url")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise Invalid("url", f"{url!r} contains whitespace or a control character")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port                                   # noqa: B018 -- raises on a bad port
    except ValueError as exc:
        raise Invalid("url", f"{url!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid("url", f"{url!r} is not an http:// or https:// URL with a host")
    return url


def _entry(name, entry):
    """A Server from its mcp.json entry, or Invalid naming the key."""
    check_name(name)
    if not isinstance(entry, dict):
        raise Invalid("", f"must be an object, not {type(entry).__name__}")
    unknown = sorted(set(entry) - set(STDIO_KEYS) - set(HTTP_KEYS))
    if unknown:
        raise Invalid(unknown[0], f"unknown key (a server has {', '.join(STDIO_KEYS)} or "
                      f"{', '.join(HTTP_KEYS)})")
    kinds = {"args": list, "env": dict, "headers": dict}
    for key, kind in kinds.items():
        if key in entry and not isinstance(entry[key], kind):
            raise Invalid(key, f"must be {'a list' if kind is list else 'an object'}, "
                          f"not {type(entry[key]).__name__}")
    for key in ("command", "url"):
        if key in entry and not isinstance(entry[key], str):
            raise Invalid(key, f"must be a string, not {type(entry[key]).__name__}")
    return Server(name, command=entry.get("command"), args=entry.get("args", ()),
                  env=entry.get("env", {}), url=entry.get("url"), headers=entry.get("headers", {}))


def parse(data, where):
    """A Config from the file's JSON object; OverlordError("mcp.json PATH: what") otherwise."""
    def bad(what):
        return OverlordError(f"mcp.json {where}: {what}")
    if not isinstance(data, dict):
        raise bad(f"not an object (a {type(data).__name__})")
    unknown = sorted(set(data) - {"approval", "servers"})
    if unknown:
        raise bad(f"unknown key {unknown[0]!r} (the keys are approval and servers)")
    approval = data.get("approval", DEFAULT_APPROVAL)
    if approval not in APPROVALS:
        raise bad(f"approval is {approval!r}, not one of {', '.join(APPROVALS)}")
    servers = data.get("servers", {})
    if not isinstance(servers, dict):
        raise bad(f"servers must be an object, not {type(servers).__name__}")
    out = {}
    for name, entry in servers.items():
        try:
            out[name] = _entry(name, entry)
        except Invalid as exc:
            key = "servers" if exc.field == "name" else \
                f"servers.{name}" + (f".{exc.field}" if exc.field else "")
            raise bad(f"{key}: {exc.reason}") from None
    return Config(approval, out)


# -- the file ----------------------------------------------------------------------------------

def load():
    """The configuration (none configured: approval ask, no servers)."""
    p = path()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Config()
    except OSError as e:
        raise OverlordError(f"cannot read mcp.json {p}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OverlordError(f"refusing mcp.json {p}: not a regular file")
        if st.st_uid != os.geteuid():
            raise OverlordError(f"refusing mcp.json {p}: it belongs to uid {st.st_uid}, not you")
        if st.st_mode & 0o077:
            raise OverlordError(f"refusing mcp.json {p}: mode {stat.S_IMODE(st.st_mode):04o} "
                                f"lets others read it; run: chmod 600 {p}")
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise OverlordError(f"mcp.json {p}: larger than {MAX_BYTES >> 20} MiB")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise OverlordError(f"mcp.json {p}: not UTF-8") from None
    except ValueError as exc:
        raise OverlordError(f"mcp.json {p}: not JSON ({exc})") from None
    return parse(data, p)


@contextlib.contextmanager
def _editing():
    """The config to change, under the file's lock (keys.json's discipline, keys.locked);
    written back atomically, 0600 from the moment it exists, when the change succeeds."""
    p = path()
    with keys.locked(p):
        cfg = load()
        yield cfg
        keys.write_private(p, cfg.to_json())


def add(server, replace=False):
    """Configure a server; a name already configured is refused unless replace."""
    if not isinstance(server, Server):
        raise TypeError("add() takes a config.Server")
    with _editing() as cfg:
        if server.name in cfg.servers and not replace:
            raise UsageError(f"a connector named {server.name!r} is already configured; "
                             f"run `overlord mcp rm {server.name}` first (or add --replace)")
        cfg.servers[server.name] = server
    return server


def remove(name):
    """Forget a server; returns it (UsageError naming the known ones when there is none)."""
    with _editing() as cfg:
        server = cfg.get(name)
        del cfg.servers[name]
    return server


def set_approval(mode):
    """Set the approval mode; returns the one it replaces."""
    if mode not in APPROVALS:
        raise UsageError(f"approval {mode!r}: one of {', '.join(APPROVALS)}")
    with _editing() as cfg:
        old, cfg.approval = cfg.approval, mode
    return old
