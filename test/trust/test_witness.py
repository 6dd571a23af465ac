"""The witness: configuration, checkpoint --send, verify --witness against the reference
receiver and against receivers that lie, truncation under a witness even by a key holder,
and the automatic, throttled sender."""
import http.server
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import REPO, Ovl
from overlord.trust import audit, witness

SID = "20261201-074714-3fa2c1"


@pytest.fixture
def cli(home):
    return Ovl(home)


@pytest.fixture
def receiver(tmp_path, home):
    """The reference receiver, run as a person would: `overlord audit witness-serve`."""
    procs = []

    def start(*extra, store=None):
        store = store or tmp_path / "witness-store.json"
        proc = subprocess.Popen([sys.executable, "-m", "overlord", "audit", "witness-serve",
                                 "--bind", "127.0.0.1:0", "--store", str(store), *map(str, extra)],
                                env=dict(os.environ, OVERLORD_HOME=str(home), PYTHONPATH=REPO),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("witness listening on http://127.0.0.1:"), line
        return line.split()[3], store

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


class Fixed(http.server.BaseHTTPRequestHandler):
    """A witness that lies: serves whatever head the test gives it, accepts every POST."""
    body = b"{}"
    posts = []

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_POST(self):
        type(self).posts.append((time.monotonic(), json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def liar():
    handler = type("Liar", (Fixed,), {"posts": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/"
    yield handler
    server.shutdown()
    server.server_close()


def fill(n):
    for i in range(n):
        audit.append("session.open", sid=SID, n=i)


def post(url, head):
    req = urllib.request.Request(url, data=json.dumps(head).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def signed(seq, digest):
    return {"seq": seq, "hash": digest, "mac": audit.witness_mac(audit.load_key(), seq, digest)}


def await_(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


# -- configuration ------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["ftp://example.org/w", "file:///etc/passwd", "example.org", "http://"])
def test_a_witness_url_that_is_not_http_is_a_usage_error(cli, home, url):
    err = cli("audit", "witness", url, check=2).err
    assert err.count("\n") == 1 and err.startswith("overlord: witness URL must be http:// or https://")
    assert not (home / "witness.json").exists()


def test_the_config_is_kept_and_shown(cli, home):
    assert cli("audit", "witness", check=0).out == "no witness configured\n"
    cli("audit", "witness", "https://w.example/head", "--auto", check=0)
    assert json.loads((home / "witness.json").read_text()) == {"url": "https://w.example/head", "auto": True}
    shown = json.loads(cli("audit", "witness", "--json", check=0).out)
    assert shown == {"url": "https://w.example/head", "auto": True, "last_sent": None}
    cli("audit", "witness", "http://127.0.0.1:9/", check=0)
    assert json.loads((home / "witness.json").read_text())["auto"] is False


# -- the reference receiver ---------------------------------------------------------------------

def test_send_and_verify_against_the_reference_receiver(cli, home, receiver):
    url, store = receiver()
    cli("audit", "witness", url, check=0)
    fill(2)
    err = cli("audit", "verify", "--witness", check=1).err
    assert err.count("\n") == 1 and "holds no head yet" in err
    proc = cli("audit", "checkpoint", "--send", check=0)
    head = json.loads(proc.out)
    assert head["seq"] == 3 and f"sent seq 3 to the witness {url}" in proc.err
    held = json.loads(store.read_text())
    assert held == signed(3, head["hash"]) == get(url)
    report = json.loads(cli("audit", "verify", "--witness", "--json", check=0).out)
    assert report["witness"] == {"seq": 3, "hash": head["hash"], "ok": True, "why": None, "url": url}
    assert [p for p in os.listdir(store.parent) if p.startswith(store.name + ".tmp")] == []


def test_the_receiver_keeps_the_highest_head_and_refuses_a_lower_one(home, receiver):
    url, store = receiver()
    fill(3)
    lines = audit.entries()
    assert post(url, signed(2, lines[1]["mac"]))[0] == 200
    assert post(url, signed(3, lines[2]["mac"]))[0] == 200
    status, body = post(url, signed(1, lines[0]["mac"]))
    assert status == 409 and body["head"]["seq"] == 3
    status, body = post(url, signed(3, lines[1]["mac"]))           # another head at the same seq
    assert status == 409
    assert post(url, signed(3, lines[2]["mac"]))[0] == 200          # the same head again: fine
    assert post(url, {"seq": "4", "hash": "x"})[0] == 400
    assert get(url)["seq"] == 3
    url2, _ = receiver(store=store)                                   # restarted on its store
    assert get(url2) == get(url) and post(url2, signed(2, lines[1]["mac"]))[0] == 409


def test_a_receiver_with_the_key_refuses_a_head_it_cannot_verify(home, receiver, tmp_path):
    fill(1)
    url, _ = receiver("--key", home / "audit.key")
    head = signed(1, audit.head()["hash"])
    status, _ = post(url, dict(head, mac="0" * 64))
    assert status == 403
    assert post(url, head)[0] == 200


# -- truncation under a witness -----------------------------------------------------------------

def test_truncation_under_the_witness_fails_even_for_a_key_holder(cli, home, receiver):
    url, _ = receiver()
    cli("audit", "witness", url, check=0)
    fill(4)
    cli("audit", "checkpoint", "--send", check=0)             # the witness holds seq 5
    lines = (home / "audit.jsonl").read_bytes().splitlines(keepends=True)
    (home / "audit.jsonl").write_bytes(b"".join(lines[:3]))
    assert cli("audit", "verify", check=0)
    proc = cli("audit", "verify", "--witness", check=1)
    assert "witness: seq 5 NOT carried: the log stops at seq 3" in proc.out
    assert proc.err.count("\n") == 1 and "the witness's seq 5" in proc.err
    fill(4)                                                   # rewritten past it with the key
    assert audit.verify()["ok"] and audit.head()["seq"] == 7
    report = json.loads(cli("audit", "verify", "--witness", "--json", check=1).out)
    assert report["bad"] is None and not report["witness"]["ok"]
    assert "not the one recorded" in report["witness"]["why"]


# -- receivers that lie or do not answer --------------------------------------------------------

def test_a_witness_serving_a_higher_fake_head_is_refused(cli, home, liar):
    fill(3)
    liar.body = json.dumps({"seq": 999, "hash": "ab" * 32, "mac": "cd" * 32}).encode()
    cli("audit", "witness", liar.url, check=0)
    proc = cli("audit", "verify", "--witness", check=1)
    assert "witness: seq 999 NOT carried: the witnessed head's mac does not verify" in proc.out
    # a mac made with another key is no better
    other = audit.witness_mac(b"x" * 32, 999, "ab" * 32)
    liar.body = json.dumps({"seq": 999, "hash": "ab" * 32, "mac": other}).encode()
    assert "mac does not verify" in cli("audit", "verify", "--witness", check=1).out


def test_a_stale_lower_head_passes_only_while_the_log_carries_it(cli, home, liar):
    fill(2)
    old = signed(2, audit.head()["hash"])
    fill(3)
    liar.body = json.dumps(old).encode()
    cli("audit", "witness", liar.url, check=0)
    assert "witness: seq 2 carried" in cli("audit", "verify", "--witness", check=0).out
    lines = (home / "audit.jsonl").read_bytes().splitlines(keepends=True)   # rewrite from seq 2
    (home / "audit.jsonl").write_bytes(lines[0])
    fill(4)
    assert "witness: seq 2 NOT carried" in cli("audit", "verify", "--witness", check=1).out


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"seq": 1, "hash": "zz", "mac": "zz"}'])
def test_a_witness_serving_no_head_is_one_line(cli, home, liar, body):
    fill(1)
    liar.body = body
    cli("audit", "witness", liar.url, check=0)
    err = cli("audit", "verify", "--witness", check=1).err
    assert err == f"overlord: witness {liar.url} served no head {{\"seq\", \"hash\", \"mac\"}}\n"


def test_a_witness_that_does_not_answer_is_one_line(cli, home):
    fill(1)
    cli("audit", "witness", "http://127.0.0.1:9/", check=0)
    for args in (("audit", "verify", "--witness"), ("audit", "checkpoint", "--send")):
        err = cli(*args, check=1).err
        assert err.count("\n") == 1 and err.startswith("overlord: witness http://127.0.0.1:9/ did not answer")
    assert cli("audit", "verify", check=0)


# -- the automatic sender -----------------------------------------------------------------------

def test_auto_sends_every_act_off_the_callers_path_throttled(cli, home, liar):
    fill(1)
    cli("audit", "witness", liar.url, "--auto", check=0)
    took = []
    for i in range(12):
        start = time.monotonic()
        audit.append("session.commit", sid=SID, i=i)
        took.append(time.monotonic() - start)
    head = audit.head()
    await_(lambda: liar.posts and liar.posts[-1][1]["seq"] == head["seq"])
    assert liar.posts[-1][1] == signed(head["seq"], head["hash"])
    times = [t for t, _ in liar.posts]
    assert len(times) < 12 and all(b - a >= 0.9 for a, b in zip(times, times[1:])), times
    assert sorted(took)[len(took) // 2] < 0.1              # the act did not wait for the POST
    await_(lambda: witness.last_sent().get("seq") == head["seq"])       # recorded after the answer
    assert witness.last_sent()["error"] is None


def test_auto_never_fails_the_act_when_the_witness_is_down(cli, home):
    fill(1)
    cli("audit", "witness", "http://127.0.0.1:9/", "--auto", check=0)
    head = json.loads(cli("audit", "checkpoint", check=0).out)
    assert head["seq"] == 2 and audit.verify()["ok"]
    await_(lambda: (witness.last_sent().get("error") or "").startswith("witness http://127.0.0.1:9/ did not answer"))
    assert "error: witness http://127.0.0.1:9/ did not answer" in cli("audit", "witness", check=0).out


# -- a witness that answers slowly, hugely or not at all -----------------------------------------

@pytest.fixture
def slow():
    """A raw TCP witness: sends `head` at once, then `tail` a byte every 50 ms, forever (or
    nothing, never answering). Returns a function (head, tail) -> URL."""
    done, socks, listeners = threading.Event(), [], []

    def start(head=b"", tail=b""):
        listener = socket.create_server(("127.0.0.1", 0))
        socks.append(listener)

        def serve():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            socks.append(conn)
            try:
                conn.sendall(head)
                for i in itertools.count():
                    if not tail or done.wait(0.05):
                        break
                    conn.sendall(tail[i % len(tail):][:1])
            except OSError:
                pass
            done.wait()
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        listeners.append((listener, t))
        return listener.getsockname()[1]

    yield start
    done.set()
    for listener, _ in listeners:     # wakes an accept: joined before the fd is closed
        try:
            listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    for _, t in listeners:
        t.join(10)
    for s in socks:
        s.close()


HEADERS = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"


@pytest.mark.parametrize("head,tail,scheme", [
    (HEADERS, b" ", "http"),                    # the body trickles
    (b"HTTP/1.0 200 OK\r\n", b"X-Slow: y\r\n", "http"),     # the headers trickle
    (b"", b"", "http"),                         # connected, never a byte
    (b"", b"", "https"),                        # the TLS handshake never answered
])
def test_a_witness_request_has_one_deadline_whatever_it_waits_for(home, monkeypatch, slow, head, tail, scheme):
    fill(1)
    monkeypatch.setattr(witness, "TIMEOUT", 60.0)         # each read alone would wait a minute
    monkeypatch.setattr(witness, "DEADLINE", 0.5)
    for call in (witness.fetch, witness.send):
        url = f"{scheme}://127.0.0.1:{slow(head, tail)}/"
        began = time.monotonic()
        with pytest.raises(witness.OverlordError) as exc:
            call(url)
        assert time.monotonic() - began < 5, "waited past the deadline"
        assert str(exc.value) == f"witness {url} did not answer in time (0.5 s)"


def test_a_huge_or_deeply_nested_answer_is_refused_in_one_line(cli, home, liar):
    fill(1)
    cli("audit", "witness", liar.url, check=0)
    liar.body = b'{"seq": 1, "pad": "' + b"x" * 5000 + b'"}'
    err = cli("audit", "verify", "--witness", check=1).err
    assert err == f"overlord: witness {liar.url} answered with more than 4096 bytes: not a head\n"
    liar.body = b"[" * 4000
    err = cli("audit", "verify", "--witness", check=1).err
    assert err == f"overlord: witness {liar.url} served no head {{\"seq\", \"hash\", \"mac\"}}\n"
