"""The running totals: folded from the ledger's offset, caught up after a crash, rebuilt when
damaged, never counting a line twice, never losing one when processes charge at once -- and a
check never re-reads the ledger."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from overlord.trust import cost
from overlord.txn import store

HAIKU = "claude-haiku-4-5"          # $1 in, $5 out per MTok
ONE = {"input_tokens": 1000, "output_tokens": 100}        # $0.0015 a call
PER = 0.0015


def new_session():
    sid = store.new_sid()
    os.makedirs(store.session_dir(sid))
    return sid


def raw_line(sid, usd=PER, **kw):
    line = cost.line_for(sid, None, kw.pop("account", None), "turn", "anthropic", HAIKU, ONE)
    line.update(kw)
    return line


def append_raw(home, data):
    with open(home / "ledger.jsonl", "ab") as f:
        f.write(data if isinstance(data, bytes) else (json.dumps(data) + "\n").encode())


def spend(home):
    return json.loads((home / "spend.json").read_text())


def machine_today(home):
    doc = spend(home)
    day = max(doc["day"])
    return doc["day"][day]["*"]


def session_file(home, sid):
    return home / "sessions" / sid / "cost.json"


def test_a_line_the_crash_left_unfolded_is_seen_by_the_next_check_and_folded_by_the_next_charge(home):
    sid = new_session()
    meter = cost.Meter(sid, None, None)
    meter.charge("turn", "anthropic", HAIKU, ONE)
    before = spend(home)
    append_raw(home, raw_line(sid))             # appended, then the process died: no fold
    assert spend(home) == before                # the caches do not know it
    assert meter.total()["calls"] == 2          # ...a check does (the tail, in memory)
    assert meter.total()["usd"] == pytest.approx(2 * PER)
    cost.set_budget("config", session_usd=2 * PER)
    assert meter.check("turn").key == "session_usd"      # and a budget sees it
    meter.charge("turn", "anthropic", HAIKU, ONE)
    doc = json.loads(session_file(home, sid).read_text())
    assert doc["calls"] == 3 and doc["offset"] == os.path.getsize(home / "ledger.jsonl")
    assert spend(home)["offset"] == doc["offset"]
    assert machine_today(home) == pytest.approx(3 * PER)


def test_a_crash_between_the_session_file_and_spend_json_counts_nothing_twice(home):
    sid = new_session()
    meter = cost.Meter(sid, None, "ann")
    meter.charge("turn", "anthropic", HAIKU, ONE)
    old_spend = (home / "spend.json").read_bytes()
    meter.charge("turn", "anthropic", HAIKU, ONE)
    (home / "spend.json").write_bytes(old_spend)     # spend.json's write never happened
    assert meter.total()["calls"] == 2
    meter.charge("turn", "anthropic", HAIKU, ONE)
    assert meter.total()["calls"] == 3 and meter.total()["usd"] == pytest.approx(3 * PER)
    assert machine_today(home) == pytest.approx(3 * PER)
    assert cost.meter_view("ann")["day"]["spent"] == pytest.approx(3 * PER)


@pytest.mark.parametrize("damage", [b"{torn", b"[]", b'{"offset": -4, "day": {}, "month": {}}',
                                    b'{"offset": 99999999, "day": {}, "month": {}}', b"",
                                    b'{"offset": 7, "day": {}, "month": {}}'])
def test_a_damaged_spend_json_is_rebuilt_from_the_ledger(home, damage):
    a, b = new_session(), new_session()
    cost.Meter(a, None, "ann").charge("turn", "anthropic", HAIKU, ONE)
    cost.Meter(b, None, "ben").charge("turn", "anthropic", HAIKU, ONE)
    (home / "spend.json").write_bytes(damage)
    view = cost.meter_view(None)
    assert view["day"]["spent"] == pytest.approx(2 * PER)
    assert machine_today(home) == pytest.approx(2 * PER)          # written back, whole
    assert spend(home)["offset"] == os.path.getsize(home / "ledger.jsonl")
    cost.Meter(a, None, "ann").charge("turn", "anthropic", HAIKU, ONE)
    assert machine_today(home) == pytest.approx(3 * PER)
    assert cost.session_total(a)["calls"] == 2 and cost.session_total(b)["calls"] == 1


def test_a_cache_write_cut_short_is_never_trusted(home):
    """The caches are rewritten in place and carry their own digest: any cut of the file, and
    any edit that keeps it valid JSON, reads as damaged and is rebuilt from the ledger."""
    a = new_session()
    for _ in range(3):
        cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    for path in (home / "spend.json", session_file(home, a)):
        whole = path.read_bytes()
        for cut in (len(whole) // 3, len(whole) - 2):
            path.write_bytes(whole[:cut])
            assert cost.session_total(a)["calls"] == 3
            assert machine_today(home) == pytest.approx(3 * PER)
        path.write_bytes(whole.replace(b'"calls":3', b'"calls":9'))
        assert cost.session_total(a)["calls"] == 3


def reseal(path, edit):
    """Edit a cache and seal it again as the cache itself does (the digest is no secret)."""
    raw = path.read_bytes()
    doc = json.loads(raw)
    doc.pop("sha256")
    edit(doc)
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(b'{"sha256":"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'",'
                     + body[1:] + b"\n")


def negative_totals(doc):
    for period in ("day", "month"):
        for scopes in doc[period].values():
            for k in scopes:
                scopes[k] = -1e6


@pytest.mark.parametrize("edit", [
    negative_totals,
    lambda doc: doc["day"].update({max(doc["day"]): {"*": float("nan")}}),
    lambda doc: doc["day"].update({max(doc["day"]): {"*": "0"}}),
    lambda doc: doc.update(offset=True)])
def test_a_resealed_spend_json_with_impossible_figures_is_rebuilt(home, edit):
    a = new_session()
    cost.set_budget("config", day_usd=PER)
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    reseal(home / "spend.json", edit)
    assert cost.Meter(a, None, None).check("turn").key == "day_usd"
    assert machine_today(home) == pytest.approx(PER)


@pytest.mark.parametrize("edit", [
    lambda doc: doc.update(usd=-5.0), lambda doc: doc.update(calls=-1),
    lambda doc: doc.update(tokens=0), lambda doc: doc.update(usd=float("inf")),
    lambda doc: doc.update(unpriced=[3])])
def test_a_resealed_session_file_with_impossible_figures_is_rebuilt(home, edit):
    a = new_session()
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    reseal(session_file(home, a), edit)
    total = cost.session_total(a)
    assert total["calls"] == 1 and total["usd"] == pytest.approx(PER) and total["tokens"] == 1100


def test_a_symlink_or_fifo_planted_for_a_cache_is_replaced_never_followed(home, tmp_path):
    a = new_session()
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.unlink(home / "spend.json")
    os.symlink(victim, home / "spend.json")
    os.unlink(session_file(home, a))
    os.mkfifo(session_file(home, a))
    assert cost.session_total(a)["calls"] == 1           # nothing hangs on the FIFO
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    assert victim.read_text() == "keep me"
    assert not os.path.islink(home / "spend.json") and machine_today(home) == pytest.approx(2 * PER)
    assert cost.session_total(a)["calls"] == 2


def test_a_missing_spend_json_is_rebuilt_without_counting_sessions_twice(home):
    a = new_session()
    for _ in range(3):
        cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    os.unlink(home / "spend.json")
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    assert machine_today(home) == pytest.approx(4 * PER)
    assert cost.session_total(a)["calls"] == 4


@pytest.mark.parametrize("damage", [b"{torn", b'{"offset": 0}', b'{"offset": 5, "calls": "x"}',
                                    b'{"offset": 1, "calls": 9, "input_tokens": 0, "output_tokens": 0,'
                                    b' "cache_read_tokens": 0, "cache_write_tokens": 0, "tokens": 0,'
                                    b' "usd": 1e400, "unpriced": []}'])
def test_a_damaged_session_file_is_rebuilt_from_the_ledger(home, damage):
    a, b = new_session(), new_session()
    for sid in (a, b, a):
        cost.Meter(sid, None, None).charge("turn", "anthropic", HAIKU, ONE)
    session_file(home, a).write_bytes(damage)
    assert cost.session_total(a)["calls"] == 2
    assert json.loads(session_file(home, a).read_text())["calls"] == 2     # written back
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    assert cost.session_total(a)["calls"] == 3 and cost.session_total(b)["calls"] == 1


def test_a_damaged_ledger_line_is_skipped_in_totals_and_reports(home):
    a = new_session()
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    append_raw(home, b'{"sid": "' + a.encode() + b'", "usd": 5, "ts": \n')      # damaged
    append_raw(home, b'["not", "an", "object"]\n')
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    assert cost.session_total(a)["calls"] == 2
    os.unlink(home / "spend.json")
    os.unlink(session_file(home, a))
    (home / "spend.json").write_text("garbage")
    assert cost.meter_view(None)["day"]["spent"] == pytest.approx(2 * PER)
    assert [r["calls"] for r in cost.report("model")] == [2]


def test_a_torn_last_line_stays_one_damaged_line_and_the_next_call_is_whole(home):
    a = new_session()
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    append_raw(home, b'{"sid": "' + a.encode() + b'", "kind": "tu')      # a write cut short
    assert cost.session_total(a)["calls"] == 1
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    lines = (home / "ledger.jsonl").read_bytes().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["sid"] == a
    assert cost.session_total(a)["calls"] == 2
    assert [r["calls"] for r in cost.report("session")] == [2]


def test_a_check_never_rereads_the_ledger(home):
    """Overwrite every earlier line in place with junk of the same length: the totals a check
    uses do not move (they come from the caches), while a report (which reads the ledger)
    sees only what is left."""
    a = new_session()
    meter = cost.Meter(a, None, None)
    for _ in range(50):
        meter.charge("turn", "anthropic", HAIKU, ONE)
    size = os.path.getsize(home / "ledger.jsonl")
    with open(home / "ledger.jsonl", "r+b") as f:
        data = f.read()
        f.seek(0)
        f.write(b"".join(b"x" * len(x) + b"\n" for x in data.splitlines()))
    assert os.path.getsize(home / "ledger.jsonl") == size
    cost.set_budget("config", session_usd=1000 * PER, day_usd=1000 * PER)
    assert meter.check("turn") is None
    assert meter.total()["calls"] == 50
    assert cost.meter_view(None)["day"]["spent"] == pytest.approx(50 * PER)
    assert cost.report("model") == []


def test_no_session_record_means_no_session_file_but_the_spend_counts(home):
    sid = store.new_sid()                      # never made
    cost.Meter(sid, None, None).charge("turn", "anthropic", HAIKU, ONE)
    assert not (home / "sessions" / sid).exists()
    assert machine_today(home) == pytest.approx(PER)


def test_old_periods_are_dropped_from_spend_json(home):
    a = new_session()
    append_raw(home, raw_line(a, ts="2001-02-03T04:05:06Z"))
    cost.Meter(a, None, None).charge("turn", "anthropic", HAIKU, ONE)
    doc = spend(home)
    assert "2001-02-03" not in doc["day"] and "2001-02" not in doc["month"]
    assert cost.session_total(a)["calls"] == 2                    # the session still counts it
    assert {r["key"] for r in cost.report("day")} >= {"2001-02-03"}


CHARGER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from overlord.trust import cost
shared, own, n, who = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
go = sys.stdin.read()                        # every process starts together
for i in range(n):
    cost.Meter(shared if i % 2 else own, "/srv/app", who).charge(
        "turn", "anthropic", "claude-haiku-4-5", {"input_tokens": 1000, "output_tokens": 100})
    cost.Meter(shared, "/srv/app", who).check("turn")
"""


def test_processes_charging_at_once_lose_no_line_and_no_total(home):
    shared = new_session()
    procs, owns, n = [], [], 40
    for k in range(4):
        own = new_session()
        owns.append(own)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", CHARGER, REPO, shared, own, str(n), f"user{k % 2}"],
            stdin=subprocess.PIPE, env=dict(os.environ, OVERLORD_HOME=str(home))))
    cost.set_budget("config", session_usd=1e6)
    for p in procs:
        p.stdin.close()
    for p in procs:
        assert p.wait(timeout=120) == 0
    lines = (home / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 4 * n and all(json.loads(x) for x in lines)
    assert cost.session_total(shared)["calls"] == 4 * n // 2
    for own in owns:
        assert cost.session_total(own)["calls"] == n // 2
    doc = spend(home)
    assert doc["offset"] == os.path.getsize(home / "ledger.jsonl")
    day = max(doc["day"])
    assert doc["day"][day]["*"] == pytest.approx(4 * n * PER)
    assert doc["day"][day]["account:user0"] == pytest.approx(2 * n * PER)
    assert doc["day"][day][cost.target_scope("/srv/app")] == pytest.approx(4 * n * PER)
    # the caches agree with a rebuild from the ledger
    os.unlink(home / "spend.json")
    for sid in owns + [shared]:
        os.unlink(session_file(home, sid))
    assert cost.meter_view("user1")["day"]["spent"] == pytest.approx(2 * n * PER)
