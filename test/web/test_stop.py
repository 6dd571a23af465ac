"""Stop in the workspace while the model call sits in the pause between two attempts (a 529
asking to retry in 30 s): the run ends within 2 s as cancelled and the retry is never sent --
the pause waits on the run's cancel token. (Stop before the first byte, mid-stream and in a
tool call: test_chat.py.)"""
import time

import pytest

from weblib import UI, AnthropicFake, records, require_kernel
from fakes import Answer


@pytest.fixture(autouse=True)
def kernel():
    require_kernel()


@pytest.mark.parametrize("wait", ["retry-after", "backoff"])
def test_stop_in_the_pause_between_retries(home, target, wait):
    fake = AnthropicFake()
    # real pauses in the server (weblib makes them instant): a 30 s retry-after, or a backoff
    # scaled to 30-40 s
    ui = UI(home, target, env={"OVERLORD_RETRY_SCALE": "1" if wait == "retry-after" else "40",
                               "OVERLORD_PROVIDER_RETRIES": "2"})
    try:
        ui.use(fake)
        headers = {"retry-after": "30"} if wait == "retry-after" else {}
        fake.queue(Answer(529, fake.error(529, "Overloaded"), headers=headers))
        r = ui.post("/api/chats", {"message": "make a plan"})
        assert r.status == 200, r.body
        sid = r.json["sid"]
        with ui.events(sid) as ev:
            ev.until(lambda n, d: n == "snapshot")
            deadline = time.monotonic() + 10
            while not fake.requests and time.monotonic() < deadline:
                time.sleep(0.02)
            assert fake.requests
            time.sleep(0.3)          # the 529 is read and the pause begun (no event says so)
            took = ui.stop(sid, ev)
            seen = ev.seen
        assert took < 2.0, took
        assert records(seen, "done")[-1]["reason"] == "cancelled"
        assert len(fake.requests) == 1                  # the retry was never sent
    finally:
        ui.close()
        fake.close()
    assert fake.problems == []
