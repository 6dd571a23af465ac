"""Every HTTP provider against its fake: plain streaming, retries (429 + retry-after, 5xx, a stream
cut mid-event, a timeout), final failures that never leak the key, and unreachable endpoints."""
import email.utils
import time

import pytest

from fakes import KEY, AnthropicFake, Answer, ChatFake, GeminiFake, ResponsesFake, quick  # noqa: F401
from overlord.agent import providers
from overlord.agent.providers import azure
from overlord.agent.providers.base import Endpoint, ProviderError

pytestmark = pytest.mark.usefixtures("quick")


def _compat():
    return ChatFake(key=None, path="/v1/chat/completions", auth=None, tokens_field="max_tokens")


KITS = {
    # name: (make the fake, provider, endpoint fields given the fake)
    "anthropic": (AnthropicFake, "anthropic", lambda f: dict(base_url=f.url)),
    "openai": (ResponsesFake, "openai", lambda f: dict(base_url=f.url)),
    "openai-chat": (ChatFake, "openai", lambda f: dict(base_url=f.url, api="chat")),
    "azure": (lambda: ChatFake(path="/openai/deployments/dep-1/chat/completions", auth="api-key",
                               query={"api-version": azure.DEFAULT_API_VERSION}),
              "azure", lambda f: dict(base_url=f.url, model="dep-1")),
    "openai-compatible": (_compat, "openai-compatible",
                          lambda f: dict(base_url=f.url + "/v1", api_key=None, model="llama-test")),
    "gemini": (GeminiFake, "gemini", lambda f: dict(base_url=f.url)),
}


class Kit:
    def __init__(self, name):
        make, self.provider, self.fields = KITS[name]
        self.name, self.fake = name, make()
        self.mod = providers.get(self.provider)

    def endpoint(self, **kw):
        fields = dict(model=self.fake.MODEL, api_key=KEY)
        fields.update(self.fields(self.fake))
        fields.update(kw)
        return Endpoint(self.provider, **fields)

    def plain(self, text="Hello there, world"):
        return self.fake.turn(text=text)

    def call(self, endpoint=None, **kw):
        deltas, heads = [], []
        reply = self.mod.complete(endpoint or self.endpoint(), "You are terse.",
                                  [{"role": "user", "content": "Say hello"}], [],
                                  on_delta=lambda k, t: deltas.append((k, t)),
                                  on_headers=lambda p, h: heads.append((p, h)), **kw)
        return reply, deltas, heads


@pytest.fixture(params=sorted(KITS))
def kit(request):
    k = Kit(request.param)
    yield k
    k.fake.close()
    assert k.fake.problems == []


def text_of(deltas):
    return "".join(t for k, t in deltas if k == "text")


def test_plain_text_streams(kit):
    kit.fake.queue(kit.plain())
    reply, deltas, heads = kit.call()
    assert reply.text == "Hello there, world" == text_of(deltas)
    assert len([d for d in deltas if d[0] == "text"]) > 2          # it streamed, in pieces
    assert reply.stop_reason == "end_turn" and reply.tool_calls == []
    assert reply.usage["input_tokens"] > 0 and reply.usage["output_tokens"] > 0
    assert reply.model
    if kit.name in ("anthropic", "openai", "openai-chat", "azure", "openai-compatible"):
        assert heads and all(p == kit.provider for p, _ in heads)
        assert all(k.startswith(("anthropic-ratelimit-", "x-ratelimit-")) for _, h in heads for k in h)
    assert len(kit.fake.requests) == 1


def test_429_honours_retry_after_then_succeeds(kit, quick):
    kit.fake.queue(Answer(429, kit.fake.error(429, "rate limited"),
                          headers={"retry-after": "2", "x-ratelimit-remaining-requests": "0"}),
                   kit.plain())
    reply, deltas, heads = kit.call()
    assert reply.text == "Hello there, world"
    assert quick == [2.0]
    assert len(kit.fake.requests) == 2
    if kit.name != "gemini":
        assert heads[0][1].get("retry-after") == "2"


def test_retry_after_as_http_date(kit, quick):
    when = email.utils.formatdate(time.time() + 3, usegmt=True)
    kit.fake.queue(Answer(503, kit.fake.error(503, "busy"), headers={"retry-after": when}),
                   kit.plain())
    assert kit.call()[0].text == "Hello there, world"
    assert len(quick) == 1 and 1.0 <= quick[0] <= 3.5


def test_500_then_succeeds(kit, quick):
    kit.fake.queue(Answer(500, kit.fake.error(500, "internal")), kit.plain())
    assert kit.call()[0].stop_reason == "end_turn"
    assert len(quick) == 1 and 0 < quick[0] <= 1.0
    assert len(kit.fake.requests) == 2


@pytest.mark.parametrize("mode", ["chunk", "eof"])
def test_stream_cut_mid_event_restarts_cleanly(kit, mode):
    kit.fake.queue(kit.plain("First attempt, which breaks").cut_in(-3, mode),
                   kit.plain("Second attempt, complete"))
    reply, deltas, _ = kit.call()
    assert reply.text == "Second attempt, complete"
    kinds = [k for k, _ in deltas]
    assert "restart" in kinds
    after = deltas[kinds.index("restart") + 1:]
    assert text_of(after) == "Second attempt, complete"
    assert len(kit.fake.requests) == 2


def test_garbled_event_is_retried(kit):
    bad = kit.plain("garbled")
    bad.events = bad.events[:2] + [(None, "{not json")] + bad.events[2:]
    kit.fake.queue(bad, kit.plain())
    assert kit.call()[0].text == "Hello there, world"


def test_final_failure_is_one_clean_line(kit):
    kit.fake.queue(*[Answer(500, kit.fake.error(500, "internal"))] * 3)
    with pytest.raises(ProviderError) as e:
        kit.call()
    msg = str(e.value)
    assert "gave up after 3 attempts" in msg and "500" in msg and "\n" not in msg
    assert e.value.status == 500
    assert len(kit.fake.requests) == 3


def test_bad_key_fails_at_once_and_is_never_echoed(kit):
    echo = f"invalid api key: {KEY} (sk-test-****{KEY[-4:]})"
    kit.fake.queue(Answer(401, kit.fake.error(401, echo)))
    if kit.name == "openai-compatible":        # this time the compatible server has a key
        kit.fake.auth, kit.fake.key = "bearer", KEY
    endpoint = kit.endpoint(api_key=KEY, headers={"X-Gateway-Token": "gw-secret-token-123456"})
    with pytest.raises(ProviderError) as e:
        kit.call(endpoint)
    msg = str(e.value)
    assert e.value.status == 401 and "401" in msg
    assert KEY not in msg and KEY[-6:] not in msg and "****" not in msg
    assert len(kit.fake.requests) == 1


def test_retry_after_beyond_the_cap_gives_up_at_once(kit, quick):
    kit.fake.queue(Answer(429, kit.fake.error(429, "quota"), headers={"retry-after": "3600"}))
    with pytest.raises(ProviderError) as e:
        kit.call()
    assert "3600" in str(e.value) and e.value.retry_after == 3600
    assert quick == [] and len(kit.fake.requests) == 1


def test_unplanned_4xx_is_not_retried(kit):
    kit.fake.queue(Answer(400, kit.fake.error(400, "bad request")))
    with pytest.raises(ProviderError) as e:
        kit.call()
    assert e.value.status == 400 and "bad request" in str(e.value)
    assert len(kit.fake.requests) == 1


def test_unreachable_endpoint_is_a_clean_error(quick):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                          # nothing listens there now
    endpoint = Endpoint("openai-compatible", model="m", base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ProviderError) as e:
        providers.get("openai-compatible").complete(endpoint, "", [{"role": "user", "content": "hi"}], [])
    assert "cannot reach" in str(e.value) and quick == []


def test_idle_timeout_is_retried(monkeypatch):
    monkeypatch.setenv("OVERLORD_PROVIDER_TIMEOUT", "0.3")
    kit = Kit("anthropic")
    try:
        slow = kit.plain("too slow")
        slow.stall = 0.8
        kit.fake.queue(slow, kit.plain())
        assert kit.call()[0].text == "Hello there, world"
        assert len(kit.fake.requests) == 2
    finally:
        kit.fake.close()
    assert kit.fake.problems == []


def test_list_models(kit):
    kit.fake.queue(kit.fake.models())
    models = kit.mod.list_models(kit.endpoint())
    assert models and all(set(m) == {"id", "name"} for m in models)
    ids = [m["id"] for m in models]
    if kit.name == "gemini":
        assert ids == [GeminiFake.MODEL]          # the embedding-only model is left out
    assert kit.fake.requests[-1]["method"] == "GET"


def test_every_provider_is_known():
    assert set(providers.PROVIDERS) == {"anthropic", "openai", "azure", "openai-compatible",
                                        "gemini", "scripted"}
    for name in providers.PROVIDERS:
        mod = providers.get(name)
        assert callable(mod.complete) and callable(mod.list_models)
        assert "| normalized" in mod.__doc__            # the stop-reason table
    assert providers.default_base_url("anthropic") == "https://api.anthropic.com"
    assert providers.default_base_url("openai") == "https://api.openai.com/v1"
    assert providers.default_base_url("openai-compatible") == "http://127.0.0.1:11434/v1"
    assert providers.default_base_url("gemini") == "https://generativelanguage.googleapis.com"
    from overlord.errors import UsageError
    with pytest.raises(UsageError):
        providers.get("nope")
