"""The agent's conditions block states the network grant as it is (issue 17): none, the
recording proxy with its allowlist and its hold, or the host's network."""
from overlord.agent import prompt


def situation(**kw):
    base = dict(provider="scripted", model="demo", base_url=None, target="/srv/app", jailed=True, backend="kernel", net="none", call_timeout=120,
                limits={}, operator="alice")
    base.update(kw)
    return prompt.Situation(**base)


def test_offline_and_host():
    assert "Network: none" in prompt.network(situation())
    assert prompt.network(situation(net="host")) == "- Network: the host's network, unrecorded."


def test_proxy_names_the_proxy_the_allowlist_and_that_tunnels_are_not_decrypted():
    line = prompt.network(situation(net="proxy", net_allow=("pypi.org", "*.pythonhosted.org")))
    assert "http://127.0.0.1:3128" in line and "ENETUNREACH" in line
    assert "`pypi.org`, `*.pythonhosted.org`" in line and "403" in line
    assert "CONNECT tunnel" in line and "Writes are held" not in line
    assert "any public host, recorded" in prompt.network(situation(net="proxy"))


def test_the_hold_is_stated_with_what_it_cannot_hold():
    line = prompt.network(situation(net="proxy", hold_writes=True))
    assert "Writes are held" in line and "202" in line and "X-Overlord-Held" in line
    assert "HTTPS tunnels cannot be held" in line
    assert prompt.network(situation(net="proxy", hold_writes=True)) in prompt.conditions(
        situation(net="proxy", hold_writes=True))
