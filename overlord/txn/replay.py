"""Replay a stacked view onto the real tree: all or nothing, even across a crash.

Safety: every parent directory is opened component by component with O_NOFOLLOW relative to
a descriptor of the target root, so nothing is written through a symlink or outside the
target. Files land by rename(2): moved out of their layer when it shares the target's
filesystem, else copied to a temp name beside them first.

Atomicity: before the first change a journal (OVERLORD_HOME/journal/<sid>.json) lists every
step; the bytes a step replaces stay reachable in a backup directory inside the target (a
hard link for files, the directory itself for trees), so a crash at any instant can be
undone by `recover()`, which the next overlord command runs. Only after everything is on disk
(syncfs) is the journal marked done; then the backup is dropped.
"""
import base64
import errno
import json
import os
import shutil
import stat

from overlord.errors import OverlordError
from overlord.linux import libc
from overlord.txn import changes as C
from overlord.txn import layers as L
from overlord.txn import store

DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ViaSymlink(Exception):
    pass


class DirFds:
    """Cache of directory fds under the target root, opened one component at a time with
    O_NOFOLLOW. O_PATH: traversal needs no read permission."""

    def __init__(self, target):
        self.target = target
        self.fds = {"": os.open(target, DIR_FLAGS)}

    def get(self, dirpath):
        """The fd of a directory; ViaSymlink if a component is a symlink, FileNotFoundError if
        a component is missing or is not a directory."""
        if dirpath in self.fds:
            return self.fds[dirpath]
        parent, _, name = dirpath.rpartition("/")
        pfd = self.get(parent)
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if stat.S_ISLNK(os.lstat(name, dir_fd=pfd).st_mode):
                raise ViaSymlink(dirpath) from None
            raise FileNotFoundError(errno.ENOENT, "a parent is not a directory", dirpath) from None
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


def split(path):
    parent, _, name = path.rpartition("/")
    return parent, name


def lstat_at(pfd, name):
    try:
        return os.lstat(name, dir_fd=pfd)
    except FileNotFoundError:
        return None


def safe_lstat(fds, path):
    """lstat without following a symlink anywhere; ViaSymlink if a parent is one."""
    if path == "":
        return os.fstat(fds.get(""))
    parent, name = split(path)
    try:
        pfd = fds.get(parent)
    except FileNotFoundError:
        return None
    return lstat_at(pfd, name)


# -- the journal -----------------------------------------------------------------------------

journal_dir = store.journal_dir


def journal_path(sid):
    return os.path.join(journal_dir(), f"{store.check_sid(sid)}.json")


def backup_name(sid):
    return f".overlord-txn-{sid}"


class Journal:
    """The step list of one replay, written before the first change."""

    def __init__(self, sid, target):
        self.sid, self.target = sid, target
        self.data = {"sid": sid, "target": target, "state": "applying", "backup": backup_name(sid),
                     "steps": []}

    def save(self):
        os.makedirs(journal_dir(), mode=0o700, exist_ok=True)
        store.write_json_atomic(journal_path(self.sid), self.data, sort_keys=False)
        store.fsync_dir(journal_dir())

    def finish(self):
        """Everything is on disk: from here recovery completes the commit, never undoes it
        (so the step list is no longer needed)."""
        self.data = {k: v for k, v in self.data.items() if k != "steps"}
        self.data.update(state="done", steps=[])
        self.save()


# -- replay ------------------------------------------------------------------------------------

def plan_steps(fds, view, merged):
    """One step per touched path: what is there now, and what replay will do to it."""
    steps, replaced = [], set()
    for path in C.touched_paths(view):
        entry = view[path]
        # below a directory replay replaces, the real entries go with it: nothing is there
        cur = None if any(p in replaced for p in L.parents(path)) else safe_lstat(fds, path)
        if entry.kind == "dir" and entry.opaque and cur is not None:
            replaced.add(path)
        steps.append({"path": path, "kind": entry.kind, "existed": cur is not None,
                      "dir": bool(cur is not None and stat.S_ISDIR(cur.st_mode)),
                      "mode": cur.st_mode if cur is not None else None,
                      "times": [cur.st_atime_ns, cur.st_mtime_ns] if cur is not None else None,
                      "ino": cur.st_ino if cur is not None else None,
                      "uid": cur.st_uid if cur is not None else None,
                      "gid": cur.st_gid if cur is not None else None,
                      "src": entry.src, "merged": path in merged,
                      # a directory kept in place may have its xattrs rewritten: keep them
                      "xattrs": _b64_xattrs(fds, path) if entry.kind == "dir" and cur is not None
                      and stat.S_ISDIR(cur.st_mode) else None,
                      # what replay puts here, to tell it from an edit made after a crash
                      "new": [entry.st.st_size, entry.st.st_mtime_ns]
                      if entry.kind in ("file", "symlink", "other") and path not in merged else None})
    return steps


def _b64_xattrs(fds, path):
    where = f"/proc/self/fd/{fds.get(path)}"
    return {k: base64.b64encode(v).decode() for k, v in L.xattrs(where, follow=True).items()}


def replay(sid, target, view, merged=None, consume=False, on_done=None, dialect="kernel",
           recorded=None):
    """Make the real tree equal the view on every path the view names, atomically.

    merged: {path: bytes} for files whose content is a three-way merge result.
    dialect: the layers' overlay dialect (whose own xattrs never reach the tree).
    recorded: the paths the session's provenance names; a directory kept in place that is not
    among them only contains changes, and keeps the real tree's owner, xattrs and mode.
    consume: the layers are discarded afterwards, so files may be moved out of them.
    on_done: called once the commit is final and journaled as done, with the backup
    directory's fd and the steps — to record the commit before the journal goes and to keep
    what was replaced before the backup is dropped. A crash inside it is completed by
    recovery; its errors do not undo the commit.
    """
    merged = merged or {}
    fds = DirFds(target)
    journal = Journal(sid, target)
    bfd = None
    try:
        journal.data["steps"] = plan_steps(fds, view, merged)
        _open_layer_dirs(view, journal)
        journal.save()
        bfd = _make_backup_dir(fds, sid)
        move = consume
        for n, step in enumerate(journal.data["steps"]):
            move = _apply(fds, bfd, n, step, view[step["path"]], merged.get(step["path"]), move, sid,
                          dialect)
        for step in reversed(journal.data["steps"]):     # deepest first: children moved them
            if step["kind"] == "dir":
                if _kept_as_is(step, view[step["path"]], recorded):
                    # its own mode back (children needed ours); its times are the session's
                    where, st = f"/proc/self/fd/{fds.get(step['path'])}", view[step["path"]].st
                    os.chmod(where, stat.S_IMODE(step["mode"]))
                    if step["path"]:
                        os.utime(where, ns=(st.st_atime_ns, st.st_mtime_ns))
                else:
                    _finish_dir(fds, step["path"], view[step["path"]], dialect)
        libc.syncfs(target)
        steps = journal.data["steps"]
        journal.finish()
    except BaseException:
        if bfd is not None:
            os.close(bfd)
        fds.close()
        undo(journal.data)
        raise
    try:
        if on_done:
            on_done(bfd, steps)
    finally:
        os.close(bfd)
        fds.close()
    settle(journal.data)


def _open_layer_dirs(view, journal):
    """Moving a file out of a read-only layer directory needs write permission on it."""
    opened = []
    seen = set()
    for entry in view.values():
        if not entry.src or entry.kind == "dir":
            continue
        d = os.path.dirname(entry.src)
        if d in seen:
            continue
        seen.add(d)
        st = os.lstat(d)
        if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
            opened.append([d, stat.S_IMODE(st.st_mode)])
    journal.data["layer_modes"] = opened
    for d, mode in opened:
        os.chmod(d, mode | 0o700)


def _make_backup_dir(fds, sid):
    root = fds.get("")
    name = backup_name(sid)
    if lstat_at(root, name) is not None:
        _rmtree_at(fds, root, name)
    os.mkdir(name, 0o700, dir_fd=root)
    return os.open(name, DIR_FLAGS, dir_fd=root)


def _apply(fds, bfd, n, step, entry, merged_bytes, move, sid, dialect):
    path = step["path"]
    if entry.kind == "invalid":         # commit refuses these first: never replayed
        raise OverlordError(f"invalid whiteout: {path}")
    if path == "":                      # the target root itself: only its mode can change
        os.chmod(fds.target, stat.S_IMODE(entry.st.st_mode) | 0o700)
        return move
    parent, name = split(path)
    pfd = fds.get(parent)
    cur = lstat_at(pfd, name)
    if entry.kind == "whiteout":
        if cur is not None:
            _set_aside(fds, pfd, bfd, n, path, name, cur)
        return move
    if entry.kind == "dir":
        if cur is not None and (not stat.S_ISDIR(cur.st_mode) or entry.opaque):
            _set_aside(fds, pfd, bfd, n, path, name, cur)
            cur = None
        if cur is None:
            os.mkdir(name, 0o700, dir_fd=pfd)
        else:
            os.chmod(name, stat.S_IMODE(cur.st_mode) | 0o700, dir_fd=pfd)   # final mode at the end
        return move
    if cur is not None:
        if stat.S_ISDIR(cur.st_mode):
            _set_aside(fds, pfd, bfd, n, path, name, cur)
        else:
            os.link(name, str(n), src_dir_fd=pfd, dst_dir_fd=bfd, follow_symlinks=False)
    # a file another session's layer shares (a fork's hard link) is copied: moving it would
    # make that layer and the real tree one inode
    if move and merged_bytes is None and entry.st.st_nlink == 1:
        if _move_into_place(pfd, name, entry, dialect):
            return True
        move = False
    _place(pfd, name, entry, merged_bytes, f".{name[:40]}.ovl-{sid[-6:]}-{n}")
    return move


def _set_aside(fds, pfd, bfd, n, path, name, cur):
    """Keep what replay removes (a file by a hard link, a tree by moving it) until done."""
    if stat.S_ISDIR(cur.st_mode):
        fds.forget(path)
        os.rename(name, str(n), src_dir_fd=pfd, dst_dir_fd=bfd)
    else:
        os.link(name, str(n), src_dir_fd=pfd, dst_dir_fd=bfd, follow_symlinks=False)
        os.unlink(name, dir_fd=pfd)


def _kept_as_is(step, entry, recorded):
    """A real directory the session only wrote inside: its own attributes are the tree's."""
    return (recorded is not None and step["path"] not in recorded and step["dir"]
            and not entry.opaque)


def _finish_dir(fds, path, entry, dialect):
    """A directory's owner, xattrs, mode and times, as the session saw them (owner first: a
    chown clears setgid and capabilities; mode last: an ACL write moves the group bits)."""
    st = entry.st
    fd = fds.get(path)
    where = f"/proc/self/fd/{fd}"
    if os.geteuid() == 0 and path != "":
        os.chown(where, st.st_uid, st.st_gid)
    L.sync_xattrs(where, entry.xattrs or {}, dialect, follow=True)     # a directory's fd
    os.chmod(where, stat.S_IMODE(st.st_mode))
    if path != "":
        os.utime(where, ns=(st.st_atime_ns, st.st_mtime_ns))


def _move_into_place(pfd, name, entry, dialect):
    """rename(2) the layer's file over the real one: atomic, no bytes copied. False when the
    layer is on another filesystem (then files are copied)."""
    own = [a for a in os.listxattr(entry.src, follow_symlinks=False)
           if a.startswith(L.INTERNAL_XATTRS[dialect])]
    if own:
        # removing a user.* xattr needs write permission: the session's mode may lack it
        mode = stat.S_IMODE(entry.st.st_mode)
        if not os.access(entry.src, os.W_OK, follow_symlinks=False):
            os.chmod(entry.src, mode | 0o200)
        for attr in own:
            os.removexattr(entry.src, attr, follow_symlinks=False)
        os.chmod(entry.src, mode)
    try:
        os.rename(entry.src, name, dst_dir_fd=pfd)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return False
        raise
    return True


def _place(pfd, name, entry, merged_bytes, tmp):
    """Write a file, symlink or node under a temp name in its parent, then rename over."""
    st = entry.st
    if lstat_at(pfd, tmp) is not None:
        os.unlink(tmp, dir_fd=pfd)
    if entry.kind == "file":
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=pfd)
        try:
            if merged_bytes is not None:
                os.write(out, merged_bytes)
            else:
                with C.readable(entry.src):
                    _copy_bytes(entry.src, out)
            if os.geteuid() == 0:
                os.fchown(out, st.st_uid, st.st_gid)
            for xname, value in (entry.xattrs or {}).items():
                os.setxattr(out, xname, value)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
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


def _copy_bytes(src, out):
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while True:
            try:
                n = os.copy_file_range(fd, out, 1 << 30)
            except OSError:
                break
            if n == 0:
                return
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            os.write(out, chunk)
    finally:
        os.close(fd)


def _rmtree_at(fds, pfd, name):
    _make_writable(pfd, name)
    shutil.rmtree(name, dir_fd=pfd)


def _make_writable(pfd, name):
    """rmtree needs to list and unlink inside every directory, even mode-000 ones."""
    try:
        fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    except OSError:
        return
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
        rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            for child in os.scandir(rfd):
                if child.is_dir(follow_symlinks=False):
                    _make_writable(rfd, child.name)
        finally:
            os.close(rfd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- undo and recovery -----------------------------------------------------------------------

def undo(data):
    """Put the tree back as it was before an unfinished replay, step by step in reverse."""
    target = data["target"]
    try:
        fds = DirFds(target)
    except OSError:
        return
    try:
        broot = lstat_at(fds.get(""), data["backup"])
        bfd = os.open(data["backup"], DIR_FLAGS, dir_fd=fds.get("")) if broot else None
        for n in reversed(range(len(data["steps"]))):
            _undo_step(fds, bfd, n, data["steps"][n], data["sid"])
        if bfd is not None:
            os.close(bfd)
        for d, mode in data.get("layer_modes", []):
            try:
                os.chmod(d, mode)
            except OSError:
                pass
        libc.syncfs(target)
    finally:
        fds.close()
    settle(data)


def _undo_step(fds, bfd, n, step, sid):
    path = step["path"]
    if path == "":
        if step.get("xattrs") is not None:
            L.sync_xattrs(f"/proc/self/fd/{fds.get('')}",
                          {k: base64.b64decode(v) for k, v in step["xattrs"].items()}, follow=True)
        if step["mode"] is not None:
            os.chmod(fds.target, stat.S_IMODE(step["mode"]))
        return
    parent, name = split(path)
    try:
        pfd = fds.get(parent)
    except (FileNotFoundError, ViaSymlink):
        return
    tmp = f".{name[:40]}.ovl-{sid[-6:]}-{n}"
    if lstat_at(pfd, tmp) is not None:
        os.unlink(tmp, dir_fd=pfd)
    saved = lstat_at(bfd, str(n)) if bfd is not None else None
    cur = lstat_at(pfd, name)
    # the inode the journal recorded is still here: this step never replaced it
    original_here = cur is not None and step["existed"] and cur.st_ino == step["ino"]
    if original_here:
        if step["dir"]:          # only its xattrs, mode and times may have moved
            if step.get("xattrs") is not None:
                where = f"/proc/self/fd/{fds.get(path)}"
                L.sync_xattrs(where, {k: base64.b64decode(v) for k, v in step["xattrs"].items()},
                              follow=True)
            os.chmod(name, stat.S_IMODE(step["mode"]), dir_fd=pfd)
            os.utime(name, ns=tuple(step["times"]), dir_fd=pfd, follow_symlinks=False)
        return
    if cur is not None and not _take_back(fds, pfd, path, name, cur, step):
        return
    if saved is not None:
        os.rename(str(n), name, src_dir_fd=bfd, dst_dir_fd=pfd)


def _take_back(fds, pfd, path, name, cur, step):
    """Remove what replay put at a path (a file moved out of a layer goes back there).
    Returns False, touching nothing, when what is there now is someone else's: an edit made
    between the crash and this recovery is never clobbered."""
    if stat.S_ISDIR(cur.st_mode):
        fds.forget(path)
        try:
            os.rmdir(name, dir_fd=pfd)      # its own entries were taken back before it
        except OSError:
            return False                     # something else was put inside meanwhile
        return True
    if step.get("new") is None or [cur.st_size, cur.st_mtime_ns] != step["new"]:
        return False
    src = step.get("src")
    if src and not os.path.lexists(src):
        os.rename(name, src, src_dir_fd=pfd)
    else:
        os.unlink(name, dir_fd=pfd)
    return True


def settle(data):
    """The replay is settled (done or undone): remove its backup and journal."""
    try:
        fds = DirFds(data["target"])
        try:
            root = fds.get("")
            if lstat_at(root, data["backup"]) is not None:
                _rmtree_at(fds, root, data["backup"])
        finally:
            fds.close()
    except OSError:
        pass
    try:
        os.unlink(journal_path(data["sid"]))
    except FileNotFoundError:
        pass


def pending_journals():
    try:
        names = sorted(os.listdir(journal_dir()))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if ".tmp" in name:              # a journal write a crash cut short: never renamed in
            try:
                os.unlink(os.path.join(journal_dir(), name))
            except OSError:
                pass
            continue
        if name.endswith(".json"):
            try:
                with open(os.path.join(journal_dir(), name), encoding="utf-8") as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return out
