"""The plan: what a stack of layers changes in the real tree, computed in O(changed paths).

One function computes it; `diff`, `log`, drift checks and `commit` all use the same list.
"""
import contextlib
import dataclasses
import hashlib
import os
import stat

from overlord.text import escape_text
from overlord.txn import layers as L
from overlord.txn import store

KINDS = ("added", "modified", "deleted", "replaced-dir", "invalid-whiteout")


@contextlib.contextmanager
def readable(path):
    """Let us read a file of our own that the command left unreadable (a mode-000 file in a
    layer), restoring its mode afterwards. Never in the real tree: a chmod there, even undone,
    moves the file's ctime -- drift evidence."""
    try:
        st = os.lstat(path)
    except OSError:
        yield
        return
    if (os.access(path, os.R_OK, follow_symlinks=False) or not stat.S_ISREG(st.st_mode) or
            not _in_store(path)):
        yield
        return
    os.chmod(path, stat.S_IMODE(st.st_mode) | 0o400)
    try:
        yield
    finally:
        os.chmod(path, stat.S_IMODE(st.st_mode))


def _in_store(path):
    home = store.home().rstrip("/") + "/"
    return os.path.abspath(path).startswith(home)


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


def type_of(st):
    """The type a person reads: file, dir, symlink, fifo, socket, char-device, block-device."""
    if st is None:
        return None
    m = st.st_mode
    for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "char-device"), (stat.S_ISBLK, "block-device")):
        if test(m):
            return name
    return kind_of(st)


@dataclasses.dataclass
class Change:
    path: str
    kind: str
    entry: L.Entry            # the session's side (None never: whiteouts have an Entry too)
    real: os.stat_result      # the real tree's side at plan time (None if absent)
    real_xattrs: dict = None  # the real side's xattrs at plan time (overlay's own left out)
    content_same: bool = None  # for a modified file or link of the same type: bytes unchanged?

    @property
    def layer(self):
        return self.entry.layer

    @property
    def path_class(self):
        """"git" for a path under a .git/ (txn/gitdir.py), else None."""
        from overlord.txn.gitdir import is_git
        return "git" if is_git(self.path) else None

    @property
    def details(self):
        """What a person must see beyond the kind: types, link target, mode, owner, xattrs,
        and what the change adds that commit refuses without --allow-privileged-modes."""
        return details(self.entry, self.real, self.real_xattrs, self.content_same)


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
        return (stat.S_IFMT(entry.st.st_mode) == stat.S_IFMT(real_st.st_mode) and
                entry.st.st_rdev == real_st.st_rdev)
    return True


def metadata_differs(entry, real_st, with_mtime, real_xattrs=None):
    a, b = entry.st, real_st
    if stat.S_IMODE(a.st_mode) != stat.S_IMODE(b.st_mode) and entry.kind != "symlink":
        return True
    if (a.st_uid, a.st_gid) != (b.st_uid, b.st_gid):
        return True
    if real_xattrs is not None and (entry.xattrs or {}) != real_xattrs:
        return True
    return with_mtime and a.st_mtime_ns != b.st_mtime_ns


def classify(entry, target, fresh, dialect):
    """(kind of change one view entry makes to the real tree or None, real lstat, real xattrs)."""
    if entry.kind == "invalid":
        return "invalid-whiteout", None, None
    if fresh:       # under a directory the session created or replaced: compare with nothing
        return (None if entry.kind == "whiteout" else "added"), None, None
    real_abs = real_path(target, entry.path)
    real_st = lstat_or_none(real_abs)
    real_x = L.xattrs(real_abs, dialect) if real_st is not None else None
    return layer_change(entry, real_abs, real_st, real_x), real_st, real_x


def layer_change(entry, before_abs, before_st, before_xattrs=None):
    """The kind of change an entry makes over what lies below it (None: no change).
    before_xattrs: the xattrs below (None: not compared)."""
    if entry.kind == "invalid":
        return "invalid-whiteout"
    if entry.kind == "whiteout":
        return "deleted" if before_st is not None else None
    if before_st is None:
        return "added"
    if entry.forged:        # an overlay xattr the command set: a change (commit refuses it)
        return "modified"
    before_kind = kind_of(before_st)
    if entry.kind == "dir":
        if before_kind == "dir":
            if entry.opaque:
                return "replaced-dir"
            return "modified" if metadata_differs(entry, before_st, False, before_xattrs) else None
        return "modified"
    if before_kind != entry.kind or metadata_differs(entry, before_st, entry.kind != "symlink",
                                                     before_xattrs):
        return "modified"
    return None if same_content(entry, before_abs, before_st) else "modified"


class Plan(list):
    """[Change], and the git lock files left out of it (txn/gitdir.py): never committed."""
    left_out = ()


def plan(view, target, dialect=None, recorded=None):
    """[Change] for a stacked view over the real tree, parents before children.
    recorded: the paths the session's provenance names; a real directory the session only
    wrote inside (a copy-up, named by no record) is no change, whatever its attributes now."""
    changes, fresh_roots = Plan(), set()
    for path in sorted(view, key=lambda p: p.split("/")):
        entry = view[path]
        fresh = any(p in fresh_roots for p in L.parents(path))
        kind, real_st, real_x = classify(entry, target, fresh, dialect)
        if (kind == "modified" and recorded is not None and path not in recorded and
                entry.kind == "dir" and not entry.opaque and kind_of(real_st) == "dir"):
            kind = None
        if entry.kind == "dir" and (fresh or kind in ("added", "replaced-dir") or
                                    (kind == "modified" and entry.opaque)):
            fresh_roots.add(path)
        if entry.kind == "dir" and kind == "modified" and not entry.opaque:
            # file -> dir without an opaque mark cannot happen in overlay; treat as fresh anyway
            if real_st is not None and not stat.S_ISDIR(real_st.st_mode):
                fresh_roots.add(path)
        if kind is not None:
            same = None
            if kind == "modified" and entry.kind in ("file", "symlink") and kind_of(real_st) == entry.kind:
                same = same_content(entry, real_path(target, path), real_st)
            changes.append(Change(path, kind, entry, real_st, real_x, same))
    return changes


# -- what a person must see beyond the kind ----------------------------------------------------

ACL_XATTRS = ("system.posix_acl_access", "system.posix_acl_default")
CAPABILITY_XATTR = "security.capability"
_ACL_USER, _ACL_GROUP = 0x02, 0x08


def acl_grants_others(value):
    """Does a POSIX ACL xattr (version 2: 4-byte header, then 8-byte entries of tag, perm,
    id) name a user or group beyond the owner's with any permission? A value we cannot
    parse counts as granting: refuse, never guess."""
    if len(value) < 4 or (len(value) - 4) % 8 or int.from_bytes(value[:4], "little") != 2:
        return True
    for off in range(4, len(value), 8):
        tag = int.from_bytes(value[off:off + 2], "little")
        perm = int.from_bytes(value[off + 2:off + 4], "little")
        if tag in (_ACL_USER, _ACL_GROUP) and perm:
            return True
    return False


def details(entry, real_st, real_xattrs, content_same=None):
    """The facts behind one change as data (see docs/JSON.md): only the keys that apply."""
    out = {}
    new_st = entry.st if entry.kind not in ("whiteout", "invalid") else None
    if new_st is not None:
        out["type"] = type_of(new_st)
    if real_st is not None:
        out["before_type"] = type_of(real_st)
    if new_st is None:
        return out
    if entry.kind == "symlink":
        out["link"] = os.readlink(entry.src)
    if stat.S_ISCHR(new_st.st_mode) or stat.S_ISBLK(new_st.st_mode):
        out["rdev"] = [os.major(new_st.st_rdev), os.minor(new_st.st_rdev)]
    same_type = real_st is not None and type_of(real_st) == out["type"]
    before_mode = stat.S_IMODE(real_st.st_mode) if same_type else None
    after_mode = stat.S_IMODE(new_st.st_mode)
    if entry.kind != "symlink" and before_mode != after_mode:
        out["mode"] = [before_mode, after_mode]
    if real_st is not None and (real_st.st_uid, real_st.st_gid) != (new_st.st_uid, new_st.st_gid):
        out["owner"] = [[real_st.st_uid, real_st.st_gid], [new_st.st_uid, new_st.st_gid]]
    before_x = (real_xattrs or {}) if same_type else {}
    after_x = entry.xattrs or {}
    if before_x != after_x:
        out["xattrs"] = {
            "added": sorted(n for n in after_x if n not in before_x),
            "removed": sorted(n for n in before_x if n not in after_x),
            "changed": sorted(n for n in after_x if n in before_x and after_x[n] != before_x[n])}
    privileged = []
    was = before_mode or 0
    # a set-id bit the session adds, or keeps over new bytes or a new owner (a setuid program
    # swapped for a shell is as new a privilege as a fresh setuid bit)
    swapped = entry.kind != "dir" and (not content_same or "owner" in out)
    if after_mode & stat.S_ISUID and (not was & stat.S_ISUID or swapped):
        privileged.append("setuid")
    if after_mode & stat.S_ISGID and (not was & stat.S_ISGID or swapped):
        privileged.append("setgid")
    if CAPABILITY_XATTR in after_x and after_x[CAPABILITY_XATTR] != before_x.get(CAPABILITY_XATTR):
        privileged.append("file capability")
    if any(n in after_x and after_x[n] != before_x.get(n) and acl_grants_others(after_x[n])
           for n in ACL_XATTRS):
        privileged.append("acl")
    if privileged:
        out["privileged"] = privileged
    if content_same and any(k in out for k in ("mode", "owner", "xattrs")):
        out["metadata_only"] = True
    return out


def describe(change):
    """The words faces print after the path: "link -> /etc/passwd", "fifo",
    "mode 0644 -> 4644, setuid", "owner 0:0 -> 1000:1000", "xattr user.x added"; "" when
    there is nothing to add to the kind."""
    return ", ".join(words(change.details, change.kind))


def words(details, kind=None, arrow="->"):
    """A change's details (or part of them) as the phrases every face shows, in one
    vocabulary; `kind` is the change's kind when known. Text a command chose is escaped."""
    d = details or {}
    out = []
    t, before = d.get("type"), d.get("before_type")
    if t == "symlink" and "link" in d:
        out.append(f"link {arrow} {escape_text(d['link'])}")
    elif t not in (None, "file", "dir", "symlink"):
        out.append(f"{t} {d['rdev'][0]}:{d['rdev'][1]}" if "rdev" in d else t)
    elif kind == "added" and t == "dir":
        out.append("dir")
    if before and t and before != t:
        out.append(f"was a {before}")
    if "mode" in d:
        was, now = d["mode"]
        if was is not None:
            out.append(f"mode {_octal(was)} {arrow} {_octal(now)}")
        elif now & 0o7000:
            out.append(f"mode {_octal(now)}")
    if "owner" in d:
        (u0, g0), (u1, g1) = d["owner"]
        out.append(f"owner {u0}:{g0} {arrow} {u1}:{g1}")
    for verb in ("added", "removed", "changed"):
        for name in (d.get("xattrs") or {}).get(verb, ()):
            label = ("ACL" if name == ACL_XATTRS[0] else "default ACL" if name == ACL_XATTRS[1]
                     else "capability" if name == CAPABILITY_XATTR else f"xattr {escape_text(name)}")
            out.append(f"{label} {verb}")
    out.extend("ACL for another principal" if w == "acl" else w for w in d.get("privileged", ()))
    if d.get("metadata_only"):
        out.append("metadata only")
    return out


def _octal(mode):
    return f"{mode:04o}"


def touched_paths(view):
    """Every path replay would touch: net changes and no-op whiteouts alike."""
    return sorted(view, key=lambda p: p.split("/"))
