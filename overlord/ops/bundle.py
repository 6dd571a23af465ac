"""Bundles as operations: export a session to a signed .ovl, import one (optionally replaying
its changes as a new pending session), and the machine's bundle key. docs/BUNDLES.md.

export_session(sid, out)  out: a path, or a binary file object (the web streams to it)
import_bundle(path, target=None, require_signature=False, owner=None, backend=None)
bundle_key(show_path=False, import_from=None)
"""
import os
import sys
import tempfile
import time

from overlord.errors import OverlordError, UsageError
from overlord.text import escape_path
from overlord.trust import audit
from overlord.trust import bundle as B
from overlord.txn import store


def _holding(sids, reason):
    try:
        from overlord.trust.retention import holding
    except ImportError:                         # before retention lands: no gc to hold off
        import contextlib
        return contextlib.nullcontext()
    return holding(sids, reason)


# -- export --------------------------------------------------------------------------------------

def export_session(sid, out):
    """Write session sid as a signed bundle to `out` (a path: written whole, then renamed
    into place; or a binary file object with .write). Returns {sid, state, path, members,
    bytes, sha256, key_id, changes}. Audited bundle.export."""
    from overlord.ops.grants import require_target
    from overlord.ops.review import get_session
    session = get_session(store.check_sid(sid))
    state = session.meta.get("state")
    if session.meta.get("imported"):     # re-signing another machine's word would launder it
        raise OverlordError(f"cannot export session {sid}: it is a record imported from "
                            f"{session.meta['imported'].get('from') or 'another machine'}; "
                            "export it where it was made")
    if state == "running":
        raise OverlordError(f"cannot export session {sid}: a command is running in it now")
    plan = None
    if state in store.OPEN_STATES:
        require_target(session.target, session.meta.get("target_id"))
        plan = session.plan()
    audit.ready()
    made = B.load_key() is None                 # the first export makes the machine's key
    if hasattr(out, "write"):
        info = B.build(session, plan, out)
        info["path"] = None
    else:
        path = os.path.abspath(os.fspath(out))
        d = os.path.dirname(path)
        if not os.path.isdir(d):
            raise UsageError(f"no such directory for the bundle: {escape_path(d)}")
        if os.path.isdir(path):
            raise UsageError(f"{escape_path(path)} is a directory; name the .ovl file")
        fd, tmp = tempfile.mkstemp(prefix=".overlord-export-", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                info = B.build(session, plan, f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        info["path"] = path
    if made:
        audit.append("bundle.key", op="create", fingerprint=info["key_id"])
    audit.append("bundle.export", sid=session.sid, target=session.target, bundle_sha256=info["sha256"],
                 members=info["members"], bytes=info["bytes"], state=state, key_id=info["key_id"],
                 path=info["path"])
    return info


# -- import --------------------------------------------------------------------------------------

def import_bundle(path, target=None, require_signature=False, owner=None, backend=None):
    """Verify the bundle at path and keep its record here (sessions/<sid>); with target, also
    replay its changes as a new pending session on that folder. Returns {sid, new_sid,
    verified, why, bundle_sha256, state, original_state, host, target, changes, members,
    record}. record: "kept" (landed now) or "present" (with target only: the sid is already
    on this machine, e.g. the bundle's own session or an earlier import; that record is left
    exactly as it is and the replay reads the staged bundle). Without target an existing sid
    is refused. Refused (nothing kept) on any flaw; audited bundle.import."""
    from overlord.ops.grants import resolve_target
    if target is not None:
        target = resolve_target(target)
    key = B.load_key()
    audit.ready()
    staged = B.read(path, key, require_signature)
    try:
        sid = staged.sid
        if target is not None and staged.changes is None:
            raise OverlordError(f"the bundle of session {sid} ({staged.meta.get('state')}) has "
                                "no changes to replay: import it without -t to keep its record")
        present = os.path.lexists(store.session_dir(sid))
        if present and target is None:
            raise B.Refused(f"refused: session {sid} already exists on this machine; nothing "
                            "was imported")
        with _holding([sid], f"bundle import of {sid}"):
            new_sid = None
            if present:
                meta = dict(staged.meta)
                here = _state_here(sid)
                original_state = meta.get("state")
                new_sid = _replay(staged, meta, target, owner, backend, kept=False)
            else:
                meta = B.land(staged, owner=owner)
                here, original_state = meta["state"], meta["imported"]["original_state"]
                if target is not None:
                    try:
                        new_sid = _replay(staged, meta, target, owner, backend, kept=True)
                    except BaseException:
                        B.unland(sid)
                        raise
        changes = B.staged_changes(staged)
    finally:
        staged.cleanup()
    result = {"sid": sid, "new_sid": new_sid, "verified": staged.verified, "why": staged.why,
              "bundle_sha256": staged.sha256, "state": here,
              "original_state": original_state,
              "host": staged.manifest.get("host"), "target": target,
              "original_target": meta.get("target"),
              "record": "present" if present else "kept",
              "members": len(staged.manifest.get("members") or {}) + 1 + (staged.sig is not None),
              "changes": B.summary(changes) if changes is not None else None}
    audit.append("bundle.import", sid=sid, target=target or meta.get("target"), new_sid=new_sid,
                 verified=staged.verified, bundle_sha256=staged.sha256,
                 original_state=result["original_state"], host=result["host"],
                 record=result["record"])
    return result


def _state_here(sid):
    """The state of the record this machine already has for sid (None when unreadable)."""
    import json
    try:
        with open(os.path.join(store.session_dir(sid), "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta.get("state") if isinstance(meta, dict) else None


def _replay(staged, meta, target, owner, backend, kept=True):
    """A new pending session on target whose one savepoint writes the bundle's changes.
    kept: the record was landed just now (its changes and transcript are read from it);
    else the sid's record is already here and everything is read from the staged bundle."""
    from overlord.agent import transcript as T
    from overlord.ops.decide import rollback
    from overlord.ops.execute import exec_in, run
    from overlord.ops.review import get_session
    sid = staged.sid
    if kept:
        changes, pack = B.imported_changes(sid), None
    else:
        changes, pack = B.staged_changes(staged), B.staged_pack(staged)
    opened = run(["true"], target=target, backend=backend, cause={"kind": "import", "event": "open"},
                 close_if_unchanged=False)
    new = opened.sid
    try:
        words = B.summary(changes)
        cause = {"kind": "import", "bundle": staged.sha256, "from": sid,
                 "host": staged.manifest.get("host"), "verified": staged.verified,
                 "summary": f"imported from session {sid} ({staged.manifest.get('host')}): {words}",
                 "command": f"overlord import (bundle {staged.sha256[:12]})"}
        with tempfile.TemporaryFile(dir=store.home()) as payload, \
                tempfile.TemporaryFile(dir=store.home()) as err:
            if kept:
                B.write_payload(sid, payload)
            else:
                B.write_payload(sid, payload, changes=changes, pack=pack)
            payload.flush()
            payload.seek(0)
            session = get_session(new)
            res = exec_in(new, [_interpreter(session), "-I", "-c", B.WRITER, session.target],
                          cause=cause, stdio=(payload.fileno(), err.fileno(), err.fileno()))
            if res.exit_code != 0 or res.timed_out:
                err.seek(0)
                said = err.read(4000).decode("utf-8", "replace").strip().splitlines()
                raise OverlordError(f"the replay of session {sid} on {escape_path(target)} failed"
                                    f"{': ' + said[-1] if said else f' (exit {res.exit_code})'}; "
                                    "nothing was imported")
        session = get_session(new)
        with T.writer(session.dir, "import into"):
            if kept:
                events = T.read(store.session_dir(sid))
            else:
                held = staged.record.get(T.NAME)
                events = store.read_jsonl(held) if held else []
            note = {"type": "import", "at": round(time.time(), 3), "from": sid,
                    "bundle_sha256": staged.sha256, "host": staged.manifest.get("host"),
                    "verified": staged.verified, "why": staged.why,
                    "exported_at": staged.manifest.get("exported_at"),
                    "original_target": meta.get("target"), "layer": res.layer,
                    "summary": cause["summary"]}
            store.append_jsonl(T.path(session.dir), events + [note])
        session.meta.update(command=f"import: session {sid} from {staged.manifest.get('host')}",
                            replayed_from={"sid": sid, "bundle_sha256": staged.sha256,
                                           "host": staged.manifest.get("host"),
                                           "verified": staged.verified},
                            owner=owner)
        if meta.get("task"):
            session.meta["task"] = meta["task"]
        session.save()
        return new
    except BaseException:
        try:
            rollback(new)
        except OverlordError:
            pass
        raise


def _interpreter(session):
    """The Python the writer runs on: ours, unless the session is jailed and ours lives
    outside the system directories a jail shows (a pyenv, a venv under /home)."""
    if not session.meta["grants"].get("jail"):
        return sys.executable
    from overlord.sandbox.jail import SYSTEM_DIRS
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        real = os.path.realpath(candidate)
        if os.access(real, os.X_OK) and any(real.startswith(d + "/") for d in SYSTEM_DIRS):
            return candidate
    raise OverlordError("the replay runs jailed here and no python3 is in the jail's system "
                        "directories (/usr/bin/python3)")


# -- the key -------------------------------------------------------------------------------------

def bundle_key(show_path=False, import_from=None):
    """The machine's bundle key: {path, exists, fingerprint} (show_path: the same, nothing
    made); import_from: install another machine's key file (audited bundle.key with both
    fingerprints, never the key). Plain `bundle key` shows the fingerprint, making the key
    if there is none yet."""
    path = B.key_path()
    if import_from is not None:
        fp, previous = B.install_key(import_from)
        audit.append("bundle.key", op="import", fingerprint=fp, previous=previous)
        return {"path": path, "exists": True, "fingerprint": fp, "previous": previous,
                "imported": True}
    if show_path:
        key = B.load_key()
        return {"path": path, "exists": key is not None, "fingerprint": B.fingerprint(key)}
    made = B.load_key() is None
    key = B.ensure_key()
    if made:
        audit.append("bundle.key", op="create", fingerprint=B.fingerprint(key))
    return {"path": path, "exists": True, "fingerprint": B.fingerprint(key), "made": made}
