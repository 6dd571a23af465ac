"""Memory as operations: what an agent is told in a folder, your notes, the journal, proposals.

    memory_show(target, owner)   {"text", "sha256", "sources"}: exactly what agent.memory.gather
                                 gives a session opened on that folder now (by that owner)
    memory_user(owner)           {"path", "text", "bytes", "cap", "sha256", "exists"}
    memory_user_set(text, by, owner)   replace your notes (audit memory.edit)
    memory_user_add(note, by, owner)   append one note to them (audit memory.edit)
    memory_journal(target)       the folder's journal entries, oldest first
    memory_proposals(sid)        the notes an agent proposed in a session, and their fate
    memory_accept(sid, ids, all, by)   append proposals to the notes of the session's owner
                                 (meta "owner"; none: OVERLORD_HOME/memory.md); the acceptance
                                 goes on the session's transcript (memory_accepted) and the
                                 audit chain (memory.accept)

owner (issue 15): an account's name -- its notes are OVERLORD_HOME/users/<owner>/memory.md --
or None, the machine's OVERLORD_HOME/memory.md (the CLI's, as before accounts). A name that is
not an account name is refused (ops.home.user_dir) before anything is read or written.

Your notes (OVERLORD_HOME/memory.md, or an account's) change only here, by a person's act: each write is atomic
(temp file + rename, mode 0600) under a lock, so an acceptance and an edit never interleave.
`by` names who acted for the record ("cli:<os user>", "workspace"); the audit chain adds the
OS user itself. Audit details carry digests and sizes, never a note's text.
"""
import contextlib
import fcntl
import hashlib
import os
import time

from overlord.agent import memory as M
from overlord.agent import transcript as T
from overlord.errors import NotFound, UsageError
from overlord.ops.grants import resolve_target
from overlord.ops.home import ensure_user_dir
from overlord.ops.review import get_session
from overlord.trust import audit
from overlord.txn import store

LOCK = "memory.lock"


def memory_show(target=None, owner=None):
    """What an agent session opened on target now (by owner) would be told before message one."""
    M.user_path(owner)                       # a hostile owner is refused first
    told = M.gather(resolve_target(target), owner)
    return dict(told.record(), text=told.text)


# -- your notes ------------------------------------------------------------------------------------

def memory_user(owner=None):
    path = M.user_path(owner)
    got = _read_user(owner)
    if got.warning:
        raise UsageError(got.warning)
    return {"path": path, "text": got.data.decode("utf-8", "replace"), "bytes": got.size,
            "cap": M.CAPS["user"], "sha256": got.sha256, "exists": got.sha256 is not None}


def memory_user_set(text, by=None, owner=None):
    """Replace your notes (owner's) with text (may be empty). Returns memory_user(owner)."""
    M.user_path(owner)
    if not isinstance(text, str):
        raise UsageError("your notes must be text")
    data = _encode(text)
    if data and not data.endswith(b"\n"):
        data += b"\n"
    audit.ready()
    with _locked():
        _current(owner)            # a symlink or a non-file there is refused, not replaced
        _write(data, owner)
        audit.append("memory.edit", how="set", sha256=_sha(data), bytes=len(data), by=by,
                     **_whose(owner))
    return memory_user(owner)


def memory_user_add(note, by=None, owner=None):
    """Append one note (a Markdown list item) to your notes (owner's). Returns memory_user(owner)."""
    M.user_path(owner)
    note = _check(note)
    audit.ready()
    with _locked():
        data = _joined(_current(owner), M.as_item(note).encode("utf-8", "surrogatepass"))
        _write(data, owner)
        audit.append("memory.edit", how="add", sha256=_sha(data), bytes=len(data),
                     note_sha256=M.note_digest(note), by=by, **_whose(owner))
    return memory_user(owner)


def _whose(owner):
    """The audit detail naming whose notes changed: only for an account (the CLI's lines stay
    as they were)."""
    return {} if owner is None else {"owner": owner}


def _check(note):
    """A person's own note: not capped like the agent's, but it must say something."""
    note = note.strip() if isinstance(note, str) else ""
    if not note:
        raise UsageError("the note is empty")
    if "\0" in note:
        raise UsageError("the note holds a NUL byte")
    return note


def _encode(text):
    if "\0" in text:
        raise UsageError("your notes cannot hold a NUL byte")
    return text.encode("utf-8", "surrogateescape")


def _read_user(owner=None):
    return M.read_user(owner, 1 << 30)          # users/<owner>/ never through a link


def _current(owner=None):
    got = _read_user(owner)
    if got.warning:
        raise UsageError(f"{got.warning}; fix it by hand first")
    if got.sha256 is not None and not got.whole:      # over 1 GiB: a rewrite would lose its head
        raise UsageError(f"{M.user_label(owner)} is {got.size} bytes; fix it by hand first")
    return got.data


def _joined(old, item):
    if old and not old.endswith(b"\n"):
        old += b"\n"
    return old + item


def _write(data, owner=None):
    store.ensure_home()
    if owner is not None:
        ensure_user_dir(owner)
    path = M.user_path(owner)
    tmp = f"{path}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        store.write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    store.fsync_dir(os.path.dirname(path))


@contextlib.contextmanager
def _locked():
    home = store.ensure_home()
    fd = os.open(os.path.join(home, "locks", LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _sha(data):
    return hashlib.sha256(data).hexdigest()


# -- the journal ---------------------------------------------------------------------------------

def memory_journal(target=None):
    """The folder's journal: one entry per committed agent session, oldest first
    ({sid, at, target, task, claim, files, changes}; claim is the model's own words)."""
    entries, _ = M.journal_entries(resolve_target(target))
    return entries


# -- proposals -----------------------------------------------------------------------------------

def _events(sid):
    session = get_session(sid)
    if not T.exists(session.dir):
        raise NotFound(f"session {sid} has no transcript (it was not an agent session)")
    return session, T.read(session.dir)


def _proposals(session, events):
    found = {}
    for e in events:
        if e.get("type") == "memory_proposal" and isinstance(e.get("id"), int):
            found[e["id"]] = {"id": e["id"], "note": e.get("note") or "", "turn": e.get("turn"),
                              "call": e.get("call"), "at": e.get("at"), "sha256": e.get("sha256"),
                              "accepted": False, "by": None, "accepted_at": None}
    for e in events + M.rewound_events(session.dir):   # an acceptance before a rewind counts
        if e.get("type") != "memory_accepted":
            continue
        digests = e.get("notes") or {}
        for i in e.get("ids") or []:
            p = found.get(i)
            if p and not p["accepted"] and digests.get(str(i), p["sha256"]) == p["sha256"]:
                p.update(accepted=True, by=e.get("by"), accepted_at=e.get("at"))
    return [found[i] for i in sorted(found)]


def memory_proposals(sid):
    """[{id, note, turn, call, at, sha256, accepted, by, accepted_at}] of a session."""
    session, events = _events(sid)
    return _proposals(session, events)


def memory_accept(sid, ids=None, all=False, by=None):
    """Append the chosen proposals to the notes of the session's owner (meta "owner": that
    account's own; none, a CLI session: OVERLORD_HOME/memory.md) -- never anyone else's,
    whoever accepts. Returns one dict per proposal asked for:
    {id, note, sha256, accepted (True: appended now), skipped (None, or why not)}.
    An id the session never proposed is a UsageError naming it, and nothing changes."""
    if all and ids:
        raise UsageError("give proposal ids or --all, not both")
    if not all and not ids:
        raise UsageError("name the proposals to accept (N ..., or --all)")
    session, _ = _events(sid)
    audit.ready()
    with _locked():             # read under the lock: two acceptances never both append a note
        return _accept(session, ids, all, by)


def _accept(session, ids, all, by):
    sid = session.sid
    owner = session.meta.get("owner")
    M.user_path(owner)              # a meta naming no account is refused, nothing written
    props = {p["id"]: p for p in _proposals(session, T.read(session.dir))}
    if all:
        if not props:
            raise UsageError(f"session {sid} proposed no notes")
        wanted = sorted(props)
    else:
        wanted = []
        for raw in ids:
            n = _id(raw)
            if n not in props:
                have = ", ".join(map(str, sorted(props))) or "none"
                raise UsageError(f"session {sid} has no memory proposal {raw} (its proposals: {have})")
            if n not in wanted:
                wanted.append(n)
    out = []
    data = _current(owner)
    fresh, added = [], b""
    for n in wanted:
        p = props[n]
        row = {"id": n, "note": p["note"], "sha256": p["sha256"], "accepted": False,
               "skipped": None}
        item = M.as_item(p["note"]).encode("utf-8", "surrogatepass")
        if p["accepted"]:
            row["skipped"] = f"already accepted (by {p['by'] or 'someone'})"
        elif item in data + added:
            row["skipped"] = "already in your notes"
        else:
            added += item
            fresh.append(n)
            row["accepted"] = True
        out.append(row)
    if not fresh:
        return out
    new = _joined(data, added)
    _write(new, owner)
    digest = _sha(added)
    store.append_jsonl(T.path(session.dir), [{
        "type": "memory_accepted", "at": round(time.time(), 3), "ids": fresh, "by": by,
        "sha256": digest, "bytes": len(added),
        "notes": {str(n): props[n]["sha256"] for n in fresh}, **_whose(owner)}])
    audit.append("memory.accept", sid=sid, target=session.target, ids=fresh,
                 sha256=digest, bytes=len(added), by=by, **_whose(owner))
    return out


def _id(raw):
    if isinstance(raw, bool):
        raise UsageError(f"not a proposal id: {raw!r}")
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    if not text.isdigit():
        raise UsageError(f"not a proposal id: {text!r} (a number, as `overlord memory proposals` lists)")
    return int(text)


