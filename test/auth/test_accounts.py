"""overlord/trust/auth.py at library level: accounts, tokens, durable logins, lockout, roles.

Hostile input first. Every scrypt hash costs ~0.35 s here, so each test makes only the hashes
it needs (an add, a check); the lockout's clock and pruning are tested on a Lockout with a
clock of the test's own, the module's lockout with real sign-ins."""
import json
import os
import stat
import time

import pytest

from overlord.errors import Conflict, NotFound, OverlordError, UsageError
from overlord.trust import audit, auth

PW = "correct horse battery"


@pytest.fixture(autouse=True)
def fresh_lockout():
    auth.lockout.clear()
    yield
    auth.lockout.clear()


def users_file(home):
    return home / "users.json"


def acts(action=None):
    return [e for e in audit.entries() if action is None or e["action"] == action]


def login_file(home, principal):
    return home / "logins" / f"{principal.login}.json"


# -- hostile input: names, roles, passwords -----------------------------------------------------

@pytest.mark.parametrize("name", ["", "Alice", "1abc", "a/b", "..", ".", "a" * 33, "-x",
                                  "al ice", "alice\n", "al\x00ice", "a@b.example", None, 7,
                                  ["alice"], "élise"])
def test_a_bad_local_name_is_refused_and_nothing_is_written(home, name):
    with pytest.raises(UsageError):
        auth.add(name, "operator", password=PW)
    assert not users_file(home).exists() and not (home / "users").exists()
    assert auth.enabled() is False


@pytest.mark.parametrize("role", ["root", "", None, "Admin", "admin ", 1])
def test_a_bad_role_is_refused(home, role):
    with pytest.raises(UsageError, match="role"):
        auth.add("alice", role, password=PW)
    assert not users_file(home).exists()


@pytest.mark.parametrize("password", [None, "", "short", "x" * 1025, "line\nbreak!", "tab\there!",
                                      b"bytes-password", "lone \udc80 surrogate"])
def test_a_password_that_may_not_be_set_is_refused_before_any_hash(home, password):
    with pytest.raises(UsageError):
        auth.add("alice", "admin", password=password)
    assert not users_file(home).exists()


def test_sso_and_local_shapes_do_not_mix(home):
    link = {"issuer": "https://idp.example", "sub": "s1", "email": "ann@corp.example"}
    with pytest.raises(UsageError):                 # a local name cannot be an SSO account
        auth.add("ann", "operator", sso=link)
    with pytest.raises(UsageError):                 # an SSO account has no password
        auth.add("ann@corp.example", "operator", password=PW, sso=link)
    for bad in ("Ann@corp.example", "a/b@corp.example", "@corp.example", "ann@", ".x@corp.example/"):
        with pytest.raises(UsageError):
            auth.add(bad, "operator", sso=link)
    with pytest.raises(UsageError):
        auth.add("ann@corp.example", "operator", sso={"issuer": "x"})     # no sub, no email
    assert not users_file(home).exists()


# -- hostile input: the accounts file -----------------------------------------------------------

DAMAGED = [b"not json", b"[]", b'{"version": 2, "users": {}, "tokens": {}}',
           b'{"version": 1, "users": [], "tokens": {}}',
           b'{"version": 1, "users": {"a": {"name": "b", "role": "admin"}}, "tokens": {}}',
           b'{"version": 1, "users": {"alice": {"name": "alice", "role": "god", "id": "x", '
           b'"gen": 1, "created": 1, "password": null, "sso": null}}, "tokens": {}}',
           b'{"version": 1, "users": {"alice": {"name": "alice", "role": "admin", "id": "x", '
           b'"gen": 1, "created": 1, "password": {"alg": "scrypt", "n": 1024, "r": 8, "p": 1, '
           b'"dklen": 32, "salt": "AAAAAAAAAAAAAAAAAAAAAA==", "hash": "AAAA"}, "sso": null}}, '
           b'"tokens": {}}']


@pytest.mark.parametrize("raw", DAMAGED)
def test_a_damaged_accounts_file_fails_closed(home, raw):
    p = users_file(home)
    p.write_bytes(raw)
    os.chmod(p, 0o600)
    assert auth.enabled() is True                # on: the launch token no longer suffices
    for call in (auth.listing, lambda: auth.check_password("alice", PW, "10.0.0.1"),
                 lambda: auth.bearer("ovl_" + "a" * 12 + "_" + "b" * 43),
                 lambda: auth.mint_token("alice"), lambda: auth.remove("alice")):
        with pytest.raises(OverlordError, match="refusing the accounts file .*damaged"):
            call()
    assert p.read_bytes() == raw                 # never rewritten


def test_a_weak_stored_hash_is_refused_not_verified(home):
    """A record whose scrypt parameters are below the minimum is damage, not a password."""
    p = users_file(home)
    p.write_bytes(DAMAGED[-1])
    os.chmod(p, 0o600)
    with pytest.raises(OverlordError, match="without a valid password hash"):
        auth.check_password("alice", "anything", None)


def test_a_group_or_other_readable_accounts_file_is_refused(home):
    auth.add("alice", "admin", password=PW)
    before = users_file(home).read_bytes()
    os.chmod(users_file(home), 0o644)
    assert auth.enabled() is True
    with pytest.raises(OverlordError, match=r"mode 0644.*chmod 600"):
        auth.listing()
    with pytest.raises(OverlordError, match="mode 0644"):
        auth.check_password("alice", PW, None)
    with pytest.raises(OverlordError, match="mode 0644"):
        auth.add("bob", "viewer", password=PW)
    assert users_file(home).read_bytes() == before
    os.chmod(users_file(home), 0o600)
    assert [r["name"] for r in auth.listing()] == ["alice"]       # fixed: read again at once


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_an_accounts_file_of_another_user_is_refused(home):
    auth.add("alice", "admin", password=PW)
    cookie = auth.login_create("alice")
    _, token = auth.mint_token("alice")
    os.chown(users_file(home), 65534, 65534)
    assert auth.enabled() is True
    for call in (auth.listing, lambda: auth.login_lookup(cookie), lambda: auth.bearer(token),
                 lambda: auth.check_password("alice", PW, None)):
        with pytest.raises(OverlordError, match="owned by uid 65534"):
            call()


def test_a_symlinked_accounts_file_is_refused(home, tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"version": 1, "users": {}, "tokens": {}}))
    os.chmod(real, 0o600)
    os.symlink(real, users_file(home))
    with pytest.raises(OverlordError, match="symlink"):
        auth.listing()
    assert auth.enabled() is True


# -- accounts ----------------------------------------------------------------------------------

def test_add_stores_a_salted_scrypt_hash_with_its_parameters(home):
    auth.add("alice", "admin", password=PW, by="cli:test")
    auth.add("bob", "operator", password=PW)
    assert stat.S_IMODE(os.stat(users_file(home)).st_mode) == 0o600
    data = json.loads(users_file(home).read_text())
    a, b = data["users"]["alice"]["password"], data["users"]["bob"]["password"]
    assert (a["alg"], a["n"], a["r"], a["p"]) == ("scrypt", 1 << 17, 8, 1)
    assert a["salt"] != b["salt"] and a["hash"] != b["hash"]      # same password, own salt
    assert PW not in users_file(home).read_text()
    for name in ("alice", "bob"):
        d = home / "users" / name
        assert d.is_dir() and stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert auth.listing() == [
        {"name": "alice", "role": "admin", "sso": False, "created": auth.get("alice")["created"],
         "tokens": 0},
        {"name": "bob", "role": "operator", "sso": False, "created": auth.get("bob")["created"],
         "tokens": 0}]
    assert "password" not in auth.public("alice") and auth.public("nobody") is None
    with pytest.raises(Conflict, match="exists"):
        auth.add("alice", "viewer", password=PW)
    add = acts("user.add")
    assert [(e["name"], e["role"], e.get("by")) for e in add] == \
        [("alice", "admin", "cli:test"), ("bob", "operator", None)]


def test_the_actor_is_the_callers_account_never_invented(home):
    with audit.acting_as("account:root-admin"):
        auth.add("carol", "viewer", password=PW, by="root-admin")
    line = acts("user.add")[-1]
    assert line["actor"] == "account:root-admin" and line["by"] == "root-admin"


def test_remove_sets_the_folder_aside_and_a_new_account_of_the_name_is_another(home):
    auth.add("dave", "operator", password=PW)
    (home / "users" / "dave" / "memory.md").write_text("dave's notes\n")
    tid, token = auth.mint_token("dave", label="ci")
    cookie = auth.login_create("dave")
    done = auth.remove("dave", by="cli:test")
    assert done["tokens"] == 1 and done["logins"] == 1
    assert not (home / "users" / "dave").exists()
    assert (home / "users" / os.path.basename(done["kept"]) / "memory.md").read_text() == \
        "dave's notes\n"
    assert auth.bearer(token) is None and auth.login_lookup(cookie) is None
    assert auth.enabled() is False                  # the last account gone: sign-in is off
    with pytest.raises(NotFound):
        auth.remove("dave")
    with pytest.raises(NotFound):
        auth.tokens("dave")
    # the same name again is a new account: no token of the old one comes back to life
    auth.add("dave", "admin", password=PW)
    assert auth.bearer(token) is None and auth.tokens("dave") == []
    assert not (home / "users" / "dave" / "memory.md").exists()


def test_sso_accounts(home):
    link = {"issuer": "https://idp.example", "sub": "s-1", "email": "Ann@Corp.example"}
    auth.add("ann@corp.example", "operator", sso=link, by="sso")
    assert auth.find_sso("https://idp.example", "s-1") == "ann@corp.example"
    assert auth.find_sso("https://idp.example", "s-2") is None
    assert auth.listing()[0]["sso"] is True
    assert auth.public("ann@corp.example")["email"] == "Ann@Corp.example"
    with pytest.raises(Conflict, match="already has the account"):
        auth.add("other@corp.example", "operator", sso=dict(link, email="other@corp.example"))
    with pytest.raises(UsageError, match="single sign-on"):
        auth.passwd("ann@corp.example", PW)
    # the password form refuses it without a lookup (and without a hash: it is immediate)
    started = time.monotonic()
    with pytest.raises(auth.AuthError, match="single sign-on") as err:
        auth.check_password("ann@corp.example", PW, "10.0.0.9")
    assert err.value.http_status == 401 and time.monotonic() - started < 0.2
    assert acts("auth.login_failed") == []          # not a wrong password: not counted
    cookie = auth.login_create("ann@corp.example")
    assert acts("auth.login")[-1]["via"] == "sso"
    assert auth.login_lookup(cookie).name == "ann@corp.example"


# -- tokens ------------------------------------------------------------------------------------

MALFORMED = [None, "", "ovl_", "ovl__", 42, b"ovl_", "Bearer ovl_x", "ovl_" + "A" * 12 + "_" + "b" * 43,
             "ovl_" + "a" * 11 + "_" + "b" * 43, "ovl_" + "a" * 12 + "_" + "b" * 42,
             "ovl_" + "a" * 12 + "_" + "b" * 44, "ovl_" + "a" * 12 + "_" + "b" * 42 + "!",
             "ovl_" + "a" * 12 + "_" + "b" * 43 + "\n", "ovl_" + "a" * 12 + "_" + "b" * 10 ** 6,
             "xyz_" + "a" * 12 + "_" + "b" * 43]


def test_malformed_unknown_and_forged_tokens_are_refused(home):
    auth.add("erin", "operator", password=PW)
    tid, token = auth.mint_token("erin")
    for bad in MALFORMED:
        assert auth.bearer(bad) is None, bad
    secret = token.split("_", 2)[2]
    forged = f"ovl_{tid}_{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"   # right id, wrong secret
    assert auth.bearer(forged) is None
    assert auth.bearer(f"ovl_{'0' * 12}_{secret}") is None                # unknown id
    p = auth.bearer(token)
    assert (p.name, p.role, p.via, p.token_id, p.login) == ("erin", "operator", "bearer", tid, None)
    assert p.actor == "account:erin"


def test_tokens_are_hashed_listed_without_secrets_and_revoked_one_by_one(home):
    auth.add("fay", "operator", password=PW)
    auth.add("gus", "operator", password=PW)
    t1, tok1 = auth.mint_token("fay", label="laptop", by="cli:test")
    t2, tok2 = auth.mint_token("fay")
    tg, tokg = auth.mint_token("gus")
    assert tok1.startswith(f"ovl_{t1}_") and len(tok1) == 4 + 12 + 1 + 43
    text = users_file(home).read_text()
    assert tok1 not in text and tok1.split("_", 2)[2] not in text
    rows = auth.tokens("fay")
    assert [(r["id"], r["label"]) for r in rows] == [(t1, "laptop"), (t2, None)]
    assert set(rows[0]) == {"id", "label", "created", "used"}
    assert auth.listing()[0]["tokens"] == 2
    assert auth.bearer(tok1).name == "fay"
    assert auth.tokens("fay")[0]["used"] is not None           # first use recorded
    with pytest.raises(NotFound):
        auth.revoke("fay", tg)                                 # gus's token, asked as fay's
    with pytest.raises(NotFound):
        auth.revoke("fay", "nope")
    assert auth.bearer(tokg).name == "gus"
    auth.revoke("fay", t1, by="cli:test")
    assert auth.bearer(tok1) is None and auth.bearer(tok2).name == "fay"
    assert [r["id"] for r in auth.tokens("fay")] == [t2]
    # a token speaks with the account's current role
    auth.set_role("fay", "viewer")
    assert auth.bearer(tok2).role == "viewer"
    log = audit.log_path()
    with open(log) as f:
        chain = f.read()
    for secret in (tok1, tok2, tokg, PW):
        assert secret not in chain
    assert [e["id"] for e in acts("user.token_revoke")] == [t1]
    assert acts("user.token_mint")[0]["label"] == "laptop"


@pytest.mark.parametrize("label", ["x" * 65, "line\nbreak", "\x1b[31mred", 5])
def test_a_bad_label_is_refused(home, label):
    with pytest.raises(UsageError, match="label"):
        auth.mint_token("hal", label=label)
    assert not users_file(home).exists()


# -- passwords, lockout -------------------------------------------------------------------------

def test_unknown_name_and_wrong_password_look_and_cost_the_same(home):
    auth.add("ivy", "admin", password=PW)
    costs = {}
    for name in ("ivy", "nobody-here", "Not/A-Name"):
        spent = []
        for i in range(2):
            started = time.monotonic()
            with pytest.raises(auth.AuthError) as err:
                auth.check_password(name, "wrong password!", f"10.1.{len(costs)}.{i}")
            spent.append(time.monotonic() - started)
            assert str(err.value) == "wrong name or password" and err.value.http_status == 401
        costs[name] = min(spent)
    known = costs["ivy"]
    for name in ("nobody-here", "Not/A-Name"):
        assert 1 / 3 < costs[name] / known < 3, costs            # one scrypt either way
    assert known > 0.05                                          # a real hash was computed
    failed = acts("auth.login_failed")
    assert len(failed) == 6 and failed[0]["address"] == "10.1.0.0"
    p = auth.check_password("  IVY ", PW, "10.1.9.9")            # trimmed, lower-cased
    assert (p.name, p.role, p.via, p.login) == ("ivy", "admin", "cookie", None)


def test_five_failures_lock_the_name_and_separately_the_address(home):
    auth.add("jo", "operator", password=PW)
    for i in range(5):
        with pytest.raises(auth.AuthError) as err:
            auth.check_password("jo", f"wrong-{i}-password", "192.0.2.1")
        assert err.value.http_status == 401
    locks = acts("auth.lockout")
    assert sorted((e["kind"], e["key"]) for e in locks) == [("address", "192.0.2.1"), ("name", "jo")]
    assert all(e["until"] > time.time() + 50 for e in locks)
    # the right password, from elsewhere: the name is locked (429, Retry-After), no hash spent
    for address in ("198.51.100.7", None):
        started = time.monotonic()
        with pytest.raises(auth.AuthError) as err:
            auth.check_password("jo", PW, address)
        assert err.value.http_status == 429 and 0 < err.value.retry_after <= 60
        assert time.monotonic() - started < 0.2
    # another name from the locked address: refused too
    with pytest.raises(auth.AuthError) as err:
        auth.check_password("someone-else", PW, "192.0.2.1")
    assert err.value.http_status == 429
    assert len(acts("auth.login_failed")) == 5              # a refusal while locked is no failure
    auth.lockout.clear()
    assert auth.check_password("jo", PW, "192.0.2.1").name == "jo"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_lock_lasts_a_minute_and_the_window_five(home):
    clock = Clock()
    lk = auth.Lockout(clock=clock)
    for _ in range(4):
        assert lk.failed("kim", "10.0.0.1") == []
    clock.now += 301                                     # the four fall out of the window
    assert lk.failed("kim", "10.0.0.1") == [] and lk.locked("kim", "10.0.0.1") is None
    for _ in range(3):
        lk.failed("kim", "10.0.0.1")
    assert lk.failed("kim", "10.0.0.1") == [("name", "kim", 60), ("address", "10.0.0.1", 60)]
    kind, key, left = lk.locked("kim", "10.0.0.2")
    assert (kind, key, left) == ("name", "kim", 60)
    assert lk.locked("lee", "10.0.0.1")[:2] == ("address", "10.0.0.1")
    assert lk.locked("lee", "10.0.0.2") is None
    clock.now += 59.5
    assert lk.locked("kim", None) is not None
    clock.now += 1
    assert lk.locked("kim", "10.0.0.1") is None
    # the window's failures remain after the lock: one more locks again
    assert lk.failed("kim", None) == [("name", "kim", 60)]


def test_name_and_address_are_counted_separately(home):
    lk = auth.Lockout(clock=Clock())
    for i in range(5):                                   # one name, five addresses
        lk.failed("mo", f"10.0.0.{i}")
    assert lk.locked("mo", "10.9.9.9")[0] == "name" and lk.locked("other", "10.0.0.1") is None
    for i in range(5):                                   # five names, one address
        lk.failed(f"n{i}", "10.7.7.7")
    assert lk.locked("fresh", "10.7.7.7")[0] == "address" and lk.locked("n0", "10.0.0.9") is None


def test_the_lock_table_is_pruned_and_bounded(home):
    clock = Clock()
    lk = auth.Lockout(clock=clock, cap=100)
    for i in range(1000):                                # a spray of names from many addresses
        lk.failed(f"user{i}", f"10.{i // 250}.{i % 250}.1")
        assert len(lk) <= 2 * 100 + 2
    for _ in range(5):
        lk.failed("target", "10.200.0.1")
    assert lk.locked("target", None) is not None         # the newest survive the bound
    clock.now += 301
    lk.locked("anyone", None)                            # any use prunes what has expired
    assert len(lk) == 0


# -- durable logins -----------------------------------------------------------------------------

@pytest.mark.parametrize("cookie", [None, "", 5, "x" * 42, "x" * 44, "../../../etc/passwd",
                                    "a" * 42 + "/", "a" * 42 + "\n", "a" * 10 ** 5])
def test_malformed_cookies_find_nothing(home, cookie):
    assert auth.login_lookup(cookie) is None
    assert auth.login_end(cookie) is False


def test_a_login_is_a_0600_file_keyed_by_the_cookies_hash_never_the_cookie(home):
    import hashlib
    auth.add("nia", "operator", password=PW)
    cookie = auth.login_create("nia")
    p = auth.login_lookup(cookie)
    assert (p.name, p.role, p.via, p.token_id) == ("nia", "operator", "cookie", None)
    assert p.login == hashlib.sha256(cookie.encode()).hexdigest()
    f = login_file(home, p)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(home / "logins").st_mode) == 0o700
    for path in (home / "logins").iterdir():
        assert cookie not in path.name and cookie not in path.read_text()
    assert auth.login_lookup("A" * 43) is None                   # well-formed, unknown
    line = acts("auth.login")[-1]
    assert (line["name"], line["via"], line["login"]) == ("nia", "password", p.login[:12])
    assert cookie not in open(audit.log_path()).read()
    assert auth.login_end(cookie) is True and not f.exists()
    assert auth.login_lookup(cookie) is None and auth.login_end(cookie) is False
    assert acts("auth.logout")[-1]["name"] == "nia"


def test_idle_expiry_and_seen_touched_at_most_once_a_minute(home):
    auth.add("oz", "operator", password=PW)
    cookie = auth.login_create("oz")
    f = login_file(home, auth.login_lookup(cookie))
    first = json.loads(f.read_text())
    assert auth.login_lookup(cookie) is not None
    assert json.loads(f.read_text()) == first                    # not rewritten within a minute
    rec = dict(first, seen=time.time() - 120)
    f.write_text(json.dumps(rec))
    assert auth.login_lookup(cookie) is not None
    assert json.loads(f.read_text())["seen"] > time.time() - 5   # touched
    rec = dict(first, seen=time.time() - auth.LOGIN_IDLE - 1)
    f.write_text(json.dumps(rec))
    assert auth.login_lookup(cookie) is None and not f.exists()  # over, and removed


def test_an_idle_login_is_swept_when_another_is_made(home):
    auth.add("pia", "operator", password=PW)
    cookie = auth.login_create("pia")
    f = login_file(home, auth.login_lookup(cookie))
    f.write_text(json.dumps(dict(json.loads(f.read_text()), seen=time.time() - auth.LOGIN_IDLE - 5)))
    old = time.time() - auth.LOGIN_IDLE - 5
    os.utime(f, (old, old))
    auth.login_create("pia")
    assert not f.exists()


def test_untrusted_login_files_grant_nothing_and_are_removed(home, tmp_path):
    auth.add("quin", "operator", password=PW)
    cookies = [auth.login_create("quin") for _ in range(4)]
    files = [login_file(home, auth.login_lookup(c)) for c in cookies]
    os.chmod(files[0], 0o644)                                     # others may read it
    files[1].write_text("{not json")                              # damaged
    files[2].write_text(json.dumps({"name": "quin"}))             # missing fields
    target = tmp_path / "planted.json"                            # a link to a file of ours
    target.write_text(files[3].read_text())
    os.chmod(target, 0o600)
    files[3].unlink()
    os.symlink(target, files[3])
    for c, f in zip(cookies, files):
        assert auth.login_lookup(c) is None
        assert not os.path.lexists(f)
    assert target.exists()                                        # never followed


def test_a_login_file_naming_another_account_grants_nothing(home):
    """A file that names an account but not its id and generation (made by hand, or left
    from an account of the same name) is refused."""
    auth.add("rae", "admin", password=PW)
    cookie = auth.login_create("rae")
    f = login_file(home, auth.login_lookup(cookie))
    rec = json.loads(f.read_text())
    f.write_text(json.dumps(dict(rec, account="0" * 16)))
    assert auth.login_lookup(cookie) is None


def test_a_password_change_ends_the_other_logins_but_keeps_keep_login(home):
    auth.add("sam", "operator", password=PW)
    mine, other, third = (auth.login_create("sam") for _ in range(3))
    keep = auth.login_lookup(mine).login
    done = auth.passwd("sam", "a brand new password", by="sam", keep_login=keep)
    assert done == {"name": "sam", "ended": 2}
    assert auth.login_lookup(mine).name == "sam"
    assert auth.login_lookup(other) is None and auth.login_lookup(third) is None
    line = acts("user.passwd")[-1]
    assert (line["name"], line["logins_ended"], line["by"]) == ("sam", 2, "sam")
    with pytest.raises(auth.AuthError):
        auth.check_password("sam", PW, None)
    assert auth.check_password("sam", "a brand new password", None).name == "sam"
    # without keep_login every login ends
    auth.passwd("sam", "yet another password")
    assert auth.login_lookup(mine) is None


def test_a_role_change_ends_the_other_logins_and_the_role_is_read_fresh(home):
    auth.add("tia", "operator", password=PW)
    mine, other = auth.login_create("tia"), auth.login_create("tia")
    keep = auth.login_lookup(mine).login
    done = auth.set_role("tia", "viewer", by="cli:test", keep_login=keep)
    assert (done["was"], done["role"], done["ended"]) == ("operator", "viewer", 1)
    p = auth.login_lookup(mine)
    assert p.role == "viewer" and not p.may_change and not p.is_admin
    assert auth.login_lookup(other) is None
    assert auth.set_role("tia", "viewer")["ended"] == 0           # the same role: nothing
    assert len(acts("user.role")) == 1
    with pytest.raises(UsageError):
        auth.set_role("tia", "overlord")
    with pytest.raises(NotFound):
        auth.set_role("nobody", "viewer")


def test_logins_are_durable_across_processes(home):
    """A login made in one process is found by another (the file, not memory)."""
    import subprocess
    import sys
    auth.add("uma", "admin", password=PW)
    code = ("from overlord.trust import auth; import sys; p = auth.login_lookup(sys.argv[1]); "
            "print(p.name if p else None, p.role if p else None)")
    cookie = auth.login_create("uma")
    from conftest import REPO
    out = subprocess.run([sys.executable, "-c", code, cookie], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=REPO), check=True, cwd=REPO).stdout
    assert out.split() == ["uma", "admin"]


# -- roles -------------------------------------------------------------------------------------

def test_can_see_and_can_change():
    admin = auth.Principal(name="ad", role="admin", via="cookie")
    op = auth.Principal(name="op", role="operator", via="bearer", token_id="x")
    viewer = auth.Principal(name="vi", role="viewer", via="cookie")
    mine, others, cli = {"owner": "op"}, {"owner": "someone"}, {"owner": None}
    table = {
        (auth.LAUNCH, "mine"): (True, True), (auth.LAUNCH, "cli"): (True, True),
        (admin, "mine"): (True, True), (admin, "others"): (True, True), (admin, "cli"): (True, True),
        (op, "mine"): (True, True), (op, "others"): (False, False), (op, "cli"): (False, False),
        (viewer, "mine"): (True, False), (viewer, "others"): (True, False),
        (viewer, "cli"): (True, False),
    }
    metas = {"mine": mine, "others": others, "cli": cli}
    for (who, which), want in table.items():
        assert (auth.can_see(who, metas[which]), auth.can_change(who, metas[which])) == want, \
            (who, which)
    assert not auth.can_see(None, mine) and not auth.can_change(None, mine)
    assert not auth.can_see("admin", mine)                       # only a Principal speaks
    nameless = auth.Principal(name=None, role="operator", via="cookie")
    assert not auth.can_see(nameless, cli) and not auth.can_change(nameless, cli)
    assert auth.LAUNCH.actor is None and auth.LAUNCH.is_admin and auth.LAUNCH.may_change
    assert op.actor == "account:op" and op.may_change and not op.is_admin


def test_a_new_account_never_adopts_what_its_folder_held(home):
    """users/<name>/ left by anything before the account (notes accepted for a removed owner,
    a planted link) is set aside at add: a new account starts empty."""
    (home / "users" / "wes").mkdir(parents=True, mode=0o700)
    (home / "users" / "wes" / "memory.md").write_text("someone else's notes\n")
    os.symlink(home / "users" / "wes", home / "users" / "xan")
    auth.add("wes", "operator", password=PW)
    auth.add("xan", "operator", password=PW)
    for name in ("wes", "xan"):
        d = home / "users" / name
        assert d.is_dir() and not d.is_symlink() and list(d.iterdir()) == []
    stale = sorted(p.name for p in (home / "users").iterdir() if p.name.startswith(".stale-"))
    assert [s.split("-")[1] for s in stale] == ["wes", "xan"]


def test_a_login_from_a_stale_check_is_refused(home):
    auth.add("yul", "operator", password=PW)
    checked = auth.check_password("yul", PW, None)
    assert checked.name == "yul" and isinstance(checked.name, str)
    auth.set_role("yul", "viewer")                       # the account changed after the check
    with pytest.raises(auth.AuthError, match="changed while signing in"):
        auth.login_create(checked.name)
    assert auth.login_lookup(auth.login_create("yul")).role == "viewer"   # a name alone: made


def test_the_address_lock_counts_an_ipv6_client_by_its_64():
    """A client rotating addresses inside its /64 is one address to the lockout (and to the
    rate limit and the pending sign-ins, which count by the same auth.address_key)."""
    from overlord.trust import auth as A
    lock = A.Lockout()
    for i in range(5):
        lock.failed(f"name{i}", f"2001:db8:1:2::{i + 1:x}")
    held = lock.locked("someone-else", "2001:db8:1:2:ffff::9")
    assert held and held[0] == "address" and held[1] == "2001:db8:1:2::/64"
    assert lock.locked("someone-else", "2001:db8:1:3::1") is None
    assert A.address_key("::ffff:10.0.0.7") == "10.0.0.7" and A.address_key("10.0.0.7") == "10.0.0.7"
    assert A.address_key("not an address") == "not an address"


@pytest.mark.parametrize("name", ["alice\n", "alice\r", "ali ce", "alice\x00"])
def test_a_name_with_a_trailing_line_end_is_no_local_name(name):
    """The name rules match the whole string: "alice\\n" is not alice (a `$` would let the
    newline through)."""
    from overlord.trust import auth as A
    with pytest.raises(UsageError):
        A.check_local_name(name)
    token = "ovl_" + "a" * 12 + "_" + "b" * 43
    assert A.TOKEN_RE.match(token) and not A.TOKEN_RE.match(token + "\n")
