"""Anything speaking the Chat Completions shape behind a base URL: Ollama, vLLM, LiteLLM, Groq,
Together, a gateway. Default base http://127.0.0.1:11434/v1 (Ollama). The key is optional: with
none, no Authorization header is sent. --api responses once the server grows the new shape.

Stop reasons (chat.py):

    | finish_reason                         | normalized |
    |---------------------------------------|------------|
    | stop (tool_use when tool calls came)  | end_turn   |
    | tool_calls, function_call             | tool_use   |
    | length                                | max_tokens |
    | content_filter, a refusal message     | refusal    |

--max-tokens is sent as max_tokens (what these servers take); strict tool schemas are not asked for.
"""
from overlord.agent.providers import openai

BASE = "http://127.0.0.1:11434/v1"
WIRE = openai.Wire("openai-compatible", BASE, default_api="chat", max_tokens_field="max_tokens",
                   strict=False)


def complete(endpoint, system, messages, tools, on_delta=None, on_headers=None, cancel=None):
    return openai.complete_on(WIRE, endpoint, system, messages, tools, on_delta, on_headers,
                              cancel)


def list_models(endpoint, cancel=None):
    return openai.list_models_on(WIRE, endpoint, cancel)
