"""OpenAI: the Responses API by default (POST {base}/responses), --api chat for Chat Completions
(POST {base}/chat/completions); GET {base}/models lists models. Base https://api.openai.com/v1,
header Authorization: Bearer <key>.

Stop reasons (details in responses.py and chat.py):

    | OpenAI value                                        | normalized |
    |-----------------------------------------------------|------------|
    | responses: completed, no function call              | end_turn   |
    | responses: completed with function_call items       | tool_use   |
    | responses: incomplete max_output_tokens             | max_tokens |
    | responses: incomplete content_filter, refusal part  | refusal    |
    | chat: stop                                          | end_turn   |
    | chat: tool_calls                                    | tool_use   |
    | chat: length                                        | max_tokens |
    | chat: content_filter, a refusal message             | refusal    |
"""
import dataclasses

from overlord.agent.providers import chat, common, http, responses

BASE = "https://api.openai.com/v1"


@dataclasses.dataclass
class Wire:
    """Where and how one OpenAI-shaped endpoint is reached."""
    name: str
    default_base: str = None
    default_api: str = "responses"
    max_tokens_field: str = "max_completion_tokens"
    strict: bool = True

    def model(self, endpoint):
        return common.need_model(endpoint)

    def base(self, endpoint):
        return common.base_url(endpoint, self.default_base)

    def url(self, endpoint, kind):
        return self.base(endpoint) + {"responses": "/responses", "chat": "/chat/completions",
                                      "models": "/models"}[kind]

    def headers(self, endpoint):
        auth = f"Bearer {endpoint.api_key}" if endpoint.api_key else None
        return common.headers(endpoint, {"authorization": auth})

    def api(self, endpoint):
        return endpoint.api or self.default_api


WIRE = Wire("openai", BASE)


def complete_on(wire, endpoint, system, messages, tools, on_delta=None, on_headers=None,
                cancel=None):
    api = wire.api(endpoint)
    if api not in ("responses", "chat"):
        raise common.ProviderError(f"{wire.name}: unknown --api {api!r} (responses or chat)")
    wire_mod = responses if api == "responses" else chat
    return wire_mod.complete(wire, endpoint, system, messages, tools, on_delta, on_headers, cancel)


def list_models_on(wire, endpoint, cancel=None):
    page = http.call(wire.name, "GET", wire.url(endpoint, "models"), wire.headers(endpoint), None,
                     lambda resp, emit: resp.json(), secrets=common.secrets(endpoint),
                     cancel=cancel)
    return [{"id": m["id"], "name": m.get("name") or m["id"]} for m in page.get("data") or []]


def complete(endpoint, system, messages, tools, on_delta=None, on_headers=None, cancel=None):
    return complete_on(WIRE, endpoint, system, messages, tools, on_delta, on_headers, cancel)


def list_models(endpoint, cancel=None):
    return list_models_on(WIRE, endpoint, cancel)
