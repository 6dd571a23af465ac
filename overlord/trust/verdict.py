"""The second model's verdicts, bound to exactly what it reviewed.

A verdict carries the fingerprint of the plan the reviewer was shown: sha256 over the sorted
rows [kind, path, before, after, details, xattrs] of every change, where before is the content hash
(overlord.txn.changes.content_hash) of the real side, after that of the session's side
(change.entry.src), None for directories and whiteouts, and details the change's facts
(types, link, mode, owner, xattrs) as canonical JSON and xattrs a digest of the session side's
extended attributes, names and values -- so a mode, owner or xattr change made after the
review makes it stale too. A rewind, an exec that writes, a resume, or committing
another selection (--only/--drop) gives another plan and so another fingerprint.

A verdict as session.meta["reviews"] keeps it (oldest first):

    {"n", "ts", "verdict": "approve" | "reject" | "no-verdict", "reason", "paths",
     "fingerprint", "selection": {"only": [...], "drop": [...]} | None, "partial",
     "unseen": [paths the dossier omitted or truncated], "read": [paths read whole],
     "reviewer": "provider:model", "agent": "provider:model" | None, "same_model", "turns"}

Standing (what a commit may rely on): among the verdicts whose fingerprint is the plan's,
`approval` is the newest approval on a complete view (it countersigns) and `rejection` the
newest rejection (it blocks unless --force). Both may stand at once: a later approval of the
same fingerprint never clears a rejection -- asking models until one agrees is not a review --
only a change to what is committed (which makes the rejection stale) or --force does.
"""
import hashlib
import json
import os
import stat
import time

from overlord.txn import changes as C
from overlord.txn.seal import seal_path

VERDICTS = ("approve", "reject", "no-verdict")


# -- the fingerprint ------------------------------------------------------------------------------

def canonical(value):
    """Canonical JSON: sorted keys, no spaces, ASCII (a lone surrogate from an odd name is
    written as its escape, so every value has exactly one form)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def rows(target, plan):
    """[[kind, path, before, after, details-json, xattrs-digest]] of a plan, in plan order."""
    sealed = _SealedHashes()
    out = []
    for ch in plan:
        before = C.content_hash(C.real_path(target, ch.path), ch.real) if ch.real is not None else None
        after = sealed.get(ch.entry) if ch.entry.src else None
        out.append([ch.kind, ch.path, before, after, canonical(ch.details),
                    _xattr_digest(ch.entry.xattrs)])
    return out


def _xattr_digest(values):
    """sha256 of the session side's xattrs, names and values: details names what changed,
    this binds what it changed to (an ACL rewritten after the review is another plan)."""
    if not values:
        return None
    h = hashlib.sha256()
    for name in sorted(values):
        value = values[name]
        h.update(b"%d:%s%d:" % (len(name), name.encode("utf-8", "surrogateescape"), len(value)))
        h.update(value)
    return h.hexdigest()


def fingerprint_rows(plan_rows):
    data = canonical(sorted(plan_rows, key=lambda r: (r[1].split("/"), r[0])))
    return hashlib.sha256(data.encode("ascii")).hexdigest()


def fingerprint_plan(target, plan):
    """sha256 hex of what a plan changes (see the module doc)."""
    return fingerprint_rows(rows(target, plan))


class _SealedHashes:
    """The session side's content hash. A regular file's is taken from its layer's seal record
    (written when the layer was sealed, and checked against the layer's entries before any plan
    is built from it), so fingerprinting does not hash the session's bytes a second time; a
    file the record does not match is hashed."""

    def __init__(self):
        self.seals = {}

    def get(self, entry):
        st = entry.st
        if st is None:
            return None
        if stat.S_ISREG(st.st_mode):
            want = self._sealed(entry)
            if want is not None:
                return want
        return C.content_hash(entry.src, st)

    def _sealed(self, entry):
        src, path = entry.src, entry.path
        if not path or not src.endswith("/" + path):
            return None
        layer_dir = src[:-len(path) - 1]
        if layer_dir not in self.seals:
            try:
                with open(seal_path(layer_dir), encoding="utf-8") as f:
                    self.seals[layer_dir] = json.load(f).get("entries") or {}
            except (OSError, ValueError):
                self.seals[layer_dir] = {}
        rec = self.seals[layer_dir].get(path)
        st = entry.st
        if (isinstance(rec, list) and len(rec) == 7 and rec[0] == "file"
                and rec[4] == st.st_size and isinstance(rec[5], str) and len(rec[5]) == 64):
            return rec[5]
        return None


# -- the record and its standing ------------------------------------------------------------------

def model_id(provider, model):
    return f"{provider}:{model}" if provider else None


def agent_model(meta):
    """The agent's "provider:model" recorded on a session; None for a `run` session."""
    settings = meta.get("agent") or {}
    provider = (settings.get("endpoint") or {}).get("provider")
    return model_id(provider, settings.get("model")) if provider else None


def record(n, verdict, reason, paths, fingerprint, selection, unseen, read, reviewer, agent,
           same_model, turns):
    """A verdict as the session keeps it."""
    if verdict not in VERDICTS:
        raise ValueError(f"not a verdict: {verdict!r}")
    unseen, read = sorted(set(unseen or ())), sorted(set(read or ()))
    return {"n": n, "ts": round(time.time(), 3), "verdict": verdict, "reason": reason or "",
            "paths": list(paths or ()), "fingerprint": fingerprint, "selection": selection,
            "partial": bool(set(unseen) - set(read)), "unseen": unseen, "read": read,
            "reviewer": reviewer, "agent": agent, "same_model": bool(same_model), "turns": turns}


def selection(only=(), drop=()):
    """The --only/--drop a review (or commit) was given, as a verdict records it (None: all)."""
    only, drop = [s for s in only or () if s], [s for s in drop or () if s]
    return {"only": only, "drop": drop} if only or drop else None


def fresh(v, fingerprint):
    return bool(fingerprint) and v.get("fingerprint") == fingerprint


def complete(v):
    return not v.get("partial", True)


def standing(reviews, fingerprint):
    """(approval, rejection): the newest fresh approval on a complete view, and the newest
    fresh rejection; either None."""
    approval = rejection = None
    for v in reviews or ():
        if not fresh(v, fingerprint):
            continue
        if v.get("verdict") == "approve" and complete(v):
            approval = v
        elif v.get("verdict") == "reject":
            rejection = v
    return approval, rejection


def review_path(session_dir):
    return os.path.join(session_dir, "review.jsonl")
