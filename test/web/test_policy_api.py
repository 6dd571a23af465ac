"""Policy from the web face: the workspace starts its agent through ops.agent, so the grants in
Settings are held to the folder's policy exactly as the CLI's flags are. A request looser than
policy (or any request under a broken policy file) is refused with the rule named, and no
session is opened."""
import json
import os

import pytest

from weblib import ui  # noqa: F401 -- the fixture


@pytest.fixture
def demo(ui):                      # noqa: F811
    ui.ok("PUT", "/api/settings", {"provider": "scripted"})     # the bundled demo: no key, no server
    return ui


def refused(ui, home, says):
    r = ui.post("/api/chats", {"message": "make a plan"})
    assert r.status == 409, (r.status, r.body)
    assert says in r.json["error"], r.json
    assert "\n" not in r.json["error"]
    assert not os.listdir(home / "sessions") if (home / "sessions").exists() else True


@pytest.mark.parametrize("sandbox,rule,says", [
    ({"jail": True, "net": "host"}, {"net": "none"},
     "allows at most net: none; this request asked for net: host"),
    ({"jail": False, "net": "host"}, {"jail": True},
     "forces jail: true; this request asked for jail: false"),
])
def test_settings_looser_than_policy_are_refused(demo, home, target, sandbox, rule, says):
    demo.ok("PUT", "/api/settings", {"sandbox": sandbox})
    (home / "policy.json").write_text(json.dumps({"targets": {str(target): rule}}))
    refused(demo, home, f"policy targets[{target}] {says}")


def test_a_broken_policy_refuses_the_workspace_agent(demo, home):
    (home / "policy.json").write_text(json.dumps({"default": {"net": "offline"}}))
    refused(demo, home, f"policy {home / 'policy.json'}: default.net must be one of")
