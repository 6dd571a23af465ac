"""The launch token that proves the operator, and the guard every request to a loopback HTTP
face passes (`overlord ui`, `overlord mcp serve --http`): one credential, one set of checks,
shared by the faces that serve HTTP (see overlord/web/security.py for why each check exists).
Standard library only and light: a face imports it at start-up.
"""
import hashlib
import hmac
import http.cookies
import os
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
