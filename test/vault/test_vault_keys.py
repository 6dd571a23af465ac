"""Provider keys from the vault: a secret:// value in keys.json or the environment resolved at
use, the providers/<provider> convention when no key is anywhere, `keys list` saying so without
running the resolver, an account's own key never a reference -- and the key arriving in the
auth header of a real call to a local fake provider (models, and an agent run)."""
import json
import os

import pytest

from vaultlib import VALUES, assert_nowhere, audit_lines, resolver  # noqa: F401 (paths first)
from agentlib import AgentOvl, require  # noqa: E402
from fakes import AnthropicFake, ResponsesFake  # noqa: E402
from overlord.agent import keys
from overlord.errors import OverlordError, UsageError
from overlord.trust import vault

NO_KEYS = {var: "" for var in keys.ENV.values()}


@pytest.fixture(autouse=True)
def clean(home, monkeypatch):
    for var in keys.ENV.values():
        monkeypatch.delenv(var, raising=False)
    vault.forget()
    yield
    vault.forget()
    assert_nowhere(home)


@pytest.fixture
def ready(resolver):
    vault.set_command(resolver.command)
    return resolver


def test_a_stored_reference_is_resolved_at_use_and_stays_a_reference_on_disk(home, ready):
    keys.set("anthropic", "secret://keys/anthropic")
    assert json.loads((home / "keys.json").read_text()) == {"anthropic": "secret://keys/anthropic"}
    assert ready.calls() == []                                  # storing runs nothing
    assert keys.resolve("anthropic") == (VALUES["keys/anthropic"], "store")
    assert keys.get("anthropic") == VALUES["keys/anthropic"]
    assert ready.calls() == [["keys/anthropic"]]                # the second use: the cache
    line = audit_lines(home, "secret.resolve")[-1]
    assert line["what"] == "provider key anthropic (keys.json)" and line["ok"] is True


def test_an_environment_reference_is_resolved_too(home, ready, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "secret://providers/openai")
    assert keys.resolve("openai") == (VALUES["providers/openai"], "env")
    assert audit_lines(home, "secret.resolve")[-1]["what"] == "provider key openai (OPENAI_API_KEY)"


def test_a_reference_inside_a_longer_value_is_the_key_itself(ready, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "x-secret://providers/openai")
    assert keys.resolve("gemini") == ("x-secret://providers/openai", "env")
    assert ready.calls() == []


def test_no_key_anywhere_asks_the_vault_for_providers_provider(home, ready):
    assert keys.resolve("anthropic") == (VALUES["providers/anthropic"], "vault")
    assert ready.calls() == [["providers/anthropic"]]
    assert audit_lines(home, "secret.resolve")[-1]["what"] == "provider key anthropic"
    keys.set("anthropic", "sk-file-wins")                       # a key in a file comes first
    assert keys.resolve("anthropic") == ("sk-file-wins", "store")


def test_without_a_resolver_there_is_simply_no_key(resolver):
    assert keys.resolve("anthropic") == (None, None)
    assert keys.listing()["anthropic"] is None and resolver.calls() == []


def test_a_provider_the_vault_does_not_hold_is_a_clean_error_naming_the_reference(ready):
    with pytest.raises(OverlordError) as e:
        keys.resolve("gemini")
    assert str(e.value) == ("secret://providers/gemini: the resolver exited 3 (no secret named "
                            "providers/gemini) (no gemini key in keys.json or GEMINI_API_KEY; "
                            "the vault was asked for providers/gemini)")
    # a provider whose key is optional (a local OpenAI-compatible server) just has none
    assert keys.resolve("openai-compatible") == (None, None)


def test_listing_says_vault_without_running_the_resolver(ready, monkeypatch):
    keys.set("gemini", "secret://keys/anthropic")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert keys.listing() == {"anthropic": "vault", "openai": "env", "azure": "vault",
                              "openai-compatible": "vault", "gemini": "store"}
    assert ready.calls() == []


def test_a_damaged_resolver_file_never_breaks_the_listing(home, ready):
    (home / "secrets.json").write_text("{")
    assert keys.listing()["anthropic"] is None
    with pytest.raises(OverlordError, match="damaged"):
        keys.resolve("anthropic")


def test_an_accounts_own_key_is_never_a_reference(home, ready):
    with pytest.raises(UsageError, match="own key cannot be a secret:// reference"):
        keys.set("anthropic", "secret://providers/anthropic", owner="alice")
    keys.set("anthropic", "sk-alice-own", owner="alice")
    # written by hand (or before): refused at use, the machine's key not handed out as "own"
    path = home / "users" / "alice" / "keys.json"
    path.write_text(json.dumps({"anthropic": "secret://providers/anthropic"}))
    with pytest.raises(OverlordError, match="account alice is a secret:// reference"):
        keys.resolve("anthropic", owner="alice")
    assert ready.calls() == []
    # with no key of its own the account gets the machine's vault key, as a shared key
    path.write_text("{}")
    assert keys.resolve("anthropic", owner="alice") == (VALUES["providers/anthropic"], "vault")


def test_the_vault_key_goes_only_to_the_providers_own_endpoint_for_an_account(home, ready):
    import importlib
    from overlord.agent import providers
    ops_agent = importlib.import_module("overlord.ops.agent")   # (ops.agent is the operation)
    own = providers.default_base_url("anthropic")
    assert ops_agent._key_for("anthropic", own, owner="alice") == VALUES["providers/anthropic"]
    with pytest.raises(OverlordError) as e:
        ops_agent._key_for("anthropic", "http://127.0.0.1:9/evil", owner="alice")
    assert e.value.http_status == 403 and "shared key" in str(e.value)


def test_a_malformed_reference_is_refused_at_set(home, ready):
    with pytest.raises(UsageError, match="not a valid secret reference"):
        keys.set("anthropic", "secret://../x")
    assert not (home / "keys.json").exists()


# -- a real call --------------------------------------------------------------------------------

@pytest.fixture
def cli(home):
    return AgentOvl(home)


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_models_sends_the_vault_key_in_the_auth_header(cli, home, resolver, kind):
    cli("secrets", "set-command", resolver.command, check=0)
    listed = json.loads(cli("keys", "list", "--json", env=NO_KEYS, check=0).out)
    assert listed[kind] == "vault" and resolver.calls() == []
    value = VALUES[f"providers/{kind}"]
    fake = (AnthropicFake if kind == "anthropic" else ResponsesFake)(key=value)
    fake.queue(fake.models())
    try:
        proc = cli("models", "--provider", kind, "--base-url", fake.url, "--json", env=NO_KEYS)
    finally:
        fake.close()
    assert proc.returncode == 0, proc.err
    assert fake.problems == [] and len(fake.requests) == 1
    got = fake.requests[0]["headers"]
    assert (got.get("x-api-key") if kind == "anthropic" else got.get("authorization")) == \
        (value if kind == "anthropic" else f"Bearer {value}")
    assert resolver.calls() == [[f"providers/{kind}"]]
    assert value not in proc.out + proc.err


def test_a_stored_reference_drives_a_call_and_a_failing_one_is_one_line(cli, home, resolver):
    cli("secrets", "set-command", resolver.command, check=0)
    cli("keys", "set", "anthropic", input=b"secret://keys/anthropic\n", env=NO_KEYS, check=0)
    fake = AnthropicFake(key=VALUES["keys/anthropic"])
    fake.queue(fake.models())
    try:
        cli("models", "--provider", "anthropic", "--base-url", fake.url, env=NO_KEYS, check=0)
        cli("keys", "set", "anthropic", input=b"secret://keys/gone\n", env=NO_KEYS, check=0)
        proc = cli("models", "--provider", "anthropic", "--base-url", fake.url, env=NO_KEYS)
    finally:
        fake.close()
    assert fake.problems == [] and len(fake.requests) == 1
    assert proc.returncode == 1 and proc.err == (
        "overlord: secret://keys/gone: the resolver exited 3 (no secret named keys/gone)\n")


def test_an_agent_run_with_no_key_file_at_all_uses_providers_anthropic(home, resolver, target):
    require("kernel")
    cli = AgentOvl(home, "kernel")
    cli("secrets", "set-command", resolver.command, check=0)
    value = VALUES["providers/anthropic"]
    fake = AnthropicFake(key=value)
    fake.queue(fake.turn(text="Nothing to change."))
    try:
        sid, proc = cli.agent(target, "look around", "--provider", "anthropic", "--model",
                              fake.MODEL, "--base-url", fake.url, env=NO_KEYS)
    finally:
        fake.close()
    assert proc.returncode == 0, (proc.out, proc.err)
    assert fake.problems == [] and fake.requests[0]["headers"]["x-api-key"] == value
    assert not (home / "keys.json").exists()
    assert resolver.calls() == [["providers/anthropic"]]
    assert [(a["name"], a["ok"]) for a in audit_lines(home, "secret.resolve")] == \
        [("providers/anthropic", True)]
    assert value not in proc.out + proc.err
