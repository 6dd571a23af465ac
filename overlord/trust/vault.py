"""Secrets from a vault: `secret://NAME` references resolved at the moment of use.

Anywhere OVERLORD stores a secret (a provider key, a connector's env or header value, the SSO
client secret, a webhook's signing secret) the stored value may be a reference,
`secret://NAME`. resolve(value, what) hands back any other value unchanged (a reference inside
a longer string, "Bearer secret://x", is NOT one: whole values only) and a reference's secret:
the output of the resolver command configured in OVERLORD_HOME/secrets.json.

secrets.json (mode 0600, this module is its one writer): {"command": [argv...], "ttl": 300}.
The command is parsed with shlex once, at set-command time, and run WITHOUT a shell: every
`{name}` inside an argument is replaced by the name, so the name is (part of) exactly one
argument and is never re-split or interpreted. Names match [A-Za-z0-9_./-]+, at most 256
characters, no `..` segment, no leading `/` and no leading `-` (a name is never an option of
the resolver). The run: stdin /dev/null, stdout and stderr captured (each capped), env = this
process's environment, 10 s timeout (the whole process group is killed past it). stdout is the
secret with one trailing newline removed; empty output, a NUL byte, output over 64 KiB or not
UTF-8 are refused. A failure is a VaultError (an OverlordError) naming the reference:
`secret://NAME: the resolver exited 3 (first line of its stderr, escaped, capped)`; its .short
form leaves stderr out, for messages that may be kept (connectors, SSO).

A resolved value is kept in this process's memory for `ttl` seconds (default 300; 0 = never
kept), keyed by the name AND the command (a new command forgets old values); failures are
never kept. The audit chain gets `secret.resolve` {name, what, ok, reason?} once per actual
run of the resolver -- never the value, never stderr, and nothing on a cache hit (the chain
is not flooded by a busy agent). `secret.config` {op, program, args, ttl} records a
set-command or off: the program's base name and the argument count only, since an argument
may itself carry a token. See docs/VAULT.md.
"""
import os
import re
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import threading
import time

from overlord.errors import OverlordError, UsageError
from overlord.txn import store

CONFIG_NAME = "secrets.json"
PREFIX = "secret://"
NAME_RE = re.compile(r"[A-Za-z0-9_./-]+\Z")
MAX_NAME = 256
PLACEHOLDER = "{name}"
DEFAULT_TTL = 300
MAX_TTL = 7 * 24 * 3600
TIMEOUT = 10.0
MAX_OUTPUT = 64 * 1024
MAX_STDERR = 4096
MAX_COMMAND = 8192          # the whole command line as typed

class VaultError(OverlordError):
    """A reference that did not resolve. str(): `secret://NAME: why (stderr's first line)`;
    .short: the same without anything the resolver printed (for a message that may be kept:
    an audit line, a transcript); .name, .reason (a fixed word: exit 3, timeout, empty...)."""

    def __init__(self, message, name, reason, short=None):
        super().__init__(message)
        self.name, self.reason, self.short = name, reason, short or message


_cache = {}                 # (name, command tuple) -> (value, expires at on _clock)
_cache_lock = threading.Lock()
_name_locks = {}            # name -> Lock: one run at a time per name in this process
_clock = time.monotonic     # the cache's clock (a test moves it instead of sleeping)


def path():
    return os.path.join(store.home(), CONFIG_NAME)


def _show(text, cap=120):
    """Text from outside (a name, a stderr line) made printable and short for a message."""
    from overlord.text import escape_text
    text = escape_text(str(text))
    return text if len(text) <= cap else text[:cap] + "..."


def valid_name(name):
    """True when `name` may be looked up: [A-Za-z0-9_./-]+, <= 256 chars, no `..` segment,
    no leading `/` or `-`."""
    return (isinstance(name, str) and 0 < len(name) <= MAX_NAME and bool(NAME_RE.match(name))
            and not name.startswith(("/", "-")) and ".." not in name.split("/"))


def check_name(name):
    """The name, or UsageError saying why it cannot be a secret name."""
    if not valid_name(name):
        raise UsageError(f"not a secret name: {_show(name)!r} (letters, digits and _ . / -, "
                         f"at most {MAX_NAME}, no '..' segment, no leading '/' or '-')")
    return name


def ref_name(value):
    """NAME when value is exactly `secret://NAME` with a valid NAME, else None."""
    if isinstance(value, str) and value.startswith(PREFIX):
        name = value[len(PREFIX):]
        if valid_name(name):
            return name
    return None


def is_ref(value):
    """True when the whole value is a reference `secret://NAME` (NAME valid)."""
    return ref_name(value) is not None


def looks_like_ref(value):
    """True for a value that starts with secret:// -- a reference, or a malformed one that
    resolve() refuses rather than passing it on as if it were the secret."""
    return isinstance(value, str) and value.startswith(PREFIX)


# -- the configuration --------------------------------------------------------------------------

def load():
    """The configuration {"command": [...], "ttl": int}, or None when no resolver is set.
    A file group/other may read, or another user's, is refused (it names the resolver)."""
    p = path()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OverlordError(f"cannot read the resolver configuration {p}: {e.strerror}") from None
    import json
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OverlordError(f"refusing {p}: not a regular file")
        if st.st_uid != os.geteuid():
            raise OverlordError(f"refusing {p}: it belongs to uid {st.st_uid}, not you")
        if st.st_mode & 0o077:
            raise OverlordError(f"refusing {p}: mode {stat.S_IMODE(st.st_mode):04o} lets others "
                                f"read it; run: chmod 600 {p}")
        try:
            data = json.load(f)
        except ValueError:
            raise OverlordError(f"the resolver configuration {p} is damaged (not JSON)") from None
    command = data.get("command") if isinstance(data, dict) else None
    ttl = data.get("ttl", DEFAULT_TTL) if isinstance(data, dict) else None
    if (not isinstance(command, list) or not command
            or not all(isinstance(a, str) and a for a in command)
            or not any(PLACEHOLDER in a for a in command)
            or not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 <= ttl <= MAX_TTL):
        raise OverlordError(f"the resolver configuration {p} is damaged "
                            f"(want {{\"command\": [argv with {PLACEHOLDER}], \"ttl\": seconds}})")
    return {"command": list(command), "ttl": ttl}


def configured():
    """True when a resolver command is set (a damaged file raises)."""
    return load() is not None


def _program_error(program):
    """None when `program` can be run, else why not."""
    if "/" in program:
        if not os.path.isfile(program):
            return f"the program {_show(program)} does not exist"
        if not os.access(program, os.X_OK):
            return f"the program {_show(program)} is not executable"
        return None
    if shutil.which(program) is None:
        return f"the program {_show(program)} is not found on PATH"
    return None


def parse_command(cmd):
    """shlex-split `cmd` and check it: not empty, a {name} somewhere, a program we can run.
    A program given with a '/' is made absolute (it is run later from another directory)."""
    if not isinstance(cmd, str) or not cmd.strip():
        raise UsageError("the resolver command is empty (example: 'pass show {name}')")
    if len(cmd) > MAX_COMMAND or "\x00" in cmd:
        raise UsageError("the resolver command is too long or holds a NUL byte")
    try:
        argv = shlex.split(cmd)
    except ValueError as e:
        raise UsageError(f"cannot parse the resolver command: {e}") from None
    if not argv:
        raise UsageError("the resolver command is empty (example: 'pass show {name}')")
    if not any(PLACEHOLDER in a for a in argv):
        raise UsageError(f"the resolver command has no {PLACEHOLDER} (where the secret's name "
                         f"goes, e.g. 'pass show {PLACEHOLDER}')")
    if PLACEHOLDER in argv[0]:
        raise UsageError(f"the resolver's program cannot be {PLACEHOLDER}: name the program")
    if any(not a for a in argv):
        raise UsageError("the resolver command has an empty argument")
    why = _program_error(argv[0])
    if why:
        raise OverlordError(f"refusing the resolver command: {why}")
    if "/" in argv[0]:
        argv[0] = os.path.abspath(argv[0])
    return argv


def _ttl(ttl):
    if ttl is None:
        return DEFAULT_TTL
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        try:
            ttl = int(str(ttl), 10)
        except ValueError:
            raise UsageError(f"--ttl wants whole seconds, not {_show(ttl)!r}") from None
    if not 0 <= ttl <= MAX_TTL:
        raise UsageError(f"--ttl must be between 0 and {MAX_TTL} seconds")
    return ttl


def set_command(cmd, ttl=None):
    """Configure the resolver (validated before anything is written); audited as
    secret.config {op: "set-command", program, args, ttl}. Returns show()."""
    ttl = _ttl(ttl)
    argv = parse_command(cmd)
    store.ensure_home()                     # (a damaged or too-open file is simply replaced)
    store.write_json_atomic(path(), {"command": argv, "ttl": ttl}, 0o600, indent=1,
                            sync_dir=True)
    forget()
    from overlord.trust import audit
    audit.append("secret.config", op="set-command", program=os.path.basename(argv[0]),
                 args=len(argv) - 1, ttl=ttl)
    return show()


def off():
    """Remove the resolver; True when one was set. Audited as secret.config {op: "off"}."""
    try:
        had = load() is not None
    except OverlordError:                   # a damaged or too-open file: removing it is the fix
        had = True
    try:
        os.unlink(path())
    except FileNotFoundError:
        had = False
    forget()
    if had:
        from overlord.trust import audit
        audit.append("secret.config", op="off")
        store.fsync_dir(store.home())
    return had


def show():
    """{"configured", "path", "command" (argv as stored) | None, "program", "ttl"}. The
    command is shown to whoever owns this OVERLORD_HOME (it is theirs and 0600); faces that
    serve others should show only `program`."""
    cfg = load()
    if cfg is None:
        return {"configured": False, "path": path(), "command": None, "program": None,
                "ttl": None}
    return {"configured": True, "path": path(), "command": cfg["command"],
            "program": os.path.basename(cfg["command"][0]), "ttl": cfg["ttl"]}


def forget():
    """Drop every cached value of this process."""
    with _cache_lock:
        _cache.clear()


# -- resolving ----------------------------------------------------------------------------------

def resolve(value, what):
    """`value` unchanged unless it is a whole reference `secret://NAME`; a reference's secret
    (cached for ttl). A value that starts with secret:// but is not a valid reference is
    refused (never passed on as the secret). `what` says where it is used ("provider key
    anthropic", "connector X env TOKEN"), for the audit line and messages."""
    if not looks_like_ref(value):
        return value
    name = value[len(PREFIX):]
    if not valid_name(name):
        raise OverlordError(f"{_show(value)}: not a valid secret reference (names: letters, "
                            f"digits and _ . / -, no '..' segment, no leading '/' or '-')")
    cfg = load()
    if cfg is None:
        raise OverlordError(f"secret://{name}: no resolver is configured; run "
                            f"`overlord secrets set-command 'CMD {PLACEHOLDER}'` (docs/VAULT.md)")
    return _fetch(name, what, cfg)


def lookup(name, what):
    """The secret `name` when a resolver is configured, else None (the `providers/<p>`
    convention asks this). A failing resolver raises as resolve() does."""
    check_name(name)
    cfg = load()
    if cfg is None:
        return None
    return _fetch(name, what, cfg)


def fetch(name, what, fresh=False):
    """Run the resolver for `name` (fresh: ignore and replace the cached value). Raises when
    no resolver is configured."""
    check_name(name)
    cfg = load()
    if cfg is None:
        raise OverlordError(f"no resolver is configured; run `overlord secrets set-command "
                            f"'CMD {PLACEHOLDER}'` (docs/VAULT.md)")
    return _fetch(name, what, cfg, fresh=fresh)


def _cached(key):
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            if _clock() < hit[1]:
                return hit[0]
            del _cache[key]
    return None


def _fetch(name, what, cfg, fresh=False):
    key = (name, tuple(cfg["command"]))
    ttl = cfg["ttl"]
    if ttl and not fresh:
        hit = _cached(key)
        if hit is not None:
            return hit
    with _cache_lock:
        lock = _name_locks.setdefault(name, threading.Lock())
    with lock:
        if ttl and not fresh:
            hit = _cached(key)          # another thread may have just run it
            if hit is not None:
                return hit
        what = _show(what or "", 200)
        from overlord.trust import audit
        try:
            value = _run(name, cfg["command"])
        except _Failed as e:
            audit.append("secret.resolve", name=name, what=what, ok=False, reason=e.reason)
            raise VaultError(f"secret://{name}: {e.message}{e.detail}", name, e.reason,
                             f"secret://{name}: {e.message}") from None
        audit.append("secret.resolve", name=name, what=what, ok=True)
        if ttl:
            with _cache_lock:
                _cache[key] = (value, _clock() + ttl)
        return value


class _Failed(Exception):
    def __init__(self, reason, message, detail=""):
        super().__init__(message)
        self.reason, self.message, self.detail = reason, message, detail


def _first_line(err):
    text = err.decode("utf-8", "replace").strip().splitlines()
    return f" ({_show(text[0], 160)})" if text and text[0].strip() else ""


def _run(name, command):
    """Run the resolver for `name`; the secret, or _Failed(reason, message). The reason is
    a fixed word for the audit line; the message may carry stderr's first line (capped)."""
    argv = [a.replace(PLACEHOLDER, name) for a in command]
    why = _program_error(argv[0])
    if why:
        raise _Failed("missing-program", f"cannot run the resolver: {why}")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(os.environ), close_fds=True,
                                start_new_session=True)
    except OSError as e:
        raise _Failed("cannot-start", f"cannot run the resolver {_show(argv[0])}: "
                                      f"{e.strerror}") from None
    out, err, over, timed_out = bytearray(), bytearray(), False, False
    deadline = time.monotonic() + TIMEOUT
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for k, _ in sel.select(left):
                chunk = os.read(k.fd, 65536)
                if not chunk:
                    sel.unregister(k.fileobj)
                    continue
                buf = k.data
                cap = MAX_OUTPUT + 1 if buf is out else MAX_STDERR
                if len(buf) < cap:
                    buf += chunk[:cap - len(buf)]
                if buf is out and len(out) > MAX_OUTPUT:
                    over = True
            if over:
                break
    if timed_out or over:
        _kill(proc)
    try:
        status = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(proc)
        status = proc.wait()
        timed_out = True
    finally:
        proc.stdout.close()
        proc.stderr.close()
    if timed_out:
        raise _Failed("timeout", f"the resolver did not answer within {TIMEOUT:g} s")
    if over:
        raise _Failed("too-long", f"the resolver printed more than {MAX_OUTPUT // 1024} KiB")
    if status != 0:
        how = (f"was killed by signal {-status}" if status < 0 else f"exited {status}")
        raise _Failed(f"exit {status}", f"the resolver {how}", _first_line(bytes(err)))
    data = bytes(out)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise _Failed("empty", "the resolver printed nothing (an empty secret)")
    if b"\x00" in data:
        raise _Failed("nul", "the resolver's output holds a NUL byte")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Failed("not-utf8", "the resolver's output is not UTF-8 text") from None


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
