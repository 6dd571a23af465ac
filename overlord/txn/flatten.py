"""A session's sealed layers merged into one directory, so a command mounts two lower layers
(this and the target) instead of hundreds.

Mounting an overlay costs the kernel time per lower layer (about 5 µs to add each, and as
much again to build and tear the mount down): at 400 savepoints that is most of a command's
overhead. The layers stay exactly as they are — diff, commit and rewind read them — and this
directory is only the view the next command starts from. It is kept up to date by applying
each newly sealed layer (cost: that layer's entries; files are hard links, never copies), and
thrown away on rewind and before commit, to be rebuilt on demand.

Applying a layer follows overlay's rules for a lower stack: a whiteout removes what is below
and stays as a whiteout (the target may still hold the name); a non-directory replaces
whatever was there; a directory merges with a directory below, except when opaque or when it
replaces a non-directory or whiteout, in which case it is marked opaque so the target's
directory of that name cannot show through.
"""
import os
import shutil
import stat

from overlord.txn import layers as L

OPAQUE = "user.overlay.opaque"
WHITEOUT = stat.S_IFCHR | 0o000


def apply(flat, layer_dir, dialect, target):
    """Merge one sealed layer onto the flattened view."""
    entries = L.read_layer(layer_dir, dialect)
    dirs = []                                   # attributes set last: linking children
    for path in sorted(entries, key=lambda p: p.split("/")):   # would move their times
        if path == "":
            continue
        entry = entries[path]
        dest = os.path.join(flat, path)
        cur = _lstat(dest)
        if entry.kind == "invalid":
            continue
        if entry.kind == "dir":
            dirs.append((dest, entry))
            if cur is not None and stat.S_ISDIR(cur.st_mode) and not entry.opaque:
                continue
            replaced = cur is not None          # a whiteout or non-dir below: hide the target
            if cur is not None:
                _remove(dest, cur)
            os.mkdir(dest, 0o700)
            if entry.opaque or replaced:
                os.setxattr(dest, OPAQUE, b"y")
            continue
        if cur is not None:
            _remove(dest, cur)
        if entry.kind == "whiteout":
            # overlay lists a directory that only one lower holds as it is, whiteouts and
            # all: keep one only where it hides something in the target
            if _target_has(flat, target, path):
                os.mknod(dest, WHITEOUT, 0)
        elif entry.kind == "file":
            os.link(entry.src, dest, follow_symlinks=False)
        elif entry.kind == "symlink":
            os.symlink(os.readlink(entry.src), dest)
            _owner(dest, entry.st)
            os.utime(dest, ns=(entry.st.st_atime_ns, entry.st.st_mtime_ns), follow_symlinks=False)
        else:
            os.mknod(dest, entry.st.st_mode, entry.st.st_rdev)
            _owner(dest, entry.st)
    for dest, entry in reversed(dirs):
        _attrs(dest, entry, dialect)


def _target_has(flat, target, path):
    """Does the target hold something at path that the flattened view lets show through?
    (Walked without following a symlink; an opaque directory above hides it.)"""
    parts = path.split("/")
    for i in range(1, len(parts)):
        above = os.path.join(flat, *parts[:i])
        if _opaque(above):
            return False
        st = _lstat(os.path.join(target, *parts[:i]))
        if st is None or not stat.S_ISDIR(st.st_mode):
            return False
    return _lstat(os.path.join(target, path)) is not None


def _opaque(path):
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _lstat(path):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _remove(path, st):
    if stat.S_ISDIR(st.st_mode):
        os.chmod(path, 0o700)
        for root, dirs, _ in os.walk(path):
            for d in dirs:
                if not os.path.islink(os.path.join(root, d)):
                    os.chmod(os.path.join(root, d), 0o700)
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _owner(path, st):
    if os.geteuid() == 0:
        os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)


def _attrs(path, entry, dialect):
    """A directory takes the top-most layer's owner, xattrs, mode and times, as overlay shows
    it. (Our own access is kept: later layers must still be linked in below it.)"""
    st = entry.st
    _owner(path, st)
    L.sync_xattrs(path, entry.xattrs or {}, dialect)
    os.chmod(path, stat.S_IMODE(st.st_mode) | (0o700 if os.geteuid() else 0))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
