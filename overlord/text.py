"""Text that came from outside OVERLORD (a command, a file, a model), made safe to show.

Every byte a command or a model chose is escaped before it reaches a terminal, and every path
that is not valid UTF-8 reaches JSON as an escaped `path` plus its exact bytes (`path_b64`),
never as a lone surrogate. Pure functions: every layer may import this module.
"""
import json
import os


def escape_path(path):
    """Printable form of a path: invalid bytes as \\xNN, control characters escaped; the
    tree root itself is '.'."""
    return "." if path == "" else _escape(path)


def escape_text(text):
    """A line of a file made safe for a terminal: tabs kept, other controls escaped."""
    return _escape(text, keep="\t\\")


def escape_block(text):
    """Multi-line text (a model's reply, a tool's output) for a terminal: newlines and tabs
    kept, every other control character (ESC, CR, BEL, ...) escaped."""
    return _escape(text, keep="\n\t\\")


def _escape(text, keep=""):
    out = []
    for ch in text:
        if ch in keep:
            out.append(ch)
            continue
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:          # an undecodable byte (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:        # any other lone surrogate
            out.append(f"\\u{code:04x}")
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif not ch.isprintable():
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def cause_text(cause):
    """A savepoint's cause in words (unescaped: a command or a model chose parts of it):
    the command line, `turn 2 write_file call_1: write_file(a.txt)`, `mcp claude-code exec 7:
    exec(make)` (a harness's tool call, with the name its client gave), `revert of SID`."""
    if not cause:
        return ""
    if cause.get("kind") == "command":
        return cause.get("command", "")
    if "turn" in cause or "tool" in cause:
        head = " ".join(str(cause[k]) for k in ("turn", "tool", "call") if cause.get(k) is not None)
        head = f"turn {head}" if "turn" in cause else head
        if cause.get("kind") in ("mcp", "hook", "daemon"):     # a harness's call: whose
            head = " ".join(str(p) for p in (cause["kind"], cause.get("client"), head) if p)
        return f"{head}: {cause['summary']}" if cause.get("summary") else head
    if cause.get("kind") == "revert":
        return f"revert of {cause.get('of')}"
    if cause.get("kind") == "import" and cause.get("from"):
        return f"import of {cause['from']}" + (f" from {cause['host']}" if cause.get("host") else "")
    return cause.get("summary") or json.dumps(cause, sort_keys=True)


def finding_line(finding):
    """One content-gate finding as a person reads it: `warn  secrets  config.py:3  AWS access
    key AKIA…` (every byte that came from the session escaped)."""
    where = escape_path(finding.path) + (f":{finding.line}" if finding.line else "")
    return f"{finding.severity}  {finding.kind}  {where}  {escape_text(str(finding.what))}"


def is_exact(text):
    """True when a str holds no lone surrogate, so JSON carries it exactly as UTF-8."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def path_fields(path, key="path"):
    """{key: path} for JSON; for a name that is not valid UTF-8, {key: escaped form,
    key_b64: the exact bytes, base64}."""
    if is_exact(path):
        return {key: path}
    return {key: escape_path(path), f"{key}_b64": _b64(path)}


def _b64(path):
    import base64            # only for a name that is not UTF-8: not on every command's path
    try:
        data = os.fsencode(path)
    except UnicodeEncodeError:  # a lone surrogate a peer sent as JSON ("\ud800"): no fs bytes
        data = path.encode("utf-8", "surrogatepass")
    return base64.b64encode(data).decode("ascii")


# keys whose strings are prose (messages, model text): escaped only, never given a *_b64
PROSE = ("error", "words", "message", "summary", "text", "output", "note", "title")


def jsonable(value):
    """value with every str that is not valid UTF-8 made safe for strict JSON parsers: in a
    dict, `key` becomes the escaped text and `key_b64` its exact bytes (path_fields), except
    for prose keys, which are only escaped; in a list or on its own, the escaped text."""
    if isinstance(value, str):
        return value if is_exact(value) else escape_path(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            k = jsonable(k) if isinstance(k, str) else k
            if isinstance(v, str) and not is_exact(v) and k not in PROSE and f"{k}_b64" not in value:
                out.update(path_fields(v, k))
            else:
                out[k] = jsonable(v)
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
