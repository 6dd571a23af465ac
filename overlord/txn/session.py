"""A session: its directory, its layer stack, and sealing a layer after each command."""
import json
import os
import shutil
import stat
import sys
import time

from overlord.txn import changes as C
from overlord.txn import flatten
from overlord.txn import gitdir
from overlord.txn import layers as L
from overlord.txn import seal as S
from overlord.txn import store

CLOCK_REALTIME_COARSE = 5
# overlayfs stacks at most 500 lower layers and the target is one of them
MAX_SAVEPOINTS = 499


def open_stamp_ns():
    """The session's open stamp, on the kernel's coarse clock: inode times are taken from it
    (or, with multigrain timestamps, from a finer clock that never runs behind it).

    A change after the stamp was read gets a ctime at or above it (compare with >=). To also
    keep every change made before opening strictly below it, wait until the coarse clock has
    passed the precise time at which opening began — it lags by a tick or, on a tickless
    idle CPU, more.
    """
    began = time.clock_gettime_ns(time.CLOCK_REALTIME)
    while True:
        now = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
        if now > began:
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
        if self.meta.get("state") not in ("running", "pending"):
            # the session's end (committed, rolled back, unchanged, timed out): its network
            # namespace holder in this process goes with it (sandbox/netns.py)
            netns = sys.modules.get("overlord.sandbox.netns")
            if netns is not None:
                netns.stop(self.sid)

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
        base = f"{self.dir}/layers/"
        out = []
        for layer in self.meta["layers"]:
            name = layer.get("dir")
            if not (isinstance(name, str) and len(name) == 4 and name.isdigit()):
                raise S.Tampered(f"session {self.sid} has a damaged record: layer {name!r}")
            out.append(base + name)
        return out

    def read_layers(self, indexes=None):
        """[{path: Entry}] bottom first (optionally only the chosen layer indexes), each layer
        verified against its seal first. Git's lock files are left out (self.locks keeps them,
        layer by layer), and so is what path-class selectors drop (`indexes` as
        history.select() returns it: see gitdir.filter_layer)."""
        keep, gone = getattr(indexes, "keep", ()), getattr(indexes, "gone", ())
        out, self.locks = [], []
        for i, d in enumerate(self.layer_dirs()):
            if indexes is None or i in indexes:
                self.verify_layer(i)
                entries, locks = gitdir.filter_layer(L.read_layer(d, self.dialect, i), keep, gone)
                out.append(entries)
                self.locks.append(locks)
        return out

    def verify_layer(self, i):
        S.verify(self.layer_dirs()[i], self.meta["layers"][i].get("seal"), self.sid, i)

    def view(self, indexes=None):
        return L.stack(self.read_layers(indexes))

    def plan(self, indexes=None):
        """[Change] commit would make (changes.Plan: .left_out names the lock files left out)."""
        out = C.plan(self.view(indexes), self.target, self.dialect, self.recorded(indexes))
        out.left_out = self.left_out()
        return out

    def left_out(self):
        """The git lock files the last read_layers() left out that would have been a change."""
        locks = L.stack(getattr(self, "locks", []))
        paths = [ch.path for ch in C.plan(locks, self.target, self.dialect)] if locks else []
        shown = set(paths)
        return [p for p in paths if not any(a in shown for a in L.parents(p))]   # top-most

    def recorded(self, indexes=None, records=None):
        """Every path the provenance of the (chosen) layers names."""
        return {r["path"] for r in (self.provenance() if records is None else records)
                if indexes is None or r.get("layer", 0) in indexes}

    # -- sealing ---------------------------------------------------------------------------

    @property
    def absorbing(self):
        """At the kernel's stack limit the top savepoint takes further commands (every cause
        it absorbs is recorded on it: attribution gets coarser, never silently lost)."""
        return len(self.meta["layers"]) >= MAX_SAVEPOINTS

    def stack_for_next(self):
        """(lower dirs top-most first ending with the target, upper dir) for the next command."""
        dirs = self.layer_dirs()
        if self.absorbing:
            self._snapshot = _signatures(L.read_layer(dirs[-1], self.dialect))
            return self._lowers(dirs[:-1]) + [self.target], dirs[-1]
        upper, _ = self.prepare_upper()
        return self._lowers(dirs) + [self.target], upper

    def _lowers(self, dirs):
        """The sealed layers as the next mount takes them: on the kernel backend one
        flattened directory (see flatten.py), else every layer, top-most first."""
        if self.dialect != "kernel" or len(dirs) < 2:
            return list(reversed(dirs))
        flat = self.path("flat")
        have = self.meta.get("flat", 0) if os.path.isdir(flat) else 0
        if have == 0 or have > len(dirs):
            remove_tree(flat)
            os.mkdir(flat, 0o700)
            have = 0
        for d in dirs[have:]:
            flatten.apply(flat, d, self.dialect, self.target)
        self.meta["flat"] = len(dirs)
        return [flat]

    def drop_flat(self):
        """Before the layers change under it (rewind) or are consumed (commit)."""
        remove_tree(self.path("flat"))
        self.meta.pop("flat", None)

    def _below_dirs(self, count):
        """Top-most first: what the first `count` layers look like to a lookup."""
        if self.meta.get("flat") == count and count >= 2 and os.path.isdir(self.path("flat")):
            return [self.path("flat")]
        return list(reversed(self.layer_dirs()[:count]))

    def prepare_upper(self):
        """A fresh, empty upper (and a work dir, which overlay empties itself on every mount)
        for the next command. The upper's root is what the command sees as the tree root: it
        takes the owner, xattrs and mode the view has now."""
        if os.path.lexists(self.path("upper")):
            remove_tree(self.path("upper"))
        os.mkdir(self.path("upper"), 0o700)
        layers = self.meta["layers"]
        below = self.path("layers", layers[-1]["dir"]) if layers else self.target
        top = L.read_root(below) if layers else os.lstat(self.target)
        upper = self.path("upper")
        if os.geteuid() == 0:
            os.chown(upper, top.st_uid, top.st_gid)
        L.sync_xattrs(upper, L.xattrs(below, self.dialect), self.dialect)
        os.chmod(upper, stat.S_IMODE(top.st_mode))
        return upper, self.path("work")

    def seal(self, cause):
        """Turn the upper written by the last command into the next layer, if it changed
        anything. Returns the new layer's index, or None when the command wrote nothing.
        Cost grows with what the command wrote (and the stack depth), not with the tree."""
        if self.absorbing:
            return self._absorb(cause)
        upper = self.path("upper")
        index = len(self.meta["layers"])
        modes = L.open_up(upper)
        fresh = L.read_layer(upper, self.dialect, index, modes)
        records = self._layer_records(fresh, index, cause)
        if not records:
            remove_tree(upper)
            return None
        name = f"{index:04d}"
        os.makedirs(self.path("layers"), exist_ok=True)
        if modes:
            store.write_json_atomic(L.modes_path(self.path("layers", name)), modes)
        os.rename(upper, self.path("layers", name))
        self.meta["layers"].append({"dir": name, "cause": cause, "paths": len(records),
                                    "sealed": time.time(),
                                    "seal": S.record(self.path("layers", name))})
        store.append_jsonl(self.path("provenance.jsonl"), records)
        return index

    def _absorb(self, cause):
        """Past the stack limit: what the command changed in the top layer, recorded with its
        cause on that layer."""
        index = len(self.meta["layers"]) - 1
        layer = self.meta["layers"][index]
        top = self.path("layers", layer["dir"])
        modes = dict(L.saved_modes(top), **L.open_up(top))
        if modes:
            store.write_json_atomic(L.modes_path(top), modes)
        now = L.read_layer(top, self.dialect, index, modes)
        before = getattr(self, "_snapshot", {})
        changed = {p: e for p, e in now.items() if _signatures({p: e}).get(p) != before.get(p)}
        gone = [p for p in before if p not in now]
        below = self._below_dirs(index)
        records = self._layer_records(changed, index, cause, below)
        records += [{"path": p, "kind": "undone", "layer": index, "caused_by": cause,
                     "before": None, "after": None} for p in gone]
        if not records:
            return None
        for rec in records:
            rec["shared"] = True
        layer.setdefault("causes", [layer["cause"]]).append(cause)
        layer.update(coarse=True, paths=len(now) - 1, sealed=time.time(), seal=S.record(top))
        store.append_jsonl(self.path("provenance.jsonl"), records)
        return index

    def below(self, path, layer_dirs_top_first):
        """(abs path, lstat, from_real) of a path as the layers below see it."""
        where, st = L.resolve(path, layer_dirs_top_first, self.dialect)
        if where == "real":
            real = C.real_path(self.target, path)
            return real, C.lstat_or_none(real), True
        if where is None:
            return None, None, False
        return os.path.join(layer_dirs_top_first[where], path), st, False

    def _layer_records(self, fresh, index, cause, stack_dirs=None):
        """One provenance record per path this layer changed relative to the view below it.

        A path seen through to the real tree is touched for the first time: its real state is
        fingerprinted into the record ("base"), the evidence commit checks drift against."""
        if stack_dirs is None:
            stack_dirs = self._below_dirs(index)
        records = []
        for path in sorted(fresh, key=lambda p: p.split("/")):
            entry = fresh[path]
            # the tree root's attributes below are the top layer's own, never the flat copy's
            dirs = self.layer_dirs()[index - 1:index] if path == "" and index else stack_dirs
            before_abs, before_st, from_real = self.below(path, dirs)
            kind = C.layer_change(entry, before_abs, before_st,
                                  L.xattrs(before_abs, self.dialect) if before_st is not None else None)
            if kind is None:
                continue
            rec = {"path": path, "kind": kind, "layer": index, "caused_by": cause,
                   "before": C.content_hash(before_abs, before_st) if before_st else None,
                   "after": C.content_hash(entry.src, entry.st) if entry.src else None}
            if from_real:
                rec["base"] = fingerprint_of(before_st, rec["before"])
                if (gitdir.is_ref_file(path) and before_st is not None and
                        stat.S_ISREG(before_st.st_mode) and before_st.st_size <= gitdir.PACKED_CAP):
                    keep_base_copy(self, before_abs, rec["before"])   # to name a ref's drift
                if self.meta.get("merge_base") and before_st is not None and stat.S_ISREG(before_st.st_mode):
                    keep_base_copy(self, before_abs, rec["before"])
            records.append(rec)
        return records

    def restored(self):
        """{path: [inode, ctime]} of originals an undone commit put back (see ops.recover)."""
        try:
            with open(self.path("restored.json"), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def provenance(self):
        return store.read_jsonl(self.path("provenance.jsonl"))

    def base(self, records=None):
        """{path: fingerprint or None} of every path first seen through to the real tree."""
        out = {}
        for rec in self.provenance() if records is None else records:
            if "base" in rec and rec["path"] not in out:
                out[rec["path"]] = rec["base"]
        return out


def _signatures(entries):
    """What identifies each entry of a layer, to see what a command changed in place."""
    return {p: (e.kind, e.opaque, e.st.st_ino, e.st.st_size, e.st.st_mtime_ns, e.st.st_ctime_ns,
                e.st.st_mode) if e.st is not None else (e.kind,)
            for p, e in entries.items()}


def fingerprint_of(st, sha):
    if st is None:
        return None
    return {"type": C.kind_of(st), "mode": st.st_mode, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "ino": st.st_ino, "dev": st.st_dev, "sha256": sha}


def keep_base_copy(session, real, sha):
    """For --merge-base: keep the bytes of a touched file as the session first saw them."""
    objdir = session.path("base")
    os.makedirs(objdir, exist_ok=True)
    dest = os.path.join(objdir, sha)
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
