"""`overlord ui`: a threaded http.server (127.0.0.1; beyond it only with accounts and TLS:
transport.py), HTTP/1.1 keep-alive.

One handler class dispatches every request through the same sequence, top to bottom:
the rate limit (429) -> Host (421) -> path (400) -> /healthz -> ?token= exchange (303) -> the principal (401, or the
sign-in page) -> origin (403) -> route (404/405) -> body (411/413/400) -> the route's rule
(roles.py: 404 for another's session, 403 for a viewer's change or a non-admin) -> the page,
the asset or the API call, whose errors become JSON with their status (never a 500 for a
client's mistake). TABLE is every route with its handler and its rule.

The principal: while no account exists, the launch token (Bearer or its cookie) is auth.LAUNCH,
the operator and admin; once one does (auth.enabled(), read per request), a login cookie or an
`ovl_` bearer token names the account, and the launch token alone names no one. The routes
that sign in (roles.OPEN) need none. Every request runs under audit.acting_as(the account), so
what it appends -- through the launcher, and from a conversation's or a review's thread --
names it.

The server calls overlord.ops in-process. Before its first thread it forks the launcher
(overlord/ops/launcher.py), which performs every session open and command for it: namespaces never come
from this multithreaded process.
"""
import http.server
import itertools
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.parse

from overlord import ops
from overlord.errors import OverlordError, UsageError
from overlord.ops import execute
from overlord.ops import launcher
from overlord.ops import auth
from overlord.ops import audit
from overlord.web import accounts, api, egress, pages, running, security, transport
from overlord.web import roles as R
from overlord.web import settings as S
from overlord.web.chats import Chats
from overlord.web.reviews import Reviews

MAX_BODY = 1 << 20
DRAIN_MAX = 8 << 20           # a refused body up to this size is read (and dropped) before the 413
SID = re.compile(r"\A\d{8}-\d{6}-[0-9a-f]{6}\Z")
S_ID = object()               # a route segment that is a session id
NAME = object()               # a route segment that is a skill name
USER = object()               # a route segment that is an account name
TOKEN_ID = object()           # a route segment that is a script token's id
HOOK = object()               # a route segment that is a webhook's name
SKILL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
USER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.@+'=!#$%&*?^`{|}~-]{0,253}$")
TOKEN_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SEGMENTS = {S_ID: (SID, "not a session id: {!r} (expected YYYYMMDD-HHMMSS-xxxxxx)"),
            NAME: (SKILL_NAME, "not a skill name: {!r} (lower-case letters, digits and dashes, "
                               "at most 64)"),
            USER: (USER_NAME, "not an account name: {!r}"),
            TOKEN_ID: (TOKEN_NAME, "not a token id: {!r}"),
            HOOK: (running.HOOK_NAME, "not a webhook name: {!r} (letters, digits, '.', '_' and "
                                      "'-', at most 64)")}

# (method, path pattern) -> (what answers, who may call it: overlord/web/roles.py). The one
# table: ROUTES and RULES are its two columns; a route without a rule cannot be added.
TABLE = (
    (("GET", ("",)), "workspace", R.ANY),
    (("GET", ("console",)), "console", R.ANY),
    (("GET", ("api", "sessions")), api.sessions, R.ANY),
    (("GET", ("api", "session", S_ID)), api.session, R.SEE),
    (("POST", ("api", "session", S_ID, "commit")), api.commit, R.CHANGE),
    (("POST", ("api", "session", S_ID, "rollback")), api.rollback, R.CHANGE),
    (("POST", ("api", "session", S_ID, "rewind")), api.rewind, R.CHANGE),
    (("POST", ("api", "session", S_ID, "fork")), api.fork, R.CHANGE),
    (("POST", ("api", "session", S_ID, "revert")), api.revert, R.CHANGE),
    (("GET", ("api", "session", S_ID, "check")), api.check, R.SEE),
    (("POST", ("api", "session", S_ID, "review")), api.review, R.CHANGE),
    (("GET", ("api", "session", S_ID, "reviews")), api.reviews, R.SEE),
    (("GET", ("api", "audit")), api.audit, R.AUDIT),
    (("GET", ("api", "blame")), api.blame, R.ANY),
    (("GET", ("api", "chats")), api.chats, R.ANY),
    (("POST", ("api", "chats")), api.start_chat, R.WRITE),
    (("GET", ("api", "chats", S_ID)), api.chat, R.SEE),
    (("POST", ("api", "chats", S_ID, "message")), api.chat_message, R.CHANGE),
    (("POST", ("api", "chats", S_ID, "cancel")), api.chat_cancel, R.CHANGE),
    (("POST", ("api", "chats", S_ID, "approval")), api.chat_approval, R.CHANGE),
    (("GET", ("api", "connectors")), api.connectors, R.ANY),
    (("GET", ("api", "chats", S_ID, "events")), "events", R.SEE),
    (("GET", ("api", "settings")), api.get_settings, R.ANY),
    (("PUT", ("api", "settings")), api.put_settings, R.WRITE),
    (("GET", ("api", "models")), api.models, R.ANY),
    (("GET", ("api", "memory")), api.memory_folder, R.ANY),
    (("GET", ("api", "memory", "user")), api.memory_user, R.ANY),
    (("PUT", ("api", "memory", "user")), api.put_memory_user, R.WRITE),
    (("GET", ("api", "chats", S_ID, "memory")), api.chat_memory, R.SEE),
    (("POST", ("api", "chats", S_ID, "memory", "accept")), api.chat_memory_accept, R.CHANGE),
    (("GET", ("api", "skills")), api.skills, R.ANY),
    (("POST", ("api", "skills")), api.skill_add, R.ADMIN),
    (("GET", ("api", "skills", NAME)), api.skill, R.ANY),
    (("DELETE", ("api", "skills", NAME)), api.skill_remove, R.ADMIN),
    # accounts and sign-in (overlord/web/accounts.py)
    (("GET", ("login",)), "signin", R.OPEN),
    (("POST", ("api", "login")), accounts.login, R.OPEN),
    (("POST", ("api", "logout")), accounts.logout, R.OPEN),
    (("GET", ("api", "whoami")), accounts.whoami, R.OPEN),
    (("GET", ("sso", "start")), accounts.sso_start, R.OPEN),
    (("GET", ("sso", "callback")), accounts.sso_callback, R.OPEN),
    (("GET", ("api", "users")), accounts.users, R.ADMIN),
    (("POST", ("api", "users")), accounts.user_add, R.ADMIN),
    (("PUT", ("api", "users", USER)), accounts.user_change, R.ADMIN),
    (("DELETE", ("api", "users", USER)), accounts.user_remove, R.ADMIN),
    (("POST", ("api", "me", "password")), accounts.my_password, R.PERSON),
    (("GET", ("api", "me", "tokens")), accounts.my_tokens, R.ACCOUNT),
    (("POST", ("api", "me", "tokens")), accounts.my_token_mint, R.PERSON),
    (("DELETE", ("api", "me", "tokens", TOKEN_ID)), accounts.my_token_revoke, R.ACCOUNT),
    # running it for real (overlord/web/running.py): the meter, notifications, export
    (("GET", ("api", "usage")), running.usage, R.ANY),
    (("GET", ("api", "session", S_ID, "export")), running.export, R.SEE),
    # the recorded network (overlord/web/egress.py): what a --net proxy session talked to
    (("GET", ("api", "session", S_ID, "egress")), egress.report, R.SEE),
    (("GET", ("api", "webhooks")), running.webhooks, R.ADMIN),
    (("POST", ("api", "webhooks")), running.webhook_add, R.ADMIN),
    (("PUT", ("api", "webhooks", "base-url")), running.webhook_base_url, R.ADMIN),
    (("GET", ("api", "webhooks", "deliveries")), running.webhook_deliveries, R.ADMIN),
    (("DELETE", ("api", "webhooks", HOOK)), running.webhook_remove, R.ADMIN),
    (("POST", ("api", "webhooks", HOOK, "test")), running.webhook_test, R.ADMIN),
)
ROUTES = {key: handler for key, handler, _ in TABLE}
RULES = {key: rule for key, _, rule in TABLE}


class HTTPError(Exception):
    def __init__(self, status, message, **extra):
        super().__init__(message)
        self.status, self.extra = status, extra


class Request:
    def __init__(self, method, segments, query, body, principal, handler=None):
        self.method, self.segments, self.query = method, segments, query
        self.body, self.principal = body, principal
        self.handler = handler        # the request handler (its headers, address, cookies)
        self.form = False             # the body came as a form (the sign-in page's)

    @property
    def address(self):
        return self.handler.client_address[0] if self.handler else None

    def cookie(self, name):
        return self.handler.cookie(name) if self.handler else None

    @property
    def headers(self):
        return self.handler.headers if self.handler else {}


class App:
    """What every request shares: the guard, the settings, the conversations, the pages."""

    def __init__(self, guard, store, backends, static=pages.STATIC):
        self.guard, self.settings, self.backends = guard, store, backends
        self.chats = Chats(store)
        self.reviews = Reviews()
        self.pages = pages.Pages(static)
        self.closing = threading.Event()
        self.flows = None             # single sign-on's pending flows (oidc.Flows), made on use
        self._lock = threading.Lock()
        self._own = {}                # account name -> its Settings (users/<name>/ui.json)

    def settings_for(self, principal):
        """The settings a request reads and writes: the account's own (users/<name>/ui.json),
        or the machine's for the launch token."""
        name = R.owner_name(principal)
        if name is None:
            return self.settings
        with self._lock:
            own = self._own.get(name)
            if own is None:
                own = self._own[name] = S.Settings(self.settings.default_folder,
                                                   path=S.user_path(name))
            return own

    def sso_flows(self):
        with self._lock:
            if self.flows is None:
                from overlord.ops import sso
                self.flows = sso.Flows()
            return self.flows


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address, app, tls=None, limiter=None, log_json=False):
        """tls: an ssl.SSLContext (transport.context) or None; limiter: a
        transport.RateLimiter or None; log_json: one JSON line a request on stderr."""
        self.app, self.tls, self.limiter, self.log_json = app, tls, limiter, log_json
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def get_request(self):
        """Accept; under TLS wrap the socket without a handshake (the handler thread does it)."""
        sock, address = super().get_request()
        if self.tls is not None:
            sock = transport.wrap(self.tls, sock)
        return sock, address

    def handle_error(self, request, client_address):
        """A browser dropping a keep-alive connection, a failed or abandoned TLS handshake (a
        plain-HTTP probe at the TLS port): not an error worth a traceback."""
        if transport.quiet(sys.exc_info()[1]):
            return
        super().handle_error(request, client_address)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "overlord-ui"
    sys_version = ""
    timeout = 30                   # an idle keep-alive connection or a stalled client
    who = None                     # the request's principal, for the log: a name, "launch" or None
    route_key = None               # (method, pattern) of the route find() matched
    form_body = False              # the body came as a form (the sign-in page's)

    @property
    def app(self):
        return self.server.app

    retry_after = None             # a 429's Retry-After seconds (fail() sets it)

    def setup(self):
        if getattr(self.server, "tls", None) is not None:
            transport.handshake(self.request)    # here, in this connection's thread; Shrugged
        super().setup()
        # an answer, or an event of a stream, leaves at once: with Nagle's algorithm a second
        # small write waits for the client's delayed ACK (40 ms, on a keep-alive connection)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def version_string(self):
        return self.server_version

    def parse_request(self):
        self.began, self.who, self.retry_after = time.monotonic(), None, None
        return super().parse_request()

    def log_request(self, code="-", size="-"):
        """--log-json: one JSON line a request (overlord/web/transport.py says what it holds)."""
        if not getattr(self.server, "log_json", False):
            return super().log_request(code, size)
        guard = self.app.guard if getattr(self.server, "app", None) else None
        began = getattr(self, "began", None)
        transport.log_json(sys.stderr, self.who, getattr(self, "command", None),
                           getattr(self, "path", None), int(code) if code != "-" else None,
                           (time.monotonic() - began) * 1000 if began else 0.0,
                           (guard.token, guard.cookie_value) if guard else ())

    def rate_limit(self):
        """The per-address rate limit (--rate-limit): a 429 with Retry-After when it is spent."""
        limiter = getattr(self.server, "limiter", None)
        retry = limiter.check(self.client_address[0]) if limiter is not None else None
        if retry:
            self.close_if_body()
            raise HTTPError(429, f"too many requests from this address; try again in {retry} s",
                            retry_after=retry)

    def log_message(self, fmt, *args):
        """OVERLORD_UI_LOG: one line a request, with the launch token and credentials redacted
        (the first request of a session is `GET /?token=...`)."""
        if os.environ.get("OVERLORD_UI_LOG"):
            guard = self.app.guard if getattr(self.server, "app", None) else None
            known = (guard.token, guard.cookie_value) if guard else ()
            line = "%s - %s" % (self.address_string(), fmt % args)
            sys.stderr.write(security.redact(line, known) + "\n")

    def do_GET(self):
        self.serve()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    # -- the sequence -----------------------------------------------------------------------

    def serve(self):
        try:
            self.respond(self.route())
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a hang
            try:
                self.fail(exc)
            except OSError:
                self.close_connection = True     # the client went away meanwhile

    def fail(self, exc):
        """Answer a request that raised, as JSON with its status. Whatever the handler had
        begun (a status line and headers buffered, not sent) is thrown away first, so the
        client always gets one whole answer -- never a hang, never half an answer."""
        self._headers_buffer = []
        self.retry_after = getattr(exc, "retry_after", None) or (
            exc.extra.get("retry_after") if isinstance(exc, HTTPError) else None)
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            self.close_connection = True
        elif isinstance(exc, HTTPError):
            self.send_json(exc.status, {"error": str(exc), **exc.extra})
        elif isinstance(exc, S.Invalid):
            self.send_json(400, {"error": str(exc), "field": exc.field})
        elif isinstance(exc, OverlordError):
            self.send_json(exc.http_status, api.refusal(exc))
        elif isinstance(exc, OSError):
            # a session's files moved while they were read (a command sealing, a commit)
            where = f" ({exc.filename})" if exc.filename else ""
            self.send_json(503, {"error": f"the session changed while it was read: "
                                          f"{exc.strerror or exc}{where}; try again"})
        else:  # a bug: logged and answered, never a dropped socket
            traceback.print_exception(type(exc), exc, exc.__traceback__)
            self.send_json(500, {"error": "internal error (the server's log has the details)"})

    def route(self):
        self.rate_limit()
        guard = self.app.guard
        self.who = None
        if not guard.host_ok(self.headers):
            raise HTTPError(421, "this server answers only to " + guard.origin)
        segments, query = self.parse_target()
        if self.command == "GET" and segments == ("healthz",):
            return 200, {"ok": True}
        accounts_on = auth.enabled()              # read per request: the first `users add` counts
        if "token" in query:
            return self.exchange(segments, query, accounts_on)
        if segments[0] == "static" and len(segments) == 2 and self.command == "GET":
            return self.static(segments[1], query)     # the package's own files: no secret
        api_call = segments[0] == "api"
        principal, how = self.identify(accounts_on)
        self.who = (principal.name or "launch") if principal is not None else None
        if principal is None and self.rule_of(segments) != R.OPEN:
            self.close_if_body()
            need_account = accounts_on or not getattr(guard, "loopback", True)
            if api_call or self.command != "GET":
                raise HTTPError(401, R.sign_in_words(need_account))
            if need_account:
                return self.signin_page(401, {"next": self.path})
            return self.page(401, "unauthorized.html")
        # no principal (an open route): a script's request (no Origin, no Sec-Fetch-Site) may
        # sign in; a browser's must come from this very origin, as a change with a cookie must
        why = guard.cross_origin(self.command, self.headers, how or "bearer", api_call)
        if why:
            self.close_if_body()
            raise HTTPError(403, why)
        handler, sid = self.find(segments)
        rule = RULES.get(self.route_key, R.ADMIN)          # a route without a rule: admins only
        body = self.read_body(form=rule == R.OPEN and self.command == "POST")
        with audit.acting_as(principal.actor if principal is not None else None):
            R.check(rule, principal, sid)
            if handler == "workspace":
                return self.page(200, "workspace.html")
            if handler == "console":
                rows = api.register(self.app, principal)
                return self.page(200, "console.html", register=self.app.pages.register_rows(rows),
                                 count=f"{len(rows)} session{'' if len(rows) == 1 else 's'}")
            if handler == "signin":
                return self.signin_page(200, query)
            req = Request(self.command, segments, query, body, principal, self)
            req.form = self.form_body
            if handler == "events":
                return Stream(self.app.chats.stream(sid, alive=self.still_signed_in(principal, sid)))
            try:
                answer = handler(self.app, req, sid) if sid else handler(self.app, req)
            except OverlordError as exc:
                if handler is accounts.sso_callback and self.navigating():
                    # a person's browser, back from the provider: the sign-in page says it
                    # did not complete (the refusal is on the audit chain), not a JSON body
                    return self.signin_page(exc.http_status, {"error": "sso"})
                raise
        if isinstance(answer, (Reply, Redirect, Page, running.Download)):
            return answer
        return 200, answer

    def identify(self, accounts_on):
        """(principal, how: "bearer"|"cookie"|None). Accounts off: the launch token (Bearer or
        its cookie) is auth.LAUNCH. Accounts on: a login cookie or an `ovl_` bearer token names
        the account; the launch token alone names no one."""
        guard = self.app.guard
        if not accounts_on:
            if not getattr(guard, "loopback", True):
                return None, None        # beyond loopback the launch token never does (the
                #                          last account removed while the server runs)
            how = guard.principal(self.headers)
            return (auth.LAUNCH, how) if how else (None, None)
        value = self.headers.get("Authorization", "")
        if value:
            token = value[7:].strip() if value.startswith("Bearer ") else ""
            found = auth.bearer(token) if token.startswith("ovl_") else None
            return (found, "bearer") if found is not None else (None, None)
        cookie = self.cookie(guard.cookie_name(accounts.LOGIN))
        found = auth.login_lookup(cookie) if cookie else None
        return (found, "cookie") if found is not None else (None, None)

    RECHECK = 5.0                  # seconds between two checks that a stream's reader may still read

    def still_signed_in(self, principal, sid):
        """alive() for a conversation's stream: False once the server stops, or (at most
        RECHECK seconds later) once the reader's login or token has ended or it may no longer
        see the session -- a signed-out or removed account stops hearing the conversation."""
        state = {"checked": time.monotonic(), "ok": True}

        def alive():
            if self.app.closing.is_set() or not state["ok"]:
                return False
            if principal.via == "launch" or time.monotonic() - state["checked"] < self.RECHECK:
                return True
            state["checked"] = time.monotonic()
            try:
                now, _ = self.identify(auth.enabled())
                state["ok"] = now is not None and R.session_meta(now, sid) is not None
            except OverlordError:
                state["ok"] = False
            return state["ok"]
        return alive

    def cookie(self, name):
        """The first value of cookie `name` among the request's Cookie headers, or None."""
        for raw in self.headers.get_all("Cookie") or ():
            for part in raw.split(";"):
                key, eq, value = part.strip().partition("=")
                if eq and key == name:
                    value = value.strip()
                    if len(value) >= 2 and value[0] == value[-1] == '"':
                        value = value[1:-1]
                    return value if 0 < len(value) <= 512 else None
        return None

    def navigating(self):
        """Whether a browser is loading this as a page (not a script asking for JSON)."""
        return self.headers.get("Sec-Fetch-Mode") == "navigate" or \
            "text/html" in self.headers.get("Accept", "")

    def signin_page(self, status, query):
        """The sign-in page (D's signin.html): ?next= (a path here), ?error= and whether single
        sign-on is configured (its button)."""
        return self.page(status, "signin.html", next=accounts.safe_next(query.get("next")),
                         error=query.get("error") or None, sso=accounts.sso_on())

    def parse_target(self):
        """(decoded path segments, {query name: first value}). Dot segments and encoded
        slashes are refused outright, whichever way they are spelled."""
        raw = self.path
        if not raw.startswith("/") or raw.startswith("//"):
            raise HTTPError(400, "the request target must be a path")
        path, _, qs = raw.partition("?")
        path = path.split("#", 1)[0]
        segments = []
        for seg in path[1:].split("/"):
            try:
                seg = urllib.parse.unquote(seg, errors="strict")
            except UnicodeDecodeError:
                raise HTTPError(400, "the path is not UTF-8") from None
            if seg in (".", "..") or "/" in seg or "\\" in seg or "\0" in seg:
                raise HTTPError(400, "bad path: dot segments and encoded slashes are refused")
            segments.append(seg)
        try:
            pairs = urllib.parse.parse_qsl(qs, keep_blank_values=True, strict_parsing=False,
                                           errors="strict", max_num_fields=50)
        except (ValueError, UnicodeDecodeError):
            raise HTTPError(400, "bad query string") from None
        query = {}
        for k, v in pairs:
            query.setdefault(k, v)
        return tuple(segments), query

    def rule_of(self, segments):
        """The rule of the route these segments name for this method (None: no such route)."""
        for (method, pattern) in ROUTES:
            if method == self.command and len(pattern) == len(segments) and all(
                    want in SEGMENTS or want == seg for want, seg in zip(pattern, segments)):
                return RULES.get((method, pattern), R.ADMIN)
        return None

    def find(self, segments):
        allowed = []
        for (method, pattern), handler in ROUTES.items():
            if len(pattern) != len(segments):
                continue
            got, kind = None, None
            for want, seg in zip(pattern, segments):
                if want in SEGMENTS:
                    got, kind = seg, want
                elif want != seg:
                    break
            else:
                if kind is not None and not SEGMENTS[kind][0].match(got):
                    raise HTTPError(400, SEGMENTS[kind][1].format(got[:40]))
                if method == self.command:
                    self.route_key = (method, pattern)
                    return handler, got
                allowed.append(method)
        if allowed:
            self.close_if_body()
            raise HTTPError(405, f"{self.command} is not allowed here", allow=sorted(set(allowed)))
        raise HTTPError(404, "no such page or API route")

    def exchange(self, segments, query, accounts_on=False):
        """?token=T: set the cookie and send the browser to the same URL without the token.
        Once accounts exist the launch token proves no one: the browser goes to the sign-in
        page (without the token in its address bar)."""
        if self.command != "GET" or not self.app.guard.token_ok(query["token"]):
            self.close_if_body()
            raise HTTPError(401, "that token is not this server's launch token")
        rest = urllib.parse.urlencode([(k, v) for k, v in query.items() if k != "token"])
        location = "/" + "/".join(urllib.parse.quote(s) for s in segments) + (f"?{rest}" if rest else "")
        if accounts_on or not getattr(self.app.guard, "loopback", True):
            return Redirect("/login?" + urllib.parse.urlencode({"next": location}))
        return Redirect(location, self.app.guard.set_cookie())

    def close_if_body(self):
        if self.headers.get("Content-Length", "0") not in ("", "0") or self.headers.get("Transfer-Encoding"):
            self.close_connection = True

    def read_body(self, form=False):
        """The JSON object the request carries (None when it has none). With `form` (the
        open routes: the sign-in page posts its form) application/x-www-form-urlencoded too."""
        self.form_body = False
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise HTTPError(411, "send the body with a Content-Length")
        length = self.headers.get("Content-Length")
        if not length:
            return None
        if not length.isdigit():
            self.close_connection = True
            raise HTTPError(400, "bad Content-Length")
        n = int(length)
        if n > MAX_BODY:
            self.close_connection = True
            if n <= DRAIN_MAX:
                self.drain(n)           # closing on an unread body resets the connection, and
                #                         the client would lose the 413 with its own write
            raise HTTPError(413, f"the body is over {MAX_BODY >> 10} KiB")
        data = self.rfile.read(n)
        if len(data) != n:
            self.close_connection = True
            raise HTTPError(400, "the body ended early")
        if not data.strip():
            return None
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if form and ctype == "application/x-www-form-urlencoded":
            try:
                pairs = urllib.parse.parse_qsl(data.decode("utf-8", "strict"), keep_blank_values=True,
                                               max_num_fields=20)
            except (ValueError, UnicodeDecodeError):
                raise HTTPError(400, "bad form body") from None
            self.form_body = True
            body = {}
            for k, v in pairs:
                body.setdefault(k, v)
            return body
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise HTTPError(400, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "the body must be a JSON object")
        return body

    def drain(self, n):
        """Read and throw away n bytes of a refused body (or until the client stops)."""
        while n > 0:
            chunk = self.rfile.read(min(n, 1 << 16))
            if not chunk:
                return
            n -= len(chunk)

    # -- answers ------------------------------------------------------------------------------

    def page(self, status, template, **slots):
        nonce = security.nonce()
        return Page(status, self.app.pages.render(template, nonce, **slots).encode(), nonce)

    def static(self, name, query):
        asset = self.app.pages.asset(name)
        if asset is None:
            raise HTTPError(404, "no such asset")
        fixed = query.get("v") == asset.version
        return Blob(asset.data, asset.type, "public, max-age=31536000, immutable" if fixed else "no-store")

    def respond(self, answer):
        if isinstance(answer, Stream):
            return self.send_stream(answer)
        if isinstance(answer, running.Download):
            return self.send_download(answer)
        if isinstance(answer, Redirect):
            self.start(303, [("Location", answer.location)] +
                       [("Set-Cookie", c) for c in answer.cookies])
            self.finish_body(b"", "text/plain; charset=utf-8")
            return
        if isinstance(answer, Reply):
            body = api.encode(answer.data)
            self.start(answer.status, [("Set-Cookie", c) for c in answer.cookies])
            self.finish_body(body, "application/json; charset=utf-8")
            return
        if isinstance(answer, Page):
            self.start(answer.status, [("Set-Cookie", c) for c in answer.cookies], answer.nonce)
            self.finish_body(answer.data, "text/html; charset=utf-8")
            return
        if isinstance(answer, Blob):
            self.start(200, [], cache=answer.cache)
            self.finish_body(answer.data, answer.type)
            return
        status, data = answer
        self.send_json(status, data)

    def send_json(self, status, data):
        """One JSON answer. The body is encoded before anything is buffered, so a value that
        cannot be encoded fails before the status line, never half-way through an answer."""
        if isinstance(data, api.Encoded):
            self.start(status, [])
            return self.finish_body(data, "application/json; charset=utf-8")
        extra = []
        if status == 405 and isinstance(data, dict) and "allow" in data:   # the methods it takes
            extra.append(("Allow", ", ".join(data.pop("allow"))))
        body = api.encode(data)
        self.start(status, extra)
        self.finish_body(body, "application/json; charset=utf-8")

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (a bad request line, headers too long), as JSON."""
        self.close_connection = True
        try:
            self.start(code, [])
            self.finish_body(json.dumps({"error": message or "bad request"}).encode(),
                             "application/json; charset=utf-8")
        except OSError:
            pass

    def start(self, status, extra, nonce=None, cache="no-store"):
        self.send_response(status)
        for name, value in security.headers(nonce) + extra:
            self.send_header(name, value)
        if getattr(self.server, "tls", None) is not None:
            self.send_header(*transport.HSTS)
        if status == 429 and self.retry_after:
            self.send_header("Retry-After", str(int(self.retry_after)))
        self.send_header("Cache-Control", cache)

    def finish_body(self, data, ctype):
        """The headers and the body in one write (one system call, one packet when small)."""
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(data)
        self.flush_headers()

    def send_download(self, download):
        """A file as an attachment: its length first, then its bytes in chunks (a bundle need
        not fit in memory). A client gone half-way closes the connection, nothing more."""
        try:
            self.start(200, [("Content-Disposition", f'attachment; filename="{download.filename}"')])
            self.send_header("Content-Type", download.type)
            self.send_header("Content-Length", str(download.size))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command == "HEAD":
                return
            for chunk in download.chunks():
                self.wfile.write(chunk)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            download.close()

    def send_stream(self, stream):
        """Server-sent events until the page goes away (or the server stops). The first event
        is made before anything is sent, so a refusal is still an ordinary JSON error."""
        events = stream.events
        first = next(events)
        self.close_connection = True
        self.start(200, [("X-Accel-Buffering", "no"), ("Connection", "close")])
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.end_headers()
        self.wfile.write(b"retry: 1000\n\n")
        try:
            for name, data in itertools.chain([first], events):
                if name == "ping":
                    self.wfile.write(b": ping\n\n")
                else:
                    self.wfile.write(b"event: %s\ndata: %s\n\n" % (name.encode(), api.encode(data)))
                self.wfile.flush()
        except (OSError, ValueError):
            pass                      # the page went away
        except Exception:  # noqa: BLE001 - the headers are gone: log it and end the stream
            traceback.print_exc()
        finally:
            events.close()


class Stream:
    def __init__(self, events):
        self.events = events


class Redirect:
    def __init__(self, location, cookie=None):
        self.location = location
        self.cookies = [cookie] if cookie else []


class Reply:
    """A JSON answer that also sets cookies (signing in and out)."""

    def __init__(self, status, data, cookies=()):
        self.status, self.data, self.cookies = status, data, list(cookies)


class Page:
    def __init__(self, status, data, nonce, cookies=()):
        self.status, self.data, self.nonce = status, data, nonce
        self.cookies = list(cookies)


class Blob:
    def __init__(self, data, ctype, cache):
        self.data, self.type, self.cache = data, ctype, cache


# -- start-up ------------------------------------------------------------------------------------

def serve(port=7777, host="127.0.0.1", folder=None, out=None, tls_cert=None, tls_key=None,
          names=(), log_json=False, rate_limit=3000):
    """Check the bind, fork the launcher, bind, print the launch link, serve until interrupted.

    Beyond loopback (a bind not 127.0.0.0/8 or ::1) the server starts only with accounts and
    TLS (tls_cert and tls_key); `names` (--host) are the names clients use (the Host check's
    allowlist, the first one in the printed link)."""
    from overlord.ops import access
    out = out or sys.stdout
    host = transport.check_bind(host)
    if not 0 <= port <= 65535:
        raise UsageError("--port takes a number from 0 to 65535")
    if not isinstance(rate_limit, int) or rate_limit < 0:
        raise UsageError("--rate-limit takes a number of requests a minute per address (0: no limit)")
    checked = []
    for name in names:
        good = access.check_name(name)
        if good is None:
            raise UsageError(f"--host takes a host name or an IP address, not {str(name)[:80]!r}")
        checked.append(good)
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together: give both")
    tls = tls_cert is not None
    accounts = auth.enabled()
    if not transport.is_loopback(host):
        missing = ([] if accounts else ["accounts (overlord users add NAME --role admin)"]) + \
                  ([] if tls else ["TLS (--tls-cert F --tls-key F; overlord tls selfsign makes them)"])
        if missing:
            raise UsageError(f"--bind {host} is beyond loopback: it needs " + " and ".join(missing))
        if host in ("0.0.0.0", "::") and not checked:
            raise UsageError(f"--bind {host} answers on every address: name the host clients use "
                             "with --host NAME (the Host check allows only those)")
    ctx = transport.context(tls_cert, tls_key) if tls else None
    client = launcher.start()              # before any thread exists
    httpd = None
    try:
        execute.use_launcher(client)
        home = S.home()
        token = security.load_token(home)
        store = S.Settings(S.check_folder(folder) if folder else os.getcwd())
        backends = {name: {"available": ok, "reason": why} for name, (ok, why) in
                    ops.doctor().backends.items()}
        try:
            httpd = Server((host, port), None, tls=ctx, limiter=transport.RateLimiter(rate_limit),
                           log_json=log_json)
        except OSError as exc:
            raise OverlordError(f"cannot listen on {access.host_port(host, port)}: {exc.strerror}") from None
        bound = httpd.server_address[1]
        guard = security.Guard(token, host, bound, tls=tls, names=checked)
        httpd.app = App(guard, store, backends)
        if accounts:           # the launch token alone no longer signs anyone in
            print(f"overlord ui: {guard.origin}/ (sign in with your account)", file=out, flush=True)
        else:
            print(f"overlord ui: {guard.origin}/?token={token}", file=out, flush=True)
        print("  the workspace is /, the console /console; Ctrl-C stops the server", file=out, flush=True)

        if os.environ.get("OVERLORD_UI_LOG"):
            import faulthandler
            faulthandler.register(signal.SIGUSR1, all_threads=True)

        def stop(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, stop)
        try:
            httpd.serve_forever(poll_interval=0.5)
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        if httpd is not None:
            if getattr(httpd, "app", None):
                httpd.app.closing.set()
            httpd.server_close()
        execute.launcher = None
        client.close()
