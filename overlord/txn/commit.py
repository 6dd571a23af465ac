"""Commit: check for drift on every path replay would touch, then replay onto the real tree.

Replay never follows a symlink: every parent directory is opened component by component with
O_NOFOLLOW relative to the target root, so a path that now runs through a symlink is refused
and nothing is written outside the target. Files land through temp file + rename.
"""
import dataclasses
import errno
import os
import secrets
import shutil
import stat
import subprocess

from overlord.errors import Conflict, OverlordError
from overlord.txn import changes as C
from overlord.txn import layers as L

UNFORCEABLE = ("via a symlink", "whiteout names the tree root", "invalid whiteout")


@dataclasses.dataclass
class Drift:
    path: str
    reason: str

    @property
    def forceable(self):
        return self.reason not in UNFORCEABLE

    def __str__(self):
        return f"{self.reason}: {self.path}"


class ViaSymlink(Exception):
    pass


class DirFds:
    """Cache of O_NOFOLLOW directory fds under the target root."""

    def __init__(self, target):
        self.fds = {"": os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)}

    def get(self, dirpath, create_mode=None):
        if dirpath in self.fds:
            return self.fds[dirpath]
        parent, _, name = dirpath.rpartition("/")
        pfd = self.get(parent, create_mode)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ViaSymlink(dirpath) from None
            raise
        self.fds[dirpath] = fd
        return fd

    def forget(self, path):
        """A directory at path (and everything under it) was removed or replaced."""
        for key in [k for k in self.fds if k == path or k.startswith(path + "/")]:
            os.close(self.fds.pop(key))

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def parent_and_name(path):
    parent, _, name = path.rpartition("/")
    return parent, name


def safe_lstat(fds, path):
    """lstat a path without following a symlink anywhere; ViaSymlink if a parent is one."""
    parent, name = parent_and_name(path)
    try:
        pfd = fds.get(parent)
    except FileNotFoundError:
        return None
    try:
        return os.lstat(name, dir_fd=pfd)
    except FileNotFoundError:
        return None


def check_drift(session, view):
    """Every way the real tree moved under the session, on every path replay would touch.

    Evidence: the kernel's ctime (no process can set it) against the open stamp, plus the
    fingerprint taken when the session first touched the path. A directory that merely
    contains changes is only checked for type: unrelated files may come and go beside them.
    """
    stamp = session.meta["open_stamp_ns"]
    base = session.base()
    drifts = []
    fds = DirFds(session.target)
    try:
        for path in C.touched_paths(view):
            entry = view[path]
            if entry.kind == "invalid":
                parent = path.rpartition("/")[0]
                drifts.append(Drift(path, "whiteout names the tree root" if not parent
                                    else "invalid whiteout"))
                continue
            try:
                cur = safe_lstat(fds, path)
            except ViaSymlink:
                drifts.append(Drift(path, "via a symlink"))
                continue
            reason = _path_drift(entry, cur, base.get(path, "unknown"), stamp)
            if reason:
                drifts.append(Drift(path, reason))
            elif cur is not None and stat.S_ISDIR(cur.st_mode) and _removes_real_dir(entry):
                drifts.extend(_descendant_drift(session.target, path, stamp))
    finally:
        fds.close()
    return drifts


def _path_drift(entry, cur, before, stamp):
    known = before != "unknown"
    if cur is None:
        return "deleted-externally" if known and before is not None and entry.kind != "whiteout" else None
    if known and before is None:
        return "created-externally"
    if entry.kind == "dir" and not entry.opaque:
        if not stat.S_ISDIR(cur.st_mode):
            return "modified-externally"
        if known and stat.S_IMODE(before["mode"]) != stat.S_IMODE(cur.st_mode):
            return "modified-externally"
        return None
    if cur.st_ctime_ns >= stamp or (known and _moved(before, cur)):
        return "modified-externally"
    return None


def _moved(before, cur):
    return (before["ino"], before["dev"], before["size"], before["mtime_ns"], before["mode"]) != (
        cur.st_ino, cur.st_dev, cur.st_size, cur.st_mtime_ns, cur.st_mode)


def _removes_real_dir(entry):
    """Replay removes the real directory here (whiteout, type change or replaced dir)."""
    return entry.kind != "dir" or entry.opaque


def _descendant_drift(target, path, stamp):
    """A directory replay will remove: anything under it that appeared or changed since open."""
    out = []
    for root, dirs, files in os.walk(C.real_path(target, path)):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = C.lstat_or_none(p)
            if st is not None and st.st_ctime_ns >= stamp:
                out.append(Drift(os.path.relpath(p, target), "appeared-after-snapshot"))
    return out


def refuse_if_drift(drifts, force):
    hard = [d for d in drifts if not d.forceable]
    soft = [d for d in drifts if d.forceable]
    if hard or (soft and not force):
        shown = hard + ([] if force else soft)
        first = shown[0]
        more = f" (and {len(shown) - 1} more)" if len(shown) > 1 else ""
        hint = "" if hard else "; commit --force overrides"
        err = Conflict(f"commit refused: {first}{more}{hint}")
        err.drifts = shown
        raise err


# -- replay ----------------------------------------------------------------------------------

def replay(target, view, merged=None, consume=False):
    """Make the real tree equal the session's view on every path the view names.

    merged: {path: bytes} for files whose content is a three-way merge result.
    consume: the layers are discarded afterwards, so a file may be moved (one rename) from
    its layer into place instead of copied, when both are on one filesystem.
    """
    merged = merged or {}
    fds = DirFds(target)
    move = consume
    dir_times = []
    try:
        for path in C.touched_paths(view):
            entry = view[path]
            if entry.kind == "invalid":
                raise OverlordError(f"refusing an invalid whiteout: {path}")
            parent, name = parent_and_name(path)
            pfd = fds.get(parent)
            cur = _lstat_at(pfd, name)
            if entry.kind == "whiteout":
                if cur is not None:
                    _remove(fds, pfd, path, name, cur)
                continue
            if entry.kind == "dir":
                if cur is not None and (not stat.S_ISDIR(cur.st_mode) or entry.opaque):
                    _remove(fds, pfd, path, name, cur)
                    cur = None
                if cur is None:
                    os.mkdir(name, 0o700, dir_fd=pfd)
                _apply_meta(pfd, name, entry.st)
                dir_times.append((path, entry.st))
                continue
            if cur is not None and stat.S_ISDIR(cur.st_mode):
                _remove(fds, pfd, path, name, cur)
            if move and path not in merged:
                move = _move_into_place(pfd, name, entry)
                if move:
                    continue
            _place(pfd, name, entry, merged.get(path))
        # directory times last, deepest first: creating children moved them
        for path, st in reversed(dir_times):
            parent, name = parent_and_name(path)
            os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=fds.get(parent),
                     follow_symlinks=False)
        _syncfs(fds.fds[""])
    finally:
        fds.close()


def _lstat_at(pfd, name):
    try:
        return os.lstat(name, dir_fd=pfd)
    except FileNotFoundError:
        return None


def _remove(fds, pfd, path, name, cur):
    if stat.S_ISDIR(cur.st_mode):
        fds.forget(path)
        _make_writable(pfd, name)
        shutil.rmtree(name, dir_fd=pfd)
    else:
        os.unlink(name, dir_fd=pfd)


def _make_writable(pfd, name):
    """rmtree needs to list and unlink inside every directory, even mode-000 ones."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    try:
        os.chmod(fd, 0o700)
        for child in os.scandir(fd):
            if child.is_dir(follow_symlinks=False):
                _make_writable(fd, child.name)
    except PermissionError:
        pass
    finally:
        os.close(fd)


def _move_into_place(pfd, name, entry):
    """rename(2) the layer's file over the real one: atomic, no bytes copied. False when the
    layer is on another filesystem (then every file is copied)."""
    for attr in os.listxattr(entry.src, follow_symlinks=False):
        if attr.startswith(("user.overlay.", "trusted.overlay.", "user.fuseoverlayfs.")):
            os.removexattr(entry.src, attr, follow_symlinks=False)
    try:
        os.rename(entry.src, name, dst_dir_fd=pfd)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return False
        raise
    return True


def _tmp_name(name):
    return f".{name[:60]}.ovl-{secrets.token_hex(4)}"


def _place(pfd, name, entry, merged_bytes):
    """Write a file, symlink or node as a temp name in its parent, then rename over."""
    tmp = _tmp_name(name)
    st = entry.st
    if entry.kind == "file":
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=pfd)
        try:
            if merged_bytes is not None:
                os.write(out, merged_bytes)
            else:
                _copy_bytes(entry.src, out, st.st_size)
            if os.geteuid() == 0:
                os.fchown(out, st.st_uid, st.st_gid)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        except BaseException:
            os.close(out)
            os.unlink(tmp, dir_fd=pfd)
            raise
        os.close(out)
    elif entry.kind == "symlink":
        os.symlink(os.readlink(entry.src), tmp, dir_fd=pfd)
        if os.geteuid() == 0:
            os.chown(tmp, st.st_uid, st.st_gid, dir_fd=pfd, follow_symlinks=False)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=pfd, follow_symlinks=False)
    else:
        os.mknod(tmp, st.st_mode, st.st_rdev, dir_fd=pfd)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=pfd, follow_symlinks=False)
    os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)


def _copy_bytes(src, out, size):
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        left = size
        while left > 0:
            try:
                n = os.copy_file_range(fd, out, left)
            except OSError:
                n = 0
            if n == 0:
                break
            left -= n
        while True:     # fallback (and anything past the size stat saw)
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            os.write(out, chunk)
    finally:
        os.close(fd)


def _apply_meta(pfd, name, st):
    if os.geteuid() == 0:
        os.chown(name, st.st_uid, st.st_gid, dir_fd=pfd, follow_symlinks=False)
    os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=pfd)


def _syncfs(fd):
    from overlord.linux import libc
    try:
        libc.libc().syncfs(fd)
    except (AttributeError, OSError):
        os.sync()


# -- three-way merge --------------------------------------------------------------------------

def three_way(session, drifts, view):
    """Merge non-overlapping external edits into the session's version of each drifted file.

    Returns {path: merged bytes}; raises Conflict when any drift cannot be merged.
    """
    git = shutil.which("git")
    if not git:
        raise OverlordError("commit --merge needs git (git merge-file); install git")
    base = session.base()
    out = []
    merged = {}
    for d in drifts:
        entry = view.get(d.path)
        fp = base.get(d.path)
        ok = (d.reason == "modified-externally" and entry is not None and entry.kind == "file"
              and fp and fp.get("type") == "file")
        real = C.real_path(session.target, d.path)
        base_copy = session.path("base", fp["sha256"]) if ok else None
        if not ok or not os.path.exists(base_copy) or not os.path.isfile(real) or os.path.islink(real):
            out.append(d)
            continue
        proc = subprocess.run([git, "merge-file", "-p", "-q", real, base_copy, entry.src],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if proc.returncode != 0:
            out.append(Drift(d.path, "overlapping edits"))
            continue
        merged[d.path] = proc.stdout
    if out:
        err = Conflict(f"commit --merge refused: {out[0]}" + (f" (and {len(out) - 1} more)" if len(out) > 1 else ""))
        err.drifts = out
        raise err
    return merged


__all__ = ["check_drift", "refuse_if_drift", "replay", "three_way", "Drift", "L"]
