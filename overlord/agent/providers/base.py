"""The one contract every model provider implements.

A provider turns a neutral conversation into its own wire format, streams the reply, and hands
back a neutral Reply. Providers know nothing of the engine: no sessions, no layers, no paths.

The neutral message list (what the agent records and replays):

    {"role": "user", "content": "text"}          (+ "compacted": N on a compaction's handover
                                                   note: the model replies it stands for;
                                                   providers ignore it)
    {"role": "assistant", "text": "...", "tool_calls": [{"id", "name", "input"}],
     "state": <opaque provider state, e.g. thinking blocks with signatures or encrypted
               reasoning items, replayed verbatim to the same provider on the next call>}
    {"role": "tool", "results": [{"call_id", "name", "content": "text", "is_error": bool}]}

Tools are [{"name", "description", "input_schema": <JSON schema object>}].

Every provider module has complete(endpoint, system, messages, tools, on_delta=None,
on_headers=None, cancel=None) -> Reply and list_models(endpoint, cancel=None) -> [{"id", "name"}].
cancel is the run's token (overlord.agent.cancel.Cancel): when it is set, the call ends within a
moment by raising Cancelled (never a ProviderError, never a retry). on_delta(kind, text) gets
kind "text" or "thinking" as the answer streams, and ("restart", "") when a broken stream is being
retried from the start: drop what was shown; the Reply holds only the attempt that completed.
on_headers(provider, headers) gets each response's rate-limit headers. Reply.usage also carries
context_tokens (what the prompt filled of the context window, cache included) and, where the
provider reports them, cache_read_tokens, cache_write_tokens and reasoning_tokens.
"""
import dataclasses

# The normalized stop reasons. Each provider module documents its own table mapping to these.
STOP_REASONS = ("end_turn", "tool_use", "max_tokens", "refusal")


@dataclasses.dataclass
class ToolCall:
    id: str
    name: str
    input: dict
    malformed: str = None     # why the streamed input could not be parsed; then input == {}


@dataclasses.dataclass
class Reply:
    text: str
    tool_calls: list           # [ToolCall]
    stop_reason: str           # one of STOP_REASONS
    usage: dict                # input_tokens, output_tokens (+ cache_read_tokens, cache_write_tokens)
    model: str = None          # the model id the endpoint says served the call
    raw_stop: str = None       # the provider's own stop value, for the record
    refusal_category: str = None
    state: object = None       # opaque; stored on the assistant message, replayed next call


@dataclasses.dataclass
class Endpoint:
    """Where and how to call a model. Knobs are sent only when set (None means: not sent)."""
    provider: str
    model: str = None
    base_url: str = None
    api_key: str = None
    headers: dict = dataclasses.field(default_factory=dict)
    max_tokens: int = None
    temperature: float = None
    top_p: float = None
    stop: list = None
    effort: str = None          # low | medium | high | xhigh | max
    thinking: str = None        # summarized | off
    api: str = None             # openai: responses (default) | chat
    stream: bool = True
    fallbacks: bool = True      # anthropic native endpoint only
    azure_api_version: str = None
    script: str = None          # scripted provider: path of the JSON file of turns

    def record(self):
        """What is recorded on a session (never the key)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "api_key"}


class ProviderError(Exception):
    """A call that failed for good (after retries): one readable line, no traceback."""

    def __init__(self, message, status=None, retryable=False, retry_after=None):
        super().__init__(message)
        self.status, self.retryable, self.retry_after = status, retryable, retry_after
