"""The SSO client secret from the vault: `overlord sso set --client-secret-stdin` takes
`secret://NAME`, stored as the reference (nothing resolved at configure time); the token
exchange resolves it -- our provider of test_oidc checks the client_secret_basic header it is
sent, and the real oidc-provider-mock signs a person in with it. (test/auth runs as root.)"""
import json
import os
import sys
import urllib.parse

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "vault"))

from conftest import Ovl  # noqa: E402
from oidcmock import authorize_without_browser, start_mock  # noqa: E402
from test_oidc import CALLBACK, CID, Provider, _token_for, keys  # noqa: E402,F401 (a fixture)
from vaultlib import VALUES, assert_nowhere, audit_lines, resolver  # noqa: E402,F401

from overlord.errors import UsageError  # noqa: E402
from overlord.trust import oidc, vault  # noqa: E402
from overlord.trust.oidc import SSOError  # noqa: E402

REF = "secret://sso/client"           # the store holds "s:cret", what Provider wants


@pytest.fixture(autouse=True)
def clean(home):
    vault.forget()
    yield
    vault.forget()
    assert_nowhere(home)


@pytest.fixture
def provider(home, keys, resolver):    # noqa: F811 -- keys: test_oidc's fixture
    vault.set_command(resolver.command)
    p = Provider()
    p.keys = [keys["rsa"]]
    p.make_token = _token_for(p, keys["rsa"])
    yield p
    p.close()


def finish(p, flows=None):
    flows = flows or oidc.Flows()
    url, binding = flows.start(CALLBACK, "/")
    query, _ = p.authorize(url)
    return flows.finish(query, binding, CALLBACK)


def test_the_cli_stores_the_reference_and_resolves_nothing(home, resolver):
    cli = Ovl(home)
    cli("secrets", "set-command", resolver.command, check=0)
    proc = cli("sso", "set", "--issuer", "https://login.example.com", "--client-id", CID,
               "--client-secret-stdin", "--domain", "example.com", input=f"{REF}\n".encode(),
               check=0)
    assert "single sign-on set" in proc.out
    assert json.loads((home / "sso.json").read_text())["client_secret"] == REF
    assert json.loads(cli("sso", "show", "--json", check=0).out)["client_secret"] == "********"
    assert resolver.calls() == []
    bad = cli("sso", "set", "--issuer", "https://login.example.com", "--client-id", CID,
              "--client-secret-stdin", input=b"secret://../etc/shadow\n")
    assert bad.returncode == 2 and "not one" in bad.err and bad.err.count("\n") == 1
    assert json.loads((home / "sso.json").read_text())["client_secret"] == REF


def test_the_token_exchange_sends_the_resolved_secret(home, provider, resolver):
    oidc.configure(provider.issuer, CID, REF, domains=["example.com"])
    assert resolver.calls() == []
    ident = finish(provider)
    assert ident.email == "alice@example.com"
    import base64
    want = "Basic " + base64.b64encode(f"{CID}:s%3Acret".encode()).decode()
    assert provider.seen[-1]["authorization"] == want
    assert resolver.calls() == [["sso/client"]]
    finish(provider)                                  # the second sign-in: from the cache
    assert resolver.calls() == [["sso/client"]]
    line = audit_lines(home, "secret.resolve")[-1]
    assert (line["name"], line["what"], line["ok"]) == ("sso/client", "sso client secret", True)


def test_a_failing_reference_refuses_the_sign_in_before_the_token_request(home, provider):
    oidc.configure(provider.issuer, CID, "secret://sso/gone", domains=["example.com"])
    with pytest.raises(SSOError) as e:
        finish(provider)
    assert str(e.value) == "the client secret: secret://sso/gone: the resolver exited 3"
    assert e.value.http_status == 502 and provider.seen == []
    refused = audit_lines(home, "sso.refused")
    assert refused and "no secret named" not in json.dumps(refused)


def test_a_malformed_reference_is_refused_at_configure(home):
    with pytest.raises(UsageError, match="not one"):
        oidc.configure("https://login.example.com", CID, "secret://a/../b", domains=["example.com"])
    assert not (home / "sso.json").exists()


def test_the_real_provider_signs_in_with_the_secret_from_the_vault(home, resolver):
    vault.set_command(resolver.command)
    with start_mock() as idp:
        oidc.configure(idp.issuer, CID, REF, domains=["example.com"])
        idp.set_user("sub-bob", {"email": "bob@example.com", "email_verified": True})
        flows = oidc.Flows()
        url, binding = flows.start(CALLBACK, "/after")
        location = authorize_without_browser(url, "sub-bob")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
        ident = flows.finish(query, binding, CALLBACK)
    assert ident.email == "bob@example.com"
    assert resolver.calls() == [["sso/client"]]
