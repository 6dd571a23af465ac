"""Webhooks end to end against real receivers on 127.0.0.1: the slack and signed json formats
after real acts (an agent run that leaves changes, `overlord run`), the link with a base URL,
retries with backoff, a 4xx tried once, endpoints that hang or refuse never holding up the
act, the SSRF guard, `webhooks test`, the delivery log without secrets, at-least-once across
a killed sender, one sender at a time under concurrent acts."""
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import REPO, SESSION_RE, require_backend
from notifylib import (FAST, Cli, audit_entries, await_, cli, dead_url, deliveries, docs_verify,  # noqa: F401
                       outcomes_for, receiver, sender_idle, verify, wait_idle)

SID = "20261201-074714-3fa2c1"


@pytest.fixture(autouse=True)
def settled(home):
    """No test leaves a sender running on its OVERLORD_HOME (it could post to a later test's
    receiver on a reused port)."""
    yield
    wait_idle(home, timeout=90)


def add(cli, name, url, *flags, input=None, check=0):
    return cli("webhooks", "add", name, url, *flags, input=input, check=check)


def act(cli, url="http://ui.example", check=0):
    """A cheap real audited act from the CLI: webhook.base_url."""
    return cli("webhooks", "base-url", url, check=check)


def append(**details):
    """An audited act in this process (audit.append, as every face's act does)."""
    from overlord.trust import audit
    return audit.append("session.open", sid=SID, target="/srv/proj", **details)


# -- formats after real acts --------------------------------------------------------------------

def test_an_agent_that_leaves_changes_posts_a_slack_line_with_a_link(cli, receiver, home, target, tmp_path):
    require_backend("kernel")
    r = receiver(200)
    add(cli, "team", r.url, "--allow-private")            # default: needs_review, approval_requested
    cli("webhooks", "base-url", "https://overlord.example.com/")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"model": "scripted-test", "turns": [
        {"tool_calls": [{"name": "write_file", "input": {"path": "new.txt", "content": "x\n"}},
                        {"name": "write_file", "input": {"path": "two.txt", "content": "y\n"}}]},
        {"text": "done"}]}))
    proc = cli("agent", "-t", target, "--provider", "scripted", "--script", script, "do it",
               env={"OVERLORD_TEST_BACKEND": "kernel"}, check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    await_(lambda: r.requests, what="the slack post")
    wait_idle(home)
    assert len(r.requests) == 1                   # base-url and the session's other acts: not subscribed
    req = r.requests[0]
    assert req["method"] == "POST" and req["path"] == "/hook"
    assert req["headers"]["content-type"].startswith("application/json")
    assert req["headers"]["x-overlord-event"] == "session.needs_review"
    assert "x-overlord-signature" not in req["headers"]        # no secret, no signature
    body = json.loads(req["body"])
    assert list(body) == ["text"]
    text = body["text"]
    assert "agent finished with 2 changes waiting for review" in text
    assert text.endswith(f" — https://overlord.example.com/?sid={sid}")
    assert "\n" not in text
    [ok] = outcomes_for(home, "session.needs_review")
    assert ok["ok"] and ok["status"] == 200 and ok["attempts"] == 1 and ok["sid"] == sid


def test_signed_json_is_the_audit_entry_plus_text_and_verifies(cli, receiver, home, target):
    require_backend("kernel")
    r = receiver(200)
    secret = "whsec-Zq9-the-signing-secret"
    add(cli, "ci", r.url, "--format", "json", "--on", "session.open", "--allow-private",
        "--secret-stdin", input=(secret + "\n").encode())
    before = time.time()
    proc = cli("run", "-t", target, "--", "true", env={"OVERLORD_TEST_BACKEND": "kernel"}, check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    await_(lambda: r.requests, what="the json post")
    req = r.requests[0]
    header = req["headers"]["x-overlord-signature"]
    assert verify(secret, header, req["body"])
    documented = docs_verify()                     # the snippet docs/WEBHOOKS.md gives receivers
    assert documented(secret.encode(), header, req["body"])
    assert not documented(b"wrong", header, req["body"])
    assert not documented(secret.encode(), header, req["body"] + b" ")
    assert not documented(secret.encode(), "t=1,v1=" + header.split("v1=")[1], req["body"])
    t = int(header.split(",")[0][2:])
    assert before - 2 <= t <= time.time() + 2
    assert not verify("another secret", header, req["body"])
    assert not verify(secret, header, req["body"].replace(b"true", b"false", 1))   # altered body
    assert not verify(secret, header, req["body"], now=t + 3600)                    # a replay, late
    body = json.loads(req["body"])
    [entry] = [e for e in audit_entries(home) if e["action"] == "session.open"]
    text = body.pop("text")
    assert body == entry                           # the entry as the chain holds it, mac too
    assert body["sid"] == sid and sid in text and "session.open" in text
    assert secret.encode() not in req["body"]


def test_a_link_needs_the_base_url_and_a_session(home, monkeypatch, receiver):
    from overlord import ops
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.01")
    r = receiver(200)
    ops.webhook_add("h", r.url, on=["session.open", "webhook.base_url"], allow_private=True)
    append()                                            # no base URL yet: no link
    await_(lambda: len(r.requests) == 1)
    ops.webhook_base_url("http://10.1.2.3:8080/ovl/")   # an act without a session: no link
    await_(lambda: len(r.requests) == 2)
    append()
    await_(lambda: len(r.requests) == 3)
    wait_idle(home)
    texts = [b["text"] for b in r.bodies()]
    assert "?sid=" not in texts[0] and "http" not in texts[0]
    assert "?sid=" not in texts[1]
    assert texts[2].endswith(f"— http://10.1.2.3:8080/ovl/?sid={SID}")


# -- retries ------------------------------------------------------------------------------------

def test_a_5xx_is_retried_with_backoff_then_delivered(home, monkeypatch, receiver):
    from overlord import ops
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.2")
    r = receiver(500, 503, 200)
    ops.webhook_add("h", r.url, on=["session.open"], allow_private=True)
    append()
    await_(lambda: outcomes_for(home, "session.open"), what="the outcome")
    wait_idle(home)
    assert len(r.requests) == 3
    ids = {req["headers"]["x-overlord-delivery"] for req in r.requests}
    assert len(ids) == 1                           # one delivery, three attempts
    gaps = [b["at"] - a["at"] for a, b in zip(r.requests, r.requests[1:])]
    assert gaps[0] >= 0.2 * 0.9 and gaps[1] >= 0.8 * 0.9        # 1x then 4x the base
    [o] = outcomes_for(home, "session.open")
    assert o["ok"] and o["status"] == 200 and o["attempts"] == 3


def test_three_failures_and_it_gives_up(home, monkeypatch, receiver):
    from overlord import ops
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.01")
    r = receiver(502)
    ops.webhook_add("h", r.url, on=["session.open"], allow_private=True)
    append()
    await_(lambda: outcomes_for(home, "session.open"))
    wait_idle(home)
    assert len(r.requests) == 3
    [o] = outcomes_for(home, "session.open")
    assert not o["ok"] and o["status"] == 502 and o["attempts"] == 3 and o["error"] == "HTTP 502"
    assert ops.webhook_list()["queued"] == 0        # given up on: not re-sent forever


@pytest.mark.parametrize("status", [400, 404, 410, 429])
def test_a_4xx_is_tried_once(home, monkeypatch, receiver, status):
    from overlord import ops
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.01")
    r = receiver(status, 200)
    ops.webhook_add("h", r.url, on=["session.open"], allow_private=True)
    append()
    await_(lambda: outcomes_for(home, "session.open"))
    wait_idle(home)
    [o] = outcomes_for(home, "session.open")
    assert len(r.requests) == 1, (r.requests, o)
    assert not o["ok"] and o["status"] == status and o["attempts"] == 1


def test_a_redirect_is_not_followed(home, monkeypatch, receiver):
    from overlord import ops
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.01")
    r = receiver(302)
    ops.webhook_add("h", r.url, on=["session.open"], allow_private=True)
    append()
    await_(lambda: outcomes_for(home, "session.open"))
    wait_idle(home)
    assert len(r.requests) == 1
    [o] = outcomes_for(home, "session.open")
    assert not o["ok"] and o["status"] == 302 and "not followed" in o["error"]


# -- never in the act's way ---------------------------------------------------------------------

def test_a_hanging_endpoint_never_holds_up_the_act(cli, home, receiver):
    r = receiver(hang=True)
    add(cli, "slow", r.url, "--on", "webhook.base_url", "--allow-private")
    env = {"OVERLORD_NOTIFY_TIMEOUT": "1.5"}
    fast = []
    for i in range(3):
        start = time.monotonic()
        cli("webhooks", "base-url", f"http://ui{i}.example", env=env, check=0)
        fast.append(time.monotonic() - start)
    # every act returned while its delivery was still waiting on the endpoint (3 x 1.5 s)
    assert outcomes_for(home) == []
    assert max(fast) < 1.5, fast
    await_(lambda: len(outcomes_for(home, "webhook.base_url")) == 3, timeout=60)
    wait_idle(home)
    for o in outcomes_for(home, "webhook.base_url"):
        assert not o["ok"] and o["attempts"] == 3 and "no answer" in o["error"] and "1.5 s" in o["error"]


def test_a_refusing_endpoint_never_fails_the_act(cli, home, target):
    require_backend("kernel")
    add(cli, "gone", dead_url(), "--on", "session.open", "--on", "session.commit", "--allow-private")
    start = time.monotonic()
    proc = cli("run", "-t", target, "--", "sh", "-c", "echo x > made.txt",
               env={"OVERLORD_TEST_BACKEND": "kernel", "OVERLORD_NOTIFY_BACKOFF": "1"}, check=0)
    sid = SESSION_RE.search(proc.out).group(1)
    cli("commit", sid, env={"OVERLORD_NOTIFY_BACKOFF": "1"}, check=0)
    took = time.monotonic() - start
    assert (target / "made.txt").read_text() == "x\n"      # the work happened
    assert outcomes_for(home, "session.commit") == []      # its delivery still retrying (1 s, 4 s)
    await_(lambda: len(outcomes_for(home)) == 2, timeout=60)
    wait_idle(home)
    for o in outcomes_for(home):
        assert not o["ok"] and o["attempts"] == 3 and "cannot connect" in o["error"]
    assert took < 30


def test_the_act_appends_one_spool_line_and_returns(home, monkeypatch, receiver):
    """Measured in-process: audit.append with a subscribed, hanging endpoint."""
    from overlord import ops
    monkeypatch.setenv("OVERLORD_NOTIFY_TIMEOUT", "1")
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.01")
    r = receiver(hang=True)
    ops.webhook_add("h", r.url, on=["session.open"], allow_private=True)
    times = []
    for _ in range(5):
        start = time.monotonic()
        append()
        times.append(time.monotonic() - start)
    assert max(times) < 1.0, times
    assert outcomes_for(home) == []                 # nothing delivered yet: it hangs (3 x 1 s each)
    await_(lambda: len(outcomes_for(home, "session.open")) == 5, timeout=90)
    wait_idle(home)


# -- the SSRF guard -----------------------------------------------------------------------------

def test_a_loopback_target_is_refused_without_allow_private(cli, home, receiver):
    r = receiver(200)
    add(cli, "local", r.url, "--on", "webhook.base_url")
    add(cli, "byname", f"http://localhost:{r.port}/hook", "--on", "webhook.base_url")
    act(cli)
    await_(lambda: len(outcomes_for(home, "webhook.base_url")) == 2)
    wait_idle(home)
    assert r.requests == []                          # nothing reached the receiver
    for o in outcomes_for(home, "webhook.base_url"):
        assert not o["ok"] and o["attempts"] == 1 and o["status"] is None
        assert "refused" in o["error"] and "--allow-private" in o["error"]
    proc = cli("webhooks", "test", "local", check=1)
    assert "FAILED" in proc.out and "loopback" in proc.out
    assert r.requests == []


def test_the_checked_address_is_the_one_connected_to(home, monkeypatch, receiver):
    """The host is looked up once: a second answer (a rebinding DNS) is never asked for; the
    request names the host (Host header) while going to the address checked."""
    import socket
    from overlord import ops
    from overlord.trust import notify
    r = receiver(200)
    ops.webhook_add("h", f"http://hooks.test:{r.port}/in", fmt="json", on=["session.open"],
                    allow_private=True)
    real, calls = socket.getaddrinfo, []

    def rebinding(host, *a, **kw):
        calls.append(host)
        if host == "hooks.test":
            first = len([c for c in calls if c == "hooks.test"]) == 1
            return real("127.0.0.1" if first else "192.0.2.1", *a, **kw)
        return real(host, *a, **kw)
    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    hook = notify.load()["hooks"]["h"]
    result = notify.send("h", hook, {"action": "session.open", "sid": SID}, None)
    assert result["ok"], result
    assert calls.count("hooks.test") == 1
    assert r.requests[0]["headers"]["host"] == f"hooks.test:{r.port}"
    assert r.requests[0]["path"] == "/in"


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "10.0.0.1", "172.16.0.1", "172.31.255.254", "192.168.1.1",
    "100.64.0.1", "100.127.255.255", "169.254.169.254", "0.0.0.0", "0.1.2.3", "224.0.0.1",
    "239.255.255.250", "255.255.255.255", "::1", "::", "fe80::1", "fe80::1%2", "fc00::1", "fd12:3456::1",
    "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1",
    "::10.0.0.1", "2002:7f00:1::1", "2002:a00:1::", "64:ff9b::a00:1", "fec0::1", "198.18.0.1"])
def test_private_and_special_addresses_are_blocked(address):
    from overlord.trust import notify
    assert notify.blocked(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "151.101.1.69", "2606:4700:4700::1111",
                                     "::ffff:8.8.8.8", "2002:808:808::1", "100.63.255.255",
                                     "100.128.0.1", "172.32.0.1"])
def test_public_addresses_pass(address):
    from overlord.trust import notify
    assert notify.blocked(address) is None


# -- webhooks test ------------------------------------------------------------------------------

def test_webhooks_test_delivers_now_and_says_so(cli, home, receiver):
    ok, bad = receiver(200), receiver(500)
    add(cli, "good", ok.url, "--allow-private", "--format", "json")
    add(cli, "bad", bad.url, "--allow-private")
    proc = cli("webhooks", "test", "good", check=0)
    assert "delivered (HTTP 200), 1 attempt" in proc.out
    assert len(ok.requests) == 1
    body = json.loads(ok.requests[0]["body"])
    assert body["action"] == "webhook.test" and "test message" in body["text"]
    proc = cli("webhooks", "test", "bad", "--json", check=1)
    out = json.loads(proc.out)
    assert out["ok"] is False and out["status"] == 500 and out["attempts"] == 1
    assert len(bad.requests) == 1                  # a test is one attempt, now
    tests = [e for e in audit_entries(home) if e["action"] == "webhook.test"]
    assert [(e["name"], e["ok"], e["status"]) for e in tests] == [("good", True, 200), ("bad", False, 500)]
    logged = [d for d in deliveries(home) if d["test"]]
    assert [(d["hook"], d["ok"]) for d in logged] == [("good", True), ("bad", False)]
    err = cli("webhooks", "test", "nobody", check=1).err
    assert err.strip() == "overlord: no webhook named nobody (overlord webhooks list)"


def test_a_star_hook_hears_every_act_but_tests(cli, home, receiver):
    r = receiver(200)
    add(cli, "all", r.url, "--on", "*", "--allow-private", "--format", "json")
    cli("webhooks", "test", "all", check=0)              # delivered directly, once
    act(cli)
    await_(lambda: len(r.requests) == 3)
    wait_idle(home)
    assert [b["action"] for b in r.bodies()] == ["webhook.add", "webhook.test", "webhook.base_url"]
    assert [b.get("test") for b in r.bodies()] == [None, True, None]


# -- the records --------------------------------------------------------------------------------

def test_no_secret_in_any_record_or_listing(cli, home, receiver):
    ok, bad = receiver(200), receiver(403)
    secret = "S3CRET-never-written-anywhere-but-webhooks.json"
    path_token = "T0001/B0002/XyZtokenInThePath"
    add(cli, "ok", ok.url.replace("/hook", "/" + path_token), "--allow-private", "--secret-stdin",
        "--on", "webhook.base_url", input=secret.encode())
    add(cli, "bad", bad.url.replace("/hook", "/" + path_token), "--allow-private", "--secret-stdin",
        "--on", "webhook.base_url", input=secret.encode())
    act(cli)
    cli("webhooks", "test", "ok", check=0)
    await_(lambda: len(outcomes_for(home, "webhook.base_url")) == 2)
    wait_idle(home)
    conf = home / "webhooks.json"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert secret in conf.read_text()
    for p in [home / "audit.jsonl", *sorted((home / "notify").iterdir())]:
        data = p.read_bytes()
        assert secret.encode() not in data, p
        assert path_token.encode() not in data, p
    assert stat.S_IMODE((home / "notify").stat().st_mode) == 0o700
    for name in ("queue.jsonl", "deliveries.jsonl"):
        assert stat.S_IMODE((home / "notify" / name).stat().st_mode) == 0o600
    for args in (("list",), ("list", "--json"), ("deliveries",), ("deliveries", "--json")):
        out = cli("webhooks", *args, check=0).out
        assert secret not in out
    listed = json.loads(cli("webhooks", "list", "--json", check=0).out)
    assert [h["secret"] for h in listed["hooks"]] == ["set", "set"]
    d = json.loads(cli("webhooks", "deliveries", "--json", check=0).out)
    assert {x["hook"]: x["ok"] for x in d if not x["test"]} == {"ok": True, "bad": False}
    # newest first (the act's background deliveries may land before or after the test's)
    assert [x["ts"] for x in d] == sorted((x["ts"] for x in d), reverse=True)
    assert [x["hook"] for x in d if x["test"]] == ["ok"]
    assert all(x["host"] == "127.0.0.1" for x in d)


def test_the_delivery_log_keeps_the_last_500(home):
    from overlord.trust import notify
    for i in range(notify.KEEP + 20):
        notify._log(notify._outcome("h", {"action": "session.open", "seq": i}, str(i), "x",
                                    1, True, 200, None))
    lines = (home / "notify" / "deliveries.jsonl").read_text().splitlines()
    assert len(lines) == notify.KEEP
    assert json.loads(lines[0])["seq"] == 20 and json.loads(lines[-1])["seq"] == notify.KEEP + 19
    assert [d["seq"] for d in notify.deliveries(3)] == [519, 518, 517]


def test_a_removed_hook_drops_what_was_spooled_for_it(home, monkeypatch, receiver):
    from overlord import ops
    from overlord.trust import notify
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.01")
    r = receiver(200)
    ops.webhook_add("h", r.url, on=["session.open"], allow_private=True)
    entry = append()
    await_(lambda: outcomes_for(home))
    wait_idle(home)
    notify.enqueue(entry, ["h"])          # as if spooled just before the rm
    ops.webhook_remove("h")
    notify.run_sender()
    assert len(r.requests) == 1
    assert outcomes_for(home)[-1]["error"] == "the webhook was removed before delivery"


# -- at least once, one sender ------------------------------------------------------------------

def _senders(home):
    """Pids of the notify senders of this OVERLORD_HOME (this test started them)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(b"overlord.trust.notify" in part for part in cmd) and f"OVERLORD_HOME={home}".encode() in env:
            out.append(int(pid))
    return out


def test_a_killed_sender_leaves_the_spool_to_the_next(home, monkeypatch, receiver):
    from overlord import ops
    monkeypatch.setenv("OVERLORD_NOTIFY_BACKOFF", "0.01")
    monkeypatch.setenv("OVERLORD_NOTIFY_TIMEOUT", "10")
    hang = receiver(hang=True)
    ops.webhook_add("h", hang.url, fmt="json", on=["session.open"], allow_private=True)
    first = append(n=1)
    await_(lambda: hang.requests, what="the first attempt")
    pids = await_(lambda: _senders(home), what="the sender")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    await_(lambda: sender_idle(home), what="the lock let go")
    assert outcomes_for(home) == []
    assert ops.webhook_list()["queued"] == 1
    good = receiver(200)
    ops.webhook_remove("h")
    ops.webhook_add("h", good.url, fmt="json", on=["session.open"], allow_private=True)
    second = append(n=2)
    await_(lambda: len(outcomes_for(home, "session.open")) == 2)
    wait_idle(home)
    assert [b["seq"] for b in good.bodies()] == [first["seq"], second["seq"]]
    assert ops.webhook_list()["queued"] == 0
    assert (home / "notify" / "queue.jsonl").stat().st_size == 0       # emptied once all done


WORKER = """
import sys
from overlord.trust import audit
for i in range(int(sys.argv[1])):
    audit.append("session.open", sid="20261201-074714-3fa2c1", worker=sys.argv[2], n=i)
"""


def test_concurrent_acts_are_each_delivered_by_one_sender(home, receiver):
    from overlord import ops
    r = receiver(200)
    ops.webhook_add("h", r.url, fmt="json", on=["session.open"], allow_private=True)
    env = dict(os.environ, OVERLORD_HOME=str(home), PYTHONPATH=REPO, **FAST)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, "10", str(w)], env=env)
             for w in range(5)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    await_(lambda: len(outcomes_for(home, "session.open")) == 50, timeout=120)
    wait_idle(home)
    seqs = sorted(b["seq"] for b in r.bodies())
    assert all(o["ok"] and o["attempts"] == 1 for o in outcomes_for(home)), outcomes_for(home)
    assert seqs == sorted(e["seq"] for e in audit_entries(home) if e["action"] == "session.open")
    assert len(seqs) == 50 == len(set(seqs))
    assert r.most_active == 1                       # one sender, one request at a time
    assert all(o["ok"] for o in outcomes_for(home))


def test_with_no_webhooks_an_act_costs_a_stat_and_loads_nothing(home):
    probe = ("import os, sys; from overlord.trust import audit; "
             "audit.append('session.open', sid='20261201-074714-3fa2c1'); "
             "print(sorted(sys.modules))")
    env = dict(os.environ, OVERLORD_HOME=str(home), PYTHONPATH=REPO)
    mods = eval(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                               env=env, check=True).stdout)      # noqa: S307 - our own probe's list
    assert "overlord.trust.notify" in mods
    assert not (home / "notify").exists() and not (home / "webhooks.json").exists()
    # the module alone (imported on every append) brings in nothing heavy
    probe = ("import sys, json, os; before = set(sys.modules); import overlord.trust.notify; "
             "print(sorted(set(sys.modules) - before))")        # (audit.py imports json and os)
    mods = eval(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                               env=env, check=True).stdout)      # noqa: S307
    assert [m for m in mods if not m.startswith("overlord")] == []
    assert [m for m in mods if m.startswith("overlord")] == ["overlord", "overlord.trust", "overlord.trust.notify"]


def test_https_goes_to_the_checked_address_with_sni_and_a_verified_certificate(
        cli, home, tmp_path, monkeypatch, receiver):
    """https: the socket to the checked address is wrapped with the default context, the
    server name (SNI) and the certificate check naming the URL's host."""
    import socket
    import ssl
    from conftest import require_tool
    from overlord.trust import notify
    require_tool("openssl")
    cli("tls", "selfsign", "--host", "hooks.test", "--out", tmp_path / "tls", check=0)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "tls" / "cert.pem", tmp_path / "tls" / "key.pem")
    names = []
    ctx.sni_callback = lambda sock, name, _ctx: names.append(name)
    r = receiver(200, tls=ctx)
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **kw: real(
        "127.0.0.1" if host in ("hooks.test", "other.test") else host, *a, **kw))
    entry = {"action": "session.open", "sid": SID}
    hook = {"url": f"https://hooks.test:{r.port}/in", "format": "json", "on": ["*"],
            "secret": None, "allow_private": True}
    untrusted = notify.send("h", hook, entry, None)          # self-signed: not trusted
    assert not untrusted["ok"] and untrusted["retry"] and "TLS with hooks.test failed" in untrusted["error"]
    assert r.requests == []
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "tls" / "cert.pem"))
    trusted = notify.send("h", hook, entry, None)
    assert trusted["ok"], trusted
    assert names[-1] == "hooks.test"
    assert r.requests[0]["headers"]["host"] == f"hooks.test:{r.port}"
    wrong = notify.send("h", dict(hook, url=f"https://other.test:{r.port}/in"), entry, None)
    assert not wrong["ok"] and "TLS with other.test failed" in wrong["error"]   # not its certificate
    assert len(r.requests) == 1
