"""Pure pieces of the faces and records: escaping, ids, manifests, trace parsing, help text."""
import io
import json
import os
import pty

import pytest

from overlord import ops
from overlord.cli import agent_cmds
from overlord.cli import main as cli
from overlord.cli import render as R
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




# -- what reaches a terminal ------------------------------------------------------------------

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[8m\r\x9b31m"


def assert_inert(text):
    """No byte a terminal acts on except newline (and tab)."""
    bad = [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0]
    assert not bad, repr(text)


def test_streamed_deltas_are_escaped_even_split_across_pieces():
    out, err = io.StringIO(), io.StringIO()
    live = agent_cmds.Live(out, err)
    pieces = ["Hi \x1b", "]0;pwned", "\x07 and \r", "\n\x1b[2J", " done\n"]
    for piece in pieces:
        live.delta("text", piece)
    for piece in ["think \x1b", "[8m", "\r"]:
        live.delta("thinking", piece)
    live.event({"type": "assistant", "message": {"text": "".join(pieces)}, "stop_reason": "end_turn"})
    assert_inert(out.getvalue())
    assert_inert(err.getvalue())
    assert "Hi \\x1b]0;pwned\\x07 and \\r\n\\x1b[2J done\n" in out.getvalue()
    assert "think \\x1b[8m\\r" in err.getvalue()


def test_unstreamed_reply_tool_lines_and_errors_are_escaped():
    out, err = io.StringIO(), io.StringIO()
    live = agent_cmds.Live(out, err)
    live.event({"type": "assistant", "message": {"text": "reply " + HOSTILE}, "stop_reason": "tool_use"})
    live.event({"type": "tool_call", "turn": 1, "summary": "read_file " + HOSTILE})
    live.event({"type": "tool_result", "turn": 1, "tool": "read_file", "layer": None,
                "result": {"is_error": True, "content": "no such file: " + HOSTILE}})
    live.event({"type": "error", "message": "provider said " + HOSTILE})
    assert_inert(out.getvalue() + err.getvalue())
    assert "\\x1b]0;pwned" in out.getvalue() and "\\x1b[2J" in err.getvalue()


def test_transcript_lines_are_escaped():
    events = [
        {"type": "task", "text": "do " + HOSTILE + "\nsecond line"},
        {"type": "assistant", "turn": 1, "model": "m" + HOSTILE, "stop_reason": "end_turn",
         "thinking": "hmm " + HOSTILE, "message": {"text": "text " + HOSTILE}},
        {"type": "tool_call", "turn": 1, "summary": "shell " + HOSTILE, "call": "c" + HOSTILE,
         "refused": "no " + HOSTILE},
        {"type": "tool_result", "turn": 1, "tool": "shell", "layer": None,
         "result": {"is_error": True, "content": HOSTILE}},
        {"type": "error", "turn": 1, "message": HOSTILE},
        {"type": "compaction", "tokens": 1, "window": 2, "dropped": 1, "kept": 1, "note": HOSTILE},
        {"type": "resume", "note": HOSTILE},
        {"type": "done", "reason": "error", "message": HOSTILE, "turns": 1},
    ]
    text = "\n".join(filter(None, map(agent_cmds._transcript_line, events)))
    assert_inert(text)
    fields = sum(json.dumps(ev).count("pwned") for ev in events)     # every field shows, escaped
    assert "    second line" in text and text.count("\\x1b]0;pwned") == fields == 12


def test_blame_owner_is_escaped():
    owner = {"sid": "20261201-074714-3fa2c1", "layer": 0, "kind": "command", "command": "x " + HOSTILE}
    assert_inert(R.owner_text(owner, width=200))
    assert "\\x1b]0;pwned" in R.owner_text(owner, width=200)
    assert_inert(R.owner_text({"sid": "s", "layer": 1, "turn": 2, "tool": "shell", "call": HOSTILE}))
    assert R.owner_text("origin") == "origin"


def test_error_line_is_one_inert_line():
    line = R.error_line(Exception("commit refused: modified-externally: a\nb" + HOSTILE + "\tc"))
    assert line.startswith("overlord: commit refused") and "\n" not in line and "\t" not in line
    assert_inert(line)


def test_own_line_prefix_only_on_a_terminal(tmp_path):
    assert R.own_line_prefix(io.StringIO()) == ""
    with open(tmp_path / "f", "w") as f:
        assert R.own_line_prefix(f) == ""
    r, w = os.pipe()
    with os.fdopen(w, "w") as pipe:
        assert R.own_line_prefix(pipe) == ""
    os.close(r)
    master, slave = pty.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            prefix = R.own_line_prefix(tty)
    finally:
        os.close(master)
        os.close(slave)
    assert prefix.startswith("\x1b[0m") and prefix.endswith("\r\x1b[K")


def test_exit_text_explains_what_ended_the_command():
    assert R.exit_text(0) == "exit 0"
    assert R.exit_text(124, timed_out=True) == "exit 124 (timed out)"
    assert R.exit_text(122, limit=("disk_mb", 5)) == "exit 122 (disk grant of 5 MiB reached)"
    assert ops.crossed_grant({"limit": "disk_mb", "grants": {"limits": {"disk_mb": 5}}}) == ("disk_mb", 5)
    assert ops.crossed_grant({"grants": {}}) is None


def test_a_fork_is_listed_as_fork_of():
    assert R.session_cause({"command": "sh -c x", "forked_from": {"sid": "20261201-074714-3fa2c1",
                                                                  "at": 2}}) == \
        "fork of 20261201-074714-3fa2c1@2"
    assert R.session_cause({"command": "printf '\x1b[2J'"}) == "printf '\\x1b[2J'"
    assert R.session_cause({}) == "-"


# -- help ---------------------------------------------------------------------------------------

def subparsers(parser):
    """[(name words, parser)] of every subcommand, nested ones (keys set) too."""
    out = []
    for action in parser._actions:
        if isinstance(action, __import__("argparse")._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, p in action.choices.items():
                out.append(((name,), p, helps.get(name)))
                out += [((name,) + words, q, h) for words, q, h in subparsers(p)]
    return out


def test_every_subcommand_has_a_one_line_help_and_a_description():
    found = subparsers(cli.build_parser())
    assert len(found) > 20
    for words, p, help in found:
        assert help and "\n" not in help and len(help) <= 64, (words, help)
        assert p.description, words


def test_help_says_what_sid_is_and_shows_the_command():
    for words, p, _ in subparsers(cli.build_parser()):
        text = p.format_help()
        if any(a.dest in ("sid", "a") for a in p._actions):
            assert "SID" in p.format_usage(), words
            assert "20261201-074714-3fa2c1" in text and "`last`" in text, words
        if words in (("run",), ("exec",)):
            assert "-- CMD [ARG...]" in p.format_usage(), words
    assert "`last`" in cli.build_parser().format_help()
