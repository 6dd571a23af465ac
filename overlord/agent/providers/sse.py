"""A small server-sent-events reader (the WHATWG HTML "event stream" format).

Lines end in CRLF, LF or a lone CR; `field: value` lines build an event, a blank line
dispatches it; `data:` lines join with "\\n"; a line starting with ":" is a comment (keep-alive);
an event without `event:` is a "message". A stream that ends inside an event (fields read but no
blank line yet, or a last line with no terminator) raises Truncated: the spec says to drop such an
event silently, but for a model reply that is a dropped connection and must not pass for an end.
"""
import collections

Event = collections.namedtuple("Event", "event data id")


class Truncated(Exception):
    """The stream ended in the middle of an event."""


def _lines(chunks):
    """Split what file.readline() returns into lines, whatever the terminator."""
    first = True
    for raw in chunks:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        if first:
            raw, first = raw.lstrip("\ufeff"), False
        ended = raw.endswith(("\n", "\r"))
        parts = raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        tail = parts.pop()          # "" after a terminator, else a line cut at end of stream
        yield from parts
        if not ended and tail:
            raise Truncated("the stream ended in the middle of a line")


def parse(chunks):
    """Yield Event(event, data, id) for each dispatched event of a stream of lines."""
    event, data, last_id, pending = "", [], None, False
    for line in _lines(chunks):
        if line == "":
            if data:
                yield Event(event or "message", "\n".join(data), last_id)
            event, data, pending = "", [], False
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
            pending = True
        elif field == "event":
            event, pending = value, True
        elif field == "id" and "\0" not in value:
            last_id = value
    if pending:
        raise Truncated("the stream ended before the event's closing blank line")
