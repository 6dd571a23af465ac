"""Held writes: the proxy keeps side-effecting plain-HTTP requests as held/<id>.json (202,
X-Overlord-Held), and overlord/sandbox/egress.py lists them masked, releases them in order
from the host under the same address guard, or drops them."""
import base64
import json
import os
import socket
import stat
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxylib import Echo, Proxy, Upstream, parse_response, resolver  # noqa: E402

from overlord.sandbox import egress  # noqa: E402

NAMES = {"up.test": "127.0.0.1"}


@pytest.fixture
def up():
    with Upstream() as server:
        yield server


def holding(tmp_path, **kw):
    kw.setdefault("names", NAMES)
    kw.setdefault("allow", ["up.test"])
    return Proxy(str(tmp_path / "sess"), hold_writes=True, **kw)


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_side_effecting_methods_are_held(tmp_path, up, method):
    (tmp_path / "sess").mkdir()
    (tmp_path / "sess" / "egress-command.json").write_text(json.dumps({"layer": 1, "cause": "pip upload"}))
    with holding(tmp_path) as px:
        status, headers, body = px.request(method, f"http://up.test:{up.port}/api?x=1",
                                           [("Authorization", "Bearer s3cret"),
                                            ("Proxy-Authorization", "Basic eA=="),
                                            ("Connection", "keep-alive"), ("X-Kind", "k")],
                                           body=b"payload")
        assert status == 202 and headers["x-overlord-held"] == "h0001"
        assert body.startswith(b"overlord: ") and body.count(b"\n") == 1
        [line] = px.wait_lines(1)
    assert up.requests == []                           # nothing was sent
    assert line["held"] == "h0001" and line["status"] == 202 and line["allowed"] is True
    assert line["method"] == method and line["bytes_up"] == 0
    path = tmp_path / "sess" / "held" / "h0001.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    [record] = egress.held(str(tmp_path / "sess"))
    assert record["id"] == "h0001" and record["method"] == method and record["state"] == "held"
    assert record["url"] == f"http://up.test:{up.port}/api?x=1" and record["path"] == "/api?x=1"
    assert record["host"] == "up.test" and record["port"] == up.port
    assert base64.b64decode(record["body_b64"]) == b"payload" and record["bytes"] == 7
    assert record["layer"] == 1 and record["cause"] == "pip upload"
    assert record["status"] is None and record["error"] is None and record["released_at"] is None
    names = [n.lower() for n, _v in record["headers"]]
    assert "authorization" in names and "x-kind" in names
    assert "proxy-authorization" not in names and "connection" not in names


def test_get_passes_and_connect_is_never_held(tmp_path, up):
    with Echo() as echo, holding(tmp_path) as px:
        assert px.get(f"http://up.test:{up.port}/bytes/4")[0] == 200
        with px.connect() as s:
            s.sendall(f"CONNECT up.test:{echo.port} HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\n\r\n".encode())
            got = b""
            while b"POST /" not in got:
                got += s.recv(1000)
            assert got.startswith(b"HTTP/1.1 200")
        lines = px.wait_lines(2)
    assert [line["held"] for line in lines] == [None, None]
    assert len(up.requests) == 1 and not os.path.exists(tmp_path / "sess" / "held")


def test_chunked_held_body_is_decoded_and_big_bodies_refused(tmp_path, up):
    with holding(tmp_path) as px:
        data = (f"POST http://up.test:{up.port}/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                "4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n").encode()
        status, headers, _b = parse_response(px.raw(data))
        assert status == 202
        too_big = (f"PUT http://up.test:{up.port}/big HTTP/1.1\r\n"
                   f"Content-Length: {17 * 1024 * 1024}\r\n\r\n").encode()
        assert parse_response(px.raw(too_big))[0] == 413
        lines = px.wait_lines(2)
    [record] = egress.held(str(tmp_path / "sess"))
    assert base64.b64decode(record["body_b64"]) == b"wikipedia"
    assert lines[1]["status"] == 413 and lines[1]["held"] is None


def test_refused_hosts_are_not_held(tmp_path, up):
    with holding(tmp_path) as px:
        assert px.request("POST", f"http://other.test:{up.port}/", body=b"x")[0] == 403
        assert px.request("POST", f"http://127.0.0.1:{up.port}/", body=b"x")[0] == 403
        px.wait_lines(2)
    assert egress.held(str(tmp_path / "sess")) == []


def test_concurrent_holds_get_distinct_ids_in_order(tmp_path, up):
    with holding(tmp_path) as px:
        got = []

        def one(i):
            got.append(px.request("POST", f"http://up.test:{up.port}/{i}", body=b"%d" % i)[1]
                       ["x-overlord-held"])
        threads = [threading.Thread(target=one, args=(i,)) for i in range(25)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        px.wait_lines(25)
    ids = [r["id"] for r in egress.held(str(tmp_path / "sess"))]
    assert sorted(got) == ids == [f"h{i:04d}" for i in range(1, 26)]


def _hold_three(tmp_path, up):
    with holding(tmp_path) as px:
        for i, method in enumerate(("POST", "PUT", "DELETE")):
            assert px.request(method, f"http://up.test:{up.port}/r{i}", body=b"b%d" % i)[0] == 202
        px.wait_lines(3)
    return str(tmp_path / "sess")


def test_release_in_order_with_statuses(tmp_path, up):
    sess = _hold_three(tmp_path, up)
    got = egress.release(sess, allow=["up.test"], getaddrinfo=resolver(NAMES), timeout=5)
    assert [(r["id"], r["ok"], r["status"], r["error"]) for r in got] == [
        ("h0001", True, 200, None), ("h0002", True, 200, None), ("h0003", True, 200, None)]
    assert [(r["method"], r["path"], r["body"]) for r in up.requests] == [
        ("POST", "/r0", b"b0"), ("PUT", "/r1", b"b1"), ("DELETE", "/r2", b"b2")]
    for r in up.requests:
        names = {k.lower(): v for k, v in r["headers"]}
        assert names["connection"] == "close" and names["host"] == f"up.test:{up.port}"
    records = egress.held(sess)
    assert [r["state"] for r in records] == ["released"] * 3
    assert all(r["status"] == 200 and r["released_at"] for r in records)
    assert egress.release(sess, allow=["up.test"], getaddrinfo=resolver(NAMES)) == []   # none left


def test_release_chosen_then_drop_the_rest(tmp_path, up):
    sess = _hold_three(tmp_path, up)
    got = egress.release(sess, ids=["h0003", "h0001"], allow=["up.test"],
                         getaddrinfo=resolver(NAMES), timeout=5)
    assert [r["id"] for r in got] == ["h0001", "h0003"]
    assert [r["path"] for r in up.requests] == ["/r0", "/r2"]
    assert egress.drop(sess) == ["h0002"]
    assert [r["state"] for r in egress.held(sess)] == ["released", "dropped", "released"]
    assert egress.drop(sess) == []
    assert egress.release(sess, allow=["up.test"], getaddrinfo=resolver(NAMES)) == []
    assert len(up.requests) == 2


def test_release_records_the_upstream_status_and_failures(tmp_path, up):
    with holding(tmp_path) as px:
        assert px.request("POST", f"http://up.test:{up.port}/status/418", body=b"t")[0] == 202
        px.wait_lines(1)
    sess = str(tmp_path / "sess")
    [r] = egress.release(sess, allow=["up.test"], getaddrinfo=resolver(NAMES), timeout=5)
    assert r["ok"] and r["status"] == 418
    assert egress.held(sess)[0]["status"] == 418


def test_release_refused_for_a_host_now_disallowed_or_private(tmp_path, up):
    sess = _hold_three(tmp_path, up)
    # no longer on the list
    [a] = egress.release(sess, ids=["h0001"], allow=["other.test"], getaddrinfo=resolver(NAMES))
    # allowed by a wildcard only: 127.0.0.1 is not opened by a wildcard
    [b] = egress.release(sess, ids=["h0002"], allow=["*.test"], getaddrinfo=resolver(NAMES))
    # the name resolves elsewhere now: a private address, not named
    [c] = egress.release(sess, ids=["h0003"], allow=(), getaddrinfo=resolver({"up.test": "10.0.0.5"}))
    assert not a["ok"] and "allowlist" in a["error"]
    assert not b["ok"] and "127.0.0.1" in b["error"]
    assert not c["ok"] and "10.0.0.5" in c["error"]
    assert up.requests == []
    records = egress.held(sess)
    assert [r["state"] for r in records] == ["failed"] * 3
    assert all(r["error"] and r["status"] is None and r["released_at"] for r in records)


def test_release_to_a_dead_upstream_fails_cleanly(tmp_path, up):
    sess = _hold_three(tmp_path, up)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    path = os.path.join(sess, "held", "h0001.json")
    record = json.load(open(path))
    record["port"] = port
    with open(path, "w") as f:
        json.dump(record, f)
    [r] = egress.release(sess, ids=["h0001"], allow=["up.test"], getaddrinfo=resolver(NAMES),
                         timeout=2)
    assert not r["ok"] and r["error"] and egress.held(sess)[0]["state"] == "failed"


def test_masked_hides_credentials_and_previews_the_body(tmp_path, up):
    with holding(tmp_path) as px:
        body = b"\x1b[31mred\x1b[0m" + b"z" * 500
        px.request("POST", f"http://up.test:{up.port}/m",
                   [("Authorization", "Bearer tok"), ("Cookie", "a=b"), ("X-Api-Key", "k1"),
                    ("X-Auth-Token", "t1"), ("X-Password", "p"), ("Accept", "text/plain")],
                   body=body)
        px.wait_lines(1)
    [record] = egress.held(str(tmp_path / "sess"))
    shown = egress.masked(record)
    values = dict((n.lower(), v) for n, v in shown["headers"])
    for secret in ("authorization", "cookie", "x-api-key", "x-auth-token", "x-password"):
        assert values[secret] == "***", secret
    assert values["accept"] == "text/plain"
    assert "body_b64" not in shown and shown["bytes"] == len(body)
    assert "\x1b" not in shown["body_preview"] and "red" in shown["body_preview"]
    assert len(shown["body_preview"]) < 300
    assert "tok" not in json.dumps(shown)
    assert record["headers"] != shown["headers"]          # a copy: the record is unchanged


def test_read_log_tolerates_a_torn_last_line(tmp_path):
    sess = tmp_path / "s"
    sess.mkdir()
    (sess / "egress.jsonl").write_text('{"host": "a"}\n{"host": "b"}\n{"host": "c"')
    assert [line["host"] for line in egress.read_log(str(sess))] == ["a", "b"]
    assert egress.read_log(str(tmp_path / "none")) == []
    assert egress.held(str(tmp_path / "none")) == []
