"""Bundles: one session as a signed `.ovl` file (a tar.gz) that travels to another machine.

The one reader and writer of OVERLORD_HOME/bundle.key and of an imported record's
`imported/` directory. Layout of a bundle (members in this order):

    manifest.json          {format, version, sid, exported_at, host, state, target, key_id,
                            changes, members: {name: {type, size, mode, sha256, link?}}}
    manifest.sig           hex HMAC-SHA256(bundle.key, the manifest's exact bytes)
    record/<name>          the session's record, as the store keeps it (RECORD_FILES)
    objects/<sha256>       the retained file versions its provenance and committed.json name
    changes/changes.json   a pending session: {deleted, replaced, root_mode}
    changes/tree/<path>    a pending session: every file (content, mode), symlink (its text)
                           and directory (mode) commit would write -- derived from its plan

Verification (read()): the stream is decompressed with a running cap, every member checked
before any byte of it is kept (a relative name under a known prefix, a regular file, or a
directory / symlink under changes/tree only, within the per-member cap, listed in the
manifest with that type, size and mode), hashed against the manifest; no member missing,
none twice. Kept bytes go to a staging directory inside OVERLORD_HOME under names we choose
(never the member's), so nothing a bundle names is ever created as a path, and no symlink
is ever made in the store. Signature: the manifest names the key that signed it (key_id, a
fingerprint). Signed by this machine's key -> verified; naming this machine's key but not
matching (edited, truncated, re-signed with another key, or the signature removed) ->
refused as forged; naming another key or none -> unverified (meta.imported.verified false).
docs/BUNDLES.md.
"""
import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
import zlib

from overlord.errors import OverlordError, UsageError
from overlord.text import escape_path, escape_text
from overlord.txn import changes as C
from overlord.txn import objects, retain, store

KEY_NAME = "bundle.key"
KEY_SIZE = 32
FORMAT = "overlord-bundle"
VERSION = 1
MANIFEST, SIG = "manifest.json", "manifest.sig"
# what of a session directory a bundle carries (never a key, a lock, a layer or a mount)
RECORD_FILES = ("meta.json", "provenance.jsonl", "transcript.jsonl", "committed.json",
                "review.jsonl", "syscalls.jsonl", "cost.json")
CHANGES_JSON = "changes/changes.json"
TREE = "changes/tree/"
OPEN = ("running", "pending", "timed-out")     # a record that lands here as `imported`
HEX64 = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_TOTAL = 8 << 30            # decompressed bytes of a whole bundle
DEFAULT_MAX_MEMBER = 2 << 30           # bytes of one member
MANIFEST_MAX = 64 << 20
JSON_MAX = 32 << 20                    # a record file or changes.json read into memory
ENTRIES_MAX = 500_000                  # paths a bundle's changes may name (memory stays bounded)
STAGING = "bundle-tmp"
IMPORTED = "imported"                  # inside an imported record's session directory
PACK = "changes.pack"                  # the changes' file bytes, one after another


class Refused(OverlordError):
    """A bundle that is not what it claims: nothing of it was kept."""


def _cap(name, default):
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise UsageError(f"{name} must be a positive number of bytes, not {raw!r}")
    return value


def max_total():
    return _cap("OVERLORD_BUNDLE_MAX", DEFAULT_MAX_TOTAL)


def max_member():
    return _cap("OVERLORD_BUNDLE_MEMBER_MAX", DEFAULT_MAX_MEMBER)


# -- the key -------------------------------------------------------------------------------------

def key_path():
    return os.path.join(store.home(), KEY_NAME)


def _key_error(path, what):
    return OverlordError(f"bundle key {escape_path(path)}: {what}")


def parse_key(data, path):
    """The 32 key bytes of a key file's text (64 hex digits, an optional newline)."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise _key_error(path, "is not a bundle key (64 hex digits)") from None
    text = text[:-1] if text.endswith("\n") else text
    if not HEX64.match(text.lower()):
        raise _key_error(path, "is not a bundle key (64 hex digits)")
    return bytes.fromhex(text)


def load_key(path=None):
    """The key's bytes, or None when there is none. A key that is not a regular file of the
    caller's, is reachable by group/other, or is malformed raises OverlordError."""
    from overlord.trust.audit import open_owned
    path = path or key_path()
    opened = open_owned(path, os.O_RDONLY, _key_error, 0o077, "reach")
    if opened is None:
        return None
    fd, st = opened
    try:
        data = os.read(fd, 200)
    finally:
        os.close(fd)
    return parse_key(data, path)


def _write_key(path, key, replace):
    """Write the key file (0600 from the moment it exists): a temp file, fsynced, then
    renamed over (replace) or hard-linked to its name (never replacing: a racing first
    exporter reads the winner's key)."""
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            store.write_all(fd, key.hex().encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.rename(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        store.fsync_dir(os.path.dirname(path))
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def ensure_key():
    """The key, made on first use."""
    key = load_key()
    if key is None:
        store.ensure_home()
        _write_key(key_path(), secrets.token_bytes(KEY_SIZE), replace=False)
        key = load_key()
        if key is None:
            raise _key_error(key_path(), "vanished while it was being made")
    return key


def fingerprint(key):
    """What names a key without telling it: 32 hex digits of a tagged sha256."""
    if key is None:
        return None
    return hashlib.sha256(b"overlord bundle key\n" + key).hexdigest()[:32]


def install_key(source):
    """Install another machine's key (a file holding 64 hex digits) as this machine's.
    Returns (new fingerprint, previous fingerprint or None)."""
    try:
        with open(source, "rb") as f:
            data = f.read(201)
    except OSError as exc:
        raise UsageError(f"cannot read {escape_path(str(source))}: {exc.strerror}") from None
    if len(data) > 200:
        raise _key_error(str(source), "is not a bundle key (64 hex digits)")
    key = parse_key(data, str(source))
    try:
        previous = load_key()
    except OverlordError:
        previous = None                   # a damaged key is what the new one replaces
    store.ensure_home()
    _write_key(key_path(), key, replace=True)
    return fingerprint(key), fingerprint(previous)


def sign(key, manifest_bytes):
    return hmac.new(key, manifest_bytes, "sha256").hexdigest()


# -- export --------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Member:
    name: str
    type: str                # file | dir | symlink
    mode: int
    size: int = 0
    sha256: str = None
    link: str = None
    data: bytes = None       # the bytes, when held in memory
    src: str = None          # else the file they are read from


class _Counting:
    """A write-only file object that hashes and counts what passes through to `out`."""

    def __init__(self, out):
        self.out, self.h, self.n = out, hashlib.sha256(), 0

    def write(self, data):
        self.h.update(data)
        self.n += len(data)
        self.out.write(data)
        return len(data)

    def flush(self):
        if hasattr(self.out, "flush"):
            self.out.flush()


def outside(path, link):
    """Does a symlink at `path` (relative to the tree root) with text `link` lead outside
    the tree (absolute, more `..` than it has parents, or a `..` after a name)?"""
    if not link or link.startswith("/"):
        return True
    depth = path.count("/")          # the directories above the link, within the tree
    named = False
    for part in link.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            # a `..` after a name climbs from wherever that name leads: another link of the
            # bundle's (`up/..` with up -> ..) would take it out while the text looks inside
            if named:
                return True
            depth -= 1
            if depth < 0:
                return True
        else:
            named = True
            depth += 1
    return False


def _record_members(session):
    out = []
    for name in RECORD_FILES:
        path = session.path(name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        out.append(_Member(f"record/{name}", "file", 0o600, len(data),
                           hashlib.sha256(data).hexdigest(), data=data))
    return out


def named_objects(session):
    """Every sha256 the record names: provenance's before/after, committed.json's states."""
    shas = set()
    for rec in session.provenance():
        for side in ("before", "after"):
            if isinstance(rec.get(side), str):
                shas.add(rec[side])
        base = rec.get("base")
        if isinstance(base, dict) and isinstance(base.get("sha256"), str):
            shas.add(base["sha256"])
    record = retain.load(session) or {}
    for states in (record.get("paths") or {}).values():
        for side in ("before", "after"):
            state = (states or {}).get(side)
            if isinstance(state, dict) and state.get("type") == "file" and isinstance(state.get("sha"), str):
                shas.add(state["sha"])
    return sorted(s for s in shas if HEX64.match(s))


def _retained(shas):
    """Those of shas the object store may hold (a loose file, or an entry of a pack's index),
    found with one listing per directory instead of a lookup per sha."""
    root = objects.root()
    if not shas or not os.path.isdir(root):
        return []
    have, loose = set(), {}
    packs = os.path.join(root, "packs")
    try:
        names = [n for n in os.listdir(packs) if n.endswith(".idx")]
    except FileNotFoundError:
        names = []
    for name in names:
        try:
            with open(os.path.join(packs, name), encoding="utf-8") as f:
                have.update(json.load(f))
        except (OSError, ValueError, TypeError):
            continue
    out = []
    for sha in shas:
        if sha in have:
            out.append(sha)
            continue
        d = sha[:2]
        if d not in loose:
            try:
                loose[d] = set(os.listdir(os.path.join(root, d)))
            except OSError:
                loose[d] = set()
        if sha[2:] in loose[d]:
            out.append(sha)
    return out


def _object_members(session):
    out = []
    for sha in _retained(named_objects(session)):
        data = objects.read(sha)
        if data is None:
            continue                  # not retained here either: blame says so where it lands
        out.append(_Member(f"objects/{sha}", "file", 0o400, len(data), sha, data=data))
    return out


HELD_FILE, HELD_TOTAL = 1 << 20, 256 << 20      # what an export keeps in memory between passes


def _read_file(path):
    with C.readable(path):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        parts = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
    finally:
        os.close(fd)


def _change_members(session, plan):
    """(members under changes/tree, changes.json's dict) from a pending session's plan."""
    out, deleted, replaced, root_mode, held = [], [], [], None, 0
    for ch in plan:
        entry, path = ch.entry, ch.path
        shown = escape_path(path or ".")
        if entry.kind == "invalid":
            raise OverlordError(f"cannot export session {session.sid}: an invalid whiteout at "
                                f"{shown} (commit refuses it too)")
        if entry.kind == "whiteout":
            deleted.append(path)
            continue
        if entry.kind == "other":
            raise OverlordError(f"cannot export session {session.sid}: {shown} is a "
                                f"{C.type_of(entry.st)}; a bundle carries files, symlinks and "
                                "directories only")
        mode = stat.S_IMODE(entry.st.st_mode)
        if path == "":
            root_mode = mode
            continue
        name = TREE + path
        if entry.kind == "dir":
            if ch.kind == "replaced-dir" or (entry.opaque and ch.real is not None):
                replaced.append(path)
            out.append(_Member(name, "dir", mode))
        elif entry.kind == "symlink":
            link = os.readlink(entry.src)
            if outside(path, link):
                raise OverlordError(f"cannot export session {session.sid}: the symlink {shown} "
                                    f"points outside the folder ({escape_text(link)}); a "
                                    "bundle carries no such link")
            out.append(_Member(name, "symlink", 0o777, 0,
                               hashlib.sha256(os.fsencode(link)).hexdigest(), link=link))
        elif entry.st.st_size <= HELD_FILE and held < HELD_TOTAL:
            data = _read_file(entry.src)           # read once: hashed now, written below
            held += len(data)
            out.append(_Member(name, "file", mode, len(data), hashlib.sha256(data).hexdigest(),
                               data=data))
        else:
            sha = C.sha256_file(entry.src)
            out.append(_Member(name, "file", mode, entry.st.st_size, sha, src=entry.src))
    return out, {"deleted": deleted, "replaced": replaced, "root_mode": root_mode}


def build(session, plan, out):
    """Write session's bundle to the binary file object `out` (plan: its pending changes,
    or None for a closed session). Returns {sid, state, members, bytes, sha256, key_id,
    changes}."""
    key = ensure_key()
    state = session.meta.get("state")
    members = _record_members(session) + _object_members(session)
    changes = None
    if plan is not None:
        tree, changes = _change_members(session, plan)
        data = json.dumps(changes, sort_keys=True).encode()
        members.append(_Member(CHANGES_JSON, "file", 0o600, len(data),
                               hashlib.sha256(data).hexdigest(), data=data))
        members.extend(tree)
    now = time.time()
    listing = {}
    for m in members:
        listing[m.name] = {"type": m.type, "size": m.size, "mode": m.mode, "sha256": m.sha256}
        if m.link is not None:
            listing[m.name]["link"] = m.link
    manifest = {"format": FORMAT, "version": VERSION, "sid": session.sid,
                "exported_at": round(now, 3), "host": socket.gethostname(), "state": state,
                "target": session.meta.get("target"), "task": session.meta.get("task"),
                "key_id": fingerprint(key), "changes": changes is not None,
                "members": listing}
    mbytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    sig = sign(key, mbytes).encode("ascii")
    counting = _Counting(out)
    tar = TarWriter(counting, int(now))
    try:
        _write_members(tar, mbytes, sig, members)
    except BaseException:
        tar.abort()
        raise
    counting.flush()
    return {"sid": session.sid, "state": state, "members": len(members) + 2,
            "bytes": counting.n, "sha256": counting.h.hexdigest(), "key_id": fingerprint(key),
            "changes": None if changes is None else
            {"files": sum(1 for m in members if m.name.startswith(TREE)),
             "deleted": len(changes["deleted"])}}


def _write_members(tar, mbytes, sig, members):
    tar.file(MANIFEST, 0o600, mbytes)
    tar.file(SIG, 0o600, sig)
    for m in members:
        if m.type == "dir":
            tar.dir(m.name, m.mode)
        elif m.type == "symlink":
            tar.symlink(m.name, m.link)
        elif m.data is not None:
            tar.file(m.name, m.mode, m.data)
        else:
            with C.readable(m.src):
                fd = os.open(m.src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                tar.file_from(m.name, m.mode, fd, m.size)
            finally:
                os.close(fd)
    tar.close()


# -- tar, strictly -------------------------------------------------------------------------------
# Our own writer and reader of the one tar dialect a bundle uses: POSIX ustar headers, with a
# pax extended header ('x') for a name, link or size ustar cannot hold. The reader takes
# nothing else: regular files, directories, symlinks and pax headers; every other member type
# (hard links, devices, fifos, GNU extensions, global headers) is refused by name.

BLOCK = 512
_ZERO = bytes(BLOCK)
KIND_FLAG = {"file": b"0", "dir": b"5", "symlink": b"2"}
FLAG_WHAT = {b"1": "a hard link", b"3": "a character device", b"4": "a block device",
             b"6": "a fifo", b"7": "a contiguous file", b"S": "a sparse file",
             b"L": "a GNU long-name member", b"K": "a GNU long-link member",
             b"g": "a global pax header", b"V": "a volume label", b"M": "a multi-volume part"}


def _fits(text, size):
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        return None
    return raw if len(raw) <= size else None


def _pax_record(key, value):
    body = b" " + key.encode("ascii") + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n = len(str(n).encode()) + len(body)
    return str(n).encode() + body


def _ustar(name, flag, mode, size, mtime, link=b""):
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % mtime
    h[148:156] = b" " * 8
    h[156:157] = flag
    h[157:157 + len(link)] = link
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


class TarWriter:
    """Writes members to a binary file object as one gzip stream (level 6, as `tar czf`). The
    compression runs on a thread of its own (zlib lets go of the GIL), overlapping the reads
    and headers as `tar czf`'s separate gzip process does."""

    CHUNK = 1 << 20

    def __init__(self, out, mtime):
        import queue
        import threading
        self.out, self.mtime = out, mtime
        self.z = zlib.compressobj(6, zlib.DEFLATED, 31)
        self.buf = bytearray()
        self.q = queue.Queue(maxsize=4)
        self.failed = None
        self.thread = threading.Thread(target=self._compress, daemon=True)
        self.thread.start()

    def _compress(self):
        while True:
            data = self.q.get()
            if data is None and self.failed is not None:
                return
            if self.failed is not None:
                continue                          # drain: the writer is stopping
            try:
                if data is None:
                    self.out.write(self.z.flush())
                    return
                self.out.write(self.z.compress(data))
            except BaseException as exc:          # noqa: BLE001 - re-raised in close()
                self.failed = exc

    def _put(self, data):
        self.buf += data
        if len(self.buf) >= self.CHUNK:
            self.q.put(bytes(self.buf))
            self.buf.clear()
            if self.failed is not None:
                raise self.failed

    def _header(self, name, kind, mode, size, link=None):
        pax = []
        raw = _fits(name + ("/" if kind == "dir" else ""), 100)
        if raw is None:
            pax.append(_pax_record("path", name.encode("utf-8", "surrogateescape")))
            raw = b"././@PaxPath"
        rawlink = b""
        if link is not None:
            rawlink = _fits(link, 100)
            if rawlink is None:
                pax.append(_pax_record("linkpath", link.encode("utf-8", "surrogateescape")))
                rawlink = b"././@PaxLink"
        field = size
        if size >= 8 ** 11:
            pax.append(_pax_record("size", str(size).encode()))
            field = 0
        if pax:
            data = b"".join(pax)
            self._put(_ustar(b"././@PaxHeader", b"x", 0o644, len(data), self.mtime))
            self._put(data + bytes(-len(data) % BLOCK))
        self._put(_ustar(raw, KIND_FLAG[kind], mode, field, self.mtime, rawlink))

    def file(self, name, mode, data):
        self._header(name, "file", mode, len(data))
        self._put(data)
        self._put(bytes(-len(data) % BLOCK))

    def file_from(self, name, mode, fd, size):
        self._header(name, "file", mode, size)
        left = size
        while left:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise OverlordError(f"{escape_path(name)} shrank while it was being exported")
            self._put(chunk)
            left -= len(chunk)
        self._put(bytes(-size % BLOCK))

    def dir(self, name, mode):
        self._header(name, "dir", mode, 0)

    def symlink(self, name, link):
        self._header(name, "symlink", 0o777, 0, link)

    def close(self):
        self._put(_ZERO * 2)
        self.q.put(bytes(self.buf))
        self.buf.clear()
        self.q.put(None)
        self.thread.join()
        if self.failed is not None:
            raise self.failed

    def abort(self):
        """Stop the compressing thread after a failure (what was written is discarded)."""
        self.failed = self.failed or OverlordError("export abandoned")
        self.q.put(None)                 # the thread drains what is queued, then stops
        self.thread.join()


@dataclasses.dataclass
class TarMember:
    name: str
    kind: str            # file | dir | symlink
    mode: int
    size: int
    link: str = None


def _octal(field, what):
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if field[:1] in (b"\x80", b"\xff"):
        raise Refused(f"refused: a tar header with a binary {what} field")
    try:
        return int(text, 8)
    except ValueError:
        raise Refused(f"not a bundle: a damaged tar header ({what})") from None


class TarReader:
    """Reads members of the bundle dialect from a read()-able stream; next() -> TarMember or
    None at the end, then data(n) / skip() for the member's bytes."""

    def __init__(self, stream):
        self.stream = stream
        self.buf = bytearray()
        self.left = 0              # data bytes of the current member not read yet
        self.pad = 0
        self.first = True

    def _exact(self, n):
        while len(self.buf) < n:
            chunk = self.stream.read(max(n - len(self.buf), 1 << 16))
            if not chunk:
                raise Refused("not a bundle: the archive is cut short")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def data(self, n):
        n = min(n, self.left)
        out = self._exact(n) if n else b""
        self.left -= n
        if not self.left and self.pad:
            self._exact(self.pad)
            self.pad = 0
        return out

    def skip(self):
        while self.left:
            self.data(1 << 20)

    def next(self):
        self.skip()
        pax = {}
        while True:
            try:
                h = self._exact(BLOCK)
            except Refused:
                if self.first:
                    raise Refused("not a bundle: not a tar archive inside the gzip (empty)") from None
                raise
            if h == _ZERO:
                return None
            if h[257:262] != b"ustar":
                raise Refused("not a bundle: not a tar archive inside the gzip"
                              if self.first else "not a bundle: a damaged tar header")
            stored = _octal(h[148:156], "checksum")
            if stored != sum(h[:148]) + 256 + sum(h[156:]):
                raise Refused("not a bundle: a tar header fails its checksum (damaged)")
            self.first = False
            flag = h[156:157]
            hsize = _octal(h[124:136], "size")
            size = pax.get("size", hsize)
            if flag == b"x":
                size = hsize
                if size > 1 << 20:
                    raise Refused("refused: a pax header over its cap")
                self.left, self.pad = size, -size % BLOCK
                pax.update(self._pax(self.data(size)))
                continue
            if flag == b"\0":
                flag = b"0"
            kind = {b"0": "file", b"5": "dir", b"2": "symlink"}.get(flag)
            if kind is None:
                what = FLAG_WHAT.get(flag, f"a member of an unknown type ({escape_text(flag.decode('latin-1'))})")
                name = pax.get("path") or self._name(h)
                raise Refused(f"refused: {what} in the bundle: {escape_path(name)} (only files, "
                              "directories and symlinks)")
            name = pax.get("path") or self._name(h)
            if kind == "dir" and name.endswith("/"):
                name = name[:-1]
            link = None
            if kind == "symlink":
                link = pax.get("linkpath") or h[157:257].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                size = 0
            elif kind == "dir":
                size = 0
            self.left, self.pad = size, -size % BLOCK
            if not size:
                self.pad = 0
            return TarMember(name, kind, _octal(h[100:108], "mode") & 0o7777, size, link)

    @staticmethod
    def _name(h):
        name = h[:100].split(b"\0", 1)[0]
        prefix = h[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
        return name.decode("utf-8", "surrogateescape")

    @staticmethod
    def _pax(data):
        out = {}
        while data:
            length, sp, rest = data.partition(b" ")
            try:
                n = int(length)
            except ValueError:
                raise Refused("refused: a damaged pax header") from None
            if not sp or n < len(length) + 2 or n > len(data):
                raise Refused("refused: a damaged pax header")
            record, data = data[len(length) + 1:n], data[n:]
            key, eq, value = record.rstrip(b"\n").partition(b"=")
            if not eq:
                raise Refused("refused: a damaged pax header")
            if key == b"path":
                out["path"] = value.decode("utf-8", "surrogateescape")
            elif key == b"linkpath":
                out["linkpath"] = value.decode("utf-8", "surrogateescape")
            elif key == b"size":
                try:
                    out["size"] = int(value)
                except ValueError:
                    raise Refused("refused: a damaged pax header (size)") from None
            elif key.startswith(b"GNU.sparse"):
                raise Refused("refused: a sparse file in the bundle (only files, directories "
                              "and symlinks)")
        return out


# -- import: reading and verifying ---------------------------------------------------------------

class _Gunzip:
    """A read()-only file object: the gzip stream of `raw`, decompressed with a cap on the
    total output (a gzip bomb is refused while it streams). Also hashes every raw byte."""

    def __init__(self, raw, cap):
        self.raw, self.cap, self.out = raw, cap, 0
        self.h = hashlib.sha256()
        self.z = zlib.decompressobj(31)
        self.pending = b""
        self.eof = False

    def _feed(self):
        chunk = self.raw.read(1 << 16)
        self.h.update(chunk)
        return chunk

    def read(self, size=-1):
        if size is None or size < 0:
            size = 1 << 20
        while not self.eof:
            if self.pending:
                data = self.z.decompress(self.pending, size)
                self.pending = self.z.unconsumed_tail
            else:
                chunk = self._feed()
                if not chunk:
                    data = self.z.flush()
                    if not self.z.eof:
                        raise Refused("not a bundle: the gzip stream is cut short")
                    self.eof = True
                else:
                    data = self.z.decompress(chunk, size)
                    self.pending = self.z.unconsumed_tail
            if self.z.eof:
                self.eof = True
            if data:
                self.out += len(data)
                if self.out > self.cap:
                    raise Refused(f"refused: the bundle decompresses to more than "
                                  f"{self.cap} bytes (OVERLORD_BUNDLE_MAX); nothing was kept")
                return data
        return b""

    def drain(self):
        """The sha256 of the whole file (what was not read yet is read now)."""
        while self._feed():
            pass
        return self.h.hexdigest()


def check_name(name):
    """A member name as a bundle may have it: relative, no empty, `.` or `..` part."""
    if not isinstance(name, str) or not name or len(name) > 8192:
        raise Refused(f"refused: a member with no usable name ({escape_text(str(name)[:200])})")
    if name.startswith("/"):
        raise Refused(f"refused: an absolute member name: {escape_path(name)}")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise Refused(f"refused: a member name with an empty, `.` or `..` part: {escape_path(name)}")
    return parts


def _place(name):
    """What a member name is: manifest | sig | record | object | changes | tree."""
    if name == MANIFEST:
        return "manifest"
    if name == SIG:
        return "sig"
    head, _, rest = name.partition("/")
    if head == "record" and rest in RECORD_FILES:
        return "record"
    if head == "objects" and HEX64.match(rest):
        return "object"
    if name == CHANGES_JSON:
        return "changes"
    if name.startswith(TREE):
        return "tree"
    raise Refused(f"refused: a member outside the known names: {escape_path(name)}")


@dataclasses.dataclass
class Staged:
    """A verified bundle, its kept bytes in a staging directory inside OVERLORD_HOME."""
    dir: str
    manifest: dict
    manifest_bytes: bytes
    sig: bytes
    verified: bool
    why: str                      # how the signature was judged, in words
    sha256: str                   # of the .ovl file
    record: dict                  # name -> staged path
    objects: dict                 # sha -> staged path, or the bytes (small ones)
    tree: list                    # [{path, type, mode, sha256, link}]
    packed: dict = None           # sha -> [offset, size] of the changes' bytes in PACK
    changes: dict = None          # changes.json's dict, for a bundle with changes
    meta: dict = None

    @property
    def sid(self):
        return self.manifest["sid"]

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def staging_root():
    return os.path.join(store.home(), STAGING)


def read(path, key, require_signature=False):
    """Verify the bundle at path, keeping its bytes in a staging directory. Returns Staged
    (the caller lands it or cleans it up). Any flaw raises Refused, with nothing kept."""
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read {escape_path(str(path))}: {exc.strerror}") from None
    with raw:
        st = os.fstat(raw.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"not a bundle: {escape_path(str(path))} is not a regular file")
        magic = raw.read(2)
        if magic != b"\x1f\x8b":
            raise Refused(f"not a bundle: {escape_path(str(path))} is not gzip-compressed "
                          "(an .ovl is a tar.gz)")
        raw.seek(0)
        store.ensure_home()
        os.makedirs(staging_root(), mode=0o700, exist_ok=True)
        sdir = os.path.join(staging_root(), f"{os.getpid()}-{secrets.token_hex(6)}")
        os.mkdir(sdir, 0o700)
        os.mkdir(os.path.join(sdir, "f"), 0o700)
        try:
            return _read(raw, sdir, key, require_signature)
        except MemoryError:
            shutil.rmtree(sdir, ignore_errors=True)
            raise Refused("refused: the bundle needs more memory than this process has; "
                          "nothing was kept") from None
        except BaseException:
            shutil.rmtree(sdir, ignore_errors=True)
            raise


def _read(raw, sdir, key, require_signature):
    stream = _Gunzip(raw, max_total())
    member_cap = max_member()
    seen, record, objs, tree, packed = set(), {}, {}, [], {}
    manifest = mbytes = sig = None
    verified, why, judged = False, None, False
    counter = held = 0
    # the changes' bytes go into one file (a pack, by offset): the record is data, not a tree
    pack = os.open(os.path.join(sdir, PACK), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                   | os.O_CLOEXEC, 0o600)
    offset = 0
    tar = TarReader(stream)
    try:
        while True:
            ti = tar.next()
            if ti is None:
                break
            name, kind = ti.name, ti.kind
            check_name(name)
            if name in seen:
                raise Refused(f"refused: the member {escape_path(name)} appears twice")
            seen.add(name)
            place = _place(name)
            if ti.size > member_cap:
                raise Refused(f"refused: the member {escape_path(name)} is {ti.size} bytes, over "
                              f"the cap of {member_cap} (OVERLORD_BUNDLE_MEMBER_MAX)")
            if manifest is None:
                if place != "manifest" or kind != "file":
                    raise Refused("refused: the bundle does not start with its manifest.json")
                if ti.size > MANIFEST_MAX:
                    raise Refused("refused: the manifest is over its cap")
                mbytes = tar.data(ti.size)
                manifest = _parse_manifest(mbytes)
                continue
            if not judged:
                # the signature is judged before any other member is read
                if place == "sig":
                    if kind != "file" or ti.size > 200:
                        raise Refused("refused: manifest.sig is not a signature")
                    sig = tar.data(ti.size)
                verified, why = judge(manifest, mbytes, sig, key, require_signature)
                judged = True
                if place == "sig":
                    continue
            if place in ("manifest", "sig"):
                raise Refused(f"refused: a second {escape_path(name)} in the bundle")
            entry = manifest["members"].get(name)
            if entry is None:
                raise Refused(f"refused: the member {escape_path(name)} is not in the manifest")
            if entry.get("type") != kind:
                raise Refused(f"refused: the member {escape_path(name)} is a {kind}, the manifest "
                              f"says {escape_text(str(entry.get('type')))}")
            if kind == "symlink":
                if place != "tree":
                    raise Refused(f"refused: a symlink outside changes/tree: {escape_path(name)}")
                link = ti.link
                rel = name[len(TREE):]
                if outside(rel, link):
                    raise Refused(f"refused: the symlink {escape_path(name)} points outside the "
                                  f"folder ({escape_text(link)})")
                if link != entry.get("link") or \
                        hashlib.sha256(os.fsencode(link)).hexdigest() != entry.get("sha256"):
                    raise Refused(f"refused: the symlink {escape_path(name)} does not match the "
                                  "manifest")
                tree.append({"path": rel, "type": "symlink", "link": link})
                continue
            if entry.get("mode") != ti.mode:
                raise Refused(f"refused: the member {escape_path(name)} has mode {ti.mode:04o}, "
                              "the manifest says another")
            if kind == "dir":
                if place != "tree":
                    raise Refused(f"refused: a directory outside changes/tree: {escape_path(name)}")
                tree.append({"path": name[len(TREE):], "type": "dir", "mode": ti.mode})
                continue
            if ti.size != entry.get("size"):
                raise Refused(f"refused: the member {escape_path(name)} is {ti.size} bytes, the "
                              f"manifest says {escape_text(str(entry.get('size')))}")
            want = entry.get("sha256")
            if not isinstance(want, str) or not HEX64.match(want):
                raise Refused(f"refused: the manifest gives {escape_path(name)} no valid sha256")
            if place == "tree":
                if want in packed:
                    sha = _stage(tar, ti, None)           # the same bytes are packed already
                else:
                    sha = _stage(tar, ti, pack)
                    packed[want] = [offset, ti.size]
                    offset += ti.size
                staged = None
            elif place == "object" and ti.size <= HELD_FILE and held + ti.size <= HELD_TOTAL:
                staged = tar.data(ti.size)              # small: kept in memory until it lands
                held += len(staged)
                sha = hashlib.sha256(staged).hexdigest()
            else:
                counter += 1
                staged = os.path.join(sdir, "f", str(counter))
                fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, 0o600)
                try:
                    sha = _stage(tar, ti, fd)
                finally:
                    os.close(fd)
            if sha != want:
                raise Refused(f"refused: the member {escape_path(name)} does not match its hash "
                              "in the manifest (altered)")
            if place == "record":
                record[name[len("record/"):]] = staged
            elif place == "object":
                if sha != name[len("objects/"):]:
                    raise Refused(f"refused: the object {escape_path(name)} is not named by its "
                                  "content's hash")
                objs[sha] = staged
            elif place == "changes":
                record[CHANGES_JSON] = staged
            else:
                tree.append({"path": name[len(TREE):], "type": "file", "mode": ti.mode,
                             "sha256": sha})
    except zlib.error:
        raise Refused("not a bundle: the gzip stream is damaged") from None
    finally:
        os.close(pack)
    if manifest is None:
        raise Refused("not a bundle: no manifest.json (an empty archive)")
    if not judged:
        verified, why = judge(manifest, mbytes, sig, key, require_signature)
    missing = sorted(set(manifest["members"]) - seen)
    if missing:
        raise Refused(f"refused: the manifest lists {len(missing)} member"
                      f"{'' if len(missing) == 1 else 's'} the bundle lacks "
                      f"({escape_path(missing[0])}{', ...' if len(missing) > 1 else ''})")
    out = Staged(sdir, manifest, mbytes, sig, verified, why, stream.drain(), record, objs, tree,
                 packed)
    _check_contents(out)
    return out


def _stage(tar, ti, fd):
    """Hash a member's bytes, appending them to the open file fd (None: only hash)."""
    h = hashlib.sha256()
    left = ti.size
    while left:
        chunk = tar.data(min(left, 1 << 20))
        h.update(chunk)
        if fd is not None:
            store.write_all(fd, chunk)
        left -= len(chunk)
    return h.hexdigest()


def _parse_manifest(data):
    try:
        manifest = json.loads(data)
    except ValueError:
        raise Refused("refused: the manifest is not JSON (truncated or damaged)") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Refused("refused: the manifest is not an OVERLORD bundle's")
    if manifest.get("version") != VERSION:
        raise Refused(f"refused: bundle format version {escape_text(str(manifest.get('version')))} "
                      f"(this OVERLORD reads version {VERSION})")
    sid = manifest.get("sid")
    if not isinstance(sid, str) or not store.SID_RE.match(sid):
        raise Refused("refused: the manifest names no valid session id")
    members = manifest.get("members")
    if not isinstance(members, dict) or not all(isinstance(v, dict) for v in members.values()):
        raise Refused("refused: the manifest's member list is damaged")
    for name, entry in members.items():
        check_name(name)
        if _place(name) in ("manifest", "sig"):
            raise Refused(f"refused: the manifest lists {escape_path(name)} as a member")
        if entry.get("type") not in ("file", "dir", "symlink"):
            raise Refused(f"refused: the manifest gives {escape_path(name)} an unknown type")
    if manifest.get("state") not in store.STATES:
        raise Refused("refused: the manifest names an unknown session state")
    return manifest


def judge(manifest, mbytes, sig, key, require_signature):
    """(verified, why) of a manifest's signature; Refused for a forged one or, with
    require_signature, for an unverified one."""
    ours = fingerprint(key)
    named = manifest.get("key_id")
    if key is not None and named == ours:
        if sig is None:
            raise Refused("refused: the manifest names this machine's bundle key but carries no "
                          "signature (removed): forged or tampered")
        text = sig.decode("ascii", "replace").strip()
        if not hmac.compare_digest(text.encode("ascii", "replace"), sign(key, mbytes).encode()):
            raise Refused("refused: the manifest's signature does not match this machine's bundle "
                          "key: the manifest was altered or forged")
        return True, f"signed with this machine's bundle key ({ours})"
    if key is None:
        why = "this machine has no bundle key (share one with `overlord bundle key --import`)"
    elif sig is None or not named:
        why = "the bundle carries no signature"
    else:
        why = (f"signed with another key ({escape_text(str(named))[:40]}), not this machine's "
               f"({ours})")
    if require_signature:
        raise Refused(f"refused: unverified bundle ({why}); --require-signature")
    return False, why


def _check_contents(staged):
    """What the verified members say, checked before anything lands."""
    meta = _load_json(staged.record.get("meta.json"), "record/meta.json")
    if not isinstance(meta, dict) or meta.get("sid") != staged.sid:
        raise Refused("refused: the record's meta.json is not this session's")
    if meta.get("state") not in store.STATES:
        raise Refused("refused: the record's meta.json names an unknown state")
    if not isinstance(meta.get("target"), str) or not isinstance(meta.get("layers", []), list):
        raise Refused("refused: the record's meta.json is damaged")
    staged.meta = meta
    if CHANGES_JSON in staged.record:
        changes = _load_json(staged.record[CHANGES_JSON], CHANGES_JSON)
        if not isinstance(changes, dict) or not all(
                isinstance(changes.get(k), list) for k in ("deleted", "replaced")):
            raise Refused("refused: changes/changes.json is damaged")
        if len(changes["deleted"]) + len(changes["replaced"]) > ENTRIES_MAX:
            raise Refused(f"refused: changes/changes.json names more than {ENTRIES_MAX:,} paths")
        root_mode = changes.get("root_mode")
        if root_mode is not None and (type(root_mode) is not int or not 0 <= root_mode <= 0o7777):
            raise Refused("refused: changes/changes.json gives the folder a bad mode")
        for p in changes["deleted"] + changes["replaced"]:
            if not isinstance(p, str):
                raise Refused("refused: changes/changes.json names a path that is not text")
            check_name(p)
        staged.changes = changes
    elif staged.manifest.get("changes"):
        raise Refused("refused: the manifest promises changes but the bundle has no changes.json")
    # no path under a symlink of the bundle's (a writer following it would leave the folder)
    links = {t["path"] for t in staged.tree if t["type"] == "symlink"}
    for p in [t["path"] for t in staged.tree] + (staged.changes or {}).get("deleted", []):
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in links:
                raise Refused(f"refused: {escape_path(p)} lies under a symlink of the bundle's")
    staged.tree.sort(key=lambda t: t["path"].split("/"))


def _load_json(path, what):
    if path is None:
        raise Refused(f"refused: the bundle has no {what}")
    if os.path.getsize(path) > JSON_MAX:
        raise Refused(f"refused: {what} is over its cap")
    with open(path, "rb") as f:
        data = f.read()
    try:
        return json.loads(data)
    except ValueError:
        raise Refused(f"refused: {what} is not JSON") from None


# -- import: landing the record ------------------------------------------------------------------

def land(staged, owner=None):
    """Make the verified record a session of this machine's: objects into objects/ (each
    already checked against its name), the record into sessions/<sid> (refused when that sid
    exists: nothing is replaced). Returns the landed meta."""
    sid = staged.sid
    final = store.session_dir(sid)
    if os.path.lexists(final):
        raise Refused(f"refused: session {sid} already exists on this machine; nothing was "
                      "imported")
    sdir = os.path.join(staged.dir, "session")
    os.mkdir(sdir, 0o700)
    meta = dict(staged.meta)
    original = meta.get("state")
    imported = {"from": staged.manifest.get("host"), "bundle_sha256": staged.sha256,
                "verified": staged.verified, "why": staged.why, "at": round(time.time(), 3),
                "original_state": original, "exported_at": staged.manifest.get("exported_at"),
                "key_id": staged.manifest.get("key_id"), "by_uid": os.getuid()}
    if meta.get("owner") is not None:
        imported["original_owner"] = meta["owner"]
    if "uid" in meta:
        imported["original_uid"] = meta["uid"]
    meta["owner"] = owner
    meta["uid"] = os.getuid()
    if original in OPEN:
        meta["state"] = "imported"
        # its layers stayed on the other machine: the changes are in imported/ (and replayed
        # by `import -t`); an empty stack keeps every reader of layers honest
        imported["layers"] = meta.get("layers") or []
        meta["layers"] = []
        meta.pop("flat", None)
    meta["imported"] = imported
    for name, path in staged.record.items():
        if name in RECORD_FILES and name != "meta.json":
            os.rename(path, os.path.join(sdir, name))
    idir = os.path.join(sdir, IMPORTED)
    os.mkdir(idir, 0o700)
    with open(os.path.join(idir, MANIFEST), "wb") as f:
        f.write(staged.manifest_bytes)
    if staged.sig is not None:
        with open(os.path.join(idir, SIG), "wb") as f:
            f.write(staged.sig)
    if staged.changes is not None:
        os.rename(os.path.join(staged.dir, PACK), os.path.join(idir, PACK))
        store.write_json_atomic(os.path.join(idir, "changes.json"),
                                dict(staged.changes, tree=staged.tree, pack=staged.packed))
    store.write_json_atomic(os.path.join(sdir, "meta.json"), meta)
    keep_objects(staged, sid)
    try:
        os.mkdir(final, 0o700)           # the claim: a racing import of the same sid fails here
    except FileExistsError:
        raise Refused(f"refused: session {sid} already exists on this machine; nothing was "
                      "imported") from None
    os.rename(sdir, final)
    store.fsync_dir(store.sessions_dir())
    return meta


def keep_objects(staged, sid):
    """The bundle's retained versions into objects/ (a pack of their own, under a fresh name:
    never one an existing pack has)."""
    if not staged.objects:
        return
    keeper = objects.Keeper(store.new_sid())
    try:
        for sha, held in sorted(staged.objects.items()):
            if keeper.has(sha):
                continue
            if isinstance(held, bytes):
                keeper.put_bytes(held)
            else:
                keeper.copy(held, os.lstat(held), sha)
        keeper.finish()
    except BaseException:
        keeper.abandon()
        raise


def unland(sid):
    """Take back a record land() just made (a replay that failed after it)."""
    shutil.rmtree(store.session_dir(sid), ignore_errors=True)


def imported_changes(sid):
    """changes.json of an imported record ({deleted, replaced, root_mode, tree}), or None."""
    path = os.path.join(store.session_dir(sid), IMPORTED, "changes.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


# -- replay: the writer a session runs -----------------------------------------------------------

# Runs inside the session (python3 -I), reading one JSON line of operations and then the
# files' bytes, in order, from stdin. Every path is walked from the folder's root one
# component at a time with O_NOFOLLOW: nothing it writes goes through a symlink.
WRITER = r'''
import json, os, stat, sys
root = sys.argv[1]
inp = sys.stdin.buffer
ops = json.loads(inp.readline())
D = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
rootfd = os.open(root, D)
def parent(path, make):
    fd = os.dup(rootfd)
    parts = path.split("/")
    for part in parts[:-1]:
        try:
            nfd = os.open(part, D, dir_fd=fd)
        except FileNotFoundError:
            if not make:
                os.close(fd)
                return None, None
            os.mkdir(part, 0o755, dir_fd=fd)
            nfd = os.open(part, D, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            if not make:
                return None, None
            raise SystemExit(f"cannot reach {path!r}: {exc.strerror} (a symlink or a file on the way)")
        os.close(fd)
        fd = nfd
    return fd, parts[-1]
def lst(fd, name):
    try:
        return os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return None
def remove(fd, name, st):
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=fd)
        return
    try:
        dfd = os.open(name, D, dir_fd=fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=fd)
        dfd = os.open(name, D, dir_fd=fd)
    try:
        for child in os.listdir(dfd):
            remove(dfd, child, os.lstat(child, dir_fd=dfd))
    finally:
        os.close(dfd)
    os.rmdir(name, dir_fd=fd)
dirs = []
for op in ops["ops"]:
    kind, path = op["op"], op["path"]
    fd, name = parent(path, kind != "rm")
    if fd is None:
        continue
    try:
        st = lst(fd, name)
        if kind == "rm":
            remove(fd, name, st)
        elif kind == "dir":
            if st is not None and not stat.S_ISDIR(st.st_mode):
                remove(fd, name, st); st = None
            if st is None:
                os.mkdir(name, 0o700, dir_fd=fd)
            dirs.append((path, op["mode"]))
        elif kind == "file":
            if st is not None and not stat.S_ISREG(st.st_mode):
                remove(fd, name, st)
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                left = op["size"]
                while left:
                    chunk = inp.read(min(left, 1 << 20))
                    if not chunk:
                        raise SystemExit(f"the payload is cut short at {path}")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
                    left -= len(chunk)
                os.fchmod(out, op["mode"])
            finally:
                os.close(out)
        elif kind == "link":
            remove(fd, name, st)
            os.symlink(op["target"], name, dir_fd=fd)
    finally:
        os.close(fd)
for path, mode in sorted(dirs, key=lambda d: d[0].count("/"), reverse=True):
    fd, name = parent(path, False)
    if fd is not None:
        try:
            dfd = os.open(name, D, dir_fd=fd)
        except OSError:
            dfd = None
        os.close(fd)
        if dfd is not None:
            os.fchmod(dfd, mode)
            os.close(dfd)
if ops.get("root_mode") is not None:
    os.chmod(rootfd, ops["root_mode"])
'''


def staged_changes(staged):
    """The changes of a staged (verified, not landed) bundle as imported_changes() gives a
    landed record's ({deleted, replaced, root_mode, tree, pack}), or None; with
    staged_pack(staged) they replay without landing the record (it is already here)."""
    if staged.changes is None:
        return None
    return dict(staged.changes, tree=staged.tree, pack=staged.packed)


def staged_pack(staged):
    return os.path.join(staged.dir, PACK)


def write_payload(sid, out, changes=None, pack=None):
    """Write the writer's stdin for an imported record's changes to the binary file `out`
    (changes + pack given: a staged bundle's, see staged_changes). Returns the number of
    operations."""
    if changes is None:
        changes = imported_changes(sid)
        pack = os.path.join(store.session_dir(sid), IMPORTED, PACK)
    if changes is None:
        raise OverlordError(f"session {sid} carries no changes to replay")
    where = changes.get("pack") or {}
    ops = [{"op": "rm", "path": p} for p in sorted(set(changes["deleted"]) | set(changes["replaced"]),
                                                    key=lambda p: p.split("/"))]
    files = []
    for t in changes["tree"]:
        if t["type"] == "dir":
            ops.append({"op": "dir", "path": t["path"], "mode": t["mode"]})
        elif t["type"] == "symlink":
            ops.append({"op": "link", "path": t["path"], "target": t["link"]})
        else:
            off, size = where[t["sha256"]]
            ops.append({"op": "file", "path": t["path"], "mode": t["mode"], "size": size})
            files.append((off, size))
    out.write(json.dumps({"ops": ops, "root_mode": changes.get("root_mode")}).encode() + b"\n")
    with open(pack, "rb") as f:
        for off, size in files:
            f.seek(off)
            left = size
            while left:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    raise OverlordError(f"session {sid}'s kept changes are cut short")
                out.write(chunk)
                left -= len(chunk)
    return len(ops)


def summary(changes):
    """"12 files, 2 symlinks, 3 directories, 1 deletion" of changes.json's dict."""
    tree = changes.get("tree") or []
    out = []
    for kind, one, many in (("file", "file", "files"), ("symlink", "symlink", "symlinks"),
                            ("dir", "directory", "directories")):
        n = sum(1 for t in tree if t["type"] == kind)
        if n:
            out.append(f"{n} {one if n == 1 else many}")
    gone = len(set(changes.get("deleted") or []) | set(changes.get("replaced") or []))
    if gone:
        out.append(f"{gone} deletion{'' if gone == 1 else 's'}")
    return ", ".join(out) or "no changes"
