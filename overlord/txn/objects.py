"""Content-addressed file versions under OVERLORD_HOME/objects: what a commit wrote and what
it replaced, kept so blame can name each line's author and revert can put the old bytes back.

An object is named by the sha256 of its bytes. Two forms, both only ever added:
  loose   objects/<2 hex>/<62 hex>, read-only: the files a commit replaced (renamed in,
          no copy) and larger written files (copied in the kernel);
  packed  the small files one commit wrote, appended to objects/packs/<sid>.pack with an
          index <sid>.idx (JSON {sha: [offset, length]}) written last: a commit of ten
          thousand small files adds two files, not ten thousand.
A crash leaves at most a temp file or a pack without its index, both ignored. A file larger
than OVERLORD_OBJECT_MAX bytes (default 16 MiB) is not kept: its hash is still recorded, and
blame and revert say the content was not retained. Every read is checked against its name.

An object never shares an inode with a file anyone can still write: a file is renamed in
only when nothing else links to it (the replaced originals), otherwise copied.
"""
import errno
import hashlib
import json
import os
import stat

from overlord.errors import UsageError
from overlord.linux import libc
from overlord.txn import changes as C
from overlord.txn import store

DEFAULT_MAX = 16 << 20
PACK_SMALL = 64 << 10          # files up to this size a commit wrote go into its pack


def object_max():
    raw = os.environ.get("OVERLORD_OBJECT_MAX")
    if raw is None or raw == "":
        return DEFAULT_MAX
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"OVERLORD_OBJECT_MAX must be a number of bytes, not {raw!r}")
    return value


def root():
    return os.path.join(store.home(), "objects")


def path_of(sha):
    return os.path.join(root(), sha[:2], sha[2:])


def read(sha):
    """The bytes of an object, or None when it was not retained (or fails its check)."""
    if not sha:
        return None
    try:
        with open(path_of(sha), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = _read_packed(sha)
    if data is None or hashlib.sha256(data).hexdigest() != sha:
        return None
    return data


def _read_packed(sha):
    packs = os.path.join(root(), "packs")
    try:
        names = sorted(n for n in os.listdir(packs) if n.endswith(".idx"))
    except FileNotFoundError:
        return None
    for name in names:
        try:
            with open(os.path.join(packs, name), encoding="utf-8") as f:
                where = json.load(f).get(sha)
            if where is None:
                continue
            with open(os.path.join(packs, name[:-4] + ".pack"), "rb") as f:
                f.seek(where[0])
                return f.read(where[1])
        except (OSError, ValueError):
            continue
    return None


class Keeper:
    """Adds the objects of one commit (pack name: its sid); `finish()` writes the pack's
    index and makes everything durable with one syncfs."""

    def __init__(self, name):
        self.limit = object_max()
        self.root = root()
        self.name = store.check_sid(name)
        self.tmpdir = os.path.join(self.root, "tmp")
        self.made = set()
        self.count = 0
        self.wrote = False
        self.pack = None
        self.index = {}
        self.offset = 0

    def has(self, sha):
        return sha in self.index or os.path.exists(f"{self.root}/{sha[:2]}/{sha[2:]}")

    def _mkdir(self, d):
        if d not in self.made:
            os.makedirs(d, mode=0o700, exist_ok=True)
            self.made.add(d)

    def _tmp(self):
        self._mkdir(self.tmpdir)
        self.count += 1
        return os.path.join(self.tmpdir, f"{os.getpid()}-{self.name}-{self.count}")

    def copy(self, path, st, sha=None):
        """Keep the bytes of a regular file of ours (a layer's). With its sha256 known (from
        provenance) it is not hashed again. Returns the sha256."""
        small = st.st_size <= PACK_SMALL
        if sha is not None and (st.st_size > self.limit or sha in self.index or
                                (not small and self.has(sha))):
            return sha
        with C.readable(path):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if small and st.st_size <= self.limit:
                return self._append(os.read(fd, st.st_size + 1), sha)
            if sha is None:
                return self.copy_fd(fd)
            tmp = self._tmp()
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
            try:
                while os.copy_file_range(fd, out, 1 << 30):
                    pass
            finally:
                os.close(out)
            return self._settle(tmp, sha)
        finally:
            os.close(fd)

    def put_bytes(self, data):
        if len(data) > self.limit:
            return hashlib.sha256(data).hexdigest()
        return self._append(data, None)

    def _append(self, data, sha):
        sha = sha or hashlib.sha256(data).hexdigest()
        if sha in self.index:
            return sha
        if self.pack is None:
            packs = os.path.join(self.root, "packs")
            self._mkdir(packs)
            for ext in (".pack", ".idx"):      # left by an attempt a crash undid
                try:
                    os.unlink(os.path.join(packs, self.name + ext))
                except FileNotFoundError:
                    pass
            self.pack = os.open(os.path.join(packs, self.name + ".pack"),
                                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
        os.write(self.pack, data)
        self.index[sha] = [self.offset, len(data)]
        self.offset += len(data)
        return sha

    def copy_fd(self, fd):
        """Hash an open file; keep a loose copy when it is within the cap."""
        keep = os.fstat(fd).st_size <= self.limit
        tmp = self._tmp() if keep else None
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400) if keep else None
        h = hashlib.sha256()
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                h.update(chunk)
                if out is not None:
                    os.write(out, chunk)
        finally:
            if out is not None:
                os.close(out)
        sha = h.hexdigest()
        if keep:
            self._settle(tmp, sha)
        return sha

    def take_at(self, dfd, name):
        """Keep a file nothing will use again (a replaced original, a consumed layer's file):
        renamed in when it is its only link and on our filesystem, else copied. Returns its
        sha256, or None if it is not a regular file or cannot be read."""
        st = os.lstat(name, dir_fd=dfd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_nlink == 1 and st.st_size <= self.limit:
            tmp = self._tmp()
            try:
                os.rename(name, tmp, src_dir_fd=dfd)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
            else:
                # what we renamed is what we lstat'ed only if nobody swapped it meanwhile
                moved = os.lstat(tmp)
                if stat.S_ISREG(moved.st_mode) and moved.st_ino == st.st_ino:
                    os.chmod(tmp, 0o400)
                    return self._settle(tmp, C.sha256_file(tmp))
                os.unlink(tmp)
                return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except PermissionError:
            return None           # an unreadable original (mode 000): not retained
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return self.copy_fd(fd)
        finally:
            os.close(fd)

    def _settle(self, tmp, sha):
        d = f"{self.root}/{sha[:2]}"
        self._mkdir(d)
        # an object of that name has the same bytes: replacing it is harmless
        os.rename(tmp, f"{d}/{sha[2:]}")
        self.wrote = True
        return sha

    def finish(self):
        if self.pack is not None:
            os.close(self.pack)
            self.pack = None
            idx = os.path.join(self.root, "packs", self.name + ".idx")
            tmp = idx + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(self.index, separators=(",", ":")))
            os.chmod(tmp, 0o400)
            os.rename(tmp, idx)     # a crash may leave it naming unwritten bytes: reads check
            self.wrote = True
        if self.wrote:
            libc.syncfs(self.root)

    def abandon(self):
        """The commit did not happen: drop the pack it started."""
        if self.pack is not None:
            os.close(self.pack)
            self.pack = None
            try:
                os.unlink(os.path.join(self.root, "packs", self.name + ".pack"))
            except FileNotFoundError:
                pass
