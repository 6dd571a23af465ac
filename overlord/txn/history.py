"""A session's history as a stack of savepoints: list, rewind, fork, compare, select by cause.

Sealed layers never change, so a fork shares their files by hard links (whiteout devices
and opaque marks are recreated), which makes it cost the number of entries, not their bytes.
"""
import json
import os
import re
import shutil
import stat
import time

from overlord.errors import UsageError
from overlord.text import escape_path
from overlord.txn import changes as C
from overlord.txn import gitdir
from overlord.txn import layers as L
from overlord.txn import store
from overlord.txn.seal import seal_path

SELECTOR = re.compile(r"^(layer|turn|tool|call):(.+)$")


def savepoints(session):
    return [{"n": i, "paths": layer.get("paths", 0), "cause": layer.get("cause"),
             "causes": layer.get("causes", [layer.get("cause")]), "coarse": bool(layer.get("coarse")),
             "pinned": bool(layer.get("pinned")),
             "sealed": layer.get("sealed"), "bytes": layer.get("bytes")}
            for i, layer in enumerate(session.meta["layers"])]


def check_index(session, n, what="--to"):
    count = len(session.meta["layers"])
    if isinstance(n, bool) or not isinstance(n, int):
        raise UsageError(f"{what} takes a savepoint number")
    if not 0 <= n < count:
        span = f"@0..@{count - 1}" if count else "none: the session has no savepoints"
        raise UsageError(f"{what} {n} is out of range (savepoints: {span})")
    return n


def rewind(session, to):
    """Drop every layer above @to. The records of the dropped layers are archived, not lost:
    a rewind is itself an act with provenance."""
    check_index(session, to)
    dropped = session.meta["layers"][to + 1:]
    if not dropped:
        return []
    records = store.read_jsonl(session.path("provenance.jsonl"))
    keep = [r for r in records if r.get("layer", 0) <= to]
    tail = [r for r in records if r.get("layer", 0) > to]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    archive = {"rewound_at": time.time(), "to": to, "layers": dropped, "provenance": tail}
    store.write_json_atomic(session.path(f"rewound-{stamp}-{to}.json"), archive)
    _rewrite_jsonl(session.path("provenance.jsonl"), keep)
    session.drop_flat()
    session.meta["layers"] = session.meta["layers"][:to + 1]
    session.meta.setdefault("rewinds", []).append({"at": time.time(), "to": to, "dropped": len(dropped)})
    session.save()
    for layer in dropped:
        d = session.path("layers", layer["dir"])
        _remove(d)
        _remove(L.modes_path(d))
        _remove(seal_path(d))
    return dropped


def _rewrite_jsonl(path, records):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def _remove(path):
    from overlord.txn.session import remove_tree
    if os.path.lexists(path):
        remove_tree(path)


def copy_layer(src, dst):
    """Copy one sealed layer: files by hard link, directories with their xattrs, whiteout
    devices recreated."""
    os.mkdir(dst, stat.S_IMODE(os.lstat(src).st_mode) | 0o700)
    _copy_xattrs(src, dst)
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        out = dst if rel == "." else os.path.join(dst, rel)
        for name in dirs:
            s, d = os.path.join(root, name), os.path.join(out, name)
            os.mkdir(d, 0o700)
            _copy_xattrs(s, d)
        for name in files:
            s, d = os.path.join(root, name), os.path.join(out, name)
            st = os.lstat(s)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                os.mknod(d, stat.S_IFCHR | 0o000, 0)
            else:
                os.link(s, d, follow_symlinks=False)
    # directory modes last (a read-only one would refuse its own children)
    for root, dirs, _ in os.walk(src, topdown=False):
        for name in dirs:
            s = os.path.join(root, name)
            d = os.path.join(dst, os.path.relpath(s, src))
            os.chmod(d, stat.S_IMODE(os.lstat(s).st_mode))
            st = os.lstat(s)
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    st = os.lstat(src)
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    if os.path.exists(L.modes_path(src)):
        shutil.copyfile(L.modes_path(src), L.modes_path(dst))
    if os.path.exists(seal_path(src)):          # the same entries: the same seal
        shutil.copyfile(seal_path(src), seal_path(dst))


def _copy_xattrs(src, dst):
    """Every xattr a directory carries: the overlay's marks and the session's own alike."""
    for name in os.listxattr(src, follow_symlinks=False):
        try:
            os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False),
                        follow_symlinks=False)
        except OSError:
            pass


def fork_records(session, at):
    return [r for r in store.read_jsonl(session.path("provenance.jsonl")) if r.get("layer", 0) <= at]


# -- compare ---------------------------------------------------------------------------------

def _signature(entry):
    """What a path ends up as in a session's view: type, mode and content."""
    if entry.kind in ("whiteout", "invalid"):
        return (entry.kind,)
    content = C.content_hash(entry.src, entry.st) if entry.src else None
    mode = stat.S_IMODE(entry.st.st_mode) if entry.kind != "symlink" else None
    return (entry.kind, mode, content)


def compare(a, b):
    """[(path, 'same' | 'differs' | 'only in A' | 'only in B')] over the paths either changed."""
    plan_a = {ch.path: ch for ch in a.plan()}
    plan_b = {ch.path: ch for ch in b.plan()}
    out = []
    for path in sorted(set(plan_a) | set(plan_b), key=lambda p: p.split("/")):
        if path not in plan_b:
            out.append((path, "only in A"))
        elif path not in plan_a:
            out.append((path, "only in B"))
        else:
            same = _signature(plan_a[path].entry) == _signature(plan_b[path].entry)
            out.append((path, "same" if same else "differs"))
    return out


# -- commit by cause ---------------------------------------------------------------------------

class Chosen(set):
    """Layer indexes, and the path classes (gitdir.CLASSES) a selection keeps (`keep`: only
    these) or drops (`gone`). Session.read_layers filters each layer by them."""
    keep = frozenset()
    gone = frozenset()

    def classes(self):
        """What the record keeps of the path classes: {"only": [...], "drop": [...]}."""
        return {"only": sorted(self.keep), "drop": sorted(self.gone)}


def select(session, only=(), drop=()):
    """Layer indexes chosen by --only / --drop selectors (layer:N, layer:A-B, turn:N,
    tool:NAME, call:ID; repeatable or comma-separated), and the path class `git` (the files
    under .git/: a Chosen). Savepoint selectors choose layers, class selectors filter the
    paths of the layers chosen: `--only turn:3 --drop git` is turn 3 without its .git/
    files. None when neither is given."""
    if not only and not drop:
        return None
    keep, gone, only, drop = gitdir.path_classes(only, drop)
    count = len(session.meta["layers"])
    chosen = set(range(count)) if not only else set()
    for sel in _split(only):
        chosen |= _match(session, sel)
    for sel in _split(drop):
        chosen -= _match(session, sel)
    if not keep and not gone:
        return chosen
    out = Chosen(chosen)
    out.keep, out.gone = frozenset(keep), frozenset(gone)
    return out


def select_some(session, only, drop, act):
    """select(), refusing (UsageError) selectors that leave no savepoint to `act` on."""
    chosen = select(session, only, drop)
    if chosen is not None and not chosen:
        raise UsageError(f"the selectors leave no savepoint to {act}")
    if isinstance(chosen, Chosen) and chosen.keep & chosen.gone:
        raise UsageError(f"the selectors keep and drop {sorted(chosen.keep & chosen.gone)[0]}: "
                         f"nothing is left to {act}")
    require_consistent(session, chosen)
    return chosen


def require_consistent(session, chosen):
    """Refuse (UsageError) a selection that keeps a savepoint written on top of one it drops.

    A directory in a layer is merged with what lies below it, so a kept layer's directory
    that was made inside (or as a copy of) what a dropped layer put in place of something
    else would land over what that layer had hidden: a tree no command saw. Files are
    whole in the layer that wrote them, and a selection that only drops the top savepoints
    is a rewind, so neither is refused."""
    if chosen is None:
        return
    dropped = set(range(len(session.meta["layers"]))) - set(chosen)
    if not dropped or min(dropped) > max(chosen, default=-1):
        return
    layers = []
    for i, d in enumerate(session.layer_dirs()):
        session.verify_layer(i)
        layers.append(L.read_layer(d, session.dialect, i))
    for k in sorted(i for i in chosen if i > min(dropped)):
        for path, entry in sorted(layers[k].items()):
            if entry.kind != "dir" or entry.opaque or not path:
                continue                       # only a merged directory depends on below
            chain = [path] + L.parents(path)[::-1]
            if any(_replaces(layers, k, x, session.target) for x in chain[1:]):
                continue                       # inside this layer's own replacement
            base = _base(layers, k, chain, session.target)
            if base is not None and base[0] in dropped:
                j, where = base
                raise UsageError(
                    f"the selection keeps savepoint @{k} but drops @{j}, and @{k} changed "
                    f"{escape_path(path)}/ on top of what @{j} put at {escape_path(where)}: "
                    f"without @{j} it would land a tree no command saw; keep @{j} too, or "
                    f"drop @{k}")


def _base(layers, k, chain, target):
    """(layer, path) of the nearest layer below k that replaced a path of chain (a directory
    and its ancestors): what k's directory was made on top of; None: the real tree."""
    for j in range(k - 1, -1, -1):
        for x in chain:
            if _replaces(layers, j, x, target):
                return j, x
    return None


def _replaces(layers, j, path, target):
    """Did layer j put something in place of what lay at path below it?  (A whiteout or a
    non-directory always counts; an opaque directory only over something: overlay may mark a
    new one opaque, and a new directory hides nothing.)"""
    entry = layers[j].get(path)
    if entry is None or not L.hides_below(entry):
        return False
    if entry.kind != "dir":
        return True
    return any(path in below for below in layers[:j]) or os.path.lexists(
        os.path.join(target, path))


def require_class(plan, chosen):
    """--only CLASS over a plan that holds none of it: refused (it would commit nothing of
    what was asked, and the session's other changes would be gone with it)."""
    if isinstance(chosen, Chosen) and "git" in chosen.keep and not any(
            gitdir.is_git(ch.path) for ch in plan):
        raise UsageError("selector 'git' matches no change (the session changed nothing under .git/)")


def _split(items):
    return [s.strip() for item in items or () for s in item.split(",") if s.strip()]


def _match(session, selector):
    m = SELECTOR.match(selector)
    if not m:
        raise UsageError(f"not a selector: {selector!r} (layer:N, layer:A-B, turn:N, tool:NAME, "
                         "call:ID, git)")
    kind, value = m.groups()
    layers = session.meta["layers"]
    if kind == "layer":
        lo, _, hi = value.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise UsageError(f"not a layer selector: {selector!r}")
        found = set(range(int(lo), int(hi or lo) + 1)) & set(range(len(layers)))
    else:
        key = {"turn": "turn", "tool": "tool", "call": "call"}[kind]
        found = {i for i, layer in enumerate(layers)
                 if str((layer.get("cause") or {}).get(key)) == value}
        if kind == "turn" and "-" in value:
            lo, _, hi = value.partition("-")
            if lo.isdigit() and hi.isdigit():
                found = {i for i, layer in enumerate(layers)
                         if str((layer.get("cause") or {}).get("turn", "")).isdigit()
                         and int(lo) <= int(layer["cause"]["turn"]) <= int(hi)}
    if not found:
        raise UsageError(f"selector {selector!r} matches no savepoint")
    return found
