"""What accounts cost: a sign-in, naming the principal of every request, verifying an ID token.

    python3 bench/bench_auth.py [--runs 200] [--json]

1. A sign-in (auth.check_password): one scrypt at N=2^17, r=8, p=1 -- for a known name, a wrong
   password and an unknown name (which must cost the same: no user enumeration by time).
2. The principal of one request: auth.login_lookup (a login cookie) and auth.bearer (an ovl_
   token), in-process, with 1 and with 1000 logins on disk (each request costs its own file,
   not the number of logins).
3. An ID token's signature: oidc.verify_id_token for RS256 (2048-bit) and ES256 (P-256) tokens
   signed by openssl, claims and all.
4. GET /api/whoami over HTTP, keep-alive, against a real `overlord ui`: with the launch token
   (no accounts) and with a login cookie (accounts on).

Figures go in docs/PERFORMANCE.md with the machine they ran on.
"""
import argparse
import base64
import hashlib
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)


def percentile(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(samples, unit=1000):
    xs = [x * unit for x in samples]
    return {"p50": round(percentile(xs, 50), 3), "p99": round(percentile(xs, 99), 3),
            "mean": round(statistics.fmean(xs), 3), "n": len(xs)}


def timed(fn, runs):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def openssl(*args, data=None):
    return subprocess.run(["openssl", *args], input=data, capture_output=True, check=True).stdout


def signed_tokens(tmp):
    """(RS256 token, ES256 token, their JWKS) over the same claims, signed by openssl."""
    from overlord.trust import oidc
    rsa, ec = os.path.join(tmp, "rsa.pem"), os.path.join(tmp, "ec.pem")
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", rsa)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", ec)
    n = int(openssl("rsa", "-in", rsa, "-noout", "-modulus").decode().split("=")[1], 16)
    text = openssl("ec", "-in", ec, "-noout", "-text").decode()
    hexpub = "".join(text.split("pub:")[1].split("ASN1")[0].split()).replace(":", "")
    pub = bytes.fromhex(hexpub)
    jwks = {"keys": [
        {"kty": "RSA", "kid": "r1", "alg": "RS256", "use": "sig", "e": b64(b"\x01\x00\x01"),
         "n": b64(n.to_bytes(256, "big"))},
        {"kty": "EC", "kid": "e1", "alg": "ES256", "use": "sig", "crv": "P-256",
         "x": b64(pub[1:33]), "y": b64(pub[33:65])}]}
    now = int(time.time())
    claims = {"iss": "https://login.example.com", "aud": "overlord", "sub": "u1",
              "exp": now + 3600, "iat": now, "nonce": "n0nce", "email": "a@example.com"}

    def token(alg, kid, key):
        signing = (b64(json.dumps({"alg": alg, "kid": kid, "typ": "JWT"}).encode()) + "." +
                   b64(json.dumps(claims).encode()))
        sig = openssl("dgst", "-sha256", "-sign", key, data=signing.encode())
        if alg == "ES256":
            sig = der_to_raw(sig)
        return signing + "." + b64(sig)
    assert oidc  # imported for the caller
    return token("RS256", "r1", rsa), token("ES256", "e1", ec), jwks


def der_to_raw(der):
    """An ECDSA signature as DER SEQUENCE{r, s} -> the JWS form r || s (32 bytes each)."""
    i = 2
    out = b""
    for _ in range(2):
        assert der[i] == 2
        ln = der[i + 1]
        out += der[i + 2:i + 2 + ln].lstrip(b"\0").rjust(32, b"\0")
        i += 2 + ln
    return out


def in_process(runs):
    from overlord.trust import audit, auth, oidc
    res = {}
    audit.ready()
    auth.add("alice", "admin", password="correct horse battery")
    res["sign_in_right_ms"] = summary(timed(
        lambda: auth.check_password("alice", "correct horse battery", "10.0.0.1"), 8))
    wrong, unknown = [], []
    for i in range(4):           # fewer than the lockout's five, each from its own address
        t = time.perf_counter()
        try:
            auth.check_password("alice", "not it at all", f"10.0.1.{i}")
        except auth.AuthError:
            pass
        wrong.append(time.perf_counter() - t)
        t = time.perf_counter()
        try:
            auth.check_password("nobody", "not it at all", f"10.0.2.{i}")
        except auth.AuthError:
            pass
        unknown.append(time.perf_counter() - t)
    res["sign_in_wrong_ms"], res["sign_in_unknown_ms"] = summary(wrong), summary(unknown)
    cookie = auth.login_create(auth.check_password("alice", "correct horse battery", "10.0.0.2").name)
    res["login_lookup_1_us"] = summary(timed(lambda: auth.login_lookup(cookie), runs), 1e6)
    _, token = auth.mint_token("alice", label="bench")
    res["bearer_us"] = summary(timed(lambda: auth.bearer(token), runs), 1e6)
    for _ in range(999):
        auth.login_create("alice")
    res["login_lookup_1000_us"] = summary(timed(lambda: auth.login_lookup(cookie), runs), 1e6)
    with tempfile.TemporaryDirectory() as tmp:
        rs, es, jwks = signed_tokens(tmp)
        for name, tok in (("rs256", rs), ("es256", es)):
            oidc.verify_id_token(tok, jwks, "https://login.example.com", "overlord", "n0nce")
            res[f"verify_{name}_ms"] = summary(timed(lambda: oidc.verify_id_token(
                tok, jwks, "https://login.example.com", "overlord", "n0nce"), 50))
    return res, cookie


def over_http(home, runs, cookie_value):
    """GET /api/whoami, keep-alive, with the launch token (accounts moved aside) and with the
    login cookie."""
    import re
    env = dict(os.environ, OVERLORD_HOME=home, PYTHONPATH=REPO)
    res = {}
    users = os.path.join(home, "users.json")
    for mode in ("launch", "cookie"):
        if mode == "launch":
            os.rename(users, users + ".aside")
        elif os.path.exists(users + ".aside"):
            os.rename(users + ".aside", users)
        proc = subprocess.Popen([sys.executable, "-m", "overlord", "ui", "--port", "0",
                                 "--folder", home, "--rate-limit", "0"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            line = proc.stdout.readline().decode()
            port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
            with open(os.path.join(home, "ui.token")) as f:
                token = f.read().strip()
            if mode == "launch":
                headers = {"Authorization": f"Bearer {token}"}
            else:
                headers = {"Cookie": f"overlord_login={cookie_value}"}
            headers["Host"] = f"127.0.0.1:{port}"
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

            def one():
                conn.request("GET", "/api/whoami", headers=headers)
                r = conn.getresponse()
                r.read()
                assert r.status == 200, r.status
            one()
            res[f"whoami_{mode}_ms"] = summary(timed(one, runs))
            conn.close()
        finally:
            proc.terminate()
            proc.wait(10)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["OVERLORD_HOME"] = home
        res, cookie = in_process(args.runs)
        res.update(over_http(home, args.runs, cookie))
    res["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "scrypt": hashlib.scrypt is not None}
    if args.json:
        print(json.dumps(res, indent=1))
        return
    for k, v in res.items():
        print(f"{k:24} {v}")


if __name__ == "__main__":
    main()
