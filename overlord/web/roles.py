"""Who may call each route: one rule a route (server.TABLE names it beside the handler), checked
for every request before the handler runs.

    OPEN     no principal needed: signing in and out, single sign-on, the sign-in page, whoami
             (they still pass the Host, Origin and body checks, and the lockout)
    ANY      any principal (what a route returns may still be filtered to what it may see)
    SEE      a session in the path: 404 unless the principal may see it (an operator asking
             for another's session learns nothing, not even that it exists)
    CHANGE   as SEE, then 403 unless the principal may change it (a viewer changes nothing)
    WRITE    a change not about one session (start a conversation, your settings, your notes):
             not for a viewer (403)
    AUDIT    the audit log: admins and viewers (the launch token holder too)
    ADMIN    accounts, machine skills: admins only (403)
    ACCOUNT  your own account (its script tokens listed, one revoked): a signed-in account,
             not the launch token (409 while there are no accounts)
    PERSON   as ACCOUNT, and signed in with a login, not a script token (403): changing the
             password, minting a token -- a leaked token must not mint its successor or take
             the account over, outliving its own revocation

A principal is overlord.trust.auth's Principal: auth.LAUNCH while no account exists (the
holder of the launch token is the operator and admin, as before), else the account a login
cookie or an `ovl_` token names. Ownership is auth.can_see / auth.can_change on the session's
meta (its `owner`; CLI sessions have none and are the admin's).
"""
from overlord import ops
from overlord.errors import NotFound, OverlordError
from overlord.ops import auth

OPEN, ANY, SEE, CHANGE, WRITE, AUDIT, ADMIN, ACCOUNT, PERSON = (
    "open", "any", "see", "change", "write", "audit", "admin", "account", "person")
RULES = (OPEN, ANY, SEE, CHANGE, WRITE, AUDIT, ADMIN, ACCOUNT, PERSON)


class Unauthorized(OverlordError):
    http_status = 401


class Forbidden(OverlordError):
    http_status = 403


def sign_in_words(accounts):
    if accounts:
        return ("sign in: POST /api/login (or the sign-in page), or send Authorization: Bearer "
                "ovl_... (a script token: `overlord users token NAME`)")
    return ("open the link `overlord ui` printed, or send Authorization: Bearer <the token in "
            "ui.token>")


def check(rule, principal, sid=None):
    """Raise (401/403/404/409) unless `principal` may call a route of `rule` (on session `sid`).
    Returns the session's meta when the rule read it (SEE, CHANGE), else None."""
    if rule == OPEN:
        return None
    if principal is None:
        raise Unauthorized(sign_in_words(True))
    if rule == ANY:
        return None
    if rule in (SEE, CHANGE):
        return session_meta(principal, sid, change=rule == CHANGE)
    if rule == WRITE:
        if not principal.may_change:
            raise Forbidden("a viewer reads every record and changes nothing")
        return None
    if rule == AUDIT:
        if principal.role not in ("admin", "viewer"):
            raise Forbidden("the audit log is for administrators and viewers")
        return None
    if rule == ADMIN:
        if not principal.is_admin:
            raise Forbidden("only an administrator may do this")
        return None
    if rule in (ACCOUNT, PERSON):
        if principal.name is None:
            raise OverlordError("there are no accounts on this machine (sign-in is off): "
                                "`overlord users add NAME --role admin` makes the first",
                                http_status=409)
        if rule == PERSON and principal.via != "cookie":
            raise Forbidden("this needs you signed in (a login), not a script token")
        return None
    raise Forbidden("this route has no rule: refused")       # fail closed


def session_meta(principal, sid, change=False):
    """The session's meta when the principal may see it (and, with change, change it);
    otherwise the very answer a session that does not exist gets."""
    meta = ops.get_session(sid).meta
    if not auth.can_see(principal, meta):
        raise NotFound(f"no such session: {sid}")
    if change and not auth.can_change(principal, meta):
        raise Forbidden(f"session {sid} is not yours to change"
                        if principal.may_change else
                        "a viewer reads every record and changes nothing")
    return meta


def visible(principal, metas):
    """The metas (or rows with `owner`) the principal may see."""
    return [m for m in metas if auth.can_see(principal, m)]


def owner_name(principal):
    """What a session the principal starts records as its owner (None: the launch token)."""
    return getattr(principal, "name", None)
