"""`overlord users ...` as a real process: passwords never from argv, one `overlord:` line for
bad input (nothing changed, no traceback), the token once on stdout, --json where listed.

What the CLI did is checked through the library (overlord.trust.auth) in the test's process,
which reads the same OVERLORD_HOME."""
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from conftest import REPO, Ovl
from overlord.trust import audit, auth

PW = "correct horse battery"


@pytest.fixture
def ovl(home):
    return Ovl(home)


@pytest.fixture(autouse=True)
def fresh_lockout():
    auth.lockout.clear()


def refused(proc, code, *words):
    """One `overlord:` line on stderr, the exit code, no traceback, nothing on stdout."""
    assert proc.returncode == code, (proc.returncode, proc.out, proc.err)
    lines = proc.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlord: "), proc.err
    assert "Traceback" not in proc.err and proc.out == ""
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def add(ovl, name, role="operator", password=PW, check=0):
    return ovl("users", "add", name, "--role", role, input=(password + "\n").encode(),
               check=check)


# -- hostile input -----------------------------------------------------------------------------

def test_a_password_on_the_command_line_is_refused(ovl, home):
    for argv in (["users", "add", "alice", "--role", "admin", "--password", PW],
                 ["users", "add", "alice", PW, "--role", "admin"],
                 ["users", "passwd", "alice", PW]):
        proc = ovl(*argv, input=b"")
        refused(proc, 2)
        assert PW not in proc.err                  # and never echoed back
    assert not (home / "users.json").exists()


@pytest.mark.parametrize("name", ["Alice", "a/b", "..", "1abc", "a" * 33, "ann@corp.example",
                                  "-rf", "al\x1bice"])
def test_a_bad_name_is_one_line_and_nothing_changes(ovl, home, name):
    line = refused(ovl("users", "add", name, "--role", "admin", input=(PW + "\n").encode()), 2)
    assert "\x1b" not in line                      # escaped on the terminal
    assert not (home / "users.json").exists() and not (home / "users").exists()


def test_a_bad_role_is_one_line(ovl, home):
    refused(ovl("users", "add", "alice", "--role", "root", input=(PW + "\n").encode()), 2, "root")
    refused(ovl("users", "add", "alice", input=(PW + "\n").encode()), 2, "--role")
    assert not (home / "users.json").exists()


@pytest.mark.parametrize("stdin, words", [(b"", "no password"), (b"short\n", "at least 8"),
                                         (b"\xff\xfe not utf-8\n", "UTF-8"),
                                         (b"x" * 9000 + b"\n", "too long"),
                                         (b"tab\tinside pw\n", "control")])
def test_a_bad_password_on_stdin_is_one_line(ovl, home, stdin, words):
    refused(ovl("users", "add", "alice", "--role", "admin", input=stdin), 2, words)
    assert not (home / "users.json").exists()


def test_a_damaged_or_readable_accounts_file_is_one_line(ovl, home):
    p = home / "users.json"
    p.write_text("{broken")
    os.chmod(p, 0o600)
    refused(ovl("users", "list"), 1, "users.json", "damaged")
    refused(ovl("users", "token", "alice"), 1, "damaged")
    assert p.read_text() == "{broken"
    p.write_text(json.dumps({"version": 1, "users": {}, "tokens": {}}))
    os.chmod(p, 0o644)
    refused(ovl("users", "list", "--json"), 1, "mode 0644", "chmod 600")
    refused(add(ovl, "alice", check=None), 1, "mode 0644")
    assert json.loads(p.read_text())["users"] == {}


def test_unknown_accounts_and_tokens(ovl, home):
    for argv, words in ((["users", "rm", "ghost"], "no account ghost"),
                        (["users", "role", "ghost", "viewer"], "no account ghost"),
                        (["users", "passwd", "ghost"], "no account ghost"),
                        (["users", "token", "ghost"], "no account ghost"),
                        (["users", "tokens", "ghost"], "no account ghost"),
                        (["users", "revoke", "ghost", "0123456789ab"], "no account ghost")):
        refused(ovl(*argv, input=(PW + "\n").encode()), 1, words)
    assert add(ovl, "alice").returncode == 0
    refused(ovl("users", "revoke", "alice", "0123456789ab"), 1, "no token")
    refused(ovl("users", "role", "alice", "boss"), 2, "boss")
    refused(add(ovl, "alice", role="viewer", check=None), 2, "exists")          # before any prompt


# -- the commands ------------------------------------------------------------------------------

def test_add_reads_one_line_of_stdin_and_turns_sign_in_on(ovl, home):
    proc = ovl("users", "add", "alice", "--role", "admin",
               input=(PW + "\r\nsecond line is not the password\n").encode(), check=0)
    assert proc.out == "added alice (admin)\n"
    assert "sign-in is on" in proc.err
    assert auth.enabled() is True
    assert auth.check_password("alice", PW, None).role == "admin"
    assert PW not in (home / "users.json").read_text()
    line = [e for e in audit.entries() if e["action"] == "user.add"][-1]
    assert line["name"] == "alice" and line["by"].startswith("cli:")
    proc = add(ovl, "bob")
    assert proc.out == "added bob (operator)\n" and "sign-in is on" not in proc.err


def test_list_and_its_json(ovl, home):
    proc = ovl("users", "list", check=0)
    assert "no accounts: sign-in is off" in proc.out
    assert json.loads(ovl("users", "list", "--json", check=0).out) == []
    add(ovl, "zed", "viewer")
    add(ovl, "amy", "admin")
    ovl("users", "token", "zed", check=0)
    lines = ovl("users", "list", check=0).out.splitlines()
    assert [line.split()[:3] for line in lines] == [["amy", "admin", "local"],
                                                    ["zed", "viewer", "local"]]
    assert lines[1].endswith("1 token")
    rows = json.loads(ovl("users", "list", "--json", check=0).out)
    assert [(r["name"], r["role"], r["sso"], r["tokens"]) for r in rows] == \
        [("amy", "admin", False, 0), ("zed", "viewer", False, 1)]
    assert all(set(r) == {"name", "role", "sso", "created", "tokens"} for r in rows)


def test_token_is_printed_once_on_stdout_and_revoked_by_id(ovl, home):
    add(ovl, "cy")
    proc = ovl("users", "token", "cy", "--label", "deploy bot", check=0)
    token = proc.out.strip()
    assert proc.out == token + "\n" and token.startswith("ovl_")
    assert "shown this once" in proc.err and token not in proc.err
    tid = token.split("_")[1]
    assert auth.bearer(token).name == "cy"
    shown = ovl("users", "tokens", "cy", check=0).out
    assert tid in shown and "deploy bot" in shown and token not in shown
    rows = json.loads(ovl("users", "tokens", "cy", "--json", check=0).out)
    assert [(r["id"], r["label"]) for r in rows] == [(tid, "deploy bot")]
    assert "sha256" not in rows[0] and token not in json.dumps(rows)
    refused(ovl("users", "token", "cy", "--label", "bad\nlabel"), 2, "label")
    assert ovl("users", "revoke", "cy", tid, check=0).out == f"revoked token {tid} of cy\n"
    assert auth.bearer(token) is None
    assert "cy has no tokens" in ovl("users", "tokens", "cy", check=0).out
    assert token not in open(audit.log_path()).read()


def test_role_and_passwd_end_the_accounts_logins(ovl, home):
    add(ovl, "dee")
    cookie = auth.login_create("dee")
    proc = ovl("users", "role", "dee", "viewer", check=0)
    assert proc.out == "dee: operator -> viewer; 1 login ended\n"
    assert auth.login_lookup(cookie) is None
    assert "already viewer" in ovl("users", "role", "dee", "viewer", check=0).out
    cookie = auth.login_create("dee")
    proc = ovl("users", "passwd", "dee", input=b"the new password\n", check=0)
    assert proc.out == "password changed for dee; 1 login ended\n"
    assert auth.login_lookup(cookie) is None
    assert auth.check_password("dee", "the new password", None).role == "viewer"


def test_passwd_refuses_a_single_sign_on_account(ovl, home):
    auth.add("eve@corp.example", "operator",
             sso={"issuer": "https://idp.example", "sub": "e1", "email": "eve@corp.example"})
    refused(ovl("users", "passwd", "eve@corp.example", input=(PW + "\n").encode()), 2,
            "single sign-on")
    rows = json.loads(ovl("users", "list", "--json", check=0).out)
    assert rows[0]["sso"] is True


def test_rm_revokes_tokens_ends_logins_and_keeps_the_folder_aside(ovl, home):
    add(ovl, "flo")
    token = ovl("users", "token", "flo", check=0).out.strip()
    cookie = auth.login_create("flo")
    (home / "users" / "flo" / "memory.md").write_text("notes\n")
    proc = ovl("users", "rm", "flo", check=0)
    assert proc.out.startswith("removed flo: 1 token revoked, 1 login ended; its folder is kept as ")
    assert "sign-in is off" in proc.err
    assert auth.bearer(token) is None and auth.login_lookup(cookie) is None
    kept = [d for d in os.listdir(home / "users") if d.startswith(".removed-flo-")]
    assert len(kept) == 1 and (home / "users" / kept[0] / "memory.md").exists()
    assert json.loads(ovl("users", "list", "--json", check=0).out) == []


def test_two_adds_at_once_both_land(ovl, home):
    """users.json is a read-modify-write under a lock: concurrent adds lose nobody."""
    env = ovl.env()
    procs = [subprocess.Popen([sys.executable, "-m", "overlord", "users", "add", name, "--role",
                               "operator"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, cwd=REPO)
             for name in ("gil", "hob", "ike")]
    for p in procs:
        p.communicate((PW + "\n").encode(), timeout=120)
        assert p.returncode == 0
    assert [r["name"] for r in auth.listing()] == ["gil", "hob", "ike"]


def _pty_run(ovl, argv, answers, timeout=60):
    """Run overlord on a pseudo-terminal (its controlling terminal: getpass reads there),
    answering each prompt (a line ending in ':' written since the last answer) in turn;
    (exit code, everything it wrote). Killed at the timeout."""
    pid, fd = pty.fork()
    if pid == 0:                                       # the child: exec at once
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "overlord", *argv], ovl.env())
    out, since, pending = b"", 0, list(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                chunk = os.read(fd, 4096)
            except OSError:                            # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if pending and out[since:].strip().endswith(b":"):
                os.write(fd, pending.pop(0).encode() + b"\n")
                since = len(out)
    finally:
        if time.monotonic() >= deadline:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


def test_at_a_terminal_the_password_is_asked_twice_without_echo(ovl, home):
    code, out = _pty_run(ovl, ["users", "add", "ivo", "--role", "viewer"],
                         ["first password", "other password"])
    assert code == 2 and "the two passwords differ" in out and "first password" not in out
    assert not (home / "users.json").exists()
    code, out = _pty_run(ovl, ["users", "add", "ivo", "--role", "viewer"], [PW, PW])
    assert code == 0 and "added ivo (viewer)" in out and PW not in out, out
    assert out.count("password for ivo:") == 1 and "the same again:" in out
    assert auth.check_password("ivo", PW, None).name == "ivo"


def test_every_action_has_helpful_help(ovl):
    top = ovl("users", "--help", check=0).out
    for action in ("add", "list", "passwd", "role", "rm", "token", "tokens", "revoke"):
        assert action in top
        text = ovl("users", action, "--help", check=0).out
        assert len(text) > 200, action
    for action in ("add", "passwd"):
        text = " ".join(ovl("users", action, "--help", check=0).out.split())
        assert "stdin" in text and "never from the command line" in text
    assert "--json" in ovl("users", "list", "--help", check=0).out
    assert "--json" in ovl("users", "tokens", "--help", check=0).out
    assert "printed once" in " ".join(ovl("users", "token", "--help", check=0).out.split())
