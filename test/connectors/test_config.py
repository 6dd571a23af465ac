"""config: OVERLORD_HOME/mcp.json -- modes and owner, masking, every bad input, atomic writes."""
import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import REPO
from overlord.agent.connectors import config
from overlord.errors import OverlordError, UsageError

TOKEN = "ghp_0123456789abcdefSECRET"
BEARER = "Bearer sk-verysecretvalue-123"


@pytest.fixture
def mcp(home):
    return home / "mcp.json"


def write(mcp, data, mode=0o600):
    mcp.write_text(data if isinstance(data, str) else json.dumps(data))
    os.chmod(mcp, mode)
    return mcp.read_bytes()


def stdio(name="gh", **kw):
    kw.setdefault("command", "npx")
    return config.Server(name, **kw)


# -- the file ----------------------------------------------------------------------------------

def test_no_file_is_no_servers_and_approval_ask(mcp):
    cfg = config.load()
    assert (cfg.approval, cfg.servers) == ("ask", {}) and not mcp.exists()


def test_add_writes_a_0600_file_that_loads_back(mcp):
    config.add(stdio(args=["-y", "@x/server"], env={"GITHUB_TOKEN": TOKEN}))
    config.add(config.Server("docs", url="https://host.example/mcp",
                             headers={"Authorization": BEARER}))
    assert stat.S_IMODE(mcp.stat().st_mode) == 0o600
    assert stat.S_IMODE(os.stat(str(mcp) + ".lock").st_mode) == 0o600
    assert json.loads(mcp.read_text()) == {
        "approval": "ask",
        "servers": {"docs": {"url": "https://host.example/mcp", "headers": {"Authorization": BEARER}},
                    "gh": {"command": "npx", "args": ["-y", "@x/server"], "env": {"GITHUB_TOKEN": TOKEN}}}}
    cfg = config.load()
    gh, docs = cfg.get("gh"), cfg.get("docs")
    assert (gh.transport, gh.command, gh.args, gh.env) == ("stdio", "npx", ("-y", "@x/server"),
                                                           {"GITHUB_TOKEN": TOKEN})
    assert (docs.transport, docs.url, docs.headers) == ("http", "https://host.example/mcp",
                                                        {"Authorization": BEARER})
    assert gh.url is None and docs.command is None


def test_a_file_others_may_read_is_refused(mcp):
    write(mcp, {"servers": {}}, 0o640)
    with pytest.raises(OverlordError, match=r"mode 0640 lets others read it; run: chmod 600"):
        config.load()


def test_a_file_another_user_owns_is_refused(mcp, monkeypatch):
    write(mcp, {"servers": {}})
    monkeypatch.setattr(os, "geteuid", lambda: mcp.stat().st_uid + 1)
    with pytest.raises(OverlordError, match=r"belongs to uid \d+, not you"):
        config.load()


def test_a_symlink_and_a_fifo_are_refused(mcp, tmp_path):
    real = tmp_path / "elsewhere.json"
    write(real, {"servers": {}})
    mcp.symlink_to(real)
    with pytest.raises(OverlordError, match="cannot read mcp.json"):
        config.load()
    mcp.unlink()
    os.mkfifo(mcp, 0o600)                      # no writer: a blocking open would hang here
    with pytest.raises(OverlordError, match="not a regular file"):
        config.load()


@pytest.mark.parametrize("content, what", [
    ("{not json", "not JSON"),
    ("[]", "not an object"),
    ('{"approval": "ask", "extra": 1}', "unknown key 'extra'"),
    ('{"approval": "sometimes"}', "approval is 'sometimes'"),
    ('{"servers": []}', "servers must be an object"),
    ('{"servers": {"gh": "npx"}}', "servers.gh: must be an object"),
    ('{"servers": {"gh": {"command": "npx", "cwd": "/"}}}', "servers.gh.cwd: unknown key"),
    ('{"servers": {"gh": {"command": ["npx"]}}}', "servers.gh.command: must be a string"),
    ('{"servers": {"gh": {"command": "npx", "args": "-y"}}}', "servers.gh.args: must be a list"),
    ('{"servers": {"gh": {"command": "npx", "args": [1]}}}', "servers.gh.args: argument 1 must be a string"),
    ('{"servers": {"gh": {"command": "npx", "env": ["A=1"]}}}', "servers.gh.env: must be an object"),
    ('{"servers": {"gh": {"command": "npx", "env": {"A": 1}}}}', "servers.gh.env: the value of A must be a string"),
    ('{"servers": {"gh": {"command": "npx", "env": {"A=B": "x"}}}}', "servers.gh.env: 'A=B' is not an environment"),
    ('{"servers": {"gh": {"command": "npx", "url": "https://h/"}}}', "servers.gh.command: both a command and a url"),
    ('{"servers": {"gh": {}}}', "servers.gh.command: neither a command"),
    ('{"servers": {"gh": {"command": ""}}}', "servers.gh.command: the command is empty"),
    ('{"servers": {"gh": {"command": "npx", "headers": {"A": "b"}}}}', "servers.gh.headers: headers are for a url"),
    ('{"servers": {"gh": {"url": "https://h/", "env": {"A": "b"}}}}', "servers.gh.env: args and env are for a command"),
    ('{"servers": {"gh": {"url": "ftp://h/"}}}', "servers.gh.url: 'ftp://h/' is not an http"),
    ('{"servers": {"gh": {"url": "https:///path"}}}', "is not an http:// or https:// URL with a host"),
    ('{"servers": {"gh": {"url": "http://h:99999/"}}}', "servers.gh.url: 'http://h:99999/' is not a URL"),
    ('{"servers": {"gh": {"url": "http://h/ x"}}}', "contains whitespace"),
    ('{"servers": {"gh": {"url": "http://h/", "headers": {"Bad Name": "x"}}}}', "'Bad Name' is not a header name"),
    ('{"servers": {"gh": {"url": "http://h/", "headers": {"X": "a\\r\\nY: b"}}}}', "line break"),
    ('{"servers": {"gh_x": {"command": "npx"}}}', "servers: 'gh_x' is not a server name"),
    ('{"servers": {"-gh": {"command": "npx"}}}', "'-gh' is not a server name"),
    ('{"servers": {"%s": {"command": "npx"}}}' % ("g" * 33), "is not a server name"),
    (b'{"servers": {"\xff": 1}}', "not UTF-8"),
])
def test_a_damaged_file_is_one_line_naming_the_file_and_the_key(mcp, content, what):
    if isinstance(content, bytes):
        mcp.write_bytes(content)
        os.chmod(mcp, 0o600)
    else:
        write(mcp, content)
    before = mcp.read_bytes()
    with pytest.raises(OverlordError) as e:
        config.load()
    msg = str(e.value)
    assert msg.startswith(f"mcp.json {mcp}: ") and what in msg and "\n" not in msg, msg
    assert not isinstance(e.value, UsageError)          # the file is damaged, not the request
    with pytest.raises(OverlordError):                  # and nothing is written over it
        config.add(stdio("other"))
    assert mcp.read_bytes() == before


def test_an_error_about_a_secret_never_shows_it(mcp):
    write(mcp, {"servers": {"gh": {"url": "https://h/", "headers": {"Authorization": BEARER + "\n"}}}})
    with pytest.raises(OverlordError) as e:
        config.load()
    assert "sk-verysecret" not in str(e.value) and "Authorization" in str(e.value)


# -- servers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, field", [
    ({"name": "a_b", "command": "x"}, "name"),
    ({"name": "", "command": "x"}, "name"),
    ({"name": "a", "command": "x", "url": "https://h/"}, "command"),
    ({"name": "a"}, "command"),
    ({"name": "a", "url": "mailto:x@y"}, "url"),
    ({"name": "a", "url": "https://h/", "headers": {"K:": "v"}}, "headers"),
    ({"name": "a", "command": "x", "env": {"": "v"}}, "env"),
    ({"name": "a", "command": "x", "args": ["a\0b"]}, "args"),
])
def test_a_bad_server_is_invalid_naming_its_field(kw, field):
    with pytest.raises(config.Invalid) as e:
        config.Server(**kw)
    assert e.value.field == field and isinstance(e.value, UsageError)


def test_masked_never_shows_a_value():
    s = stdio(args=["-y"], env={"GITHUB_TOKEN": TOKEN, "SHORT": "hunter2", "EMPTY": ""})
    m = s.masked()
    assert m == {"name": "gh", "transport": "stdio", "command": "npx", "args": ["-y"],
                 "env": {"GITHUB_TOKEN": "ghp…(masked)", "SHORT": "••••", "EMPTY": "••••"}}
    h = config.Server("docs", url="https://user:pa55word@host.example/mcp?key=abc123&flag",
                      headers={"Authorization": BEARER, "X-Key": "shortkey"}).masked()
    text = json.dumps(h, ensure_ascii=False)
    for secret in ("sk-verysecret", "shortkey", "pa55word", "abc123"):
        assert secret not in text
    assert h["headers"] == {"Authorization": "Bea…(masked)", "X-Key": "••••"}
    assert h["url"] == "https://user:••••@host.example/mcp?key=••••&flag"


def test_add_refuses_a_name_in_use_and_replace_replaces(mcp):
    config.add(stdio())
    before = mcp.read_bytes()
    with pytest.raises(UsageError, match=r"already configured; run `overlord mcp rm gh` first"):
        config.add(stdio(command="other"))
    assert mcp.read_bytes() == before
    config.add(stdio(command="other"), replace=True)
    assert config.load().get("gh").command == "other"


def test_remove_and_get_name_the_known_ones(mcp):
    with pytest.raises(UsageError, match="none is configured"):
        config.remove("gh")
    config.add(stdio("gh"))
    config.add(stdio("fs"))
    with pytest.raises(UsageError, match=r"no connector named 'nope' .*configured: fs, gh"):
        config.load().get("nope")
    before = mcp.read_bytes()
    with pytest.raises(UsageError, match="configured: fs, gh"):
        config.remove("nope")
    assert mcp.read_bytes() == before
    assert config.remove("gh").name == "gh"
    assert list(config.load().servers) == ["fs"]


def test_set_approval(mcp):
    assert config.set_approval("auto") == "ask"
    assert config.load().approval == "auto"
    assert config.set_approval("readonly") == "auto"
    with pytest.raises(UsageError, match="one of ask, auto, readonly"):
        config.set_approval("never")
    assert config.load().approval == "readonly"
    assert stat.S_IMODE(mcp.stat().st_mode) == 0o600


ADDER = """
import sys
from overlord.agent.connectors import config
who, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    config.add(config.Server(f"{who}{i}", command="srv", env={"TOKEN": "t" * 20}))
"""
READER = """
import os, sys
from overlord.agent.connectors import config
seen = 0
while not os.path.exists(sys.argv[1]):
    seen = max(seen, len(config.load().servers))     # raises if it ever reads a torn file
print(seen)
"""


def test_two_concurrent_adders_lose_nothing_and_a_reader_never_sees_a_torn_file(mcp, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    done = tmp_path / "done"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(done)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    adders = [subprocess.Popen([sys.executable, "-c", ADDER, who, "25"], env=env,
                               stderr=subprocess.PIPE) for who in ("a", "b")]
    for p in adders:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    done.touch()
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    names = set(config.load().servers)
    assert names == {f"{w}{i}" for w in "ab" for i in range(25)}
    assert stat.S_IMODE(mcp.stat().st_mode) == 0o600
    assert [p for p in os.listdir(mcp.parent) if ".tmp-" in p] == []
