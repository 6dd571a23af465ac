"""Single sign-on for the faces (the CLI's `overlord sso`, the web face's /sso routes):
overlord/trust/oidc.py through the service layer. The names are oidc's own, so a face may
`from overlord.ops import sso as oidc` and call exactly what docs/AUTH.md describes."""
from overlord.trust.oidc import (ALGS, DEFAULT_ROLE, FLOW_TTL, ROLES, SCOPES,  # noqa: F401
                                 Flows, Identity, SSOError, config, configure, off, path,
                                 provision, public, role_for, test, verify_id_token)

