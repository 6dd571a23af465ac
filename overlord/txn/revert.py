"""The inverse of a committed session, built as an overlay layer from its commit record.

`check` compares the tree with what the commit left (committed.json's "after" states): a path
changed again since is a conflict, never overwritten. `stage` writes the "before" states into
an empty upper directory — files from the objects, whiteouts for what the commit created —
which the session machinery then seals like any command's layer, so the undo is reviewed and
committed like any other change.
"""
import hashlib
import os
import stat

from overlord.txn import layers as L
from overlord.txn import objects, retain
from overlord.txn import replay as R

WHITEOUT = stat.S_IFCHR | 0o000


def _order(paths):
    return sorted(paths, key=lambda p: p.split("/") if p else [])


def _changed(state):
    return state["before"] != state["after"]


def check(record, target):
    """([(path, why)] conflicts, {sha: bytes} the undo needs)."""
    paths = record["paths"]
    conflicts, contents = [], {}
    fds = R.DirFds(target)
    try:
        for path in _order(paths):
            state = paths[path]
            if not _changed(state):
                continue
            why = _differs(fds, path, state["after"], state["before"], paths)
            if why:
                conflicts.append((path, why))
                continue
            before = state["before"]
            if before and before["type"] == "file":
                data = objects.read(before.get("sha"))
                if data is None:
                    conflicts.append((path, "its earlier content was not kept (over OVERLORD_OBJECT_MAX "
                                      "or unreadable)"))
                contents[before.get("sha")] = data
            elif before and before["type"] == "other" and not stat.S_ISFIFO(before["mode"]):
                conflicts.append((path, "it was a device node, which cannot be recreated"))
    finally:
        fds.close()
    return conflicts, contents


def _differs(fds, path, after, before, paths):
    """Why the tree no longer holds what the commit left at path (None if it does)."""
    try:
        cur = R.safe_lstat(fds, path)
    except R.ViaSymlink:
        return "a parent directory is now a symlink"
    if after is None:
        return None if cur is None else "it was created again since"
    if cur is None:
        return "it was deleted since"
    kind = {stat.S_IFREG: "file", stat.S_IFLNK: "symlink", stat.S_IFDIR: "dir"}.get(
        stat.S_IFMT(cur.st_mode), "other")
    if kind != after["type"]:
        return f"it is now a {kind}"
    if kind in ("file", "dir") and stat.S_IMODE(cur.st_mode) != after["mode"]:
        return "its mode changed since"
    if kind == "file" and _sha_at(fds, path) != after["sha"]:
        return "it was modified since"
    if kind == "symlink":
        parent, name = R.split(path)
        if os.readlink(name, dir_fd=fds.get(parent)) != after["target"]:
            return "it points elsewhere since"
    if kind == "dir" and before is None:
        # a directory the commit created goes away whole: only if nothing new is inside
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fds.get(path))
        try:
            foreign = [n for n in os.listdir(fd) if (f"{path}/{n}" if path else n) not in paths]
        finally:
            os.close(fd)
        if foreign:
            return f"it holds new entries since ({foreign[0]})"
    return None


def _sha_at(fds, path):
    parent, name = R.split(path)
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fds.get(parent))
    h = hashlib.sha256()
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)
    finally:
        os.close(fd)


def stage(upper, record, target, contents, dialect="kernel"):
    """Write the "before" side of every changed path into an empty upper directory, in the
    overlay dialect of the session that will hold it."""
    opaque = L.KERNEL_OPAQUE[0] if dialect == "kernel" else L.FUSE_OPAQUE[0]
    paths = record["paths"]
    covered = []                # staged as a non-directory: nothing below it is needed
    modes = []                                  # directory modes, set last (deepest first)
    for path in _order(paths):
        state = paths[path]
        before = state["before"]
        if not _changed(state) or any(path.startswith(c + "/") for c in covered):
            continue
        if path == "":
            modes.append((upper, before["mode"]))
            continue
        _parents(upper, path, target, modes, dialect)
        dest = os.path.join(upper, path)
        if not before or before["type"] != "dir":
            covered.append(path)
        if before is None:
            os.mknod(dest, WHITEOUT, 0)
        elif before["type"] == "file":
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, contents[before["sha"]])
            finally:
                os.close(fd)
            _own(dest, before)
            L.sync_xattrs(dest, retain.xattr_values(before), dialect)
            os.chmod(dest, before["mode"])
        elif before["type"] == "symlink":
            os.symlink(before["target"], dest)
            _own(dest, before)
        elif before["type"] == "dir":
            if not os.path.isdir(dest):
                os.mkdir(dest, 0o700)
            if (state["after"] or {}).get("type") != "dir":
                # a directory where the tree has a non-directory: as overlay marks one
                os.setxattr(dest, opaque, b"y")
            _own(dest, before)
            L.sync_xattrs(dest, retain.xattr_values(before), dialect)
            modes.append((dest, before["mode"]))
        else:
            os.mkfifo(dest, stat.S_IMODE(before["mode"]))
            _own(dest, before)
    for dest, mode in sorted(modes, key=lambda m: m[0].count("/"), reverse=True):
        os.chmod(dest, mode)


def _parents(upper, path, target, modes, dialect):
    """Directories above path in the layer, as the view has them (so they are no change)."""
    parts = path.split("/")[:-1]
    for i in range(len(parts)):
        rel = "/".join(parts[:i + 1])
        dest = os.path.join(upper, rel)
        if os.path.isdir(dest):
            continue
        st = os.lstat(os.path.join(target, rel))
        os.mkdir(dest, 0o700)
        _own(dest, {"uid": st.st_uid, "gid": st.st_gid})
        L.sync_xattrs(dest, L.xattrs(os.path.join(target, rel), dialect), dialect)
        modes.append((dest, stat.S_IMODE(st.st_mode)))


def _own(dest, state):
    if os.geteuid() == 0 and state.get("uid") is not None:
        os.chown(dest, state["uid"], state["gid"], follow_symlinks=False)
