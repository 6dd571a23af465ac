"""What `overlord ui` needs beyond loopback: TLS, the bind's rules, and a per-address rate limit.

TLS: the listening socket accepts plain TCP; each accepted connection is wrapped without a
handshake (no I/O in the accepting thread) and the handshake is done in the connection's own
handler thread with a timeout (`handshake`). A plain-HTTP probe at the TLS port, a scanner, a
client that does not trust the certificate or one that connects and says nothing is closed
quietly: no traceback, no thread left waiting. TLS 1.2 at least.

The rate limit is a token bucket per client address: `per_minute` requests may come at once,
and the bucket refills at per_minute/60 a second; an empty bucket answers 429 with the seconds
until the next request would pass (Retry-After).
"""
import ipaddress
import math
import os
import ssl
import threading
import time

from overlord.errors import UsageError

HANDSHAKE_TIMEOUT = 10.0          # seconds a new connection has to finish its TLS handshake
HSTS = ("Strict-Transport-Security", "max-age=31536000")


class Shrugged(Exception):
    """A connection closed before HTTP began (a failed or abandoned TLS handshake): not an
    error worth a line."""


def handshake_timeout():
    try:
        value = float(os.environ.get("OVERLORD_UI_HANDSHAKE_TIMEOUT", ""))
    except ValueError:
        return HANDSHAKE_TIMEOUT
    return value if 0 < value <= 300 else HANDSHAKE_TIMEOUT


def is_loopback(address):
    return ipaddress.ip_address(address).is_loopback


def check_bind(value):
    """`--bind ADDR`: an IP address (v4 or v6), normalized."""
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise UsageError(f"--bind takes an IP address (127.0.0.1, ::1, 0.0.0.0, an address of "
                         f"this machine), not {value[:80]!r}") from None


def context(cert, key):
    """The server's TLS context from a PEM certificate (chain) and its key: TLS 1.2 or later.
    An unreadable file, a file that is not PEM, an encrypted key or a key that is not the
    certificate's is one UsageError line."""
    for what, path in (("certificate", cert), ("key", key)):
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as exc:
            raise UsageError(f"cannot read the TLS {what} {path}: {exc.strerror or exc}") from None

    def no_password():
        raise UsageError(f"the TLS key {key} is encrypted: give an unencrypted key (mode 0600)")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        ctx.set_alpn_protocols(["http/1.1"])
    except (NotImplementedError, ssl.SSLError):
        pass
    try:
        ctx.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as exc:
        reason = getattr(exc, "reason", None) or ""
        if "MISMATCH" in reason:
            raise UsageError(f"the TLS key {key} is not the key of the certificate {cert}") from None
        raise UsageError(f"the TLS certificate {cert} and key {key} are not a PEM certificate "
                         f"and its key ({reason.lower().replace('_', ' ') or exc})") from None
    except OSError as exc:
        raise UsageError(f"cannot read the TLS certificate or key: {exc.strerror or exc}") from None
    return ctx


def wrap(ctx, sock):
    """An accepted socket wrapped for TLS, the handshake not yet done (no I/O here)."""
    return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


def handshake(sock, timeout=None):
    """Do the TLS handshake of an accepted, wrapped socket within `timeout` seconds; raise
    Shrugged when it fails or the client goes silent (the caller closes the socket)."""
    sock.settimeout(timeout or handshake_timeout())
    try:
        sock.do_handshake()
    except (ssl.SSLError, OSError, ValueError) as exc:     # a plain-HTTP probe: SSLError too
        raise Shrugged(type(exc).__name__) from None


def quiet(exc):
    """Whether a failure on a connection is a client's doing, not worth a traceback."""
    return isinstance(exc, (Shrugged, ConnectionError, TimeoutError, ssl.SSLError))


class RateLimiter:
    """`per_minute` requests a minute per address (a token bucket; 0: no limit)."""

    PRUNE_AT = 4096               # addresses tracked before full buckets are forgotten

    def __init__(self, per_minute):
        self.per_minute = int(per_minute)
        self.rate = self.per_minute / 60.0
        self.buckets = {}         # address -> [tokens, last monotonic time]
        self.lock = threading.Lock()

    def check(self, address, now=None):
        """None when a request from `address` may pass (and it is counted), else the whole
        seconds until one would."""
        if self.per_minute <= 0:
            return None
        now = time.monotonic() if now is None else now
        from overlord.ops import auth
        address = auth.address_key(address)       # an IPv6 client by its /64
        with self.lock:
            bucket = self.buckets.get(address)
            if bucket is None:
                if len(self.buckets) >= self.PRUNE_AT:
                    self._prune(now)
                bucket = self.buckets[address] = [float(self.per_minute), now]
            tokens = min(float(self.per_minute), bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
            if tokens >= 1.0:
                bucket[0] = tokens - 1.0
                return None
            bucket[0] = tokens
            return max(1, math.ceil((1.0 - tokens) / self.rate))

    def _prune(self, now):
        """Forget the addresses whose bucket has refilled (they lose nothing by it)."""
        full = [a for a, (tokens, last) in self.buckets.items()
                if tokens + (now - last) * self.rate >= self.per_minute]
        for a in full:
            del self.buckets[a]
        if len(self.buckets) >= self.PRUNE_AT:          # a flood of addresses: oldest first
            for a, _ in sorted(self.buckets.items(), key=lambda kv: kv[1][1])[:len(self.buckets) // 2]:
                del self.buckets[a]


_LOG_LOCK = threading.Lock()


def log_json(out, principal, method, path, status, ms, secrets=()):
    """`--log-json`: one line a request -- when, who, what, the answer, how long. The path
    goes without its query string or fragment (where a token, a code or a state would be) and
    any of `secrets` is taken out of it; no header is logged."""
    import json
    if principal is not None and not isinstance(principal, str):
        principal = str(principal)
    path = (path or "").split("?", 1)[0].split("#", 1)[0][:512]
    for secret in secrets:
        if secret:
            path = path.replace(secret, "[redacted]")
    now = time.time()
    line = json.dumps({"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z",
                       "principal": principal, "method": method, "path": path,
                       "status": status, "ms": round(ms, 1)}, ensure_ascii=True)
    with _LOG_LOCK:
        try:
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):
            pass
