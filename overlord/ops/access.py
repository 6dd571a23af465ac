"""The launch token that proves the operator, and the guard every request to an HTTP face
passes (`overlord ui`, `overlord mcp serve --http`): one credential, one set of checks, shared
by the faces that serve HTTP (see overlord/web/security.py for why each check exists). The
guard also knows the names the server answers to (`overlord ui --host`), whether it speaks TLS,
and so how its cookies are named and flagged (`__Host-`, Secure).
Standard library only and light: a face imports it at start-up.
"""
import hashlib
import hmac
import http.cookies
import os
import re
import secrets

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


def _bracketed(host):
    """How a Host header names a host (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def host_port(host, port):
    """How a Host header names host:port (an IPv6 address in brackets)."""
    return f"{_bracketed(host)}:{port}"


# A name for --host: a DNS name (letters, digits, dashes, dots) or an IP address.
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_DNS = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")


def check_name(name):
    """`name` lower-cased when it is a host name or an IP address, else None."""
    import ipaddress
    if not isinstance(name, str) or not name or len(name) > 253:
        return None
    name = name.lower().rstrip(".") if name.endswith(".") and len(name) > 1 else name.lower()
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        pass
    return name if _DNS.match(name) else None


def _loopback(host):
    import ipaddress
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Guard:
    """The checks every request passes, for a server bound to host:port with a token.

    `names` (`overlord ui --host NAME`, repeatable) are the names clients use: the Host header
    must be one of them or the bound address (with the port; the bare name when the port is the
    scheme's default), and an Origin must be the scheme and one of those. Under `tls` the
    origins are https://, and cookies are `Secure` with a `__Host-` name."""

    def __init__(self, token, host, port, tls=False, names=()):
        self.token = token
        self.cookie_value = hmac.new(token.encode(), b"overlord ui cookie", hashlib.sha256).hexdigest()
        self.port = port
        self.tls = bool(tls)
        self.scheme = "https" if self.tls else "http"
        # bound beyond loopback (a LAN address, 0.0.0.0): the launch token alone must never do
        self.loopback = _loopback(host)
        default = 443 if self.tls else 80
        wildcard = host in ("0.0.0.0", "::")
        named = list(dict.fromkeys([n.lower() for n in names] + ([] if wildcard else [host])))
        self.names = tuple(named)
        self.hosts = set()
        for name in named:
            self.hosts.add(host_port(name, port))
            if port == default:
                self.hosts.add(_bracketed(name))
        self.origins = {f"{self.scheme}://{h}" for h in self.hosts}
        # the origin the faces name (the launch link's, and what a refusal says may ask)
        first = named[0] if named else host
        self.origin = f"{self.scheme}://" + (_bracketed(first) if port == default
                                             else host_port(first, port))

    def host_ok(self, headers):
        return headers.get("Host", "").lower() in self.hosts

    def token_ok(self, value):
        return isinstance(value, str) and hmac.compare_digest(value.encode(), self.token.encode())

    def cookie_name(self, base):
        """The name a cookie goes by: `__Host-base` under TLS (the browser then holds it to
        Secure, Path=/ and this very host), `base` otherwise."""
        return f"__Host-{base}" if self.tls and not base.startswith("__Host-") else base

    def cookie(self, name, value, max_age):
        """The Set-Cookie value for cookie `name` (HttpOnly, SameSite=Strict, Path=/, and under
        TLS Secure with the `__Host-` name); max_age 0 clears it."""
        out = f"{self.cookie_name(name)}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={int(max_age)}"
        return out + "; Secure" if self.tls else out

    def principal(self, headers):
        """'bearer', 'cookie' or None: how the request proved it comes from the operator."""
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer ") and self.token_ok(auth[7:].strip()):
            return "bearer"
        name = self.cookie_name(COOKIE)
        for raw in headers.get_all("Cookie") or ():
            try:
                jar = http.cookies.SimpleCookie(raw)
            except http.cookies.CookieError:
                continue
            morsel = jar.get(name)
            if morsel is not None and hmac.compare_digest(morsel.value.encode(),
                                                          self.cookie_value.encode()):
                return "cookie"
        return None

    def cross_origin(self, method, headers, principal, api):
        """Why this request must be refused as coming from elsewhere, or None."""
        origin = headers.get("Origin")
        site = headers.get("Sec-Fetch-Site")
        if origin is not None and origin.lower() not in self.origins:
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
        return self.cookie(COOKIE, self.cookie_value, 2592000)

