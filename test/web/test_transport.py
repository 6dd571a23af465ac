"""`overlord ui` beyond loopback (issue 15, section 2): TLS with a certificate from `overlord tls
selfsign`, the start refusals, the Host allowlist, HSTS, `__Host-`/Secure cookies, a plain-HTTP
probe at the TLS port, --log-json, the per-address rate limit, /healthz.

Real processes throughout: the server is `overlord ui` (weblib.UI), the certificate is openssl's,
the clients are the ssl module trusting that certificate only, and curl when it is installed.
"""
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import stat
import subprocess
import time
import warnings

import pytest

from conftest import Ovl
from weblib import UI, ui  # noqa: F401 -- ui: the plain loopback server fixture

NAME = "overlord.test"          # the --host name: in the certificate, never resolved
PASSWORD = "correct horse battery staple"


@pytest.fixture
def ovl_plain(home):
    return Ovl(home)


@pytest.fixture
def pair(ovl_plain, tmp_path):
    """(cert, key) made by `overlord tls selfsign` for NAME and 127.0.0.1."""
    out = tmp_path / "tls"
    proc = ovl_plain("tls", "selfsign", "--host", NAME, "--host", "127.0.0.1", "--out", out, check=0)
    assert "SHA-256 fingerprint" in proc.out
    return str(out / "cert.pem"), str(out / "key.pem")


def tls_args(pair, *more):
    return ("--tls-cert", pair[0], "--tls-key", pair[1], "--host", NAME, *more)


def add_account(ovl, name="admin", role="admin"):
    """One account, through the CLI (one scrypt hash): sign-in is on from then on."""
    ovl("users", "add", name, "--role", role, input=PASSWORD.encode() + b"\n", check=0)


def client_context(cafile):
    return ssl.create_default_context(cafile=cafile)


def wait_for(cond, timeout=15, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def settled(pid):
    """The server's thread count once it has held still for a moment (no connection open)."""
    last, since = threads(pid), time.monotonic()
    deadline = since + 15
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = threads(pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.3:
            return now
    raise AssertionError("the server's threads never settled")


def one_line_refusal(proc):
    assert proc.returncode != 0, (proc.out, proc.err)
    assert "Traceback" not in proc.err
    lines = proc.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "overlord ui:" not in proc.out                  # it never started
    return lines[0]


@pytest.fixture
def tls_ui(home, target, pair):
    server = UI(home, target, args=tls_args(pair), cafile=pair[0],
                env={"OVERLORD_UI_HANDSHAKE_TIMEOUT": "1"})
    yield server
    server.close()


# -- overlord tls selfsign ------------------------------------------------------------------------

def test_selfsign_makes_a_key_0600_and_a_certificate_naming_every_host(ovl_plain, home):
    proc = ovl_plain("tls", "selfsign", "--host", NAME, "--host", "10.1.2.3", "--host", "::1",
                     "--days", "30", check=0)
    cert, key = home / "tls" / "cert.pem", home / "tls" / "key.pem"
    assert f"certificate: {cert}" in proc.out and f"key:         {key}" in proc.out
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(home / "tls").st_mode) == 0o700
    assert not [n for n in os.listdir(home / "tls") if n.startswith(".selfsign-")]
    shown = re.search(r"SHA-256 fingerprint: ([0-9A-F:]{95})$", proc.out, re.M).group(1)
    x509 = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256",
                           "-ext", "subjectAltName,basicConstraints", "-enddate"],
                          capture_output=True, text=True, check=True).stdout
    assert shown in x509                                  # the fingerprint openssl computes
    assert f"DNS:{NAME}" in x509 and "IP Address:10.1.2.3" in x509 and "IP Address:0:0:0:0:0:0:0:1" in x509
    assert "CA:FALSE" in x509
    # a second run replaces the pair: a new key
    before = key.read_bytes()
    ovl_plain("tls", "selfsign", "--host", NAME, check=0)
    assert key.read_bytes() != before and stat.S_IMODE(os.stat(key).st_mode) == 0o600


@pytest.mark.parametrize("args, says", [
    (("--host", "not a name"), "--host takes a host name or an IP address"),
    (("--host", "a..b"), "--host takes a host name or an IP address"),
    (("--host", NAME, "--days", "0"), "--days takes 1 to"),
    (("--host", NAME, "--days", "99999"), "--days takes 1 to"),
    ((), "required: --host"),
])
def test_selfsign_bad_input_is_one_line_and_writes_nothing(ovl_plain, home, args, says):
    line = one_line_refusal(ovl_plain("tls", "selfsign", *args))
    assert says in line
    assert not (home / "tls").exists()


def test_selfsign_without_openssl_says_so_in_one_line(ovl_plain, home, tmp_path):
    bare = tmp_path / "bin"                          # a PATH with python3 and no openssl
    bare.mkdir()
    proc = ovl_plain("tls", "selfsign", "--host", NAME, env={"PATH": str(bare)})
    line = one_line_refusal(proc)
    assert "openssl is not installed" in line
    assert not (home / "tls").exists() or not os.listdir(home / "tls")


# -- start refusals --------------------------------------------------------------------------------

def ui_cmd(ovl, target, *args):
    return ovl("ui", "--port", "0", "--folder", target, *args, timeout=60)


def test_beyond_loopback_without_accounts_and_tls_is_refused_naming_both(ovl_plain, target):
    line = one_line_refusal(ui_cmd(ovl_plain, target, "--bind", "0.0.0.0", "--host", NAME))
    assert "beyond loopback" in line and "accounts" in line and "TLS" in line


def test_beyond_loopback_without_accounts_is_refused_naming_accounts(ovl_plain, target, pair):
    line = one_line_refusal(ui_cmd(ovl_plain, target, "--bind", "0.0.0.0", *tls_args(pair)))
    assert "accounts" in line and "TLS" not in line


def test_beyond_loopback_without_tls_is_refused_naming_tls(ovl_plain, target):
    add_account(ovl_plain)
    line = one_line_refusal(ui_cmd(ovl_plain, target, "--bind", "0.0.0.0", "--host", NAME))
    assert "TLS" in line and "accounts" not in line


@pytest.mark.parametrize("make_args, says", [
    (lambda p, t: ("--bind", "0.0.0.0", "--tls-cert", p[0], "--tls-key", p[1]), "--host NAME"),
    (lambda p, t: ("--bind", "not-an-ip", *tls_args(p)), "--bind takes an IP address"),
    (lambda p, t: ("--tls-cert", p[0]), "--tls-cert and --tls-key go together"),
    (lambda p, t: ("--tls-key", p[1]), "--tls-cert and --tls-key go together"),
    (lambda p, t: ("--tls-cert", str(t / "missing.pem"), "--tls-key", p[1]), "cannot read the TLS certificate"),
    (lambda p, t: ("--tls-cert", p[0], "--tls-key", str(t / "missing.pem")), "cannot read the TLS key"),
    (lambda p, t: ("--tls-cert", str(t / "garbage.pem"), "--tls-key", p[1]), "are not a PEM certificate"),
    (lambda p, t: ("--tls-cert", p[0], "--tls-key", str(t / "other" / "key.pem")), "is not the key of the certificate"),
    (lambda p, t: ("--host", "bad name!"), "--host takes a host name or an IP address"),
    (lambda p, t: ("--rate-limit", "-1"), "--rate-limit takes"),
])
def test_bad_tls_and_bind_arguments_are_one_line(ovl_plain, target, pair, tmp_path, make_args, says):
    if says == "--host NAME":
        add_account(ovl_plain)                      # past the accounts-and-TLS refusal
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    ovl_plain("tls", "selfsign", "--host", NAME, "--out", tmp_path / "other", check=0)
    line = one_line_refusal(ui_cmd(ovl_plain, target, *make_args(pair, tmp_path)))
    assert says in line, line


def test_an_encrypted_key_is_refused_without_a_prompt(ovl_plain, target, pair, tmp_path):
    locked = tmp_path / "locked.pem"
    subprocess.run(["openssl", "pkey", "-in", pair[1], "-out", str(locked), "-aes256",
                    "-passout", "pass:secret"], check=True, capture_output=True)
    line = one_line_refusal(ui_cmd(ovl_plain, target, "--tls-cert", pair[0], "--tls-key", str(locked)))
    assert "is encrypted" in line


def test_beyond_loopback_with_accounts_and_tls_starts(home, target, pair, ovl_plain):
    add_account(ovl_plain)
    server = UI(home, target, args=("--bind", "0.0.0.0", *tls_args(pair)), cafile=pair[0])
    try:
        assert server.link == f"https://{NAME}:{server.port}/"          # no launch token
        r = server.get("/healthz", auth=False)
        assert r.status == 200 and r.json == {"ok": True}
        assert r.header("Strict-Transport-Security") == "max-age=31536000"
        assert server.get("/healthz", auth=False, headers={"Host": f"0.0.0.0:{server.port}"}).status == 421
        assert server.get("/api/sessions", auth=False).status == 401
    finally:
        server.close()


def test_a_login_beyond_loopback_gets_a_secure_host_prefixed_cookie(home, target, pair, ovl_plain):
    """Accounts and TLS on 0.0.0.0: sign in over TLS; the login cookie is `__Host-`, Secure,
    HttpOnly, SameSite=Strict, Path=/; it names the account; sign-out clears it (Secure too);
    the launch token alone is refused."""
    add_account(ovl_plain)
    server = UI(home, target, args=("--bind", "0.0.0.0", *tls_args(pair), "--log-json"), cafile=pair[0])
    try:
        r = server.post("/api/login", {"name": "admin", "password": PASSWORD}, auth=False)
        assert r.status == 200, r.body
        line = r.header("Set-Cookie")
        name, _, rest = line.partition("=")
        value = rest.split(";")[0]
        flags = [f.strip() for f in rest.split(";")[1:]]
        assert name == "__Host-overlord_login" and value
        assert {"Secure", "HttpOnly", "SameSite=Strict", "Path=/"} <= set(flags), line
        assert not any(f.lower().startswith("domain") for f in flags)
        me = server.get("/api/whoami", auth=False, headers={"Cookie": f"{name}={value}"})
        assert me.status == 200 and me.json["name"] == "admin"
        # the unprefixed name is not read under TLS; the launch token no longer suffices
        assert server.get("/api/sessions", auth=False, headers={"Cookie": f"overlord_login={value}"}).status == 401
        assert server.get("/api/sessions").status == 401
        out = server.post("/api/logout", {}, auth=False,
                          headers={"Cookie": f"{name}={value}", "Origin": f"https://{NAME}:{server.port}"})
        assert out.status == 200, out.body
        gone = out.header("Set-Cookie")
        assert gone.startswith("__Host-overlord_login=;") and "Max-Age=0" in gone and "Secure" in gone
        err = server.stderr()
        assert value not in err and PASSWORD not in err and server.token not in err
        rows = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
        assert ("GET", "/api/whoami", "admin") in [(r["method"], r["path"], r["principal"]) for r in rows]
    finally:
        server.close()


# -- TLS on the wire --------------------------------------------------------------------------------

def test_a_client_trusting_the_certificate_gets_https_and_hsts(tls_ui, pair):
    assert tls_ui.link == f"https://{NAME}:{tls_ui.port}/?token={tls_ui.token}"   # accounts off
    r = tls_ui.get("/healthz", auth=False)
    assert r.status == 200 and r.json == {"ok": True}
    assert r.header("Strict-Transport-Security") == "max-age=31536000"
    assert tls_ui.get("/api/sessions").status == 200
    # the same connection serves a second request (keep-alive over TLS)
    conn = tls_ui.conn()
    try:
        for _ in range(2):
            assert tls_ui.get("/healthz", auth=False, conn=conn).status == 200
        assert conn.sock.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        conn.close()
    # a client that does not trust the certificate cannot talk to it
    with socket.create_connection(("127.0.0.1", tls_ui.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname=NAME)


def test_tls_below_1_2_is_refused_by_the_server(tls_ui):
    """A client offering TLS 1.0-1.1 only gets the server's protocol_version alert."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        except (ValueError, ssl.SSLError):
            pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", tls_ui.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLError) as err:
            ctx.wrap_socket(raw, server_hostname=NAME)
    if "NO_PROTOCOLS_AVAILABLE" in str(err.value):
        pytest.skip("this OpenSSL refuses TLS 1.1 on the client side")
    assert "ALERT_PROTOCOL_VERSION" in str(err.value)        # the server's answer
    assert tls_ui.get("/healthz", auth=False).status == 200


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_trusting_the_certificate(tls_ui, pair):
    out = subprocess.run(["curl", "-sS", "--noproxy", "*", "--cacert", pair[0], "-i",
                          "--resolve", f"{NAME}:{tls_ui.port}:127.0.0.1",
                          f"https://{NAME}:{tls_ui.port}/healthz"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("HTTP/1.1 200") and out.stdout.rstrip().endswith('{"ok": true}')
    assert re.search(r"(?im)^strict-transport-security: max-age=31536000", out.stdout)
    bad = subprocess.run(["curl", "-sS", "--noproxy", "*", "-o", "/dev/null",
                          "--resolve", f"{NAME}:{tls_ui.port}:127.0.0.1",
                          f"https://{NAME}:{tls_ui.port}/healthz"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0                   # curl with the system's CAs refuses it


def _refused_quietly(port, data):
    """Send `data` in the clear to the TLS port: the server closes the connection and sends no
    HTTP answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        if data:
            s.sendall(data)
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:
            pass
    assert not got.startswith(b"HTTP/"), got


def test_a_plain_http_probe_is_shrugged_off_and_the_next_request_is_answered(tls_ui):
    tls_ui.get("/healthz", auth=False)
    pid = tls_ui.proc.pid
    _refused_quietly(tls_ui.port, f"GET /healthz HTTP/1.1\r\nHost: {tls_ui.host}\r\n\r\n".encode())
    _refused_quietly(tls_ui.port, b"\x00\xffnot a handshake at all\r\n\r\n")
    r = tls_ui.get("/healthz", auth=False)
    assert r.status == 200 and r.json == {"ok": True}
    idle = settled(pid)
    # a client that connects and says nothing is dropped after the handshake timeout (1 s here)
    start = time.monotonic()
    _refused_quietly(tls_ui.port, b"")
    assert time.monotonic() - start < 8
    wait_for(lambda: threads(pid) <= idle, what="the silent connection's thread to end")
    assert tls_ui.get("/healthz", auth=False).status == 200
    err = tls_ui.stderr()
    assert "Traceback" not in err and "SSL" not in err and "Error" not in err, err


def test_many_silent_connections_leave_no_thread_behind(tls_ui):
    pid = tls_ui.proc.pid
    tls_ui.get("/healthz", auth=False)
    before = settled(pid)
    socks = [socket.create_connection(("127.0.0.1", tls_ui.port), timeout=10) for _ in range(8)]
    try:
        wait_for(lambda: threads(pid) >= before + 8, what="a thread per connection")
        assert tls_ui.get("/healthz", auth=False).status == 200    # still answering meanwhile
        for s in socks:
            assert s.recv(1) == b""              # each closed by the server, at the timeout
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: threads(pid) <= before, what="the threads to end")


# -- the Host allowlist, origins and cookies under TLS ----------------------------------------------

def test_host_allowlist_is_421_for_any_other_name(tls_ui):
    assert tls_ui.get("/healthz", auth=False, headers={"Host": f"evil.example:{tls_ui.port}"}).status == 421
    assert tls_ui.get("/healthz", auth=False, headers={"Host": NAME}).status == 421     # wrong port
    assert tls_ui.get("/healthz", auth=False, headers={"Host": None}).status == 421
    r = tls_ui.get("/api/sessions", headers={"Host": f"localhost:{tls_ui.port}"})
    assert r.status == 421 and NAME in r.json["error"]
    # the name, in any case, and the bound address itself
    assert tls_ui.get("/healthz", auth=False, headers={"Host": f"OVERLORD.Test:{tls_ui.port}"}).status == 200
    assert tls_ui.get("/healthz", auth=False, headers={"Host": f"127.0.0.1:{tls_ui.port}"}).status == 200


def test_origins_are_https_and_the_allowed_names(tls_ui):
    ok = tls_ui.post("/api/chats/20990101-000000-abcdef/cancel",
                     headers={"Origin": f"https://{NAME}:{tls_ui.port}"})
    assert ok.status != 403, ok.body
    for origin in (f"http://{NAME}:{tls_ui.port}", f"https://evil.example:{tls_ui.port}",
                   f"https://{NAME}:1"):
        r = tls_ui.post("/api/chats/20990101-000000-abcdef/cancel", headers={"Origin": origin})
        assert r.status == 403, (origin, r.status, r.body)


def test_the_launch_cookie_is_secure_and_host_prefixed_under_tls(tls_ui):
    r = tls_ui.get(f"/?token={tls_ui.token}", auth=False)
    assert r.status == 303
    cookie = r.header("Set-Cookie")
    name, _, rest = cookie.partition("=")
    assert name == "__Host-overlord_ui"
    flags = {f.strip().split("=")[0] for f in rest.split(";")[1:]}
    assert {"Secure", "HttpOnly", "SameSite", "Path"} <= flags and "Domain" not in flags
    assert "Path=/" in cookie and "SameSite=Strict" in cookie
    value = rest.split(";")[0]
    assert tls_ui.get("/api/sessions", auth=False, headers={"Cookie": f"__Host-overlord_ui={value}"}).status == 200
    # the unprefixed name (a cookie any plain-HTTP page on the host could plant) is not read
    assert tls_ui.get("/api/sessions", auth=False, headers={"Cookie": f"overlord_ui={value}"}).status == 401


def test_plain_loopback_sends_no_hsts_and_a_plain_cookie(ui):
    r = ui.get("/healthz", auth=False)
    assert r.status == 200 and r.json == {"ok": True}
    assert r.header("Strict-Transport-Security") is None
    cookie = ui.get(f"/?token={ui.token}", auth=False).header("Set-Cookie")
    assert cookie.startswith("overlord_ui=") and "Secure" not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie


def test_healthz_says_nothing_else(tls_ui):
    r = tls_ui.get("/healthz", auth=False)
    assert r.body == b'{"ok": true}'
    assert r.header("Set-Cookie") is None
    assert tls_ui.request("POST", "/healthz", auth=False, raw=b"").status in (401, 404, 405)


# -- --log-json --------------------------------------------------------------------------------------

def test_log_json_is_one_line_a_request_without_secrets(home, target, pair):
    server = UI(home, target, args=tls_args(pair, "--log-json"), cafile=pair[0])
    try:
        cookie = server.get(f"/?token={server.token}", auth=False).header("Set-Cookie")
        value = cookie.split(";")[0].split("=", 1)[1]
        server.get("/api/sessions")
        server.get("/api/sessions", auth=False, headers={"Cookie": f"__Host-overlord_ui={value}"})
        server.get("/sso/callback?code=SECRETCODE&state=SECRETSTATE", auth=False)
        server.get("/nowhere#frag", auth=False)
        server.get("/healthz", auth=False, headers={"Host": "evil.example"})
        server.request("DELETE", "/healthz", auth=False)
        n = 7

        def lines():
            got = [ln for ln in server.stderr().splitlines() if ln.startswith("{")]
            return got if len(got) >= n else None
        got = wait_for(lines, what="seven log lines")
        err = server.stderr()
        for secret in (server.token, value, "SECRETCODE", "SECRETSTATE", "Bearer"):
            assert secret not in err, secret
        rows = [json.loads(ln) for ln in got]
        for row in rows:
            assert set(row) == {"ts", "principal", "method", "path", "status", "ms"}, row
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", row["ts"])
            assert "?" not in row["path"] and "#" not in row["path"]
            assert isinstance(row["ms"], (int, float)) and row["ms"] >= 0
            assert row["principal"] is None or isinstance(row["principal"], str)
        assert [(r["method"], r["path"], r["status"]) for r in rows] == [
            ("GET", "/", 303), ("GET", "/api/sessions", 200), ("GET", "/api/sessions", 200),
            ("GET", "/sso/callback", rows[3]["status"]), ("GET", "/nowhere", rows[4]["status"]),
            ("GET", "/healthz", 421), ("DELETE", "/healthz", rows[6]["status"])]
        assert rows[5]["principal"] is None                 # refused before anyone was named
    finally:
        server.close()


def test_without_log_json_nothing_is_logged(ui):
    ui.get("/healthz", auth=False)
    ui.get("/api/sessions")
    assert ui.stderr().strip() == ""


# -- the rate limit ----------------------------------------------------------------------------------

def test_rate_limit_answers_429_with_retry_after_per_address(home, target):
    server = UI(home, target, args=("--rate-limit", "5"))
    try:
        conn = server.conn()
        for _ in range(5):
            assert server.get("/healthz", auth=False, conn=conn).status == 200
        r = server.get("/healthz", auth=False, conn=conn)
        assert r.status == 429, r.body
        retry = int(r.header("Retry-After"))
        assert 1 <= retry <= 12 and r.json["retry_after"] == retry
        assert "too many requests" in r.json["error"]
        assert server.get("/api/sessions", conn=conn).status == 429      # every route, signed in too
        body = server.post("/api/chats", {"x": "y" * 1000})              # a body left unread: closed
        assert body.status == 429
        conn.close()
        # another address is not held back by this one's spending
        other = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10,
                                           source_address=("127.0.0.2", 0))
        assert server.get("/healthz", auth=False, conn=other).status == 200
        other.close()
    finally:
        server.close()


def test_rate_limit_under_tls_and_zero_means_none(home, target, pair):
    server = UI(home, target, args=tls_args(pair, "--rate-limit", "0"), cafile=pair[0])
    try:
        conn = server.conn()
        for _ in range(40):
            assert server.get("/healthz", auth=False, conn=conn).status == 200
        conn.close()
    finally:
        server.close()
