"""Pricing and the ledger on every provider's usage shape: each provider module is called for
real against its wire-protocol fake on 127.0.0.1 (test/agent/fakes.py), and its Reply.usage --
the normalized dict providers/common.usage() builds -- is charged through a Meter.

Anthropic reports input_tokens without the cached part; OpenAI (Responses and Chat, so Azure
and OpenAI-compatible servers too) and Gemini count the cached tokens inside their prompt
figure. The ledger's input_tokens is always the uncached part, so a cached token is priced once,
at the cache-read rate."""
import json
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "test", "agent"))
from fakes import KEY, AnthropicFake, ChatFake, GeminiFake, ResponsesFake, quick  # noqa: E402,F401

from overlord.agent import ratelimit  # noqa: E402
from overlord.agent.providers import anthropic, azure, gemini, openai, openai_compatible, scripted  # noqa: E402
from overlord.agent.providers.base import Endpoint  # noqa: E402
from overlord.trust import cost  # noqa: E402
from overlord.txn import store  # noqa: E402

pytestmark = pytest.mark.usefixtures("quick")
TASK = [{"role": "user", "content": "hi"}]
RATES = {"input": 1.0, "output": 10.0, "cache_read": 0.1, "cache_write": 2.0}   # per MTok


def session():
    sid = store.new_sid()
    os.makedirs(store.session_dir(sid))
    return sid


def call(mod, endpoint):
    return mod.complete(endpoint, "Be brief.", TASK, [],
                        on_headers=ratelimit.record)


def charged(endpoint, reply):
    for model in {reply.model, endpoint.model} - {None}:
        cost.set_price(model, **RATES)
    sid = session()
    line = cost.Meter(sid, "/srv/app", "alice").charge("turn", endpoint.provider,
                                                       reply.model or endpoint.model, reply.usage)
    return sid, line


def expect(line, i, o, cr, cw):
    assert [line[k] for k in cost.TOKEN_KEYS] == [i, o, cr, cw]
    usd = (i * RATES["input"] + o * RATES["output"] + cr * RATES["cache_read"]
           + cw * RATES["cache_write"]) / 1e6
    assert line["usd"] == pytest.approx(usd) and line["priced"] is True


def ledger():
    with open(os.path.join(store.home(), "ledger.jsonl")) as f:
        return [json.loads(x) for x in f]


@pytest.fixture
def fakes():
    made = []

    def make(cls, **kw):
        made.append(cls(**kw))
        return made[-1]
    yield make
    for f in made:
        f.close()
        assert f.problems == []


def test_anthropic_input_excludes_the_cache(fakes):
    f = fakes(AnthropicFake)
    f.queue(f.turn(text="ok"))          # usage: input 25, output 12, cache read 7, cache write 3
    endpoint = Endpoint("anthropic", model=f.MODEL, base_url=f.url, api_key=KEY)
    reply = call(anthropic, endpoint)
    assert reply.usage["context_tokens"] == 35
    sid, line = charged(endpoint, reply)
    expect(line, 25, 12, 7, 3)
    total = cost.session_total(sid)
    assert total["tokens"] == 47 and total["calls"] == 1 and ledger() == [line]


def test_openai_responses_input_includes_cached_tokens(fakes):
    f = fakes(ResponsesFake)
    f.queue(f.turn(text="ok"))   # input 40 of which cached 16, output 20 of which reasoning 8
    endpoint = Endpoint("openai", model=f.MODEL, base_url=f.url, api_key=KEY)
    reply = call(openai, endpoint)
    assert reply.usage["input_tokens"] == 40 and reply.usage["cache_read_tokens"] == 16
    sid, line = charged(endpoint, reply)
    expect(line, 24, 20, 16, 0)
    assert cost.session_total(sid)["tokens"] == 60          # the API's own total_tokens


def test_openai_chat_prompt_tokens_include_cached_tokens(fakes):
    f = fakes(ChatFake)
    f.queue(f.turn(text="ok"))   # prompt 33 of which cached 5, completion 11
    endpoint = Endpoint("openai", model=f.MODEL, base_url=f.url, api_key=KEY, api="chat")
    reply = call(openai, endpoint)
    sid, line = charged(endpoint, reply)
    expect(line, 28, 11, 5, 0)
    assert cost.session_total(sid)["tokens"] == 44          # total_tokens


def test_azure_chat(fakes):
    f = fakes(ChatFake, path="/openai/deployments/dep/chat/completions", auth="api-key",
              query={"api-version": "2024-10-21"})
    f.queue(f.turn(text="ok"))
    endpoint = Endpoint("azure", model="dep", base_url=f.url + "/openai/", api_key=KEY,
                        azure_api_version="2024-10-21")
    reply = call(azure, endpoint)
    _, line = charged(endpoint, reply)
    assert line["provider"] == "azure"
    expect(line, 28, 11, 5, 0)


def test_azure_responses(fakes, monkeypatch):
    monkeypatch.delenv("OPENAI_API_VERSION", raising=False)
    f = fakes(ResponsesFake, path="/openai/responses", auth="api-key",
              query={"api-version": azure.DEFAULT_API_VERSION})
    f.queue(f.turn(text="ok"))
    endpoint = Endpoint("azure", model="dep-5", base_url=f.url, api_key=KEY, api="responses")
    reply = call(azure, endpoint)
    _, line = charged(endpoint, reply)
    expect(line, 24, 20, 16, 0)


def test_openai_compatible(fakes):
    f = fakes(ChatFake, key=None, path="/v1/chat/completions", auth=None)
    f.queue(f.turn(text="ok"))
    endpoint = Endpoint("openai-compatible", model="qwen-test", base_url=f.url + "/v1")
    reply = call(openai_compatible, endpoint)
    _, line = charged(endpoint, reply)
    expect(line, 28, 11, 5, 0)


def test_openai_compatible_unpriced_model_is_tokens_only(fakes):
    f = fakes(ChatFake, key=None, path="/v1/chat/completions", auth=None)
    f.queue(f.turn(text="ok"))
    endpoint = Endpoint("openai-compatible", model="never-priced-7b", base_url=f.url + "/v1")
    reply = call(openai_compatible, endpoint)
    sid = session()
    line = cost.Meter(sid, None, None).charge("turn", "openai-compatible", reply.model or
                                              endpoint.model, reply.usage)
    assert line["model"] == "gpt-test-5" and cost.price("gpt-test-5") is None
    assert line["usd"] is None and line["priced"] is False
    assert cost.session_total(sid)["unpriced"] == ["gpt-test-5"]
    assert line["input_tokens"] + line["cache_read_tokens"] == 33


def test_gemini_prompt_includes_cached_content_and_output_includes_thoughts(fakes):
    f = fakes(GeminiFake)
    f.queue(f.turn(text="ok"))   # prompt 50 of which cached 20; candidates 14 + thoughts 6
    endpoint = Endpoint("gemini", model=f.MODEL, base_url=f.url, api_key=KEY)
    reply = call(gemini, endpoint)
    sid, line = charged(endpoint, reply)
    expect(line, 30, 20, 20, 0)
    assert cost.session_total(sid)["tokens"] == 70          # totalTokenCount


def test_scripted_usage_is_already_in_the_normalized_names(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"model": "scripted-test", "turns": [
        {"text": "ok", "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 4,
                                 "cache_write_tokens": 2}}]}))
    endpoint = Endpoint("scripted", model="scripted-test", script=str(script))
    reply = scripted.complete(endpoint, "", TASK, [])
    _, line = charged(endpoint, reply)
    expect(line, 10, 5, 4, 2)


def test_a_usage_dict_may_say_itself_whether_the_cache_is_inside(home):
    meter = cost.Meter(session(), None, None)
    u = {"input_tokens": 100, "output_tokens": 0, "cache_read_tokens": 30}
    assert meter.charge("turn", "anthropic", "m", dict(u, cache_included=True))["input_tokens"] == 70
    assert meter.charge("turn", "openai", "m", dict(u, cache_included=False))["input_tokens"] == 100


def test_the_provider_readings_reach_the_usage_meter(fakes):
    from overlord import ops
    a, c = fakes(AnthropicFake), fakes(ChatFake)
    a.queue(a.turn(text="ok"))
    c.queue(c.turn(text="ok"))
    call(anthropic, Endpoint("anthropic", model=a.MODEL, base_url=a.url, api_key=KEY))
    call(openai, Endpoint("openai", model=c.MODEL, base_url=c.url, api_key=KEY, api="chat"))
    rate = ops.usage_meter(None)["rate"]
    assert set(rate) == {"anthropic", "openai"}
    assert rate["anthropic"]["requests"]["remaining"] == 49
    assert rate["anthropic"]["tokens"]["reset"] == "2026-01-01T00:00:00Z"
    assert rate["openai"]["requests"] == {"limit": None, "remaining": 98, "reset": None}
