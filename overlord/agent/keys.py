"""Provider keys: OVERLORD_HOME/keys.json (mode 0600), with environment variables winning.

An account (issue 15) has its own OVERLORD_HOME/users/<owner>/keys.json, held to the same
checks; for an owner the order is: the account's own key, then the environment, then the
machine's keys.json (the shared key an admin provisions with `overlord keys set`). Without an
owner (the CLI) it is as it always was: the environment, then the machine's file.

A key file that group or others may read, or that another user owns, is refused rather than
used: a key that leaked once is not a key. Writes are atomic (temp file created 0600, fsync,
rename) under a lock, so a concurrent `keys set` never loses the other's key.

Secrets from a vault (trust/vault.py, docs/VAULT.md): a value in the machine's keys.json or in
the environment may be a reference, `secret://NAME`, resolved at the moment of use (the source
stays "store" / "env"). With no key in any file or the environment and a resolver configured,
the vault is asked for `providers/<provider>` (source "vault": the machine's shared key, like
"store"). An account's own keys.json may not hold a reference: the vault answers for the
machine, and an account naming `secret://providers/anthropic` as its "own" key would carry the
machine's key to an endpoint of its choosing -- refused at `set` and at use.
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
OPTIONAL = ("openai-compatible",)   # a keyless endpoint is fine: a failing vault lookup is no key
VAULT_PREFIX = "providers/"         # the convention: providers/<provider>


def path(owner=None):
    """The machine's key file, or (owner) the account's own: users/<owner>/keys.json. A name
    that is not an account name is refused (trust.userdirs.user_dir): none leads outside users/."""
    if owner is None:
        return os.path.join(store.home(), "keys.json")
    from overlord.trust.userdirs import user_dir
    return os.path.join(user_dir(owner), "keys.json")


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


def _load(owner=None):
    p = path(owner)
    dfd = None
    if owner is not None:
        # users/<owner>/ itself is never followed through a link (nor users/): opened
        # O_DIRECTORY|O_NOFOLLOW and checked ours, the file opened at it
        from overlord.trust.userdirs import open_user_dir
        dfd = open_user_dir(owner)
        if dfd is None:
            return {}
    try:
        fd = os.open(os.path.basename(p) if dfd is not None else p,
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise OverlordError(f"cannot read the key file {p}: {e.strerror}") from None
    finally:
        if dfd is not None:
            os.close(dfd)
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


def _stored(data, provider):
    value = data.get(provider)
    return value if isinstance(value, str) and value else None


def get(provider, owner=None):
    """The key to use for a provider, or None: the owner's own key (when an owner is named),
    else the environment, else the machine's key file, else the vault's providers/<provider>."""
    return resolve(provider, owner)[0]


def _vault():
    from overlord.trust import vault
    return vault


def _use(value, provider, where):
    """A stored or environment value at use: a secret:// reference resolved (a malformed one
    refused), anything else as it is."""
    vault = _vault()
    if not vault.looks_like_ref(value):
        return value
    return vault.resolve(value, f"provider key {provider} ({where})")


def _no_ref_own(value, provider, owner):
    if _vault().looks_like_ref(value):
        raise OverlordError(f"the {provider} key of account {owner} is a secret:// reference: "
                            f"an account's own key is the key itself (the vault answers for "
                            f"the machine; an admin stores a reference with `overlord keys set`)")


def resolve(provider, owner=None):
    """(key, source) as get() resolves it: source "own" (the owner's keys.json), "env",
    "store" (the machine's keys.json), "vault" (providers/<provider> from the resolver, when
    no file or variable has a key) or None (no key). "env", "store" and "vault" are the
    machine's shared key: for an owner it goes only to the provider's own endpoint
    (ops.agent.endpoint). A secret:// value is resolved here, at use; a failing resolver is
    an OverlordError naming the reference."""
    _check(provider)
    if owner is not None:
        own = _stored(_load(owner), provider)
        if own:
            _no_ref_own(own, provider, owner)
            return own, "own"
    env = os.environ.get(ENV[provider])
    if env:
        return _use(env, provider, ENV[provider]), "env"
    stored = _stored(_load(), provider)
    if stored:
        return _use(stored, provider, "keys.json"), "store"
    name = VAULT_PREFIX + provider
    try:
        key = _vault().lookup(name, f"provider key {provider}")
    except OverlordError as e:
        if provider in OPTIONAL:
            return None, None
        raise OverlordError(f"{e} (no {provider} key in keys.json or {ENV[provider]}; the "
                            f"vault was asked for {name})") from None
    return (key, "vault") if key else (None, None)


def vault_ready():
    """True when a resolver is configured (a damaged secrets.json counts as none here: a
    listing is never the place that fails)."""
    try:
        return _vault().configured()
    except OverlordError:
        return False


def set(provider, key, owner=None):  # noqa: A001 -- the module's verb, as in `overlord keys set`
    """Store a key (None or "" removes it): in the machine's file, or (owner) the account's."""
    _check(provider)
    key = (key or "").strip()
    if any(c.isspace() for c in key):
        raise UsageError("a key cannot contain whitespace")
    vault = _vault()
    if vault.looks_like_ref(key):
        if owner is not None:
            raise UsageError("an account's own key cannot be a secret:// reference (the vault "
                             "answers for the machine: an admin sets one with `overlord keys set`)")
        if not vault.is_ref(key):
            raise UsageError("not a valid secret reference: secret://NAME, the name letters, "
                             "digits and _ . / -, no '..' segment, no leading '/' or '-'")
    target = path(owner)              # a hostile owner is refused before anything is made
    if owner is not None:
        from overlord.trust.userdirs import ensure_user_dir
        ensure_user_dir(owner)
    with locked(target):
        data = _load(owner)
        if key:
            data[provider] = key
        else:
            data.pop(provider, None)
        write_private(target, data)


def listing(owner=None):
    """{provider: "own" | "env" | "store" | "vault" | None} -- where each key comes from (as
    get() resolves it), never the key, and without running the resolver: "vault" says the
    resolver would be asked for providers/<provider> (a stored reference is still "store",
    an environment one "env"). "own" only for an owner."""
    own = _load(owner) if owner is not None else {}
    stored = _load()
    vault = None
    out = {}
    for p, var in ENV.items():
        if _stored(own, p):
            out[p] = "own"
        elif os.environ.get(var):
            out[p] = "env"
        elif _stored(stored, p):
            out[p] = "store"
        else:
            if vault is None:
                vault = vault_ready()
            out[p] = "vault" if vault else None
    return out
