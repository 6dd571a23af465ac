"""A `--net proxy` session's records: the egress log and the held requests.

The proxy (netproxy.py) writes both into the session directory, which the command never sees:
`egress.jsonl` (one line per connection) and `held/<id>.json` (one per request held for the
person). This module reads them back, masks what a listing must not show, and at commit sends
the held requests the person released -- from the host, under the same allowlist and address
guard the proxy applied (a name that now resolves to a private address is refused), to the
URL's own host (the client's Host header is never used to route) -- or drops them.
"""
import base64
import json
import os
import socket
import time

from overlord.sandbox import netallow
from overlord.text import escape_text
from overlord.txn import store

LOG_NAME = "egress.jsonl"
HELD_DIR = "held"
PREVIEW = 200                       # bytes of a held body shown in a listing
SECRET_WORDS = ("token", "secret", "key", "password", "auth", "cookie", "session")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length", "expect"}
STATUS_MAX = 8192                   # bytes of an answer's head read for its status line


def read_log(record_dir):
    """The log's lines, oldest first; a torn last line (a crash mid-write) is left out."""
    path = os.path.join(record_dir, LOG_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return store.parse_jsonl(data)


def _held_dir(record_dir):
    return os.path.join(record_dir, HELD_DIR)


def held(record_dir):
    """Every held request's full record, in id (arrival) order."""
    folder = _held_dir(record_dir)
    try:
        names = sorted((n for n in os.listdir(folder) if n.endswith(".json") and n.startswith("h")
                        and n[1:-5].isdigit()), key=lambda n: (int(n[1:-5]), n))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                record = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("id") == name[:-5]:
            out.append(record)
    return out


def _secret(name):
    low = str(name).lower()
    return any(word in low for word in SECRET_WORDS)


def masked(record):
    """A copy for listings: credential headers as ***, the body as a short preview + size."""
    out = {k: v for k, v in record.items() if k != "body_b64"}
    out["headers"] = [[n, "***" if _secret(n) else v] for n, v in record.get("headers") or ()]
    body = _body(record)
    out["bytes"] = len(body)
    out["body_preview"] = escape_text(body[:PREVIEW].decode("utf-8", "replace")) + (
        "..." if len(body) > PREVIEW else "")
    return out


def _body(record):
    try:
        return base64.b64decode(record.get("body_b64") or "", validate=True)
    except ValueError:
        return b""


def _save(record_dir, record):
    store.write_json_atomic(os.path.join(_held_dir(record_dir), record["id"] + ".json"), record)


def _chosen(record_dir, ids):
    waiting = [r for r in held(record_dir) if r.get("state") == "held"]
    if ids is None:
        return waiting
    wanted = set(ids)
    return [r for r in waiting if r["id"] in wanted]


def release(record_dir, ids=None, allow=(), timeout=30, getaddrinfo=None, cap=None):
    """Send the chosen held requests (all when ids is None) in id order; each record is
    updated (released or failed, status, error, released_at). Returns
    [{"id", "ok", "status", "error"}]."""
    results = []
    for record in _chosen(record_dir, ids):
        status, error = None, None
        try:
            status = _send(record, allow, timeout, getaddrinfo, cap)
        except netallow.Refused as exc:
            error = f"refused: {exc}"
        except (OSError, ValueError) as exc:
            error = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        record.update(state="released" if status is not None else "failed", status=status,
                      error=error, released_at=time.time())
        _save(record_dir, record)
        results.append({"id": record["id"], "ok": status is not None, "status": status,
                        "error": error})
    return results


def drop(record_dir, ids=None):
    """Mark the chosen held requests dropped (never sent); returns their ids."""
    out = []
    for record in _chosen(record_dir, ids):
        record.update(state="dropped", released_at=None)
        _save(record_dir, record)
        out.append(record["id"])
    return out


def _clean(text):
    """A header name or value as it may go on the wire: no CR, LF or NUL smuggled in."""
    text = str(text)
    if any(c in text for c in "\r\n\0"):
        raise ValueError("a held header carries a line break or NUL")
    return text


def _send(record, allow, timeout, getaddrinfo, cap):
    """One held request, to the checked address of its URL's host; the answer's status."""
    host, port = record["host"], int(record["port"])
    method, path = _clean(record["method"]), _clean(record.get("path") or "/")
    if not path.startswith("/") or " " in path or " " in method:
        raise ValueError("a held request line is malformed")
    addresses = netallow.resolve(host, port, list(allow or ()), getaddrinfo, cap=cap)
    body = _body(record)
    shown = netallow.normal(host)
    if ":" in shown:
        shown = f"[{shown}]"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {shown}" + ("" if port == 80 else f":{port}")]
    for name, value in record.get("headers") or ():
        if str(name).lower() not in HOP_BY_HOP and not str(name).lower().startswith("proxy-"):
            lines.append(f"{_clean(name)}: {_clean(value)}")
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    last = None
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
        except OSError as exc:
            sock.close()
            last = exc
            continue
        with sock:
            sock.sendall(head + body)
            return _status(sock)
    raise last or OSError(f"cannot connect to {host}")


def _status(sock):
    """The status of the answer (interim 1xx heads skipped)."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data and len(data) < STATUS_MAX:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit() \
                or len(parts[1]) != 3:
            raise ValueError("the upstream did not answer HTTP")
        status = int(parts[1])
        end = data.find(b"\r\n\r\n")
        if 100 <= status < 200 and status != 101 and end >= 0:
            data = data[end + 4:]
            continue
        return status
