"""Red team, issue 15, the library: overlord/trust/auth.py and overlord/trust/oidc.py attacked
from outside -- every record read back asked who else could have written it, every name who
chose it.

A hole is a strict xfail naming it (it fails today for that reason and passes once fixed); an
attack that is refused is a plain test guarding the refusal. scrypt costs ~0.35 s a hash: each
test makes only the hashes its attack needs, and hand-made hashes use cheap parameters on
purpose (they are what a tampered file would hold)."""
import base64
import hashlib
import json
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))

from agentlib import call, write_script  # noqa: E402
from conftest import require_backend  # noqa: E402

from overlord import ops  # noqa: E402
from overlord.agent import keys  # noqa: E402
from overlord.errors import Conflict, OverlordError, UsageError  # noqa: E402
from overlord.trust import auth, oidc  # noqa: E402

PW = "correct horse battery"
NEW = "another horse, stapled"
ISSUER = "http://127.0.0.1:9"          # never contacted: provision() needs no network
PROPOSE = [{"tool_calls": [call("remember", scope="user", note="Prefers tabs")]}, {"text": "done"}]


@pytest.fixture(autouse=True)
def fresh_lockout():
    auth.lockout.clear()
    yield
    auth.lockout.clear()


@pytest.fixture
def kernel(monkeypatch, home):
    require_backend("kernel")
    monkeypatch.setenv("OVERLORD_TEST_BACKEND", "kernel")
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "AZURE_OPENAI_API_KEY",
                 "OPENAI_COMPAT_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return home


def scripted(tmp_path, target, turns, **kw):
    return ops.agent("do the task", str(target), provider="scripted",
                     script=str(write_script(tmp_path, turns)), **kw)


def guess(name, password, address, out):
    try:
        out.append(auth.check_password(name, password, address))
    except auth.AuthError as exc:
        out.append(exc)


# -- lockout -------------------------------------------------------------------------------------

def test_a_guess_in_flight_when_the_name_locks_is_not_granted(home, monkeypatch):
    auth.add("bob", "operator", password=PW)
    passed, go = threading.Event(), threading.Event()

    class Burst(auth.Lockout):
        """The module's lockout, holding the right guess just after its check passed."""

        def locked(self, name, address=None):
            held = super().locked(name, address)
            if address == "10.9.9.1" and not passed.is_set():
                passed.set()
                assert go.wait(30)
            return held

    monkeypatch.setattr(auth, "lockout", Burst(limit=2))      # two failures lock (fewer hashes)
    right = []
    t = threading.Thread(target=guess, args=("bob", PW, "10.9.9.1", right))
    t.start()
    assert passed.wait(30)
    # the rest of the burst: wrong guesses from other addresses, hashed meanwhile
    wrong = []
    threads = [threading.Thread(target=guess, args=("bob", f"wrong guess {i}", f"10.9.8.{i}",
                                                    wrong)) for i in range(2)]
    for w in threads:
        w.start()
    for w in threads:
        w.join(30)
    assert len(wrong) == 2 and all(isinstance(e, auth.AuthError) for e in wrong)
    assert auth.lockout.locked("bob") is not None            # the name is locked now
    go.set()
    t.join(30)
    assert isinstance(right[0], auth.AuthError) and right[0].http_status == 429, right


def test_name_variants_count_against_one_name_and_no_address_unlocks_it(home, monkeypatch):
    monkeypatch.setattr(auth, "lockout", auth.Lockout(limit=2))   # the rule, in two hashes
    auth.add("bob", "operator", password=PW)
    out = []
    threads = [threading.Thread(target=guess, args=(variant, "wrong guess", f"10.7.0.{i}", out))
               for i, variant in enumerate(["Bob", " BOB\t"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(e, auth.AuthError) and e.http_status == 401 for e in out)
    for name, address in (("bob", "10.7.1.1"), ("bOb", None), ("\tbob\n", "::1")):
        with pytest.raises(auth.AuthError) as info:          # the right password, refused
            auth.check_password(name, PW, address)
        assert info.value.http_status == 429 and info.value.retry_after >= 1


# -- logins made from a check, after the account changed ------------------------------------------

def test_a_login_from_a_check_made_before_a_password_change_is_over(home):
    auth.add("bob", "operator", password=PW)
    thief = auth.check_password("bob", PW, "10.0.0.66")      # the old password, checked ...
    auth.passwd("bob", NEW)                                  # ... as bob changes it
    with pytest.raises(auth.AuthError, match="changed while signing in"):
        auth.login_create(thief.name)                        # refused: the check is stale
    assert list((home / "logins").glob("*.json")) == []


def test_a_login_from_a_check_of_a_removed_account_is_not_the_new_accounts(home):
    auth.add("bob", "operator", password=PW)
    old = auth.check_password("bob", PW, "10.0.0.66")
    auth.remove("bob")
    auth.add("bob", "admin", password=NEW)                   # another person, named bob
    with pytest.raises(auth.AuthError, match="changed while signing in"):
        auth.login_create(old.name)
    with pytest.raises(auth.AuthError, match="changed while signing in"):
        auth.login_create(old)                               # the principal whole: the same


# -- a name removed and given again ---------------------------------------------------------------

def test_a_removed_name_given_again_keeps_no_token_login_key_or_note(home):
    auth.add("bob", "operator", password=PW)
    _, token = auth.mint_token("bob", label="ci")
    cookie = auth.login_create("bob")
    ops.keys_set("anthropic", "sk-old-bob", owner="bob")
    ops.memory_user_add("old bob's note", owner="bob")
    auth.remove("bob")
    auth.add("bob", "operator", password=NEW)
    assert auth.bearer(token) is None and auth.login_lookup(cookie) is None
    assert keys.get("anthropic", owner="bob") is None
    assert "old bob" not in ops.memory_user(owner="bob")["text"]
    assert auth.tokens("bob") == []


def test_a_new_account_under_a_removed_name_does_not_own_the_old_sessions(kernel, tmp_path,
                                                                          target):
    auth.add("bob", "operator", password=PW)
    sid = scripted(tmp_path, target, PROPOSE, owner="bob").sid
    auth.remove("bob")
    try:
        auth.add("bob", "operator", password=NEW)
    except (Conflict, UsageError):
        return                    # refusing the name while it owns sessions is a fix too
    new_bob = auth.login_lookup(auth.login_create("bob"))
    meta = ops.get_session(sid).meta
    assert not auth.can_see(new_bob, meta) and not auth.can_change(new_bob, meta)


def test_notes_accepted_after_removal_do_not_reach_the_next_account_of_the_name(kernel,
                                                                                tmp_path, target):
    auth.add("bob", "operator", password=PW)
    sid = scripted(tmp_path, target, PROPOSE, owner="bob").sid
    auth.remove("bob")
    try:
        ops.memory_accept(sid, all=True, by="workspace")   # an admin clears the old queue
    except OverlordError:
        pass                      # refusing to write for an account that is gone: a fix
    try:
        auth.add("bob", "operator", password=NEW)
    except (Conflict, UsageError):
        return
    assert "Prefers tabs" not in ops.memory_user(owner="bob")["text"]
    assert "Prefers tabs" not in ops.memory_show(str(target), owner="bob")["text"]


def test_a_symlinked_account_dir_is_not_read_through(home):
    ops.keys_set("anthropic", "sk-alice-own", owner="alice")
    ops.memory_user_add("alice's private note", owner="alice")
    os.symlink("alice", home / "users" / "bob")
    for read in (lambda: keys.get("anthropic", owner="bob"),
                 lambda: ops.memory_user(owner="bob")["text"]):
        try:
            got = read()
        except OverlordError:
            continue
        assert got is None or ("sk-alice" not in got and "alice's" not in got), got


# -- the accounts file and the login files, written by someone else ------------------------------

def _cheap_record(name, password, n=2, r=8, p=1, **over):
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32,
                            maxmem=1 << 28)
    pw = {"alg": "scrypt", "n": n, "r": r, "p": p, "dklen": 32,
          "salt": base64.b64encode(salt).decode(), "hash": base64.b64encode(digest).decode()}
    pw.update(over)
    return {"name": name, "role": "admin", "created": 1.0, "id": "0123456789abcdef", "gen": 1,
            "password": pw, "sso": None}


@pytest.mark.parametrize("params", [{"n": 2}, {"n": 1 << 16}, {"n": 1 << 17, "r": 4},
                                    {"n": 16, "alg": "plain"}, {"n": 16, "hash": ""},
                                    {"n": 16, "salt": "AAAA"}, {"n": 16, "dklen": 4}])
def test_a_downgraded_hash_in_a_tampered_file_is_refused_and_fails_closed(home, params):
    over = {k: v for k, v in params.items() if k not in ("n", "r")}
    rec = _cheap_record("mallory", PW, n=params["n"], r=params.get("r", 8), **over)
    p = home / "users.json"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"version": 1, "users": {"mallory": rec}, "tokens": {}}, f)
    with pytest.raises(OverlordError) as info:
        auth.check_password("mallory", PW, "10.0.0.5")
    assert not isinstance(info.value, auth.AuthError) or info.value.http_status in (401, 429)
    assert auth.enabled() is True              # a damaged file: nobody signs in, no launch token
    try:
        assert auth.bearer("ovl_0123456789ab_" + "A" * 43) is None
    except OverlordError:
        pass                                   # refused with the file: as good


def test_a_login_file_planted_as_a_symlink_or_readable_is_refused_and_removed(home):
    auth.add("bob", "admin", password=PW)
    cookie = auth.login_create("bob")
    real = home / "logins" / (hashlib.sha256(cookie.encode()).hexdigest() + ".json")
    other = "B" * 43
    planted = home / "logins" / (hashlib.sha256(other.encode()).hexdigest() + ".json")
    os.symlink(real, planted)                              # named by a hash, pointing elsewhere
    assert auth.login_lookup(other) is None and not os.path.lexists(planted)
    assert auth.login_lookup(cookie).name == "bob"
    os.chmod(real, 0o644)
    assert auth.login_lookup(cookie) is None and not real.exists()


def test_malformed_tokens_and_cookies_name_no_one(home):
    auth.add("bob", "admin", password=PW)
    tid, token = auth.mint_token("bob")
    cookie = auth.login_create("bob")
    for bad in (f"ovl_{tid}_", f"ovl_{tid}_x", token[:-1], token + "\n", token + " ", " " + token,
                token.upper(), token.replace("ovl_", "OVL_"), f"ovl_{tid}_" + "é" * 43,
                f"ovl_{tid}_" + "A" * 43, token + "A" * (1 << 20), token.replace("_", "-", 1),
                f"ovl_{tid.upper()}_{token[-43:]}", token + "\x00", None, 7, b"ovl_", [token]):
        assert auth.bearer(bad) is None, bad
    assert auth.bearer(token).name == "bob"
    for bad in (cookie + "\n", cookie[:-1], cookie + "A", " " + cookie, cookie.encode(),
                "A" * (1 << 20), "../" * 14 + "x", "", None):
        assert auth.login_lookup(bad) is None, bad
    assert auth.login_lookup(cookie).name == "bob"


def test_the_same_words_for_an_unknown_name_and_a_wrong_password(home):
    auth.add("bob", "admin", password=PW)
    said = set()
    for name in ("bob", "nobody"):
        with pytest.raises(auth.AuthError) as info:
            auth.check_password(name, "wrong guess", "10.1.1.1")
        said.add((str(info.value), info.value.http_status))
    assert len(said) == 1


# -- single sign-on: who provisions what ---------------------------------------------------------

def _identity(email, sub="sub-1", verified=True):
    return oidc.Identity(ISSUER, sub, email=email, email_verified=verified)


def test_a_kelvin_sign_mailbox_is_not_provisioned_as_kate(home):
    oidc.configure(ISSUER, "cid", "secret", domains=["example.com"], admins=["kate@example.com"])
    with pytest.raises(oidc.SSOError):
        oidc.provision(_identity("\u212aate@example.com", sub="sub-mallory"))
    assert auth.get("kate@example.com") is None


@pytest.mark.parametrize("email", ["alice@ex\u0430mple.com", "alice@sub.example.com",
                                   "alice@example.com.evil.example", "alice@example.com@evil.example",
                                   "alice@evil.example?@example.com", "alice@example.co",
                                   "\u0430lice@example.com", "alice@EXAMPLE.com\u200b",
                                   "alice@example.com/../x", "alice", "", None])
def test_a_lookalike_or_foreign_email_is_refused(home, email):
    oidc.configure(ISSUER, "cid", "secret", domains=["example.com"])
    with pytest.raises(oidc.SSOError):
        oidc.provision(_identity(email))
    assert auth.listing() == []


def test_case_variants_of_an_email_are_one_account_and_never_taken_over(home):
    oidc.configure(ISSUER, "cid", "secret", domains=["example.com"])
    who = oidc.provision(_identity(" Alice@EXAMPLE.com ", sub="sub-alice"))
    assert who.name == "alice@example.com"
    for email in ("alice@example.com", "ALICE@example.com"):
        with pytest.raises(oidc.SSOError, match="exists"):
            oidc.provision(_identity(email, sub="sub-mallory"))
    with pytest.raises(oidc.SSOError):
        oidc.provision(_identity("bob@example.com", sub="sub-bob", verified=False))
    with pytest.raises(oidc.SSOError):          # another issuer's same subject is no one here
        oidc.provision(oidc.Identity("http://127.0.0.1:8", "sub-alice",
                                     email="alice@example.com", email_verified=True))
    assert [r["name"] for r in auth.listing()] == ["alice@example.com"]
    with pytest.raises(auth.AuthError, match="single sign-on"):
        auth.check_password("alice@example.com", "", "10.0.0.1")


def test_turning_single_sign_on_off_ends_its_logins(home):
    oidc.configure(ISSUER, "cid", "secret", domains=["example.com"])
    who = oidc.provision(_identity("eve@example.com", sub="sub-eve"))
    cookie = auth.login_create(who.name)
    assert auth.login_lookup(cookie).name == "eve@example.com"
    oidc.off()
    assert auth.login_lookup(cookie) is None


def test_flows_keep_no_next_with_control_characters(home):
    import http.server
    doc = {}

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            data = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = "http://127.0.0.1:%d" % srv.server_port
        doc.update(issuer=base, authorization_endpoint=base + "/a", token_endpoint=base + "/t",
                   userinfo_endpoint=base + "/u", jwks_uri=base + "/j")
        oidc.configure(base, "cid", "secret", domains=["example.com"])
        flows = oidc.Flows()
        for nxt in ("/\t/evil.example", "/\n/evil.example", "/x\r\nSet-Cookie: a=b", "/\x00x"):
            url, _ = flows.start(base + "/sso/callback", nxt)
            import urllib.parse
            state = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))["state"]
            assert flows._flows[state]["next"] == "/", nxt
    finally:
        srv.shutdown()
        srv.server_close()


# -- the signature arithmetic, with forgeries of our own -----------------------------------------

def test_es256_degenerate_signatures_and_points_are_refused():
    gx, gy = oidc.P256_G
    n = oidc.P256_N
    msg = b"header.payload"
    for sig in (bytes(64), (0).to_bytes(32, "big") + (1).to_bytes(32, "big"),
                (1).to_bytes(32, "big") + bytes(32), n.to_bytes(32, "big") * 2,
                (n + 1).to_bytes(32, "big") + (1).to_bytes(32, "big"), b"\xff" * 64, b"", b"\x00" * 65):
        assert oidc.es256_verify(gx, gy, msg, sig) is False
    # a "signature" made for a point off the curve (an invalid-curve attack) is refused outright
    assert not oidc.p256_on_curve((gx, gy + 1))
    assert oidc.es256_verify(gx, gy + 1, msg, (1).to_bytes(32, "big") * 2) is False
    assert oidc.es256_verify(0, 0, msg, (1).to_bytes(32, "big") * 2) is False


def test_rsa_e1_and_small_or_even_keys_cannot_be_forged_with():
    msg = b"header.payload"
    t = bytes.fromhex("3031300d060960864801650304020105000420") + hashlib.sha256(msg).digest()
    k = 256
    em = b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t
    n = (1 << 2047) * 2 - 1 - 2 * (1 << 100)          # odd, 2048 bits, larger than em
    assert n.bit_length() == 2048 and int.from_bytes(em, "big") < n
    assert oidc.rsa_verify(n, 1, msg, em) is False     # e = 1: the message is its own signature
    assert oidc.rsa_verify(n, 2, msg, em) is False
    small = (1 << 1023) + 1
    assert oidc.rsa_verify(small, 1, msg, em[-128:]) is False
    assert oidc.rsa_verify(n, 65537, msg, em[1:]) is False      # a short signature
    assert oidc.rsa_verify(n, 65537, msg, n.to_bytes(k, "big")) is False   # s >= n
