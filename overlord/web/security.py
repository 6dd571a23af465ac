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
import re
import secrets
import urllib.parse

from overlord.ops.access import COOKIE, UNSAFE, Guard, load_token, token_path  # noqa: F401 -- the faces' names

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
