"""The streamable HTTP transport: each message is a POST to the server's URL.

A request's answer is JSON, or an SSE stream that may carry the server's own requests and
notifications before the response (a request is answered by a POST of its own: `ping` with
{}, anything else with -32601). Headers: `Accept: application/json, text/event-stream` and
`Content-Type: application/json`; the configured headers on every request; the handshake's
`Mcp-Session-Id` sent back once the server gave one; `MCP-Protocol-Version` on every request
once the revision is known; the 2026-07-28 revision adds `Mcp-Method` and, for a named
request (tools/call), `Mcp-Name`. A notification is answered 202. close() DELETEs the session.

One connection per message, its socket watched by the cancel token, so a cancel breaks a
blocked read at once. A loopback server is reached directly; another through the proxy the
environment names (https: a CONNECT tunnel), unless no_proxy says otherwise.
"""
import base64
import http.client
import ipaddress
import json
import re
import socket
import ssl
import time
import urllib.parse
import urllib.request

from overlord.agent.cancel import Cancel, Cancelled
from overlord.agent.connectors.client import (LINE_MAX, NAMED, NOTIFY_TIMEOUT, VERSION_KEY,
                                              ConnectorError, RemoteError, TimedOut, _clip,
                                              answer_to_server, secret_values)

CONNECT_MAX = 30.0                   # seconds a connection may take to open
_SAFE = re.compile(r"^[\x20-\x7E]*$")


def header_value(value):
    """An Mcp-Name value as sent: verbatim when it is plain printable ASCII without edge
    spaces, else the `=?base64?...?=` form."""
    if _SAFE.fullmatch(value) and value == value.strip() and not (
            value.startswith("=?base64?") and value.endswith("?=")):
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8", "surrogatepass")).decode() + "?="


def _loopback(host):
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Http:
    def __init__(self, server, log):
        self.name, self.log = server.name, log
        url = getattr(server, "url", None)
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectorError(f"connector {self.name}: the url must be http:// or https:// "
                                 "with a host")
        try:
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ConnectorError(f"connector {self.name}: the url's port is not a number") \
                from None
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/",
                                            parts.query, ""))
        # a header value that is secret://NAME: resolved now, as the server is reached
        self.headers = secret_values(self.name, "header", getattr(server, "headers", None))
        self.proxy = None if _loopback(self.host) else self._proxy(parts.scheme)
        self.session = None          # Mcp-Session-Id (the handshake)
        self.version = None          # MCP-Protocol-Version, once known
        self.modern = False          # the 2026-07-28 revision: Mcp-Method / Mcp-Name too

    # -- what the client calls ----------------------------------------------------------------

    def stateless(self, version):
        self.version, self.modern, self.session = version, True, None

    def handshake(self, version):
        self.version, self.modern = version, False

    def request(self, msg_id, message, deadline, cancel):
        cancel = cancel if cancel is not None else Cancel()
        modern = self.modern or bool(_enveloped(message))
        return self._exchange(message, deadline, cancel, modern, msg_id)

    def notify(self, message):
        deadline = time.monotonic() + NOTIFY_TIMEOUT
        self._exchange(message, deadline, Cancel(), self.modern, None)

    def _exchange(self, message, deadline, cancel, modern, msg_id):
        """POST message; the response to msg_id (None: a notification or an answer, whose
        reply is read and dropped)."""
        method = message.get("method") or "an answer"
        try:
            conn = self._connection(deadline)
        except OSError as exc:
            raise self._broken(exc, method, deadline, cancel) from None
        sock = conn.sock               # held: the connection lets go of it on Connection: close
        try:
            with cancel.watch(sock):
                response = self._post(conn, message, method, modern)
                if msg_id is None:
                    response.read(LINE_MAX)
                    return None
                return self._answer(sock, response, msg_id, method, deadline, cancel)
        except (OSError, http.client.HTTPException) as exc:
            raise self._broken(exc, method, deadline, cancel) from None
        except ConnectorError:
            if cancel.is_set():                # the watch shut the socket: a short read
                raise Cancelled() from None
            raise
        finally:
            conn.close()

    def close(self, hurry=False):
        """DELETE the session (handshake era); hurry: a shorter deadline for it."""
        if self.session is None:
            return
        deadline = time.monotonic() + (NOTIFY_TIMEOUT / 4 if hurry else NOTIFY_TIMEOUT)
        try:
            conn = self._connection(deadline)
            conn.putrequest("DELETE", self._target(), skip_accept_encoding=True)
            for key, value in self._headers(None, False).items():
                conn.putheader(key, value)
            conn.endheaders()
            conn.getresponse().read(LINE_MAX)
            conn.close()
        except (OSError, http.client.HTTPException, ValueError):
            pass
        self.log.write("closed the HTTP session")
        self.session = None

    # -- one POST -----------------------------------------------------------------------------

    def _post(self, conn, message, method, modern):
        """The response to one POST of message, its status checked."""
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass")
        try:
            conn.putrequest("POST", self._target(), skip_accept_encoding=True)
            for key, value in self._headers(message, modern).items():
                conn.putheader(key, value)
        except ValueError:
            raise ConnectorError(f"connector {self.name}: a configured header has an invalid "
                                 "name or value") from None
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        response = conn.getresponse()
        if method == "initialize" and response.status < 300:
            session = response.getheader("Mcp-Session-Id")
            if session and _SAFE.fullmatch(session):
                self.session = session
        if response.status >= 400:
            raise self._refused(response.status, response.read(LINE_MAX), method)
        if response.status >= 300:
            raise RemoteError(f"connector {self.name}: {method} answered HTTP "
                              f"{response.status} (redirects are not followed)",
                              status=response.status)
        return response

    def _refused(self, status, body, method):
        error = None
        try:
            msg = json.loads(body)
            if isinstance(msg, dict) and isinstance(msg.get("error"), dict):
                error = msg["error"]
        except ValueError:
            pass
        if error is not None:
            code = error.get("code") if isinstance(error.get("code"), int) else None
            return RemoteError(f"connector {self.name}: {method} failed: HTTP {status}: "
                               f"{_clip(error.get('message'), 200)} ({code})", code=code,
                               data=error.get("data"), status=status)
        what = {401: "unauthorized", 403: "forbidden", 404: "not found (or the session "
                "ended)", 405: "method not allowed"}.get(status, "refused")
        return RemoteError(f"connector {self.name}: {method} failed: HTTP {status} ({what})",
                           status=status)

    def _answer(self, sock, response, msg_id, method, deadline, cancel):
        ctype = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if response.status in (202, 204):
            raise ConnectorError(f"connector {self.name}: {method} was accepted (HTTP "
                                 f"{response.status}) but not answered")
        if ctype == "text/event-stream":
            return self._stream(sock, response, msg_id, method, deadline, cancel)
        if ctype != "application/json":
            raise ConnectorError(f"connector {self.name}: {method} was answered with "
                                 f"{_clip(ctype or 'no content type', 40)}, not JSON or SSE")
        self._settle(sock, deadline)
        body = response.read(LINE_MAX + 1)
        if len(body) > LINE_MAX:
            raise ConnectorError(f"connector {self.name}: its answer to {method} is over "
                                 f"{LINE_MAX >> 20} MiB")
        msg = self._decode(body, method)
        if not _is_response(msg) or msg.get("id") != msg_id:
            raise ConnectorError(f"connector {self.name}: answered {method} with something "
                                 "that is not its JSON-RPC response")
        return msg

    def _stream(self, sock, response, msg_id, method, deadline, cancel):
        """Read SSE events until the response to msg_id; the server's requests on the way are
        answered, its notifications ignored."""
        data, size = [], 0
        while True:
            self._settle(sock, deadline)
            line = response.readline(LINE_MAX + 1)
            if not line:
                raise ConnectorError(f"connector {self.name}: closed the event stream without "
                                     f"answering {method}")
            if len(line) > LINE_MAX:
                raise ConnectorError(f"connector {self.name}: sent an event line over "
                                     f"{LINE_MAX >> 20} MiB")
            line = line.rstrip(b"\r\n")
            if line:
                field, _, value = line.partition(b":")
                if field == b"data":
                    value = value[1:] if value.startswith(b" ") else value
                    size += len(value)
                    if size > LINE_MAX:
                        raise ConnectorError(f"connector {self.name}: sent an event over "
                                             f"{LINE_MAX >> 20} MiB")
                    data.append(value)
                continue                       # event:, id:, retry:, a comment
            if not data:
                continue
            msg = self._decode(b"\n".join(data), method)
            data, size = [], 0
            if _is_response(msg):
                if msg.get("id") == msg_id:
                    return msg
                continue                       # not ours: nobody awaits it
            if isinstance(msg.get("method"), str) and "id" in msg:
                self._answer_server(msg, cancel)
            # a notification (progress, logging, list_changed): nothing to do

    def _answer_server(self, msg, cancel):
        """Answer a server's request by a POST of its own."""
        answer = answer_to_server(msg["id"], msg["method"], self.log)
        try:
            self._exchange(answer, time.monotonic() + NOTIFY_TIMEOUT, cancel, self.modern, None)
        except (ConnectorError, Cancelled):
            pass

    def _decode(self, body, method):
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):
            msg = None
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            raise ConnectorError(f"connector {self.name}: answered {method} with garbage (not "
                                 "a JSON-RPC message)")
        return msg

    # -- plumbing -----------------------------------------------------------------------------

    def _headers(self, message, modern):
        headers = dict(self.headers)
        headers["Accept"] = "application/json, text/event-stream"
        if message is not None:
            headers["Content-Type"] = "application/json"
        if self.session is not None:
            headers["Mcp-Session-Id"] = self.session
        version = self.version or (_enveloped(message) if message else None)
        if version:
            headers["MCP-Protocol-Version"] = version
        if modern and message is not None and isinstance(message.get("method"), str):
            headers["Mcp-Method"] = message["method"]
            key = NAMED.get(message["method"])
            params = message.get("params") if isinstance(message.get("params"), dict) else {}
            if key and isinstance(params.get(key), str):
                headers["Mcp-Name"] = header_value(params[key])
        return headers

    def _target(self):
        if self.proxy is not None and not self.https:
            return self.url                    # a plain-HTTP proxy takes the absolute URL
        return self.path

    def _connection(self, deadline):
        timeout = min(CONNECT_MAX, max(0.01, deadline - time.monotonic()))
        host, port = self.proxy if self.proxy is not None else (self.host, self.port)
        if self.https:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                               context=ssl.create_default_context())
            if self.proxy is not None:
                conn.set_tunnel(self.host, self.port)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.connect()
        return conn

    def _settle(self, sock, deadline):
        """Bound the next read by the request's deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        sock.settimeout(left)

    def _broken(self, exc, method, deadline, cancel):
        """The error for a connection that failed under a request."""
        if cancel.is_set():
            return Cancelled()
        if isinstance(exc, socket.timeout) or time.monotonic() >= deadline:
            return TimedOut(f"connector {self.name}: timed out")
        if isinstance(exc, ConnectionRefusedError):
            return ConnectorError(f"connector {self.name}: the server refused the connection "
                                  f"({method})")
        if isinstance(exc, ssl.SSLError):
            return ConnectorError(f"connector {self.name}: TLS failed ({_clip(exc.reason or exc)}) "
                                  f"during {method}")
        if isinstance(exc, socket.gaierror):
            return ConnectorError(f"connector {self.name}: cannot resolve the server's host")
        return ConnectorError(f"connector {self.name}: the connection failed during {method} "
                              f"({type(exc).__name__})")

    def _proxy(self, scheme):
        proxies = urllib.request.getproxies()
        url = proxies.get(scheme)
        if not url or urllib.request.proxy_bypass(self.host):
            return None
        parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if not parts.hostname:
            return None
        try:
            return parts.hostname, parts.port or 80
        except ValueError:
            return None


def _enveloped(message):
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(VERSION_KEY) if isinstance(meta, dict) else None


def _is_response(msg):
    return "method" not in msg and "id" in msg and ("result" in msg or "error" in msg)
