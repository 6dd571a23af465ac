"""OpenAI (Responses API and --api chat), Azure and OpenAI-compatible servers against their fakes."""
import pytest

from fakes import KEY, ChatFake, ResponsesFake, quick  # noqa: F401
from overlord.agent.providers import azure, openai, openai_compatible
from overlord.agent.providers.base import Endpoint, ProviderError

pytestmark = pytest.mark.usefixtures("quick")

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"},
                                           "timeout": {"type": "integer"}},
          "required": ["command"]}
STRICT = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
          "additionalProperties": False}
TOOLS = [{"name": "shell", "description": "Run a command", "input_schema": SCHEMA},
         {"name": "read_file", "description": "Read a file", "input_schema": STRICT}]
TASK = [{"role": "user", "content": "List the files"}]


def run(mod, endpoint, messages, tools=TOOLS):
    deltas = []
    reply = mod.complete(endpoint, "Be brief.", messages, tools,
                         on_delta=lambda k, t: deltas.append((k, t)))
    return reply, deltas


def after(messages, reply, results):
    return messages + [
        {"role": "assistant", "text": reply.text, "state": reply.state,
         "tool_calls": [{"id": c.id, "name": c.name, "input": c.input} for c in reply.tool_calls]},
        {"role": "tool", "results": [{"call_id": c.id, "name": c.name, "content": r,
                                      "is_error": False} for c, r in zip(reply.tool_calls, results)]}]


@pytest.fixture
def resp():
    f = ResponsesFake()
    yield f
    f.close()
    assert f.problems == []


def rep(fake, **kw):
    return Endpoint("openai", model=kw.pop("model", "gpt-5.5"), base_url=fake.url, api_key=KEY, **kw)


# ---------------------------------------------------------------- Responses API

def test_responses_reasoning_replayed_ahead_of_its_tool_calls(resp):
    resp.allowed.add("reasoning")
    resp.queue(resp.turn(reasoning="Listing needs ls.", text="Let me look.",
                         calls=[("shell", {"command": "ls -la"}), ("read_file", {"path": "a"})]),
               resp.turn(text="Two files."))
    endpoint = rep(resp, effort="max")
    reply, deltas = run(openai, endpoint, TASK)
    body = resp.body()
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"effort": "xhigh"}
    assert body["instructions"] == "Be brief."
    assert [t["strict"] for t in body["tools"]] == [False, True]     # only a closed schema is strict
    assert reply.stop_reason == "tool_use"
    assert [(c.name, c.input) for c in reply.tool_calls] == [("shell", {"command": "ls -la"}),
                                                             ("read_file", {"path": "a"})]
    assert "".join(t for k, t in deltas if k == "thinking") == "Listing needs ls."
    assert reply.usage == {"input_tokens": 40, "output_tokens": 20, "cache_read_tokens": 16,
                           "reasoning_tokens": 8, "context_tokens": 40}
    assert reply.state["items"][0]["type"] == "reasoning"

    second, _ = run(openai, endpoint, after(TASK, reply, ["a\nb", "text"]))
    assert second.text == "Two files." and second.stop_reason == "end_turn"
    kinds = [i.get("type", "message") for i in resp.body()["input"]]
    assert kinds == ["message", "reasoning", "message", "function_call", "function_call",
                     "function_call_output", "function_call_output"]


def test_responses_unset_knobs_absent(resp):
    resp.queue(resp.turn(text="hi"))
    run(openai, rep(resp, model="gpt-test-5"), TASK, tools=[])
    assert set(resp.body()) == {"model", "input", "instructions", "store", "stream"}


def test_responses_knobs(resp):
    resp.allowed |= {"reasoning", "max_output_tokens", "temperature", "top_p"}
    resp.queue(resp.turn(text="hi"), resp.turn(text="hi"))
    run(openai, rep(resp, max_tokens=500, temperature=0.5, top_p=0.8, thinking="summarized",
                    effort="low"), TASK)
    body = resp.body()
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert (body["max_output_tokens"], body["temperature"], body["top_p"]) == (500, 0.5, 0.8)
    run(openai, rep(resp, thinking="off"), TASK)
    assert resp.body()["reasoning"] == {"effort": "none"} and "include" not in resp.body()


def test_responses_refuse_stop_sequences_before_any_request(resp):
    with pytest.raises(ProviderError, match="--api chat"):
        run(openai, rep(resp, stop=["END"]), TASK)
    assert resp.requests == []


def test_responses_incomplete_max_output_tokens(resp):
    resp.queue(resp.turn(text="Partial", calls=[("shell", '{"command": "ls')],
                         incomplete="max_output_tokens"))
    reply, _ = run(openai, rep(resp), TASK)
    assert reply.stop_reason == "max_tokens" and reply.raw_stop == "incomplete:max_output_tokens"
    assert reply.tool_calls[0].malformed and reply.tool_calls[0].input == {}


def test_responses_content_filter_and_refusal_part(resp):
    resp.queue(resp.turn(text="Some", incomplete="content_filter"),
               resp.turn(refusal="I can't help with that."))
    reply, _ = run(openai, rep(resp), TASK)
    assert reply.stop_reason == "refusal" and reply.refusal_category == "content_filter"
    reply, deltas = run(openai, rep(resp), TASK)
    assert reply.stop_reason == "refusal" and reply.text == "I can't help with that."
    assert "".join(t for k, t in deltas if k == "text") == "I can't help with that."


def test_responses_malformed_arguments(resp):
    resp.queue(resp.turn(calls=[("shell", '{"command": ls}')]), resp.turn(text="ok"))
    reply, _ = run(openai, rep(resp), TASK)
    assert reply.stop_reason == "tool_use" and "not valid JSON" in reply.tool_calls[0].malformed
    assert run(openai, rep(resp), after(TASK, reply, ["Error: malformed input"]))[0].text == "ok"
    replayed = [i for i in resp.body()["input"] if i.get("type") == "function_call"]
    assert replayed[0]["arguments"] == '{"command": ls}'      # what the model said, verbatim


def test_responses_failed_event(resp):
    failed = resp.turn(text="x")
    failed.events = failed.events[:2] + [("response.failed", {"type": "response.failed", "response": {
        "status": "failed", "error": {"code": "server_error", "message": "oops"}}})]
    bad = resp.turn(text="x")
    bad.events = bad.events[:1] + [("error", {"type": "error", "code": "invalid_prompt",
                                              "message": "flagged", "param": None})]
    resp.queue(failed, resp.turn(text="recovered"), bad)
    assert run(openai, rep(resp), TASK)[0].text == "recovered"
    with pytest.raises(ProviderError, match="invalid_prompt: flagged"):
        run(openai, rep(resp), TASK)


def test_responses_no_stream(resp):
    resp.queue(resp.turn(text="Whole answer", calls=[("shell", {"command": "pwd"})], stream=False))
    reply, deltas = run(openai, rep(resp, stream=False), TASK)
    assert "stream" not in resp.body()
    assert reply.text == "Whole answer" and deltas == [("text", "Whole answer")]
    assert reply.tool_calls[0].input == {"command": "pwd"}


# ---------------------------------------------------------------- Chat Completions

@pytest.fixture
def chat():
    f = ChatFake()
    yield f
    f.close()
    assert f.problems == []


def test_chat_tool_call_deltas_and_round_trip(chat):
    chat.queue(chat.turn(text="Looking.", calls=[("shell", {"command": "ls", "timeout": 5}),
                                                 ("read_file", {"path": "x y"})]),
               chat.turn(text="Done."))
    endpoint = Endpoint("openai", model="gpt-test", base_url=chat.url, api_key=KEY, api="chat")
    reply, _ = run(openai, endpoint, TASK)
    assert reply.stop_reason == "tool_use" and reply.raw_stop == "tool_calls"
    assert [c.input for c in reply.tool_calls] == [{"command": "ls", "timeout": 5}, {"path": "x y"}]
    assert reply.usage["cache_read_tokens"] == 5 and reply.usage["reasoning_tokens"] == 3
    body = chat.body()
    assert set(body) == {"model", "messages", "tools", "stream", "stream_options"}
    assert body["tools"][1]["function"]["strict"] is True and "strict" not in body["tools"][0]["function"]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    second, _ = run(openai, endpoint, after(TASK, reply, ["a b", "content"]))
    assert second.text == "Done."
    roles = [m["role"] for m in chat.body()["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool"]


def test_chat_knobs_and_stops(chat):
    chat.allowed |= {"max_completion_tokens", "temperature", "top_p", "stop", "reasoning_effort"}
    chat.queue(chat.turn(text="cut", finish="length"), chat.turn(text="no", finish="content_filter"),
               chat.turn(refusal="I won't."))
    endpoint = Endpoint("openai", model="gpt-test", base_url=chat.url, api_key=KEY, api="chat",
                        max_tokens=64, temperature=0.1, top_p=0.5, stop=["\n\n"], effort="medium")
    reply, _ = run(openai, endpoint, TASK)
    body = chat.body()
    assert (body["max_completion_tokens"], body["temperature"], body["top_p"], body["stop"],
            body["reasoning_effort"]) == (64, 0.1, 0.5, ["\n\n"], "medium")
    assert reply.stop_reason == "max_tokens"
    assert run(openai, endpoint, TASK)[0].stop_reason == "refusal"
    reply, _ = run(openai, endpoint, TASK)
    assert reply.stop_reason == "refusal" and reply.text == "I won't."


def test_chat_no_stream(chat):
    chat.queue(chat.turn(text="Answer", calls=[("shell", {"command": "id"})], stream=False))
    endpoint = Endpoint("openai", model="gpt-test", base_url=chat.url, api_key=KEY, api="chat",
                        stream=False)
    reply, deltas = run(openai, endpoint, TASK)
    assert "stream" not in chat.body() and "stream_options" not in chat.body()
    assert reply.text == "Answer" and reply.tool_calls[0].input == {"command": "id"}
    assert reply.stop_reason == "tool_use"


# ---------------------------------------------------------------- Azure

def test_azure_deployment_api_version_and_api_key():
    fake = ChatFake(path="/openai/deployments/my-dep/chat/completions", auth="api-key",
                    query={"api-version": "2024-10-21"})
    try:
        fake.queue(fake.turn(text="hello from azure"))
        endpoint = Endpoint("azure", model="my-dep", base_url=fake.url + "/openai/", api_key=KEY,
                            azure_api_version="2024-10-21")
        reply, _ = run(azure, endpoint, TASK)
        assert reply.text == "hello from azure"
    finally:
        fake.close()
    assert fake.problems == []


def test_azure_responses_and_default_version(monkeypatch):
    monkeypatch.delenv("OPENAI_API_VERSION", raising=False)
    fake = ResponsesFake(path="/openai/responses", auth="api-key",
                         query={"api-version": azure.DEFAULT_API_VERSION})
    try:
        fake.queue(fake.turn(text="responses on azure"), fake.models())
        monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", fake.url)
        endpoint = Endpoint("azure", model="dep-5", api_key=KEY, api="responses")
        assert run(azure, endpoint, TASK)[0].text == "responses on azure"
        assert fake.body()["model"] == "dep-5" and fake.body()["store"] is False
        assert azure.list_models(endpoint)[0]["id"] == "gpt-test-5"
        assert fake.requests[-1]["path"] == "/openai/models"
    finally:
        fake.close()
    assert fake.problems == []


def test_azure_needs_a_base_url(monkeypatch):
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)
    with pytest.raises(ProviderError, match="--base-url"):
        run(azure, Endpoint("azure", model="d", api_key=KEY), TASK)


# ---------------------------------------------------------------- OpenAI-compatible

def test_compatible_without_key_ids_or_done():
    fake = ChatFake(key=None, path="/v1/chat/completions", auth=None, tokens_field="max_tokens")
    try:
        fake.allowed.add("max_tokens")
        # an Ollama-like server: no call ids, finish "stop" with tool calls, no [DONE], reasoning text
        fake.queue(fake.turn(reasoning="thinking...", calls=[("shell", {"command": "ls"}),
                                                             ("shell", {"command": "pwd"})],
                             finish="stop", ids=False, done=False))
        endpoint = Endpoint("openai-compatible", model="qwen-test", base_url=fake.url + "/v1",
                            max_tokens=128)
        reply, deltas = run(openai_compatible, endpoint, TASK)
        assert reply.stop_reason == "tool_use"
        ids = [c.id for c in reply.tool_calls]
        assert len(set(ids)) == 2 and all(ids)
        assert ("thinking", "think") in deltas
        assert fake.body()["max_tokens"] == 128 and "strict" not in str(fake.body()["tools"])
        again = openai_compatible.complete  # same conversation, same ids (a resume sees the same)
        fake.queue(fake.turn(calls=[("shell", {"command": "ls"}), ("shell", {"command": "pwd"})],
                             ids=False))
        assert [c.id for c in again(endpoint, "Be brief.", TASK, TOOLS).tool_calls] == ids
        fake.queue(fake.turn(text="ok", ids=False))
        second, _ = run(openai_compatible, endpoint, after(TASK, reply, ["a", "/"]))
        assert second.text == "ok"
    finally:
        fake.close()
    assert fake.problems == []


def test_compatible_list_models():
    fake = ChatFake(key=None, path="/v1/chat/completions", auth=None)
    try:
        fake.queue(fake.models())
        got = openai_compatible.list_models(Endpoint("openai-compatible", base_url=fake.url + "/v1"))
        assert [m["id"] for m in got] == ["gpt-test-5", "gpt-test-5-mini"]
        assert fake.requests[0]["path"] == "/v1/models"
    finally:
        fake.close()
    assert fake.problems == []
