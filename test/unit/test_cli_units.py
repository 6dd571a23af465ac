"""Pure pieces of the faces and records: escaping, ids, manifests, trace parsing, help text."""
import json
import os

import pytest

from overlord import ops
from overlord.cli import main as cli
from overlord.cli.render import escape_path
from overlord.errors import UsageError
from overlord.sandbox.trace import parse_line
from overlord.txn import store

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_escape_path():
    raw = os.fsdecode(b"a\nb\xff c\\d")
    assert escape_path(raw) == "a\\nb\\xff c\\\\d"
    assert escape_path("caf\u00e9") == "caf\u00e9"


@pytest.mark.parametrize("sid", ["../x", "20261129-000000-abcdef/..", "", "x" * 22,
                                 "20261129-000000-ABCDEF", "20261129-000000-abcde"])
def test_bad_session_ids_are_refused(sid):
    with pytest.raises(UsageError):
        store.check_sid(sid)


def test_good_session_id_round_trips():
    assert store.check_sid(store.new_sid())


def test_manifest_rejects_unknown_keys_and_bad_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(UsageError, match="not valid JSON"):
        ops.load_manifest(str(bad))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"jail": True, "root": True}))
    with pytest.raises(UsageError, match="unknown key"):
        ops.load_manifest(str(unknown))
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({"timeout": "soon"}))
    with pytest.raises(UsageError, match="wrong type"):
        ops.load_manifest(str(typed))


def test_flags_override_manifest():
    assert ops.merge_grants({"timeout": 5, "jail": True}, {"timeout": 9, "jail": None}) == \
        {"timeout": 9, "jail": True}


def test_trace_value_is_only_strace_or_ebpf():
    assert cli._normalize_trace(["run", "--trace", "ebpf", "--", "x"])[1] == "--trace=ebpf"
    assert cli._normalize_trace(["run", "--trace", "ls"])[1:] == ["--trace=strace", "ls"]


def test_strace_line_parsing():
    rec = parse_line('12 1700000000.123456 openat(AT_FDCWD, "out.txt", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 3')
    assert rec["pid"] == 12 and rec["syscall"] == "openat" and rec["write"] and rec["path"] == "out.txt"
    rec = parse_line('12 1700000000.2 execve("/bin/true", ["true"], 0x7ffd /* 3 vars */) = 0')
    assert rec["kind"] == "exec" and "write" not in rec


def test_every_command_has_help_and_a_readme_mention():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    for name, p in sub.choices.items():
        assert p.description or p.format_help().strip(), name
        assert f"overlord {name}" in readme, f"README does not mention `overlord {name}`"
