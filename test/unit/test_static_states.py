"""The web's static files keep up with the records: every session state has its pill and dot
(the state `imported` too), and both key-status lines say where a vault key comes from."""
import os
import re

from overlord.txn import store

STATIC = os.path.join(os.path.dirname(__file__), "..", "..", "overlord", "web", "static")


def _read(name):
    with open(os.path.join(STATIC, name), encoding="utf-8") as f:
        return f.read()


def test_every_state_has_a_pill_and_a_dot():
    css = _read("app.css")
    for kind in ("pill", "dot"):
        styled = set(re.findall(rf"\.{kind}\.state-([a-z-]+)", css))
        missing = [s for s in store.STATES if s != "running" or kind == "pill"
                   if s not in styled]
        assert missing == [], (kind, missing)


def test_key_status_names_the_vault():
    js = _read("workspace.js")
    lines = re.findall(r'src === "vault" \? `The key comes from the vault \(providers/\$\{[a-z.]+\}\)', js)
    assert len(lines) == 2, lines
    for src in ("env", "store"):
        assert js.count(f'src === "{src}"') == 2
