"""Skills as operations: list, show, add (install a machine skill), new (scaffold a project
skill), remove. The skill format and the two homes are overlord/agent/skills.py's.

Adding and removing a machine skill are a person's acts on OVERLORD_HOME: each goes on the
audit chain (skill.add / skill.remove, with the SKILL.md's sha256) and is refused before
anything changes when the chain cannot take the line. `new` writes a scaffold into the real
folder -- a person's act too, like editing any file there; an agent writes a project skill
inside its session instead, as a reviewed diff.
"""
import contextlib
import fcntl
import hashlib
import os
import shutil
import stat

from overlord.agent import skills as S
from overlord.errors import NotFound, OverlordError, UsageError
from overlord.ops.grants import resolve_target
from overlord.text import escape_path, escape_text
from overlord.trust import audit, policy
from overlord.txn import store

ADD_MAX_BYTES = 16 << 20          # a machine skill, all its files
ADD_MAX_FILES = 1000


def _entry(skill, shadowed=False, allowed=True):
    return {"name": skill.name, "description": skill.description, "when": skill.when,
            "source": skill.source, "path": skill.path, "sha256": skill.sha256,
            "shadowed": shadowed, "allowed": allowed, "files": skill.files,
            "offered": bool(allowed is not False and not shadowed)}


def skills_list(target=None):
    """Every skill a session on target would see: its project skills, then the machine skills
    (shadowed: a project folder of that name hides it; allowed: the folder's policy lets it be
    offered, None without a target). Without a target, the machine skills only."""
    real = resolve_target(target) if target is not None else None
    allowed = policy.rule(real)["skills"] if real else None
    project, claimed, machine, warnings = S.everything(real)
    rows = [_entry(project[n]) for n in sorted(project)]
    for name in sorted(machine):
        rows.append(_entry(machine[name], shadowed=name in claimed,
                           allowed=S.permits(allowed, name) if real else None))
    return {"target": real, "skills": rows, "warnings": warnings,
            "policy": allowed, "machine_dir": S.machine_root()}


def skill_show(name, target=None):
    """The skill a session on target would load under `name` (the project's if it has one),
    with its SKILL.md text and its files."""
    _name(name)
    real = resolve_target(target) if target is not None else None
    project, claimed, machine, warnings = S.everything(real)
    if name in project:
        skill, entry = project[name], _entry(project[name])
    elif name in claimed:
        raise OverlordError(f"the project skill {name!r} cannot be read: {claimed[name]}")
    elif name in machine:
        allowed = policy.rule(real)["skills"] if real else None
        skill = machine[name]
        entry = _entry(skill, allowed=S.permits(allowed, name) if real else None)
    else:
        where = f" in {escape_path(real)} or" if real else ""
        raise NotFound(f"no skill named {name!r}{where} among the machine skills "
                       f"({escape_path(S.machine_root())})")
    return dict(entry, text=skill.text)


def _name(name):
    why = S.check_name(name)
    if why:
        raise UsageError(why)


@contextlib.contextmanager
def _locked():
    """The machine skills' folder, made if missing, held for one add or remove."""
    root = S.machine_root()
    store.ensure_home()
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise OverlordError(f"{escape_path(root)} is not a directory (a symlink is not followed)")
    fd = os.open(os.path.join(store.home(), "locks", "skills.lock"),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield root
    finally:
        os.close(fd)


def _source(path):
    """(folder, SKILL.md bytes, parsed head, [(rel, bytes)]) of a skill folder to install;
    every refusal a clear line, before anything is written."""
    if not path:
        raise UsageError("give the path of a skill folder (one holding a SKILL.md)")
    shown = escape_path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UsageError(f"{shown} does not exist") from None
    if stat.S_ISREG(st.st_mode) and os.path.basename(path) == S.SKILL_FILE:
        path = os.path.dirname(os.path.abspath(path))
        shown = escape_path(path)
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        path = os.path.realpath(path)              # the folder a person named, resolved once
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{shown} is not a skill folder (a folder holding a {S.SKILL_FILE})")
    files, total = [], 0
    for base, dirs, names in os.walk(path):
        dirs.sort()
        for d in list(dirs):
            if os.path.islink(os.path.join(base, d)):
                raise UsageError(f"{escape_path(os.path.join(base, d))} is a symlink: a skill "
                                 "holds regular files and folders only")
        for n in sorted(names):
            full = os.path.join(base, n)
            rel = os.path.relpath(full, path)
            fst = os.lstat(full)
            if not stat.S_ISREG(fst.st_mode):
                what = "a symlink" if stat.S_ISLNK(fst.st_mode) else "not a regular file"
                raise UsageError(f"{escape_path(full)} is {what}: a skill holds regular files "
                                 "and folders only")
            total += fst.st_size
            if total > ADD_MAX_BYTES or len(files) >= ADD_MAX_FILES:
                raise UsageError(f"{shown} is too large for a skill (at most {ADD_MAX_FILES} "
                                 f"files, {ADD_MAX_BYTES >> 20} MiB)")
            with open(full, "rb") as f:
                files.append((rel, f.read()))
    data = dict(files).get(S.SKILL_FILE)
    if data is None:
        raise UsageError(f"{shown} holds no {S.SKILL_FILE}: it is not a skill folder")
    try:
        head = S.parse(data)
    except S.Malformed as exc:
        raise UsageError(f"{escape_path(os.path.join(path, S.SKILL_FILE))}: {exc}") from None
    return path, data, head, files


def skill_add(path, by=None):
    """Install the skill folder at path as the machine skill its front matter names."""
    folder, data, head, files = _source(path)
    name = head["name"]
    audit.ready()                  # installed only where the act can be recorded
    with _locked() as root:
        dest = os.path.join(root, name)
        if os.path.lexists(dest):
            raise OverlordError(f"a machine skill named {name!r} is already installed "
                                f"({escape_path(dest)}); remove it first: overlord skills rm {name}")
        tmp = os.path.join(root, f".add-{name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            os.mkdir(tmp, 0o755)
            for rel, content in files:
                out = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(out), 0o755, exist_ok=True)
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, 0o644)
                try:
                    store.write_all(fd, content)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.rename(tmp, dest)
            store.fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    digest = hashlib.sha256(data).hexdigest()
    audit.append("skill.add", name=name, sha256=digest, files=len(files),
                 bytes=sum(len(c) for _, c in files), by=by)
    return {"name": name, "path": dest, "sha256": digest, "description": head["description"],
            "files": [rel for rel, _ in files if rel != S.SKILL_FILE], "source": folder}


def skill_new(name, target=None, description=None):
    """Scaffold TARGET/.overlord/skills/NAME/SKILL.md in the real folder."""
    _name(name)
    if description is not None:
        description = " ".join(str(description).split())
        if not description:
            raise UsageError("the description is empty")
        if len(description) > S.LINE_CAP:
            raise UsageError(f"the description is longer than {S.LINE_CAP} characters")
    real = resolve_target(target)
    parts = S.PROJECT_DIR + (name,)
    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            shown = escape_path(os.path.join(real, *parts[:i + 1]))
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                if i == len(parts) - 1:
                    raise OverlordError(f"{shown} already exists: a skill named {name!r} is "
                                        "there (edit its SKILL.md)") from None
            try:
                nxt = S.open_dir(fd, part, shown)
            except S.Unsafe as exc:
                raise OverlordError(f"{exc}; nothing was written") from None
            os.close(fd)
            fd = nxt
        text = S.scaffold(name, description).encode("utf-8")
        out = os.open(S.SKILL_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                      os.O_CLOEXEC, 0o644, dir_fd=fd)
        try:
            store.write_all(out, text)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    path = os.path.join(real, *parts, S.SKILL_FILE)
    return {"name": name, "path": path, "target": real,
            "sha256": hashlib.sha256(text).hexdigest()}


def skill_remove(name, by=None):
    """Uninstall a machine skill (a project skill is a file of its folder: delete it there)."""
    _name(name)
    audit.ready()
    with _locked() as root:
        dest = os.path.join(root, name)
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            raise NotFound(f"no machine skill named {name!r} is installed "
                           f"({escape_path(root)})") from None
        digest = None
        if stat.S_ISDIR(st.st_mode):
            fd = os.open(dest, S.DIR_FLAGS)
            try:
                data = S.read_file(fd, S.SKILL_FILE, escape_text(name), S.SKILL_MAX)
            except S.Unsafe:
                data = None
            finally:
                os.close(fd)
            digest = hashlib.sha256(data).hexdigest() if data is not None else None
        gone = os.path.join(root, f".rm-{name}-{os.getpid()}")
        os.rename(dest, gone)
        store.fsync_dir(root)
        if os.path.isdir(gone) and not os.path.islink(gone):
            shutil.rmtree(gone)
        else:
            os.unlink(gone)
    audit.append("skill.remove", name=name, sha256=digest, by=by)
    return {"name": name, "path": dest, "sha256": digest}
