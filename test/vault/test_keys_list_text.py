"""`overlord keys list` (text) names the vault's reference: `vault (providers/<provider>)`."""
import pytest

from vaultlib import resolver  # noqa: F401 (fixture; puts test/agent on the path first)
from agentlib import AgentOvl  # noqa: E402
from overlord.agent import keys

NO_KEYS = {var: "" for var in keys.ENV.values()}


@pytest.fixture
def cli(home):
    return AgentOvl(home)


def rows(proc):
    return dict(line.split(None, 1) for line in proc.out.splitlines() if line.strip())


def test_keys_list_names_the_vault_reference(cli, home, resolver):
    before = rows(cli("keys", "list", env=NO_KEYS, check=0))
    assert before["anthropic"] == "-"
    cli("secrets", "set-command", resolver.command, check=0)
    cli("keys", "set", "openai", input=b"sk-stored-value-1\n", env=NO_KEYS, check=0)
    got = rows(cli("keys", "list", env=NO_KEYS, check=0))
    assert got["anthropic"] == "vault (providers/anthropic)"
    assert got["openai"] == "store"
    assert resolver.calls() == []                     # listing never runs the resolver
    env = dict(NO_KEYS, ANTHROPIC_API_KEY="sk-env-1")
    assert rows(cli("keys", "list", env=env, check=0))["anthropic"] == "env"
