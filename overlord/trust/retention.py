"""Retention: what `overlord gc` may prune, and the holds that keep a session from it.

A hold is OVERLORD_HOME/holds/<random>.json `{pid, sids, reason, ts}` with an exclusive flock
on it for as long as the `holding()` block runs (the file is locked before it is renamed to
its name, so no reader ever sees it unlocked while its holder lives). gc keeps every session a
live hold names, and prunes no object or pack while any live hold exists (the holder may be
adding objects whose record is not written yet: a bundle import). A hold whose flock is free
is stale (its process died): gc removes it. Layout and rules: docs/RETENTION.md.
"""
import contextlib
import dataclasses
import errno
import fcntl
import gc
import json
import os
import re
import secrets
import stat
import time

from overlord.errors import OverlordError, UsageError
from overlord.txn import store

HOLDS = "holds"


def holds_dir():
    return os.path.join(store.home(), HOLDS)


@contextlib.contextmanager
def holding(sids=(), reason=""):
    """Keep the sessions `sids` (and every object) from gc while the block runs."""
    sids = [store.check_sid(s) for s in ([sids] if isinstance(sids, str) else list(sids))]
    if not isinstance(reason, str):
        raise UsageError("a hold's reason must be text")
    store.ensure_home()
    d = holds_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    name = secrets.token_hex(8)
    path = os.path.join(d, name + ".json")
    tmp = os.path.join(d, f".{name}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        store.write_all(fd, (json.dumps({"pid": os.getpid(), "sids": sids, "reason": reason,
                                         "ts": time.time()}, sort_keys=True) + "\n").encode())
        os.fsync(fd)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _probe(path):
    """(live, record): live when another process holds the file's flock. record: its JSON
    (None when unreadable). A free flock: the file is stale."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            live = True
        else:
            live = False
            fcntl.flock(fd, fcntl.LOCK_UN)
        try:
            record = json.loads(os.read(fd, 1 << 16) or b"null")
        except ValueError:
            record = None
        return live, record if isinstance(record, dict) else None
    finally:
        os.close(fd)


def live_holds():
    """[(path, record)] of the holds whose holder is alive."""
    out = []
    try:
        names = sorted(os.listdir(holds_dir()))
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".json") and not n.startswith("."):
            path = os.path.join(holds_dir(), n)
            live, record = _probe(path)
            if live:
                out.append((path, record or {}))
    return out


def held_sids():
    """The sids live holds name, and whether any hold is live."""
    holds = live_holds()
    sids = set()
    for _, rec in holds:
        for s in rec.get("sids") or ():
            if isinstance(s, str):
                sids.add(s)
    return sids, bool(holds)


# -- the plan ----------------------------------------------------------------------------------

FINISHED = ("committed", "rolled-back", "timed-out", "unchanged", "imported")
NEVER = ("running", "pending")                   # never pruned, whatever their age
DEFAULT_KEEP_DAYS = 30
DEFAULT_KEEP_LAST = 10
DAY = 86400.0
TRASH = ".gc-trash"           # objects/.gc-trash: what a prune set aside, deleted or put back
GONE = ".gc-"                 # sessions/.gc-<sid>: a record being removed (not a session id)
LOCK_RE = re.compile(r"^[0-9a-f]{24}\.lock$")     # txn/locks.py's per-target locks
HEX = frozenset("0123456789abcdef")


def check_keep(keep_days, keep_last):
    """(keep_days, keep_last) as numbers, defaults for None; UsageError for anything else."""
    out = []
    for name, value, default in (("keep-days", keep_days, DEFAULT_KEEP_DAYS),
                                 ("keep-last", keep_last, DEFAULT_KEEP_LAST)):
        if value is None:
            value = default
        if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()):
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10 ** 9:
            raise UsageError(f"--{name} must be a whole number of "
                             f"{'days' if name == 'keep-days' else 'sessions'} (0 or more), "
                             f"not {value!r}")
        out.append(value)
    return tuple(out)


def _num(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def finished_at(meta, sdir=None):
    """When the record finished here: its close time (committed, rolled_back, finished),
    an import's time when later; else the newest mtime in its directory."""
    times = [_num(meta.get(k)) for k in ("committed", "rolled_back", "finished")]
    imported = meta.get("imported")
    if isinstance(imported, dict):
        times.append(_num(imported.get("at")))
    times = [t for t in times if t is not None]
    if times:
        return max(times)
    if sdir is None:
        return None
    newest = None
    for base, _dirs, files in os.walk(sdir):
        for n in files + [base]:
            try:
                m = os.lstat(os.path.join(base, n)).st_mtime
            except OSError:
                continue
            newest = m if newest is None or m > newest else newest
    return newest


def _tree_bytes(path):
    total = 0
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_size
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return total


def _load(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _read_meta(sid):
    meta = _load(os.path.join(store.sessions_dir(), sid, "meta.json"))
    return meta if isinstance(meta, dict) else None


SHA_RE = re.compile(rb"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def referenced(sids):
    """Every object sha the records of `sids` may name: any 64-hex-digit word of their
    committed.json (the before/after `sha` of each path) and provenance.jsonl (before, after,
    the base fingerprint) — what blame, revert and the kept diff read. Taken as words, not
    parsed: a damaged line still counts, and a hash that names no object (a seal, an
    attestation digest) only keeps what nothing else would."""
    refs = set()
    root = store.sessions_dir()
    for sid in sids:
        d = os.path.join(root, sid)
        for name in ("committed.json", "provenance.jsonl"):
            try:
                with open(os.path.join(d, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            refs.update(m.decode() for m in SHA_RE.findall(data))
    return refs


@dataclasses.dataclass
class Plan:
    keep_days: int
    keep_last: int
    now: float
    started_ns: int
    sessions: list = dataclasses.field(default_factory=list)   # {sid, state, target, finished, age_days, bytes}
    objects: list = dataclasses.field(default_factory=list)    # {sha, bytes} loose
    packs: list = dataclasses.field(default_factory=list)      # {name, files, bytes, why}
    locks: list = dataclasses.field(default_factory=list)      # {name, bytes}
    holds: list = dataclasses.field(default_factory=list)      # stale holds {name, bytes}
    tmp: list = dataclasses.field(default_factory=list)        # {name, bytes} left by a crash
    cgroups: list = dataclasses.field(default_factory=list)    # {path, sid}
    kept: dict = dataclasses.field(default_factory=dict)       # why: count
    notes: list = dataclasses.field(default_factory=list)
    objects_deferred: str = None          # why objects are not pruned this time
    remaining: list = dataclasses.field(default_factory=list)  # sids kept (not in the report)

    KINDS = ("sessions", "objects", "packs", "locks", "holds", "tmp", "cgroups")

    def counts(self):
        return {k: len(getattr(self, k)) for k in self.KINDS}

    def sizes(self):
        out = {k: sum(i.get("bytes", 0) for i in getattr(self, k)) for k in self.KINDS}
        out["total"] = sum(out.values())
        return out

    def as_dict(self):
        d = {k: getattr(self, k) for k in self.KINDS}
        d.update(keep_days=self.keep_days, keep_last=self.keep_last, now=self.now,
                 kept=self.kept, notes=self.notes, objects_deferred=self.objects_deferred,
                 counts=self.counts(), bytes=self.sizes())
        return d


def _kept(plan, why):
    plan.kept[why] = plan.kept.get(why, 0) + 1


SLIM = ("sid", "state", "target", "created", "finished", "committed", "rolled_back",
        "imported", "forked_from", "reverts")      # what the plan reads of a meta.json


def plan(keep_days=None, keep_last=None, now=None):
    """What a prune would remove now, with sizes; changes nothing."""
    keep_days, keep_last = check_keep(keep_days, keep_last)
    collecting = gc.isenabled()
    gc.disable()            # ten thousand records parsed: no cycles among them to look for
    try:
        return _plan(keep_days, keep_last, now)
    finally:
        if collecting:
            gc.enable()


def _plan(keep_days, keep_last, now):
    p = Plan(keep_days, keep_last, time.time() if now is None else float(now), time.time_ns())
    root = store.sessions_dir()
    try:
        names = os.listdir(root) if _real_dir(root) else []
    except FileNotFoundError:
        names = []
    if names == [] and os.path.islink(root):
        p.notes.append("sessions/ is a symlink: gc does not follow it (nothing there is pruned)")
    held, any_hold = held_sids()
    journals = _journals()
    metas, open_deps = [], set()
    for name in names:
        if name.startswith(GONE) and store.SID_RE.match(name[len(GONE):]):
            path = os.path.join(root, name)
            p.notes.append(f"sessions/{name}: left by an interrupted gc, removed first")
            p.sessions.append({"sid": name[len(GONE):], "state": "removing", "target": None,
                               "finished": None, "age_days": None, "bytes": _tree_bytes(path),
                               "dir": name})
            continue
        if not store.SID_RE.match(name):
            continue
        if not _real_dir(os.path.join(root, name)):
            _kept(p, "not a directory")       # a symlinked record: never followed
            p.remaining.append(name)
            continue
        meta = _read_meta(name)
        if meta is None or meta.get("sid") != name:
            _kept(p, "damaged")               # never guessed at: a person looks at it
            p.remaining.append(name)
            continue
        meta = {k: meta[k] for k in SLIM if k in meta}     # the rest freed at once
        metas.append(meta)
        if meta.get("state") not in FINISHED:
            for k in ("forked_from", "reverts"):
                dep = meta.get(k)
                dep = dep.get("sid") if isinstance(dep, dict) else dep
                if isinstance(dep, str):
                    open_deps.add(dep)
    newest = sorted((m for m in metas if m.get("state") == "committed"),
                    key=lambda m: (_num(m.get("committed")) or 0, m["sid"]), reverse=True)
    keep_newest = {m["sid"] for m in newest[:keep_last]}
    cutoff = p.now - keep_days * DAY
    for meta in metas:
        sid, state = meta["sid"], meta.get("state")
        sdir = os.path.join(root, sid)
        why = None
        if state not in FINISHED:
            why = "open" if state in NEVER or state in store.OPEN_STATES else "unknown state"
        elif sid in held:
            why = "held"
        elif sid in journals:
            why = "commit journal"
        elif sid in keep_newest:
            why = "keep-last"
        elif sid in open_deps:
            why = "named by an open session"
        if why is None:
            done = finished_at(meta, sdir)
            if done is None or done > cutoff:
                why = "younger than keep-days"
        if why is not None:
            _kept(p, why)
            p.remaining.append(sid)
            continue
        p.sessions.append({"sid": sid, "state": state, "target": meta.get("target"),
                           "finished": done, "age_days": round((p.now - done) / DAY, 2),
                           "bytes": _tree_bytes(sdir)})
    going = {s["sid"] for s in p.sessions}
    remaining_targets = {m.get("target") for m in metas if m["sid"] not in going}
    _plan_locks(p, remaining_targets)
    _plan_holds(p)
    _plan_cgroups(p, {m["sid"]: m.get("state") for m in metas}, going)
    if any_hold:
        p.objects_deferred = "a hold is live (a bundle import may be adding objects)"
    else:
        states = {m["sid"]: m.get("state") for m in metas if m["sid"] not in going}
        _plan_objects(p, referenced(p.remaining), states)
    return p


def _journals():
    try:
        return {n[:-5] for n in os.listdir(store.journal_dir()) if n.endswith(".json")}
    except FileNotFoundError:
        return set()


def _older(st, p):
    """Made (or last changed) before the plan started: never remove what is newer."""
    return st.st_ctime_ns < p.started_ns and st.st_mtime_ns < p.started_ns


def _plan_locks(p, targets):
    d = os.path.join(store.home(), "locks")
    if not _real_dir(d):
        return
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return
    from overlord.txn import locks
    live = {os.path.basename(locks._lock_path(t)) for t in targets if isinstance(t, str)}
    held = _held_inodes()
    for n in names:
        if not LOCK_RE.match(n) or n in live:
            continue                 # named locks (memory, skills…) and a kept target's stay
        path = os.path.join(d, n)
        st = _lstat(path)
        if st is None or not _older(st, p):
            continue
        if (st.st_ino in held) if held is not None else _busy(path):
            continue
        p.locks.append({"name": n, "bytes": st.st_size})


def _held_inodes():
    """The inode numbers of every file someone holds a lock on (/proc/locks), or None when it
    cannot be read. Read, not probed: taking even a shared flock for a moment could make a
    command starting on that target think it busy. (Inode only: a collision across
    filesystems errs on keeping.)"""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = set()
    for line in lines:
        for field in line.split():
            if field.count(":") == 2:
                ino = field.rsplit(":", 1)[1]
                if ino.isdigit():
                    out.add(int(ino))
                break
    return out


def _lstat(path):
    try:
        return os.lstat(path)
    except OSError:
        return None


def _real_dir(path):
    """A directory, not a symlink to one: gc lists and removes only inside real directories
    below OVERLORD_HOME (a symlinked objects/, objects/<2>, packs/, tmp/, locks/, holds/ or
    sessions/ is never followed: what it points at is not ours to delete)."""
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _busy(path):
    """Someone holds the flock on path (a probe with LOCK_NB; nothing is changed)."""
    live, _ = _probe(path)
    return live is not False


def _plan_holds(p):
    if not _real_dir(holds_dir()):
        return
    try:
        names = sorted(os.listdir(holds_dir()))
    except FileNotFoundError:
        return
    for n in names:
        path = os.path.join(holds_dir(), n)
        st = _lstat(path)
        if st is None or not _older(st, p):
            continue
        if n.startswith(".") and n.endswith(".tmp"):
            # a hold being made holds its flock on the temp file before the rename
            if _busy(path):
                continue
        elif not n.endswith(".json") or _busy(path):
            continue
        p.holds.append({"name": n, "bytes": st.st_size})


def _pid_alive(pid):
    return os.path.exists(f"/proc/{pid}")


def _plan_objects(p, refs, states):
    root = os.path.join(store.home(), "objects")
    if not _real_dir(root):
        return
    try:
        top = os.listdir(root)
    except FileNotFoundError:
        return
    if TRASH in top:
        p.notes.append(f"objects/{TRASH}: left by an interrupted gc; a run puts it back first")
    for d in sorted(top):
        if len(d) != 2 or not set(d) <= HEX or not _real_dir(os.path.join(root, d)):
            continue
        try:
            it = os.scandir(os.path.join(root, d))
        except OSError:
            continue
        with it:
            for e in it:
                sha = d + e.name
                if sha in refs or len(e.name) != 62:
                    continue
                st = e.stat(follow_symlinks=False)
                if _older(st, p):
                    p.objects.append({"sha": sha, "bytes": st.st_size})
    p.objects.sort(key=lambda o: o["sha"])
    _plan_packs(p, os.path.join(root, "packs"), refs, states)
    tmpdir = os.path.join(root, "tmp")
    if not _real_dir(tmpdir):
        return
    try:
        it = os.scandir(tmpdir)
    except OSError:
        return
    with it:
        for e in sorted(it, key=lambda e: e.name):
            pid = e.name.split("-", 1)[0]
            st = e.stat(follow_symlinks=False)
            if pid.isdigit() and not _pid_alive(int(pid)) and _older(st, p):
                p.tmp.append({"name": f"tmp/{e.name}", "bytes": st.st_size})


def _plan_packs(p, d, refs, states):
    if not _real_dir(d):
        return
    try:
        names = set(os.listdir(d))
    except FileNotFoundError:
        return
    stems = sorted({n.split(".", 1)[0] for n in names if store.SID_RE.match(n.split(".", 1)[0])})
    kept = set(p.remaining)
    for stem in stems:
        files = [n for n in (f"{stem}.pack", f"{stem}.idx", f"{stem}.idx.tmp") if n in names]
        sts = {n: _lstat(os.path.join(d, n)) for n in files}
        if any(st is None or not _older(st, p) for st in sts.values()):
            continue
        size = sum(st.st_size for st in sts.values())
        if f"{stem}.idx" in names:
            if stem in kept:
                continue              # its own record names what it holds (its "after"s)
            index = _index_shas(os.path.join(d, f"{stem}.idx"))
            if not index:
                continue              # an index we cannot read: never guessed at
            if not refs.isdisjoint(index):
                continue
            why = "unreferenced"
        else:
            state = states.get(stem)
            if state is not None and state not in FINISHED:
                continue              # its commit may be running; a retry replaces it itself
            why = "no index"
        p.packs.append({"name": stem, "files": files, "bytes": size, "why": why})


def _index_shas(path):
    """The object names a pack index lists (its 64-hex keys), or None when it cannot be read
    or lists none."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return {m.decode() for m in SHA_RE.findall(data)} or None


def _plan_cgroups(p, states, going):
    """Cgroups a finished (or pruned) session of this home left behind (limits.Cgroup.remove
    gives up on one still busy)."""
    try:
        from overlord.sandbox import limits
        kind, base = limits.cgroup_kind()
    except Exception:                  # no cgroups here, or not ours to manage
        return
    if kind == "v1":
        parents = [os.path.join(base, c, "overlord") for c in ("memory", "pids", "cpu")]
        prefix = ""
    elif kind == "v2":
        parents, prefix = [base], "overlord-"
    else:
        return
    # only this home's own records: the cgroup tree is the machine's, shared by every
    # OVERLORD_HOME on it
    ours = {prefix + sid for sid, state in states.items() if state in FINISHED}
    ours.update(prefix + sid for sid in going)
    for parent in parents:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for n in sorted(ours.intersection(names)):
            path = os.path.join(parent, n)
            st = _lstat(path)
            if st is not None and _older(st, p):
                p.cgroups.append({"path": path, "sid": n[len(prefix):], "bytes": 0})


# -- the prune -----------------------------------------------------------------------------------

GC_LOCK = "gc.lock"          # locks/gc.lock: one prune at a time
BARRIER_WAIT = 10.0          # seconds a prune waits for a commit in progress to finish


@contextlib.contextmanager
def _gc_lock():
    store.ensure_home()
    fd = os.open(os.path.join(store.home(), "locks", GC_LOCK),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OverlordError("another `overlord gc` is running; nothing was removed") from None
            raise
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _target_lock(target):
    """The lock a command or a commit on target holds, taken without waiting; yields False
    when someone holds it."""
    from overlord.txn import locks
    lock = locks.TargetLock(target)
    try:
        lock.__enter__()
    except OverlordError:
        yield False
        return
    try:
        yield True
    finally:
        lock.__exit__(None, None, None)


def _rm(path):
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def prune(p):
    """Remove what plan p listed, re-checking each thing as it goes (what changed since the
    plan — a session reopened, held or committed, an object named again, a lock taken — is
    kept and said). Order: stale holds, session records (renamed out of sight, then removed),
    then objects and packs set aside in objects/.gc-trash, references counted again after
    every commit in progress has finished, and only then deleted (or put back), then locks,
    temp files, cgroups. A crash at any point leaves no kept record naming a missing object:
    the next run puts the trash back before it plans. Returns {kind: [removed]} + skipped."""
    from overlord.txn.session import remove_tree
    done = {k: [] for k in Plan.KINDS}
    skipped = []
    with _gc_lock():
        restore_trash()
        for h in p.holds if _real_dir(holds_dir()) else ():
            path = os.path.join(holds_dir(), h["name"])
            live, _ = _probe(path)
            if live is False and _rm(path):
                done["holds"].append(h)
        held, any_hold = held_sids()
        root = store.sessions_dir()
        for s in p.sessions if _real_dir(root) else ():
            if s["state"] == "removing":
                remove_tree(os.path.join(root, s["dir"]))
                done["sessions"].append(s)
                continue
            why = _session_changed(s, p, held)
            if why:
                skipped.append({"kind": "session", "name": s["sid"], "why": why})
                continue
            with _target_lock(s["target"]) if s["state"] == "timed-out" else \
                    contextlib.nullcontext(True) as free:
                why = "its target is busy" if not free else _session_changed(s, p, held_sids()[0])
                if why:
                    skipped.append({"kind": "session", "name": s["sid"], "why": why})
                    continue
                gone = os.path.join(root, GONE + s["sid"])
                try:
                    os.rename(os.path.join(root, s["sid"]), gone)
                except FileNotFoundError:
                    continue
            remove_tree(gone)
            done["sessions"].append(s)
        if p.objects or p.packs or p.tmp:
            if any_hold or held_sids()[1]:
                skipped.append({"kind": "objects", "name": "*",
                                "why": "a hold is live (a bundle import may be adding objects)"})
            else:
                _prune_objects(p, done, skipped)
        _prune_locks(p, done, skipped)
        for c in p.cgroups:
            try:
                os.rmdir(c["path"])
                done["cgroups"].append(c)
            except FileNotFoundError:
                pass
            except OSError as exc:
                skipped.append({"kind": "cgroup", "name": c["path"], "why": exc.strerror})
    return done, skipped


def _session_changed(s, p, held):
    """Why the planned session must now be kept, or None."""
    if s["sid"] in held:
        return "held"
    meta = _read_meta(s["sid"])
    if meta is None:
        return "its record is gone or damaged"
    if meta.get("state") != s["state"]:
        return f"it is {meta.get('state')} now"
    done = finished_at(meta)
    if done is not None and done != s["finished"]:
        return "its record changed since the plan"
    if s["sid"] in _journals():
        return "a commit journal names it"
    return None


def _trash():
    return os.path.join(store.home(), "objects", TRASH)


def restore_trash():
    """Put back whatever an interrupted prune set aside (loose objects and pack files)."""
    t = _trash()
    if os.path.islink(t):
        os.unlink(t)                  # never ours: nothing is taken from where it points
        return 0
    if not _real_dir(t) or not _real_dir(os.path.dirname(t)):
        return 0
    try:
        names = os.listdir(t)
    except FileNotFoundError:
        return 0
    objects_root = os.path.join(store.home(), "objects")
    n = 0
    for name in names:
        src = os.path.join(t, name)
        if name.startswith("pack-"):
            dest = os.path.join(objects_root, "packs", name[5:])
        elif len(name) == 64 and set(name) <= HEX:
            dest = os.path.join(objects_root, name[:2], name[2:])
        else:
            _rm(src)
            continue
        os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
        if not _real_dir(os.path.dirname(dest)):
            continue                  # left in the trash: never moved through a symlink
        os.rename(src, dest)
        n += 1
    with contextlib.suppress(OSError):
        os.rmdir(t)                   # (what could not go back stays, for a person to see)
    return n


def _prune_objects(p, done, skipped):
    objects_root = os.path.join(store.home(), "objects")
    packs = os.path.join(objects_root, "packs")
    t = _trash()
    if not _real_dir(objects_root):
        return
    try:
        os.mkdir(t, 0o700)
    except FileExistsError:
        if not _real_dir(t):
            return
    names_now = _all_sids()
    refs = referenced(names_now)
    moved = []           # (item kind, item, [(trash name, original path)])
    for o in p.objects:
        src = os.path.join(objects_root, o["sha"][:2], o["sha"][2:])
        if not _real_dir(os.path.dirname(src)):
            continue
        st = _lstat(src)
        if o["sha"] in refs or st is None or not _older(st, p):
            if st is not None:
                skipped.append({"kind": "object", "name": o["sha"], "why": "named again"
                                if o["sha"] in refs else "changed since the plan"})
            continue
        os.rename(src, os.path.join(t, o["sha"]))
        moved.append(("objects", o, [(o["sha"], src)]))
    for k in p.packs if _real_dir(packs) else ():
        srcs = [os.path.join(packs, f) for f in k["files"]]
        if k["why"] == "unreferenced":
            index = _index_shas(os.path.join(packs, k["name"] + ".idx"))
            if not index or not refs.isdisjoint(index):
                skipped.append({"kind": "pack", "name": k["name"], "why": "named again"})
                continue
        elif os.path.exists(os.path.join(packs, k["name"] + ".idx")):
            skipped.append({"kind": "pack", "name": k["name"], "why": "it has an index now"})
            continue
        sts = [_lstat(s) for s in srcs]
        if any(st is None or not _older(st, p) for st in sts):
            skipped.append({"kind": "pack", "name": k["name"], "why": "changed since the plan"})
            continue
        entry = []
        for f, src in sorted(zip(k["files"], srcs), key=lambda x: not x[0].endswith(".idx")):
            os.rename(src, os.path.join(t, "pack-" + f))     # the index first: no reader
            entry.append(("pack-" + f, src))                  # then finds it naming nothing
        moved.append(("packs", k, entry))
    store.fsync_dir(t)
    # a commit that found an object here before it was set aside may still be writing the
    # record that names it: wait until every commit that could be running has finished
    if not _barrier(p):
        skipped.append({"kind": "objects", "name": "*", "why": "a commit stayed in progress; "
                        "everything set aside was put back"})
        restore_trash()
        return
    refs = referenced(_all_sids())
    for kind, item, entry in moved:
        names = [item["sha"]] if kind == "objects" else \
            _index_shas(os.path.join(t, "pack-" + item["name"] + ".idx")) or ()
        back = refs.intersection(names) or (
            kind == "packs" and item["why"] == "no index"
            and os.path.exists(os.path.join(packs, item["name"] + ".idx")))
        for name, src in entry:
            if back:
                os.rename(os.path.join(t, name), src)
            else:
                _rm(os.path.join(t, name))
        if back:
            skipped.append({"kind": kind[:-1], "name": item.get("sha") or item["name"],
                            "why": "named again"})
        else:
            done[kind].append(item)
    for f in p.tmp if _real_dir(os.path.join(objects_root, "tmp")) else ():
        path = os.path.join(objects_root, f["name"])
        st = _lstat(path)
        if st is not None and _older(st, p) and _rm(path):
            done["tmp"].append(f)
    with contextlib.suppress(OSError):
        os.rmdir(t)


def _all_sids():
    try:
        return [n for n in os.listdir(store.sessions_dir()) if store.SID_RE.match(n)]
    except FileNotFoundError:
        return []


def _barrier(p):
    """Take and let go of the lock of every target a commit could be running on now (an
    open session's, or one committed since the plan): a commit holds it from its first
    object to its committed.json. False when one stays busy past BARRIER_WAIT."""
    targets = set()
    start_s = p.started_ns / 1e9
    for sid in _all_sids():
        meta = _read_meta(sid) or {}
        state = meta.get("state")
        if state in store.OPEN_STATES or \
                (state == "committed" and (_num(meta.get("committed")) or 0) >= start_s - 1):
            if isinstance(meta.get("target"), str):
                targets.add(meta["target"])
    deadline = time.monotonic() + BARRIER_WAIT
    for target in sorted(targets):
        while True:
            with _target_lock(target) as free:
                if free:
                    break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    return True


def _prune_locks(p, done, skipped):
    d = os.path.join(store.home(), "locks")
    if not _real_dir(d):
        return
    from overlord.txn import locks
    live = set()
    for sid in _all_sids():
        t = (_read_meta(sid) or {}).get("target")
        if isinstance(t, str):
            live.add(os.path.basename(locks._lock_path(t)))
    for k in p.locks:
        path = os.path.join(d, k["name"])
        if k["name"] in live:
            skipped.append({"kind": "lock", "name": k["name"], "why": "a session on its target now"})
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                skipped.append({"kind": "lock", "name": k["name"], "why": "held"})
                continue
            st, now = os.fstat(fd), _lstat(path)
            if now is None or now.st_ino != st.st_ino or not _older(st, p):
                continue
            os.unlink(path)                      # while we hold it: nobody is inside
            done["locks"].append(k)
        finally:
            os.close(fd)
