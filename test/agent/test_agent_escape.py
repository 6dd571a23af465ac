"""A prompt-injected model cannot drive the operator's terminal: whatever escape sequences its
replies, its thinking, its tool calls and their errors carry reach `agent`, `resume` and
`transcript` output escaped."""
import json

from agentlib import call, kovl, write_script  # noqa: F401 -- kovl is a fixture

TITLE, CLEAR = "\x1b]0;pwned\x07", "\x1b[2J"


def assert_inert(text):
    bad = sorted({c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0})
    assert not bad, (bad, text)


def test_model_text_reaches_the_terminal_escaped(kovl, target, tmp_path):
    turns = [
        {"thinking": f"plan {TITLE} quietly\r", "text": f"Hello {TITLE}{CLEAR} there\r\n",
         "tool_calls": [call("read_file", path=f"no{CLEAR}such"),
                        call("write_file", path="note.txt", content="ok\n")]},
        {"text": f"done {CLEAR}", "stop_reason": "end_turn"},
    ]
    sid, proc = kovl.scripted(target, tmp_path, turns, check=0)
    assert sid, (proc.out, proc.err)
    assert_inert(proc.out)
    assert_inert(proc.err)
    assert "Hello \\x1b]0;pwned\\x07\\x1b[2J there\\r" in proc.out, proc.out
    assert "plan \\x1b]0;pwned\\x07 quietly\\r" in proc.err, proc.err
    assert "no\\x1b[2Jsuch" in proc.out, proc.out              # the call line and its error
    assert "done \\x1b[2J" in proc.out

    shown = kovl("transcript", sid, check=0).out
    assert_inert(shown)
    assert "Hello \\x1b]0;pwned\\x07\\x1b[2J there" in shown and "plan \\x1b]0;pwned" in shown
    # the record keeps the exact text: only what is shown is escaped
    events = json.loads(kovl("transcript", sid, "--json", check=0).out)
    assert any(TITLE in (e.get("message") or {}).get("text", "") for e in events)


def test_provider_errors_and_resume_notes_are_escaped(kovl, target, tmp_path):
    script = write_script(tmp_path, [{"text": "first", "stop_reason": "end_turn"},
                                     {"error": f"gateway said {TITLE}{CLEAR}"}])
    sid, proc = kovl.agent(target, "task", "--provider", "scripted", "--script", script, check=0)
    assert sid, proc.err
    proc = kovl("resume", sid, "--note", f"go on {CLEAR}", check=1)
    assert_inert(proc.out + proc.err)
    assert "gateway said \\x1b]0;pwned\\x07\\x1b[2J" in proc.out + proc.err
    shown = kovl("transcript", sid, check=0).out
    assert_inert(shown)
    assert "go on \\x1b[2J" in shown and "gateway said \\x1b]0;pwned" in shown
