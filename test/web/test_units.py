"""The web face's pure parts, without a server: diffs as correct patches, the request
coalescing (no answer older than its request), settings validation, the guard's decisions,
and Stop breaking a blocked socket read in another thread."""
import random
import re
import socket
import threading
import time
from email.message import Message

import pytest

from overlord.agent.cancel import Cancelled
from overlord.web import api, diffs, security, settings
from overlord.web.stop import Stop


def patch(a, hunks):
    """Apply unified hunks to a, checking every context and removed line."""
    out, pos = [], 0
    for hunk in hunks:
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@$", hunk["header"])
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out += a[pos:start]
        pos = start
        for tag, text in hunk["lines"]:
            if tag in " -":
                assert a[pos] == text
                pos += 1
            if tag in " +":
                out.append(text)
    return out + a[pos:]


def test_diff_hunks_are_correct_patches_with_three_lines_of_context():
    rng = random.Random(7)
    for _ in range(2000):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 40))]
        b = list(a)
        for _ in range(rng.randint(0, 5)):
            r = rng.random()
            if r < 0.4 and b:
                b[rng.randrange(len(b))] = rng.choice("xyz")
            elif r < 0.7:
                b.insert(rng.randint(0, len(b)), rng.choice("xyz"))
            elif b:
                del b[rng.randrange(len(b))]
        out = {"hunks": [], "added": 0, "removed": 0, "truncated": False}
        diffs._hunks(out, a, b)
        assert patch(a, out["hunks"]) == b
        assert (a == b) == (out["hunks"] == [])
        for hunk in out["hunks"]:
            lines = hunk["lines"]
            changed = [i for i, (tag, _) in enumerate(lines) if tag != " "]
            assert changed[0] <= 3 and len(lines) - 1 - changed[-1] <= 3


def test_a_long_diff_is_cut_and_says_so(tmp_path):
    out = {"hunks": [], "added": 0, "removed": 0, "truncated": False}
    diffs._hunks(out, [], [str(i) for i in range(diffs.MAX_LINES + 50)])
    assert out["truncated"] and sum(len(h["lines"]) for h in out["hunks"]) == diffs.MAX_LINES
    assert out["added"] == diffs.MAX_LINES + 50


def test_coalesced_answers_are_never_older_than_their_request():
    shared = api.Coalesce()
    state = {"version": 0, "computations": 0}
    lock = threading.Lock()

    def compute():
        with lock:
            state["computations"] += 1
            seen = state["version"]
        time.sleep(0.01)
        return seen

    errors = []

    def client():
        for _ in range(20):
            with lock:
                state["version"] += 1
                asked_at = state["version"]
            got = shared.run("dossier", compute)
            if got < asked_at:
                errors.append((asked_at, got))
    threads = [threading.Thread(target=client) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert state["computations"] < 30 * 20 / 3          # shared, not once per request
    with pytest.raises(ZeroDivisionError):
        shared.run("x", lambda: 1 / 0)
    assert shared.run("x", lambda: 5) == 5              # a failure is not remembered


def test_knobs_and_headers_are_checked_field_by_field():
    assert settings.check_knobs({"max_tokens": "100", "temperature": 1, "top_p": "0.5", "stop": "A\nB",
                                 "effort": "low", "thinking": "off", "api": "chat", "stream": False,
                                 "max_tokens_x": None} | {"max_tokens_x": ""}) == {
        "max_tokens": 100, "temperature": 1.0, "top_p": 0.5, "stop": ["A", "B"], "effort": "low",
        "thinking": "off", "api": "chat", "stream": False}
    for knobs, field in (({"max_tokens": 1.5}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
                         ({"temperature": 3}, "temperature"), ({"wat": 1}, "wat"),
                         ({"stream": "yes"}, "stream"), ({"stop": ["x" * 300]}, "stop")):
        with pytest.raises(settings.Invalid) as e:
            settings.check_knobs(knobs)
        assert e.value.field == field
    old = {"Authorization": "Bearer real"}
    assert settings._headers({"Authorization": settings.MASK, "X-A": "1"}, old) == {
        "Authorization": "Bearer real", "X-A": "1"}
    with pytest.raises(settings.Invalid):
        settings._headers({"X-A": "1\r\nInjected: yes"}, {})


def _headers(**kw):
    m = Message()
    for k, v in kw.items():
        m[k.replace("_", "-")] = v
    return m


def test_the_guard_decides_by_origin_fetch_site_and_principal():
    g = security.Guard("t" * 48, "127.0.0.1", 7777)
    mine, other = "http://127.0.0.1:7777", "http://127.0.0.1:8000"
    assert g.host_ok(_headers(Host="127.0.0.1:7777")) and not g.host_ok(_headers(Host="localhost:7777"))
    assert g.principal(_headers(Authorization="Bearer " + "t" * 48)) == "bearer"
    assert g.principal(_headers(Cookie=f"a=b; overlord_ui={g.cookie_value}")) == "cookie"
    assert g.principal(_headers(Cookie="overlord_ui=" + "t" * 48)) is None
    ok = g.cross_origin
    assert ok("POST", _headers(Origin=mine), "cookie", True) is None
    assert ok("POST", _headers(Sec_Fetch_Site="same-origin"), "cookie", True) is None
    assert ok("POST", _headers(Origin=other), "cookie", True)
    assert ok("POST", _headers(), "cookie", True)
    assert ok("POST", _headers(), "bearer", True) is None
    assert ok("GET", _headers(Sec_Fetch_Site="same-site"), "cookie", True)
    assert ok("GET", _headers(Sec_Fetch_Site="same-site"), "cookie", False) is None   # a link to a page
    assert ok("GET", _headers(Origin=other), "bearer", True)


def test_stop_breaks_a_model_call_blocked_in_another_thread():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = Stop()
    outcome = {}

    def call():
        try:
            with stop.interruptible():
                s = socket.create_connection(server.getsockname())
                try:
                    while True:                      # a provider retrying a broken read
                        if s.recv(10) == b"":
                            time.sleep(0.5)
                            s = socket.create_connection(server.getsockname())
                finally:
                    s.close()
        except Cancelled:
            outcome["cancelled"] = time.monotonic()
    t = threading.Thread(target=call)
    t.start()
    conn, _ = server.accept()                        # connected, and the reader is blocked
    time.sleep(0.1)
    asked = time.monotonic()
    stop.set()
    t.join(2)
    assert not t.is_alive() and outcome["cancelled"] - asked < 1.0
    conn.close()
    server.close()
    with pytest.raises(Cancelled):
        with stop.interruptible():
            pass
