"""Looking at a session: the session record (with stale-run recovery), diff, log, syscalls."""
import dataclasses
import os
import stat

from overlord.errors import OverlordError
from overlord.ops import patch as _patch
from overlord.ops.grants import require_target
from overlord.sandbox import backends
from overlord.txn import changes as C
from overlord.txn import gitdir, history, locks, retain, store
from overlord.txn.session import Session


# -- review ---------------------------------------------------------------------------------------

def resolve_sid(sid):
    """The id a face was given, with `last` naming the newest session (any target). Faces
    resolve once, up front; every other operation takes only a well-formed id."""
    return store.resolve_sid(sid)


def get_session(sid):
    session = Session.load(store.check_sid(sid))
    if session.meta["state"] == "running":
        try:
            with locks.TargetLock(session.target):
                session = Session.load(sid)
                if session.meta["state"] == "running":
                    _recover_stale(session)
        except OverlordError:
            pass          # a command really is executing on the target right now
    return session


def _recover_stale(session):
    """A session left 'running' by a process that died (nothing holds the target lock):
    seal what its last command wrote and make it reviewable again."""
    merged = session.path("merged")
    if os.path.ismount(merged):
        backends.get("fuse").unmount(merged)
    opening = session.meta["state"] == "running"
    if os.path.isdir(session.path("upper")):      # an opening's command, or a later exec's
        command = session.meta.get("command", "") if opening else "(a command whose process was killed)"
        session.seal({"kind": "command", "command": command, "interrupted": True})
    session.meta.update(state="pending" if opening else session.meta["state"], interrupted=True)
    session.save()


def reconcile():
    """Settle every session a killed process left mid-command (a daemon's SIGKILL): one left
    `running`, or an open one whose last command's upper was never sealed, is sealed as
    interrupted and left pending for review. A session whose target lock is held (a command
    really is running) is left alone. Returns the sids settled."""
    settled = []
    for meta in store.list_metas():
        state = meta.get("state")
        if state != "running" and state not in store.OPEN_STATES:
            continue
        sdir = store.session_dir(meta["sid"])
        if state != "running" and not (os.path.lexists(os.path.join(sdir, "upper"))
                                       or os.path.ismount(os.path.join(sdir, "merged"))):
            continue
        try:
            with locks.TargetLock(meta["target"]):
                session = Session.load(meta["sid"])
                _recover_stale(session)
                settled.append(session.sid)
        except (OSError, OverlordError):
            continue
    return settled


def diff(sid, only=(), drop=()):
    """[Change] of a session against the real tree (the plan commit would execute; with
    --only/--drop selectors, the plan `commit --only/--drop` would)."""
    session = get_session(sid)
    _require_layers(session)
    require_target(session.target, session.meta.get("target_id"))
    chosen = history.select_some(session, only, drop, "diff")
    plan = session.plan(chosen)
    history.require_class(plan, chosen)
    return plan


def _require_layers(session):
    if session.meta["state"] == "imported":
        raise OverlordError(f"session {session.sid} is an imported record of work left open on "
                            "another machine; nothing of it is staged here (`overlord import FILE "
                            "-t DIR` replays it as a new pending session)")
    if session.meta["state"] in ("committed", "rolled-back"):
        shown = "what was committed" if session.meta["state"] == "committed" else "what it held"
        raise OverlordError(f"session {session.sid} is {session.meta['state']}; its changes "
                            f"are no longer staged (`overlord log {session.sid}` shows {shown})")


KINDS = C.KINDS


def git_summary(sid, changes=None):
    """What a session does to the target's git repositories, as one summary (txn/gitdir.py:
    {"paths", "left_out", "repos": [{"dir", "objects", "packs", "refs", "head", "index",
    "config", "hooks", "other", "left_out", "problem", "line"}]}), or None when nothing under
    a .git/ changed. Pending: of its plan, ref values read now (changes: ops.diff(sid), if
    the caller has it); committed: what the commit recorded; rolled back: the names its
    records hold (no values)."""
    session = get_session(sid)
    state = session.meta["state"]
    if state == "committed" and "git_summary" in session.meta:
        return session.meta["git_summary"]
    if state in ("committed", "rolled-back", "unchanged"):
        records = store.read_jsonl(session.path("provenance.jsonl"))
        if state == "committed":
            records = [r for r in records if _committed(session.meta)(r)]
        records = _net(records)
        return gitdir.summarize(session.target, (), rows=[(r["path"], r["kind"]) for r in records])
    if changes is None:
        changes = diff(sid)
    return gitdir.summarize(session.target, changes, getattr(changes, "left_out", ()))


def unified(sid, changes=None):
    """[str]: the unified diff (`git diff`-like text, escaped) of each change of a pending
    session, in plan order. changes: ops.diff(sid), if the caller already has it."""
    session = get_session(sid)
    if changes is None:
        changes = diff(sid)
    return [_patch.render(session.target, ch, describe(ch)) for ch in changes]


def describe(change):
    """The words a face prints after a change's path ("link -> /etc/passwd", "fifo",
    "mode 0644 -> 4644, setuid"), "" when the kind says it all. Takes a Change or a
    LogRecord (anything with .kind and .details)."""
    if not getattr(change, "details", None):
        return ""
    return C.describe(change)


def change_words(details, kind=None, arrow="->"):
    """The same words as a list, for faces that lay them out themselves (the web pages)."""
    return C.words(details, kind, arrow)


@dataclasses.dataclass
class LogRecord:
    path: str
    kind: str
    before: str               # sha256 of the content before (the real tree), None if absent
    after: str                # sha256 after (the session / what was committed), None if absent
    layer: int
    caused_by: dict
    syscalls: int = None
    dropped: bool = False     # after a partial commit: a change that was left out
    details: dict = dataclasses.field(default_factory=dict)   # Change.details (docs/JSON.md)

    @property
    def path_class(self):
        """"git" for a path under a .git/ (grouped by git_summary), else None."""
        return "git" if gitdir.is_git(self.path) else None


def log(sid):
    """Per change: sha256 before (real tree) -> after (session), the layer and its cause.

    Pending: the plan commit would execute. Committed: what the commit wrote (its
    committed.json record, with causes from provenance), then -- after `commit --only/--drop`
    -- every change of a savepoint that was left out, with dropped=True. Rolled back: what
    the session held when it was discarded."""
    session = get_session(sid)
    state = session.meta["state"]
    if state == "committed":
        return _committed_log(session)
    if state == "rolled-back":
        return [_record(r) for r in _net(store.read_jsonl(session.path("provenance.jsonl")))]
    require_target(session.target, session.meta.get("target_id"))
    out = []
    layers_meta = session.meta["layers"]
    for ch in session.plan():
        before = C.content_hash(C.real_path(session.target, ch.path), ch.real) if ch.real else None
        after = C.content_hash(ch.entry.src, ch.entry.st) if ch.entry.src else None
        cause = layers_meta[ch.layer]["cause"] if ch.layer is not None else None
        out.append(LogRecord(ch.path, ch.kind, before, after, ch.layer, cause,
                             details=dict(getattr(ch, "details", None) or {})))
    return out


def _record(rec, dropped=False):
    return LogRecord(rec["path"], rec["kind"], rec.get("before"), rec.get("after"),
                     rec.get("layer"), rec.get("caused_by"), dropped=dropped)


def _net(records):
    """The last provenance record per path (a later layer's change supersedes), in path order."""
    last = {}
    for rec in records:
        last[rec["path"]] = rec
    return [last[p] for p in sorted(last, key=lambda p: p.split("/"))]


def _committed(meta):
    """Was a provenance record's change part of the commit? (its savepoint chosen, its path
    class kept, not a git lock file)"""
    chosen = meta.get("committed_layers")
    classes = meta.get("committed_classes") or {}
    keep, gone = set(classes.get("only") or ()), set(classes.get("drop") or ())

    def kept(rec):
        path = rec["path"]
        if chosen is not None and rec.get("layer", 0) not in chosen:
            return False
        if gitdir.is_lock(path):
            return False
        git = gitdir.is_git(path)
        return not (("git" in keep and not git) or ("git" in gone and git))
    return kept


def _committed_log(session):
    records = store.read_jsonl(session.path("provenance.jsonl"))
    committed = _committed(session.meta)
    kept = [r for r in records if committed(r)]
    # (a git lock file was never part of any commit: the git summary says it was left out)
    left_out = [r for r in records if not committed(r) and not gitdir.is_lock(r["path"])]
    record = retain.load(session)
    committed = _from_record(record, kept) if record else [_record(r) for r in _net(kept)]
    return committed + [_record(r, dropped=True) for r in _net(left_out)]


def _from_record(record, kept):
    """LogRecords from committed.json: the paths the commit really changed, each with its
    state before and after; the layer and cause of the last committed record of the path."""
    cause = {r["path"]: r for r in _net(kept)}
    first = {}
    for r in kept:
        first.setdefault(r["path"], r)
    out, gone = [], []
    for path in sorted(record.get("paths", {}), key=lambda p: p.split("/")):
        states = record["paths"][path]
        before, after = states.get("before"), states.get("after")
        prov = cause.get(path)
        if before == "unknown":           # the commit could not record it: provenance can
            src = first.get(path)
            if src is None:
                continue
            before = None if src.get("kind") == "added" else {"sha": src.get("before")}
        if before is None and after is None:
            continue                      # a deletion mark over nothing
        if before == after and prov is None:
            continue                      # a directory the change merely passed through
        if after is None and any(path.startswith(g + "/") for g in gone):
            continue                      # inside a directory deleted or replaced above
        if before is None:
            kind = "added"
        elif after is None:
            kind = "deleted"
        elif prov and prov.get("kind") == "replaced-dir":
            kind = "replaced-dir"
        else:
            kind = "modified"
        if before and before.get("type") == "dir" and (after is None or kind == "replaced-dir"
                                                       or after.get("type") != "dir"):
            gone.append(path)
        out.append(LogRecord(path, kind, (before or {}).get("sha"), (after or {}).get("sha"),
                             prov.get("layer") if prov else None,
                             prov.get("caused_by") if prov else None,
                             details=_state_details(before, after)))
    return out


def _state_type(state):
    t = state.get("type")
    if t == "other" and isinstance(state.get("mode"), int):
        m = state["mode"]
        for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
                           (stat.S_ISCHR, "char-device"), (stat.S_ISBLK, "block-device")):
            if test(m):
                return name
    return t


def _state_details(before, after):
    """Change.details' keys that a committed record can tell (docs/JSON.md)."""
    out = {}
    if after:
        out["type"] = _state_type(after)
        if after.get("type") == "symlink" and "target" in after:
            out["link"] = after["target"]
        if after.get("type") == "other" and isinstance(after.get("rdev"), int):
            if out["type"] in ("char-device", "block-device"):
                out["rdev"] = [os.major(after["rdev"]), os.minor(after["rdev"])]
    if before and before.get("type"):
        out["before_type"] = _state_type(before)
    if after and after.get("type") not in ("symlink", None) and "mode" in after:
        same = bool(before) and _state_type(before) == out.get("type")
        b_mode = stat.S_IMODE(before["mode"]) if same and isinstance(before.get("mode"), int) else None
        a_mode = stat.S_IMODE(after["mode"])
        if b_mode != a_mode:
            out["mode"] = [b_mode, a_mode]
    if before and after and "uid" in before and "uid" in after and \
            (before.get("uid"), before.get("gid")) != (after.get("uid"), after.get("gid")):
        out["owner"] = [[before.get("uid"), before.get("gid")], [after.get("uid"), after.get("gid")]]
    return out


def syscalls(sid):
    """What --trace recorded for a session, one dict per syscall, in order (see
    overlord/sandbox/trace.py): pid, ts, syscall, args, ret, and where they apply path,
    write (True), kind (exec | connect), recorder (ebpf)."""
    return store.read_jsonl(get_session(sid).path("syscalls.jsonl"))


def traced(sid):
    """The recorder a session was run with (strace | ebpf), or None."""
    return get_session(sid).meta.get("trace")


def blame(path, metas=None):
    """Each line of a committed file with the session, layer and cause that produced it.
    metas: the sessions whose folders may be read (None: every session's)."""
    from overlord.txn import blame as txn_blame      # (objects, difflib): blame only
    return txn_blame.blame(path, metas)
