"""The keyed audit chain: its construction, its key, every tamper case verify must catch, pins,
concurrent appenders, and the CLI's one-line errors."""
import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, Ovl
from overlord.errors import OverlordError
from overlord.trust import audit

SID = "20261201-074714-3fa2c1"


@pytest.fixture
def cli(home):
    return Ovl(home)


def raw_lines(home):
    return (home / "audit.jsonl").read_bytes().splitlines(keepends=True)


def write_lines(home, lines):
    (home / "audit.jsonl").write_bytes(b"".join(lines))


def fill(n=5):
    return [audit.append("session.open", sid=SID, target="/srv/t", n=i) for i in range(n)]


def broken(cli, line, seq, why):
    proc = cli("audit", "verify", check=1)
    err = proc.err.strip()
    assert "\n" not in err and err.startswith("overlord: audit chain does not hold at ")
    assert f"line {line} (seq {seq})" in err and why in err, err
    assert f"chain: BROKEN at line {line} (seq {seq})" in proc.out
    report = json.loads(cli("audit", "verify", "--json", check=1).out)
    assert report["ok"] is False and report["bad"]["line"] == line and report["bad"]["seq"] == seq
    return report


# -- construction -------------------------------------------------------------------------------

def test_a_line_is_its_canonical_text_and_a_chained_mac(home):
    first = audit.append("session.open", sid=SID, target="/srv/t", grants={"net": "none"})
    second = audit.append("session.commit", sid=SID, changes=2, actor="7:someone")
    assert (first["seq"], second["seq"]) == (1, 2)
    assert first["actor"] == audit.actor() == f"{os.getuid()}:{__import__('pwd').getpwuid(os.getuid()).pw_name}"
    assert second["actor"] == "7:someone" and second["changes"] == 2
    key = (home / "audit.key").read_bytes()
    assert len(key) == 32 and (home / "audit.key").stat().st_mode & 0o777 == 0o600
    assert (home / "audit.jsonl").stat().st_mode & 0o777 == 0o600
    prev = ""
    for raw, returned in zip(raw_lines(home), (first, second)):
        entry = json.loads(raw)
        assert entry == returned
        mac = entry.pop("mac")
        canonical = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        # what docs/AUDIT.md promises an independent verifier
        assert mac == hmac.new(key, (prev + "\n" + canonical).encode(), hashlib.sha256).hexdigest()
        assert raw == canonical[:-1].encode() + b',"mac":"' + mac.encode() + b'"}\n'
        prev = mac
    report = audit.verify()
    assert report == {"signed": True, "lines": 2, "head": {"seq": 2, "hash": second["mac"]},
                      "ok": True, "bad": None, "pin": None, "witness": None}


def test_details_that_are_not_utf8_reach_the_line_exactly(home):
    entry = audit.append("session.open", sid=SID, target="/srv/t\udcff", path="a\udcfe\n")
    line = json.loads(raw_lines(home)[0])
    b64 = lambda b: base64.b64encode(b).decode()      # noqa: E731
    assert line["target"] == "/srv/t\\xff" and line["target_b64"] == b64(b"/srv/t\xff")
    assert line["path"] == "a\\xfe\\n" and line["path_b64"] == b64(b"a\xfe\n")
    assert entry["target_b64"] == b64(b"/srv/t\xff") and audit.verify()["ok"]


def test_unknown_action_and_reserved_detail_are_programming_errors(home):
    with pytest.raises(ValueError):
        audit.append("session.frobnicate")
    with pytest.raises(ValueError):
        audit.append("session.open", mac="x")
    assert not (home / "audit.jsonl").exists() or raw_lines(home) == []


def test_append_reads_only_the_tail(home):
    fill(3)
    big = audit.append("session.commit", sid=SID, note="x" * 20000)      # a line > one chunk
    after = audit.append("session.rollback", sid=SID)
    assert after["seq"] == big["seq"] + 1 == 5 and audit.verify()["ok"]


def test_checkpoint_reports_the_head_that_includes_it(home):
    fill(2)
    head = audit.checkpoint()
    last = json.loads(raw_lines(home)[-1])
    assert last["action"] == "audit.checkpoint"
    assert head == {"seq": 3, "hash": last["mac"]} == audit.head()


def test_entries_filter_by_seq_and_action(home):
    fill(2)
    audit.append("session.commit", sid=SID)
    audit.checkpoint()
    assert [e["seq"] for e in audit.entries(since=3)] == [3, 4]
    assert [e["action"] for e in audit.entries(action="session.commit")] == ["session.commit"]
    assert [e["seq"] for e in audit.entries(action="session")] == [1, 2, 3]
    assert [e["seq"] for e in audit.entries(action="audit")] == [4]


# -- the key ------------------------------------------------------------------------------------

def test_the_first_users_race_leaves_one_key(home):
    """Two first users: the loser's link fails and it reads the winner's key, never replacing it."""
    home.mkdir(exist_ok=True)
    a = audit._make_key(str(home / "audit.key"))
    b = audit._make_key(str(home / "audit.key"))
    assert a == b == (home / "audit.key").read_bytes()
    assert [p for p in os.listdir(home) if p.startswith("audit.key.tmp")] == []


@pytest.mark.parametrize("damage, words", [
    (lambda p: os.chmod(p, 0o640), "mode 0640"),
    (lambda p: os.chmod(p, 0o604), "mode 0604"),
    (lambda p: p.write_bytes(b"k" * 31), "31 bytes, not 32"),
    (lambda p: (p.unlink(), p.symlink_to("/etc/hostname")), "is a symlink"),
], ids=["group-readable", "other-readable", "wrong-size", "symlink"])
def test_a_bad_key_refuses_and_is_never_replaced(home, cli, damage, words):
    fill(2)
    key = home / "audit.key"
    damage(key)
    before = os.readlink(key) if key.is_symlink() else key.read_bytes()
    log = (home / "audit.jsonl").read_bytes()
    for call in (audit.ready, lambda: audit.append("session.commit", sid=SID), audit.verify):
        with pytest.raises(OverlordError) as exc:
            call()
        assert str(key) in str(exc.value) and words in str(exc.value)
    for args in (("audit", "verify"), ("audit", "checkpoint"), ("audit", "key")):
        err = cli(*args, check=1).err
        assert err.count("\n") == 1 and err.startswith(f"overlord: audit key {key}") and words in err
    assert (os.readlink(key) if key.is_symlink() else key.read_bytes()) == before
    assert (home / "audit.jsonl").read_bytes() == log


def test_a_key_owned_by_someone_else_refuses(home, monkeypatch):
    fill(1)
    owner = 65534
    if os.geteuid() == 0:
        os.chown(home / "audit.key", owner, owner)
    else:              # an ordinary user cannot give a file away: be someone else instead
        owner = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(OverlordError, match=f"owned by uid {owner}"):
        audit.ready()
    with pytest.raises(OverlordError, match=f"owned by uid {owner}"):
        audit.append("session.commit", sid=SID)


def test_a_lost_key_refuses_appends_rather_than_starting_a_new_one(home, cli):
    fill(2)
    (home / "audit.key").unlink()
    with pytest.raises(OverlordError, match="audit.key: is missing while audit.jsonl holds 2"):
        audit.ready()
    with pytest.raises(OverlordError, match="is missing"):
        audit.append("session.commit", sid=SID)
    assert not (home / "audit.key").exists() and len(raw_lines(home)) == 2
    broken(cli, 1, 1, "the key")


def test_a_writable_log_refuses(home):
    fill(1)
    os.chmod(home / "audit.jsonl", 0o622)
    with pytest.raises(OverlordError, match="audit.jsonl: is mode 0622"):
        audit.ready()


# -- tampering ----------------------------------------------------------------------------------

def test_an_untouched_chain_verifies(home, cli):
    fill(4)
    proc = cli("audit", "verify", check=0)
    assert proc.out.splitlines()[:2] == ["signed", "lines: 4"]
    assert json.loads(proc.out.splitlines()[2].removeprefix("head: ")) == audit.head()
    assert "chain: ok" in proc.out and proc.err == ""


def test_an_edited_line(home, cli):
    fill(4)
    lines = raw_lines(home)
    lines[1] = lines[1].replace(b'"n":1', b'"n":7')
    write_lines(home, lines)
    broken(cli, 2, 2, "the mac does not verify")


def test_a_reformatted_line_is_an_edit(home, cli):
    fill(3)
    lines = raw_lines(home)
    lines[2] = json.dumps(json.loads(lines[2]), sort_keys=True).encode() + b"\n"   # same data
    write_lines(home, lines)
    broken(cli, 3, 3, "rewritten")


def test_a_deleted_line(home, cli):
    fill(4)
    lines = raw_lines(home)
    del lines[1]
    write_lines(home, lines)
    broken(cli, 2, 3, "deleted")


def test_reordered_lines(home, cli):
    fill(4)
    lines = raw_lines(home)
    lines[1], lines[2] = lines[2], lines[1]
    write_lines(home, lines)
    broken(cli, 2, 3, "deleted")
    # renumbered to hide the swap, the macs no longer chain
    lines = raw_lines(home)
    lines[1], lines[2] = lines[1].replace(b'"seq":3', b'"seq":2'), lines[2].replace(b'"seq":2', b'"seq":3')
    write_lines(home, lines)
    broken(cli, 2, 2, "the mac does not verify")


def test_an_inserted_line(home, cli):
    fill(3)
    lines = raw_lines(home)
    forged = lines[1].replace(b'"n":1', b'"n":9')
    write_lines(home, lines[:2] + [forged] + lines[2:])
    broken(cli, 3, 2, "reordered, repeated or inserted")
    # the insertion renumbered, every later seq shifted: the forged line's mac fails
    renumbered = [lines[0], lines[1], forged.replace(b'"seq":2', b'"seq":3'),
                  lines[2].replace(b'"seq":3', b'"seq":4')]
    write_lines(home, renumbered)
    broken(cli, 3, 3, "the mac does not verify")


def test_a_line_forged_with_another_key(home, cli):
    fill(2)
    entry = {"action": "session.commit", "actor": "0:root", "seq": 3, "ts": 1.0}
    canonical = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    mac = hmac.new(b"k" * 32, (audit.head()["hash"] + "\n" + canonical).encode(), hashlib.sha256).hexdigest()
    write_lines(home, raw_lines(home) + [canonical[:-1].encode() + b',"mac":"' + mac.encode() + b'"}\n'])
    broken(cli, 3, 3, "the mac does not verify")


def test_stripped_macs_with_a_key_present_are_a_downgrade(home, cli):
    fill(3)
    stripped = []
    for raw in raw_lines(home):
        entry = json.loads(raw)
        entry.pop("mac")
        stripped.append(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    write_lines(home, stripped)
    report = broken(cli, 1, 1, "MACs stripped: a downgrade")
    assert report["signed"] is True
    with pytest.raises(OverlordError, match="carries no mac while the key exists"):
        audit.append("session.commit", sid=SID)
    # and with the key deleted too, the log says UNSIGNED loudly (seq order alone is checked)
    (home / "audit.key").unlink()
    proc = cli("audit", "verify", check=0)
    assert proc.out.startswith("UNSIGNED (no audit key") and "lines: 3" in proc.out
    assert "audit chain: UNSIGNED, 3 lines, ok" in cli("doctor", check=None).out
    write_lines(home, stripped[:1] + stripped[2:])
    broken(cli, 2, 3, "deleted")


def test_a_torn_last_line_is_named_and_never_continued(home, cli):
    fill(3)
    whole = (home / "audit.jsonl").read_bytes()
    torn = raw_lines(home)[0][:40]
    (home / "audit.jsonl").write_bytes(whole + torn)
    broken(cli, 4, 4, "torn")
    for call in (audit.ready, lambda: audit.append("session.commit", sid=SID)):
        with pytest.raises(OverlordError, match="the last line is torn"):
            call()
    err = cli("audit", "checkpoint", check=1).err
    assert err.count("\n") == 1 and "torn" in err
    assert (home / "audit.jsonl").read_bytes() == whole + torn


def test_doctor_names_the_first_bad_line(home, cli):
    fill(3)
    assert "audit chain: signed, 3 lines, ok" in cli("doctor", check=None).out
    lines = raw_lines(home)
    write_lines(home, lines[:1] + lines[2:])
    out = cli("doctor", check=None).out
    assert "audit chain: signed, 2 lines, BROKEN at line 2 (seq 3)" in out
    report = json.loads(cli("doctor", "--json", check=None).out)["audit"]
    assert report["ok"] is False and report["bad"]["line"] == 2


# -- pins ---------------------------------------------------------------------------------------

def test_a_pin_catches_truncation_and_a_rewrite_by_a_key_holder(home, cli, tmp_path):
    fill(3)
    pin = tmp_path / "pin.json"
    assert cli("audit", "checkpoint", pin, check=0).out == ""
    assert json.loads(pin.read_text()) == audit.head() and audit.head()["seq"] == 4
    fill(2)
    assert "pin: seq 4 carried" in cli("audit", "verify", "--pin", pin, check=0).out
    # truncated below the pin: the chain itself still holds
    write_lines(home, raw_lines(home)[:3])
    assert cli("audit", "verify", check=0)
    proc = cli("audit", "verify", "--pin", pin, check=1)
    assert "pin: seq 4 NOT carried: the log stops at seq 3" in proc.out
    assert proc.err.startswith("overlord: audit chain does not hold at the pin's seq 4")
    # the key holder re-appends past the pin: a valid chain, but not the pinned line
    fill(3)
    assert audit.verify()["ok"]
    report = json.loads(cli("audit", "verify", "--pin", pin, "--json", check=1).out)
    assert report["bad"] is None and report["pin"]["ok"] is False
    assert "not the one recorded" in report["pin"]["why"]


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"seq": 3}', '{"seq": "3", "hash": "%s"}' % ("a" * 64),
                                     '{"seq": 0, "hash": "%s"}' % ("a" * 64), '{"seq": 3, "hash": "xyz"}'])
def test_a_pin_that_is_not_seq_and_hash_is_a_usage_error(home, cli, tmp_path, content):
    fill(1)
    pin = tmp_path / "pin.json"
    pin.write_text(content)
    err = cli("audit", "verify", "--pin", pin, check=2).err
    assert err.count("\n") == 1 and err.startswith(f"overlord: pin {pin}")
    err = cli("audit", "verify", "--pin", tmp_path / "missing.json", check=2).err
    assert err.count("\n") == 1 and "no such file" in err


# -- concurrency --------------------------------------------------------------------------------

WRITER = """
import sys
from overlord.trust import audit
for i in range(50):
    audit.append("session.open", sid=None, writer=int(sys.argv[1]), i=i)
"""


def test_eight_processes_append_fifty_acts_each(home, cli):
    env = dict(os.environ, OVERLORD_HOME=str(home), PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w)], env=env) for w in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    entries = audit.entries()
    assert [e["seq"] for e in entries] == list(range(1, 401))
    for w in range(8):
        assert [e["i"] for e in entries if e["writer"] == w] == list(range(50))
    report = json.loads(cli("audit", "verify", "--json", check=0).out)
    assert report["ok"] and report["lines"] == 400 and report["head"]["seq"] == 400
    assert sorted(p for p in os.listdir(home) if p.startswith("audit")) == ["audit.jsonl", "audit.key"]


# -- the CLI ------------------------------------------------------------------------------------

def test_show_escapes_what_came_from_a_record(home, cli):
    audit.append("session.open", sid=SID, target="/srv/\x1b[31mred\n", command="echo \x07hi")
    audit.append("session.commit", sid=SID, changes=1)
    out = cli("audit", "show", check=0).out
    assert "\x1b" not in out and "\x07" not in out
    assert "/srv/\\x1b[31mred\\n" in out and "session.commit" in out
    assert out.splitlines()[0].split() == ["SEQ", "TIME", "ACTOR", "ACTION", "SID", "TARGET", "DETAILS"]
    rows = json.loads(cli("audit", "show", "--json", check=0).out)
    assert rows[0]["target"] == "/srv/\x1b[31mred\n" and rows[0]["command"] == "echo \x07hi"
    assert [r["seq"] for r in json.loads(cli("audit", "show", "--since", "2", "--json", check=0).out)] == [2]
    only = cli("audit", "show", "--action", "session.commit", check=0).out.splitlines()
    assert len(only) == 2 and only[1].split()[0] == "2"
    assert cli("audit", "show", "--since", "x", check=2).err.startswith("overlord: ")


def test_key_says_where_the_key_is(home, cli):
    out = cli("audit", "key", check=0).out
    assert str(home / "audit.key") in out and "not made yet" in out
    fill(1)
    info = json.loads(cli("audit", "key", "--json", check=0).out)
    assert info == {"path": str(home / "audit.key"), "exists": True, "log": str(home / "audit.jsonl")}


def test_an_empty_log_is_unsigned_and_holds(home, cli):
    proc = cli("audit", "verify", check=0)
    assert proc.out.startswith("UNSIGNED (empty") and "lines: 0" in proc.out
    assert not (home / "audit.key").exists()


def test_checkpoint_to_stdout_and_a_refused_send_records_nothing(home, cli):
    fill(1)
    head = json.loads(cli("audit", "checkpoint", check=0).out)
    assert head == audit.head() and head["seq"] == 2
    err = cli("audit", "checkpoint", "--send", check=1).err
    assert err == "overlord: no witness configured (`overlord audit witness URL` sets one)\n"
    assert audit.head() == head
