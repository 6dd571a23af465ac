"""The one way out to a model endpoint: a request, its streamed answer, and bounded retries.

Retried (with exponential backoff, a bounded number of times): HTTP 408, 409, 429, 5xx and 529;
a reset, refused-after-connect or timed-out connection; a stream that breaks or ends before the
protocol's final event; an in-band error the provider marks as transient (e.g. overloaded).
A `retry-after` (or `retry-after-ms`) header is honoured exactly when it is at most MAX_WAIT
seconds; a longer one ends the call at once (waiting an hour is not a retry). `x-should-retry`
overrides the status when the server sends it. Not retried: other 4xx (a bad key, a bad request),
a refused connection, an unknown host or a certificate that fails verification (configuration,
not weather).

The rule for a stream that breaks after some of it was already shown: the call is restarted
cleanly. The Reply only ever holds one complete attempt; before the retry, on_delta receives
("restart", "") so a live view can drop what it printed. Nothing has run at that point: tool
calls are only handed back in the final Reply.

A cancel (the run's cancel token, overlord.agent.cancel.Cancel) ends a call within a moment,
whatever it is doing: every socket the call opens is watched by the token from before it
connects until the answer is read (set() shuts it down, so a blocked connect, TLS handshake or
read returns at once), every pause between retries waits on the token instead of sleeping, and
the token is checked before each attempt and after any failure. A cancelled call raises
Cancelled -- never a ProviderError, never a retry, no further request.

Tests make retries instant: set the module attribute `sleep` (then called with the seconds
instead of waiting on the token), or OVERLORD_RETRY_SCALE=0.
Knobs from the environment: OVERLORD_PROVIDER_RETRIES (default 4 retries after the first try),
OVERLORD_PROVIDER_TIMEOUT (connect and idle-read timeout, default 600 s: a non-streamed answer
may take minutes before its first byte), OVERLORD_RETRY_SCALE.
"""
import contextlib
import email.utils
import http.client
import json
import os
import random
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from overlord.agent.cancel import Cancel
from overlord.agent.providers import sse
from overlord.agent.providers.base import ProviderError

sleep = None                  # tests set a callable: pauses call it instead of waiting on the token
MAX_WAIT = 60.0               # the longest retry-after we are willing to sit out
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}
RATE_PREFIXES = ("anthropic-ratelimit-", "x-ratelimit-")
RATE_NAMES = ("retry-after", "retry-after-ms")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Dropped(Exception):
    """The answer broke off: the stream ended or failed before the protocol said it was done."""


def _env_num(name, default, kind=float):
    try:
        return kind(os.environ.get(name, default))
    except ValueError:
        return kind(default)


def retries():
    return max(0, _env_num("OVERLORD_PROVIDER_RETRIES", 4, int))


def timeout():
    return _env_num("OVERLORD_PROVIDER_TIMEOUT", 600.0)


def _pause(seconds, cancel):
    """The pause between two attempts: it ends at once (Cancelled) when the run is cancelled."""
    seconds *= _env_num("OVERLORD_RETRY_SCALE", 1.0)
    if seconds > 0:
        if sleep is not None:
            sleep(seconds)
        else:
            cancel.wait(seconds)
    cancel.check()


def backoff(attempt):
    """1, 2, 4, 8 ... seconds with jitter, capped at 30."""
    return min(30.0, 2.0 ** attempt) * random.uniform(0.75, 1.0)


def rate_headers(headers):
    """The rate-limit headers of a response, names lower-cased."""
    out = {}
    for name, value in (headers or {}).items():
        low = name.lower()
        if low.startswith(RATE_PREFIXES) or low in RATE_NAMES:
            out[low] = value
    return out


def retry_after(headers):
    """Seconds the server asks us to wait, from retry-after-ms / retry-after (seconds or a date)."""
    h = {k.lower(): v for k, v in (headers or {}).items()}
    try:
        if h.get("retry-after-ms"):
            return max(0.0, float(h["retry-after-ms"]) / 1000)
        value = h.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def scrub(text, secrets):
    """One line, bounded, with no secret in it (nor a masked echo of one)."""
    text = " ".join(str(text).split())
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "[redacted]")
            if len(s) >= 12:          # servers echo keys masked, keeping head and tail
                text = text.replace(s[-6:], "[redacted]")
    text = re.sub(r"\S*\*{4,}\S*", "[redacted]", text)
    return text if len(text) <= 300 else text[:297] + "..."


def error_detail(body):
    """(kind, message) from a provider's JSON error body, else (None, a snippet of it)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, body.decode("utf-8", "replace")[:200] if isinstance(body, bytes) else body
    if isinstance(data, list) and data and isinstance(data[0], dict):
        data = data[0]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        kind = err.get("type") or err.get("status") or err.get("code")
        return (str(kind) if kind is not None else None), err.get("message") or ""
    if isinstance(err, str):
        return None, err
    return None, json.dumps(data)[:200]


class Response:
    """A successful response being read: SSE events or one JSON document."""

    def __init__(self, raw, provider):
        self.raw, self.provider = raw, provider
        self.headers = {k.lower(): v for k, v in raw.headers.items()}

    def _readlines(self):
        while True:
            line = self.raw.readline()
            if not line:
                return
            yield line

    def events(self):
        try:
            yield from sse.parse(self._readlines())
        except sse.Truncated as e:
            raise Dropped(str(e)) from None

    def json(self):
        body = self.raw.read()
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise Dropped("the response was not complete JSON") from None


def _connect(watch, address, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):
    """socket.create_connection, each socket handed to watch() before it connects."""
    host, port = address
    error = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            watch(sock)
            if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(addr)
            return sock
        except OSError as e:
            error = e
            sock.close()
    raise error if error is not None else OSError("getaddrinfo returns an empty list")


class _Watching:
    """A urllib handler whose connections hand their socket to watch() before connecting: the
    proxy tunnel, the TLS handshake, the request and the answer all run on a watched socket."""

    def __init__(self, watch):
        super().__init__()
        self._watch = watch

    def do_open(self, http_class, req, **kw):
        def connection(*args, **kwargs):
            conn = http_class(*args, **kwargs)
            conn._create_connection = lambda *a, **k: _connect(self._watch, *a, **k)
            return conn
        return super().do_open(connection, req, **kw)


class _HTTP(_Watching, urllib.request.HTTPHandler):
    pass


class _HTTPS(_Watching, urllib.request.HTTPSHandler):
    pass


def _opener(url, watch):
    handlers = [_HTTP(watch), _HTTPS(watch)]
    host = urllib.parse.urlsplit(url).hostname or ""
    if host in LOOPBACK:   # a local server is never reached through a proxy
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


class _Retry(Exception):
    def __init__(self, error, wait):
        self.error, self.wait = error, wait


def _open(provider, method, url, headers, data, secrets, on_headers, attempt, watch):
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    host = urllib.parse.urlsplit(url).netloc
    try:
        raw = _opener(url, watch).open(req, timeout=timeout())
    except urllib.error.HTTPError as e:
        hdrs = dict(e.headers.items()) if e.headers else {}
        if on_headers and rate_headers(hdrs):
            on_headers(provider, rate_headers(hdrs))
        try:
            body = e.read(65536)
        except (OSError, http.client.HTTPException):
            body = b""
        kind, message = error_detail(body)
        text = f"{provider}: HTTP {e.code}" + (f" {kind}" if kind else "") + (f": {message}" if message else "")
        wait = retry_after(hdrs)
        should = {k.lower(): v for k, v in hdrs.items()}.get("x-should-retry")
        retryable = e.code in RETRY_STATUS if should not in ("true", "false") else should == "true"
        err = ProviderError(scrub(text, secrets), status=e.code, retryable=retryable, retry_after=wait)
        if retryable and wait is not None and wait > MAX_WAIT:
            raise ProviderError(scrub(f"{text} (the provider asks to wait {wait:.0f} s)", secrets),
                                status=e.code, retry_after=wait) from None
        if retryable:
            raise _Retry(err, wait if wait is not None else backoff(attempt)) from None
        raise err from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, (ConnectionRefusedError, socket.gaierror, ssl.SSLCertVerificationError,
                               str)):     # configuration, not weather: retrying will not help
            raise ProviderError(scrub(f"{provider}: cannot reach {host}: {_why(reason)}", secrets)) from None
        raise _Retry(ProviderError(scrub(f"{provider}: connection to {host} failed: {_why(reason)}",
                                         secrets), retryable=True), backoff(attempt)) from None
    except (http.client.HTTPException, OSError) as e:
        raise _Retry(ProviderError(scrub(f"{provider}: connection to {host} failed: {_why(e)}",
                                         secrets), retryable=True), backoff(attempt)) from None
    if on_headers and rate_headers(raw.headers):
        on_headers(provider, rate_headers(raw.headers))
    return raw


def _why(e):
    if isinstance(e, socket.timeout) or isinstance(e, TimeoutError):
        return "timed out"
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return text


def call(provider, method, url, headers, body, read, *, on_delta=None, on_headers=None, secrets=(),
         cancel=None):
    """Send `body` (a dict, JSON-encoded; None for a GET) and return read(Response, emit).

    `read` parses the answer, calling emit(kind, text) for streamed text; it raises Dropped when
    the answer broke off and ProviderError for an in-band error (retryable or not).
    `cancel` (a Cancel; None: a call nothing cancels but a signal handler) ends the call with
    Cancelled at any moment.
    """
    cancel = cancel if cancel is not None else Cancel()
    data = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
    headers = dict(headers)
    headers.setdefault("user-agent", "overlord")
    if data is not None:
        headers.setdefault("content-type", "application/json")
    tries = retries() + 1
    shown = [False]

    def emit(kind, text):
        if text and on_delta:
            shown[0] = True
            on_delta(kind, text)

    last = None
    for attempt in range(tries):
        cancel.check()
        if shown[0]:
            on_delta("restart", "")
            shown[0] = False
        with contextlib.ExitStack() as watched:
            def watch(sock):
                watched.enter_context(cancel.watch(sock))
            try:
                return _attempt(provider, method, url, headers, data, read, emit, secrets,
                                on_headers, attempt, watch)
            except _Retry as r:
                cancel.check()            # a cancel broke it: no retry
                last, wait = r.error, r.wait
            except Exception:
                cancel.check()            # a cancel broke it, whatever the failure looked like
                raise
        if attempt + 1 < tries:
            _pause(min(wait, MAX_WAIT), cancel)
    raise ProviderError(f"{last} (gave up after {tries} attempts)", status=last.status,
                        retryable=True, retry_after=last.retry_after)


def _attempt(provider, method, url, headers, data, read, emit, secrets, on_headers, attempt, watch):
    """One try: read's answer, or _Retry(the error, how long to wait) when another may help."""
    raw = _open(provider, method, url, headers, data, secrets, on_headers, attempt, watch)
    try:
        with raw:
            return read(Response(raw, provider), emit)
    except Dropped as e:
        last = ProviderError(scrub(f"{provider}: the answer broke off: {e}", secrets), retryable=True)
    except (http.client.HTTPException, OSError) as e:
        last = ProviderError(scrub(f"{provider}: the answer broke off: {_why(e)}", secrets),
                             retryable=True)
    except ProviderError as e:
        if not e.retryable:
            raise
        last = e
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        # an answer of the wrong shape: a gateway or server bug, not weather; one clean line
        raise ProviderError(scrub(f"{provider}: the endpoint's answer has an unexpected shape "
                                  f"({type(e).__name__}: {e})", secrets)) from None
    raise _Retry(last, last.retry_after if last.retry_after is not None else backoff(attempt))
