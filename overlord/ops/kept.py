"""What a committed session wrote, as per-file diffs read back from what the commit kept:
committed.json's state of every path before and after (txn/retain.py) and the bytes of both
sides in the object store (txn/objects.py). The same shape as ops.patch.file_diff, so the
pages render a committed change exactly as they rendered it while it was staged.

A side whose bytes were not kept (over OVERLORD_OBJECT_MAX, or a commit that could not
record what it replaced) is said in words, never guessed from the folder as it is now.
"""
from overlord.errors import OverlordError
from overlord.ops import patch as _patch
from overlord.ops.review import get_session, log
from overlord.txn import objects, retain


def committed_diff(sid):
    """[file_diff dict] for each path a committed session changed (ops.log's committed
    records, in its order; the changes a partial commit left out are not in the folder and
    have no diff). Each carries `kept`: False when a side's bytes were not retained."""
    session = get_session(sid)
    if session.meta["state"] != "committed":
        raise OverlordError(f"session {sid} is {session.meta['state']}, not committed: "
                            f"`overlord diff {sid}` shows a staged change")
    states = (retain.load(session) or {}).get("paths") or {}
    out = []
    for rec in log(sid):
        if rec.dropped:
            continue
        pair = states.get(rec.path) or {"before": "unknown", "after": "unknown"}
        out.append(_diff(rec, _known(pair.get("before"), rec.before),
                         _known(pair.get("after"), rec.after)))
    return out


def _known(state, sha):
    """A side the commit could not record ("unknown"): a file by provenance's hash, if any."""
    if state == "unknown":
        return {"type": "file", "sha": sha} if sha else None
    return state


def _diff(rec, before, after):
    out = _patch.blank(rec.path, rec.kind, rec.layer)
    out["kept"] = True
    old_kind, new_kind = _kind(before), _kind(after)
    if new_kind == "dir" or (new_kind is None and old_kind == "dir"):
        out["directory"] = True
        out["summary"] = _patch.DIR_WORDS.get(rec.kind, "directory")
        return out
    if "symlink" in (old_kind, new_kind):
        out["summary"] = _patch.link_summary(old_kind, new_kind, _link(before), _link(after))
        return out
    if "other" in (old_kind, new_kind):
        out["summary"] = "a special file (device, fifo or socket)"
        return out
    old, new = _bytes(before), _bytes(after)
    if old is None or new is None:
        out["kept"] = False
        gone = [w for w, side in (("before", old), ("after", new)) if side is None]
        out["summary"] = (f"content not kept ({' and '.join(gone)}): over OVERLORD_OBJECT_MAX "
                          "or not recorded by the commit; the hashes are in the manifest")
        return out
    return _patch.compare(out, rec.kind, old, new)


def _kind(state):
    if not state:
        return None
    return {"file": "file", "symlink": "symlink", "dir": "dir"}.get(state.get("type"), "other")


def _link(state):
    return state.get("target", "?") if state and state.get("type") == "symlink" else None


def _bytes(state):
    """A file side as patch.compare takes it: b"" absent, an int (its size) when too large to
    compare, None when its bytes were not kept."""
    if not state or state.get("type") != "file":
        return b""
    data = objects.read(state.get("sha"))
    if data is None:
        return None
    return len(data) if len(data) > _patch.MAX_BYTES else data
