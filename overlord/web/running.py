"""Running it for real, in the browser: the usage meter, Settings -> Notifications and a
session's export.

    GET    /api/usage                     ops.usage_meter(owner): the rail's meter (any principal)
    GET    /api/webhooks                  the hooks (never a secret), the base URL, the acts
    POST   /api/webhooks                  add one: {name, url, format, on, secret, allow_private}
    DELETE /api/webhooks/<name>           remove it
    POST   /api/webhooks/<name>/test      one delivery now; its outcome
    PUT    /api/webhooks/base-url         {url}: the link Slack messages carry (null: none)
    GET    /api/webhooks/deliveries       the newest outcomes of the delivery log
    GET    /api/session/<sid>/export      the session as a signed .ovl, a download

The webhook routes are for administrators (roles.ADMIN, server.TABLE says so), the export for
whoever may see the session (roles.SEE). Every function calls overlord.ops; what comes back
of a hook is rebuilt here field by field, so a secret never reaches a page even if a lower
layer sent one up (a stored value other than a secret:// reference shows as "set").
"""
import os
import re
import tempfile
import urllib.parse

from overlord import ops
from overlord.errors import OverlordError, UsageError
from overlord.web import roles as R
from overlord.web import settings as S

HOOK_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")   # as trust/notify.check_name
EVERY = "*"
DELIVERIES_SHOWN = 50
CHUNK = 1 << 16


# -- the usage meter -----------------------------------------------------------------------------

def usage(app, req):
    """The provider's own rate-limit readings and the ledger's spend against the day and month
    lines of the principal (an account's lines are its own; the launch token's the machine's)."""
    return ops.usage_meter(R.owner_name(req.principal))


# -- Settings -> Notifications ---------------------------------------------------------------------

def webhooks(app, req):
    """{base_url, hooks: [{name, url, host, format, on, secret, allow_private, created}],
    queued, actions: [every act a hook may subscribe to], formats, default_on}."""
    return listing()


def listing():
    from overlord.ops import notify
    listed = ops.webhook_list()
    return {"base_url": listed.get("base_url"),
            "hooks": [hook_row(h) for h in listed.get("hooks") or () if isinstance(h, dict)],
            "queued": listed.get("queued"), "actions": audit_actions(listed),
            "formats": list(notify.FORMATS), "default_on": list(notify.DEFAULT_ON)}


def hook_row(hook):
    url = hook.get("url") or ""
    return {"name": hook.get("name"), "url": url, "host": hook.get("host") or _host(url),
            "format": hook.get("format"), "on": list(hook.get("on") or ()),
            "secret": secret_shown(hook.get("secret")),
            "allow_private": bool(hook.get("allow_private")), "created": hook.get("created")}


def _host(url):
    try:
        return urllib.parse.urlsplit(url).hostname or ""
    except ValueError:
        return ""


def secret_shown(value):
    """None (no secret), a secret://NAME reference as it is (it names, it does not hold), else
    "set": whatever else arrives, the value itself never leaves here."""
    if not value:
        return None
    if isinstance(value, str) and value.startswith("secret://") and all(
            c.isalnum() or c in "_./-" for c in value[len("secret://"):]):
        return value
    return "set"


def audit_actions(listed=None):
    """The audited acts a hook may subscribe to (the notify layer's list when the listing
    gives one, else ops.notify.ACTIONS), without "*" (EVERY: offered on its own)."""
    from overlord.ops import notify
    acts = (listed or {}).get("actions") or notify.ACTIONS
    return sorted(a for a in acts if isinstance(a, str) and a != EVERY)


def webhook_add(app, req):
    body = req.body
    if not isinstance(body, dict):
        raise S.Invalid("w-name", "send the hook as a JSON object: {name, url, format, on, secret, allow_private}")
    unknown = sorted(set(body) - {"name", "url", "format", "on", "secret", "allow_private"})
    if unknown:
        raise S.Invalid("w-name", f"unknown webhook setting {unknown[0]!r}")
    name = body.get("name")
    if not isinstance(name, str) or not HOOK_NAME.match(name):
        raise S.Invalid("w-name", "a hook's name is letters, digits, '.', '_' or '-' (at most 64, "
                                  "starting with a letter or digit)")
    url = http_url(body.get("url"), "w-url", "the URL")
    from overlord.ops import notify
    fmt = body.get("format", "slack")
    if fmt not in notify.FORMATS:
        raise S.Invalid("w-format", f"the format is one of {', '.join(notify.FORMATS)}")
    on = body.get("on") or []
    if isinstance(on, str):
        on = [on]
    if not isinstance(on, list) or len(on) > 200 or not all(isinstance(a, str) and a for a in on):
        raise S.Invalid("w-on", "the acts to notify of are a list of audit action names")
    known = set(audit_actions()) | {EVERY}
    bad = [a for a in on if a not in known]
    if bad:
        raise S.Invalid("w-on", f"not an audit action: {bad[0][:60]!r}")
    secret = body.get("secret")
    if secret in ("", None):
        secret = None
    elif not isinstance(secret, str) or len(secret) > 4096 or any(c in secret for c in "\r\n\0"):
        raise S.Invalid("w-secret", "the secret is one line of text (or secret://NAME)")
    allow = body.get("allow_private", False)
    if not isinstance(allow, bool):
        raise S.Invalid("w-private", "allow_private is true or false")
    try:
        ops.webhook_add(name, url, fmt=fmt, on=tuple(on), secret=secret, allow_private=allow)
    except UsageError as exc:         # the notify layer's own checks (a URL with a password, ...)
        words = str(exc).lower()
        field = "w-url" if "url" in words else "w-secret" if "secret" in words else "w-name"
        raise S.Invalid(field, str(exc)) from None
    return listing()


def http_url(value, field, what):
    """One http:// or https:// address with a host (stripped), or Invalid naming the field."""
    if not isinstance(value, str) or not value.strip() or len(value) > 2000 or \
            any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value.strip()):
        raise S.Invalid(field, f"{what} is one http:// or https:// address")
    value = value.strip()
    try:
        parts = urllib.parse.urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port                                 # noqa: B018 - raises on a bad port
    except ValueError:
        ok = False
    if not ok:
        raise S.Invalid(field, f"{what} must be http:// or https:// with a host")
    return value


def webhook_remove(app, req, name):
    ops.webhook_remove(name)
    return listing()


def webhook_test(app, req, name):
    """One delivery now, synchronously: its outcome (status, error, how long), never the
    secret the request was signed with."""
    outcome = ops.webhook_test(name)
    if isinstance(outcome, dict):
        outcome = {k: v for k, v in outcome.items() if k not in ("secret", "signature", "headers")}
    return {"name": name, "outcome": outcome}


def webhook_base_url(app, req):
    """{url}: the address links in messages start with (?sid= opens a conversation); null or
    "" clears it."""
    body = req.body or {}
    if "url" not in body:
        raise S.Invalid("w-base-url", "send {\"url\": \"https://...\"} (or null to clear it)")
    url = body["url"]
    url = None if url in (None, "") else http_url(url, "w-base-url", "the base URL")
    ops.webhook_base_url(url)
    return listing()


def webhook_deliveries(app, req):
    raw = req.query.get("limit", "")
    if raw and (not raw.isdigit() or not 0 < int(raw) <= 500):
        raise UsageError("limit takes a number from 1 to 500")
    rows = ops.webhook_deliveries(limit=int(raw) if raw else DELIVERIES_SHOWN)
    return {"deliveries": [{k: v for k, v in r.items() if k not in ("secret", "signature", "headers")}
                           for r in rows if isinstance(r, dict)]}


# -- export ---------------------------------------------------------------------------------------

class Download:
    """A file sent as an attachment, from an open file with no name on disk (the answer reads
    it from the start and closes it)."""

    def __init__(self, f, filename, ctype="application/octet-stream"):
        self.file, self.filename, self.type = f, filename, ctype
        self.size = os.fstat(f.fileno()).st_size

    def chunks(self):
        try:
            while True:
                data = self.file.read(CHUNK)
                if not data:
                    return
                yield data
        finally:
            self.file.close()

    def close(self):
        self.file.close()


def export(app, req, sid):
    """The session as a .ovl (`overlord export SID -o FILE`), built into an unnamed file under
    OVERLORD_HOME (no name on disk, ever: nothing of it stays once the answer is sent) and
    streamed from there."""
    if app.chats.running(sid):
        raise OverlordError("cannot export while the agent is working in this session: press "
                            "Stop first (or wait for it to finish)")
    f = tempfile.TemporaryFile(dir=ops.ensure_home())
    try:
        ops.export_session(sid, f)
        f.flush()
        f.seek(0)
        return Download(f, f"{sid}.ovl")
    except BaseException:
        f.close()
        raise
