"""`overlord sessions --json`: every row carries the session's running cost (zeros when it
made no call); a damaged cost file never breaks the listing; many sessions list quickly."""
import json
import os
import shutil
import sys
import time

import pytest

from conftest import REPO, require_backend

sys.path.insert(0, os.path.join(REPO, "test", "agent"))
from agentlib import AgentOvl, call  # noqa: E402

KEYS = {"calls", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
        "tokens", "usd", "unpriced"}


@pytest.fixture
def kovl(home):
    require_backend("kernel")
    return AgentOvl(home, "kernel")


def rows(kovl):
    proc = kovl("sessions", "--json", check=0)
    return {r["sid"]: r for r in json.loads(proc.out)}


def test_rows_carry_cost(kovl, home, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [
        {"text": "w", "tool_calls": [call("write_file", path="a.txt", content="a\n")],
         "usage": {"input_tokens": 120, "output_tokens": 3}},
        {"text": "done", "usage": {"input_tokens": 30, "output_tokens": 2}}])
    assert proc.returncode == 0, proc.err
    kovl("rollback", sid, check=0)
    kovl("run", "-t", target, "--", "true", check=0)
    got = rows(kovl)
    assert got[sid]["cost"]["tokens"] == 155 and got[sid]["cost"]["calls"] == 2
    assert set(got[sid]["cost"]) >= KEYS
    [other] = [s for s in got if s != sid]
    assert got[other]["cost"]["calls"] == 0 and got[other]["cost"]["tokens"] == 0
    assert set(got[other]["cost"]) >= KEYS

    # a damaged cost file: the listing still works (cost rebuilds it from the ledger)
    path = home / "sessions" / sid / "cost.json"
    path.write_text("{not json")
    got = rows(kovl)
    assert got[sid]["cost"]["tokens"] == 155
    # one that cannot be read at all: zeros for that row, the rest listed
    path.unlink()
    path.mkdir()
    proc = kovl("sessions", "--json")
    assert proc.returncode == 0, proc.err
    got = {r["sid"]: r for r in json.loads(proc.out)}
    assert set(got) == {sid, other} and set(got[sid]["cost"]) >= KEYS


def test_many_sessions_list_quickly(kovl, home, target, tmp_path):
    sid, proc = kovl.scripted(target, tmp_path, [{"text": "done", "usage": {"input_tokens": 7}}])
    assert proc.returncode == 0, proc.err
    kovl("rollback", sid, check=0)
    src = home / "sessions" / sid
    for i in range(1500):
        new = f"20200101-000000-{i:06x}"
        d = home / "sessions" / new
        d.mkdir()
        meta = json.loads((src / "meta.json").read_text())
        meta["sid"] = new
        (d / "meta.json").write_text(json.dumps(meta))
        if i % 2:
            shutil.copy(src / "cost.json", d / "cost.json")   # says offset N: not this sid's lines
    start = time.monotonic()
    got = rows(kovl)
    took = time.monotonic() - start
    assert len(got) == 1501 and got[sid]["cost"]["tokens"] == 7
    assert all(set(r["cost"]) >= KEYS for r in got.values())
    assert took < 20, took
