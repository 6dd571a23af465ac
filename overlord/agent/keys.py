"""Provider keys: OVERLORD_HOME/keys.json (mode 0600), with environment variables winning.

A key file that group or others may read, or that another user owns, is refused rather than
used: a key that leaked once is not a key. Writes are atomic (temp file created 0600, fsync,
rename) under a lock, so a concurrent `keys set` never loses the other's key.
"""
import contextlib
import fcntl
import json
import os
import stat

from overlord.errors import OverlordError, UsageError
from overlord.txn import store

ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY",
       "azure": "AZURE_OPENAI_API_KEY", "openai-compatible": "OPENAI_COMPAT_API_KEY",
       "gemini": "GEMINI_API_KEY"}


def path():
    return os.path.join(store.home(), "keys.json")


@contextlib.contextmanager
def locked(target):
    """An exclusive lock beside `target` for a read-modify-write."""
    store.ensure_home()
    fd = os.open(target + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_private(target, data):
    """Write JSON atomically into a file that is 0600 from the moment it exists."""
    store.write_json_atomic(target, data, 0o600, indent=1, sync_dir=True)


def _load():
    p = path()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise OverlordError(f"cannot read the key file {p}: {e.strerror}") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid():
            raise OverlordError(f"refusing the key file {p}: it belongs to uid {st.st_uid}, not you")
        if st.st_mode & 0o077:
            raise OverlordError(f"refusing the key file {p}: mode {stat.S_IMODE(st.st_mode):04o} "
                                f"lets others read it; run: chmod 600 {p}")
        try:
            data = json.load(f)
        except ValueError:
            raise OverlordError(f"the key file {p} is damaged (not JSON)") from None
    if not isinstance(data, dict):
        raise OverlordError(f"the key file {p} is damaged (not an object)")
    return data


def _check(provider):
    if provider not in ENV:
        raise UsageError(f"no key for provider {provider!r} (one of: {', '.join(ENV)})")


def get(provider):
    """The key to use for a provider (environment first), or None."""
    _check(provider)
    env = os.environ.get(ENV[provider])
    if env:
        return env
    value = _load().get(provider)
    return value if isinstance(value, str) and value else None


def set(provider, key):  # noqa: A001 -- the module's verb, as in `overlord keys set`
    """Store a key (None or "" removes it)."""
    _check(provider)
    key = (key or "").strip()
    if any(c.isspace() for c in key):
        raise UsageError("a key cannot contain whitespace")
    with locked(path()):
        data = _load()
        if key:
            data[provider] = key
        else:
            data.pop(provider, None)
        write_private(path(), data)


def listing():
    """{provider: "env" | "store" | None} -- where each key comes from, never the key."""
    stored = _load()
    return {p: "env" if os.environ.get(var) else ("store" if stored.get(p) else None)
            for p, var in ENV.items()}
