"""Git-aware sessions: the `.git/` path class, its one-line summary, lock files, ref drift, and
the git directories a target keeps outside itself (a linked worktree, a submodule).

Path class. Every path with a `.git` component is of class `git` (the repository's own
`.git/`, a nested clone's `vendor/x/.git/`); its repository is the prefix up to that
component. `commit --only git` / `--drop git` keep or leave out the class (filter_layer).

Lock files. A `*.lock` under a `.git` component is what a git process holds while it writes
(index.lock, refs/heads/main.lock, packed-refs.lock); one left in a layer was left by a git
that was killed. It is never committed: filter_layer leaves it out of every view, so it is in
no plan, no drift check and no replay, and the summary says it was left out.

Summary. summarize(target, changes) turns the git rows of a plan into one dict per repository
(objects, packs, refs before -> after, HEAD, index, config, hooks, the rest counted) and line()
into `git: 3 objects, refs/heads/main moved a1b2c3d → d4e5f6a, ...`. It reads only what the
plan names (a ref file, packed-refs when it changed, the listing of a removed object
directory): its cost grows with the change, never with the repository. It never raises for a
broken repository: what it cannot read is said in the summary (`problem`).

Ref drift. check_drift (txn/commit.py) finds the paths that moved under the session; for ref
files (HEAD, refs/**, packed-refs) ref_drifts() names the ref and its values instead, from the
copy of the ref file kept when the session first touched it (session._layer_records), and adds
the one case a path check cannot see: a loose ref created outside for a ref the session moved
in packed-refs.

External git directories. inspect(target) reads the target's `.git` when it is a file
(`gitdir: ...`): a linked worktree (its git dir and the common dir it names) or a submodule
whose git dir lies outside the target. A jail binds those directories read-only at their real
paths (binds(); git status/log/diff work, a write fails with EROFS); an unjailed session would
let git write them outside the transaction, so refuse_unjailed() refuses to open one.
"""
import os
import re
import stat

from overlord.errors import OverlordError, UsageError
from overlord.text import escape_path, escape_text

GIT = ".git"
CLASSES = ("git",)
SHORT = 7                        # hex digits of an object id shown, as `git log --oneline`
REF_CAP = 4096                   # bytes read of a loose ref file
PACKED_CAP = 16 << 20            # bytes read of packed-refs
LIST_CAP = 8                     # refs named on a line before "and N more"
OID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
LOOSE = re.compile(r"^objects/[0-9a-f]{2}/(?:[0-9a-f]{38}|[0-9a-f]{62})$")
FANOUT = re.compile(r"^objects/[0-9a-f]{2}$")
PACK = re.compile(r"^objects/pack/pack-[0-9a-f]+\.pack$")
PACK_PART = re.compile(r"^objects/pack/pack-[0-9a-f]+\.(?:idx|rev|bitmap|keep|promisor|mtimes)$")
CONFIG = re.compile(r"^(?:(?:modules/.+|worktrees/[^/]+)/)?config(?:\.worktree)?$")
HOOK = re.compile(r"^(?:modules/.+/)?hooks/[^/]+$")
HOOKS_DIR = re.compile(r"^(?:modules/.+/)?hooks$")
REDIRECT = re.compile(r"^(?:(?:modules/.+|worktrees/[^/]+)/)?(?:commondir|gitdir)$")


# -- the path class ----------------------------------------------------------------------------

def repo_of(path):
    """The repository prefix of a git-class path ('.git', 'vendor/x/.git'), else None."""
    if path == GIT or path.startswith(GIT + "/"):
        return GIT
    if "/.git" not in path:
        return None
    parts = path.split("/")
    if GIT not in parts:
        return None
    return "/".join(parts[:parts.index(GIT) + 1])


def is_git(path):
    return repo_of(path) is not None


def inner(path):
    """A git-class path relative to its repository's git dir ('' for the dir itself)."""
    repo = repo_of(path)
    return path[len(repo) + 1:] if repo is not None else None


def is_lock(path):
    """A `*.lock` at or under a `.git` component: git's lock files, never committed."""
    rest = inner(path)
    return bool(rest) and any(part.endswith(".lock") for part in rest.split("/"))


def is_ref_file(path):
    """HEAD, packed-refs or a loose ref: the files a ref's value lives in."""
    rest = inner(path)
    return rest in ("HEAD", "packed-refs") or bool(rest and rest.startswith("refs/"))


def path_classes(only, drop):
    """(keep classes, drop classes) named among selectors, and the other selectors. A class
    selector is a bare class name (`git`)."""
    keep, gone, rest_only, rest_drop = set(), set(), [], []
    for items, classes, rest in ((only, keep, rest_only), (drop, gone, rest_drop)):
        for item in items or ():
            for sel in item.split(","):
                sel = sel.strip()
                if not sel:
                    continue
                if sel in CLASSES:
                    classes.add(sel)
                else:
                    rest.append(sel)
    return keep, gone, rest_only, rest_drop


def filter_layer(entries, keep=(), gone=()):
    """(entries of one layer without lock files and as the class selectors choose, the lock
    entries left out). keep={'git'}: only git-class paths (and the directories above them);
    gone={'git'}: none of them."""
    out, locks = {}, {}
    for path, entry in entries.items():
        if "/.git" in path or path.startswith(GIT):
            if is_lock(path):
                locks[path] = entry
                continue
        if not keep and not gone:
            out[path] = entry
            continue
        git = is_git(path)
        if ("git" in gone and git) or ("git" in keep and not git):
            continue
        out[path] = entry
    if "git" in keep:
        # the directories a git path lies in must exist for it to land
        for path in list(out):
            parts = path.split("/")
            for i in range(len(parts)):
                above = "/".join(parts[:i])
                if above not in out and above in entries:
                    entry = entries[above]
                    if entry.kind != "dir" or entry.opaque:
                        raise UsageError(f"--only git: {escape_path(path)} lies under "
                                         f"{escape_path(above) or '.'}, which the session "
                                         "replaced; commit it without --only git")
                    out[above] = entry
    return out, locks


# -- reading refs --------------------------------------------------------------------------------

def _walk(target, names):
    """An O_PATH fd of the directory target/names[0]/..., no symlink followed below target;
    OSError when there is none."""
    fd = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_at(target, path, cap):
    """The bytes of a regular file under target (no symlink followed anywhere), or None."""
    parts = path.split("/")
    try:
        fd = _walk(target, parts[:-1])
    except OSError:
        return None
    try:
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _read_fd(leaf, cap)


def _read_file(path, cap):
    """The bytes of a regular file (not through a symlink), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    return _read_fd(fd, cap)


def _read_fd(fd, cap):
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, cap)
    except OSError:
        return None
    finally:
        os.close(fd)


BAD = "?"        # a ref file that holds neither an object id nor `ref: NAME`


def ref_value(data):
    """A loose ref's value: the object id, `ref: NAME`, BAD, or None (no file)."""
    if data is None:
        return None
    text = data.decode("utf-8", "surrogateescape").strip()
    if OID.match(text):
        return text
    if text.startswith("ref:") and text[4:].strip() and "\n" not in text:
        return "ref: " + text[4:].strip()
    return BAD


def packed(data):
    """{ref name: object id} of a packed-refs file (peeled lines and junk skipped)."""
    out = {}
    if not data:
        return out
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        if not line or line[0] in "#^":
            continue
        oid, _, name = line.partition(" ")
        if OID.match(oid) and name:
            out[name] = oid
    return out


def short(value):
    if value is None:
        return "-"
    if value.startswith("ref: "):
        return value[5:]
    return value[:SHORT] if OID.match(value) else BAD


class Sides:
    """A pending plan's two sides of a path: the real tree now, and the session's view."""

    def __init__(self, target, changes):
        self.target = target
        self.by_path = {ch.path: ch for ch in changes}
        self._packed = {}

    def real(self, path, cap=REF_CAP):
        return _read_at(self.target, path, cap)

    def session(self, path, cap=REF_CAP):
        ch = self.by_path.get(path)
        if ch is not None:
            entry = ch.entry
            return _read_file(entry.src, cap) if entry.kind == "file" else None
        parts = path.split("/")
        for i in range(1, len(parts)):
            above = self.by_path.get("/".join(parts[:i]))
            if above is not None and (above.entry.kind != "dir" or
                                      above.kind in ("added", "replaced-dir", "deleted")):
                return None          # gone with it, or only what the plan names is in it
        return self.real(path, cap)

    def packed(self, repo, side):
        key = (repo, side)
        if key not in self._packed:
            read = self.real if side == "real" else self.session
            self._packed[key] = packed(read(f"{repo}/packed-refs", PACKED_CAP))
        return self._packed[key]

    def ref(self, repo, name, side):
        """A ref's value on one side: its loose file, else packed-refs."""
        read = self.real if side == "real" else self.session
        value = ref_value(read(f"{repo}/{name}"))
        if value is None and name != "HEAD":
            value = self.packed(repo, side).get(name)
        return value

    def listing(self, path):
        """Names in a real directory (what replay removes with it)."""
        try:
            fd = _walk(self.target, path.split("/"))
        except OSError:
            return []
        try:
            rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                return sorted(os.listdir(rfd))
            finally:
                os.close(rfd)
        except OSError:
            return []
        finally:
            os.close(fd)


# -- the summary ---------------------------------------------------------------------------------

def _new_repo(repo):
    return {"dir": repo, "paths": 0, "state": None, "objects": {"added": 0, "removed": 0},
            "packs": {"added": 0, "removed": 0}, "refs": [], "head": None, "index": None,
            "packed_refs": None, "config": [], "hooks": [], "other": 0, "left_out": [],
            "problem": None, "line": ""}


def summarize(target, changes, left_out=(), rows=None):
    """The git summary of a plan (see the module's docstring), or None when nothing of class
    git changed. changes: [Change] of a pending plan (both sides readable: refs get values);
    or rows: [(path, kind)] only (a rolled-back session's records: names, no values)."""
    sides = Sides(target, changes) if rows is None else None
    if rows is None:
        rows = [(ch.path, ch.kind) for ch in changes if is_git(ch.path)]
    else:
        rows = [(p, k) for p, k in rows if is_git(p) and not is_lock(p)]
    left_out = sorted(left_out, key=lambda p: p.split("/"))
    if not rows and not left_out:
        return None
    repos = {}
    for path, kind in rows:
        repo = repos.setdefault(repo_of(path), _new_repo(repo_of(path)))
        repo["paths"] += 1
        try:
            _classify(repo, inner(path), kind, sides, path)
        except (OSError, ValueError) as exc:          # a broken repository is said, never raised
            repo["problem"] = repo["problem"] or f"unreadable: {exc}"
    for path in left_out:
        repos.setdefault(repo_of(path), _new_repo(repo_of(path)))["left_out"].append(path)
    for repo in repos.values():
        try:
            _refs(repo, sides, [(p, k) for p, k in rows if repo_of(p) == repo["dir"]])
        except (OSError, ValueError) as exc:
            repo["problem"] = repo["problem"] or f"unreadable: {exc}"
        if sides is not None and repo["problem"] is None:
            repo["problem"] = _health(repo, sides)
        repo["line"] = line(repo)
    out = [repos[k] for k in sorted(repos, key=lambda p: p.split("/"))]
    return {"paths": len(rows), "left_out": left_out, "repos": out}


def _classify(repo, rest, kind, sides, path):
    if rest == "":
        repo["state"] = {"added": "new repository", "deleted": "repository removed",
                         "replaced-dir": "repository replaced"}.get(kind)
        ch = sides.by_path.get(path) if sides is not None else None
        if kind == "modified" and ch is not None and ch.entry.kind != "dir":
            was_dir = ch.real is not None and stat.S_ISDIR(ch.real.st_mode)
            repo["state"] = (f"{GIT} replaced by a {ch.entry.kind}" if was_dir
                             else f"{GIT} changed")           # a `gitdir:` file
        return
    if LOOSE.match(rest):
        if kind == "added":
            repo["objects"]["added"] += 1
        elif kind == "deleted":
            repo["objects"]["removed"] += 1
        return
    if FANOUT.match(rest):
        if kind in ("deleted", "replaced-dir"):
            if sides is not None:
                repo["objects"]["removed"] += len(sides.listing(path))
            else:                                     # names only: the directories are counted
                repo["objects"]["removed_dirs"] = repo["objects"].get("removed_dirs", 0) + 1
        return
    if PACK.match(rest):
        if kind in ("added", "deleted"):
            repo["packs"]["added" if kind == "added" else "removed"] += 1
        return
    if PACK_PART.match(rest) or rest in ("objects", "objects/pack", "refs") or rest == "HEAD":
        return
    if rest.startswith("refs/") or rest == "packed-refs":
        if rest == "packed-refs":
            repo["packed_refs"] = kind
        return
    if rest == "index" or rest.startswith("sharedindex."):
        repo["index"] = kind
        return
    if CONFIG.match(rest):
        repo["config"].append({"path": rest, "kind": kind})
        return
    if HOOK.match(rest) and not rest.endswith(".sample"):       # git never runs a *.sample
        repo["hooks"].append({"path": rest, "kind": kind})
        return
    if HOOKS_DIR.match(rest) and not _is_dir(sides, path, kind) and kind != "deleted":
        repo["hooks"].append({"path": rest, "kind": kind})   # the folder swapped for a link
        return
    if REDIRECT.match(rest):          # where git finds the common dir: config and hooks too
        repo["config"].append({"path": rest, "kind": kind})
        return
    if kind in ("added", "modified", "deleted") and not _is_dir(sides, path, kind):
        repo["other"] += 1


def _is_dir(sides, path, kind):
    if sides is None:
        return False
    ch = sides.by_path.get(path)
    if ch is None:
        return False
    if kind == "deleted":
        return ch.real is not None and stat.S_ISDIR(ch.real.st_mode)
    return ch.entry.kind == "dir"


def _refs(repo, sides, rows):
    """The refs the plan moves: loose ref files it names, refs under a removed directory,
    every name whose packed-refs entry differs, and HEAD. Without sides (names only): the
    loose ref files named, created, deleted or changed."""
    name = repo["dir"]
    paths = [p for p, _ in rows]
    if sides is None:
        kinds = {"added": "created", "deleted": "deleted"}
        repo["refs"] = [{"name": inner(p), "before": None, "after": None,
                         "change": kinds.get(k, "changed")}
                        for p, k in sorted(rows) if inner(p).startswith("refs/")]
        if any(inner(p) == "HEAD" for p in paths):
            repo["head"] = {"before": None, "after": None}
        return
    names = set()
    for path in paths:
        rest = inner(path)
        if rest.startswith("refs/"):
            ch = sides.by_path.get(path)
            if ch is not None and ch.kind in ("deleted", "replaced-dir") and ch.real is not None \
                    and stat.S_ISDIR(ch.real.st_mode):
                names.update(_loose_under(sides, path, rest))
            elif ch is None or ch.entry.kind != "dir":
                names.add(rest)
    if repo["packed_refs"]:
        before, after = sides.packed(name, "real"), sides.packed(name, "session")
        names.update(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    refs = []
    for ref in sorted(names):
        before, after = sides.ref(name, ref, "real"), sides.ref(name, ref, "session")
        if before == after:
            continue                # packed or unpacked, not moved
        change = "created" if before is None else "deleted" if after is None else "moved"
        refs.append({"name": ref, "before": before, "after": after, "change": change})
    repo["refs"] = refs
    if any(inner(p) == "HEAD" for p in paths):
        before, after = sides.ref(name, "HEAD", "real"), sides.ref(name, "HEAD", "session")
        if before != after:
            repo["head"] = {"before": before, "after": after}


def _loose_under(sides, path, rest):
    """Loose refs in a real directory the plan removes (bounded by what it removes)."""
    out, todo = [], [(path, rest)]
    while todo and len(out) < 10000:
        p, r = todo.pop()
        for child in sides.listing(p):
            st = None
            try:
                st = os.lstat(os.path.join(sides.target, p, child))
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append((f"{p}/{child}", f"{r}/{child}"))
            else:
                out.append(f"{r}/{child}")
    return out


def _health(repo, sides):
    """What makes the repository unusable after this plan, said once: a `.git` file pointing
    nowhere, a HEAD that is neither a ref nor an object id."""
    gitdir = repo["dir"]
    top = sides.by_path.get(gitdir)
    if top is not None and top.entry.kind == "file":
        data = _read_file(top.entry.src, REF_CAP)
        return _gitfile_problem(data, os.path.dirname(os.path.join(sides.target, gitdir)))
    if repo["state"] == "repository removed":
        return None
    head = sides.ref(gitdir, "HEAD", "session")
    if head is None or head == BAD:
        return "HEAD is unreadable (neither a ref nor an object id): git will not see a repository here"
    return None


def _gitfile_problem(data, base):
    if data is None:
        return f"{GIT} is unreadable"
    text = data.decode("utf-8", "surrogateescape").strip()
    if not text.startswith("gitdir:"):
        return f"{GIT} is a file without a `gitdir:` line: git will not see a repository here"
    where = os.path.join(base, text[7:].strip())
    if not os.path.isdir(where):
        return f"{GIT} points to {where}, which is not a directory"
    return None


def _ref_words(ref):
    """A ref change in words (unescaped)."""
    name, change, b, a = ref["name"], ref["change"], ref["before"], ref["after"]
    if change == "changed":
        return f"{name} changed"
    for prefix, noun in (("refs/heads/", "branch"), ("refs/tags/", "tag")):
        if name.startswith(prefix):
            short_name = name[len(prefix):]
            if change == "created":
                return f"new {noun} {short_name} at {short(a)}"
            if change == "deleted":
                return f"{noun} {short_name} deleted (was {short(b)})"
            if noun == "tag":
                return f"tag {short_name} moved {short(b)} → {short(a)}"
            return f"{name} moved {short(b)} → {short(a)}"
    if name == "refs/stash":
        return {"created": f"stash saved at {short(a)}", "deleted": "stash dropped"}.get(
            change, f"stash moved {short(b)} → {short(a)}")
    if change == "created":
        return f"{name} created at {short(a)}"
    if change == "deleted":
        return f"{name} deleted (was {short(b)})"
    return f"{name} moved {short(b)} → {short(a)}"


def _count(n, word, plural=None):
    return f"{n} {word if n == 1 else plural or word + 's'}"


def line(repo):
    """One repository's summary as one line (unescaped: ref names and paths came from the
    session -- a face escapes it for a terminal)."""
    head = "git" if repo["dir"] == GIT else f"git ({repo['dir']})"
    parts = []
    if repo.get("state"):
        parts.append(repo["state"])
    objects = repo["objects"]
    if objects["added"]:
        parts.append(_count(objects["added"], "object"))
    if objects["removed"]:
        parts.append(f"{_count(objects['removed'], 'loose object')} removed")
    elif objects.get("removed_dirs"):
        parts.append(f"loose objects in {_count(objects['removed_dirs'], 'directory', 'directories')} removed")
    refs = repo["refs"]
    parts.extend(_ref_words(r) for r in refs[:LIST_CAP])
    if len(refs) > LIST_CAP:
        parts.append(f"and {len(refs) - LIST_CAP} more refs")
    if repo["head"] is not None:
        b, a = repo["head"]["before"], repo["head"]["after"]
        parts.append("HEAD changed" if b is None and a is None else f"HEAD {short(b)} → {short(a)}")
    if repo["index"]:
        parts.append("index " + ("changed" if repo["index"] == "modified" else repo["index"]))
    for verb in ("added", "removed"):
        if repo["packs"][verb]:
            parts.append(f"{_count(repo['packs'][verb], 'pack')} {verb}")
    if repo["packed_refs"] and not refs:
        parts.append("refs packed")
    for item in repo["config"]:
        parts.append(f"{item['path']} {_verb(item['kind'])}")
    for item in repo["hooks"]:
        name = item["path"].removeprefix("hooks/")
        parts.append(f"hooks directory {_verb(item['kind'])}" if HOOKS_DIR.match(item["path"])
                     else f"hook {name} {_verb(item['kind'])}")
    if repo["other"]:
        parts.append(_count(repo["other"], "other file"))
    for path in repo.get("left_out", ()):
        parts.append(f"lock file {path} left out (never committed)")
    if repo.get("problem"):
        parts.append(repo["problem"])
    return f"{head}: " + (", ".join(parts) if parts else _count(repo["paths"], "path") + " changed")


def _verb(kind):
    return {"modified": "changed", "deleted": "removed", "replaced-dir": "replaced"}.get(kind, kind)


# -- ref drift -----------------------------------------------------------------------------------

def ref_drifts(session, view, drifts, make):
    """check_drift's list with each drift on a ref file named by its ref (first, in path
    order), plus loose refs created outside for refs the session moved in packed-refs.
    make(path, reason) builds a Drift."""
    base = session.base()
    target = session.target
    named, rest = [], []
    for d in drifts:
        if is_ref_file(d.path) and d.reason in ("modified-externally", "deleted-externally",
                                                "created-externally"):
            try:
                named.append(make(d.path, _ref_reason(session, target, d.path, base)))
            except (OSError, ValueError):
                named.append(d)
        else:
            rest.append(d)
    seen = {d.path for d in drifts}
    try:
        named.extend(make(p, why) for p, why in _created_outside(session, view, base)
                     if p not in seen)
    except (OSError, ValueError):
        pass
    return named + rest


def _base_copy(session, fp, cap):
    """The bytes of a ref file as the session first saw it: None (it did not exist), or the
    kept copy; raises LookupError when no copy was kept."""
    if fp is None:
        return None
    sha = fp.get("sha256") if isinstance(fp, dict) else None
    data = _read_file(session.path("base", sha), cap) if sha else None
    if data is None:
        raise LookupError
    return data


def _kept_packed(session, fp):
    """{ref: oid} of a packed-refs file as the session first saw it; None when not known."""
    if fp == "unknown":
        return None
    try:
        return packed(_base_copy(session, fp, PACKED_CAP))
    except LookupError:
        return None


def _ref_reason(session, target, path, base):
    repo, rest = repo_of(path), inner(path)
    fp = base.get(path, "unknown")
    if rest == "packed-refs":
        now = packed(_read_at(target, path, PACKED_CAP))
        was = _kept_packed(session, fp)
        if was is None:
            return "packed-refs changed outside the session"
        moved = sorted(n for n in set(was) | set(now) if was.get(n) != now.get(n))
        if not moved:
            return "packed-refs rewritten outside the session (git pack-refs or gc)"
        first = moved[0]
        more = f" (and {len(moved) - 1} more refs)" if len(moved) > 1 else ""
        return (f"{escape_text(first)} moved outside the session: {short(was.get(first))} → "
                f"{short(now.get(first))}, in packed-refs{more}")
    now = ref_value(_read_at(target, path, REF_CAP))
    if now is None and rest != "HEAD":
        now = packed(_read_at(target, f"{repo}/packed-refs", PACKED_CAP)).get(rest)
    name = escape_text(rest)
    try:
        was = ref_value(_base_copy(session, fp, REF_CAP)) if fp != "unknown" else BAD
    except LookupError:
        was = BAD
    if was is None and rest != "HEAD":
        was = _packed_then(session, target, repo, rest, base)    # it lived in packed-refs
    if was == BAD:
        return f"{name} changed outside the session (now {short(now)})"
    if was is None:
        return f"{name} created outside the session at {short(now)}"
    if now is None:
        return f"{name} deleted outside the session (was {short(was)})"
    if now == was:
        return f"{name} packed outside the session (git pack-refs or gc)"
    return f"{name} moved outside the session: {short(was)} → {short(now)}"


def _packed_then(session, target, repo, ref, base):
    """A ref's packed-refs value as the session saw it: from the kept copy when the session
    touched packed-refs, else the real file (unless it changed since the session opened:
    then unknown, BAD)."""
    path = f"{repo}/packed-refs"
    fp = base.get(path, "unknown")
    if fp != "unknown":
        try:
            return packed(_base_copy(session, fp, PACKED_CAP)).get(ref)
        except LookupError:
            return BAD
    try:
        st = os.lstat(os.path.join(target, path))
    except OSError:
        return None
    if st.st_ctime_ns >= (session.meta.get("open_stamp_ns") or 0):
        return BAD
    return packed(_read_at(target, path, PACKED_CAP)).get(ref)


def _created_outside(session, view, base):
    """Refs the session moves through packed-refs whose loose file appeared or changed in the
    real tree since the session opened, where the session never touched it: after the commit
    that loose file would win over the session's packed value."""
    stamp = session.meta.get("open_stamp_ns") or 0
    out = []
    for path, entry in view.items():
        if inner(path) != "packed-refs" or entry.kind != "file":
            continue
        repo = repo_of(path)
        was = _kept_packed(session, base.get(path, "unknown"))
        if was is None:
            was = packed(_read_at(session.target, path, PACKED_CAP))
        mine = packed(_read_file(entry.src, PACKED_CAP))
        for ref in sorted(n for n in set(was) | set(mine) if was.get(n) != mine.get(n)):
            loose = f"{repo}/{ref}"
            if loose in view:
                continue
            try:
                st = os.lstat(os.path.join(session.target, loose))
            except OSError:
                continue
            if st.st_ctime_ns >= stamp:
                now = ref_value(_read_at(session.target, loose, REF_CAP))
                out.append((loose, f"{escape_text(ref)} moved outside the session: "
                                   f"{short(was.get(ref))} → {short(now)}"))
    return out


# -- git directories outside the target ----------------------------------------------------------

def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def inspect(target):
    """What the target's `.git` is, for the session record (meta["git"]), or None when it has
    none: {"kind": "repository" | "worktree" | "submodule" | "gitfile", "external": [{"path",
    "role"}], "bind": [dirs a jail binds read-only], "problem": str | None}. Never raises."""
    dotgit = os.path.join(target, GIT)
    try:
        st = os.lstat(dotgit)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return _nothing_outside("repository")
    if not stat.S_ISREG(st.st_mode):
        return _nothing_outside("gitfile", f"{GIT} is neither a directory nor a file")
    data = _read_file(dotgit, REF_CAP)
    text = (data or b"").decode("utf-8", "surrogateescape").strip()
    if not text.startswith("gitdir:"):
        return _nothing_outside("gitfile", f"{GIT} is a file without a `gitdir:` line")
    gitdir = os.path.realpath(os.path.join(target, text[7:].strip()))
    if not os.path.isdir(gitdir):
        return _nothing_outside("gitfile", f"{GIT} points to {gitdir}, which is not a directory")
    if _inside(gitdir, target):
        return _nothing_outside("gitfile")
    external = [{"path": gitdir, "role": "git dir"}]
    common = _read_file(os.path.join(gitdir, "commondir"), REF_CAP)
    kind, problem = "submodule", None
    if common is not None:
        kind = "worktree"
        cdir = os.path.realpath(os.path.join(gitdir, common.decode("utf-8", "surrogateescape").strip()))
        if not _inside(cdir, target):
            external.append({"path": cdir, "role": "common dir"})
        problem = _verify_worktree(target, gitdir, cdir)
    else:
        problem = _verify_submodule(target, gitdir)
    for ext in external:
        if _inside(target, ext["path"]):
            problem = problem or f"the target lies inside its own git directory {ext['path']}"
    bind = []
    if problem is None:
        for ext in sorted(external, key=lambda e: len(e["path"])):
            if not any(_inside(ext["path"], b) for b in bind):
                bind.append(ext["path"])
    return {"kind": kind, "external": external, "bind": bind, "problem": problem}


def _nothing_outside(kind, problem=None):
    return {"kind": kind, "external": [], "bind": [], "problem": problem}


def _verify_worktree(target, gitdir, common):
    """git records where a linked worktree is: <gitdir>/gitdir names its `.git` file, and the
    git dir is <common>/worktrees/<name>. A `.git` file naming any other directory is not
    this repository's worktree (it could name a stranger's repository): never bound."""
    back = _read_file(os.path.join(gitdir, "gitdir"), REF_CAP)
    if back is None:
        return f"{gitdir} has no gitdir file naming this worktree"
    named = os.path.realpath(os.path.join(gitdir, back.decode("utf-8", "surrogateescape").strip()))
    if named != os.path.join(target, GIT):
        return f"{gitdir} belongs to another worktree ({named})"
    if os.path.dirname(gitdir) != os.path.join(common, "worktrees"):
        return f"{gitdir} is not a worktree of {common}"
    return None


def _verify_submodule(target, gitdir):
    """A submodule's git dir names its worktree in core.worktree."""
    data = _read_file(os.path.join(gitdir, "config"), 1 << 20)
    worktree = _config_value(data, "core", "worktree") if data else None
    if worktree is None:
        return f"{gitdir} names no worktree (core.worktree)"
    if os.path.realpath(os.path.join(gitdir, worktree)) != target:
        return f"{gitdir} belongs to another worktree ({worktree})"
    return None


def _config_value(data, section, key):
    """The last `key = value` of [section] in a git config file (a small reader: sections
    without subsections, quotes stripped)."""
    current, found = None, None
    for raw in data.decode("utf-8", "surrogateescape").splitlines():
        text = raw.strip()
        if not text or text[0] in "#;":
            continue
        if text.startswith("["):
            current = text[1:text.find("]")].strip().lower() if "]" in text else None
            continue
        if current != section:
            continue
        name, eq, value = text.partition("=")
        if eq and name.strip().lower() == key:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            found = value
    return found


def record(target):
    """meta["git"] at open: inspect() less what a reader of the record need not know."""
    info = inspect(target)
    if info is None:
        return None
    return {"kind": info["kind"], "external": info["external"], "readonly": info["bind"],
            "problem": info["problem"]}


def refuse_unjailed(target, grants):
    """An unjailed session on a target whose git directory lies outside it would let git
    write that directory outside the transaction: refused, with what to do."""
    if grants.get("jail"):
        return
    info = inspect(target)
    if not info or not info["external"]:
        return
    where = info["external"][-1]["path"]
    what = "a linked worktree" if info["kind"] == "worktree" else "a submodule"
    main = os.path.dirname(where) if where.endswith("/" + GIT) else where
    raise OverlordError(
        f"the target is {what} whose git directory {escape_path(where)} lies outside it: git "
        f"in an unjailed session would write it outside the transaction; run with --jail "
        f"(kernel backend: it is mounted read-only there) or target the main repository "
        f"{escape_path(main)}")


def binds(target):
    """The external git directories a jail binds read-only at their real paths."""
    info = inspect(target)
    return list(info["bind"]) if info else []


# -- who the operator is, for git in a jail ------------------------------------------------------

_identity = {}


def identity():
    """(user.name, user.email) of the operator's global git config (either may be None), once
    per state of those files: read directly when they are plain (_read_simple), else asked of
    git itself (includes and XDG paths honoured)."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = [os.environ.get("GIT_CONFIG_GLOBAL") or os.path.join(home, ".gitconfig"),
             os.path.join(xdg, "git", "config")]
    key = []
    for f in files:
        try:
            st = os.stat(f)
            key.append((f, st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            key.append((f, None))
    key = tuple(key)
    if key not in _identity:
        _identity.clear()
        _identity[key] = _read_simple([f for f, *_ in reversed(key)]) or _ask_git()
    return _identity[key]


_PLAIN = re.compile(r"[^\\#;]*")


def _read_simple(files):
    """(name, email) read from config files (later ones win, as git reads the XDG file
    before ~/.gitconfig) this module's small reader reads exactly -- no
    include, no escape, no inline comment, `[section]` lines alone -- without starting git
    (two processes for every jailed command); None when a file is not that simple."""
    name = email = None
    for f in files:
        try:
            with open(f, "rb") as fh:
                data = fh.read(1 << 16)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        for raw in data.decode("utf-8", "replace").splitlines():
            text = raw.strip()
            if not text or text[0] in "#;":
                continue
            if text.startswith("[") and not (text.endswith("]") and _PLAIN.fullmatch(text)):
                return None
            if "include" in text.lower() or not _PLAIN.fullmatch(text):
                return None
        name = _config_value(data, "user", "name") or name
        email = _config_value(data, "user", "email") or email
    return name, email


def _ask_git():
    import subprocess               # only for a git target: `exec` of any other stays light
    from overlord import hosttools
    git = hosttools.find("git")     # host-side: never a git of the caller's PATH, installed
    if git is None:
        return None, None
    out = {}
    for name in ("name", "email"):
        try:
            proc = subprocess.run([git, "config", "--global", "--includes", "--get",
                                   f"user.{name}"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None, None
        value = proc.stdout.decode("utf-8", "replace").strip()
        out[name] = value if proc.returncode == 0 and value and "\n" not in value else None
    return out["name"], out["email"]


def _quote(value):
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def jail_config(target):
    """The text of the jail's global git config ($HOME is the jail's /tmp). It holds only the
    operator's user.name/user.email (global level: a repository that sets its own keeps it;
    for every jailed session, since a command may `git init` or clone and commit there) and
    safe.directory for the target (inside the jail, git's ownership check guards
    nothing the jail does not: any hook or config the repository brings runs jailed)."""
    name, email = identity()
    text = ""
    if name or email:
        text += "[user]\n"
        text += f"\tname = {_quote(name)}\n" if name else ""
        text += f"\temail = {_quote(email)}\n" if email else ""
    text += f"[safe]\n\tdirectory = {_quote(target)}\n"
    return text
