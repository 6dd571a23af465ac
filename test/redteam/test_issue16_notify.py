"""Red team, issue 16: webhooks. Who chooses the bytes a webhook sends, and where they go?

A real receiver listens on loopback (127.0.0.1, and ::1 where the host has IPv6); every
spelling of "this machine" a URL can carry must be refused without --allow-private, checked
on the resolved address at send time. The text line of a Slack post carries fields an agent
or a file name chooses; the secret must appear nowhere but webhooks.json.
"""
import hashlib
import hmac
import json
import os
import socket
import threading
import time

import pytest

from conftest import Ovl

FAST = {"OVERLORD_NOTIFY_BACKOFF": "0.01", "OVERLORD_NOTIFY_TIMEOUT": "3"}


class Receiver:
    """An HTTP receiver on 127.0.0.1 and (when possible) ::1, on one port. Records every
    request (method, path, headers, body); answers `status` (with `location` for a 3xx), or
    never answers with hang=True."""

    def __init__(self, status=200, location=None, hang=False, port=0):
        self.status, self.location, self.hang = status, location, hang
        self.requests, self.conns = [], []
        self.got = threading.Event()
        self.closing = threading.Event()
        self.socks = []
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(16)
        self.port = s.getsockname()[1]
        self.socks.append(s)
        self.v6 = False
        try:
            s6 = socket.socket(socket.AF_INET6)
            s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s6.bind(("::1", self.port))
            s6.listen(16)
            self.socks.append(s6)
            self.v6 = True
        except OSError:
            pass
        self.threads = [threading.Thread(target=self._serve, args=(sock,), daemon=True)
                        for sock in self.socks]
        for t in self.threads:
            t.start()

    def _serve(self, sock):
        while not self.closing.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
            while len(body) < n:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            self.requests.append((lines[0], headers, body))
            self.got.set()
            if self.hang:
                self.closing.wait()
                return
            extra = f"Location: {self.location}\r\n" if self.location else ""
            conn.sendall(f"HTTP/1.1 {self.status} X\r\n{extra}Content-Length: 0\r\n"
                         "Connection: close\r\n\r\n".encode())
        except OSError:
            pass
        finally:
            if not self.hang:
                conn.close()

    def close(self):
        """shutdown wakes the accept threads, which are joined before the fds are closed
        (closing one under a blocked accept would let that thread accept on whatever socket
        reuses the fd number -- a later test's listener)."""
        self.closing.set()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(10)
        for s in self.socks + self.conns:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def recv():
    made = []

    def make(**kw):
        r = Receiver(**kw)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


@pytest.fixture
def o(home):
    return Ovl(home)


def wait_for(cond, timeout=20):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    return cond()


def deliveries(o):
    return json.loads(o("webhooks", "deliveries", "--json", check=0).out)


# -- the SSRF guard ------------------------------------------------------------------------------

LOOPBACK_SPELLINGS = ["127.0.0.1", "127.0.0.2", "127.1", "2130706433", "0x7f000001",
                      "0177.0.0.1", "0.0.0.0", "0", "localhost", "[::ffff:127.0.0.1]",
                      "[::ffff:7f00:1]", "[::1]", "[::]", "[::127.0.0.1]", "[64:ff9b::7f00:1]",
                      "[2002:7f00:1::]"]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_loopback_in_any_spelling_is_refused_at_send_time(o, recv, host):
    r = recv()
    if host in ("[::1]", "[::]") and not r.v6:
        pytest.skip("no IPv6 loopback here")
    url = f"http://{host}:{r.port}/hook"
    add = o("webhooks", "add", "h", url, "--format", "json", "--on", "*")
    if add.returncode != 0:                          # refused when added: as good
        assert add.returncode in (1, 2) and "Traceback" not in add.err, add.err
        return
    proc = o("webhooks", "test", "h", "--json", env=FAST)
    assert "Traceback" not in proc.err, proc.err
    assert r.requests == [], (host, r.requests)
    out = json.loads(proc.out) if proc.out.strip().startswith("{") else {}
    assert out.get("ok") is not True, (host, proc.out, proc.err)


def test_allow_private_reaches_loopback_control(o, recv):
    """The positive control: the same receiver IS reached with --allow-private."""
    r = recv()
    o("webhooks", "add", "h", f"http://127.0.0.1:{r.port}/hook", "--format", "json",
      "--allow-private", check=0)
    proc = o("webhooks", "test", "h", "--json", env=FAST, check=0)
    assert json.loads(proc.out)["ok"] is True
    assert len(r.requests) == 1


def test_a_redirect_to_loopback_is_not_followed(o, recv):
    inner = recv()
    outer = recv(status=302, location=f"http://127.0.0.1:{inner.port}/inner")
    o("webhooks", "add", "h", f"http://127.0.0.1:{outer.port}/hook", "--format", "json",
      "--allow-private", check=0)
    proc = o("webhooks", "test", "h", "--json", env=FAST)
    assert len(outer.requests) == 1 and inner.requests == []
    assert json.loads(proc.out)["ok"] is False


@pytest.mark.parametrize("url", ["http://evil@127.0.0.1/", "http://a:b@example.com/",
                                 "http://example.com/\r\nX-Injected: 1", "http://example.com/ a",
                                 "file:///etc/passwd", "gopher://127.0.0.1:25/", "http:///x",
                                 "javascript:alert(1)"])
def test_bad_urls_refused_when_added(o, url):
    proc = o("webhooks", "add", "h", url)
    assert proc.returncode in (1, 2) and proc.err.startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err
    assert not (o.home / "webhooks.json").exists() or "h" not in json.loads(
        (o.home / "webhooks.json").read_text()).get("hooks", {})


@pytest.mark.parametrize("name", ["a\r\nX-Injected: 1", "../x", "a b", "-x", "a\n"])
def test_bad_names_refused(o, name):
    proc = o("webhooks", "add", name, "https://example.com/")
    assert proc.returncode in (1, 2) and "Traceback" not in proc.err, proc.err


# -- what is sent ---------------------------------------------------------------------------------

def test_slack_text_neutralises_mrkdwn_controls_a_folder_name_chooses(o, recv, tmp_path):
    """A folder named by whoever made it: `<!channel>`, a `<url|label>` link, a newline.
    The Slack text carries none of them as controls."""
    r = recv()
    evil = tmp_path / "x <!channel> <mailto:a@evil.example|click here>\nline two"
    evil.mkdir()
    o("webhooks", "add", "s", f"http://127.0.0.1:{r.port}/hook", "--format", "slack",
      "--on", "*", "--allow-private", check=0)
    o("run", "-t", evil, "--", "true", env=FAST)      # its acts name the folder
    assert wait_for(lambda: any(b"channel" in b for _, _, b in r.requests)), r.requests
    for _, _, body in r.requests:
        text = json.loads(body)["text"]
        assert "<" not in text and ">" not in text, text      # &lt; &gt;: shown, not parsed
        assert "&lt;!channel&gt;" in text or "channel" not in text, text
        assert "\n" not in text, text


def test_secret_never_leaves_webhooks_json(o, recv):
    secret = "s3cr3t-" + os.urandom(8).hex()
    ok, bad = recv(), recv(status=500)
    o("webhooks", "add", "good", f"http://127.0.0.1:{ok.port}/hook", "--format", "json",
      "--secret-stdin", "--allow-private", "--on", "*", input=(secret + "\n").encode(), check=0)
    o("webhooks", "add", "bad", f"http://127.0.0.1:{bad.port}/hook", "--format", "json",
      "--secret-stdin", "--allow-private", input=(secret + "\n").encode(), check=0)
    o("webhooks", "test", "good", env=FAST)
    o("webhooks", "test", "bad", env=FAST)
    outs = [o("webhooks", "list", "--json").out, o("webhooks", "list").out,
            o("webhooks", "deliveries", "--json").out, o("webhooks", "deliveries").out]
    for text in outs:
        assert secret not in text
    # the signature is right (so the secret was really used)
    line, headers, body = ok.requests[0]
    t, v1 = (kv.split("=", 1)[1] for kv in headers["x-overlord-signature"].split(","))
    assert v1 == hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert secret.encode() not in body and all(secret not in v for v in headers.values())
    for base, _, files in os.walk(o.home):
        for f in files:
            p = os.path.join(base, f)
            if p == str(o.home / "webhooks.json"):
                assert stat_mode(p) & 0o077 == 0
                continue
            with open(p, "rb") as fh:
                assert secret.encode() not in fh.read(), p


def stat_mode(p):
    return os.stat(p).st_mode


def test_a_hanging_receiver_never_blocks_the_act(o, recv):
    r = recv(hang=True)
    o("webhooks", "add", "h", f"http://127.0.0.1:{r.port}/hook", "--format", "json",
      "--on", "cost.price", "--allow-private", check=0)
    t0 = time.monotonic()
    o("cost", "set-price", "m-slow", "--input", "1", "--output", "2", check=0,
      env={"OVERLORD_NOTIFY_TIMEOUT": "10"})
    took = time.monotonic() - t0
    assert took < 5, f"the act waited {took:.1f} s on a receiver that never answers"
    assert r.got.wait(20), "the hook never fired (the test would prove nothing)"


def test_one_act_one_delivery(o, recv):
    """One act is delivered once; delivering is not itself an audited act."""
    r = recv()
    o("webhooks", "add", "h", f"http://127.0.0.1:{r.port}/hook", "--format", "json",
      "--on", "cost.price", "--allow-private", check=0)
    o("cost", "set-price", "m-a", "--input", "1", "--output", "2", check=0, env=FAST)
    assert wait_for(lambda: deliveries(o))
    acts = [json.loads(x)["action"] for x in open(o.home / "audit.jsonl") if x.strip()]
    assert acts.count("cost.price") == 1 and len(r.requests) == 1, (acts, r.requests)


def _sender_busy(home):
    import fcntl
    path = os.path.join(home, "notify", "sender.lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_vault_signed_hook_on_every_act_does_not_feed_itself(o, recv, tmp_path):
    r = recv()
    res = tmp_path / "resolver.sh"
    res.write_text("#!/bin/sh\necho \"value-of-$1\"\n")
    res.chmod(0o755)
    o("secrets", "set-command", f"{res} {{name}}", "--ttl", "0", check=0)
    o("webhooks", "add", "h", f"http://127.0.0.1:{r.port}/hook", "--format", "json", "--on", "*",
      "--allow-private", "--secret-stdin", input=b"secret://hooksig\n", check=0)
    try:
        o("cost", "set-price", "m-a", "--input", "1", "--output", "2", check=0, env=FAST)
        assert wait_for(lambda: r.requests), "nothing was delivered"
        settled = wait_for(lambda: not _sender_busy(o.home), timeout=10)
        assert settled and len(r.requests) <= 3, \
            f"{len(r.requests)} deliveries for one act and still going: {settled=}"
    finally:
        o("webhooks", "rm", "h")                  # stops the flood either way
        wait_for(lambda: not _sender_busy(o.home), timeout=20)
