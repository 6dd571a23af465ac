"""The rate-limit record: headers merged per provider, atomically, 0600; fed by a real call."""
import json
import os
import stat


from fakes import KEY, AnthropicFake, quick  # noqa: F401
from overlord.agent import ratelimit
from overlord.agent.providers import anthropic
from overlord.agent.providers.base import Endpoint


def test_record_merges_per_provider(quick):
    ratelimit.record("anthropic", {"Anthropic-Ratelimit-Requests-Remaining": "5",
                                   "content-type": "text/plain"})
    ratelimit.record("anthropic", {"anthropic-ratelimit-tokens-remaining": "900", "retry-after": "3"})
    ratelimit.record("openai", {"x-ratelimit-remaining-requests": "7"})
    ratelimit.record("gemini", {"server": "x"})               # nothing to keep: no entry
    data = ratelimit.load()
    assert data["anthropic"]["headers"] == {"anthropic-ratelimit-requests-remaining": "5",
                                            "anthropic-ratelimit-tokens-remaining": "900",
                                            "retry-after": "3"}
    assert data["openai"]["headers"] == {"x-ratelimit-remaining-requests": "7"}
    assert "gemini" not in data and data["anthropic"]["at"].endswith("Z")
    assert stat.S_IMODE(os.stat(ratelimit.path()).st_mode) == 0o600


def test_a_call_feeds_the_record(quick):
    fake = AnthropicFake()
    try:
        fake.queue(fake.turn(text="hi"))
        endpoint = Endpoint("anthropic", model=fake.MODEL, base_url=fake.url, api_key=KEY)
        anthropic.complete(endpoint, "", [{"role": "user", "content": "hi"}], [],
                           on_headers=ratelimit.record)
    finally:
        fake.close()
    assert fake.problems == []
    with open(ratelimit.path()) as f:
        saved = json.load(f)
    assert saved["anthropic"]["headers"]["anthropic-ratelimit-requests-remaining"] == "49"


def test_unwritable_home_never_fails_a_call(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLORD_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a directory")
    ratelimit.record("openai", {"x-ratelimit-remaining-requests": "1"})   # no exception
    assert ratelimit.load() == {}
