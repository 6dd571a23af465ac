"""Anthropic Messages API against its fake: thinking carried across tool turns, knobs, refusal,
cut-off, malformed tool input, server-side refusal fallbacks, non-streaming mode."""
import pytest

from fakes import KEY, AnthropicFake, Answer, quick  # noqa: F401
from overlord.agent.providers import anthropic
from overlord.agent.providers.base import Endpoint, ProviderError

pytestmark = pytest.mark.usefixtures("quick")

TOOLS = [{"name": "write_file", "description": "Write a file",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                                                            "content": {"type": "string"}},
                           "required": ["path", "content"]}}]
TASK = [{"role": "user", "content": "Write hello.txt"}]


@pytest.fixture
def fake():
    f = AnthropicFake()
    yield f
    f.close()
    assert f.problems == []


def ep(fake, **kw):
    return Endpoint("anthropic", model=fake.MODEL, base_url=fake.url, api_key=KEY, **kw)


def run(endpoint, messages, tools=TOOLS):
    deltas = []
    reply = anthropic.complete(endpoint, "Be careful.", messages, tools,
                               on_delta=lambda k, t: deltas.append((k, t)))
    return reply, deltas


def after(messages, reply, results):
    """The conversation the agent sends next: the assistant turn, then the tool results."""
    return messages + [
        {"role": "assistant", "text": reply.text, "state": reply.state,
         "tool_calls": [{"id": c.id, "name": c.name, "input": c.input} for c in reply.tool_calls]},
        {"role": "tool", "results": [{"call_id": c.id, "name": c.name, "content": r,
                                      "is_error": r.startswith("error")}
                                     for c, r in zip(reply.tool_calls, results)]}]


def test_thinking_and_tool_use_round_trip(fake):
    args = {"path": "hello.txt", "content": "hi \"there\"\n"}
    fake.queue(fake.turn(thinking="I should write the file.", text="Writing it.",
                         calls=[("write_file", args)], redacted=True),
               fake.turn(text="Done."))
    endpoint = ep(fake, thinking="summarized", effort="high")
    fake.allowed |= {"thinking", "output_config"}
    reply, deltas = run(endpoint, TASK)
    assert reply.stop_reason == "tool_use" and reply.raw_stop == "tool_use"
    [call] = reply.tool_calls
    assert call.name == "write_file" and call.input == args and call.malformed is None
    assert call.id.startswith("toolu_")
    assert "".join(t for k, t in deltas if k == "thinking") == "I should write the file."
    blocks = reply.state["content"]
    assert [b["type"] for b in blocks] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert blocks[0]["signature"].startswith("EqQB")
    assert reply.usage == {"input_tokens": 25, "output_tokens": 12, "cache_read_tokens": 7,
                           "cache_write_tokens": 3, "context_tokens": 35}

    second, _ = run(endpoint, after(TASK, reply, ["wrote 12 bytes"]))
    assert second.text == "Done." and second.stop_reason == "end_turn"
    body = fake.body()
    assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert body["output_config"] == {"effort": "high"}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    result = body["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == call.id
    assert result["cache_control"] == {"type": "ephemeral"}        # the cached prefix ends here
    assert body["system"][0]["text"] == "Be careful."


def test_unset_knobs_are_absent_and_set_ones_sent(fake):
    fake.queue(fake.turn(text="a"), fake.turn(text="b"))
    run(ep(fake), TASK, tools=[])
    body = fake.body()
    assert set(body) == {"model", "messages", "max_tokens", "system", "stream"}
    assert body["max_tokens"] == anthropic.DEFAULT_MAX_TOKENS
    fake.allowed |= {"temperature", "top_p", "stop_sequences", "thinking"}
    run(ep(fake, max_tokens=900, temperature=0.2, top_p=0.9, stop=["END"], thinking="off"), TASK)
    body = fake.body()
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["stop_sequences"],
            body["thinking"]) == (900, 0.2, 0.9, ["END"], {"type": "disabled"})
    assert "output_config" not in body and "fallbacks" not in body


def test_refusal_carries_its_category(fake):
    fake.queue(fake.turn(text="I can", stop="refusal", category="cyber"))
    reply, _ = run(ep(fake), TASK)
    assert reply.stop_reason == "refusal" and reply.refusal_category == "cyber"
    assert reply.text == "I can"


def test_cut_off_mid_tool_input_is_max_tokens_and_malformed(fake):
    fake.queue(fake.turn(text="Writing", calls=[("write_file", '{"path": "a.txt", "cont')],
                         stop="max_tokens"))
    reply, _ = run(ep(fake), TASK)
    assert reply.stop_reason == "max_tokens"
    [call] = reply.tool_calls
    assert call.input == {} and "not valid JSON" in call.malformed


def test_malformed_tool_input_is_marked_not_raised(fake):
    fake.queue(fake.turn(calls=[("write_file", '{"path": "a.txt", "content": }'),
                                ("write_file", '["not", "an", "object"]'),
                                ("write_file", '{"path": NaN}')]),
               fake.turn(text="ok"))
    reply, _ = run(ep(fake), TASK)
    assert reply.stop_reason == "tool_use"
    assert [c.input for c in reply.tool_calls] == [{}, {}, {}]
    assert all(c.malformed for c in reply.tool_calls)
    assert "not a JSON object" in reply.tool_calls[1].malformed
    # handed back as error results, the conversation goes on (the fake checks the replay)
    second, _ = run(ep(fake), after(TASK, reply, ["error: malformed input"] * 3))
    assert second.text == "ok"
    assert all(b.get("is_error") for b in fake.body()["messages"][2]["content"])


def test_in_band_overloaded_error_is_retried(fake):
    broken = fake.turn(text="partial")
    broken.events = broken.events[:4] + [("error", {"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"}})]
    fake.queue(broken, fake.turn(text="whole"))
    assert run(ep(fake), TASK)[0].text == "whole"


def test_in_band_invalid_request_is_not_retried(fake):
    bad = fake.turn(text="x")
    bad.events = bad.events[:1] + [("error", {"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long"}})]
    fake.queue(bad)
    with pytest.raises(ProviderError) as e:
        run(ep(fake), TASK)
    assert "prompt is too long" in str(e.value) and len(fake.requests) == 1


def test_fallbacks_only_on_the_native_endpoint(fake, monkeypatch):
    fake.queue(fake.turn(text="a"), fake.turn(text="b"), fake.turn(text="c"))
    run(ep(fake), TASK)                              # a gateway: never sent
    assert "fallbacks" not in fake.body()
    monkeypatch.setattr(anthropic, "BASE", fake.url)  # now the fake *is* the native endpoint
    fake.allowed.add("fallbacks")
    run(ep(fake), TASK)
    assert fake.body()["fallbacks"] == "default"
    assert anthropic.FALLBACK_BETA in fake.requests[-1]["headers"]["anthropic-beta"]
    run(ep(fake, fallbacks=False), TASK)             # --no-fallbacks
    assert "fallbacks" not in fake.body()
    assert "anthropic-beta" not in fake.requests[-1]["headers"]


def test_fallback_hop_names_the_model_that_answered(fake, monkeypatch):
    monkeypatch.setattr(anthropic, "BASE", fake.url)
    fake.allowed.add("fallbacks")
    fake.queue(fake.turn(text="Answer from the fallback.", fallback="claude-fallback-4"))
    endpoint = ep(fake, headers={"anthropic-beta": "other-beta-2026-01-01"})
    reply, _ = run(endpoint, TASK)
    assert reply.model == "claude-fallback-4"
    assert reply.state["fallbacks"] == [{"from": fake.MODEL, "to": "claude-fallback-4"}]
    assert reply.text == "Answer from the fallback."
    beta = fake.requests[-1]["headers"]["anthropic-beta"]
    assert beta == "other-beta-2026-01-01," + anthropic.FALLBACK_BETA


def test_model_that_rejects_fallbacks_is_asked_again_without(fake, monkeypatch):
    monkeypatch.setattr(anthropic, "BASE", fake.url)
    fake.allowed.add("fallbacks")
    fake.queue(Answer(400, fake.error(400, "fallbacks: not supported for this model")),
               fake.turn(text="fine"))
    assert run(ep(fake), TASK)[0].text == "fine"
    assert "fallbacks" in fake.requests[0]["body"] and "fallbacks" not in fake.requests[1]["body"]


def test_no_stream(fake):
    fake.queue(fake.message(text="Plain.", thinking="hmm", calls=[("write_file", {"path": "x",
                                                                                  "content": ""})]),
               fake.message(text="Done."))
    endpoint = ep(fake, stream=False)
    reply, deltas = run(endpoint, TASK)
    assert "stream" not in fake.body() and fake.body()["max_tokens"] == anthropic.DEFAULT_MAX_TOKENS_NO_STREAM
    assert reply.text == "Plain." and deltas == [("thinking", "hmm"), ("text", "Plain.")]
    assert reply.stop_reason == "tool_use" and reply.tool_calls[0].input == {"path": "x", "content": ""}
    assert run(endpoint, after(TASK, reply, ["ok"]))[0].text == "Done."


def test_replay_without_state_is_built_from_the_neutral_message(fake):
    fake.queue(fake.turn(text="ok"))
    messages = TASK + [
        {"role": "assistant", "text": "", "tool_calls": [{"id": "toolu_x", "name": "write_file",
                                                          "input": {"path": "a", "content": "b"}}]},
        {"role": "tool", "results": [{"call_id": "toolu_x", "name": "write_file", "content": "ok"}]},
        {"role": "user", "content": "and now?"}]
    run(ep(fake), messages)
    sent = fake.body()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]   # result + note merged
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result", "text"]


def test_an_answer_of_the_wrong_shape_is_one_clean_line(fake):
    odd = fake.turn(text="x")
    odd.events = odd.events[:1] + [("content_block_start", {"type": "content_block_start",
                                                            "content_block": {"type": "text"}})]
    fake.queue(odd)
    with pytest.raises(ProviderError) as e:
        run(ep(fake), TASK)
    assert "unexpected shape" in str(e.value) and "\n" not in str(e.value)
    assert len(fake.requests) == 1


def test_x_should_retry_false_is_obeyed(fake):
    fake.queue(Answer(503, fake.error(503, "down for good"), headers={"x-should-retry": "false"}))
    with pytest.raises(ProviderError) as e:
        run(ep(fake), TASK)
    assert e.value.status == 503 and len(fake.requests) == 1
