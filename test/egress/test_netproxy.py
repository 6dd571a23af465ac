"""The egress proxy (overlord/sandbox/netproxy.py) on a 127.0.0.1 listener in the host
namespace: forwarding, tunnels, the allowlist and address guard, bad input and floods, and
exactly one egress.jsonl line per connection whatever happens to it."""
import json
import os
import resource
import socket
import stat
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxylib import Echo, Proxy, Silent, Upstream, parse_response, read_all  # noqa: E402

NAMES = {"up.test": "127.0.0.1", "a.up.test": "127.0.0.1", "b.a.up.test": "127.0.0.1",
         "evil.test": "127.0.0.1", "pub.test": "93.184.216.34",
         "localhost": ["127.0.0.1", "::1"]}
FIELDS = {"ts", "host", "port", "method", "path", "allowed", "status", "bytes_up", "bytes_down",
          "duration_ms", "layer", "cause", "reason", "held"}


@pytest.fixture
def up():
    with Upstream() as server:
        yield server


@pytest.fixture
def echo():
    with Echo() as server:
        yield server


def proxy(tmp_path, **kw):
    kw.setdefault("names", NAMES)
    kw.setdefault("allow", ["up.test"])
    return Proxy(str(tmp_path / "sess"), **kw)


def test_forward_get_and_its_line(tmp_path, up):
    (tmp_path / "sess").mkdir()
    (tmp_path / "sess" / "egress-command.json").write_text(json.dumps({"layer": 3, "cause": "curl x"}))
    with proxy(tmp_path) as px:
        status, headers, body = px.get(f"http://up.test:{up.port}/bytes/1000?q=1",
                                       [("Proxy-Authorization", "Basic eA=="),
                                        ("Connection", "keep-alive, X-Drop"), ("X-Drop", "1"),
                                        ("X-Keep", "yes")])
        assert status == 200 and body == b"x" * 1000
        assert headers["connection"] == "close"
        [line] = px.wait_lines(1)
    assert set(line) == FIELDS
    assert line["host"] == "up.test" and line["port"] == up.port and line["method"] == "GET"
    assert line["path"] == "/bytes/1000?q=1" and line["allowed"] is True
    assert line["status"] == 200 and line["bytes_down"] == 1000 and line["bytes_up"] == 0
    assert line["layer"] == 3 and line["cause"] == "curl x" and line["reason"] is None
    assert line["held"] is None and line["duration_ms"] > 0 and abs(line["ts"] - time.time()) < 60
    [got] = up.requests
    names = {k.lower(): v for k, v in got["headers"]}
    assert got["path"] == "/bytes/1000?q=1"
    assert names["host"] == f"up.test:{up.port}" and names["connection"] == "close"
    assert "proxy-authorization" not in names and "x-drop" not in names and names["x-keep"] == "yes"
    mode = os.stat(tmp_path / "sess" / "egress.jsonl").st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_post_body_and_chunked_request_reframed(tmp_path, up):
    with proxy(tmp_path) as px:
        status, _h, body = px.request("POST", f"http://up.test:{up.port}/echo", body=b"hello")
        assert status == 200 and json.loads(body)["body"] == "hello"
        chunked = (f"PUT http://up.test:{up.port}/echo HTTP/1.1\r\nHost: up.test\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n").encode()
        status, _h, body = parse_response(px.raw(chunked))
        assert status == 200
        got = up.requests[-1]
        assert got["body"] == b"abcde"
        names = {k.lower(): v for k, v in got["headers"]}
        assert names["content-length"] == "5" and "transfer-encoding" not in names
        lines = px.wait_lines(2)
    assert [line["bytes_up"] for line in lines] == [5, 5]


def test_chunked_response_relayed_and_ended(tmp_path, up):
    with proxy(tmp_path) as px:
        status, headers, body = px.get(f"http://up.test:{up.port}/chunked/50")
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        assert body.endswith(b"0\r\n\r\n") and b"piece-49\n" in body
        [line] = px.wait_lines(1)
    assert line["bytes_down"] == len(body) and line["reason"] is None


def test_connect_tunnel_counts_bytes(tmp_path, echo):
    with proxy(tmp_path) as px:
        with px.connect() as s:
            s.sendall(f"CONNECT up.test:{echo.port} HTTP/1.1\r\nHost: up.test\r\n\r\nearly".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(1)
            assert head.startswith(b"HTTP/1.1 200 ")
            got = b""
            while len(got) < 5:
                got += s.recv(100)
            assert got == b"early"
            payload = os.urandom(300000)
            s.sendall(payload)
            back = b""
            while len(back) < len(payload):
                back += s.recv(65536)
            assert back == payload
            s.shutdown(socket.SHUT_WR)
            assert read_all(s) == b""
        [line] = px.wait_lines(1)
    assert line["method"] == "CONNECT" and line["path"] is None and line["status"] == 200
    assert line["host"] == "up.test" and line["port"] == echo.port and line["allowed"] is True
    assert line["bytes_up"] == 300005 and line["bytes_down"] == 300005


def test_connect_to_any_port_and_refused_the_same_way(tmp_path, echo):
    with proxy(tmp_path) as px:
        answer = px.raw(f"CONNECT other.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
        assert parse_response(answer)[0] == 403
        [line] = px.wait_lines(1)
    assert line["allowed"] is False and "allowlist" in line["reason"]
    assert echo.connections == 0


def test_allowlist_refusal_and_suffix_matching(tmp_path, up):
    names = dict(NAMES)
    with proxy(tmp_path, allow=["*.up.test", "up.test"], names=names) as px:
        assert px.get(f"http://a.up.test:{up.port}/bytes/1")[0] == 403   # a wildcard opens no loopback
        status, headers, body = px.get(f"http://other.test:{up.port}/x")
        assert status == 403 and headers["content-type"].startswith("text/plain")
        assert body.count(b"\n") == 1 and body.startswith(b"overlord: ")
        assert px.get(f"http://up.test:{up.port}/bytes/1")[0] == 200
        lines = px.wait_lines(3)
    assert [(line["host"], line["allowed"], line["status"]) for line in lines] == [
        ("a.up.test", False, 403), ("other.test", False, 403), ("up.test", True, 200)]
    assert "127.0.0.1" in lines[0]["reason"] and "loopback" in lines[0]["reason"]
    assert len(up.requests) == 1


def test_suffix_matches_below_only_with_public_addresses(tmp_path):
    seen = []

    def fake(host, port, family=0, type=0, proto=0, flags=0):
        seen.append(host)
        if host in ("a.pub.test", "b.a.pub.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", port))]
        raise socket.gaierror(socket.EAI_NONAME, "no")
    # 192.0.2.1 is TEST-NET (not public): refused even though the suffix matches
    with Proxy(str(tmp_path / "s"), allow=["*.pub.test"], getaddrinfo=fake, timeout=2) as px:
        assert px.get("http://pub.test/")[0] == 403               # the suffix itself: not below
        assert px.get("http://b.a.pub.test/")[0] == 403           # below, but not public
        assert px.get("http://x.pub.test/")[0] == 502             # below, no such name
        lines = px.wait_lines(3)
    assert "allowlist" in lines[0]["reason"] and lines[0]["allowed"] is False
    assert "192.0.2.1" in lines[1]["reason"]
    assert lines[2]["allowed"] is True and lines[2]["status"] == 502
    assert "pub.test" not in seen                                 # refused before any lookup


def test_loopback_refused_unless_named(tmp_path, up):
    with proxy(tmp_path, allow=()) as px:                # record only: public only
        assert px.get(f"http://up.test:{up.port}/bytes/1")[0] == 403      # resolves to 127.0.0.1
        assert px.get(f"http://127.0.0.1:{up.port}/bytes/1")[0] == 403
        assert px.get(f"http://[::1]:{up.port}/bytes/1")[0] == 403
        assert px.get(f"http://localhost:{up.port}/bytes/1")[0] == 403
        assert px.get(f"http://[::ffff:127.0.0.1]:{up.port}/bytes/1")[0] == 403
        assert px.get(f"http://10.1.2.3:{up.port}/")[0] == 403
        assert px.get(f"http://169.254.169.254/latest/meta-data")[0] == 403
        lines = px.wait_lines(7)
    assert all(line["allowed"] is False for line in lines)
    assert "resolves to 127.0.0.1" in lines[0]["reason"]
    assert up.requests == []


def test_ip_literal_named_exactly_is_allowed(tmp_path, up):
    with proxy(tmp_path, allow=["127.0.0.1"]) as px:
        assert px.get(f"http://127.0.0.1:{up.port}/bytes/3")[0] == 200
        assert px.get(f"http://up.test:{up.port}/bytes/3")[0] == 403    # a name is not the address
        lines = px.wait_lines(2)
    assert lines[0]["host"] == "127.0.0.1" and lines[0]["allowed"] is True
    assert lines[1]["allowed"] is False


@pytest.mark.parametrize("data, status", [
    (b"hello\r\n\r\n", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400),                       # origin-form
    (b"GET http://up.test/ HTTP/2.0\r\n\r\n", 400),
    (b"GET http://up.test/ HTTP/1.1\nHost: x\n\n", 400),              # bare LF
    (b"GET http://user@up.test/ HTTP/1.1\r\n\r\n", 400),
    (b"GET https://up.test/ HTTP/1.1\r\n\r\n", 400),
    (b"GET http://up.test/ HTTP/1.1\r\n folded: x\r\n\r\n", 400),
    (b"GET http://up.test/ HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
    (b"CONNECT up.test HTTP/1.1\r\n\r\n", 400),                        # no port
    (b"CONNECT up.test:0 HTTP/1.1\r\n\r\n", 400),
    (b"GET http://up\x00.test/ HTTP/1.1\r\n\r\n", 400),
])
def test_garbage_gets_400_and_a_line(tmp_path, up, data, status):
    with proxy(tmp_path) as px:
        answer = px.raw(data)
        got, headers, body = parse_response(answer)
        assert got == status, answer
        assert body.startswith(b"overlord: ") and body.count(b"\n") == 1
        [line] = px.wait_lines(1)
    assert line["status"] == status and line["allowed"] is False and line["reason"]
    assert up.requests == []


def test_header_cap(tmp_path, up):
    with proxy(tmp_path) as px:
        big = b"X-Big: " + b"a" * (70 * 1024) + b"\r\n"
        answer = px.raw(f"GET http://up.test:{up.port}/ HTTP/1.1\r\n".encode() + big + b"\r\n")
        assert parse_response(answer)[0] in (431, 400)
        ok = b"X-Ok: " + b"a" * (60 * 1024) + b"\r\n"
        answer = px.raw(f"GET http://up.test:{up.port}/bytes/1 HTTP/1.1\r\n".encode() + ok + b"\r\n")
        assert parse_response(answer)[0] == 200
        lines = px.wait_lines(2)
    assert lines[0]["status"] in (431, 400) and "KiB" in lines[0]["reason"]
    assert len(up.requests) == 1


def test_content_length_with_transfer_encoding_is_refused(tmp_path, up):
    with proxy(tmp_path) as px:
        data = (f"POST http://up.test:{up.port}/echo HTTP/1.1\r\nContent-Length: 4\r\n"
                "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: up.test\r\n\r\n")
        assert parse_response(px.raw(data.encode()))[0] == 400
        data = (f"POST http://up.test:{up.port}/echo HTTP/1.1\r\nContent-Length: 4\r\n"
                "Content-Length: 40\r\n\r\nabcd")
        assert parse_response(px.raw(data.encode()))[0] == 400
        data = (f"POST http://up.test:{up.port}/echo HTTP/1.1\r\n"
                "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n")
        assert parse_response(px.raw(data.encode()))[0] in (400, 501)
        lines = px.wait_lines(3)
    assert "smuggling" in lines[0]["reason"]
    assert up.requests == []


def test_pipelined_second_request_never_reaches_the_upstream(tmp_path, up):
    with proxy(tmp_path) as px:
        first = f"GET http://up.test:{up.port}/bytes/2 HTTP/1.1\r\nHost: up.test\r\n\r\n"
        second = f"GET http://up.test:{up.port}/smuggled HTTP/1.1\r\nHost: up.test\r\n\r\n"
        answer = px.raw((first + second).encode())
        assert answer.count(b"HTTP/1.1 ") == 1 and parse_response(answer)[0] == 200
        # the body of a POST carrying a request behind its declared length
        body = "abcd" + f"DELETE /smuggled2 HTTP/1.1\r\nHost: up.test:{up.port}\r\n\r\n"
        post = (f"POST http://up.test:{up.port}/echo HTTP/1.1\r\nContent-Length: 4\r\n\r\n{body}")
        answer = px.raw(post.encode())
        assert parse_response(answer)[0] == 200
        lines = px.wait_lines(2)
    assert [r["path"] for r in up.requests] == ["/bytes/2", "/echo"]
    assert up.requests[1]["body"] == b"abcd"
    assert "not forwarded" in lines[0]["reason"] and "not forwarded" in lines[1]["reason"]
    assert len(lines) == 2


def test_upstream_never_answering_gives_504_within_the_timeout(tmp_path):
    with Silent() as silent, proxy(tmp_path, timeout=0.5) as px:
        t = time.monotonic()
        status = px.get(f"http://up.test:{silent.port}/")[0]
        took = time.monotonic() - t
        [line] = px.wait_lines(1)
    assert status == 504 and 0.4 < took < 5
    assert line["status"] == 504 and line["allowed"] is True and "0.5s" in line["reason"]


def test_env_timeout_overrides_config(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLORD_PROXY_TIMEOUT", "0.3")
    with Silent() as silent, proxy(tmp_path, timeout=60) as px:
        t = time.monotonic()
        assert px.get(f"http://up.test:{silent.port}/")[0] == 504
        assert time.monotonic() - t < 5


def test_cannot_connect_is_502(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                    # nothing listens there now
    with proxy(tmp_path) as px:
        assert px.get(f"http://up.test:{port}/")[0] == 502
        assert px.get("http://nosuch.test/")[0] in (403, 502)
        lines = px.wait_lines(2)
    assert lines[0]["status"] == 502 and "cannot connect" in lines[0]["reason"]


def test_client_disconnecting_mid_body_and_silent_clients(tmp_path, up):
    with proxy(tmp_path, timeout=1) as px:
        with px.connect() as s:
            s.sendall(f"POST http://up.test:{up.port}/echo HTTP/1.1\r\nContent-Length: 1000\r\n\r\nabc".encode())
            time.sleep(0.05)
        with px.connect():
            pass                                      # connects, says nothing, leaves
        with px.connect() as s:
            s.sendall(b"GET http://up.test")           # half a head, then silence
            assert parse_response(read_all(s))[0] == 408
        assert px.get(f"http://up.test:{up.port}/bytes/1")[0] == 200
        lines = px.wait_lines(4)
        time.sleep(0.2)
        assert len(px.lines()) == 4
    by = {line["reason"] and line["reason"].split(" ")[1]: line for line in lines}
    mid = [line for line in lines if line["method"] == "POST"][0]
    assert mid["status"] is None and "mid" in mid["reason"] and mid["bytes_up"] <= 3
    assert any("without sending" in (line["reason"] or "") for line in lines)
    assert any(line["status"] == 408 for line in lines)
    assert by


def test_thousand_idle_connections_do_not_stop_another_client(tmp_path, up):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    with proxy(tmp_path, max_connections=32, timeout=20) as px:
        flood = []
        try:
            for _ in range(1000):
                flood.append(socket.create_connection(("127.0.0.1", px.port)))
            for s in flood[:50]:
                s.sendall(b"GET http://up.test")      # half-sent heads
            t = time.monotonic()
            assert px.get(f"http://up.test:{up.port}/bytes/10")[0] == 200
            assert time.monotonic() - t < 5
        finally:
            for s in flood:
                s.close()
        lines = px.wait_lines(1001)
    assert sum(1 for line in lines if line["status"] == 200) == 1
    assert len(lines) == 1001


def test_beyond_max_connections_503_and_the_rest_served(tmp_path, echo, up):
    with proxy(tmp_path, max_connections=2) as px:
        tunnels = []
        for _ in range(2):
            s = px.connect()
            s.sendall(f"CONNECT up.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
            assert s.recv(100).startswith(b"HTTP/1.1 200")
            tunnels.append(s)
        status, _h, body = px.get(f"http://up.test:{up.port}/bytes/1")
        assert status == 503 and body.startswith(b"overlord: ")
        for s in tunnels:
            s.close()
        deadline = time.monotonic() + 10
        while px.get(f"http://up.test:{up.port}/bytes/1")[0] != 200:
            assert time.monotonic() < deadline
        lines = px.wait_lines(4)
    assert any(line["status"] == 503 and "at most 2" in line["reason"] for line in lines)


def test_serve_survives_a_resolver_that_raises(tmp_path, up):
    def broken(*a, **kw):
        raise RuntimeError("boom")
    with Proxy(str(tmp_path / "s"), allow=["up.test"], getaddrinfo=broken) as px:
        status = px.get(f"http://up.test:{up.port}/")[0]
        assert status in (500, 502)
        [line] = px.wait_lines(1)
        assert line["status"] == status
    with proxy(tmp_path) as px:
        assert px.get(f"http://up.test:{up.port}/bytes/1")[0] == 200


def test_concurrent_clients_each_one_line(tmp_path, up):
    with proxy(tmp_path) as px:
        results = []

        def one(i):
            results.append(px.get(f"http://up.test:{up.port}/bytes/{i}")[0])
        threads = [threading.Thread(target=one, args=(i,)) for i in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lines = px.wait_lines(60)
    assert results == [200] * 60 and len(lines) == 60
    assert sorted(line["bytes_down"] for line in lines) == list(range(60))


def test_a_missing_record_dir_cannot_serve(tmp_path):
    from overlord.sandbox import netproxy
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen()
    with pytest.raises(OSError):
        netproxy.serve(lst, netproxy.Config(record_dir=str(tmp_path / "nope")))
    lst.close()


def test_large_download_relayed_whole(tmp_path, up):
    size = 20 * 1024 * 1024 + 7
    with proxy(tmp_path) as px:
        status, headers, body = px.get(f"http://up.test:{up.port}/bytes/{size}")
        assert status == 200 and len(body) == size and body == b"x" * size
        [line] = px.wait_lines(1)
    assert line["bytes_down"] == size and line["reason"] is None
