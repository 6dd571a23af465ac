"""The plan: what a stack of layers changes in the real tree, computed in O(changed paths).

One function computes it; `diff`, `log`, drift checks and `commit` all use the same list.
"""
import contextlib
import dataclasses
import hashlib
import os
import stat

from overlord.txn import layers as L

KINDS = ("added", "modified", "deleted", "replaced-dir", "invalid-whiteout")


@contextlib.contextmanager
def readable(path):
    """Let us read a file of our own that the command left unreadable (a mode-000 file in a
    layer), restoring its mode afterwards."""
    try:
        st = os.lstat(path)
    except OSError:
        yield
        return
    if os.access(path, os.R_OK, follow_symlinks=False) or not stat.S_ISREG(st.st_mode):
        yield
        return
    os.chmod(path, stat.S_IMODE(st.st_mode) | 0o400)
    try:
        yield
    finally:
        os.chmod(path, stat.S_IMODE(st.st_mode))


def sha256_file(path):
    with readable(path):
        return _sha256(path)


def _sha256(path):
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def content_hash(path, st):
    """A stable content id: sha256 of bytes (files) or of the link text (symlinks)."""
    if st is None:
        return None
    if stat.S_ISREG(st.st_mode):
        return sha256_file(path)
    if stat.S_ISLNK(st.st_mode):
        return hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()
    return None


def kind_of(st):
    if st is None:
        return None
    m = st.st_mode
    if stat.S_ISDIR(m):
        return "dir"
    if stat.S_ISREG(m):
        return "file"
    if stat.S_ISLNK(m):
        return "symlink"
    return "other"


@dataclasses.dataclass
class Change:
    path: str
    kind: str
    entry: L.Entry            # the session's side (None never: whiteouts have an Entry too)
    real: os.stat_result      # the real tree's side at plan time (None if absent)

    @property
    def layer(self):
        return self.entry.layer


def real_path(target, path):
    return os.path.join(target, path) if path else target


def lstat_or_none(path):
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def same_content(entry, real_abs, real_st):
    if entry.kind == "file":
        return entry.st.st_size == real_st.st_size and sha256_file(entry.src) == sha256_file(real_abs)
    if entry.kind == "symlink":
        return os.readlink(entry.src) == os.readlink(real_abs)
    if entry.kind == "other":
        return entry.st.st_mode == real_st.st_mode and entry.st.st_rdev == real_st.st_rdev
    return True


def metadata_differs(entry, real_st, with_mtime):
    a, b = entry.st, real_st
    if stat.S_IMODE(a.st_mode) != stat.S_IMODE(b.st_mode) and entry.kind != "symlink":
        return True
    if (a.st_uid, a.st_gid) != (b.st_uid, b.st_gid):
        return True
    return with_mtime and a.st_mtime_ns != b.st_mtime_ns


def classify(entry, target, fresh):
    """The kind of change one view entry makes to the real tree, or None."""
    if entry.kind == "invalid":
        return "invalid-whiteout"
    if fresh:       # under a directory the session created or replaced: compare with nothing
        return None if entry.kind == "whiteout" else "added"
    real_abs = real_path(target, entry.path)
    return layer_change(entry, real_abs, lstat_or_none(real_abs))


def layer_change(entry, before_abs, before_st):
    """The kind of change an entry makes over what lies below it (None: no change)."""
    if entry.kind == "invalid":
        return "invalid-whiteout"
    if entry.kind == "whiteout":
        return "deleted" if before_st is not None else None
    if before_st is None:
        return "added"
    before_kind = kind_of(before_st)
    if entry.kind == "dir":
        if before_kind == "dir":
            if entry.opaque:
                return "replaced-dir"
            return "modified" if metadata_differs(entry, before_st, with_mtime=False) else None
        return "modified"
    if before_kind != entry.kind or metadata_differs(entry, before_st, entry.kind != "symlink"):
        return "modified"
    return None if same_content(entry, before_abs, before_st) else "modified"


def plan(view, target):
    """[Change] for a stacked view over the real tree, parents before children."""
    changes, fresh_roots = [], set()
    for path in sorted(view, key=lambda p: p.split("/")):
        entry = view[path]
        fresh = any(p in fresh_roots for p in L.parents(path))
        kind = classify(entry, target, fresh)
        if entry.kind == "dir" and (fresh or kind in ("added", "replaced-dir") or
                                    (kind == "modified" and entry.opaque)):
            fresh_roots.add(path)
        if entry.kind == "dir" and kind == "modified" and not entry.opaque:
            # file -> dir without an opaque mark cannot happen in overlay; treat as fresh anyway
            real_st = lstat_or_none(real_path(target, path))
            if real_st is not None and not stat.S_ISDIR(real_st.st_mode):
                fresh_roots.add(path)
        if kind is not None:
            changes.append(Change(path, kind, entry, None if fresh else lstat_or_none(real_path(target, path))))
    return changes


def touched_paths(view):
    """Every path replay would touch: net changes and no-op whiteouts alike."""
    return sorted(view, key=lambda p: p.split("/"))
