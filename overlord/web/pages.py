"""The pages and their assets: real files in static/, read once at start-up.

Templates are HTML files with `{{name}}` slots (filled with escaped text; a name that is not
valid UTF-8 shows its bytes as \\xNN), `{{{name}}}` slots (filled with HTML this module built
from another template) and `{{asset:NAME}}` (the asset's URL with its content hash, so a
browser may cache it for good). Every page gets a fresh CSP nonce in `{{nonce}}`; nothing
inline runs without it, and nothing inline is styled.
"""
import hashlib
import html
import os
import re
import time
import urllib.parse

from overlord.text import escape_path, is_exact

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
         ".ico": "image/x-icon"}
SLOT = re.compile(r"\{\{\{(\w+)\}\}\}|\{\{(asset:[\w.-]+|\w+)\}\}")
TEMPLATES = ("workspace.html", "console.html", "register-row.html", "unauthorized.html",
             "signin.html")
STATE_LABELS = {"rolled-back": "rolled back", "timed-out": "timed out"}    # as common.js's stateLabel
# the sign-in page's error line: a known code only (the page never echoes text from the URL)
SIGNIN_ERRORS = {"1": "That name and password do not match. Try again.",
                 "locked": "Too many failed sign-ins: wait a minute, then try again.",
                 "sso": "Single sign-on did not complete. Try again, or use your name and password.",
                 "expired": "Your sign-in has ended. Sign in again."}
SIGNIN_GENERIC = "Sign-in failed. Try again."


class Asset:
    def __init__(self, name, data):
        self.name, self.data = name, data
        self.type = TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        self.version = hashlib.sha256(data).hexdigest()[:12]

    @property
    def url(self):
        return f"/static/{self.name}?v={self.version}"


class Pages:
    def __init__(self, directory=STATIC):
        self.assets, self.templates = {}, {}
        for name in sorted(os.listdir(directory)):
            full = os.path.join(directory, name)
            if not os.path.isfile(full) or name.startswith("."):
                continue
            with open(full, "rb") as f:
                data = f.read()
            if name in TEMPLATES:
                self.templates[name] = data.decode("utf-8")
            else:
                self.assets[name] = Asset(name, data)

    def asset(self, name):
        """The asset called exactly `name` (a flat name from the list read at start-up), or None."""
        return self.assets.get(name)

    def render(self, template, nonce, **slots):
        if template == "signin.html" and "error_hidden" not in slots:
            slots = signin_slots(**slots)      # plain values in; a caller's own slots stay as given

        def fill(m):
            raw, name = m.group(1), m.group(2)
            if raw:
                return slots[raw]
            if name.startswith("asset:"):
                return html.escape(self.assets[name[6:]].url)
            if name == "nonce":
                return nonce
            value = str(slots.get(name, ""))
            return html.escape(value if is_exact(value) else escape_path(value))
        return SLOT.sub(fill, self.templates[template])

    def register_rows(self, rows):
        """The console's register, rendered on the server for the first paint."""
        out = []
        for r in rows:
            out.append(self.render("register-row.html", "", sid=r["sid"], state=r["state"] or "?",
                                   label=STATE_LABELS.get(r["state"], r["state"] or "?"),
                                   when=_when(r.get("created")), what=r.get("command") or "-",
                                   target=r.get("target") or "", layers=r.get("layers", 0),
                                   kind="chat" if r.get("chat") else "command"))
        return "".join(out)


def local_path(value, default="/"):
    """`value` when it is a path on this server ("/..." but not "//host" or "/\\host"), else
    `default`: where a sign-in may send the browser next (never another site)."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return default
    if "\\" in value or any(ord(c) < 0x20 or ord(c) == 0x7f for c in value) or len(value) > 2000:
        return default
    return value


def signin_slots(next="/", error=None, sso=False, **rest):
    """The sign-in page's slots from plain values: `next` (the path to go to after signing in;
    anything but a local path becomes "/"), `error` (None/False, or a code: True/"1" a wrong
    name or password, "locked", "sso", "expired"; any other value a generic line), `sso`
    (True when single sign-on is configured: the button shows). The page's script also reads
    ?next= and ?error= and asks GET /api/whoami for "sso", so a plain render still works."""
    target = local_path(next)
    code = "1" if error is True else str(error) if error not in (None, False, "", 0) else ""
    code = code if code in SIGNIN_ERRORS or not code else "other"
    text = SIGNIN_ERRORS.get(code, SIGNIN_GENERIC) if code else ""
    return dict(rest, next=target, error_code=code, error_text=text,
                error_hidden="" if code else " hidden", sso_hidden="" if sso else " hidden",
                sso_href="/sso/start?" + urllib.parse.urlencode({"next": target}))


def _when(stamp):
    if not stamp:
        return ""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))
