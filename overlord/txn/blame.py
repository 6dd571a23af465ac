"""Blame: every line of a file with the session, layer and cause (turn, tool call, task) that
first produced it.

The history of a path is the chain of versions its committed layers recorded (provenance
keeps each layer's before/after hash; objects keep the bytes). Walking it in commit order,
each version is diffed against the previous one: kept lines keep their owner, new lines get
the layer's cause. Lines older than the record are `origin`; lines changed outside OVERLORD
(between commits, or since the last one) are `drift`; lines whose history cannot be rebuilt
because a version's bytes were not kept are `unknown`.
"""
import difflib
import hashlib
import os
import stat

from overlord.errors import OverlordError, UsageError
from overlord.txn import objects, retain, store
from overlord.txn.session import Session

ORIGIN, DRIFT, UNKNOWN = "origin", "drift", "unknown"


def locate(path, metas):
    """(absolute path, target, path relative to it) for a path inside a known target."""
    full = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))),
                        os.path.basename(os.path.abspath(path)))
    targets = sorted({m["target"] for m in metas if m.get("target")}, key=len, reverse=True)
    for target in targets:
        if full.startswith(target.rstrip("/") + "/"):
            return full, target, full[len(target.rstrip("/")) + 1:]
    raise UsageError(f"{path} is not inside any target OVERLORD knows (see `overlord sessions`)")


def _versions(metas, target, rel):
    """[(meta, [record])] of every committed change to rel, in commit then layer order."""
    out = []
    committed = sorted((m for m in metas if m.get("target") == target and m.get("state") == "committed"),
                       key=lambda m: m.get("committed", 0))
    for meta in committed:
        chosen = meta.get("committed_layers")
        recs = [r for r in store.read_jsonl(os.path.join(store.session_dir(meta["sid"]), "provenance.jsonl"))
                if r["path"] == rel and (chosen is None or r.get("layer", 0) in chosen)]
        if recs:
            out.append((meta, sorted(recs, key=lambda r: r.get("layer", 0))))
    return out


def owner_of(meta, rec):
    cause = rec.get("caused_by") or {}
    owner = {"sid": meta["sid"], "layer": rec.get("layer", 0)}
    owner.update({k: cause[k] for k in ("kind", "turn", "tool", "call", "summary", "command", "of")
                  if k in cause})
    if meta.get("task"):
        owner["task"] = meta["task"]
    imported = meta.get("imported")
    if isinstance(imported, dict):     # another machine's word for it: say whose, and if signed
        owner["imported"] = {"from": imported.get("from"), "verified": imported.get("verified") is True}
    return owner


class _Chain:
    """The current version's lines and their owners; content None when it is not known."""

    def __init__(self):
        self.sha, self.lines, self.owners = None, None, None

    def move_to(self, sha, data, owner):
        if data is None:                        # bytes not kept: the trail is lost here
            self.sha, self.lines, self.owners = sha, None, None
            return
        new = data.splitlines(keepends=True)
        if self.lines is None:
            owners = [owner if self.sha is None and owner == ORIGIN else UNKNOWN] * len(new)
        else:
            owners = []
            matcher = difflib.SequenceMatcher(None, self.lines, new, autojunk=False)
            for tag, i1, i2, j1, j2 in matcher.get_opcodes():
                owners += self.owners[i1:i2] if tag == "equal" else [owner] * (j2 - j1)
        self.sha, self.lines, self.owners = sha, new, owners


def _content(sha, deleted=False):
    if deleted or sha is None:
        return b""
    return objects.read(sha)


def blame(path, metas=None):
    """{"path", "target", "lines": [{"n", "text", "owner"}]} for a file of a known target."""
    metas = store.list_metas() if metas is None else metas
    full, target, rel = locate(path, metas)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{path} is a symlink; blame the file it points to")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path} is not a regular file")
    with open(full, "rb") as f:
        now = f.read()
    if b"\0" in now:
        raise OverlordError(f"{path} is binary; blame works on text")
    chain = _Chain()
    for meta, recs in _versions(metas, target, rel):
        for rec in recs:
            before = rec.get("before")
            if chain.lines is None and chain.sha is None:
                chain.move_to(before, _content(before), ORIGIN)
            elif before != chain.sha:
                chain.move_to(before, _content(before), DRIFT)     # changed outside meanwhile
            chain.move_to(rec.get("after"), _content(rec.get("after"), rec["kind"] == "deleted"),
                          owner_of(meta, rec))
        if rel in (meta.get("merged") or []):
            _merged(chain, meta, rel)
    sha = hashlib.sha256(now).hexdigest()
    if chain.sha is None and chain.lines is None:
        chain.move_to(sha, now, ORIGIN)                        # never touched by a commit
    elif sha != chain.sha:
        chain.move_to(sha, now, DRIFT)
    text = now.decode("utf-8", "surrogateescape").splitlines()
    return {"path": full, "target": target, "lines": [
        {"n": i + 1, "text": line, "owner": chain.owners[i] if chain.owners else UNKNOWN}
        for i, line in enumerate(text)]}


def _merged(chain, meta, rel):
    """A merged commit wrote bytes no layer had: the lines it took from outside edits."""
    record = retain.load(Session(meta)) or {}
    state = (record.get("paths", {}).get(rel) or {}).get("after") or {}
    if state.get("sha") and state["sha"] != chain.sha:
        chain.move_to(state["sha"], objects.read(state["sha"]), DRIFT)
