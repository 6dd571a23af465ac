"""A real OpenID provider for tests: oidc-provider-mock (PyPI, 0.3.4) in its own process.

    from oidcmock import start_mock, authorize_without_browser

    with start_mock() as idp:                 # http://127.0.0.1:PORT, discovery answered
        idp.set_user("alice-sub", {"email": "alice@example.com", "email_verified": True})
        url, binding = flows.start(redirect_uri, "/")
        callback = authorize_without_browser(url, "alice-sub")   # the consent form, POSTed
        # callback: the redirect Location -- redirect_uri?code=...&state=...

The provider accepts any client id, secret and redirect URI; it signs its ID tokens RS256 with
one key made at start; its issuer is the host URL of the request, so every URL here names
127.0.0.1 (the issuer to configure is `idp.issuer`, exactly).  The process is ours: `stop()`
(or leaving the with block) closes its stdin, which ends it; it is killed if it lingers.
"""

import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse

HOST = "127.0.0.1"

# Runs in the provider's process: the mock's Flask app on a werkzeug threaded server, port 0
# (no port race), the port printed on stdout, served until stdin closes.
_SERVER = r"""
import os, sys, threading, logging
os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import werkzeug.serving
from oidc_provider_mock import app
srv = werkzeug.serving.make_server(sys.argv[1], 0,
                                   app(require_nonce=sys.argv[2] == "1"), threaded=True)
threading.Thread(target=srv.serve_forever, args=(0.1,), daemon=True).start()
print(srv.server_port, flush=True)
sys.stdin.read()
srv.shutdown()
"""


def _request(method, url, body=None, headers=None, timeout=10):
    """One HTTP request (no redirect followed) -> (status, headers dict lower-cased, bytes)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


class Mock:
    """A running provider: .issuer, .port, .set_user(sub, claims), .discovery(), .stop()."""

    def __init__(self, proc, port, log):
        self.proc = proc
        self.port = port
        self.issuer = "http://%s:%d" % (HOST, port)
        self._log = log

    def url(self, path):
        return self.issuer + path

    def discovery(self):
        status, _, data = _request("GET", self.url("/.well-known/openid-configuration"))
        if status != 200:
            raise RuntimeError("oidc mock discovery: HTTP %d" % status)
        return json.loads(data)

    def jwks(self):
        status, _, data = _request("GET", self.url("/jwks"))
        if status != 200:
            raise RuntimeError("oidc mock jwks: HTTP %d" % status)
        return json.loads(data)

    def set_user(self, sub, claims):
        """The claims the provider gives `sub` (ID token and userinfo; "sub" itself is added)."""
        status, _, data = _request(
            "PUT", self.url("/users/" + urllib.parse.quote(sub, safe="")),
            body=json.dumps(claims).encode(), headers={"Content-Type": "application/json"})
        if status != 204:
            raise RuntimeError("oidc mock set_user %r: HTTP %d %s" % (sub, status, data[:300]))

    def revoke_tokens(self, sub):
        """Revoke every access token of `sub` (its userinfo then answers 401)."""
        _request("POST", self.url("/users/%s/revoke-tokens" % urllib.parse.quote(sub, safe="")))

    def log(self):
        """What the provider wrote on stderr so far (for a failing test's message)."""
        try:
            with open(self._log, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self._log)


@contextlib.contextmanager
def start_mock(require_nonce=False, timeout=30):
    """Start oidc-provider-mock on 127.0.0.1 (a free port); yield a Mock once discovery answers."""
    fd, log = tempfile.mkstemp(prefix="oidcmock-", suffix=".log")
    env = dict(os.environ, AUTHLIB_INSECURE_TRANSPORT="1", PYTHONUNBUFFERED="1")
    with os.fdopen(fd, "wb") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, HOST, "1" if require_nonce else "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, env=env)
    mock = None
    try:
        line = proc.stdout.readline()     # the port, or EOF when the provider could not start
        if not line.strip().isdigit():
            proc.wait(5)
            with open(log, "r", errors="replace") as f:
                raise RuntimeError("oidc-provider-mock did not start:\n" + f.read()[-3000:])
        mock = Mock(proc, int(line), log)
        deadline = time.monotonic() + timeout
        while True:
            try:
                conf = mock.discovery()
                if conf.get("issuer") != mock.issuer:
                    raise RuntimeError("oidc mock issuer %r != %r" % (conf.get("issuer"),
                                                                       mock.issuer))
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("oidc-provider-mock discovery never answered:\n"
                                       + mock.log()[-3000:])
                time.sleep(0.05)
        yield mock
    finally:
        if mock is not None:
            mock.stop()
        elif proc.poll() is None:
            proc.kill()
            proc.wait(5)


def authorize_without_browser(authorize_url, sub, deny=False):
    """Do what a person does on the provider's consent page: POST `sub` (or "deny") to the
    authorization URL. Returns the redirect Location: the callback URL with code & state (or
    error=access_denied & state). Raises when the provider answers anything but a redirect."""
    form = {"action": "deny"} if deny else {"sub": sub}
    status, headers, data = _request(
        "POST", authorize_url, body=urllib.parse.urlencode(form).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"})
    if status not in (301, 302, 303, 307) or "location" not in headers:
        raise RuntimeError("oidc mock consent: HTTP %d %s" % (status, data[:500]))
    return headers["location"]
