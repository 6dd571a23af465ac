"""The MCP client: one configured server, reached over stdio or streamable HTTP, spoken to in
either protocol generation. Standard library only.

    client = open(server, log=path, cancel=cancel)    # connects: discover, else the handshake
    tools = client.list_tools()                       # every page, raw tool dicts
    result = client.call_tool("echo", {"message": "hi"}, timeout=30, cancel=cancel)
    client.close()

Generations: first the stateless 2026-07-28 revision (`server/discover`, every request
carrying the `_meta` envelope: protocol version, client capabilities, client info); a server
that does not know it (a JSON-RPC error, or over HTTP a 4xx) gets the handshake: `initialize`
asking for 2025-11-25, the negotiated revision checked (2025-11-25, 2025-06-18, 2025-03-26),
then `notifications/initialized`.

A server's requests to us: `ping` is answered, every other one (sampling/createMessage,
roots/list, elicitation/create, ...) is refused with -32601; its notifications are ignored.
A call that times out or is cancelled sends `notifications/cancelled` {requestId, reason}
first. Whatever goes wrong (a crash, garbage, a hang, a JSON-RPC error, a wrong shape) is a
ConnectorError of one line naming the server, never a configured header or env value.

The transports are stdio.py (a child process in its own session, newline-delimited JSON-RPC)
and http.py (POST per message, JSON or SSE answers, Mcp-Session-Id kept).
"""
import base64
import binascii
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import threading
import time

from overlord import __version__
from overlord.agent.cancel import Cancelled
from overlord.errors import OverlordError

CAP = 32 << 10                       # bytes of a call's text for the model
CALL_TIMEOUT = 120.0                 # seconds a request may take unless told otherwise
LINE_MAX = 16 << 20                  # bytes of one message: anything longer is garbage
PAGES_MAX = 100                      # tools/list pages followed before we give up
TOOLS_MAX = 10000                    # tools accepted from one server
NOTIFY_TIMEOUT = 2.0                 # seconds a best-effort notification may take (HTTP)

STATELESS = "2026-07-28"
HANDSHAKE = "2025-11-25"             # what initialize asks for
ACCEPTED = ("2025-11-25", "2025-06-18", "2025-03-26")   # negotiated revisions we speak
# the 2026-07-28 envelope (equal to overlord.mcp.protocol's: a test says so; not imported,
# that package is a face)
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}  # -> Mcp-Name
CLIENT_INFO = {"name": "overlord", "version": __version__}
METHOD_NOT_FOUND = -32601


class ConnectorError(OverlordError):
    """A connector failed: one readable line naming the server, never a secret."""


class RemoteError(ConnectorError):
    """The server answered with a JSON-RPC error (code, data), or over HTTP with a 4xx/5xx
    (status; code None when the body carried no JSON-RPC error)."""

    def __init__(self, message, code=None, data=None, status=None):
        super().__init__(message)
        self.code, self.data, self.status = code, data, status


class TimedOut(ConnectorError):
    """A request's deadline passed (the transport raises it; the client words the error)."""


@dataclasses.dataclass
class CallResult:
    text: str              # the content flattened for the model, capped at CAP bytes
    is_error: bool         # the result's isError
    sha256: str            # of the canonical JSON of the whole result object
    size: int              # bytes of that canonical JSON
    truncated: bool


def secret_values(name, kind, values):
    """A server's configured env (kind "env") or header (kind "header") values as they are
    used: each value that is a whole `secret://NAME` resolved by the vault (trust/vault.py)
    when the server starts or is reached, anything else as it is. A failing reference is a
    ConnectorError naming the server, the key and the reference (never a value)."""
    out = {}
    vault = None
    for key, value in (values or {}).items():
        key, value = str(key), str(value)
        if value.startswith("secret://"):
            if vault is None:
                from overlord.trust import vault
            try:
                value = vault.resolve(value, f"connector {name} {kind} {key}")
            except OverlordError as exc:
                raise ConnectorError(f"connector {name}: {kind} {_clip(key)}: "
                                     f"{getattr(exc, 'short', exc)}") from None
        out[key] = value
    return out


def open(server, *, log=None, start_timeout=20.0, cancel=None):
    """Start or reach `server` (a config.Server or anything with its attributes), connect in
    the newest generation it speaks, and return the Client. ConnectorError when it cannot;
    Cancelled when cancel is set meanwhile (nothing is left running either way)."""
    name = getattr(server, "name", None) or "?"
    transport = getattr(server, "transport", None)
    events = Log(log, name)
    deadline = time.monotonic() + start_timeout
    if transport == "stdio":             # (the transports import this module: not at the top)
        from overlord.agent.connectors import stdio
        wire = stdio.Stdio(server, events, deadline=deadline, cancel=cancel)
    elif transport == "http":
        from overlord.agent.connectors import http
        wire = http.Http(server, events)
    else:
        raise ConnectorError(f"connector {name}: unknown transport {str(transport)[:20]!r} "
                             "(stdio or http)")
    client = Client(name, wire, events)
    try:
        client._connect(start_timeout, cancel, deadline)
    except BaseException:
        client.close()
        raise
    return client


class Client:
    """A connected server. Its methods may be called from several threads at once."""

    def __init__(self, name, wire, events):
        self.name = name
        self.era = None               # "stateless" | "handshake"
        self.version = None           # "2026-07-28", "2025-11-25", ...
        self.server_info = {}
        self.instructions = None
        self.capabilities = {}
        self._wire = wire
        self._log = events
        self._ids = 0
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the API ------------------------------------------------------------------------------

    def list_tools(self, cancel=None, timeout=None):
        """Every tool the server lists (following nextCursor), as the raw dicts."""
        tools, cursor, seen = [], None, set()
        for _ in range(PAGES_MAX):
            params = {} if cursor is None else {"cursor": cursor}
            result = self._request("tools/list", params, timeout=timeout, cancel=cancel)
            page = result.get("tools")
            if not isinstance(page, list) or not all(
                    isinstance(t, dict) and isinstance(t.get("name"), str) for t in page):
                raise self._error("answered tools/list with a malformed tool list")
            tools.extend(page)
            if len(tools) > TOOLS_MAX:
                raise self._error(f"lists more than {TOOLS_MAX} tools")
            cursor = result.get("nextCursor")
            if cursor is None or cursor == "":
                return tools
            if not isinstance(cursor, str) or cursor in seen:
                raise self._error("answered tools/list with a bad or repeated nextCursor")
            seen.add(cursor)
        raise self._error(f"lists more than {PAGES_MAX} pages of tools")

    def call_tool(self, name, arguments, *, timeout=None, cancel=None):
        """CallResult of tools/call; ConnectorError when the call fails (the call is over)."""
        result = self._request("tools/call", {"name": name, "arguments": arguments or {}},
                               timeout=timeout, cancel=cancel)
        content = result.get("content", [])
        if not isinstance(content, list):
            raise self._error(f"answered tools/call {_clip(name)} with malformed content")
        is_error = result.get("isError", False)
        if not isinstance(is_error, bool):
            raise self._error(f"answered tools/call {_clip(name)} with a non-boolean isError")
        data = canonical(result)
        text, truncated = capped(flatten(content, result.get("structuredContent")))
        return CallResult(text=text, is_error=is_error, sha256=hashlib.sha256(data).hexdigest(),
                          size=len(data), truncated=truncated)

    def close(self, hurry=False):
        """End the conversation (stdio: the process and its whole group; http: the session).
        hurry: the run was stopped and a person waits -- short graces, then SIGKILL (stdio)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wire.close(hurry=hurry)

    # -- connecting ---------------------------------------------------------------------------

    def _connect(self, start_timeout, cancel, deadline):
        try:
            found = self._request("server/discover", {}, deadline=deadline, cancel=cancel,
                                  stateless=True, starting=start_timeout)
        except RemoteError as exc:
            self._log.write(f"server/discover refused ({exc.status or exc.code}): falling back "
                            "to the handshake")
            found = None
        if found is not None:
            versions = found.get("supportedVersions")
            if isinstance(versions, list) and STATELESS in versions:
                self.era, self.version = "stateless", STATELESS
                self._wire.stateless(STATELESS)
                meta = found.get("_meta") if isinstance(found.get("_meta"), dict) else {}
                self._identify(found, meta.get(SERVER_INFO_KEY) or found.get("serverInfo"))
                self._log.write(f"connected: stateless {STATELESS}")
                return
            self._log.write("server/discover does not list 2026-07-28: falling back to the "
                            "handshake")
        answer = self._request("initialize", {
            "protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": dict(CLIENT_INFO)},
            deadline=deadline, cancel=cancel, starting=start_timeout)
        version = answer.get("protocolVersion")
        if version not in ACCEPTED:
            raise self._error(f"negotiated protocol version {_clip(version)!r}, which this "
                              f"client does not speak ({', '.join(ACCEPTED)} or {STATELESS})")
        self.era, self.version = "handshake", version
        self._wire.handshake(version)
        self._identify(answer, answer.get("serverInfo"))
        self._notify("notifications/initialized", None)
        self._log.write(f"connected: handshake {version}")

    def _identify(self, result, info):
        self.server_info = info if isinstance(info, dict) else {}
        instructions = result.get("instructions")
        self.instructions = instructions if isinstance(instructions, str) else None
        caps = result.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}

    # -- requests -----------------------------------------------------------------------------

    def _envelope(self, params):
        params = dict(params or {})
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        params["_meta"] = dict(meta, **{VERSION_KEY: STATELESS, CAPABILITIES_KEY: {},
                                        CLIENT_INFO_KEY: dict(CLIENT_INFO)})
        return params

    def _next_id(self):
        """A request id a server cannot guess (so it cannot answer a request before it is
        sent): 32 random bits over a 21-bit count, unique per connection, within JSON's safe
        integers (2**53 - 1)."""
        with self._lock:
            self._ids += 1
            return (secrets.randbits(32) << 21) | (self._ids & ((1 << 21) - 1)) or 1

    def _request(self, method, params, *, timeout=None, deadline=None, cancel=None,
                 stateless=False, starting=None):
        """The result (a dict) of one request; RemoteError for an error answer."""
        if self._closed:
            raise self._error(f"is closed: {method} was not sent")
        if cancel is not None:
            cancel.check()
        if stateless or self.era == "stateless":
            params = self._envelope(params)
        if deadline is None:
            timeout = CALL_TIMEOUT if timeout is None else timeout
            deadline = time.monotonic() + timeout
        msg_id = self._next_id()
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params:
            message["params"] = params
        try:
            answer = self._wire.request(msg_id, message, deadline, cancel)
        except TimedOut:
            self._cancelled(msg_id, method, "timed out")
            if starting is not None:
                raise self._error(f"did not answer {method} within {starting:g} s of starting")
            raise self._error(f"did not answer {method} within {timeout:g} s (timed out)")
        except Cancelled:
            self._cancelled(msg_id, method, "cancelled")
            raise
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {}
            code = error.get("code") if isinstance(error.get("code"), int) else None
            raise RemoteError(f"connector {self.name}: {method} failed: "
                              f"{_clip(error.get('message'), 200)} ({code})", code=code,
                              data=error.get("data"))
        result = answer.get("result")
        if not isinstance(result, dict):
            raise self._error(f"answered {method} with a result that is not an object")
        return result

    def _notify(self, method, params):
        message = {"jsonrpc": "2.0", "method": method}
        if self.era == "stateless":
            params = self._envelope(params)
        if params:
            message["params"] = params
        self._wire.notify(message)

    def _cancelled(self, msg_id, method, reason):
        """Best effort: tell the server we no longer await msg_id (never for initialize)."""
        if method == "initialize":
            return
        try:
            self._notify("notifications/cancelled", {"requestId": msg_id, "reason": reason})
        except (ConnectorError, OSError):
            pass
        self._log.write(f"{method} (request {msg_id}) {reason}: sent notifications/cancelled")

    def _error(self, what):
        return ConnectorError(f"connector {self.name}: {what}")


def answer_to_server(msg_id, method, log):
    """Our answer to a server's request: `ping` gets {}, every other method -32601 (logged)."""
    if method == "ping":
        return {"jsonrpc": "2.0", "id": msg_id, "result": {}}
    log.write(f"refused the server's request {_clip(method)} (not supported)")
    return {"jsonrpc": "2.0", "id": msg_id, "error": {
        "code": METHOD_NOT_FOUND,
        "message": f"Method not found: this client does not support {_clip(method)}"}}


# -- results --------------------------------------------------------------------------------

def canonical(value):
    """The canonical JSON of a value: sorted keys, compact, UTF-8 (ASCII-escaped when the
    value holds a lone surrogate, which UTF-8 cannot carry)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("ascii")


def flatten(content, structured=None):
    """The model's text of a result's content: text parts as they are; every other part one
    bracketed line (never dropped); structuredContent as JSON when no part carries text."""
    lines, texts = [], 0
    for part in content:
        if not isinstance(part, dict):
            lines.append("[malformed content part]")
            continue
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            lines.append(part["text"])
            texts += 1
        elif kind in ("image", "audio"):
            lines.append(f"[{kind}: {_word(part.get('mimeType'))}, "
                         f"{_size(_b64_size(part.get('data')))}]")
        elif kind == "resource":
            res = part.get("resource") if isinstance(part.get("resource"), dict) else {}
            if isinstance(res.get("text"), str):
                size = len(res["text"].encode("utf-8", "surrogatepass"))
            else:
                size = _b64_size(res.get("blob"))
            lines.append(f"[resource: {_word(res.get('uri'))}, {_word(res.get('mimeType'))}, "
                         f"{_size(size)}]")
        elif kind == "resource_link":
            lines.append(f"[resource link: {_word(part.get('name'))} {_word(part.get('uri'))}"
                         f" ({_word(part.get('mimeType'))})]")
        else:
            lines.append(f"[{_word(kind)} content part]")
    if structured is not None and not texts:
        lines.append(canonical(structured).decode("utf-8", "replace"))
    return "\n".join(lines)


def capped(text, cap=CAP):
    """(text, truncated): at most cap bytes of UTF-8, the head and the tail kept around a note
    saying how much was left out."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        return text, False
    note_room = 80
    head = (cap - note_room) * 3 // 4
    tail = cap - note_room - head
    left = len(data) - head - tail
    note = f"\n[... {left} bytes of this result left out ({len(data)} in all) ...]\n"
    kept = data[:head].decode("utf-8", "ignore") + note + \
        data[len(data) - tail:].decode("utf-8", "ignore")
    return kept, True


def _b64_size(data):
    if not isinstance(data, str):
        return None
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return None


def _size(n):
    if n is None:
        return "size unknown"
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.1f} MiB"


def _word(value, limit=200):
    """A server-chosen string inside a bracketed summary: one line, no controls, bounded."""
    if not isinstance(value, str) or not value:
        return "?"
    return _clip(value, limit)


def _clip(value, limit=80):
    """A server-chosen value in an error line: one line, printable, bounded."""
    text = value if isinstance(value, str) else repr(value)
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return text if len(text) <= limit else text[:limit] + "..."


# -- the log --------------------------------------------------------------------------------

class Log:
    """The per-session connector log: a stdio server's stderr lands there (its first
    STDERR_MAX bytes in this log, then one line saying the rest was dropped), and we append
    one line per notable event (connected, fell back, cancelled, crashed) while the log is
    under EVENTS_MAX bytes -- a server cannot fill the disk through it either way."""

    STDERR_MAX = 1 << 20
    EVENTS_MAX = 2 << 20

    def __init__(self, path, name):
        self.path, self.name = path, name

    def _open(self):
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _line(self, event):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        return f"{stamp} overlord connector {self.name}: {_clip(event, 500)}\n".encode(
            "utf-8", "replace")

    def stderr(self, chunk):
        """Append a chunk of the server's stderr while the log is under STDERR_MAX bytes;
        False once it is full (after one line saying the rest is dropped)."""
        if self.path is None:
            return False
        try:
            fd = self._open()
        except OSError:
            return False
        try:
            room = self.STDERR_MAX - os.fstat(fd).st_size
            if room >= len(chunk):
                os.write(fd, chunk)
                return True
            if room > 0:
                os.write(fd, chunk[:room])
            os.write(fd, b"\n" + self._line(f"its stderr filled this log's "
                                              f"{self.STDERR_MAX >> 20} MiB: the rest is dropped"))
        except OSError:
            pass
        finally:
            os.close(fd)
        return False

    def write(self, event):
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            fd = self._open()
            try:
                if os.fstat(fd).st_size < self.EVENTS_MAX:
                    os.write(fd, self._line(event))
            finally:
                os.close(fd)
