"""Azure OpenAI: a deployment on https://<resource>.openai.azure.com, header api-key.

Chat Completions (the default here): POST {base}/openai/deployments/<deployment>/chat/completions
?api-version=V, the deployment being the endpoint's model. --api responses: POST
{base}/openai/responses?api-version=V with the deployment as `model`. Models the resource offers:
GET {base}/openai/models?api-version=V. The base URL defaults to AZURE_OPENAI_ENDPOINT and the
version to OPENAI_API_VERSION, as in the official SDKs, else DEFAULT_API_VERSION.

Stop reasons are those of the wire in use (chat.py, responses.py):

    | Azure value                                    | normalized |
    |------------------------------------------------|------------|
    | chat: stop / tool_calls / length               | end_turn / tool_use / max_tokens |
    | chat: content_filter, a refusal message        | refusal    |
    | responses: completed (with/without calls)      | tool_use / end_turn |
    | responses: incomplete max_output_tokens        | max_tokens |
    | responses: incomplete content_filter, refusal  | refusal    |
"""
import os
import urllib.parse

from overlord.agent.providers import common, openai

DEFAULT_API_VERSION = "2025-04-01-preview"   # has chat reasoning_effort and the Responses API


class AzureWire(openai.Wire):
    def base(self, endpoint):
        url = endpoint.base_url or os.environ.get("AZURE_OPENAI_ENDPOINT")
        if not url:
            raise common.ProviderError(
                "azure: no base URL given (pass --base-url https://<resource>.openai.azure.com)")
        url = url.rstrip("/")
        return url[: -len("/openai")] if url.endswith("/openai") else url

    def version(self, endpoint):
        return (endpoint.azure_api_version or os.environ.get("OPENAI_API_VERSION")
                or DEFAULT_API_VERSION)

    def url(self, endpoint, kind):
        query = "?api-version=" + urllib.parse.quote(self.version(endpoint))
        base = self.base(endpoint)
        if kind == "chat":
            deployment = urllib.parse.quote(common.need_model(endpoint), safe="")
            return f"{base}/openai/deployments/{deployment}/chat/completions{query}"
        return f"{base}/openai/{kind}{query}"

    def headers(self, endpoint):
        return common.headers(endpoint, {"api-key": endpoint.api_key})


WIRE = AzureWire("azure", default_api="chat")


def complete(endpoint, system, messages, tools, on_delta=None, on_headers=None, cancel=None):
    return openai.complete_on(WIRE, endpoint, system, messages, tools, on_delta, on_headers,
                              cancel)


def list_models(endpoint, cancel=None):
    return openai.list_models_on(WIRE, endpoint, cancel)
