"""Gemini against its fake: function calling with thought signatures carried back, call ids unique
across the conversation, knobs in generationConfig, finish reasons, non-streaming mode."""
import pytest

from fakes import KEY, GeminiFake, quick  # noqa: F401
from overlord.agent.providers import gemini
from overlord.agent.providers.base import Endpoint

pytestmark = pytest.mark.usefixtures("quick")

TOOLS = [{"name": "write_file", "description": "Write a file",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                                                            "content": {"type": "string"}},
                           "required": ["path", "content"], "additionalProperties": False}}]
TASK = [{"role": "user", "content": "Write two files"}]


@pytest.fixture
def fake():
    f = GeminiFake()
    yield f
    f.close()
    assert f.problems == []


def ep(fake, **kw):
    return Endpoint("gemini", model=fake.MODEL, base_url=fake.url, api_key=KEY, **kw)


def run(endpoint, messages, tools=TOOLS):
    deltas = []
    reply = gemini.complete(endpoint, "Be exact.", messages, tools,
                            on_delta=lambda k, t: deltas.append((k, t)))
    return reply, deltas


def after(messages, reply, results):
    return messages + [
        {"role": "assistant", "text": reply.text, "state": reply.state,
         "tool_calls": [{"id": c.id, "name": c.name, "input": c.input} for c in reply.tool_calls]},
        {"role": "tool", "results": [{"call_id": c.id, "name": c.name, "content": r,
                                      "is_error": r.startswith("Error")}
                                     for c, r in zip(reply.tool_calls, results)]}]


def test_function_calls_signatures_and_unique_ids(fake):
    fake.allowed.add("thinkingConfig")
    a, b = {"path": "a.txt", "content": "A"}, {"path": "b.txt", "content": "B"}
    fake.queue(fake.turn(thought="Two writes.", text="Writing both.",
                         calls=[("write_file", a), ("write_file", b)]),
               fake.turn(calls=[("write_file", a)]),
               fake.turn(text="All done."))
    endpoint = ep(fake, thinking="summarized")
    first, deltas = run(endpoint, TASK)
    assert first.stop_reason == "tool_use" and first.raw_stop == "STOP"
    assert [c.input for c in first.tool_calls] == [a, b]
    assert "".join(t for k, t in deltas if k == "thinking") == "Two writes."
    assert first.text == "Writing both."            # thought parts are not the answer
    assert first.usage == {"input_tokens": 50, "output_tokens": 20, "cache_read_tokens": 20,
                           "reasoning_tokens": 6, "context_tokens": 50}
    assert fake.body()["generationConfig"] == {"thinkingConfig": {"includeThoughts": True}}
    assert fake.body()["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] == TOOLS[0]["input_schema"]

    convo = after(TASK, first, ["ok", "ok"])
    second, _ = run(endpoint, convo)                 # the fake checks the echoed signature
    sent = fake.body()["contents"]
    assert [c["role"] for c in sent] == ["user", "model", "user"]
    assert [p["functionResponse"]["response"] for p in sent[2]["parts"]] == [{"output": "ok"}] * 2
    third, _ = run(endpoint, after(convo, second, ["Error: disk full"]))
    assert third.text == "All done." and third.stop_reason == "end_turn"
    assert fake.body()["contents"][-1]["parts"][0]["functionResponse"]["response"] == {
        "error": "Error: disk full"}
    ids = [c.id for c in first.tool_calls + second.tool_calls]
    assert len(set(ids)) == 3                        # the same call twice still gets a new id
    # deterministic: the same conversation gives the same ids (a resume replays exactly)
    fake.queue(fake.turn(thought="Two writes.", text="Writing both.",
                         calls=[("write_file", a), ("write_file", b)]))
    assert [c.id for c in run(endpoint, TASK)[0].tool_calls] == ids[:2]


def test_unset_knobs_absent_then_all_set(fake):
    fake.queue(fake.turn(text="hi"), fake.turn(text="hi"))
    run(ep(fake), TASK, tools=[])
    assert set(fake.body()) == {"contents", "systemInstruction"}
    fake.allowed |= {"maxOutputTokens", "temperature", "topP", "stopSequences", "thinkingConfig"}
    run(ep(fake, max_tokens=100, temperature=0.3, top_p=0.7, stop=["X"], effort="max"), TASK)
    assert fake.body()["generationConfig"] == {"maxOutputTokens": 100, "temperature": 0.3,
                                               "topP": 0.7, "stopSequences": ["X"],
                                               "thinkingConfig": {"thinkingLevel": "high"}}


def test_thinking_off_and_gemini_2_budgets():
    old = Endpoint("gemini", model="gemini-2.5-flash", effort="low")
    assert gemini.request_body(old, "", TASK, [])["generationConfig"] == {
        "thinkingConfig": {"thinkingBudget": 1024}}
    off = Endpoint("gemini", model="gemini-2.5-flash", thinking="off")
    assert gemini.request_body(off, "", TASK, [])["generationConfig"] == {
        "thinkingConfig": {"thinkingBudget": 0}}
    new = Endpoint("gemini", model="models/gemini-3-pro", thinking="off")
    assert gemini.request_body(new, "", TASK, [])["generationConfig"] == {
        "thinkingConfig": {"thinkingLevel": "minimal"}}


@pytest.mark.parametrize("finish,stop,category", [("MAX_TOKENS", "max_tokens", None),
                                                  ("SAFETY", "refusal", "safety"),
                                                  ("RECITATION", "refusal", "recitation"),
                                                  ("OTHER", "end_turn", None)])
def test_finish_reasons(fake, finish, stop, category):
    fake.queue(fake.turn(text="Some text", finish=finish))
    reply, _ = run(ep(fake), TASK)
    assert (reply.stop_reason, reply.refusal_category, reply.raw_stop) == (stop, category, finish)


def test_blocked_prompt_is_a_refusal(fake):
    fake.queue(fake.turn(blocked="PROHIBITED_CONTENT"))
    reply, _ = run(ep(fake), TASK)
    assert reply.stop_reason == "refusal" and reply.refusal_category == "prohibited_content"


def test_malformed_function_call_goes_back_as_an_error(fake):
    fake.queue(fake.turn(finish="MALFORMED_FUNCTION_CALL"), fake.turn(text="retrying properly"))
    reply, _ = run(ep(fake), TASK)
    assert reply.stop_reason == "tool_use"
    [call] = reply.tool_calls
    assert call.input == {} and "MALFORMED_FUNCTION_CALL" in call.malformed
    second, _ = run(ep(fake), after(TASK, reply, ["Error: malformed call"]))
    assert second.text == "retrying properly"
    last = fake.body()["contents"][-1]
    assert "functionResponse" not in last["parts"][-1] and "malformed call" in last["parts"][-1]["text"]


def test_no_stream(fake):
    fake.queue(fake.turn(text="Whole.", thought="hm", calls=[("write_file", {"path": "p", "content": ""})],
                         stream=False))
    fake.allowed.add("thinkingConfig")
    reply, deltas = run(ep(fake, stream=False, thinking="summarized"), TASK)
    assert fake.requests[-1]["path"].endswith(":generateContent")
    assert reply.text == "Whole." and ("thinking", "hm") in deltas
    assert reply.tool_calls[0].input == {"path": "p", "content": ""}


def test_text_signature_stays_on_its_part_and_is_replayed(fake):
    fake.allowed.add("thinkingConfig")
    fake.queue(fake.turn(thought="Consider it.", text="Plain answer."), fake.turn(text="Next."))
    endpoint = ep(fake, thinking="summarized")
    reply, _ = run(endpoint, TASK)
    parts = reply.state["parts"]
    assert parts[0] == {"text": "Consider it.", "thought": True}
    assert parts[1]["text"] == "Plain answer." and parts[1]["thoughtSignature"].startswith("CiQBtext")
    convo = TASK + [{"role": "assistant", "text": reply.text, "state": reply.state, "tool_calls": []},
                    {"role": "user", "content": "and?"}]
    run(endpoint, convo)
    assert fake.body()["contents"][1] == {"role": "model", "parts": parts}
