"""Who may talk to `overlord ui`, and what every answer carries.

Loopback is not a credential (red team A13): a session granted `net: host` shares the host's
loopback, so the agent could reach this server too. The operator is proven by a launch token:

  - kept in OVERLORD_HOME/ui.token (mode 0600; a jail never sees OVERLORD_HOME);
  - `GET /any/page?token=T` sets a cookie and redirects to the same URL without the token;
    the cookie is HttpOnly and SameSite=Strict, and holds a value derived from the token (so
    the cookie alone is not the token scripts use);
  - scripts send `Authorization: Bearer T`;
  - anything else is 401 (only /healthz answers, and says nothing an outsider could use).

SameSite ignores ports: a page an agent serves on another loopback port is "same-site" and its
requests carry the cookie. So a request that changes state must prove it comes from this very
origin (an exact Origin, or Sec-Fetch-Site: same-origin), and an API read with the cookie is
refused when the browser says it was made by another site or port. The Host header must name
the address we are bound to (421 otherwise), which also defeats DNS rebinding.
"""
import hashlib
import hmac
import http.cookies
import os
import re
import secrets
import urllib.parse

COOKIE = "overlord_ui"
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")


def token_path(home):
    return os.path.join(home, "ui.token")


def load_token(home):
    """The launch token: read from ui.token, or made and written there (0600) the first time.
    A token file that others may read, or that is not ours, is replaced."""
    os.makedirs(home, mode=0o700, exist_ok=True)
    path = token_path(home)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            token = os.read(fd, 256).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if st.st_uid == os.getuid() and not st.st_mode & 0o077 and len(token) >= 32 and token.isalnum():
            return token
        os.unlink(path)
    except FileNotFoundError:
        pass
    token = secrets.token_hex(24)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    return token


class Guard:
    """The checks every request passes, for a server bound to host:port with a token."""

    def __init__(self, token, host, port):
        self.token = token
        self.cookie_value = hmac.new(token.encode(), b"overlord ui cookie", hashlib.sha256).hexdigest()
        self.port = port
        self.hosts = {f"{host}:{port}"}
        self.origin = f"http://{host}:{port}"

    def host_ok(self, headers):
        return headers.get("Host", "") in self.hosts

    def token_ok(self, value):
        return isinstance(value, str) and hmac.compare_digest(value.encode(), self.token.encode())

    def principal(self, headers):
        """'bearer', 'cookie' or None: how the request proved it comes from the operator."""
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer ") and self.token_ok(auth[7:].strip()):
            return "bearer"
        for raw in headers.get_all("Cookie") or ():
            try:
                jar = http.cookies.SimpleCookie(raw)
            except http.cookies.CookieError:
                continue
            morsel = jar.get(COOKIE)
            if morsel is not None and hmac.compare_digest(morsel.value.encode(),
                                                          self.cookie_value.encode()):
                return "cookie"
        return None

    def cross_origin(self, method, headers, principal, api):
        """Why this request must be refused as coming from elsewhere, or None."""
        origin = headers.get("Origin")
        site = headers.get("Sec-Fetch-Site")
        if origin is not None and origin != self.origin:
            return f"requests from {origin[:80]} are refused; only {self.origin} may ask"
        if method in UNSAFE:
            if site is not None and site != "same-origin" and not (site == "none" and principal == "bearer"):
                return "a change must come from this page (Sec-Fetch-Site: same-origin)"
            if principal == "cookie" and origin is None and site is None:
                return "a change from the browser must carry its Origin"
        elif principal == "cookie" and api and site in ("same-site", "cross-site"):
            return "the API answers this page only, not another site or port"
        return None

    def set_cookie(self):
        return (f"{COOKIE}={self.cookie_value}; Path=/; HttpOnly; SameSite=Strict; "
                "Max-Age=2592000")


REDACTED = "[redacted]"
_SECRETS = (
    (re.compile(r"(?i)(token=)[^&\s\"'#]*"), r"\1" + REDACTED),             # ?token=T
    (re.compile(r"(?i)(authorization:\s*)[^\r\n]*"), r"\1" + REDACTED),
    (re.compile(r"(?i)(cookie:\s*)[^\r\n]*"), r"\1" + REDACTED),
    (re.compile(r"(?i)(bearer\s+)[^\s\"']+"), r"\1" + REDACTED),
    (re.compile(COOKIE + r"=[^;\s\"']*"), COOKIE + "=" + REDACTED),
)


def redact(line, secrets=()):
    """A log line with the launch token and credentials taken out: `token=` query values
    (however %-encoded: the line is decoded first), Authorization and Cookie headers, Bearer
    values, the session cookie, and each of `secrets` wherever it appears."""
    line = urllib.parse.unquote(line, errors="replace")
    for pattern, replacement in _SECRETS:
        line = pattern.sub(replacement, line)
    for secret in secrets:
        if secret:
            line = line.replace(secret, REDACTED)
    return line


def nonce():
    return secrets.token_urlsafe(18)


def headers(nonce_value=None):
    """The headers every answer carries; pages add their CSP nonce."""
    script = f"'nonce-{nonce_value}'" if nonce_value else "'none'"
    csp = ("default-src 'none'; "
           f"script-src {script}; "
           "style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; "
           "manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
    return [("Content-Security-Policy", csp), ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
            ("Cross-Origin-Opener-Policy", "same-origin"),
            ("Cross-Origin-Resource-Policy", "same-origin")]
