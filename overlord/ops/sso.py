"""Single sign-on for the faces (the CLI's `overlord sso`, the web face's /sso routes):
overlord/trust/oidc.py through the service layer. The names are oidc's own, so a face may
`from overlord.ops import sso as oidc` and call exactly what docs/AUTH.md describes."""
from overlord.trust.oidc import (ALGS, DEFAULT_ROLE, FLOW_TTL, ROLES, SCOPES,  # noqa: F401
                                 Flows, Identity, SSOError, config, configure, off, path,
                                 provision, public, role_for, test, verify_id_token)


def sso_set(issuer, client_id, client_secret=None, domains=(), admins=(), viewers=(),
            role_claim=None, role_map=None, default_role=None, by=None):
    """configure(); client_secret None keeps the stored one (same issuer and client id)."""
    return configure(issuer, client_id, client_secret, domains=domains, admins=admins,
                     viewers=viewers, role_claim=role_claim, role_map=role_map,
                     default_role=default_role, by=by)


def sso_show():
    """public(): the configuration with the client secret masked ({"enabled": False} when off)."""
    return public()


def sso_test():
    return test()


def sso_off(by=None):
    return off(by=by)
