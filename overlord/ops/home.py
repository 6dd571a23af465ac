"""OVERLORD_HOME for a face: where it is, made on demand, and a private file written there.

A face keeps its own state beside the sessions (the web face's settings and launch token, the
daemon's socket); it reaches the state directory through these, never through the engine.
"""
from overlord.txn import store


def home():
    """OVERLORD_HOME's path (OVERLORD_HOME, else ~/.overlord; not made)."""
    return store.home()


def ensure_home():
    """OVERLORD_HOME, made mode 0700 if missing; returns its path."""
    return store.ensure_home()


def write_private_json(path, data, indent=None):
    """Write JSON to `path` atomically (temp file, fsync, rename), mode 0600 from the moment
    the file exists, whatever the umask: for a file that may hold a credential."""
    store.write_json_atomic(path, data, 0o600, indent=indent)


USER_DIRS = ("ensure_user_dir", "open_user_dir", "user_dir", "valid_user")


def __getattr__(name):
    """Accounts' folders, from the domain layer (overlord/trust/userdirs.py), loaded on first
    use: a hook's `overlord exec` never pays for them."""
    if name in USER_DIRS:
        from overlord.trust import userdirs
        return getattr(userdirs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
