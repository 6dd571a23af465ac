"""A session: its directory, its layer stack, and sealing a layer after each command."""
import os
import shutil
import stat
import time

from overlord.txn import changes as C
from overlord.txn import layers as L
from overlord.txn import store

CLOCK_REALTIME_COARSE = 5


def open_stamp_ns():
    """The session's open stamp on the kernel's coarse clock, which is what inode times use.

    Wait for the next tick, so a change made before the session opened has a ctime strictly
    below the stamp and a change made after it has a ctime at or above it (compare with >=).
    """
    first = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
    while True:
        now = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
        if now != first:
            return now
        time.sleep(0.0005)


class Session:
    def __init__(self, meta):
        self.meta = meta
        self.sid = meta["sid"]
        self.dir = store.session_dir(self.sid)

    @classmethod
    def load(cls, sid):
        return cls(store.load_meta(sid))

    def save(self):
        store.save_meta(self.meta)

    @property
    def target(self):
        return self.meta["target"]

    @property
    def dialect(self):
        return self.meta["backend"]

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def layer_dirs(self):
        """Sealed layer directories, bottom first."""
        return [self.path("layers", layer["dir"]) for layer in self.meta["layers"]]

    def read_layers(self, indexes=None):
        """[{path: Entry}] bottom first (optionally only the chosen layer indexes)."""
        out = []
        for i, d in enumerate(self.layer_dirs()):
            if indexes is None or i in indexes:
                out.append(L.read_layer(d, self.dialect, i))
        return out

    def view(self, indexes=None):
        return L.stack(self.read_layers(indexes))

    def plan(self, indexes=None):
        return C.plan(self.view(indexes), self.target)

    # -- sealing ---------------------------------------------------------------------------

    def prepare_upper(self):
        """A fresh, empty upper and work dir for the next command."""
        for name in ("upper", "work"):
            p = self.path(name)
            if os.path.lexists(p):
                remove_tree(p)
            os.mkdir(p, 0o700)
        return self.path("upper"), self.path("work")

    def seal(self, cause):
        """Turn the upper written by the last command into the next layer, if it changed
        anything. Returns the new layer's index, or None when the command wrote nothing."""
        upper = self.path("upper")
        remove_tree(self.path("work"))
        index = len(self.meta["layers"])
        fresh = L.read_layer(upper, self.dialect, index)
        below = self.read_layers()
        records = self._layer_records(fresh, below, index, cause)
        if not records:
            remove_tree(upper)
            return None
        name = f"{index:04d}"
        os.makedirs(self.path("layers"), exist_ok=True)
        os.rename(upper, self.path("layers", name))
        self._record_base(fresh)
        self.meta["layers"].append({"dir": name, "cause": cause, "paths": len(records),
                                    "sealed": time.time()})
        store.append_jsonl(self.path("provenance.jsonl"), records)
        return index

    def _layer_records(self, fresh, below, index, cause):
        """One provenance record per path this layer changed relative to the view below it."""
        below_view = L.stack(below)
        records = []
        for path in sorted(fresh, key=lambda p: p.split("/")):
            entry = fresh[path]
            before_abs, before_st = self._resolve(path, below_view)
            after_st = entry.st
            if entry.kind == "invalid":
                kind = "invalid-whiteout"
            elif entry.kind == "whiteout":
                if before_st is None:
                    continue
                kind = "deleted"
            elif before_st is None:
                kind = "added"
            elif entry.kind == "dir":
                if entry.opaque and stat.S_ISDIR(before_st.st_mode):
                    kind = "replaced-dir"
                elif stat.S_ISDIR(before_st.st_mode) and not C._metadata_differs(entry, before_st, False):
                    continue
                else:
                    kind = "modified"
            else:
                if (C.kind_of(before_st) == entry.kind
                        and not C._metadata_differs(entry, before_st, entry.kind != "symlink")
                        and C._same_content(entry, before_abs, before_st)):
                    continue
                kind = "modified"
            records.append({
                "path": path, "kind": kind, "layer": index, "caused_by": cause,
                "before": C.content_hash(before_abs, before_st) if before_st else None,
                "after": C.content_hash(entry.src, after_st) if entry.src else None,
            })
        return records

    def _resolve(self, path, view):
        """(abs path, lstat) of a path as the layers below see it, or (None, None)."""
        entry = view.get(path)
        if entry is None and any(p in view and L.hides_below(view[p]) for p in L.parents(path)):
            return None, None
        if entry is not None:
            if entry.kind in ("whiteout", "invalid"):
                return None, None
            return entry.src, entry.st
        real = C.real_path(self.target, path)
        return real, C.lstat_or_none(real)

    def _record_base(self, fresh):
        """Fingerprint, on first touch, each path as the real tree has it (drift evidence)."""
        base_path = self.path("base.json")
        base = store_read_json(base_path, {})
        added = False
        for path in fresh:
            if path in base:
                continue
            real = C.real_path(self.target, path)
            base[path] = fingerprint(real)
            added = True
            if self.meta.get("merge_base") and base[path] and base[path]["type"] == "file":
                keep_base_copy(self, path, real, base[path])
        if added:
            store.write_json_atomic(base_path, base)

    def base(self):
        return store_read_json(self.path("base.json"), {})


def store_read_json(path, default):
    import json
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def fingerprint(path):
    st = C.lstat_or_none(path)
    if st is None:
        return None
    return {"type": C.kind_of(st), "mode": st.st_mode, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "ino": st.st_ino, "dev": st.st_dev,
            "sha256": C.content_hash(path, st)}


def keep_base_copy(session, path, real, fp):
    """For --merge-base: keep the bytes of a touched file as the session first saw them."""
    objdir = session.path("base")
    os.makedirs(objdir, exist_ok=True)
    dest = os.path.join(objdir, fp["sha256"])
    if not os.path.exists(dest):
        shutil.copyfile(real, dest, follow_symlinks=False)


def remove_tree(path):
    """Remove a session-owned tree, even one holding mode-000 overlay work dirs."""
    if not os.path.lexists(path):
        return

    def onerror(func, p, _exc):
        parent = os.path.dirname(p)
        try:
            os.chmod(parent, 0o700)
            os.chmod(p, 0o700, follow_symlinks=False)
        except OSError:
            pass
        if func in (os.rmdir, os.unlink):
            func(p)
        else:
            shutil.rmtree(p, ignore_errors=True)
    if os.path.isdir(path) and not os.path.islink(path):
        from overlord.sandbox.executor import make_removable
        make_removable(path)
        shutil.rmtree(path, onerror=onerror)
    else:
        os.unlink(path)
