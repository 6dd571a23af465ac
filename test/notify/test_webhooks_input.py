"""`overlord webhooks` refusing bad input with one line, nothing written; a secret never taken
from argv (nor echoed); a damaged or exposed config refused while the act it would tell of
still happens; a `secret://NAME` signing secret resolved by the vault at send time."""
import json
import os
import stat
import sys

import pytest

from notifylib import audit_entries, await_, cli, receiver, verify, wait_idle  # noqa: F401


def snapshot(home):
    """Every file under OVERLORD_HOME with its bytes: to prove a refusal changed nothing."""
    out = {}
    for base, _dirs, files in os.walk(home):
        for name in files:
            p = os.path.join(base, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, home)] = f.read()
    return out


@pytest.fixture
def configured(cli, home):
    cli("webhooks", "add", "first", "https://hooks.example.com/x", check=0)
    return snapshot(home)


@pytest.mark.parametrize("url", [
    "ftp://hooks.example.com/x", "file:///etc/passwd", "hooks.example.com/x", "http://",
    "https:///path", "javascript:alert(1)", "http://exa mple.com/", "http://example.com/\nX: y",
    "http://example.com:99999/", "http://example.com:port/", "gopher://example.com/", ""])
def test_a_url_that_is_not_http_with_a_host_is_a_usage_error(cli, home, configured, url):
    proc = cli("webhooks", "add", "second", url, check=2)
    assert proc.err.startswith("overlord: webhook URL must be http:// or https:// with a host")
    assert len(proc.err.strip().splitlines()) == 1 and "Traceback" not in proc.err
    assert snapshot(home) == configured


def test_credentials_in_the_url_are_refused_and_not_echoed(cli, home, configured):
    proc = cli("webhooks", "add", "second", "https://bob:hunter2pw@hooks.example.com/x", check=2)
    assert "must not carry a user or password" in proc.err
    assert "hunter2pw" not in proc.err and "hunter2pw" not in proc.out
    assert snapshot(home) == configured


@pytest.mark.parametrize("args, code, says", [
    (["--on", "session.nope"], 2, "--on session.nope: not an audited act"),
    (["--on", "session.commit", "--on", "Session.Open"], 2, "--on Session.Open: not an audited act"),
    (["--on", ""], 2, "not an audited act"),
    (["--format", "xml"], 2, "invalid choice: 'xml'"),
])
def test_unknown_acts_and_formats_are_refused(cli, home, configured, args, code, says):
    proc = cli("webhooks", "add", "second", "https://hooks.example.com/y", *args, check=code)
    assert says in proc.err and "Traceback" not in proc.err
    assert snapshot(home) == configured


@pytest.mark.parametrize("name", ["-x", "a b", "a/b", "..", "x" * 65, "é", "a;b"])
def test_a_bad_name_is_refused(cli, home, configured, name):
    proc = cli("webhooks", "add", "--", name, "https://hooks.example.com/y", check=None)
    assert proc.returncode == 2, proc.err
    assert "Traceback" not in proc.err
    assert snapshot(home) == configured


def test_a_name_in_use_is_refused(cli, home, configured):
    proc = cli("webhooks", "add", "first", "https://other.example.com/", check=1)
    assert proc.err.strip() == ("overlord: a webhook named first exists (remove it first: "
                                "overlord webhooks rm first)")
    assert snapshot(home) == configured


@pytest.mark.parametrize("form", [["--secret", "hunter2-on-argv"], ["--secret=hunter2-on-argv"],
                                  ["--secret"]])
def test_a_secret_on_argv_is_refused_without_echo(cli, home, configured, form):
    proc = cli("webhooks", "add", "second", "https://hooks.example.com/y", *form, check=2)
    assert proc.err.strip() == ("overlord: a webhook secret is never taken from the command "
                                "line: pipe it to --secret-stdin")
    assert "hunter2" not in proc.out + proc.err
    assert snapshot(home) == configured


@pytest.mark.parametrize("stdin, says", [(b"", "no webhook secret on stdin"),
                                         (b"   \n", "no webhook secret on stdin"),
                                         (b"one\ntwo\n", "one line on stdin"),
                                         (b"has\x01control\n", "one line of at most")])
def test_a_bad_secret_on_stdin_is_refused(cli, home, configured, stdin, says):
    proc = cli("webhooks", "add", "second", "https://hooks.example.com/y", "--secret-stdin",
               input=stdin, check=2)
    assert says in proc.err
    assert snapshot(home) == configured


def test_base_url_and_rm_and_deliveries_refuse_bad_input(cli, home, configured):
    assert "base URL must be http" in cli("webhooks", "base-url", "ftp://x/", check=2).err
    assert "URL or --clear, not both" in cli("webhooks", "base-url", "https://a/", "--clear", check=2).err
    assert cli("webhooks", "rm", "nobody", check=1).err.strip() == \
        "overlord: no webhook named nobody (overlord webhooks list)"
    assert "limit must be 1..500" in cli("webhooks", "deliveries", "-n", "0", check=2).err
    assert "limit must be 1..500" in cli("webhooks", "deliveries", "-n", "501", check=2).err
    assert snapshot(home) == configured


def test_add_list_rm_and_the_audit_trail(cli, home):
    out = json.loads(cli("webhooks", "add", "team", "https://hooks.example.com/T/B/tok",
                         "--on", "budget.stop", "--on", "session.commit", "--on", "budget.stop",
                         "--json", check=0).out)
    assert out["on"] == ["budget.stop", "session.commit"] and out["format"] == "slack"
    assert out["secret"] is None and out["allow_private"] is False
    out = json.loads(cli("webhooks", "add", "dflt", "http://hooks.example.com/", "--json", check=0).out)
    assert out["on"] == ["session.needs_review", "connector.approval_requested"]
    cli("webhooks", "base-url", "https://ovl.example.com///", check=0)
    listed = json.loads(cli("webhooks", "list", "--json", check=0).out)
    assert [h["name"] for h in listed["hooks"]] == ["dflt", "team"]
    assert listed["base_url"] == "https://ovl.example.com" and listed["queued"] == 0
    text = cli("webhooks", "list", check=0).out
    assert "team" in text and "budget.stop,session.commit" in text and "unsigned" in text
    cli("webhooks", "rm", "team", check=0)
    cli("webhooks", "base-url", "--clear", check=0)
    assert json.loads(cli("webhooks", "base-url", "--json", check=0).out) == {"base_url": None}
    acts = [(e["action"], e.get("name"), e.get("host"), e.get("url")) for e in audit_entries(home)
            if e["action"].startswith("webhook.")]
    assert acts == [("webhook.add", "team", "hooks.example.com", None),
                    ("webhook.add", "dflt", "hooks.example.com", None),
                    ("webhook.base_url", None, None, "https://ovl.example.com"),
                    ("webhook.remove", "team", None, None),
                    ("webhook.base_url", None, None, None)]
    # the URL's path (a Slack URL's token) is not on the audit chain
    assert b"/T/B/tok" not in (home / "audit.jsonl").read_bytes()
    conf = home / "webhooks.json"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600


def test_an_exposed_config_is_refused_and_the_act_still_happens(cli, home):
    cli("webhooks", "add", "team", "https://hooks.example.com/x", "--on", "webhook.base_url", check=0)
    conf = home / "webhooks.json"
    os.chmod(conf, 0o644)
    err = cli("webhooks", "list", check=1).err
    assert err.startswith("overlord: refusing the webhook config") and "chmod 600" in err
    # the act it would tell of is not failed by it (and spools nothing)
    before = len(audit_entries(home))
    from overlord.trust import audit
    audit.append("webhook.base_url", url=None)
    assert len(audit_entries(home)) == before + 1
    assert not (home / "notify" / "queue.jsonl").exists()
    conf.write_text("{not json")
    os.chmod(conf, 0o600)
    assert "is damaged (not JSON)" in cli("webhooks", "list", check=1).err
    audit.append("webhook.base_url", url=None)
    assert len(audit_entries(home)) == before + 2


def test_help_says_where_state_lives(cli):
    out = cli("webhooks", "--help", check=0).out
    assert "webhooks.json" in out and "docs/WEBHOOKS.md" in out
    for sub in ("add", "list", "test", "rm", "base-url", "deliveries"):
        assert cli("webhooks", sub, "--help", check=0).returncode == 0
    assert "--secret-stdin" in cli("webhooks", "add", "--help", check=0).out
    assert "--secret " not in cli("webhooks", "add", "--help", check=0).out


RESOLVER = """import sys
values = {"hooks/team": "vault-held-Signing-Secret-5c1f"}
name = sys.argv[1]
if name not in values:
    sys.stderr.write("no such secret\\n")
    sys.exit(3)
sys.stdout.write(values[name] + "\\n")
"""


def test_a_secret_reference_is_resolved_by_the_vault_at_send_time(cli, home, receiver, tmp_path):
    r = receiver(200)
    script = tmp_path / "resolver.py"
    script.write_text(RESOLVER)
    cli("secrets", "set-command", f"{sys.executable} {script} {{name}}", check=0)
    cli("webhooks", "add", "team", r.url, "--format", "json", "--allow-private",
        "--on", "webhook.base_url", "--secret-stdin", input=b"secret://hooks/team\n", check=0)
    listed = json.loads(cli("webhooks", "list", "--json", check=0).out)
    assert listed["hooks"][0]["secret"] == "secret://hooks/team"
    cli("webhooks", "base-url", "https://ovl.example.com", check=0)
    await_(lambda: r.requests)
    wait_idle(home)
    req = r.requests[0]
    assert verify("vault-held-Signing-Secret-5c1f", req["headers"]["x-overlord-signature"], req["body"])
    assert not verify("secret://hooks/team", req["headers"]["x-overlord-signature"], req["body"])
    resolved = [e for e in audit_entries(home) if e["action"] == "secret.resolve"]
    assert resolved and resolved[0].get("what") == "webhook team"
    for base, _dirs, files in os.walk(home):
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                assert b"vault-held-Signing-Secret" not in f.read(), name
    # a reference the resolver cannot answer: not delivered, said so, the act unharmed
    cli("webhooks", "add", "broken", r.url, "--allow-private", "--on", "webhook.base_url",
        "--secret-stdin", input=b"secret://hooks/missing\n", check=0)
    cli("webhooks", "base-url", "https://ovl2.example.com", check=0)
    wait_idle(home)
    from notifylib import outcomes_for
    [bad] = outcomes_for(home, hook="broken")
    assert not bad["ok"] and "could not be resolved" in bad["error"] and "secret://hooks/missing" in bad["error"]
