"""Provider keys: 0600 from creation, refused when others may read them, environment first."""
import os
import stat

import pytest

from overlord.agent import keys
from overlord.errors import OverlordError, UsageError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLORD_HOME", str(tmp_path / "home"))
    for var in keys.ENV.values():
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home"


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_set_get_listing(home):
    old = os.umask(0)                       # even a careless umask gives a private file
    try:
        keys.set("anthropic", "  sk-ant-123\n")
    finally:
        os.umask(old)
    assert mode(keys.path()) == 0o600
    assert keys.get("anthropic") == "sk-ant-123"
    assert keys.get("openai") is None
    keys.set("gemini", "g-1")
    assert keys.listing() == {"anthropic": "store", "openai": None, "azure": None,
                              "openai-compatible": None, "gemini": "store"}
    assert "sk-ant-123" not in repr(keys.listing())
    keys.set("gemini", None)
    assert keys.get("gemini") is None and keys.get("anthropic") == "sk-ant-123"
    assert not [n for n in os.listdir(home) if ".tmp-" in n]


def test_environment_wins(monkeypatch):
    keys.set("openai", "from-store")
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert keys.get("openai") == "from-env"
    assert keys.listing()["openai"] == "env"
    monkeypatch.setenv("OPENAI_COMPAT_API_KEY", "c")
    assert keys.get("openai-compatible") == "c"


def test_readable_key_file_is_refused():
    keys.set("anthropic", "sk-ant-123")
    os.chmod(keys.path(), 0o644)
    with pytest.raises(OverlordError) as e:
        keys.get("anthropic")
    msg = str(e.value)
    assert "0644" in msg and "chmod 600" in msg and "sk-ant-123" not in msg and "\n" not in msg
    with pytest.raises(OverlordError):
        keys.listing()


def test_stale_temp_file_with_a_wide_mode_does_not_widen_the_key_file(home):
    keys.set("anthropic", "a")
    stale = f"{keys.path()}.tmp-{os.getpid()}"
    fd = os.open(stale, os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    os.chmod(stale, 0o644)
    keys.set("openai", "b")
    assert mode(keys.path()) == 0o600 and keys.get("openai") == "b"


def test_usage_errors():
    with pytest.raises(UsageError):
        keys.set("scripted", "x")
    with pytest.raises(UsageError):
        keys.get("nope")
    with pytest.raises(UsageError):
        keys.set("openai", "two words")


def test_damaged_file_is_a_clean_error():
    keys.set("openai", "x")
    with open(keys.path(), "w") as f:
        f.write("{not json")
    with pytest.raises(OverlordError, match="damaged"):
        keys.get("openai")
