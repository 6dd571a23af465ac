"""The two generations of MCP, side by side: the client picks.

- **Handshake** (revisions 2025-11-25 and 2025-06-18): `initialize` names the client and asks
  for a revision (answered with the same one when served, else with the newest served one, as
  the spec's negotiation says); `notifications/initialized` follows; `ping` works at any time;
  over HTTP the conversation is held by an `Mcp-Session-Id`.
- **Stateless** (revision 2026-07-28): no handshake; every request carries its revision and
  the client's capabilities (and, optionally, its name) in `params._meta`; `server/discover`
  says what is served. A request with no envelope is -32602, a revision not served is -32022
  with data {supported, requested}; over HTTP the `MCP-Protocol-Version`, `Mcp-Method` and
  `Mcp-Name` headers must repeat the body (-32020 otherwise).

On one stdio connection the first request that succeeds fixes the generation: after a
handshake an enveloped request is -32600; after a stateless request `initialize` is -32022.

A Conversation turns one decoded message into its answer. Tool calls are the only slow
requests: receive() hands them back as work (a callable) for the transport to run where it
likes (stdio: a thread of their own, so `ping` and `notifications/cancelled` are read while
a command runs), with a cancel event that `notifications/cancelled` sets.
"""
import threading

from overlord import __version__
from overlord.mcp import jsonrpc as J
from overlord.mcp.jsonrpc import RpcError

HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18")          # newest first
STATELESS_VERSIONS = ("2026-07-28",)
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}  # -> Mcp-Name
UNCACHED = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}   # 2026-07-28 results

SERVER_INFO = {"name": "overlord", "title": "OVERLORD", "version": __version__}
CAPABILITIES = {"tools": {}}
INSTRUCTIONS = (
    "OVERLORD runs your shell commands and file edits inside a transaction over the project: "
    "nothing you do reaches the real files until a person reviews the change and commits it. "
    "Call open_session first (it returns a session id), then exec, read_file, write_file, "
    "edit_file, list_dir and search with that session. Every call that writes becomes its own "
    "savepoint (savepoints lists them, rewind drops the ones above a point, diff shows the "
    "whole change). Commands run jailed and offline unless policy grants otherwise. When the "
    "work is done, call request_review: a person then commits or rolls it back. There is no "
    "commit tool.")


class Conversation:
    """One client's conversation: a stdio connection, an HTTP session (handshake) or one
    HTTP request (stateless). tools is a tools.Table."""

    def __init__(self, tools, era=None):
        self.tools = tools
        self.era = era                # None (undecided), "handshake" or "stateless"
        self.version = None           # the handshake's revision
        self.client = None            # clientInfo.name from initialize: untrusted text
        self.initialized = False      # initialize answered
        self.inflight = {}            # request id -> cancel event of a running tool call
        self.abandoned = set()        # ids of calls cancelled by notifications/cancelled
        self.lock = threading.Lock()

    # -- messages ---------------------------------------------------------------------------

    def receive(self, msg, headers=None):
        """(answer, work) for one decoded message: answer is the response dict (or None: a
        notification or a response gets none); work, when not None, is a callable that
        returns the response later (a tool call), and answer is then None. headers: the HTTP
        request's (lower-case names), or None on stdio."""
        if msg.kind == "response":
            return None, None                      # we never ask, so nothing is awaited
        if msg.kind == "notification":
            self._notification(msg)
            return None, None
        try:
            return self._request(msg, headers)
        except RpcError as exc:
            return J.error(msg.id, exc), None

    def _notification(self, msg):
        params = msg.params if isinstance(msg.params, dict) else {}
        if msg.method == "notifications/cancelled":
            self.cancel(params.get("requestId"))
        # every other notification (initialized, progress, roots/list_changed, ...) asks
        # nothing of us: a conversation is served from the moment initialize is answered

    def cancel(self, request_id=None):
        """Cancel the tool call running for request_id, whose answer the client then no longer
        awaits; None: every call (the client is leaving), each still answered."""
        with self.lock:
            if request_id is None:
                events = list(self.inflight.values())
            elif _hashable(request_id) and request_id in self.inflight:
                events = [self.inflight[request_id]]
                self.abandoned.add(request_id)
            else:
                events = []
        for event in events:
            event.set()

    def _request(self, msg, headers):
        params = msg.params
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RpcError(J.INVALID_PARAMS, "Invalid params: params must be an object")
        method = msg.method
        enveloped = is_enveloped(params)
        if method != "initialize" and (self.era == "stateless" or (
                self.era is None and (enveloped or method == "server/discover"))):
            return self._stateless(msg, method, params, headers)
        return self._handshake(msg, method, params, enveloped)

    # -- the handshake revisions --------------------------------------------------------------

    def _handshake(self, msg, method, params, enveloped):
        if self.era == "stateless":
            raise RpcError(J.UNSUPPORTED_PROTOCOL_VERSION,
                           "this connection speaks the stateless 2026-07-28 revision: the "
                           "initialize handshake is not accepted on it",
                           {"supported": list(STATELESS_VERSIONS),
                            "requested": _str_or_none(params.get("protocolVersion"))})
        if method == "initialize":
            return J.result(msg.id, self._initialize(params)), None
        if enveloped:
            raise RpcError(J.INVALID_REQUEST, "this connection speaks the handshake revision "
                           f"{self.version}: requests carrying the 2026-07-28 envelope are not "
                           "accepted on it")
        if method == "ping":
            return J.result(msg.id, {}), None
        if method not in ("tools/list", "tools/call"):
            raise RpcError(J.METHOD_NOT_FOUND, f"Method not found: {method}", method)
        if not self.initialized:
            raise RpcError(J.INVALID_REQUEST, "the connection is not initialized: send "
                           "initialize first (or use the 2026-07-28 envelope)")
        return self._serve(msg, method, params, self.client, None)

    def _initialize(self, params):
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            raise RpcError(J.INVALID_PARAMS, "Invalid params: initialize needs protocolVersion "
                           "(a string)")
        info = params.get("clientInfo")
        if info is not None and not isinstance(info, dict):
            raise RpcError(J.INVALID_PARAMS, "Invalid params: clientInfo must be an object")
        caps = params.get("capabilities")
        if caps is not None and not isinstance(caps, dict):
            raise RpcError(J.INVALID_PARAMS, "Invalid params: capabilities must be an object")
        with self.lock:
            if self.initialized:
                raise RpcError(J.INVALID_REQUEST, "already initialized: initialize is sent once")
            self.era = "handshake"
            self.version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
            self.client = _name(info)
            self.initialized = True
        return {"protocolVersion": self.version, "capabilities": CAPABILITIES,
                "serverInfo": SERVER_INFO, "instructions": INSTRUCTIONS}

    # -- the stateless revision ---------------------------------------------------------------

    def _stateless(self, msg, method, params, headers):
        client = envelope(msg.raw, params, headers)
        if self.era is None:
            self.era = "stateless"
        if method == "server/discover":
            return J.result(msg.id, _stamped({
                "supportedVersions": list(STATELESS_VERSIONS), "capabilities": CAPABILITIES,
                "instructions": INSTRUCTIONS, **UNCACHED})), None
        if method not in ("tools/list", "tools/call"):
            raise RpcError(J.METHOD_NOT_FOUND, f"Method not found: {method}", method)
        return self._serve(msg, method, params, client, STATELESS_VERSIONS[0])

    # -- tools --------------------------------------------------------------------------------

    def _serve(self, msg, method, params, client, stateless):
        if method == "tools/list":
            cursor = params.get("cursor")
            if cursor is not None:
                raise RpcError(J.INVALID_PARAMS, "Invalid params: unknown cursor (the tool list "
                               "is one page)")
            listed = {"tools": self.tools.listing()}
            if stateless:
                listed = _stamped(dict(listed, **UNCACHED))
            return J.result(msg.id, listed), None
        name, args = params.get("name"), params.get("arguments")
        if not isinstance(name, str):
            raise RpcError(J.INVALID_PARAMS, "Invalid params: tools/call needs name (a string)")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise RpcError(J.INVALID_PARAMS, "Invalid params: arguments must be an object")
        if not self.tools.has(name):
            raise RpcError(J.INVALID_PARAMS, f"Unknown tool: {name}", {"tool": name})
        cancel = threading.Event()
        with self.lock:
            if msg.id in self.inflight:
                raise RpcError(J.INVALID_REQUEST, f"request id {msg.id!r} is already in use by a "
                               "running call")
            self.inflight[msg.id] = cancel

        def work():
            try:
                outcome = self.tools.call(name, args, client, msg.id, cancel)
            finally:
                with self.lock:
                    self.inflight.pop(msg.id, None)
                    abandoned = msg.id in self.abandoned
                    self.abandoned.discard(msg.id)
            if abandoned:
                return None                        # cancelled: the spec wants no response
            if stateless:
                outcome = _stamped(dict(outcome, resultType="complete"))
            return J.result(msg.id, outcome)
        return None, work


def is_enveloped(params):
    """Whether a request's params carry the 2026-07-28 envelope (its protocol version)."""
    meta = params.get("_meta")
    return isinstance(meta, dict) and VERSION_KEY in meta


def envelope(raw, params, headers):
    """The client's name from a stateless request's `_meta` envelope, once the envelope (and,
    over HTTP, the headers that must repeat it) checks out; else RpcError."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        raise RpcError(J.INVALID_PARAMS, f"Invalid params: params._meta must be an object "
                       f"carrying {VERSION_KEY!r} and {CAPABILITIES_KEY!r} (the 2026-07-28 "
                       "envelope), or send initialize first")
    missing = [k for k in (VERSION_KEY, CAPABILITIES_KEY) if k not in meta]
    if missing:
        raise RpcError(J.INVALID_PARAMS, "Invalid params: params._meta lacks " +
                       ", ".join(missing))
    version = meta[VERSION_KEY]
    if headers is not None:
        if headers.get("mcp-protocol-version") != version:
            raise RpcError(J.HEADER_MISMATCH, "the MCP-Protocol-Version header does not match "
                           "params._meta's protocol version")
        if headers.get("mcp-method") != raw.get("method"):
            raise RpcError(J.HEADER_MISMATCH, "the Mcp-Method header does not match the "
                           "request's method")
        key = NAMED.get(raw.get("method"))
        if key is not None and params.get(key) is not None and \
                _header_value(headers.get("mcp-name")) != params.get(key):
            raise RpcError(J.HEADER_MISMATCH, f"the Mcp-Name header does not match params.{key}")
    if not isinstance(version, str):
        raise RpcError(J.INVALID_PARAMS, "Invalid params: the protocol version must be a string")
    if version not in STATELESS_VERSIONS:
        raise RpcError(J.UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
                       {"supported": list(STATELESS_VERSIONS), "requested": version})
    if not isinstance(meta[CAPABILITIES_KEY], dict):
        raise RpcError(J.INVALID_PARAMS, "Invalid params: the client capabilities must be an "
                       "object")
    return _name(meta.get(CLIENT_INFO_KEY))


def _header_value(value):
    """An Mcp-Name header's value: verbatim, or the `=?base64?...?=` form decoded."""
    import base64
    import binascii
    if value and value.startswith("=?base64?") and value.endswith("?="):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    return value


def _stamped(result):
    """A 2026-07-28 result carries the server's identity in its `_meta`."""
    return dict(result, _meta={SERVER_INFO_KEY: SERVER_INFO})


def _name(info):
    name = info.get("name") if isinstance(info, dict) else None
    return name if isinstance(name, str) else None


def _str_or_none(value):
    return value if isinstance(value, str) else None


def _hashable(value):
    return isinstance(value, (str, int)) and not isinstance(value, bool)
