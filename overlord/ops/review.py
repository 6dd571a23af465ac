"""Looking at a session: the session record (with stale-run recovery), diff, log, syscalls."""
import dataclasses
import os

from overlord.errors import OverlordError
from overlord.sandbox import backends
from overlord.txn import blame as txn_blame
from overlord.txn import changes as C
from overlord.txn import locks, store
from overlord.txn.session import Session


# -- review ---------------------------------------------------------------------------------------

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
    if os.path.isdir(session.path("upper")):
        session.seal({"kind": "command", "command": session.meta.get("command", ""),
                      "interrupted": True})
    session.meta.update(state="pending", interrupted=True)
    session.save()


def diff(sid):
    """[Change] of a session against the real tree (the plan commit would execute)."""
    session = get_session(sid)
    _require_layers(session)
    return session.plan()


def _require_layers(session):
    if session.meta["state"] in ("committed", "rolled-back"):
        raise OverlordError(f"session {session.sid} is {session.meta['state']}; its changes "
                            "are no longer staged")


@dataclasses.dataclass
class LogRecord:
    path: str
    kind: str
    before: str
    after: str
    layer: int
    caused_by: dict
    syscalls: int = None


def log(sid):
    """Per change: sha256 before (real tree) -> after (session), the layer and its cause."""
    session = get_session(sid)
    if session.meta["state"] in ("committed", "rolled-back"):
        return [LogRecord(r["path"], r["kind"], r.get("before"), r.get("after"), r.get("layer"),
                          r.get("caused_by")) for r in _net_provenance(session)]
    out = []
    layers_meta = session.meta["layers"]
    for ch in session.plan():
        before = C.content_hash(C.real_path(session.target, ch.path), ch.real) if ch.real else None
        after = C.content_hash(ch.entry.src, ch.entry.st) if ch.entry.src else None
        cause = layers_meta[ch.layer]["cause"] if ch.layer is not None else None
        out.append(LogRecord(ch.path, ch.kind, before, after, ch.layer, cause))
    return out


def _net_provenance(session):
    """After commit or rollback: the last provenance record per path."""
    last = {}
    for rec in store.read_jsonl(session.path("provenance.jsonl")):
        last[rec["path"]] = rec
    return [last[p] for p in sorted(last, key=lambda p: p.split("/"))]


def syscalls(sid):
    return store.read_jsonl(get_session(sid).path("syscalls.jsonl"))


def blame(path):
    """Each line of a committed file with the session, layer and cause that produced it."""
    return txn_blame.blame(path)
