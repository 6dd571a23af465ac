"""JSON-RPC 2.0 as MCP uses it: one message, decoded and classified, or the error it earns.

A message is a request (`method` and `id`), a notification (`method`, no `id`) or a response
(`result` or `error`, which this server never asks for and so ignores). Anything else is
answered with the standard error object: -32700 for bytes that are not JSON, -32600 for JSON
that is not a message (a number, an array, a request whose `id` or `method` has the wrong
type, a missing `"jsonrpc": "2.0"`). A batch (a JSON array) is -32600 too: MCP removed
JSON-RPC batching in its 2025-06-18 revision, and no revision this server speaks has it.
"""
import json

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020                 # MCP 2026-07-28: HTTP headers disagree with the body
UNSUPPORTED_PROTOCOL_VERSION = -32022    # MCP 2026-07-28: data {supported, requested}

MAX_MESSAGE = 4 << 20                    # bytes of one message (a file's content travels in it)


class RpcError(Exception):
    """A JSON-RPC error to answer with: code, one-line message, optional data."""

    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def body(self):
        error = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class Message:
    """A decoded message: kind is "request", "notification" or "response"."""

    __slots__ = ("kind", "id", "method", "params", "raw")

    def __init__(self, kind, raw, id=None, method=None, params=None):
        self.kind, self.raw, self.id, self.method, self.params = kind, raw, id, method, params


def decode(data):
    """bytes or str of one message -> Message; RpcError (with the id when one could be read)
    for anything that is not one. The error's `id` attribute is the id to answer with."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise _with_id(RpcError(PARSE_ERROR, "Parse error: the message is not UTF-8"), None)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise _with_id(RpcError(PARSE_ERROR, "Parse error: the message is not JSON"), None)
    return classify(obj)


def classify(obj):
    """A parsed JSON value -> Message, or RpcError(-32600) carrying the id to answer with."""
    if isinstance(obj, list):
        raise _with_id(RpcError(INVALID_REQUEST, "Invalid Request: batches are not part of MCP "
                                "(removed in 2025-06-18); send one message at a time"), None)
    if not isinstance(obj, dict):
        raise _with_id(RpcError(INVALID_REQUEST, "Invalid Request: a message is a JSON object"),
                       None)
    has_id = "id" in obj
    msg_id = obj.get("id")
    id_ok = isinstance(msg_id, str) or (isinstance(msg_id, int) and not isinstance(msg_id, bool))
    answer_id = msg_id if id_ok else None
    if obj.get("jsonrpc") != "2.0":
        raise _with_id(RpcError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"'),
                       answer_id)
    if "method" not in obj:
        if has_id and ("result" in obj or "error" in obj):
            return Message("response", obj, id=msg_id)
        raise _with_id(RpcError(INVALID_REQUEST, "Invalid Request: no method"), answer_id)
    method = obj["method"]
    if not isinstance(method, str):
        raise _with_id(RpcError(INVALID_REQUEST, "Invalid Request: method must be a string"),
                       answer_id)
    if has_id and not id_ok:
        raise _with_id(RpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an "
                                "integer"), None)
    params = obj.get("params")
    if has_id:
        return Message("request", obj, id=msg_id, method=method, params=params)
    return Message("notification", obj, method=method, params=params)


def _with_id(error, msg_id):
    error.id = msg_id
    return error


def result(msg_id, value):
    return {"jsonrpc": "2.0", "id": msg_id, "result": value}


def error(msg_id, err):
    """The error response for err (an RpcError) to the request msg_id (None: unknown)."""
    return {"jsonrpc": "2.0", "id": msg_id, "error": err.body()}


def encode(message):
    """One message as compact UTF-8 JSON, no newline inside (JSON escapes every control); a
    lone surrogate a peer sent us (`"\\ud800"`) goes back escaped, as it came."""
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":")).encode("ascii")
