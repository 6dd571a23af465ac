"""Through a real provider's wire protocol (the Anthropic fake): the memory section is in the
system parameter the endpoint receives, `remember` is among the tools it is offered, and its
project and user scopes behave as with the scripted provider."""
from memlib import kmem, of_type, results  # noqa: F401
from fakes import AnthropicFake


def test_the_endpoint_is_told_the_memory_and_offered_remember(kmem, target):
    (target / "OVERLORD.md").write_text("- build with `make`\n")
    fake = AnthropicFake()
    fake.queue(fake.turn(text="Noting.", calls=[
        ("remember", {"scope": "project", "note": "lint with ruff"}),
        ("remember", {"scope": "user", "note": "likes ruff"})]), fake.turn(text="Done."))
    try:
        sid, proc = kmem.agent(target, "note things", "--provider", "anthropic", "--model",
                               fake.MODEL, "--base-url", fake.url)
    finally:
        fake.close()
    assert proc.returncode == 0 and fake.problems == [], (proc.err, fake.problems)
    told = kmem.system(sid)["memory"]["text"]
    system = fake.body(0)["system"]
    system = system if isinstance(system, str) else "".join(b.get("text", "") for b in system)
    assert told and told in system and "build with `make`" in system
    assert "remember" in [t["name"] for t in fake.body(0)["tools"]]
    res = [r for r in results(kmem.events(sid)).values() if r["tool"] == "remember"]
    assert [r["result"]["is_error"] for r in res] == [False, False]
    assert kmem.diff(sid) == [("modified", "OVERLORD.md")]
    assert [p["note"] for p in of_type(kmem.events(sid), "memory_proposal")] == ["likes ruff"]
    assert kmem.memory_md() is None
