"""ops.notify.ACTIONS: what a hook may subscribe to (every audited act, and "*"), beside
FORMATS and DEFAULT_ON; the web's list of acts comes from it (without "*", offered apart)."""
from overlord.ops import notify as ops_notify
from overlord.trust import audit
from overlord.web import running


def test_actions_are_the_audit_acts_and_every():
    assert set(ops_notify.ACTIONS) == set(audit.ACTIONS) | {"*"}
    assert len(ops_notify.ACTIONS) == len(set(ops_notify.ACTIONS))
    assert set(ops_notify.DEFAULT_ON) <= set(ops_notify.ACTIONS)
    assert "session.needs_review" in ops_notify.ACTIONS and "budget.stop" in ops_notify.ACTIONS


def test_web_lists_them_without_every():
    got = running.audit_actions()
    assert got == sorted(audit.ACTIONS) and "*" not in got
    # a listing that names its own acts wins
    assert running.audit_actions({"actions": ["b.x", "a.y", "*"]}) == ["a.y", "b.x"]


def test_every_listed_act_is_accepted_by_a_hook(home):
    for act in ops_notify.ACTIONS:
        ops_notify.webhook_add("h", "https://example.com/hook", on=(act,))
        ops_notify.webhook_remove("h")
