"""The streamable HTTP transport, on loopback only, behind the UI's launch token.

One endpoint, /mcp. A POST carries one JSON-RPC message; a request is answered in the body
(application/json, or one `event: message` of text/event-stream for a client that accepts
only that), a notification or a response with 202. Which generation answers is read from the
`MCP-Protocol-Version` header: a handshake revision (or none) is the handshake path, where
`initialize` without an `Mcp-Session-Id` opens a conversation whose id comes back in that
header, every later message carries it (400 without, 404 for one that is unknown or ended)
and DELETE ends it; any other value (2026-07-28, or one not served: -32022) is the stateless
path, each POST on its own, its headers checked against its body. GET is 405: this server
never speaks first.

Loopback is not a credential (a session granted `net: host` shares it): every request must
carry the launch token of `overlord ui` (OVERLORD_HOME/ui.token) as `Authorization: Bearer
TOKEN` (401 otherwise), name this very address in `Host` (421: DNS rebinding) and, if it
has an `Origin`, this very origin (403: a page in a browser). Refusals carry a JSON-RPC error
body. While a tool call runs its connection is watched: a client that hangs up cancels it.
"""
import http.server
import ipaddress
import secrets
import select
import socket
import sys
import threading

from overlord import ops
from overlord.errors import OverlordError, UsageError
from overlord.mcp import jsonrpc as J
from overlord.mcp import protocol
from overlord.ops import access     # the UI's launch token and host check

PATH = "/mcp"
BODY_MAX = 32 << 20
SESSIONS_MAX = 64
WATCH = 0.1                  # seconds between looks at a connection while its call runs
IDLE = 60                    # seconds a connection may be silent before it is let go
STATUS = {J.PARSE_ERROR: 400, J.INVALID_REQUEST: 400, J.INVALID_PARAMS: 400,
          J.HEADER_MISMATCH: 400, J.UNSUPPORTED_PROTOCOL_VERSION: 400, J.METHOD_NOT_FOUND: 404}
CANCELLED = -32000           # implementation-defined: the request was cancelled


def parse_bind(value):
    """'127.0.0.1:PORT' -> (host, port); loopback IPv4 only (UsageError otherwise)."""
    host, sep, port = value.rpartition(":")
    try:
        ip = ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        ip = number = None
    if not sep or ip is None or not 0 <= number <= 65535:
        raise UsageError(f"--http takes 127.0.0.1:PORT, not {value!r}")
    if ip.version != 4 or not ip.is_loopback:
        raise UsageError(f"--http binds a loopback address only (127.0.0.1), not {host}")
    return host, number


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        """A client that hung up is no error; anything else is one line on stderr."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            print(f"overlord mcp: internal error answering a request: {type(exc).__name__}: "
                  f"{exc}", file=sys.stderr, flush=True)

    def configure(self, tools, token, host):
        self.tools = tools
        self.guard = access.Guard(token, host, self.server_address[1])
        self.sessions = {}                       # Mcp-Session-Id -> Conversation
        self.lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "overlord-mcp"
    # seconds a connection may be silent (idle between requests, or mid-request): any local
    # user can connect before a single check runs, and each connection holds a thread
    timeout = IDLE

    def log_message(self, format, *args):        # no access log: stderr is the operator's
        pass

    # -- the verbs ----------------------------------------------------------------------------

    def do_POST(self):
        if not self._admitted():
            return
        ctype = self.headers.get("Content-Type", "")
        if not ctype.lower().startswith("application/json"):
            return self._refuse(415, J.INVALID_REQUEST, "Content-Type must be application/json")
        accept = self.headers.get("Accept", "*/*").lower()
        sse_only = "text/event-stream" in accept and "application/json" not in accept \
            and "*/*" not in accept
        if not sse_only and not any(t in accept for t in ("application/json", "*/*", "application/*")):
            return self._refuse(406, J.INVALID_REQUEST, "Accept must include application/json "
                                "or text/event-stream")
        body = self._body()
        if body is None:
            return
        try:
            msg = J.decode(body)
        except J.RpcError as exc:
            return self._reply(J.error(exc.id, exc), sse_only)
        headers = {k.lower(): v for k, v in self.headers.items()}
        version = headers.get("mcp-protocol-version")
        params = msg.params if isinstance(msg.params, dict) else {}
        enveloped = protocol.is_enveloped(params)
        if version is not None and version not in protocol.HANDSHAKE_VERSIONS or \
                (version is None and enveloped and msg.method != "initialize"):
            conversation = protocol.Conversation(self.server.tools, era="stateless")
            return self._answer(conversation, msg, headers, sse_only)
        self._handshake(msg, headers, sse_only)

    def do_DELETE(self):
        if not self._admitted():
            return
        sid = self.headers.get("Mcp-Session-Id")
        if sid is None:
            return self._refuse(400, J.INVALID_REQUEST, "Bad Request: no Mcp-Session-Id")
        with self.server.lock:
            conversation = self.server.sessions.pop(sid, None)
        if conversation is None:
            return self._refuse(404, J.INVALID_REQUEST, "Session not found")
        conversation.cancel()
        self._send(200, b"", None)

    def do_GET(self):
        if self._admitted():
            self._refuse(405, J.INVALID_REQUEST, "this server sends no messages of its own: "
                         "POST to " + PATH, allow="POST, DELETE")

    def _other(self):
        if self._admitted():
            self._refuse(405, J.INVALID_REQUEST, "Method Not Allowed", allow="POST, DELETE")

    do_PUT = do_PATCH = do_HEAD = do_OPTIONS = _other

    # -- the handshake path -------------------------------------------------------------------

    def _handshake(self, msg, headers, sse_only):
        sid = headers.get("mcp-session-id")
        if sid is None:
            if msg.kind != "request" or msg.method != "initialize":
                return self._refuse(400, J.INVALID_REQUEST, "Bad Request: no Mcp-Session-Id "
                                    "(send initialize first, or use the 2026-07-28 revision)",
                                    msg.id)
            conversation = protocol.Conversation(self.server.tools)
            answer, _ = conversation.receive(msg)
            if "error" in answer:
                return self._reply(answer, sse_only)
            with self.server.lock:
                if len(self.server.sessions) >= SESSIONS_MAX:
                    return self._refuse(503, J.INVALID_REQUEST, f"too many open sessions "
                                        f"({SESSIONS_MAX}): DELETE one", msg.id)
                sid = secrets.token_hex(16)
                self.server.sessions[sid] = conversation
            return self._reply(answer, sse_only, {"Mcp-Session-Id": sid})
        with self.server.lock:
            conversation = self.server.sessions.get(sid)
        if conversation is None:
            return self._refuse(404, J.INVALID_REQUEST, "Session not found", msg.id)
        version = headers.get("mcp-protocol-version")
        if version is not None and conversation.version and version != conversation.version:
            return self._refuse(400, J.INVALID_REQUEST, f"MCP-Protocol-Version {version} is "
                                f"not this session's ({conversation.version})", msg.id)
        self._answer(conversation, msg, None, sse_only, {"Mcp-Session-Id": sid})

    # -- answering ----------------------------------------------------------------------------

    def _answer(self, conversation, msg, headers, sse_only, extra=None):
        answer, work = conversation.receive(msg, headers)
        if work is not None:
            answer = self._watched(work, conversation, msg.id)
            if answer is None:
                answer = J.error(msg.id, J.RpcError(CANCELLED, "the request was cancelled"))
        if answer is None:
            return self._send(202, b"", None, extra)
        self._reply(answer, sse_only, extra)

    def _watched(self, work, conversation, request_id):
        """work()'s answer, computed on a thread while this connection is watched: a client
        that closes it cancels the call."""
        box = []
        thread = threading.Thread(target=lambda: box.append(work()), daemon=True)
        thread.start()
        sock = self.connection
        while thread.is_alive():
            thread.join(WATCH)
            if thread.is_alive() and _hung_up(sock):
                conversation.cancel(request_id)
                thread.join()
        return box[0] if box else None

    def _reply(self, message, sse_only, extra=None):
        status = STATUS.get(message["error"]["code"], 200) if "error" in message else 200
        data = J.encode(message)
        if sse_only:
            return self._send(status, b"event: message\ndata: " + data + b"\n\n",
                              "text/event-stream", extra)
        self._send(status, data, "application/json", extra)

    def _refuse(self, status, code, text, msg_id=None, allow=None):
        extra = {"Allow": allow} if allow else {}
        if status == 401:
            extra["WWW-Authenticate"] = 'Bearer realm="overlord"'
        self._send(status, J.encode(J.error(msg_id, J.RpcError(code, text))), "application/json",
                   extra)

    def _send(self, status, data, ctype, extra=None):
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if data:
            self.wfile.write(data)

    # -- checks -------------------------------------------------------------------------------

    def _admitted(self):
        """Host, Origin and the launch token; refuses (and returns False) when one fails."""
        guard = self.server.guard
        if not guard.host_ok(self.headers):
            self._refuse(421, J.INVALID_REQUEST, "the Host header must name this server "
                         f"({guard.origin[7:]})")
            return False
        origin = self.headers.get("Origin")
        if origin is not None and origin != guard.origin:
            self._refuse(403, J.INVALID_REQUEST, f"requests from {origin[:80]!r} are refused; "
                         f"only {guard.origin} may ask")
            return False
        auth = self.headers.get("Authorization", "")
        if not (auth.startswith("Bearer ") and guard.token_ok(auth[7:].strip())):
            self._refuse(401, J.INVALID_REQUEST, "unauthorized: send the launch token as "
                         "Authorization: Bearer TOKEN (OVERLORD_HOME/ui.token)")
            return False
        if self.path.split("?", 1)[0] != PATH:
            self._refuse(404, J.INVALID_REQUEST, f"the MCP endpoint is {PATH}")
            return False
        return True

    def _body(self):
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") or length is None or not (
                length.isascii() and length.isdigit()):
            self._refuse(411, J.INVALID_REQUEST, "a POST needs a Content-Length")
            self.close_connection = True
            return None
        if int(length) > BODY_MAX:
            self._refuse(413, J.INVALID_REQUEST, f"a message is at most {BODY_MAX} bytes")
            self.close_connection = True
            return None
        return self.rfile.read(int(length))


def _hung_up(sock):
    """Whether the peer closed a connection it has nothing more to send on."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def serve(tools, host, port, err=None):
    """Bind host:port, print the URL and how to pass the token on err, serve until stopped."""
    err = err or sys.stderr
    token = access.load_token(ops.home())
    try:
        httpd = Server((host, port), Handler)
    except OSError as exc:
        raise OverlordError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    try:
        httpd.configure(tools, token, host)
        url = f"http://{host}:{httpd.server_address[1]}{PATH}"
        print(f"overlord mcp: serving {url}", file=err, flush=True)
        print(f"  send the launch token as `Authorization: Bearer {token}` "
              "(it is the UI's: OVERLORD_HOME/ui.token); Ctrl-C stops the server", file=err,
              flush=True)
        httpd.serve_forever(poll_interval=0.5)
    finally:
        httpd.server_close()
    return 0
