"""Single sign-on (overlord/trust/oidc.py): the ID token's signature and claims, the flow, and
provisioning.

Forged tokens are signed here with keys openssl makes (RSA 2048, RSA with e=3, a second RSA key,
P-256) -- openssl signs, oidc verifies with its own integer arithmetic, so the two agree only if
both are right. The flow runs twice over: against a small provider of ours on a real socket
(it hands out whatever token a test forges, and counts its key-set fetches), and against a real
OpenID provider for testing, oidc-provider-mock (test/auth/oidcmock.py), without a browser:
Flows.start -> the consent form POSTed -> Flows.finish -> provision.
"""
import base64
import hashlib
import hmac
import http.server
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from oidcmock import authorize_without_browser, start_mock  # noqa: E402

from overlord.errors import UsageError  # noqa: E402
from overlord.trust import audit, auth, oidc  # noqa: E402
from overlord.trust.oidc import SSOError  # noqa: E402

ISS = "https://idp.example.test"
CID = "overlord-client"
NONCE = "n-0S6_WzA2Mj"
CALLBACK = "http://127.0.0.1:7777/sso/callback"


# -- keys and signatures (openssl) -------------------------------------------------------------

def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def int_b64(n, size=None):
    return b64(n.to_bytes(size or (n.bit_length() + 7) // 8, "big"))


def _openssl(*args, data=None):
    return subprocess.run(["openssl", *args], input=data, capture_output=True,
                          check=True).stdout


class RSAKey:
    def __init__(self, folder, name, bits=2048, e=65537):
        self.pem = str(folder / f"{name}.pem")
        _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", f"rsa_keygen_bits:{bits}",
                 "-pkeyopt", f"rsa_keygen_pubexp:{e}", "-out", self.pem)
        self.n = int(_openssl("rsa", "-in", self.pem, "-noout", "-modulus")
                     .decode().strip().split("=")[1], 16)
        self.e = e
        self.kid = name
        self.pub_pem = _openssl("rsa", "-in", self.pem, "-pubout")

    def jwk(self, kid=True):
        k = {"kty": "RSA", "n": int_b64(self.n), "e": int_b64(self.e), "use": "sig",
             "alg": "RS256"}
        if kid:
            k["kid"] = self.kid
        return k

    def sign(self, data):
        return _openssl("dgst", "-sha256", "-sign", self.pem, data=data)


def der_to_raw(der):
    """An ECDSA DER signature (SEQUENCE of two INTEGERs) as JWS's 32-byte r || 32-byte s."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 3
    out = []
    for _ in range(2):
        assert der[i] == 0x02
        length = der[i + 1]
        out.append(int.from_bytes(der[i + 2:i + 2 + length], "big"))
        i += 2 + length
    return out[0].to_bytes(32, "big") + out[1].to_bytes(32, "big")


class ECKey:
    def __init__(self, folder, name):
        self.pem = str(folder / f"{name}.pem")
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", self.pem)
        text = _openssl("ec", "-in", self.pem, "-text", "-noout").decode()
        pub = bytes.fromhex(re.sub(r"[^0-9a-f]", "", text.split("pub:")[1].split("ASN1")[0]))
        assert pub[0] == 4 and len(pub) == 65
        self.x, self.y = int.from_bytes(pub[1:33], "big"), int.from_bytes(pub[33:], "big")
        self.kid = name

    def jwk(self, kid=True):
        k = {"kty": "EC", "crv": "P-256", "x": int_b64(self.x, 32), "y": int_b64(self.y, 32),
             "use": "sig"}
        if kid:
            k["kid"] = self.kid
        return k

    def sign_der(self, data):
        return _openssl("dgst", "-sha256", "-sign", self.pem, data=data)

    def sign(self, data):
        return der_to_raw(self.sign_der(data))


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"rsa": RSAKey(folder, "rsa-1"), "other": RSAKey(folder, "rsa-other"),
            "next": RSAKey(folder, "rsa-2"), "e3": RSAKey(folder, "rsa-e3", e=3),
            "small": RSAKey(folder, "rsa-1024", bits=1024), "ec": ECKey(folder, "ec-1")}


def claims(**over):
    now = int(time.time())
    c = {"iss": ISS, "aud": CID, "sub": "user-1", "exp": now + 300, "iat": now,
         "nonce": NONCE, "email": "alice@example.com", "email_verified": True}
    c.update(over)
    return {k: v for k, v in c.items() if v is not DROP}


DROP = object()


def forge(key, payload, alg=None, kid=None, header=None, signature=None):
    """A compact JWS: header.payload.signature, signed by `key` (or `signature` as given)."""
    if header is None:
        header = {"alg": alg or ("ES256" if isinstance(key, ECKey) else "RS256"), "typ": "JWT"}
        if kid is not None:
            header["kid"] = kid
        elif key is not None:
            header["kid"] = key.kid
    head = b64(json.dumps(header).encode()) if isinstance(header, dict) else header
    body = b64(json.dumps(payload).encode()) if isinstance(payload, dict) else payload
    signing_input = f"{head}.{body}".encode()
    if signature is None:
        signature = key.sign(signing_input)
    return f"{head}.{body}.{b64(signature)}"


def jwks(*keys_, kid=True):
    return {"keys": [k.jwk(kid=kid) for k in keys_]}


def verify(token, key_set, nonce=NONCE, **kw):
    return oidc.verify_id_token(token, key_set, ISS, CID, nonce, **kw)


def refused(token, key_set, match, nonce=NONCE, **kw):
    with pytest.raises(SSOError, match=match) as info:
        verify(token, key_set, nonce=nonce, **kw)
    assert info.value.http_status == 401
    return info.value


# -- the signature -----------------------------------------------------------------------------

def test_a_good_rs256_token_verifies(keys):
    got = verify(forge(keys["rsa"], claims()), jwks(keys["rsa"], keys["ec"]))
    assert got["sub"] == "user-1" and got["nonce"] == NONCE


def test_a_token_without_kid_is_tried_against_the_keys_of_its_type(keys):
    """oidc-provider-mock's tokens carry no kid: any RSA key of the set may verify it."""
    token = forge(keys["rsa"], claims(), header={"alg": "RS256"})
    assert verify(token, jwks(keys["other"], keys["rsa"], kid=False))["sub"] == "user-1"


def test_a_good_es256_token_verifies_and_a_der_signature_does_not(keys):
    ec = keys["ec"]
    assert verify(forge(ec, claims()), jwks(ec))["sub"] == "user-1"
    header = b64(json.dumps({"alg": "ES256", "kid": ec.kid}).encode())
    body = b64(json.dumps(claims()).encode())
    der = ec.sign_der(f"{header}.{body}".encode())       # the right signature, in DER: not JWS
    refused(f"{header}.{body}.{b64(der)}", jwks(ec), "signature does not verify")


def test_the_rsa_arithmetic_agrees_with_openssl_and_nothing_else(keys):
    k = keys["rsa"]
    sig = k.sign(b"message")
    assert oidc.rsa_verify(k.n, k.e, b"message", sig)
    assert not oidc.rsa_verify(k.n, k.e, b"messagE", sig)
    assert not oidc.rsa_verify(k.n, k.e, b"message", sig[:-1])               # length != k
    assert not oidc.rsa_verify(k.n, k.e, b"message", b"\x00" + sig)
    assert not oidc.rsa_verify(k.n, k.e, b"message", (k.n + 1).to_bytes(256, "big"))  # s >= n
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert not oidc.rsa_verify(k.n, k.e, b"message", flipped)
    # s + n has the same s^e mod n: refused all the same (RFC 8017 RSAVP1: s < n)
    for i in range(64):
        m = b"message %d" % i
        s = int.from_bytes(k.sign(m), "big")
        if s + k.n < 1 << 2048:
            assert oidc.rsa_verify(k.n, k.e, m, s.to_bytes(256, "big"))
            assert not oidc.rsa_verify(k.n, k.e, m, (s + k.n).to_bytes(256, "big"))
            break
    else:
        pytest.fail("no signature below 2^2048 - n in 64 tries")


def _icbrt(n):
    lo, hi = 0, 1 << ((n.bit_length() + 2) // 3 + 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if mid ** 3 < n:
            lo = mid + 1
        else:
            hi = mid
    return lo


def test_an_e3_signature_with_garbage_after_the_digest_is_refused(keys):
    """Bleichenbacher 2006: with e=3, a cube root makes a block that *starts* 00 01 FF 00
    DigestInfo H(m) and ends in garbage -- accepted by a verifier that parses the block. Ours
    rebuilds the whole block and compares it, so the forgery fails; the honest signature under
    the same e=3 key passes."""
    k = keys["e3"]
    message = b"header.payload"
    digest_info = bytes.fromhex("3031300d060960864801650304020105000420") + \
        hashlib.sha256(message).digest()
    prefix = b"\x00\x01" + b"\xff" * 8 + b"\x00" + digest_info
    block = prefix + b"\x00" * (256 - len(prefix))     # the cube root's error lands here
    forged = _icbrt(int.from_bytes(block, "big"))
    em = pow(forged, 3, k.n).to_bytes(256, "big")
    assert em.startswith(prefix)                     # a parse-based verifier would say yes
    assert not oidc.rsa_verify(k.n, 3, message, forged.to_bytes(256, "big"))
    assert oidc.rsa_verify(k.n, 3, message, k.sign(message))


def test_the_p256_arithmetic(keys):
    ec = keys["ec"]
    sig = ec.sign(b"m")
    assert oidc.es256_verify(ec.x, ec.y, b"m", sig)
    assert not oidc.es256_verify(ec.x, ec.y, b"M", sig)
    r, s = sig[:32], int.from_bytes(sig[32:], "big")
    assert not oidc.es256_verify(ec.x, ec.y, b"m", r + ((s + 1) % oidc.P256_N).to_bytes(32, "big"))
    assert not oidc.es256_verify(ec.x, ec.y, b"m", bytes(32) + sig[32:])      # r = 0
    assert not oidc.es256_verify(ec.x, ec.y, b"m", sig + b"\x00")             # 65 bytes
    assert not oidc.es256_verify(ec.x, ec.y, b"m", sig[:32] + b"\x00" + sig[32:])  # same s
    assert not oidc.es256_verify(ec.x, ec.y, b"m", sig[:63])
    assert not oidc.es256_verify(ec.x, ec.y, b"m", sig[:32] + oidc.P256_N.to_bytes(32, "big"))
    assert not oidc.es256_verify(ec.x, (ec.y + 1) % oidc.P256_P, b"m", sig)   # not on the curve
    assert oidc.p256_mul(oidc.P256_N, oidc.P256_G) is None                    # n*G = infinity
    assert oidc.p256_on_curve(oidc.p256_mul(7, oidc.P256_G))


def test_a_token_signed_by_another_key_is_refused(keys):
    token = forge(keys["other"], claims(), kid=keys["rsa"].kid)   # names our kid, other key
    refused(token, jwks(keys["rsa"]), "signature does not verify")


def test_a_tampered_payload_is_refused(keys):
    good = forge(keys["rsa"], claims())
    head, _, sig = good.split(".")
    evil = b64(json.dumps(claims(sub="admin-1")).encode())
    refused(f"{head}.{evil}.{sig}", jwks(keys["rsa"]), "signature does not verify")


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "", None])
def test_alg_none_is_refused(keys, alg):
    header = {"alg": alg, "typ": "JWT"} if alg is not None else {"typ": "JWT"}
    for sig in (b"", b"x"):
        refused(forge(None, claims(), header=header, signature=sig), jwks(keys["rsa"]),
                "algorithm")


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_hmac_with_the_public_key_as_the_secret_is_refused(keys, alg):
    """The old confusion attack: sign HS256 with the provider's *public* key as the HMAC
    secret, hoping the verifier feeds the key it has to HMAC."""
    k = keys["rsa"]
    header = {"alg": alg, "kid": k.kid}
    head = b64(json.dumps(header).encode())
    body = b64(json.dumps(claims()).encode())
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
    for secret in (k.pub_pem, json.dumps(k.jwk()).encode(), k.n.to_bytes(256, "big")):
        mac = hmac.new(secret, f"{head}.{body}".encode(), digest).digest()
        refused(f"{head}.{body}.{b64(mac)}", jwks(k), "algorithm")


@pytest.mark.parametrize("alg", ["RS384", "RS512", "PS256", "ES384", "ES512", "EdDSA", "rs256"])
def test_other_algorithms_are_refused(keys, alg):
    refused(forge(keys["rsa"], claims(), alg=alg), jwks(keys["rsa"]), "algorithm")


def test_a_key_of_the_wrong_type_or_use_is_not_used(keys):
    k = keys["rsa"]
    token = forge(k, claims())
    enc = dict(k.jwk(), use="enc")
    refused(token, {"keys": [enc]}, "signature does not verify")
    other_alg = dict(k.jwk(), alg="RS512")
    refused(token, {"keys": [other_alg]}, "signature does not verify")
    # an ES256 header over an RSA key's kid: no EC arithmetic on an RSA key
    ec_head = forge(keys["ec"], claims(), kid=k.kid)
    refused(ec_head, jwks(k), "signature does not verify")


def test_an_rsa_key_under_2048_bits_is_refused(keys):
    k = keys["small"]
    token = forge(k, claims())
    assert oidc.rsa_verify(k.n, k.e, b"x", k.sign(b"x")) is False
    refused(token, jwks(k), "signature does not verify")


def test_a_key_too_large_to_be_one_is_not_worked_with(keys):
    """pow() with a megabit modulus or exponent costs seconds: such a key is refused outright."""
    k = keys["rsa"]
    big_n = (1 << 20000) + 1
    t0 = time.monotonic()
    assert not oidc.rsa_verify(big_n, 65537, b"m", b"\x01" * 2501)
    assert not oidc.rsa_verify(k.n, (1 << 4096) + 1, b"m", k.sign(b"m"))
    assert not oidc._usable_key({"kty": "RSA", "n": int_b64(big_n), "e": "AQAB"})
    assert time.monotonic() - t0 < 1


def test_an_unknown_kid_is_its_own_refusal(keys):
    with pytest.raises(oidc._UnknownKey):
        verify(forge(keys["next"], claims()), jwks(keys["rsa"]))


def test_a_kid_that_is_not_a_string_is_refused(keys):
    refused(forge(keys["rsa"], claims(), kid=7), jwks(keys["rsa"]), "kid")


@pytest.mark.parametrize("token", [
    "", "abc", "a.b", "a.b.c.d", "a.b.c.d.e",
    "eyJhbGciOiJSUzI1NiJ9.e30.", "eyJhbGciOiJSUzI1NiJ9=.e30.AA",
    "eyJhbGciOiJSUzI1NiJ9.e30.A", "eyJhbGciOiJSUzI1NiJ9.e3+.AA", "eyJhbGciOiJSUzI1NiJ9.e30 .AA",
    "x" * (64 * 1024 + 1),
])
def test_malformed_tokens_are_refused(keys, token):
    with pytest.raises(SSOError):
        verify(token, jwks(keys["rsa"]))


def test_headers_and_payloads_that_are_not_plain_json_objects(keys):
    k = keys["rsa"]
    dup = '{"alg":"none","alg":"RS256","kid":"rsa-1"}'
    refused(forge(k, claims(), header=b64(dup.encode())), jwks(k), "not JSON")
    refused(forge(k, b64(b"[1,2]")), jwks(k), "not a JSON object")
    refused(forge(k, b64(b"\xff\xfe")), jwks(k), "not JSON")
    refused(forge(k, claims(), header={"alg": "RS256", "kid": k.kid, "crit": ["exp"]}),
            jwks(k), "do not understand")
    # a canonical-looking token whose base64 has non-zero trailing bits
    head = b64(json.dumps({"alg": "RS256", "kid": k.kid}).encode())
    body = b64(json.dumps(claims()).encode())
    sig = b64(k.sign(f"{head}.{body}".encode()))
    assert len(sig) % 4 == 2            # 256 bytes: the last character carries 4 spare bits
    bent = sig[:-1] + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(sig[-1]) | 1]
    if bent != sig:
        refused(f"{head}.{body}.{bent}", jwks(k), "canonical")


# -- the claims --------------------------------------------------------------------------------

def test_an_expired_token_is_refused(keys):
    now = int(time.time())
    refused(forge(keys["rsa"], claims(exp=now - 1, iat=now - 600)), jwks(keys["rsa"]),
            "expired")
    refused(forge(keys["rsa"], claims(exp=now)), jwks(keys["rsa"]), "expired", now=now)


def test_iat_in_the_future_beyond_the_skew_is_refused(keys):
    now = int(time.time())
    refused(forge(keys["rsa"], claims(iat=now + 120, exp=now + 600)), jwks(keys["rsa"]),
            "future")
    assert verify(forge(keys["rsa"], claims(iat=now + 30)), jwks(keys["rsa"]))  # within skew
    refused(forge(keys["rsa"], claims(nbf=now + 120)), jwks(keys["rsa"]), "nbf")


@pytest.mark.parametrize("field,value", [("exp", DROP), ("exp", "9999999999"), ("exp", True),
                                         ("iat", DROP), ("iat", None), ("sub", DROP),
                                         ("sub", ""), ("sub", 5)])
def test_required_claims_of_the_right_type(keys, field, value):
    with pytest.raises(SSOError):
        verify(forge(keys["rsa"], claims(**{field: value})), jwks(keys["rsa"]))


def test_a_wrong_issuer_is_refused(keys):
    for iss in ("https://evil.example", ISS + "/", ISS.upper(), None, [ISS]):
        refused(forge(keys["rsa"], claims(iss=iss)), jwks(keys["rsa"]), "another issuer")


def test_the_audience_and_the_authorized_party(keys):
    k = keys["rsa"]
    for aud in ("someone-else", ["someone-else"], [], None, [CID.upper()], 7):
        refused(forge(k, claims(aud=aud)), jwks(k), "aud")
    assert verify(forge(k, claims(aud=[CID])), jwks(k))
    refused(forge(k, claims(aud=[CID, "other"])), jwks(k), "several audiences and no azp")
    assert verify(forge(k, claims(aud=[CID, "other"], azp=CID)), jwks(k))
    refused(forge(k, claims(aud=[CID, "other"], azp="other")), jwks(k), "azp")
    refused(forge(k, claims(azp="other")), jwks(k), "azp")


def test_the_nonce_must_be_this_sign_ins(keys):
    k = keys["rsa"]
    refused(forge(k, claims(nonce=DROP)), jwks(k), "nonce")
    refused(forge(k, claims(nonce="an-older-sign-in")), jwks(k), "nonce")
    refused(forge(k, claims(nonce=7)), jwks(k), "nonce")
    refused(forge(k, claims()), jwks(k), "nonce", nonce=None)
    refused(forge(k, claims(nonce="")), jwks(k), "nonce", nonce="")


# -- the flow against a provider of ours (real socket; it serves what the test forges) --------

class Provider:
    """A minimal OpenID provider on 127.0.0.1: discovery, a key set (fetches counted), a token
    endpoint checking client_secret_basic and PKCE and answering with a token the test makes,
    and userinfo."""

    def __init__(self):
        self.keys = []
        self.jwks_fetches = 0
        self.make_token = None           # f(nonce) -> id_token
        self.userinfo = {"sub": "user-1"}
        self.token_extra = {}
        self.seen = []                   # the token requests' forms
        self.pending = {}                # code -> (nonce, challenge)
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/.well-known/openid-configuration":
                    base = outer.issuer
                    return self.reply(200, {
                        "issuer": base, "authorization_endpoint": base + "/authorize",
                        "token_endpoint": base + "/token", "userinfo_endpoint": base + "/me",
                        "jwks_uri": base + "/jwks",
                        "id_token_signing_alg_values_supported": ["RS256", "ES256"]})
                if self.path == "/jwks":
                    outer.jwks_fetches += 1
                    return self.reply(200, {"keys": [k.jwk() for k in outer.keys]})
                if self.path == "/me":
                    if self.headers.get("Authorization") != "Bearer AT-1":
                        return self.reply(401, {"error": "invalid_token"})
                    return self.reply(200, outer.userinfo)
                self.reply(404, {})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                form["authorization"] = self.headers.get("Authorization")
                outer.seen.append(form)
                want = "Basic " + base64.b64encode(f"{CID}:s%3Acret".encode()).decode()
                if form["authorization"] != want:
                    return self.reply(401, {"error": "invalid_client"})
                nonce, challenge = outer.pending.pop(form.get("code"), (None, None))
                verifier = form.get("code_verifier", "")
                if nonce is None or b64(hashlib.sha256(verifier.encode()).digest()) != challenge:
                    return self.reply(400, {"error": "invalid_grant"})
                tok = {"access_token": "AT-1", "token_type": "Bearer",
                       "id_token": outer.make_token(nonce)}
                tok.update(outer.token_extra)
                self.reply(200, tok)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.issuer = "http://127.0.0.1:%d" % self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def authorize(self, url, code="CODE-1"):
        """What the provider does with the authorization URL: remember its nonce and PKCE
        challenge for the code, and send the browser back with code and state."""
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        assert q["code_challenge_method"] == "S256" and q["response_type"] == "code"
        assert q["scope"].split()[0] == "openid" and q["client_id"] == CID
        self.pending[code] = (q["nonce"], q["code_challenge"])
        return {"code": code, "state": q["state"]}, q

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def provider(home, keys):
    p = Provider()
    p.keys = [keys["rsa"]]
    oidc.configure(p.issuer, CID, "s:cret", domains=["example.com"])
    yield p
    p.close()


def _token_for(p, key, **over):
    def make(nonce):
        return forge(key, dict(claims(nonce=nonce, **over), iss=p.issuer))
    return make


def test_the_flow_with_our_provider(provider, keys):
    provider.make_token = _token_for(provider, keys["rsa"])
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/workspace?x=1")
    assert url.startswith(provider.issuer + "/authorize?")
    query, q = provider.authorize(url)
    assert binding not in url and len(binding) >= 43
    ident = flows.finish(query, binding, CALLBACK)
    assert (ident.issuer, ident.sub, ident.email) == (provider.issuer, "user-1",
                                                      "alice@example.com")
    assert ident.next_path == "/workspace?x=1"
    form = provider.seen[-1]
    assert form["grant_type"] == "authorization_code" and form["redirect_uri"] == CALLBACK
    assert 43 <= len(form["code_verifier"]) <= 128
    assert "client_secret" not in form             # client_secret_basic, not in the body
    assert len(flows) == 0                         # one use


def test_parse_qs_lists_are_taken_and_two_values_are_not(provider, keys):
    provider.make_token = _token_for(provider, keys["rsa"])
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    query, _ = provider.authorize(url)
    with pytest.raises(SSOError, match="no state"):
        flows.finish({"code": [query["code"]], "state": [query["state"], "x"]}, binding,
                     CALLBACK)
    assert flows.finish({k: [v] for k, v in query.items()}, binding, CALLBACK).sub == "user-1"


def test_an_unknown_kid_fetches_the_key_set_once_more_then_refuses(provider, keys):
    provider.make_token = _token_for(provider, keys["next"])       # kid rsa-2: not served
    flows = oidc.Flows()
    oidc.test()                                                    # key set fetched: cached
    before = provider.jwks_fetches
    url, binding = flows.start(CALLBACK, "/")
    query, _ = provider.authorize(url)
    with pytest.raises(SSOError, match="unknown kid") as info:
        flows.finish(query, binding, CALLBACK)
    assert info.value.http_status == 401
    assert provider.jwks_fetches == before + 1                     # one refetch, no more


def test_a_rotated_key_is_accepted_after_the_refetch(provider, keys):
    flows = oidc.Flows()
    provider.make_token = _token_for(provider, keys["rsa"])
    url, binding = flows.start(CALLBACK, "/")
    flows.finish(provider.authorize(url)[0], binding, CALLBACK)    # rsa-1 cached
    provider.keys = [keys["next"], keys["ec"]]                     # the provider rotates
    provider.make_token = _token_for(provider, keys["next"])
    before = provider.jwks_fetches
    url, binding = flows.start(CALLBACK, "/")
    assert flows.finish(provider.authorize(url, "CODE-2")[0], binding, CALLBACK).sub == "user-1"
    assert provider.jwks_fetches == before + 1
    provider.make_token = _token_for(provider, keys["ec"])         # ES256, same key set
    url, binding = flows.start(CALLBACK, "/")
    assert flows.finish(provider.authorize(url, "CODE-3")[0], binding, CALLBACK).sub == "user-1"
    assert provider.jwks_fetches == before + 1                     # cached: no fetch


def test_a_forged_token_from_the_token_endpoint_is_refused_and_audited(provider, keys):
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    query, _ = provider.authorize(url)
    provider.make_token = lambda nonce: forge(keys["other"], dict(
        claims(nonce=nonce), iss=provider.issuer), kid=keys["rsa"].kid)
    with pytest.raises(SSOError, match="signature"):
        flows.finish(query, binding, CALLBACK)
    last = list(audit.entries())[-1]
    assert last["action"] == "sso.refused" and "signature" in last["reason"]
    assert "CODE" not in json.dumps(last) and "s:cret" not in json.dumps(last)


def test_userinfo_must_name_the_same_subject(provider, keys):
    provider.make_token = _token_for(provider, keys["rsa"])
    provider.userinfo = {"sub": "user-2", "email": "alice@example.com"}
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    with pytest.raises(SSOError, match="another subject"):
        flows.finish(provider.authorize(url)[0], binding, CALLBACK)


def test_at_hash_must_match_the_access_token(provider, keys):
    good = b64(hashlib.sha256(b"AT-1").digest()[:16])
    provider.make_token = _token_for(provider, keys["rsa"], at_hash=good)
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    assert flows.finish(provider.authorize(url)[0], binding, CALLBACK)
    provider.make_token = _token_for(provider, keys["rsa"], at_hash=b64(b"0" * 16))
    url, binding = flows.start(CALLBACK, "/")
    with pytest.raises(SSOError, match="at_hash"):
        flows.finish(provider.authorize(url, "CODE-2")[0], binding, CALLBACK)


def test_a_token_replayed_from_an_earlier_sign_in_is_refused(provider, keys):
    """The provider hands back, for a new sign-in, an ID token minted for an earlier one (its
    nonce): refused -- and the earlier state cannot be finished twice."""
    flows = oidc.Flows()
    tokens = []
    provider.make_token = lambda nonce: tokens.append(
        forge(keys["rsa"], dict(claims(nonce=nonce), iss=provider.issuer))) or tokens[-1]
    url, binding = flows.start(CALLBACK, "/")
    first, _ = provider.authorize(url)
    flows.finish(first, binding, CALLBACK)
    with pytest.raises(SSOError, match="unknown or has expired"):
        flows.finish(first, binding, CALLBACK)
    provider.make_token = lambda nonce: tokens[0]
    url, binding = flows.start(CALLBACK, "/")
    with pytest.raises(SSOError, match="nonce"):
        flows.finish(provider.authorize(url, "CODE-2")[0], binding, CALLBACK)


@pytest.mark.parametrize("extra", [{"access_token": "AT\r\nX-Evil: 1"}, {"access_token": ""},
                                   {"access_token": 7}, {"id_token": None},
                                   {"token_type": "mac"}])
def test_a_token_answer_out_of_shape_is_a_refusal(provider, keys, extra):
    provider.make_token = _token_for(provider, keys["rsa"])
    provider.token_extra = extra
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    with pytest.raises(SSOError) as info:
        flows.finish(provider.authorize(url)[0], binding, CALLBACK)
    assert info.value.http_status == 401


def test_the_token_endpoints_refusal_is_a_refusal(provider, keys):
    provider.make_token = _token_for(provider, keys["rsa"])
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    query, _ = provider.authorize(url)
    query["code"] = "NOT-ISSUED"
    with pytest.raises(SSOError, match="refused the code") as info:
        flows.finish(query, binding, CALLBACK)
    assert info.value.http_status == 401


def test_state_binding_redirect_and_expiry(provider, keys):
    provider.make_token = _token_for(provider, keys["rsa"])
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    query, _ = provider.authorize(url)
    for bad in ({}, {"code": "x"}, {"state": ""}, "not a dict", {"state": ["a", "b"]}):
        with pytest.raises(SSOError) as info:
            flows.finish(bad, binding, CALLBACK)
        assert info.value.http_status == 400
    with pytest.raises(SSOError, match="unknown"):
        flows.finish(dict(query, state="guessed"), binding, CALLBACK)
    # login CSRF: the attacker's state and code, delivered to the victim's browser
    _, victims_binding = flows.start(CALLBACK, "/")
    with pytest.raises(SSOError, match="another browser"):
        flows.finish(query, victims_binding, CALLBACK)
    with pytest.raises(SSOError, match="unknown"):           # and the attacker's state is spent
        flows.finish(query, binding, CALLBACK)
    url, binding = flows.start(CALLBACK, "/")
    query, _ = provider.authorize(url, "CODE-2")
    with pytest.raises(SSOError, match="another address"):
        flows.finish(query, binding, "http://127.0.0.1:7777/elsewhere")
    for missing in (None, "", 5):
        url, b = flows.start(CALLBACK, "/")
        with pytest.raises(SSOError):
            flows.finish(provider.authorize(url, "CODE-3")[0], missing, CALLBACK)
    expired = oidc.Flows(ttl=-1)
    url, binding = expired.start(CALLBACK, "/")
    with pytest.raises(SSOError, match="expired"):
        expired.finish(provider.authorize(url, "CODE-4")[0], binding, CALLBACK)


def _state(url):
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))["state"]


def test_pending_flows_are_bounded_without_evicting_anyone(provider):
    # the whole table full: a new sign-in is refused (429), nobody's pending one is dropped
    flows = oidc.Flows(limit=5)
    started = [flows.start(CALLBACK, "/") for _ in range(5)]
    for _ in range(3):
        with pytest.raises(SSOError, match="too many sign-ins under way") as info:
            flows.start(CALLBACK, "/")
        assert info.value.http_status == 429 and info.value.retry_after == 60
    assert len(flows) == 5
    assert _state(started[0][0]) in flows._flows
    # one address over its own cap drops its own oldest, never another address's
    flows = oidc.Flows(limit=50, per_address=3)
    victim = flows.start(CALLBACK, "/", address="10.0.0.5")
    hog = [flows.start(CALLBACK, "/", address="10.0.0.6") for _ in range(10)]
    assert len(flows) == 4
    assert _state(victim[0]) in flows._flows
    assert [_state(u) in flows._flows for u, _ in hog] == [False] * 7 + [True] * 3
    # an IPv6 client counts by its /64: another address of the same host shares the cap
    for i in range(5):
        flows.start(CALLBACK, "/", address=f"2001:db8::{i + 1}")
    assert len(flows) == 7 and _state(victim[0]) in flows._flows
    with pytest.raises(SSOError, match="unknown"):        # a dropped one is gone for good
        flows.finish({"state": _state(hog[0][0]), "code": "x"}, hog[0][1], CALLBACK)


def test_next_is_only_a_path_here(provider):
    flows = oidc.Flows()
    for nxt in ("//evil.example/", "https://evil.example/", "/\\evil.example", "evil", None):
        url, binding = flows.start(CALLBACK, nxt)
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        assert flows._flows[query["state"]]["next"] == "/"


def test_a_provider_error_is_a_refusal(provider):
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    state = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))["state"]
    with pytest.raises(SSOError, match="refused: access_denied") as info:
        flows.finish({"error": "access_denied", "state": state}, binding, CALLBACK)
    assert info.value.http_status == 401
    with pytest.raises(SSOError, match="unknown"):                # the state is spent
        flows.finish({"code": "x", "state": state}, binding, CALLBACK)
    with pytest.raises(SSOError, match=r"refused: \?script"):     # no state; text made safe
        flows.finish({"error": "<script>"}, binding, CALLBACK)


def test_discovery_must_name_the_issuer_we_configured(home):
    p = Provider()
    try:
        oidc.configure(p.issuer + "/", CID, "s:cret", domains=["example.com"])
        with pytest.raises(SSOError, match="names issuer") as info:
            oidc.Flows().start(CALLBACK, "/")
        assert info.value.http_status == 502
    finally:
        p.close()


def test_a_provider_that_is_not_there(home):
    oidc.configure("http://127.0.0.1:9", CID, "x", domains=["example.com"])
    with pytest.raises(SSOError, match="cannot reach") as info:
        oidc.test()
    assert info.value.http_status == 502


def test_not_configured(home):
    assert oidc.config() is None and oidc.public() == {"enabled": False}
    with pytest.raises(SSOError, match="not configured"):
        oidc.Flows().start(CALLBACK, "/")
    with pytest.raises(SSOError):
        oidc.test()


# -- the configuration -------------------------------------------------------------------------

def test_configure_validates_and_keeps_the_secret_private(home):
    conf = oidc.configure("https://login.example.com", CID, "top-secret",
                          domains=["Example.COM", "@corp.example"], admins=["Boss@Example.com"],
                          viewers=["aud@example.com"], role_claim="groups",
                          role_map={"auditors": "viewer", "ops": "operator"})
    assert conf["client_secret"] == "********" and conf["domains"] == ["example.com",
                                                                       "corp.example"]
    assert conf["admins"] == ["boss@example.com"] and conf["default_role"] == "operator"
    p = home / "sso.json"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert oidc.config()["client_secret"] == "top-secret"
    assert "top-secret" not in (home / "audit.jsonl").read_text()
    # the secret kept when none is given (same issuer and client)
    oidc.configure("https://login.example.com", CID, None, domains=["example.com"])
    assert oidc.config()["client_secret"] == "top-secret"
    with pytest.raises(UsageError, match="secret"):
        oidc.configure("https://login.example.com", "other-client", None)
    bad = [dict(issuer="http://login.example.com"), dict(issuer="ftp://x"),
           dict(issuer="https://u:p@x.example"), dict(issuer="https://x.example/?a=1"),
           dict(issuer="https://x.example/#f"), dict(issuer=""), dict(issuer="https://x:99999"),
           dict(client_id=""), dict(client_id="a b"), dict(client_secret="two\nlines"),
           dict(domains=["not a domain"]), dict(domains=["a/b"]), dict(admins=["nobody"]),
           dict(admins=["x@example.com"], viewers=["X@example.com"]),
           dict(role_map={"g": "root"}, role_claim="groups"), dict(role_map={"g": "admin"}),
           dict(role_claim="sub"), dict(role_claim="bad claim"), dict(default_role="god")]
    before = p.read_bytes()
    for over in bad:
        args = dict(issuer="https://login.example.com", client_id=CID, client_secret="s")
        args.update(over)
        with pytest.raises(UsageError):
            oidc.configure(args.pop("issuer"), args.pop("client_id"), args.pop("client_secret"),
                           **args)
    assert p.read_bytes() == before
    for loopback in ("http://127.0.0.1:8080", "http://[::1]:8080", "http://localhost:8080"):
        oidc.configure(loopback, CID, "s")
    assert oidc.off() is True and oidc.off() is False and oidc.config() is None


def test_a_sso_file_others_may_read_is_refused(home):
    oidc.configure("https://login.example.com", CID, "s")
    os.chmod(home / "sso.json", 0o644)
    with pytest.raises(Exception, match="chmod 600"):
        oidc.config()
    os.chmod(home / "sso.json", 0o600)
    (home / "sso.json").write_text("{not json")
    with pytest.raises(Exception, match="damaged"):
        oidc.config()


# -- the real provider: oidc-provider-mock, no browser -----------------------------------------

@pytest.fixture(scope="module")
def _mock():
    with start_mock() as mock:
        yield mock


@pytest.fixture
def idp(home, _mock):
    """The provider (one process for the module: each test sets the claims of its subjects
    before signing them in), with a fresh OVERLORD_HOME."""
    return _mock


def sign_in(idp, sub, claims_, flows=None, **conf):
    """The whole round: configure (if asked), start, consent, finish, provision."""
    if conf:
        oidc.configure(idp.issuer, CID, "mock-secret", **conf)
    idp.set_user(sub, claims_)
    flows = flows or oidc.Flows()
    url, binding = flows.start(CALLBACK, "/after")
    location = authorize_without_browser(url, sub)
    assert location.startswith(CALLBACK + "?")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
    ident = flows.finish(query, binding, CALLBACK)
    return ident, oidc.provision(ident)


def acts(action):
    return [e for e in audit.entries() if e["action"] == action]


def test_the_real_provider_signs_in_and_provisions(idp):
    ident, who = sign_in(idp, "sub-alice", {"email": "Alice@Example.com", "email_verified": True,
                                            "name": "Alice"}, domains=["example.com"])
    assert ident.issuer == idp.issuer and ident.sub == "sub-alice" and ident.name == "Alice"
    assert ident.next_path == "/after"
    assert (who.name, who.role, who.via) == ("alice@example.com", "operator", "cookie")
    assert who.actor == "account:alice@example.com"
    rec = auth.get("alice@example.com")
    assert rec["sso"] == {"issuer": idp.issuer, "sub": "sub-alice", "email": "alice@example.com"}
    assert rec["password"] is None
    assert acts("sso.provision")[-1]["name"] == "alice@example.com"
    # the second sign-in finds the same account: no second provision, the stored role kept
    auth.set_role("alice@example.com", "viewer")
    _, again = sign_in(idp, "sub-alice", {"email": "alice@example.com", "email_verified": True})
    assert (again.name, again.role) == ("alice@example.com", "viewer")
    assert len(acts("sso.provision")) == 1
    with pytest.raises(auth.AuthError, match="single sign-on"):
        auth.check_password("alice@example.com", "anything", "127.0.0.1")


def test_a_domain_not_allowed_is_refused(idp):
    with pytest.raises(SSOError, match="may not sign in") as info:
        sign_in(idp, "sub-eve", {"email": "eve@evil.example", "email_verified": True},
                domains=["example.com"])
    assert info.value.http_status == 403
    assert auth.listing() == []
    assert acts("sso.refused")[-1]["reason"] == "domain not allowed"
    # a subdomain is another domain
    with pytest.raises(SSOError, match="may not sign in"):
        sign_in(idp, "sub-sub", {"email": "x@mail.example.com", "email_verified": True})


def test_an_unverified_email_is_refused(idp):
    for verified in (False, None, "false", 1):
        claims_ = {"email": "bob@example.com"}
        if verified is not None:
            claims_["email_verified"] = verified
        with pytest.raises(SSOError, match="not verified"):
            sign_in(idp, "sub-bob", claims_, domains=["example.com"])
    assert auth.listing() == []
    assert acts("sso.refused")[-1]["reason"] == "e-mail not verified"


def test_no_email_is_refused(idp):
    with pytest.raises(SSOError, match="no e-mail"):
        sign_in(idp, "sub-anon", {"name": "Anon"}, domains=["example.com"])


def test_roles_from_the_lists_the_groups_claim_and_the_default(idp):
    oidc.configure(idp.issuer, CID, "mock-secret", domains=["example.com"],
                   admins=["boss@example.com"], viewers=["audit@partner.example"],
                   role_claim="groups", role_map={"auditors": "viewer", "admins": "admin"},
                   default_role="viewer")
    v = {"email_verified": True}
    cases = [("s-boss", {"email": "boss@example.com", "groups": ["auditors"]}, "admin"),
             ("s-aud", {"email": "audit@partner.example"}, "viewer"),   # listed: domain aside
             ("s-grp", {"email": "g@example.com", "groups": ["admins", "auditors"]}, "admin"),
             ("s-one", {"email": "o@example.com", "groups": "auditors"}, "viewer"),
             ("s-def", {"email": "d@example.com", "groups": ["unmapped"]}, "viewer")]
    for sub, c, role in cases:
        _, who = sign_in(idp, sub, dict(c, **v))
        assert who.role == role, (sub, who)
        assert auth.get(who.name)["role"] == role
    oidc.configure(idp.issuer, CID, "mock-secret", domains=["example.com"])
    _, who = sign_in(idp, "s-plain", {"email": "p@example.com", "email_verified": True,
                                      "groups": ["admins"]})
    assert who.role == "operator"          # no role claim configured: the default, operator
    sources = {e["name"]: e["source"] for e in acts("sso.provision")}
    assert sources["boss@example.com"] == "admins" and sources["g@example.com"] == "role_claim"


def test_an_identity_never_takes_over_an_account_with_its_email(idp):
    """Another subject (at the same provider) claiming alice's verified e-mail gets nothing:
    the account belongs to the (issuer, sub) that made it."""
    _, alice = sign_in(idp, "sub-alice", {"email": "alice@example.com", "email_verified": True},
                       domains=["example.com"])
    with pytest.raises(SSOError, match="exists already") as info:
        sign_in(idp, "sub-mallory", {"email": "ALICE@example.com", "email_verified": True})
    assert info.value.http_status == 403
    assert auth.get("alice@example.com")["sso"]["sub"] == "sub-alice"
    assert [r["name"] for r in auth.listing()] == ["alice@example.com"]
    assert acts("sso.refused")[-1]["reason"] == "account exists with another identity"


def test_another_issuer_with_the_same_sub_is_another_identity(idp, keys):
    _, who = sign_in(idp, "sub-1", {"email": "a@example.com", "email_verified": True},
                     domains=["example.com"])
    other = oidc.Identity("https://other.example", "sub-1", email="a@example.com",
                          email_verified=True)
    with pytest.raises(SSOError, match="not configured for this issuer"):
        oidc.provision(other)


def test_the_mock_flow_refuses_a_wrong_binding_and_a_replay(idp):
    oidc.configure(idp.issuer, CID, "mock-secret", domains=["example.com"])
    idp.set_user("sub-c", {"email": "c@example.com", "email_verified": True})
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    _, other_binding = flows.start(CALLBACK, "/")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(
        authorize_without_browser(url, "sub-c")).query)
    with pytest.raises(SSOError, match="another browser"):
        flows.finish(query, other_binding, CALLBACK)
    with pytest.raises(SSOError, match="unknown"):
        flows.finish(query, binding, CALLBACK)
    assert auth.listing() == []


def test_the_mock_consent_denied(idp):
    oidc.configure(idp.issuer, CID, "mock-secret", domains=["example.com"])
    flows = oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    location = authorize_without_browser(url, "sub-x", deny=True)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
    assert query["error"] == ["access_denied"]
    with pytest.raises(SSOError, match="access_denied"):
        flows.finish(query, binding, CALLBACK)


def test_sso_test_against_the_real_provider(idp):
    oidc.configure(idp.issuer, CID, "mock-secret", domains=["example.com"])
    found = oidc.test()
    assert found["issuer"] == idp.issuer and found["jwks_keys"] == 1
    assert found["usable_keys"] == 1 and found["supported"] == ["RS256"]
    assert found["token_endpoint"] == idp.issuer + "/oauth2/token"


def test_sso_off_or_another_issuer_ends_the_sign_ins_it_made(home):
    first, second = "http://127.0.0.1:9", "http://127.0.0.1:8"
    auth.add("lena", "admin", password="a local password 1")   # (one hash: a local login stays)
    local = auth.login_create("lena")
    oidc.configure(first, "cid", "secret", domains=["example.com"])
    eve = auth.login_create(oidc.provision(
        oidc.Identity(first, "sub-eve", email="eve@example.com", email_verified=True)).name)
    oidc.configure(first, "cid", None, domains=["example.com", "example.org"])   # same issuer
    assert auth.login_lookup(eve).name == "eve@example.com"
    oidc.configure(second, "cid2", "secret2", domains=["example.com"])          # another one
    assert auth.login_lookup(eve) is None
    ivy = auth.login_create(oidc.provision(
        oidc.Identity(second, "sub-ivy", email="ivy@example.com", email_verified=True)).name)
    assert auth.login_lookup(ivy).name == "ivy@example.com"
    assert oidc.off() is True
    assert auth.login_lookup(ivy) is None
    assert auth.login_lookup(local).name == "lena"               # a password's login is not SSO's
    changes = audit.entries(action="sso.config")
    assert [(e["change"], e.get("logins_ended")) for e in changes] == \
        [("set", None), ("set", None), ("set", 1), ("off", 1)]
