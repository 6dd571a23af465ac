"""The run's cancel token at the depth of a model call: set from another thread, it ends
http.call / complete / list_models within 1 s -- waiting for the first byte, mid-stream, in the
pause between retries -- with Cancelled (never a ProviderError, never a retry: no further request);
and the token itself: a watched socket shut, on_set callbacks, Ctrl-C reaching both.

The faces' ends of it live with their faces: the workspace's Stop in a model call, mid-stream and
in a retry pause (test/web/test_chat.py, test/web/test_stop.py), Ctrl-C on the CLI in a model call
and in a tool call (test/agent/test_agent_resume.py)."""
import os
import signal
import socket
import threading
import time

import pytest

from fakes import AnthropicFake, Answer, quick, sse_text  # noqa: F401
from overlord.agent.cancel import Cancel, Cancelled
from overlord.agent.providers import anthropic, http
from overlord.agent.providers.base import Endpoint
from test_provider_transport import KITS, Kit

HELLO = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def real_pauses(quick, monkeypatch):
    """quick's private home and no proxy, but pauses that really wait (on the token)."""
    monkeypatch.setattr(http, "sleep", None)


@pytest.fixture
def claude(quick):
    fake = AnthropicFake()
    yield fake
    fake.close()
    assert fake.problems == []


def endpoint(fake, **kw):
    return Endpoint("anthropic", model=fake.MODEL, api_key=fake.key, base_url=fake.url, **kw)


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.01)


class Call:
    """call() in a thread; .outcome is what it returned or raised, .ended when."""

    def __init__(self, call):
        self.outcome, self.ended = None, None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call):
        try:
            self.outcome = call()
        except BaseException as e:    # noqa: BLE001 - Cancelled is what we are after
            self.outcome = e
        self.ended = time.monotonic()

    def cancelled_within(self, cancel, seconds):
        """Set cancel; the call ends with Cancelled within `seconds`."""
        asked = time.monotonic()
        cancel.set()
        self.thread.join(seconds + 5)
        assert not self.thread.is_alive(), "the call did not end"
        assert isinstance(self.outcome, Cancelled), repr(self.outcome)
        return self.ended - asked


class Held:
    """An answer that sends its head and first events, then holds the stream open until
    released (a model that paused mid-answer)."""

    def __init__(self, answer, first=6):
        self.chunks = [c.encode() for c in sse_text(answer.events)]
        self.first, self.release = first, threading.Event()

    def send(self, h):
        h.send_response(200)
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        try:
            for n, c in enumerate(self.chunks):
                if n == self.first:
                    self.release.wait(30)
                h.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


class Pausing(Cancel):
    """A token that says when the call is waiting on it (the pause between retries)."""

    def __init__(self):
        super().__init__()
        self.pausing = threading.Event()

    def wait(self, seconds):
        self.pausing.set()
        return super().wait(seconds)


# -- a model call, at each moment --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(KITS))
def test_a_cancel_while_waiting_for_the_first_byte(name, quick):
    kit = Kit(name)
    try:
        late = kit.plain("too late")
        late.stall = 30
        kit.fake.queue(late)
        cancel = Cancel()
        call = Call(lambda: kit.call(cancel=cancel))
        wait_for(lambda: kit.fake.requests)
        assert call.cancelled_within(cancel, 1.0) < 1.0
        assert len(kit.fake.requests) == 1 and quick == []          # no retry, no pause
    finally:
        kit.fake.close()
    assert kit.fake.problems == []


@pytest.mark.parametrize("name", sorted(KITS))
def test_a_cancel_while_listing_models(name, quick):
    kit = Kit(name)
    try:
        late = kit.fake.models()
        late.stall = 30
        kit.fake.queue(late)
        cancel = Cancel()
        call = Call(lambda: kit.mod.list_models(kit.endpoint(), cancel=cancel))
        wait_for(lambda: kit.fake.requests)
        assert call.cancelled_within(cancel, 1.0) < 1.0
        assert len(kit.fake.requests) == 1
    finally:
        kit.fake.close()


def test_a_cancel_mid_stream(claude, quick):
    held = Held(claude.turn(text="word " * 40))
    claude.queue(held)
    cancel, deltas = Cancel(), []
    call = Call(lambda: anthropic.complete(endpoint(claude), "Be terse.", HELLO, [],
                                           on_delta=lambda k, t: deltas.append((k, t)),
                                           cancel=cancel))
    wait_for(lambda: deltas)                     # text has arrived; the rest is held back
    try:
        assert call.cancelled_within(cancel, 1.0) < 1.0
    finally:
        held.release.set()
    assert len(claude.requests) == 1 and quick == []
    assert ("restart", "") not in deltas          # no second attempt began


@pytest.mark.parametrize("wait", ["retry-after", "backoff"])
def test_a_cancel_in_the_pause_between_retries(claude, real_pauses, monkeypatch, wait):
    if wait == "retry-after":
        claude.queue(Answer(529, claude.error(529, "Overloaded"), headers={"retry-after": "30"}))
    else:
        monkeypatch.setenv("OVERLORD_RETRY_SCALE", "40")        # a first backoff of 30-40 s
        claude.queue(Answer(529, claude.error(529, "Overloaded")))
    cancel = Pausing()
    call = Call(lambda: anthropic.complete(endpoint(claude), "Be terse.", HELLO, [], cancel=cancel))
    assert cancel.pausing.wait(10), "the call never paused"
    assert call.cancelled_within(cancel, 1.0) < 1.0
    assert len(claude.requests) == 1                              # the retry was never sent


def test_a_cancelled_token_sends_nothing(claude):
    cancel = Cancel()
    cancel.set()
    with pytest.raises(Cancelled):
        anthropic.complete(endpoint(claude), "Be terse.", HELLO, [], cancel=cancel)
    assert claude.requests == []


def test_a_call_that_is_not_cancelled_is_untouched(claude):
    claude.queue(claude.turn(text="Hello"))
    reply = anthropic.complete(endpoint(claude), "Be terse.", HELLO, [], cancel=Cancel())
    assert reply.text == "Hello"


def test_a_cancel_while_connecting_to_a_silent_host(quick, monkeypatch):
    """A host that never completes the handshake: the connect itself is watched (a listening
    socket with a full backlog stands for a dropped SYN)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    try:
        for _ in range(8):                       # fill the accept queue: later SYNs are dropped
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(server.getsockname())
            fillers.append(s)
        time.sleep(0.05)
        ep = Endpoint("anthropic", model="m", api_key="k" * 20,
                      base_url=f"http://127.0.0.1:{server.getsockname()[1]}")
        cancel = Cancel()
        call = Call(lambda: anthropic.complete(ep, "s", HELLO, [], cancel=cancel))
        time.sleep(0.3)                          # it is in connect (or the first read): no event says so
        assert call.thread.is_alive()
        assert call.cancelled_within(cancel, 1.0) < 1.0
    finally:
        for s in fillers:
            s.close()
        server.close()


# -- the token -------------------------------------------------------------------------------

def test_set_shuts_a_socket_blocked_in_another_thread():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    cancel, got = Cancel(), {}
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()

    def read():
        with cancel.watch(client):
            got["data"] = client.recv(10)
        got["at"] = time.monotonic()
    t = threading.Thread(target=read)
    t.start()
    wait_for(lambda: cancel._fds)                   # watched, and the reader is in recv
    asked = time.monotonic()
    cancel.set()
    t.join(5)
    assert not t.is_alive() and got["data"] == b"" and got["at"] - asked < 1.0
    for s in (client, conn, server):
        s.close()
    with pytest.raises(Cancelled):
        cancel.check()
    with pytest.raises(Cancelled):
        with cancel.interruptible():
            pass


def test_watch_leaves_no_descriptor_behind():
    before = len(os.listdir("/proc/self/fd"))
    cancel = Cancel()
    for _ in range(20):
        with socket.socket() as s, cancel.watch(s):
            pass
    assert len(os.listdir("/proc/self/fd")) == before and cancel._fds == {}


def test_ctrl_c_sets_the_token_callbacks_and_watched_sockets_included():
    """The CLI's path: SIGINT sets the flag and, through the watcher thread, calls set() -- so a
    connector's on_set callback and a watched socket fire as they do for the workspace's Stop."""
    cancel, called = Cancel(), threading.Event()
    a, b = socket.socketpair()
    with cancel.signals(), cancel.on_set(called.set), cancel.watch(a):
        os.kill(os.getpid(), signal.SIGINT)
        assert called.wait(2), "on_set was not called"
        assert a.recv(1) == b""                      # shut down: reads end at once
    assert cancel.is_set()
    a.close()
    b.close()
