"""Accounts on the web: signing in and out (a password, or single sign-on through
overlord/trust/oidc.py), who the request is, the administrator's accounts API, and each
account's own password and script tokens. The accounts themselves are overlord/trust/auth.py's;
this module only speaks HTTP for it.

The login cookie (`overlord_login`, `__Host-overlord_login` under TLS) holds a random secret;
the server keeps only its hash (auth.login_create). It is HttpOnly, SameSite=Strict, Path=/,
and Secure under TLS (the Guard builds it). The single sign-on flow binds its `state` to the
browser that started it with a second cookie (`overlord_sso`, ten minutes, SameSite=Lax: it
must come back with the provider's redirect, a cross-site navigation). After the callback the
browser is sent on by a page of ours rather than a 303, so its next request is a same-site
navigation that carries the Strict login cookie.
"""
import html
import urllib.parse

from overlord.errors import OverlordError, UsageError
from overlord.ops import audit, auth

LOGIN = "overlord_login"
SSO = "overlord_sso"
SSO_AGE = 600
MAX_NAME, MAX_PASSWORD, MAX_LABEL = 254, 1024, 100


def _oidc():
    from overlord.ops import sso as oidc
    return oidc


def sso_on():
    """Whether single sign-on is configured (the sign-in page shows its button)."""
    try:
        return _oidc().config() is not None
    except OverlordError:
        return False


def safe_next(value):
    """Where to go after signing in: a path on this server, else "/". Never another host:
    no scheme, no `//host`, no backslash (browsers read `/\\host` as `//host`), no control
    character."""
    if not isinstance(value, str) or not value.startswith("/") or len(value) > 2000:
        return "/"
    if value.startswith("//") or "\\" in value or any(ord(c) < 0x20 or ord(c) == 0x7f for c in value):
        return "/"
    parts = urllib.parse.urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    if value.startswith(("/login", "/sso/", "/api/")):
        return "/"
    # a Location header is Latin-1 at most: anything beyond ASCII goes %-encoded
    return "".join(c if c.isascii() else urllib.parse.quote(c) for c in value)


def cookie(app, base, value, max_age, lax=False):
    """A Set-Cookie line for `base` (the Guard names it: `__Host-` under TLS, and builds the
    attributes: HttpOnly, SameSite=Strict, Path=/, Secure under TLS)."""
    guard = app.guard
    line = guard.cookie(guard.cookie_name(base), value, max_age)
    return line.replace("SameSite=Strict", "SameSite=Lax") if lax else line


def origin_of(app, req):
    """This server as the request named it (the Host passed the allowlist)."""
    scheme = "https" if getattr(app.guard, "tls", False) else "http"
    return f"{scheme}://{req.headers.get('Host')}"


def _text(body, field, limit, required=True):
    value = body.get(field)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value) or len(value) > limit or "\0" in value:
        raise UsageError(f"{field} must be text of at most {limit} characters")
    return value


def _role(value):
    if value not in auth.ROLES:
        raise UsageError(f"role must be one of {', '.join(auth.ROLES)}")
    return value


def _by(req):
    return getattr(req.principal, "name", None)


def _sign_in(app, found):
    """The Set-Cookie line of a new login for the principal a password or the provider
    vouched for."""
    with audit.acting_as(found.actor):             # the sign-in is the account's own act
        value = auth.login_create(found.name)
    return cookie(app, LOGIN, value, auth.LOGIN_IDLE)


# -- signing in and out --------------------------------------------------------------------------

def login(app, req):
    """{name, password} as JSON -> 200 and the login cookie, or 401 (429 when locked out); as
    the sign-in page's form -> 303 to `next` (a path here), or back to /login?error=..."""
    from overlord.web.server import Redirect, Reply
    body = req.body or {}
    nxt = safe_next(body.get("next")) if req.form else "/"
    try:
        name = _text(body, "name", MAX_NAME)
        password = _text(body, "password", MAX_PASSWORD)
        found = auth.check_password(name, password, req.address)
    except (auth.AuthError, UsageError) as exc:
        if not req.form:
            raise
        code = "locked" if getattr(exc, "http_status", 401) == 429 else "1"
        return Redirect("/login?" + urllib.parse.urlencode({"error": code, "next": nxt}))
    line = _sign_in(app, found)
    if req.form:
        return Redirect(nxt, line)
    return Reply(200, {"name": found.name, "role": found.role}, [line])


def logout(app, req):
    """End this browser's login (its file goes) and clear the cookie."""
    from overlord.web.server import Reply
    value = req.cookie(app.guard.cookie_name(LOGIN))
    if value:
        auth.login_end(value)
    return Reply(200, {"signed_out": True}, [cookie(app, LOGIN, "", 0)])


def whoami(app, req):
    """{accounts, name, role, via, sso}: whether sign-in is on, and who this request is."""
    p = req.principal
    return {"accounts": auth.enabled(), "name": getattr(p, "name", None),
            "role": getattr(p, "role", None), "via": getattr(p, "via", None), "sso": sso_on()}


def _need_sso():
    if not sso_on():
        raise OverlordError("single sign-on is not configured (overlord sso set)", http_status=404)


def _callback_uri(app, req):
    return origin_of(app, req) + "/sso/callback"


def sso_start(app, req):
    """?next=PATH: off to the provider, the flow bound to this browser by a cookie."""
    from overlord.web.server import Redirect
    _need_sso()
    url, binding = app.sso_flows().start(_callback_uri(app, req),
                                         safe_next(req.query.get("next")),
                                         address=req.address)    # the per-address cap
    return Redirect(url, cookie(app, SSO, binding, SSO_AGE, lax=True))


def sso_callback(app, req):
    """The provider's redirect: the flow must be this browser's (its cookie), the ID token
    verified, the account provisioned or found; then signed in, on to the flow's `next`."""
    from overlord.web.server import Page
    _need_sso()
    oidc = _oidc()
    binding = req.cookie(app.guard.cookie_name(SSO))
    if not binding:
        raise oidc.SSOError("no single sign-on was started in this browser (or it took over "
                            "ten minutes): start again from the sign-in page", http_status=400)
    identity = app.sso_flows().finish(dict(req.query), binding, _callback_uri(app, req))
    line = _sign_in(app, oidc.provision(identity))
    nxt = safe_next(identity.next_path)
    where = html.escape(nxt, quote=True)
    page = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"refresh\" content=\"0;url={where}\"><title>OVERLORD</title>"
            f"</head><body><p>Signed in. <a href=\"{where}\">Continue</a></p></body></html>")
    return Page(200, page.encode(), None,
                cookies=[line, cookie(app, SSO, "", 0, lax=True)])


# -- the administrator's accounts API --------------------------------------------------------------

def users(app, req):
    return {"users": auth.listing()}


def _entry(name):
    for row in auth.listing():
        if row["name"] == name:
            return row
    return None


def user_add(app, req):
    """{name, role, password}: a local account (single sign-on ones are made at first sign-in)."""
    body = req.body or {}
    name = _text(body, "name", MAX_NAME)
    role = _role(body.get("role"))
    password = _text(body, "password", MAX_PASSWORD)
    auth.add(name, role, password=password, by=_by(req))
    return {"user": _entry(name)}


def user_change(app, req, name):
    """{role} or {password}: change one; either ends the account's other logins (an admin
    changing their own keeps this one)."""
    body = req.body or {}
    if set(body) not in ({"role"}, {"password"}):
        raise UsageError("send {\"role\": ...} or {\"password\": ...}")
    if auth.get(name) is None:
        raise OverlordError(f"no account named {name!r}", http_status=404)
    if _by(req) == name and req.principal.via != "cookie":
        # as for /api/me/password: a leaked script token must not lock its owner out
        raise OverlordError("changing your own account needs a sign-in, not a script token",
                            http_status=403)
    keep = req.principal.login if _by(req) == name else None
    if "role" in body:
        auth.set_role(name, _role(body["role"]), by=_by(req), keep_login=keep)
    else:
        auth.passwd(name, _text(body, "password", MAX_PASSWORD), by=_by(req), keep_login=keep)
    return {"user": _entry(name)}


def user_remove(app, req, name):
    if name == _by(req):
        raise OverlordError("you cannot remove your own account: ask another administrator",
                            http_status=409)
    if auth.get(name) is None:
        raise OverlordError(f"no account named {name!r}", http_status=404)
    auth.remove(name, by=_by(req))
    return {"removed": name}


# -- your own account --------------------------------------------------------------------------------

def my_password(app, req):
    """{old, new}: the old password proves it is you (a wrong one counts toward the lockout);
    your other logins end, this one stays. Signed in only (roles.PERSON: not with a script
    token)."""
    p = req.principal
    if "@" in p.name:
        raise OverlordError("a single sign-on account has no password here: change it with "
                            "your provider", http_status=409)
    body = req.body or {}
    old = _text(body, "old", MAX_PASSWORD)
    new = _text(body, "new", MAX_PASSWORD)
    auth.check_password(p.name, old, req.address)
    auth.passwd(p.name, new, by=p.name, keep_login=p.login)
    return {"changed": True}


def my_tokens(app, req):
    return {"tokens": auth.tokens(req.principal.name)}


def my_token_mint(app, req):
    """{label}: a script token (`Authorization: Bearer ovl_...`), shown this once. Signed in
    only (roles.PERSON): a token never mints another."""
    label = _text(req.body or {}, "label", MAX_LABEL, required=False)
    token_id, token = auth.mint_token(req.principal.name, label=label or None,
                                         by=req.principal.name)
    return {"id": token_id, "token": token}


def my_token_revoke(app, req, token_id):
    if not any(t["id"] == token_id for t in auth.tokens(req.principal.name)):
        raise OverlordError(f"you have no token {token_id!r}", http_status=404)
    auth.revoke(req.principal.name, token_id, by=req.principal.name)
    return {"revoked": token_id}
