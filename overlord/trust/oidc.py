"""Single sign-on: OpenID Connect, authorization code with PKCE (S256), state and nonce.

`overlord sso set` names the issuer and the client (OVERLORD_HOME/sso.json, mode 0600). The
web face keeps one `Flows` per server: `start()` gives the provider's authorization URL and a
*binding* -- a random value the face sets as a cookie in the browser that started -- and
`finish()` takes the callback's query with that cookie back. A state is one use, expires after
ten minutes, and only the browser holding its binding may finish it: an attacker's state and
code delivered to a victim's browser (login CSRF) fails.

What the trust rests on: the TLS channel to the provider's endpoints (https, certificates
checked; plain http only for a loopback issuer), the state / nonce / PKCE round trip, and the
ID token's **signature**, verified here against the issuer's JWKS with integer arithmetic --
RS256 (RSASSA-PKCS1-v1_5, SHA-256: the whole encoded message rebuilt and compared, never
parsed) and ES256 (ECDSA over P-256, the JWS raw r||s form). `alg: none`, HMAC and every
other algorithm are refused; an unknown `kid` fetches the JWKS once more (key rotation). Then
iss, aud, azp, exp, iat, nbf, nonce, at_hash, and `userinfo` confirms the same `sub` directly
from the provider.

provision() turns a verified identity into an account (trust/auth.py): the account already
holding that (issuer, sub) wins; else the e-mail must be verified and its domain allowed (or
the address listed), and the account is named by the lower-cased e-mail -- never one that
exists already (local names have no "@"; another identity's account is not taken over).
"""
import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import threading
import time
import urllib.parse

from overlord.errors import OverlordError, UsageError
from overlord.trust.auth import ROLES
from overlord.txn import store

SCOPES = "openid email profile"
DEFAULT_ROLE = "operator"
ALGS = ("RS256", "ES256")
SKEW = 60                  # seconds of clock difference allowed for iat / nbf
FLOW_TTL = 600             # a started sign-in lives ten minutes
FLOW_MAX = 1000            # pending sign-ins kept per server (full: new ones refused, 429)
FLOW_PER_ADDRESS = 20      # pending sign-ins of one client address (its oldest dropped first)
HTTP_TIMEOUT = 10
HTTP_CAP = 1 << 20         # a provider's answer larger than this is refused
TOKEN_CAP = 64 * 1024      # an ID token larger than this is refused
DISCOVERY_TTL = 3600
JWKS_TTL = 3600
MIN_RSA_BITS = 2048
MAX_RSA_BITS = 16384       # beyond this (or an exponent over 256 bits) a key is not a key: pow's cost
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class SSOError(OverlordError):
    """A sign-in refused: malformed (400), not verified (401), provider unreachable (502)."""

    http_status = 401


class _UnknownKey(SSOError):
    """No key of the JWKS verifies this token's kid (a refetch may find a rotated key)."""


# ---------------------------------------------------------------------------------------------
# configuration: OVERLORD_HOME/sso.json

def path():
    return os.path.join(store.home(), "sso.json")


@contextlib.contextmanager
def _lock():
    """sso.json's flock, for a read-modify-write (sso.json.lock beside it)."""
    store.ensure_home()
    fd = os.open(path() + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def config():
    """The stored configuration (with the client secret), or None when SSO is off.
    A file not ours, group/other-readable or damaged is refused (OverlordError)."""
    p = path()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OverlordError(f"cannot read the sign-on file {p}: {e.strerror}") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OverlordError(f"refusing the sign-on file {p}: not a regular file")
        if st.st_uid != os.geteuid():
            raise OverlordError(f"refusing the sign-on file {p}: it belongs to uid "
                                f"{st.st_uid}, not you")
        if st.st_mode & 0o077:
            raise OverlordError(f"refusing the sign-on file {p}: mode "
                                f"{stat.S_IMODE(st.st_mode):04o} lets others read it; "
                                f"run: chmod 600 {p}")
        try:
            data = json.loads(f.read(HTTP_CAP))
        except ValueError:
            raise OverlordError(f"the sign-on file {p} is damaged (not JSON)") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data.get(k)
                                             for k in ("issuer", "client_id", "client_secret")):
        raise OverlordError(f"the sign-on file {p} is damaged (issuer, client_id, "
                            f"client_secret missing)")
    data.setdefault("domains", [])
    data.setdefault("admins", [])
    data.setdefault("viewers", [])
    data.setdefault("role_claim", None)
    data.setdefault("role_map", {})
    data.setdefault("default_role", DEFAULT_ROLE)
    data.setdefault("scopes", SCOPES)
    return data


def public(conf=None):
    """The configuration for a face: the client secret never shown (only that one is set)."""
    conf = config() if conf is None else conf
    if conf is None:
        return {"enabled": False}
    out = {k: v for k, v in conf.items() if k != "client_secret"}
    out["client_secret"] = "********"
    out["enabled"] = True
    return out


_HOST_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                      r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$")
_CLAIM_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")


def check_url(url, what="issuer"):
    """An https URL, or http to a loopback host; no user info, query or fragment for the
    issuer. Returns the parsed URL; raises UsageError."""
    if not isinstance(url, str) or not url or len(url) > 2048 or not _PRINTABLE.match(url):
        raise UsageError(f"the {what} must be a URL (https://...)")
    parts = urllib.parse.urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise UsageError(f"the {what} {url!r} has a bad port") from None
    if parts.scheme not in ("https", "http") or not host:
        raise UsageError(f"the {what} must be an https:// URL, not {url!r}")
    if parts.scheme == "http" and host not in LOOPBACK:
        raise UsageError(f"the {what} must be https:// (plain http only for a loopback host "
                         f"-- 127.0.0.1, ::1, localhost): {url!r}")
    if parts.username is not None or parts.password is not None:
        raise UsageError(f"the {what} must not carry a user name or password")
    if what == "issuer" and (parts.query or parts.fragment or "?" in url or "#" in url):
        raise UsageError("the issuer must not have a query or fragment")
    del port
    return parts


def _email(value, what):
    # ASCII before lower(): str.lower() maps U+212A KELVIN SIGN to "k", U+0130 to "i̇"...
    e = value.strip().lower() if isinstance(value, str) and value.isascii() else ""
    local, _, domain = e.rpartition("@")
    if not local or not _HOST_RE.match(domain) or not _valid_name(e):
        raise UsageError(f"{what} must be an e-mail address, not {value!r}")
    return e


def _valid_name(name):
    from overlord.ops.home import valid_user
    return valid_user(name)


def configure(issuer, client_id, client_secret, domains=(), admins=(), viewers=(),
              role_claim=None, role_map=None, default_role=None, by=None):
    """Store the sign-on configuration (replacing any). client_secret None keeps the stored one
    when the issuer and client id are unchanged. Audited (sso.config), never the secret.
    Returns public()."""
    check_url(issuer)
    if not isinstance(client_id, str) or not _PRINTABLE.match(client_id) or len(client_id) > 512:
        raise UsageError("the client id must be printable text without spaces")
    doms = []
    for d in domains or ():
        d2 = d.strip().lower().lstrip("@") if isinstance(d, str) and d.isascii() else ""
        if not _HOST_RE.match(d2):
            raise UsageError(f"not an e-mail domain: {d!r}")
        if d2 not in doms:
            doms.append(d2)
    adm = sorted({_email(a, "--admin") for a in admins or ()})
    vie = sorted({_email(v, "--viewer") for v in viewers or ()})
    both = set(adm) & set(vie)
    if both:
        raise UsageError(f"{sorted(both)[0]} cannot be both an admin and a viewer")
    rmap = {}
    for group, role in (role_map or {}).items():
        if not isinstance(group, str) or not group or len(group) > 256 or "\n" in group:
            raise UsageError(f"not a group name: {group!r}")
        if role not in ROLES:
            raise UsageError(f"role for {group!r} must be one of {', '.join(ROLES)}, "
                             f"not {role!r}")
        rmap[group] = role
    if role_claim is not None and not (isinstance(role_claim, str) and
                                       _CLAIM_RE.match(role_claim)):
        raise UsageError(f"not a claim name: {role_claim!r}")
    if rmap and not role_claim:
        raise UsageError("--role-map needs --role-claim (the claim naming the groups)")
    if role_claim in ("sub", "iss", "aud", "email", "email_verified", "nonce"):
        raise UsageError(f"--role-claim {role_claim} is not a groups claim")
    if default_role is None:
        default_role = DEFAULT_ROLE
    if default_role not in ROLES:
        raise UsageError(f"the default role must be one of {', '.join(ROLES)}")
    with _lock():
        try:
            old = config()
        except OverlordError:
            old = None
        if client_secret is None:
            if not old or old["issuer"] != issuer or old["client_id"] != client_id:
                raise UsageError("a client secret is needed (--client-secret-stdin)")
            client_secret = old["client_secret"]
        if (not isinstance(client_secret, str) or not client_secret or len(client_secret) > 4096
                or not _PRINTABLE.match(client_secret)):
            raise UsageError("the client secret must be one line of printable text")
        from overlord.trust import vault            # secret://NAME: resolved at the exchange
        if vault.looks_like_ref(client_secret) and not vault.is_ref(client_secret):
            raise UsageError("the client secret looks like a secret:// reference but is not "
                             "one (secret://NAME: letters, digits and _ . / -, no '..')")
        data = {"issuer": issuer, "client_id": client_id, "client_secret": client_secret,
                "domains": doms, "admins": adm, "viewers": vie, "role_claim": role_claim or None,
                "role_map": rmap, "default_role": default_role, "scopes": SCOPES}
        store.write_json_atomic(path(), data, 0o600, indent=1, sync_dir=True)
    _forget()
    # the sign-ins another issuer made end (its accounts cannot sign in again)
    ended = end_sso_logins(keep_issuer=issuer)
    from overlord.trust import audit
    audit.append("sso.config", change="set", issuer=issuer, client_id=client_id,
                 **({"logins_ended": ended} if ended else {}),
                 domains=doms, admins=adm, viewers=vie, role_claim=role_claim or None,
                 role_map=rmap, default_role=default_role,
                 secret_changed=bool(old is None or old.get("client_secret") != client_secret),
                 **({"by": by} if by else {}))
    return public(data)


def off(by=None):
    """Turn single sign-on off (sso.json removed) and end every login single sign-on made
    (every login of an SSO account: they have no password, so every one of theirs was made by
    the provider) -- a provider turned off as compromised keeps no sign-in inside. SSO
    accounts stay (they cannot sign in). Returns True when it was on."""
    with _lock():
        try:
            os.unlink(path())
        except FileNotFoundError:
            was_on = False
        else:
            was_on = True
    _forget()
    ended = end_sso_logins()
    if not was_on:
        return False
    from overlord.trust import audit
    audit.append("sso.config", change="off", logins_ended=ended, **({"by": by} if by else {}))
    return True


def end_sso_logins(keep_issuer=None):
    """End the logins of every single sign-on account (but those provisioned by keep_issuer,
    when named): auth's listing and end_logins. Returns how many ended."""
    from overlord.trust import auth
    ended = 0
    for row in auth.listing():
        if not row.get("sso"):
            continue
        if keep_issuer is not None:
            link = (auth.get(row["name"]) or {}).get("sso") or {}
            if link.get("issuer") == keep_issuer:
                continue
        ended += auth.end_logins(row["name"])
    return ended


# ---------------------------------------------------------------------------------------------
# HTTP to the provider (https with certificates checked; http only for a loopback issuer)

def _http(method, url, headers=None, body=None):
    """One request, no redirect followed -> (status, lower-cased headers, bytes ≤ HTTP_CAP)."""
    import http.client
    parts = check_url(url, "provider URL")
    if parts.scheme == "https":
        import ssl
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT)
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    hdrs = {"Accept": "application/json", "User-Agent": "overlord-sso"}
    hdrs.update(headers or {})
    try:
        conn.request(method, target, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read(HTTP_CAP + 1)
        status, rh = resp.status, {k.lower(): v for k, v in resp.getheaders()}
    except (OSError, http.client.HTTPException, ValueError) as e:
        host = parts.hostname
        raise SSOError(f"cannot reach the identity provider at {host}: "
                       f"{getattr(e, 'strerror', None) or e.__class__.__name__}",
                       http_status=502) from None
    finally:
        conn.close()
    if len(data) > HTTP_CAP:
        raise SSOError("the identity provider's answer is too large", http_status=502)
    return status, rh, data


def _json_obj(data, what):
    try:
        obj = json.loads(data.decode("utf-8"), object_pairs_hook=_no_dupes)
    except (ValueError, UnicodeDecodeError):
        raise SSOError(f"the {what} is not JSON", http_status=502) from None
    if not isinstance(obj, dict):
        raise SSOError(f"the {what} is not a JSON object", http_status=502)
    return obj


def _no_dupes(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


_cache_lock = threading.Lock()
_discovery = {}            # issuer -> (fetched monotonic, document)
_jwks = {}                 # jwks_uri -> (fetched monotonic, jwks)


def _forget():
    with _cache_lock:
        _discovery.clear()
        _jwks.clear()


def discover(issuer, fresh=False):
    """The provider's metadata (/.well-known/openid-configuration), cached an hour. Its
    `issuer` must be exactly ours; every endpoint https (or loopback http)."""
    now = time.monotonic()
    with _cache_lock:
        hit = _discovery.get(issuer)
    if hit and not fresh and now - hit[0] < DISCOVERY_TTL:
        return hit[1]
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    status, _, data = _http("GET", url)
    if status != 200:
        raise SSOError(f"the identity provider's discovery answered HTTP {status}",
                       http_status=502)
    doc = _json_obj(data, "discovery document")
    if doc.get("issuer") != issuer:
        raise SSOError(f"the discovery document names issuer {str(doc.get('issuer'))[:200]!r}, "
                       f"not {issuer!r}", http_status=502)
    for key in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
        value = doc.get(key)
        if not isinstance(value, str):
            raise SSOError(f"the discovery document has no {key}", http_status=502)
        try:
            check_url(value, key)
        except UsageError as e:
            raise SSOError(str(e), http_status=502) from None
    with _cache_lock:
        _discovery[issuer] = (now, doc)
    return doc


def fetch_jwks(jwks_uri, fresh=False):
    """The provider's key set, cached an hour; `fresh` fetches it again."""
    now = time.monotonic()
    with _cache_lock:
        hit = _jwks.get(jwks_uri)
    if hit and not fresh and now - hit[0] < JWKS_TTL:
        return hit[1]
    status, _, data = _http("GET", jwks_uri)
    if status != 200:
        raise SSOError(f"the identity provider's key set answered HTTP {status}",
                       http_status=502)
    doc = _json_obj(data, "key set")
    if not isinstance(doc.get("keys"), list):
        raise SSOError("the identity provider's key set has no keys", http_status=502)
    with _cache_lock:
        _jwks[jwks_uri] = (now, doc)
    return doc


def test():
    """Discovery and the key set, fetched fresh: what `overlord sso test` shows."""
    conf = config()
    if conf is None:
        raise SSOError("single sign-on is not configured (overlord sso set)", http_status=404)
    doc = discover(conf["issuer"], fresh=True)
    keys = fetch_jwks(doc["jwks_uri"], fresh=True)
    algs = doc.get("id_token_signing_alg_values_supported")
    algs = [a for a in algs if isinstance(a, str)] if isinstance(algs, list) else []
    usable = [k for k in keys["keys"] if isinstance(k, dict) and _usable_key(k)]
    return {"issuer": conf["issuer"],
            "authorization_endpoint": doc["authorization_endpoint"],
            "token_endpoint": doc["token_endpoint"],
            "userinfo_endpoint": doc["userinfo_endpoint"],
            "jwks_keys": len(keys["keys"]), "usable_keys": len(usable),
            "algs": algs, "supported": [a for a in algs if a in ALGS]}


# ---------------------------------------------------------------------------------------------
# JWS: base64url, RS256, ES256 -- integer arithmetic only

_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")


def b64url_decode(text, what="value"):
    """Strict base64url without padding (RFC 7515): other characters, padding, a length that
    cannot be, or non-canonical trailing bits are refused."""
    if not isinstance(text, str) or not _B64URL.match(text) or len(text) % 4 == 1:
        raise SSOError(f"the ID token's {what} is not base64url")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != text:
        raise SSOError(f"the ID token's {what} is not canonical base64url")
    return raw


def b64url_encode(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _b64_int(jwk, name, size=None):
    try:
        raw = b64url_decode(jwk.get(name), "key " + name)
    except SSOError:
        return None
    if not raw or (size is not None and len(raw) != size):
        return None
    return int.from_bytes(raw, "big")


# RSASSA-PKCS1-v1_5 (RFC 8017 8.2.2, 9.2): DigestInfo for SHA-256 (the DER prefix of note 1)
_SHA256_DIGESTINFO = bytes.fromhex("3031300d060960864801650304020105000420")


def rsa_verify(n, e, message, signature):
    """True when `signature` is an RS256 signature of `message` under (n, e): s = OS2IP(sig)
    with len(sig) == k and s < n, m = s^e mod n, and I2OSP(m, k) equal -- byte for byte -- to
    0x00 0x01 FF..FF 0x00 DigestInfo(SHA-256(message)) built here."""
    k = (n.bit_length() + 7) // 8
    if not (MIN_RSA_BITS <= n.bit_length() <= MAX_RSA_BITS) or not (3 <= e < n) \
            or e % 2 == 0 or e.bit_length() > 256:
        return False
    if len(signature) != k:
        return False
    s = int.from_bytes(signature, "big")
    if s >= n:
        return False
    em = pow(s, e, n).to_bytes(k, "big")
    t = _SHA256_DIGESTINFO + hashlib.sha256(message).digest()
    if k < len(t) + 11:
        return False
    expected = b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t
    return hmac.compare_digest(em, expected)


# P-256 (SEC 2 / FIPS 186-4 D.1.2.3): y^2 = x^3 - 3x + b over GF(p), order n, cofactor 1
P256_P = 0xffffffff00000001000000000000000000000000ffffffffffffffffffffffff
P256_A = P256_P - 3
P256_B = 0x5ac635d8aa3a93e7b3ebbd55769886bc651d06b0cc53b0f63bce3c3e27d2604b
P256_N = 0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551
P256_G = (0x6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296,
          0x4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5)


def p256_on_curve(pt):
    if pt is None:
        return False
    x, y = pt
    p = P256_P
    return 0 <= x < p and 0 <= y < p and (y * y - (x * x * x + P256_A * x + P256_B)) % p == 0


# Jacobian coordinates (X, Y, Z) ~ (X/Z^2, Y/Z^3); Z == 0 is the point at infinity.
def _jdouble(P):
    X, Y, Z = P
    p = P256_P
    if Z == 0 or Y == 0:
        return (0, 1, 0)
    YY = Y * Y % p
    S = 4 * X * YY % p
    ZZ = Z * Z % p
    M = 3 * (X - ZZ) * (X + ZZ) % p          # a = -3
    X3 = (M * M - 2 * S) % p
    Y3 = (M * (S - X3) - 8 * YY * YY) % p
    Z3 = 2 * Y * Z % p
    return (X3, Y3, Z3)


def _jadd(P, Q):
    p = P256_P
    X1, Y1, Z1 = P
    X2, Y2, Z2 = Q
    if Z1 == 0:
        return Q
    if Z2 == 0:
        return P
    Z1Z1 = Z1 * Z1 % p
    Z2Z2 = Z2 * Z2 % p
    U1 = X1 * Z2Z2 % p
    U2 = X2 * Z1Z1 % p
    S1 = Y1 * Z2 * Z2Z2 % p
    S2 = Y2 * Z1 * Z1Z1 % p
    if U1 == U2:
        if S1 != S2:
            return (0, 1, 0)
        return _jdouble(P)
    H = (U2 - U1) % p
    R = (S2 - S1) % p
    HH = H * H % p
    HHH = H * HH % p
    V = U1 * HH % p
    X3 = (R * R - HHH - 2 * V) % p
    Y3 = (R * (V - X3) - S1 * HHH) % p
    Z3 = H * Z1 * Z2 % p
    return (X3, Y3, Z3)


def _affine(P):
    X, Y, Z = P
    if Z == 0:
        return None
    p = P256_P
    zi = pow(Z, -1, p)
    zi2 = zi * zi % p
    return (X * zi2 % p, Y * zi2 * zi % p)


def _double_mul(u1, G, u2, Q):
    """u1*G + u2*Q (Shamir's trick), affine in, affine (or None) out."""
    Gj, Qj = (G[0], G[1], 1), (Q[0], Q[1], 1)
    GQ = _jadd(Gj, Qj)
    R = (0, 1, 0)
    for i in range(max(u1.bit_length(), u2.bit_length()) - 1, -1, -1):
        R = _jdouble(R)
        b1, b2 = (u1 >> i) & 1, (u2 >> i) & 1
        if b1 and b2:
            R = _jadd(R, GQ)
        elif b1:
            R = _jadd(R, Gj)
        elif b2:
            R = _jadd(R, Qj)
    return _affine(R)


def p256_mul(k, pt):
    """k*pt on P-256 (affine in and out; None is infinity) -- for tests and key checks."""
    return _double_mul(0, P256_G, k, pt)


def es256_verify(x, y, message, signature):
    """True when `signature` (JWS form: 32-byte r || 32-byte s, RFC 7518 3.4) is an ECDSA
    P-256 SHA-256 signature of `message` under the public point (x, y) (FIPS 186-4 6.4.2)."""
    Q = (x, y)
    if not p256_on_curve(Q):
        return False
    if len(signature) != 64:
        return False
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:], "big")
    n = P256_N
    if not (1 <= r < n and 1 <= s < n):
        return False
    z = int.from_bytes(hashlib.sha256(message).digest(), "big")   # 256 bits == bitlen(n)
    w = pow(s, -1, n)
    R = _double_mul(z * w % n, P256_G, r * w % n, Q)
    if R is None:
        return False
    return R[0] % n == r


def _usable_key(jwk):
    """A JWK we could verify with: RSA (>= 2048 bits) or EC P-256, for signing."""
    if jwk.get("use") not in (None, "sig"):
        return False
    if jwk.get("alg") not in (None,) + ALGS:
        return False
    ops = jwk.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        return False
    if jwk.get("kty") == "RSA":
        n, e = _b64_int(jwk, "n"), _b64_int(jwk, "e")
        return bool(n and e and MIN_RSA_BITS <= n.bit_length() <= MAX_RSA_BITS
                    and e.bit_length() <= 256)
    if jwk.get("kty") == "EC" and jwk.get("crv") == "P-256":
        x, y = _b64_int(jwk, "x", 32), _b64_int(jwk, "y", 32)
        return x is not None and y is not None and p256_on_curve((x, y))
    return False


def _key_verifies(jwk, alg, message, signature):
    if not _usable_key(jwk) or jwk.get("alg") not in (None, alg):
        return False
    if alg == "RS256" and jwk.get("kty") == "RSA":
        return rsa_verify(_b64_int(jwk, "n"), _b64_int(jwk, "e"), message, signature)
    if alg == "ES256" and jwk.get("kty") == "EC":
        return es256_verify(_b64_int(jwk, "x", 32), _b64_int(jwk, "y", 32), message, signature)
    return False


def _decode_jws(token):
    """(header, payload claims, signing input, signature) of a compact JWS; nothing trusted."""
    if not isinstance(token, str) or not token or len(token) > TOKEN_CAP:
        raise SSOError("the ID token is missing or too large")
    parts = token.split(".")
    if len(parts) != 3:
        raise SSOError("the ID token is not a signed JWT (three parts)")
    raw_header = b64url_decode(parts[0], "header")
    raw_payload = b64url_decode(parts[1], "payload")
    signature = b64url_decode(parts[2], "signature")
    try:
        header = json.loads(raw_header.decode("utf-8"), object_pairs_hook=_no_dupes)
        claims = json.loads(raw_payload.decode("utf-8"), object_pairs_hook=_no_dupes)
    except (ValueError, UnicodeDecodeError):
        raise SSOError("the ID token's header or payload is not JSON") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise SSOError("the ID token's header or payload is not a JSON object")
    return header, claims, (parts[0] + "." + parts[1]).encode("ascii"), signature


def _num(claims, name, required=True):
    value = claims.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise SSOError(f"the ID token's {name} is missing or not a number")
    return value


def verify_id_token(token, jwks, issuer, client_id, nonce, now=None):
    """The claims of an ID token that passes every check, else SSOError (401):
    signature RS256 / ES256 by a key of `jwks` (by kid; a token without kid: any usable key of
    its type), iss == issuer, aud contains client_id, azp == client_id when present (required
    when aud names several), exp in the future, iat (and nbf) not beyond SKEW in the future,
    nonce == `nonce`, sub a non-empty string. A kid not in `jwks` raises _UnknownKey (an
    SSOError: the caller may fetch the key set once more)."""
    now = time.time() if now is None else now
    header, claims, signing_input, signature = _decode_jws(token)
    alg = header.get("alg")
    if alg not in ALGS:
        raise SSOError(f"the ID token's algorithm {str(alg)[:20]!r} is refused "
                       f"(only {' and '.join(ALGS)})")
    if "crit" in header or "zip" in header:
        raise SSOError("the ID token carries header parameters we do not understand")
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    keys = [k for k in keys if isinstance(k, dict)] if isinstance(keys, list) else []
    kid = header.get("kid")
    if kid is not None:
        if not isinstance(kid, str):
            raise SSOError("the ID token's kid is not a string")
        candidates = [k for k in keys if k.get("kid") == kid]
        if not candidates:
            raise _UnknownKey("the ID token is signed by a key the provider does not list "
                              "(unknown kid)")
    else:
        kty = "RSA" if alg == "RS256" else "EC"
        candidates = [k for k in keys if k.get("kty") == kty]
        if not candidates:
            raise _UnknownKey(f"the provider lists no {kty} key for the ID token")
    if not any(_key_verifies(k, alg, signing_input, signature) for k in candidates):
        if kid is None:
            raise _UnknownKey("the ID token's signature does not verify")
        raise SSOError("the ID token's signature does not verify")
    # the signature holds: now the claims
    if claims.get("iss") != issuer:
        raise SSOError("the ID token was issued by another issuer")
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else aud
    if not isinstance(auds, list) or not auds or not all(isinstance(a, str) for a in auds):
        raise SSOError("the ID token has no audience")
    if client_id not in auds:
        raise SSOError("the ID token is for another client (aud)")
    azp = claims.get("azp")
    if azp is not None and azp != client_id:
        raise SSOError("the ID token was issued to another party (azp)")
    if len(auds) > 1 and azp is None:
        raise SSOError("the ID token names several audiences and no azp")
    exp = _num(claims, "exp")
    iat = _num(claims, "iat")
    if now >= exp:
        raise SSOError("the ID token has expired")
    if iat > now + SKEW:
        raise SSOError("the ID token is issued in the future (iat)")
    nbf = _num(claims, "nbf", required=False)
    if nbf is not None and nbf > now + SKEW:
        raise SSOError("the ID token is not valid yet (nbf)")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > 255:
        raise SSOError("the ID token has no subject (sub)")
    got = claims.get("nonce")
    if not isinstance(nonce, str) or not nonce:
        raise SSOError("no nonce to check the ID token against")
    if not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
        raise SSOError("the ID token's nonce is missing or not this sign-in's")
    return claims


# ---------------------------------------------------------------------------------------------
# the flow

class Identity:
    """A person the provider vouched for (ID token verified, userinfo agreeing)."""

    __slots__ = ("issuer", "sub", "email", "email_verified", "name", "groups", "claims",
                 "next_path")

    def __init__(self, issuer, sub, email=None, email_verified=False, name=None, groups=(),
                 claims=None, next_path="/"):
        self.issuer, self.sub = issuer, sub
        self.email, self.email_verified = email, bool(email_verified)
        self.name, self.groups = name, list(groups)
        self.claims = dict(claims or {})
        self.next_path = next_path

    def __repr__(self):
        return f"Identity(issuer={self.issuer!r}, sub={self.sub!r}, email={self.email!r})"


def _sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def _one(query, name):
    """A query parameter's one value (str, or a list of one as parse_qs gives), else None."""
    value = query.get(name) if isinstance(query, dict) else None
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            return None
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _safe(text, limit=80):
    """A provider's error code for a message: printable ASCII, short."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "?", str(text))[:limit]


def _verified(value):
    return value is True or value == "true"


def _audit_refused(reason, **details):
    from overlord.trust import audit
    audit.append("sso.refused", reason=reason, **details)


class Flows:
    """The pending sign-ins of one server (in memory): state -> the flow's nonce, PKCE
    verifier, redirect URI, next path, the binding's sha256. One use, FLOW_TTL. Bounded without
    letting one client push out another's sign-in: an address keeps at most `per_address`
    pending (its own oldest dropped for a new one), and when the whole table (`limit`) is full
    a new sign-in is refused (429) -- nobody else's is evicted."""

    def __init__(self, ttl=FLOW_TTL, limit=FLOW_MAX, per_address=FLOW_PER_ADDRESS):
        self.ttl, self.limit, self.per_address = ttl, limit, per_address
        self._lock = threading.Lock()
        self._flows = {}          # insertion order == age
        self._by_address = {}     # address key -> [states], oldest first

    def __len__(self):
        with self._lock:
            self._prune(time.monotonic())
            return len(self._flows)

    def _forget_state(self, state):
        flow = self._flows.pop(state, None)
        if flow is not None and flow.get("address") is not None:
            mine = self._by_address.get(flow["address"])
            if mine is not None:
                try:
                    mine.remove(state)
                except ValueError:
                    pass
                if not mine:
                    del self._by_address[flow["address"]]
        return flow

    def _prune(self, now):
        for state in [s for s, f in self._flows.items() if now - f["created"] > self.ttl]:
            self._forget_state(state)

    def _admit(self, state, flow, address):
        """Keep the flow (under the lock): the address's own oldest make room for it; a full
        table refuses it."""
        self._prune(flow["created"])
        from overlord.trust.auth import address_key     # an IPv6 client by its /64
        key = None if address is None else address_key(str(address))
        if key is not None:
            mine = self._by_address.get(key, [])
            while mine and len(mine) >= self.per_address:
                self._forget_state(mine[0])
                mine = self._by_address.get(key, [])
        if len(self._flows) >= self.limit:
            exc = SSOError("too many sign-ins under way; try again in a minute", http_status=429)
            exc.retry_after = 60
            raise exc
        flow["address"] = key
        self._flows[state] = flow
        if key is not None:
            self._by_address.setdefault(key, []).append(state)

    def start(self, redirect_uri, next_path="/", address=None):
        """(authorize_url, binding): send the browser to authorize_url and set `binding` as
        its cookie; the state, nonce and PKCE verifier stay here. address: the client's (the
        socket's), for the per-address cap; None counts only toward the whole table's.
        SSOError 429 when the table is full."""
        conf = config()
        if conf is None:
            raise SSOError("single sign-on is not configured", http_status=404)
        # this server's own callback (the face builds it from its origin): an absolute http(s)
        # URL; which ones are registered is the provider's check
        parts = urllib.parse.urlsplit(redirect_uri) if isinstance(redirect_uri, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc \
                or parts.fragment or not _PRINTABLE.match(redirect_uri):
            raise SSOError("the redirect URI must be an absolute http(s) URL", http_status=400)
        if not isinstance(next_path, str) or not next_path.startswith("/") \
                or next_path.startswith("//") or "\\" in next_path or len(next_path) > 2000 \
                or any(ord(c) < 0x20 or ord(c) == 0x7f for c in next_path):
            next_path = "/"         # a browser drops tab/CR/LF: "/\t/host" would be "//host"
        doc = discover(conf["issuer"])
        state, nonce, binding = (secrets.token_urlsafe(32) for _ in range(3))
        verifier = secrets.token_urlsafe(48)             # 64 characters (RFC 7636: 43..128)
        challenge = b64url_encode(hashlib.sha256(verifier.encode("ascii")).digest())
        flow = {"binding": _sha256(binding), "nonce": nonce, "verifier": verifier,
                "redirect_uri": redirect_uri, "next": next_path, "issuer": conf["issuer"],
                "client_id": conf["client_id"], "created": time.monotonic()}
        with self._lock:
            self._admit(state, flow, address)
        params = {"response_type": "code", "client_id": conf["client_id"],
                  "redirect_uri": redirect_uri, "scope": conf.get("scopes") or SCOPES,
                  "state": state, "nonce": nonce, "code_challenge": challenge,
                  "code_challenge_method": "S256"}
        endpoint = doc["authorization_endpoint"]
        sep = "&" if urllib.parse.urlsplit(endpoint).query else "?"
        return endpoint + sep + urllib.parse.urlencode(params), binding

    def _take(self, state, binding):
        with self._lock:
            self._prune(time.monotonic())
            flow = self._forget_state(state) if isinstance(state, str) else None
        if flow is None:
            raise SSOError("this sign-in is unknown or has expired (state); start again",
                           http_status=400)
        if not isinstance(binding, str) or not hmac.compare_digest(
                flow["binding"], _sha256(binding)):
            _audit_refused("state bound to another browser", issuer=flow["issuer"])
            raise SSOError("this sign-in was started in another browser (state); start again",
                           http_status=400)
        return flow

    def finish(self, query, binding, redirect_uri):
        """The Identity of the callback `query` (a dict of str or of one-item lists), for the
        browser holding `binding`, at `redirect_uri` (the same as at start)."""
        state = _one(query, "state")
        error = _one(query, "error")
        if not state:
            if error:
                raise SSOError(f"the identity provider refused: {_safe(error)}",
                               http_status=401)
            raise SSOError("the sign-in answer has no state", http_status=400)
        flow = self._take(state, binding)
        if error:
            _audit_refused("provider error", issuer=flow["issuer"], error=_safe(error))
            raise SSOError(f"the identity provider refused: {_safe(error)}", http_status=401)
        if redirect_uri != flow["redirect_uri"]:
            raise SSOError("the sign-in came back to another address", http_status=400)
        code = _one(query, "code")
        if not code or len(code) > 4096:
            raise SSOError("the sign-in answer has no code", http_status=400)
        conf = config()
        if conf is None or conf["issuer"] != flow["issuer"] or \
                conf["client_id"] != flow["client_id"]:
            raise SSOError("single sign-on changed during this sign-in; start again",
                           http_status=400)
        try:
            return self._exchange(conf, flow, code)
        except SSOError as e:
            _audit_refused(str(e), issuer=flow["issuer"])
            raise

    def _exchange(self, conf, flow, code):
        doc = discover(conf["issuer"])
        secret = conf["client_secret"]
        from overlord.trust import vault
        if vault.looks_like_ref(secret):            # resolved now, at the token exchange
            try:
                secret = vault.resolve(secret, "sso client secret")
            except OverlordError as e:           # .short: nothing the resolver printed
                raise SSOError(f"the client secret: {getattr(e, 'short', e)}",
                               http_status=502) from None
        basic = (urllib.parse.quote(conf["client_id"], safe="") + ":" +
                 urllib.parse.quote(secret, safe=""))
        body = urllib.parse.urlencode({
            "grant_type": "authorization_code", "code": code,
            "redirect_uri": flow["redirect_uri"], "code_verifier": flow["verifier"]}).encode()
        status, _, data = _http("POST", doc["token_endpoint"], body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Authorization": "Basic " + base64.b64encode(basic.encode()).decode()})
        if status != 200:
            err = None
            try:
                err = _json_obj(data, "token answer").get("error")
            except SSOError:
                pass
            raise SSOError(f"the identity provider refused the code (HTTP {status}"
                           + (f", {_safe(err)}" if err else "") + ")")
        tok = _json_obj(data, "token answer")
        id_token, access = tok.get("id_token"), tok.get("access_token")
        if not isinstance(id_token, str) or not isinstance(access, str) or not access \
                or len(access) > TOKEN_CAP or not _PRINTABLE.match(access):
            raise SSOError("the identity provider's answer has no ID token or access token")
        if str(tok.get("token_type", "")).lower() != "bearer":
            raise SSOError("the identity provider's access token is not a bearer token")
        claims = self.verify(id_token, conf, doc, flow["nonce"])
        at_hash = claims.get("at_hash")
        if at_hash is not None:
            want = b64url_encode(hashlib.sha256(access.encode("ascii")).digest()[:16])
            if not isinstance(at_hash, str) or not hmac.compare_digest(at_hash, want):
                raise SSOError("the ID token's at_hash does not match the access token")
        status, rh, data = _http("GET", doc["userinfo_endpoint"],
                                 headers={"Authorization": "Bearer " + access})
        if status != 200:
            raise SSOError(f"the identity provider's userinfo answered HTTP {status}")
        if "jwt" in rh.get("content-type", "").lower():
            raise SSOError("a signed userinfo answer is not supported")
        info = _json_obj(data, "userinfo answer")
        if not isinstance(info.get("sub"), str) or not hmac.compare_digest(
                info["sub"].encode(), claims["sub"].encode()):
            raise SSOError("userinfo names another subject than the ID token")
        merged = dict(claims)
        merged.update({k: v for k, v in info.items() if k not in (
            "iss", "aud", "azp", "exp", "iat", "nbf", "nonce", "at_hash")})
        email = merged.get("email")
        email = email.strip() if isinstance(email, str) and len(email) <= 254 else None
        name = merged.get("name") if isinstance(merged.get("name"), str) else None
        gclaim = conf.get("role_claim") or "groups"
        groups = merged.get(gclaim)
        if isinstance(groups, str):
            groups = [groups]
        groups = [g for g in groups if isinstance(g, str)] if isinstance(groups, list) else []
        return Identity(conf["issuer"], claims["sub"], email=email,
                        email_verified=_verified(merged.get("email_verified")),
                        name=name, groups=groups, claims=merged, next_path=flow["next"])

    @staticmethod
    def verify(id_token, conf, doc, nonce):
        """verify_id_token against the provider's key set; an unknown key fetches the set
        again, once."""
        keys = fetch_jwks(doc["jwks_uri"])
        try:
            return verify_id_token(id_token, keys, conf["issuer"], conf["client_id"], nonce)
        except _UnknownKey:
            keys = fetch_jwks(doc["jwks_uri"], fresh=True)
            try:
                return verify_id_token(id_token, keys, conf["issuer"], conf["client_id"], nonce)
            except _UnknownKey as e:
                raise SSOError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# provisioning

_RANK = {"viewer": 0, "operator": 1, "admin": 2}
_provision_lock = threading.Lock()


def _find_by_subject(auth, issuer, sub):
    """(name, record) of the account holding this (issuer, sub), or (None, None)."""
    name = auth.find_sso(issuer, sub)
    return (name, auth.get(name) or {}) if name is not None else (None, None)


def role_for(identity, conf):
    """The role a new account gets: --admin / --viewer lists, else the role claim mapped by
    role_map (the highest role any group maps to), else the default."""
    email = (identity.email or "").strip()
    email = email.lower() if email.isascii() else ""
    if email in conf.get("admins", []):
        return "admin", "admins"
    if email in conf.get("viewers", []):
        return "viewer", "viewers"
    rmap = conf.get("role_map") or {}
    mapped = [rmap[g] for g in identity.groups if g in rmap and rmap[g] in _RANK]
    if conf.get("role_claim") and mapped:
        return max(mapped, key=_RANK.get), "role_claim"
    return conf.get("default_role") or DEFAULT_ROLE, "default"


def provision(identity):
    """The account for a verified identity, as a Principal (via "cookie"): the account holding
    this (issuer, sub) already, or a new one named by the lower-cased e-mail when the e-mail is
    verified and its domain allowed (or the address listed as admin/viewer). Refused (SSOError
    403, audited sso.refused): a disallowed domain, an unverified e-mail, a name that another
    identity or a local account holds."""
    from overlord.trust import audit, auth
    conf = config()
    if conf is None or conf["issuer"] != identity.issuer:
        raise SSOError("single sign-on is not configured for this issuer", http_status=403)

    def refuse(reason, message):
        audit.append("sso.refused", reason=reason, issuer=identity.issuer, sub=identity.sub,
                     email=identity.email)
        raise SSOError(message, http_status=403)

    with _provision_lock:
        name, rec = _find_by_subject(auth, identity.issuer, identity.sub)
        if name is not None:
            return auth.Principal(name=name, role=rec.get("role"), via="cookie")
        email = identity.email.strip() if isinstance(identity.email, str) else ""
        local, _, domain = email.rpartition("@")
        if not local or not domain:
            refuse("no e-mail", "the identity provider gave no e-mail address")
        if not email.isascii():
            # before lower(): U+212A KELVIN SIGN lowers to "k" -- "\u212aate@" is not kate@
            refuse("e-mail not usable as an account name",
                   "this e-mail address cannot name an account here")
        email = email.lower()
        local, _, domain = email.rpartition("@")
        if not identity.email_verified:
            refuse("e-mail not verified", "the identity provider has not verified this e-mail")
        listed = email in conf.get("admins", []) or email in conf.get("viewers", [])
        if domain not in conf.get("domains", []) and not listed:
            refuse("domain not allowed", f"e-mail addresses at {domain} may not sign in here")
        if not _valid_name(email):
            refuse("e-mail not usable as an account name",
                   "this e-mail address cannot name an account here")
        if auth.get(email) is not None:
            refuse("account exists with another identity",
                   f"an account named {email} exists already and is not this sign-on identity")
        role, source = role_for(identity, conf)
        link = {"issuer": identity.issuer, "sub": identity.sub, "email": email}
        try:
            auth.add(email, role, sso=link, by="sso")
        except OverlordError:
            # another process provisioned in between: only the same identity may have it
            name, rec = _find_by_subject(auth, identity.issuer, identity.sub)
            if name is None:
                refuse("account exists with another identity",
                       f"an account named {email} exists already")
            return auth.Principal(name=name, role=rec.get("role"), via="cookie")
        audit.append("sso.provision", name=email, role=role, source=source,
                     issuer=identity.issuer, sub=identity.sub)
        return auth.Principal(name=email, role=role, via="cookie")
