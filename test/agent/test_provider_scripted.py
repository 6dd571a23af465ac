"""The scripted provider: turns picked by how many assistant messages exist, streamed text,
malformed input, refusal, cut-off, errors, an exhausted script."""
import json

import pytest

from overlord.agent.providers import scripted
from overlord.agent.providers.base import Endpoint, ProviderError


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "turns.json"
    path.write_text(json.dumps({"model": "scripted-demo", "turns": [
        {"thinking": "plan it", "text": "I will write a file.",
         "tool_calls": [{"name": "write_file", "input": {"path": "a.txt", "content": "A"}},
                        {"name": "shell", "input": "{\"command\": "}],
         "usage": {"input_tokens": 10, "output_tokens": 4}},
        {"text": "Cut here", "tool_calls": [{"name": "shell", "input": {"command": "ls"}}],
         "stop_reason": "max_tokens"},
        {"text": "No.", "stop_reason": "refusal", "refusal_category": "cyber"},
        {"error": "the model is down"},
        {"text": "Done."}]}))
    return Endpoint("scripted", script=str(path))


def convo(n):
    msgs = [{"role": "user", "content": "go"}]
    for i in range(n):
        msgs += [{"role": "assistant", "text": "", "tool_calls": []},
                 {"role": "user", "content": f"next {i}"}]
    return msgs


def test_turns_follow_the_assistant_count(script):
    deltas = []
    first = scripted.complete(script, "", convo(0), [], on_delta=lambda k, t: deltas.append((k, t)))
    assert first.text == "I will write a file." == "".join(t for k, t in deltas if k == "text")
    assert len([d for d in deltas if d[0] == "text"]) > 1
    assert "".join(t for k, t in deltas if k == "thinking") == "plan it"
    assert first.stop_reason == "tool_use" and first.model == "scripted-demo"
    ok, bad = first.tool_calls
    assert (ok.id, ok.input, ok.malformed) == ("call_0_0", {"path": "a.txt", "content": "A"}, None)
    assert bad.id == "call_0_1" and bad.input == {} and "not valid JSON" in bad.malformed
    assert first.usage["input_tokens"] == 10

    cut = scripted.complete(script, "", convo(1), [])
    assert cut.stop_reason == "max_tokens" and cut.tool_calls[0].input == {"command": "ls"}
    refused = scripted.complete(script, "", convo(2), [])
    assert refused.stop_reason == "refusal" and refused.refusal_category == "cyber"
    with pytest.raises(ProviderError, match="the model is down"):
        scripted.complete(script, "", convo(3), [])
    assert scripted.complete(script, "", convo(4), []).text == "Done."
    with pytest.raises(ProviderError, match="no turn 6"):
        scripted.complete(script, "", convo(5), [])
    # deterministic: asking again at the same point (a resume) gives the same turn
    assert scripted.complete(script, "", convo(1), []).text == "Cut here"
    assert scripted.list_models(script) == [{"id": "scripted-demo", "name": "scripted-demo"}]


def test_bad_scripts_are_clean_errors(tmp_path):
    with pytest.raises(ProviderError, match="--script"):
        scripted.complete(Endpoint("scripted"), "", convo(0), [])
    with pytest.raises(ProviderError, match="cannot read"):
        scripted.complete(Endpoint("scripted", script=str(tmp_path / "none.json")), "", convo(0), [])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ProviderError, match="not JSON"):
        scripted.complete(Endpoint("scripted", script=str(tmp_path / "bad.json")), "", convo(0), [])
    (tmp_path / "stop.json").write_text('[{"text": "x", "stop_reason": "pause"}]')
    with pytest.raises(ProviderError, match="unknown stop_reason"):
        scripted.complete(Endpoint("scripted", script=str(tmp_path / "stop.json")), "", convo(0), [])
