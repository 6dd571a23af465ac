"""What a sealed layer holds, recorded the moment it is sealed and checked before it is used.

A layer directory lives in OVERLORD_HOME, where any process of the operator's user could
write. So that diff, review and commit show -- and land -- exactly what the command wrote,
sealing records every entry of the layer as it was (type, mode, owner, size, content hash or
link text or device number, a digest of all its xattrs) in `NNNN.seal.json` beside it, and the
digest of that record on meta.json. Before a layer is read for a plan, every entry is checked
against the record: an entry added, removed or changed since is refused, naming the session,
the savepoint and the path.

Within one process a file whose inode and ctime are what they were when it was last hashed and
matched is not hashed again: no process can set ctime, and every change to content, mode,
owner or xattrs moves it.
"""
import hashlib
import json
import os
import stat
import threading

from overlord.errors import OverlordError
from overlord.text import escape_path
from overlord.txn import changes as C
from overlord.txn import layers as L
from overlord.txn import store

_verified = {}            # (layer dir, rel) -> (ino, ctime_ns, record) last hashed and matched
_lock = threading.Lock()


class Tampered(OverlordError):
    """A sealed layer no longer holds what was sealed."""


def seal_path(layer_dir):
    return layer_dir.rstrip("/") + ".seal.json"


# On a file, the overlay's own xattrs (origin, ...) mean nothing to the view, and commit
# strips them before moving the file into the tree (an undone commit moves it back)
_FILE_BOOKKEEPING = ("user.overlay.", "trusted.overlay.", "user.fuseoverlayfs.")


def _xattr_digest(path, is_dir):
    try:
        names = sorted(n for n in os.listxattr(path, follow_symlinks=False)
                       if is_dir or not n.startswith(_FILE_BOOKKEEPING))
    except OSError:
        return None
    if not names:
        return None
    h = hashlib.sha256()
    for name in names:
        try:
            value = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            value = b"?"
        h.update(name.encode("utf-8", "surrogateescape") + b"\0" + value + b"\0")
    return h.hexdigest()


def _entry(path, st, hashes=None):
    """One entry's record: [type, mode, uid, gid, size, content, xattrs]."""
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return ["whiteout"]          # a fork recreates these: only the kind is the content
    kind = C.type_of(st)
    content = None
    if stat.S_ISREG(st.st_mode):
        content = hashes.get(path) if hashes and path in hashes else C.sha256_file(path)
    elif stat.S_ISLNK(st.st_mode):
        content = os.fsencode(os.readlink(path)).hex()
    elif not stat.S_ISDIR(st.st_mode):
        content = st.st_rdev
    return [kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
            st.st_size if stat.S_ISREG(st.st_mode) else None, content,
            _xattr_digest(path, stat.S_ISDIR(st.st_mode))]


def _walk(layer_dir):
    """(rel, abs path, lstat) of every entry in a layer, the root included, markers too."""
    todo = [("", layer_dir)]
    while todo:
        rel, absdir = todo.pop()
        st = os.lstat(absdir)
        yield rel, absdir, st
        for name in sorted(os.listdir(absdir)):
            p = os.path.join(absdir, name)
            r = f"{rel}/{name}" if rel else name
            cst = os.lstat(p)
            if stat.S_ISDIR(cst.st_mode):
                todo.append((r, p))
            else:
                yield r, p, cst


def _modes_digest(layer_dir):
    try:
        with open(L.modes_path(layer_dir), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def record(layer_dir):
    """Write the seal of a layer as it is now; returns the digest meta.json keeps."""
    entries = {}
    for rel, p, st in _walk(layer_dir):
        entries[rel] = _entry(p, st)
    data = {"entries": entries, "modes": _modes_digest(layer_dir)}
    store.write_json_atomic(seal_path(layer_dir), data)
    with open(seal_path(layer_dir), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def verify(layer_dir, digest, sid, n):
    """Refuse a layer that is not exactly what was sealed."""
    where = f"session {sid} savepoint @{n}"
    if not digest:
        raise Tampered(f"{where} has no seal record, so what it holds cannot be trusted; "
                       "roll the session back")
    try:
        with open(seal_path(layer_dir), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise Tampered(f"{where} was changed after it was sealed: its seal record is gone") from None
    if hashlib.sha256(raw).hexdigest() != digest:
        raise Tampered(f"{where} was changed after it was sealed: its seal record was rewritten")
    sealed = json.loads(raw)
    entries = sealed["entries"]
    if _modes_digest(layer_dir) != sealed.get("modes"):
        raise Tampered(f"{where} was changed after it was sealed: its saved directory modes")
    seen = set()
    for rel, p, st in _walk(layer_dir):
        seen.add(rel)
        want = entries.get(rel)
        if want is None:
            _refuse(where, rel, "added")
        key = (layer_dir, rel)
        with _lock:
            known = _verified.get(key)
        if known and known[:2] == (st.st_ino, st.st_ctime_ns) and known[2] == want:
            continue
        have = _entry(p, st)
        if have != want:
            _refuse(where, rel, _what(want, have))
        with _lock:
            _verified[key] = (st.st_ino, st.st_ctime_ns, want)
    missing = [rel for rel in entries if rel not in seen]
    if missing:
        _refuse(where, min(missing), "removed")


def _what(want, have):
    if want[0] != have[0]:
        return f"was a {want[0]}, now a {have[0]}"
    names = ("type", "mode", "owner", "owner", "size", "content", "xattrs")
    for i, name in enumerate(names):
        if want[i:i + 1] != have[i:i + 1]:
            return f"{name} changed"
    return "changed"


def _refuse(where, rel, what):
    raise Tampered(f"{where} was changed after it was sealed: {escape_path(rel)} ({what})")
