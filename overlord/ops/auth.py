"""Accounts, logins, tokens and roles for the faces (the CLI's `overlord users`, the web face's
sign-in and accounts API): overlord/trust/auth.py through the service layer, under auth's own
names, so a face writes `from overlord.ops import auth` and calls exactly what the contract
(docs/AUTH.md) describes."""
from overlord.trust.auth import (  # noqa: F401
    LAUNCH, LOCAL_NAME, LOGIN_IDLE, PASSWORD_MAX, PASSWORD_MIN, ROLES, SCRYPT, AuthError,
    Lockout, Principal, add, address_key, bearer, can_change, can_see, check_local_name, check_name,
    check_new_password, check_password, enabled, end_logins, find_sso, get, listing, lockout,
    login_create, login_end, login_lookup, mint_token, passwd, public, remove, revoke, set_role,
    tokens, user_dir)
