"""Reading sealed overlay layers and stacking them into one view of the session's changes.

A layer is an overlay upper directory. Two dialects exist, and each is read from the markers
its own filesystem writes -- never from a marker a command could have made:
  kernel  whiteout = char device 0/0; opaque dir = xattr user.overlay.opaque / trusted.overlay.
          opaque "y". A command can create neither through the overlay (overlay refuses its
          private xattrs; the seccomp filter refuses mknod of 0/0), so a file the command names
          `.wh.x` is an ordinary file.
  fuse    whiteout = char device 0/0 (fuse-overlayfs makes one where the kernel lets it, which
          is everywhere since 5.8); opaque dir = xattr user.fuseoverlayfs.opaque or
          trusted.overlay.opaque "y", which fuse-overlayfs refuses to let a command set.
          fuse-overlayfs also writes `.wh..wh..opq` (an empty file) and `.wh..opq` (a 0/0
          device) into the directories it marks opaque: those are skipped there. Any other
          `.wh.` name is one a command made through the mount (rename, mkdir, symlink, mkfifo
          are let through) and fuse-overlayfs would read it as a whiteout on the next mount:
          ambiguous, so it is `invalid` and commit refuses it.
Paths are relative to the target root, '/'-separated, decoded with surrogateescape.
"""
import dataclasses
import json
import os
import stat

FUSE_MARKERS = (".wh..wh..opq", ".wh..opq")
KERNEL_OPAQUE = ("user.overlay.opaque", "trusted.overlay.opaque")
FUSE_OPAQUE = ("user.fuseoverlayfs.opaque", "trusted.overlay.opaque")
# The xattrs that are a tree's content: what a command can set and read back, and what
# carries privilege. trusted.* (invisible to a capability-free command, and not copied up by
# an overlay mounted in a user namespace) and security labels other than file capabilities
# (assigned by the host's LSM on creation) are never compared, set or removed.
CONTENT_XATTRS = ("user.", "system.posix_acl_access", "system.posix_acl_default",
                  "security.capability")
# ...less the overlay's own bookkeeping in each dialect
INTERNAL_XATTRS = {"kernel": ("user.overlay.", "trusted.overlay."),
                   "fuse": ("user.fuseoverlayfs.", "trusted.overlay.", "user.containers.",
                            "user.overlay.")}
# Overlay's own names that a command set anyway. The kernel stores a command's user.overlay.X
# escaped, as user.overlay.overlay.X; fuse-overlayfs stores it as it is, hides it from the
# command, and reads user.overlay.opaque as a mark on the next mount. Either way the name
# would mean something to the next overlay that meets it: commit refuses such an entry.
FORGED_XATTRS = {"kernel": ("user.overlay.overlay.",), "fuse": ("user.overlay.",)}


def xattrs(path, dialect=None, follow=False):
    """{name: value} of a path's content xattrs (not followed through a symlink unless
    `follow`: for /proc/self/fd/N of a directory), less the overlay's own in that dialect."""
    return _read_xattrs(path, dialect, follow)[0]


def _read_xattrs(path, dialect, follow=False):
    """(content xattrs, sorted forged names) with one listxattr."""
    internal = INTERNAL_XATTRS.get(dialect, ())
    try:
        names = os.listxattr(path, follow_symlinks=follow)
    except OSError:
        return {}, []
    out = {}
    for name in names:
        if not name.startswith(CONTENT_XATTRS) or name.startswith(internal):
            continue
        try:
            out[name] = os.getxattr(path, name, follow_symlinks=follow)
        except OSError:
            continue
    return out, sorted(n for n in names if n.startswith(FORGED_XATTRS.get(dialect, ())))


def sync_xattrs(path, wanted, dialect=None, follow=False):
    """Make a path's content xattrs exactly `wanted` (removing the others, setting those that
    differ); overlay's own and non-content names are left alone."""
    have = xattrs(path, dialect, follow)
    for name in have:
        if name not in wanted:
            os.removexattr(path, name, follow_symlinks=follow)
    for name, value in wanted.items():
        if have.get(name) != value:
            os.setxattr(path, name, value, follow_symlinks=follow)


@dataclasses.dataclass
class Entry:
    path: str            # relative path in the tree
    kind: str            # whiteout | dir | file | symlink | other | invalid
    src: str = None      # absolute path inside the layer (None for whiteouts)
    st: os.stat_result = None
    opaque: bool = False
    layer: int = None
    xattrs: dict = None  # what the command saw (overlay's own removed); None for whiteouts
    forged: list = None  # overlay-reserved xattr names the command set (commit refuses)


def _xattr_opaque(path, names):
    for name in names:
        try:
            if os.getxattr(path, name, follow_symlinks=False) in (b"y", b"Y", b"1"):
                return True
        except OSError:
            continue
    return False


def _is_whiteout_dev(st):
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def with_mode(st, mode):
    """A copy of a stat result with another st_mode."""
    extra = {n: getattr(st, n) for n in dir(st) if n.startswith("st_")}
    return os.stat_result((mode,) + tuple(st)[1:], extra)


def open_up(layer_dir):
    """Give us search/read/write on every directory of a fresh layer (the command may have
    made one mode 000: as an ordinary user we could not even list it). Returns the modes the
    command set, {path: st_mode}, to keep beside the layer; read_layer reports those."""
    changed = {}
    if os.geteuid() == 0:
        return changed
    todo = [("", layer_dir)]
    while todo:
        rel, absdir = todo.pop()
        st = os.lstat(absdir)
        if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
            os.chmod(absdir, stat.S_IMODE(st.st_mode) | 0o700)
            changed[rel] = st.st_mode
        for entry in os.scandir(absdir):
            if entry.is_dir(follow_symlinks=False):
                todo.append((f"{rel}/{entry.name}" if rel else entry.name, entry.path))
    return changed


def modes_path(layer_dir):
    return layer_dir.rstrip("/") + ".modes.json"


def saved_modes(layer_dir):
    try:
        with open(modes_path(layer_dir), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def read_root(layer_dir):
    """The lstat of a layer's root as the view reports it."""
    st = os.lstat(layer_dir)
    mode = saved_modes(layer_dir).get("")
    return st if mode is None else with_mode(st, mode)


def read_layer(layer_dir, dialect, index=None, modes=None):
    """All entries of one layer: {path: Entry}. Cost grows with the layer, not the tree."""
    modes = saved_modes(layer_dir) if modes is None else modes
    root_st = os.lstat(layer_dir)
    opaque_names = KERNEL_OPAQUE if dialect == "kernel" else FUSE_OPAQUE
    # the root carries the tree root's own mode (a chmod of "." is a change like any other)
    if "" in modes:
        root_st = with_mode(root_st, modes[""])
    entries = {"": Entry("", "dir", layer_dir, root_st, layer=index,
                         xattrs=xattrs(layer_dir, dialect))}
    if _xattr_opaque(layer_dir, opaque_names):
        # an opaque root would mean "the whole tree is gone": never replayable
        entries[""] = Entry("", "invalid", layer=index)
    todo = [("", layer_dir)]
    while todo:
        rel, absdir = todo.pop()
        opaque = entries[rel].opaque
        for name in os.listdir(absdir):
            src = os.path.join(absdir, name)
            path = f"{rel}/{name}" if rel else name
            st = os.lstat(src)
            if dialect == "fuse" and name.startswith(".wh."):
                if opaque and _is_own_marker(name, st):
                    continue
                entries[path] = Entry(path, "invalid", src, st, layer=index)
                continue
            if _is_whiteout_dev(st):
                entries[path] = Entry(path, "whiteout", layer=index)
            elif stat.S_ISDIR(st.st_mode):
                if path in modes:
                    st = with_mode(st, modes[path])
                entries[path] = Entry(path, "dir", src, st, _xattr_opaque(src, opaque_names), index,
                                      *_read_xattrs(src, dialect))
                todo.append((path, src))
            else:
                kind = ("file" if stat.S_ISREG(st.st_mode) else
                        "symlink" if stat.S_ISLNK(st.st_mode) else "other")
                content, forged = _read_xattrs(src, dialect)
                entries[path] = Entry(path, kind, src, st, layer=index, xattrs=content,
                                      forged=forged)
    return entries


def _is_own_marker(name, st):
    """fuse-overlayfs's own marks inside a directory it made opaque."""
    if name == ".wh..wh..opq":
        return stat.S_ISREG(st.st_mode) and st.st_size == 0
    return name == ".wh..opq" and _is_whiteout_dev(st)


def parents(path):
    """'a/b/c' -> ['a', 'a/b']"""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def hides_below(entry):
    """Does this entry hide everything under its path in the layers below it?"""
    return entry.kind in ("whiteout", "file", "symlink", "other", "invalid") or (
        entry.kind == "dir" and entry.opaque)


def stack(layers):
    """Merge layers (a list, bottom first, of {path: Entry}) into the top-most view.

    Returns {path: Entry} where each path is decided by the highest layer naming it, and
    entries hidden by a whiteout, an opaque dir or a non-dir above them are dropped. A
    directory that a lower layer made replace something (an opaque dir, or a dir over a
    whiteout or non-dir) still replaces it when a later layer copies it up: the view's entry
    is marked opaque, as overlay itself reads the stack.
    """
    view, hidden = {}, set()
    for entries in reversed(layers):                      # top-most first
        for path, entry in entries.items():
            if path in hidden or any(p in hidden for p in parents(path)):
                continue
            top = view.get(path)
            if top is None:
                view[path] = entry
            elif (top.kind == "dir" and not top.opaque and entry.kind != "invalid"
                  and hides_below(entry)):
                # a later layer copied up a directory this layer made replace what is below
                view[path] = dataclasses.replace(top, opaque=True)
        for path in entries:
            if path in view and hides_below(view[path]):
                hidden.add(path)
    return view


def split_links(layers, view):
    """Paths whose hard-link group in one layer was split by a later layer's copy-up of
    another of its names. fuse-overlayfs keeps one node per underlying inode, so such names
    show whichever version it looked up first: what the command saw is not determined by the
    layers, and commit must refuse rather than guess."""
    out = []
    for i, entries in enumerate(layers):
        groups = {}
        for path, e in entries.items():
            if e.kind == "file" and e.st.st_nlink > 1:
                groups.setdefault(e.st.st_ino, []).append(path)
        for paths in groups.values():
            live = [p for p in paths if view.get(p) is entries[p]]
            if not live:
                continue
            # a later layer's copy-up of another name splits the group, even when that name
            # was renamed or removed afterwards: the copy is what fuse may show for the rest
            copied = [p for p in paths if view.get(p) is not entries[p] and any(
                later.get(p) is not None and later[p].kind == "file" for later in layers[i + 1:])]
            if copied:
                out.extend(live + copied)
    return sorted(set(out))


def _layer_hides(layer_dir, rel, dialect):
    """Does this layer hide what lies at rel below it?  (whiteout, non-dir or opaque dir)"""
    p = os.path.join(layer_dir, rel)
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISDIR(st.st_mode):
        return True
    return _xattr_opaque(p, FUSE_OPAQUE if dialect == "fuse" else KERNEL_OPAQUE)


def resolve(path, layer_dirs, dialect):
    """Where a path's content lives in a stack (layer_dirs top-most first).

    Returns (index into layer_dirs, lstat) for a layer holding it, (None, None) when a layer
    removes or hides it, or ("real", None) when no layer says anything: the real tree decides.
    Costs a few lstats per layer, independent of the size of the layers or the tree.
    """
    ancestors = parents(path)
    for i, layer_dir in enumerate(layer_dirs):
        p = os.path.join(layer_dir, path)
        try:
            st = os.lstat(p)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None:
            if _is_whiteout_dev(st):
                return None, None
            return i, st
        if any(_layer_hides(layer_dir, a, dialect) for a in ancestors):
            return None, None
    return "real", None
