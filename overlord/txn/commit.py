"""Before commit replays: drift on every path replay would touch, and the three-way merge."""
import dataclasses
import os
import stat
import subprocess

from overlord.errors import Conflict
from overlord.text import escape_path, escape_text
from overlord.txn import changes as C
from overlord.txn import gitdir
from overlord.txn import layers as L
from overlord.txn.replay import DirFds, ViaSymlink, safe_lstat
from overlord import hosttools

SPLIT_LINK = "hard link split across savepoints (the fuse backend showed either version)"
FORGED = "an overlay xattr set by the command"
UNFORCEABLE = ("via a symlink", "whiteout names the tree root", "invalid whiteout", SPLIT_LINK,
               FORGED)


@dataclasses.dataclass
class Drift:
    path: str
    reason: str

    @property
    def forceable(self):
        return not self.reason.startswith(UNFORCEABLE)

    def __str__(self):
        return f"{self.reason}: {escape_path(self.path)}"


def check_drift(session, view, records=None, layers=None):
    """Every way the real tree moved under the session, on every path replay would touch.

    Evidence: the kernel's ctime (no process can set it) against the open stamp, plus the
    fingerprint taken when the session first touched the path. A directory that merely
    contains changes is only checked for type: unrelated files may come and go beside them.
    """
    stamp = session.meta["open_stamp_ns"]
    base = session.base(records)
    restored = session.restored()
    drifts = []
    if session.dialect == "fuse" and layers is not None:
        drifts.extend(Drift(p, SPLIT_LINK) for p in L.split_links(layers, view))
    fds = DirFds(session.target)
    replaced = set()          # what opaque directories replace wholesale
    try:
        for path in C.touched_paths(view):
            entry = view[path]
            # what no replay may take, wherever it is
            if entry.kind == "invalid":
                drifts.append(Drift(path, "whiteout names the tree root" if path == ""
                                    else "invalid whiteout"))
                continue
            if entry.forged:
                drifts.append(Drift(path, f"{FORGED} ({escape_text(', '.join(entry.forged))})"))
                continue
            if any(p in replaced for p in L.parents(path)):
                continue              # what is below goes with its parent, checked there
            try:
                cur = safe_lstat(fds, path)
            except ViaSymlink:
                drifts.append(Drift(path, "via a symlink"))
                continue
            if entry.kind == "dir" and entry.opaque and cur is not None:
                replaced.add(path)
            ours = cur is not None and restored.get(path) == [cur.st_ino, cur.st_ctime_ns]
            reason = _path_drift(entry, cur, base.get(path, "unknown"), 0 if ours else stamp)
            if reason:
                drifts.append(Drift(path, reason))
            elif cur is not None and stat.S_ISDIR(cur.st_mode) and _removes_real_dir(entry):
                drifts.extend(_descendant_drift(session.target, path, stamp))
    finally:
        fds.close()
    # a ref file's drift named by its ref and values; a loose ref made outside for a ref the
    # session moved in packed-refs (see gitdir.ref_drifts)
    return gitdir.ref_drifts(session, view, drifts, Drift)


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
    if (stamp and cur.st_ctime_ns >= stamp) or (known and _moved(before, cur)):
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


def privileged(plan):
    """[(path, [what])] for every change that adds a setuid/setgid bit, a file capability or
    an ACL granting another principal."""
    return [(ch.path, ch.details["privileged"]) for ch in plan if ch.details.get("privileged")]


def refuse_privileged(found):
    path, what = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    err = Conflict(f"commit refused: adds {' and '.join(what)}: {escape_path(path)}{more}; "
                   "--allow-privileged-modes overrides")
    err.privileged = found
    raise err


def refuse_if_drift(drifts, force, merge_base=False):
    hard = [d for d in drifts if not d.forceable]
    soft = [d for d in drifts if d.forceable]
    if hard or (soft and not force):
        shown = hard + ([] if force else soft)
        first = shown[0]
        more = f" (and {len(shown) - 1} more)" if len(shown) > 1 else ""
        hint = "" if hard else "; commit --force overrides"
        hint += ("; commit --merge may merge it (the session kept base copies)" if hint and merge_base
                 and any(d.reason == "modified-externally" for d in soft) else "")
        err = Conflict(f"commit refused: {first}{more}{hint}")
        err.drifts = shown
        raise err


# -- three-way merge --------------------------------------------------------------------------

def three_way(session, drifts, view):
    """Merge non-overlapping external edits into the session's version of each drifted file.

    Returns {path: merged bytes}; raises Conflict when any drift cannot be merged.
    """
    git = hosttools.find("git")        # ops.commit refused --merge without it already
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


