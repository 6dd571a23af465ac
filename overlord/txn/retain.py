"""The record a commit leaves behind: for every path it touched, the state before and after
(type, mode, sha256 or link text), with the bytes of both sides kept as objects.

`committed.json` in the session directory is what `revert` inverts; the objects, together
with each layer's provenance, are what `blame` walks. A state is None for "absent".
"""
import base64
import hashlib
import json
import os
import stat

from overlord.txn import changes as C
from overlord.txn import layers as L
from overlord.txn import store

READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def link_state(text, st):
    return dict(_owner(st), type="symlink", target=text,
                sha=hashlib.sha256(os.fsencode(text)).hexdigest())


def _owner(st):
    return {"uid": st.st_uid, "gid": st.st_gid}


def _with_xattrs(state, values):
    """A state's content xattrs, base64, when it has any (revert writes them back)."""
    if values:
        state["xattrs"] = {k: base64.b64encode(v).decode("ascii") for k, v in sorted(values.items())}
    return state


def xattr_values(state):
    return {k: base64.b64decode(v) for k, v in ((state or {}).get("xattrs") or {}).items()}


def written(keeper, view, merged, records):
    """Before replay: the state every touched path will have, keeping each file's bytes
    (copied: the layer's file itself is about to be moved into the tree). records: the
    session's provenance, whose hashes spare hashing the files again."""
    known = {(r["path"], r.get("layer", 0)): r.get("after") for r in records if r.get("after")}
    out = {}
    for path in C.touched_paths(view):
        entry = view[path]
        st = entry.st
        if entry.kind == "whiteout":
            out[path] = None
        elif entry.kind == "file":
            sha = keeper.put_bytes(merged[path]) if path in merged else \
                keeper.copy(entry.src, st, known.get((path, entry.layer)))
            out[path] = _with_xattrs(dict(_owner(st), type="file", mode=stat.S_IMODE(st.st_mode),
                                          sha=sha), entry.xattrs)
        elif entry.kind == "symlink":
            out[path] = link_state(os.readlink(entry.src), st)
        elif entry.kind == "dir":
            out[path] = _with_xattrs(dict(_owner(st), type="dir", mode=stat.S_IMODE(st.st_mode)),
                                     entry.xattrs)
        elif entry.kind == "other":
            out[path] = dict(_owner(st), type="other", mode=st.st_mode, rdev=st.st_rdev)
    return out


def replaced(keeper, bfd, steps):
    """After replay, before the backup is dropped: the state every touched path had, taking
    the replaced files into the object store instead of deleting them."""
    out = {}
    for n, step in enumerate(steps):
        path = step["path"]
        if not step["existed"]:
            out.setdefault(path, None)
            continue
        try:
            os.lstat(str(n), dir_fd=bfd)
        except FileNotFoundError:
            if step["dir"]:               # a directory replay kept in place
                out.setdefault(path, dict({"type": "dir", "mode": stat.S_IMODE(step["mode"]),
                                           "uid": step.get("uid"), "gid": step.get("gid")},
                                          **({"xattrs": step["xattrs"]} if step.get("xattrs") else {})))
            continue
        _walk(keeper, bfd, str(n), path, out)
    return out


def _walk(keeper, dfd, name, path, out):
    st = os.lstat(name, dir_fd=dfd)
    values = L.xattrs(f"/proc/self/fd/{dfd}/{name}") if not stat.S_ISLNK(st.st_mode) else None
    if stat.S_ISREG(st.st_mode):
        out[path] = _with_xattrs(dict(_owner(st), type="file", mode=stat.S_IMODE(st.st_mode)),
                                 values)
        out[path]["sha"] = keeper.take_at(dfd, name)
    elif stat.S_ISLNK(st.st_mode):
        out[path] = link_state(os.readlink(name, dir_fd=dfd), st)
    elif stat.S_ISDIR(st.st_mode):
        out[path] = _with_xattrs(dict(_owner(st), type="dir", mode=stat.S_IMODE(st.st_mode)),
                                 values)
        try:
            fd = os.open(name, READ_DIR, dir_fd=dfd)
        except PermissionError:            # a mode-000 directory of the caller's own
            os.chmod(name, 0o700, dir_fd=dfd)
            fd = os.open(name, READ_DIR, dir_fd=dfd)
        try:
            for child in os.listdir(fd):
                _walk(keeper, fd, child, f"{path}/{child}" if path else child, out)
        finally:
            os.close(fd)
    else:
        out[path] = dict(_owner(st), type="other", mode=st.st_mode, rdev=st.st_rdev)


def layer_versions(keeper, session, chosen, records):
    """Each committed layer's own version of a file (blame's intermediate steps), taken from
    the layers before they are dropped."""
    if not keeper.limit:
        return
    for rec in records:
        sha, layer = rec.get("after"), rec.get("layer", 0)
        if not sha or (chosen is not None and layer not in chosen) or keeper.has(sha):
            continue
        if layer >= len(session.meta["layers"]):
            continue
        parent, _, name = rec["path"].rpartition("/")
        d = session.path("layers", session.meta["layers"][layer]["dir"], parent)
        try:
            fd = os.open(d, READ_DIR)
        except OSError:
            continue
        try:
            keeper.take_at(fd, name)
        except OSError:
            pass
        finally:
            os.close(fd)


def save(session, before, after, keeper):
    paths = {p: {"before": before.get(p) if before is not None else "unknown", "after": after[p]}
             for p in after}
    for p, state in (before or {}).items():
        paths.setdefault(p, {"before": state, "after": None})
    store.write_json_atomic(session.path("committed.json"),
                            {"paths": paths, "object_max": keeper.limit, "complete": before is not None})


def load(session):
    try:
        with open(session.path("committed.json"), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def base_copies(keeper, session):
    """With --merge-base the session kept the bytes it first saw; a merged commit replaced
    something else (the outside edit), so these are the only copy of that first version."""
    try:
        fd = os.open(session.path("base"), READ_DIR)
    except FileNotFoundError:
        return
    try:
        for name in os.listdir(fd):
            keeper.take_at(fd, name)
    finally:
        os.close(fd)
