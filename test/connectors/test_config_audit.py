"""A connector configuration change is an audit act (connector.config) that never carries a
secret, and a broken chain refuses the change before mcp.json is touched."""
import json

from conftest import Ovl
from connlib import acts


def test_config_changes_are_audited_without_their_secrets(home):
    ovl = Ovl(home)
    ovl("mcp", "add", "gh", "--command", "gh-server", "--env", "GITHUB_TOKEN=ghp_abcdefghijklmnop1234",
        check=0)
    ovl("mcp", "add", "docs", "--url", "https://host/mcp?key=s3cr3t-value", "--header",
        "Authorization: Bearer tok-1234567890abcdef", check=0)
    ovl("mcp", "approval", "auto", check=0)
    ovl("mcp", "rm", "gh", check=0)
    got = [a for a in acts(home) if a["action"] == "connector.config"]
    assert [(a["change"], a.get("name")) for a in got] == [("add", "gh"), ("add", "docs"),
                                                          ("approval", None), ("remove", "gh")]
    assert got[0]["env"] == ["GITHUB_TOKEN"] and got[1]["headers"] == ["Authorization"]
    assert got[2]["approval"] == "auto" and got[2]["was"] == "ask"
    text = (home / "audit.jsonl").read_text()
    for secret in ("ghp_abcdefghijklmnop1234", "tok-1234567890abcdef", "s3cr3t-value"):
        assert secret not in text
    assert json.loads(ovl("audit", "verify", "--json", check=0).out)["ok"]


def test_a_broken_chain_refuses_the_change(home):
    ovl = Ovl(home)
    ovl("mcp", "add", "gh", "--command", "gh-server", check=0)
    before = (home / "mcp.json").read_bytes()
    (home / "audit.key").chmod(0o644)            # a key others may read is refused
    proc = ovl("mcp", "add", "other", "--command", "x", check=1)
    assert proc.err.startswith("overlord: ") and "audit.key" in proc.err
    assert (home / "mcp.json").read_bytes() == before


def test_doctor_shows_the_connectors_and_a_damaged_file(home):
    ovl = Ovl(home)
    ovl("mcp", "add", "gh", "--command", "gh-server", check=0)
    proc = ovl("doctor", check=None)
    assert "connectors: gh; approval ask" in proc.out
    report = json.loads(ovl("doctor", "--json", check=None).out)
    assert report["connectors"]["servers"] == ["gh"] and report["connectors"]["approval"] == "ask"
    (home / "mcp.json").write_text("{ not json")
    line = [l for l in ovl("doctor", check=None).out.splitlines() if l.startswith("connectors:")]
    assert len(line) == 1 and "mcp.json" in line[0]
