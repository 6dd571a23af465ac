"""The SSE reader and the HTTP helper's small pure parts."""
import email.utils
import time

import pytest

from overlord.agent.providers import common, http, sse


def events(*chunks):
    return list(sse.parse(chunks))


def test_fields_comments_multiline_and_line_endings():
    got = events(b": keep-alive\r\n", b"event: delta\r\n", b"data: {\"a\":\r\n", b"data:  1}\r\n",
                 b"id: 7\r\n", b"retry: 10\r\n", b"\r\n", b"data: lf\n", b"\n", b"data: cr\r\r",
                 "data: str\n", "\n")
    assert got == [sse.Event("delta", '{"a":\n 1}', "7"), sse.Event("message", "lf", "7"),
                   sse.Event("message", "cr", "7"), sse.Event("message", "str", "7")]


def test_blank_lines_and_events_without_data_dispatch_nothing():
    assert events(b"\n", b"\n", b"event: ping\n", b"\n", b"data: x\n", b"\n") == [
        sse.Event("message", "x", None)]


def test_a_bom_and_a_field_without_colon():
    assert events("\ufeffdata: a\n", "data\n", "\n") == [sse.Event("message", "a\n", None)]


@pytest.mark.parametrize("chunks", [[b"data: x\n"], [b"event: e\n"], [b"data: x\n", b"\n", b"data: {\"par"]])
def test_truncated_final_event(chunks):
    with pytest.raises(sse.Truncated):
        events(*chunks)


def test_a_clean_end_after_a_comment_is_not_truncated():
    assert events(b"data: a\n", b"\n", b": bye\n") == [sse.Event("message", "a", None)]


def test_retry_after_forms():
    assert http.retry_after({"Retry-After": "7"}) == 7.0
    assert http.retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= http.retry_after({"retry-after": date}) <= 30
    assert http.retry_after({"retry-after": "soon"}) is None
    assert http.retry_after({}) is None


def test_scrub_removes_keys_masked_echoes_and_newlines():
    key = "sk-live-abcdefghijklmnop"
    text = http.scrub(f"bad key {key}\nor sk-live-****mnop or ...ijklmnop", [key])
    assert key not in text and "mnop" not in text and "\n" not in text
    assert len(http.scrub("x" * 1000, [])) == 300


def test_strict_tool_input():
    assert common.tool_input("") == ({}, None)
    assert common.tool_input('{"a": [1, 2]}') == ({"a": [1, 2]}, None)
    for bad in ('{"a": 1', '{"a": NaN}', '[1]', '"s"', '{"a": 1} trailing'):
        value, why = common.tool_input(bad)
        assert value == {} and why


def test_strict_schema_detection():
    closed = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
              "additionalProperties": False}
    assert common.strict_ok(closed)
    assert not common.strict_ok({**closed, "required": []})
    assert not common.strict_ok({k: v for k, v in closed.items() if k != "additionalProperties"})
    nested = {**closed, "properties": {"a": {"type": "object", "properties": {}}}}
    assert not common.strict_ok(nested)
