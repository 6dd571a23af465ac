"""Skills: SKILL.md folders the agent loads with the `skill` tool when one fits.

A skill is a folder holding a SKILL.md -- front matter between two `---` lines with `name`
(required: [a-z0-9][a-z0-9-]{0,63}, the folder's own name), `description` (required, one line,
cut at 300 characters) and `when` (optional, one line) -- and any supporting files. Two homes:

    project   TARGET/.overlord/skills/<name>/   part of the tree, so part of the transaction
    machine   OVERLORD_HOME/skills/<name>/      installed by a person (`overlord skills add`)

A project folder claims its name: it shadows the machine skill of that name entirely, even
when its own SKILL.md is malformed (then neither is offered, and the warning says so). The
policy rule's `skills` ("*" | [names] | []) caps the MACHINE skills a folder's sessions are
offered and may load; project skills are the folder's own files, reviewed like any other.

    catalogue(target, allowed) -> Offered     at session open: what the model is told
    from_record(meta_skills) -> Offered       what a session was offered (for a resume)
    tools(session, record, offered) -> [tools.Extra]   the `skill` tool

The catalogue is read host-side, refusing a symlink at every component (O_NOFOLLOW on each
directory fd). A load re-reads: a project skill INSIDE the session (the tree the agent sees, so
one it wrote a moment ago loads, and a symlink anywhere on the way is refused), a machine skill
host-side from OVERLORD_HOME after checking the live policy. Every load is a `skill_load`
transcript event {name, source, sha256, files, turn, call} (+ file, for a supporting file).
"""
import dataclasses
import errno
import hashlib
import os
import posixpath
import re
import stat

from overlord.agent import tools as T
from overlord.errors import OverlordError
from overlord.text import escape_path, escape_text
from overlord.trust import policy
from overlord.txn import store

SKILL_FILE = "SKILL.md"
PROJECT_DIR = (".overlord", "skills")           # under the target
MACHINE_DIR = "skills"                          # under OVERLORD_HOME
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")
NAME_RULE = "lower-case letters, digits and '-', starting with a letter or digit, at most 64"
SKILL_MAX = 64 << 10                            # bytes of one SKILL.md
FILE_MAX = 256 << 10                            # bytes of one supporting file the tool returns
LINE_CAP = 300                                  # characters of a description or a `when`
LIST_MAX = 200                                  # files a listing names
DEPTH_MAX = 8                                   # folder depth a listing descends
NO_PROJECT_SKILL = 6                            # the load script's exit: no such project folder


class Malformed(Exception):
    """A SKILL.md that cannot be a skill; the message says why (no file name)."""


@dataclasses.dataclass
class Offered:
    skills: list = dataclasses.field(default_factory=list)    # [{name, description, when, source, sha256}]
    text: str = ""                  # the catalogue section of the prompt, "" when none
    warnings: list = dataclasses.field(default_factory=list)  # malformed SKILL.md, one line each

    def record(self):
        return {"offered": self.skills, "warnings": self.warnings}


# -- SKILL.md -----------------------------------------------------------------------------------

def check_name(name):
    """Why `name` cannot name a skill, or None."""
    if not isinstance(name, str) or not name:
        return "a skill needs a name"
    if "/" in name:
        return f"the name {escape_text(name)!r} contains '/'"
    if not NAME_RE.match(name):
        return f"the name {escape_text(name)!r} is not a skill name ({NAME_RULE})"
    return None


def _one_line(value, key):
    if value in (">", "|", ">-", "|-", ">+", "|+"):
        raise Malformed(f"`{key}` must be one line (a block value is not read)")
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    value = " ".join(value.split())
    return value if len(value) <= LINE_CAP else value[:LINE_CAP - 3] + "..."


def parse(data):
    """{name, description, when} of a SKILL.md's bytes, or Malformed."""
    if len(data) > SKILL_MAX:
        raise Malformed(f"larger than {SKILL_MAX >> 10} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8 text") from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[0].rstrip() != "---":
        raise Malformed("no front matter (the file must begin with a '---' line)")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if end is None:
        raise Malformed("the front matter has no closing '---' line")
    found, key = {}, None
    for n, line in enumerate(lines[1:end], 2):
        line = line.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t" or line.startswith("- "):          # a continuation of `key`
            if key in ("name", "description", "when"):
                raise Malformed(f"`{key}` must be one line (line {n} continues it)")
            continue
        m = re.match(r"([A-Za-z_][A-Za-z0-9_-]*)\s*:(.*)\Z", line)
        if not m:
            raise Malformed(f"front matter line {n} is not `key: value`")
        key, value = m.group(1), m.group(2).strip()
        if key in ("name", "description", "when"):
            if key in found:
                raise Malformed(f"`{key}` is given twice")
            found[key] = _one_line(value, key)
    if not found.get("name"):
        raise Malformed("no `name` in the front matter")
    why = check_name(found["name"])
    if why:
        raise Malformed(why)
    if not found.get("description"):
        raise Malformed("no `description` in the front matter")
    return {"name": found["name"], "description": found["description"],
            "when": found.get("when") or None}


def scaffold(name, description=None):
    """A new SKILL.md's text."""
    description = description or "TODO: one line saying what this skill is for and when to load it."
    return (f"---\nname: {name}\ndescription: {description}\n"
            "# when: the tasks this skill fits (optional: remove the '# ' to say it)\n"
            f"---\n\n# {name}\n\n"
            "Write the know-how here: the steps, the commands, the conventions and the traps.\n"
            "The agent reads this text when the description above fits its task; supporting\n"
            "files beside this one (templates, checklists, scripts) are listed for it to open.\n")


# -- reading host-side, no symlink anywhere -----------------------------------------------------

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Unsafe(Exception):
    """A path that is a symlink, not what it should be, or unreadable: the message names it."""


def open_dir(base_fd, name, shown):
    """A directory fd for base_fd/name, refusing a symlink; None when it does not exist."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=base_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unsafe(_why(base_fd, name, shown, exc, "a directory")) from None


def _why(base_fd, name, shown, exc, want):
    try:
        st = os.stat(name, dir_fd=base_fd, follow_symlinks=False)
    except OSError:
        return f"{shown}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{shown} is a symlink (skills are read without following links)"
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        return f"{shown} is not {want}"
    return f"{shown}: {exc.strerror or exc}"


def read_file(dir_fd, name, shown, cap):
    """The bytes of the regular file dir_fd/name (not a symlink, at most cap bytes), or Unsafe;
    None when it does not exist."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unsafe(_why(dir_fd, name, shown, exc, "a regular file")) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(f"{shown} is not a regular file")
        if st.st_size > cap:
            raise Unsafe(f"{shown} is larger than {cap >> 10} KiB")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                raise Unsafe(f"{shown} is larger than {cap >> 10} KiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_path(base, parts, shown):
    """A directory fd for base/parts[0]/..., every component refused if a symlink (base is
    trusted: a real path we resolved). None when a component does not exist."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_path_fd(fd, parts, shown)
    finally:
        os.close(fd)


def open_path_fd(fd, parts, shown):
    """open_path below an already open directory fd (which stays open)."""
    cur = os.dup(fd)
    for i, part in enumerate(parts):
        try:
            nxt = open_dir(cur, part, shown(parts[:i + 1]))
        finally:
            os.close(cur)
        if nxt is None:
            return None
        cur = nxt
    return cur


def listing(dir_fd, prefix="", depth=0, out=None):
    """[{path, size}] of the regular files under a skill folder (SKILL.md left out), sorted,
    at most LIST_MAX; symlinks and other non-regular entries are left out (never followed)."""
    out = [] if out is None else out
    try:
        entries = sorted(os.scandir(dir_fd), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        if len(out) >= LIST_MAX:
            break
        rel = prefix + entry.name
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and rel != SKILL_FILE:
            out.append({"path": escape_path(rel), "size": st.st_size})
        elif stat.S_ISDIR(st.st_mode) and depth < DEPTH_MAX:
            try:
                sub = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                listing(sub, rel + "/", depth + 1, out)
            finally:
                os.close(sub)
    return out


@dataclasses.dataclass
class Skill:
    name: str
    description: str
    when: str
    source: str                 # project | machine
    path: str                   # the skill's folder
    sha256: str                 # of SKILL.md
    text: str                   # SKILL.md
    files: list                 # [{path, size}] beside SKILL.md

    def entry(self):
        return {"name": self.name, "description": self.description, "when": self.when,
                "source": self.source, "sha256": self.sha256}


def machine_root():
    return os.path.join(store.home(), MACHINE_DIR)


def read_skill(folder_fd, name, source, path):
    """The Skill in an open folder named `name`, or Malformed / Unsafe (naming SKILL.md)."""
    shown = escape_path(os.path.join(path, SKILL_FILE))
    data = read_file(folder_fd, SKILL_FILE, shown, SKILL_MAX)
    if data is None:
        raise Unsafe(f"{shown} does not exist")
    try:
        head = parse(data)
    except Malformed as exc:
        raise Malformed(f"{shown}: {exc}") from None
    if head["name"] != name:
        raise Malformed(f"{shown}: its name {head['name']!r} is not its folder's name {name!r}")
    return Skill(head["name"], head["description"], head["when"], source, path,
                 hashlib.sha256(data).hexdigest(), data.decode("utf-8"), listing(folder_fd))


def survey(root, parts, source):
    """(skills {name: Skill}, claimed {folder name: why it is not a skill, or None},
    warnings) of one home: root/parts/*/."""
    skills, claimed, warnings = {}, {}, []
    home = os.path.join(root, *parts)

    def shown(sub):
        return escape_path(os.path.join(root, *sub))
    try:
        fd = open_path(root, parts, shown)
    except Unsafe as exc:
        return skills, claimed, [f"{exc}; its skills are not read"]
    except OSError as exc:
        return skills, claimed, [f"{escape_path(home)}: {exc.strerror or exc}"]
    if fd is None:
        return skills, claimed, warnings
    try:
        entries = sorted(os.scandir(fd), key=lambda e: e.name)
        for entry in entries:
            if entry.name.startswith("."):
                continue                          # an add or a remove in progress, dotfiles
            path = os.path.join(home, entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                why = f"{escape_path(path)} is a symlink (skills are read without following links)"
                warnings.append(f"{why}; skipped")
                if NAME_RE.match(entry.name):
                    claimed[entry.name] = why
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue                          # a stray file beside the skill folders
            if check_name(entry.name):
                warnings.append(f"{escape_path(path)}: {check_name(entry.name)}; skipped")
                continue
            claimed[entry.name] = None
            try:
                sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                claimed[entry.name] = f"{escape_path(path)}: {exc.strerror or exc}"
                warnings.append(f"{claimed[entry.name]}; skipped")
                continue
            try:
                skills[entry.name] = read_skill(sub, entry.name, source, path)
            except (Malformed, Unsafe) as exc:
                claimed[entry.name] = str(exc)
                warnings.append(f"{exc}; skipped")
            finally:
                os.close(sub)
    finally:
        os.close(fd)
    return skills, claimed, warnings


def permits(allowed, name):
    """Whether the policy's `skills` value lets a machine skill be offered and loaded."""
    return allowed == "*" or (isinstance(allowed, list) and name in allowed)


def everything(target=None):
    """(project {name: Skill}, claimed {project folder name: why it is no skill, or None},
    machine {name: Skill}, warnings)."""
    project, claimed, warnings = {}, {}, []
    if target is not None:
        project, claimed, warnings = survey(target, PROJECT_DIR, "project")
    machine, _, more = survey(store.home(), (MACHINE_DIR,), "machine")
    for name in sorted(set(claimed) & set(machine)):
        if name not in project:
            warnings.append(f"the machine skill {name!r} is shadowed by the project's folder of "
                            "that name, so it is not offered either")
    return project, claimed, machine, warnings + more


# -- the catalogue ------------------------------------------------------------------------------

def catalogue(target, allowed):
    """What a session on target is offered: its project skills, and the machine skills the
    policy's `skills` value allows that no project folder shadows."""
    project, claimed, machine, warnings = everything(target)
    chosen = dict(project)
    for name, skill in machine.items():
        if name not in claimed and permits(allowed, name):
            chosen[name] = skill
    skills = [chosen[n].entry() for n in sorted(chosen)]
    return Offered(skills, render(skills), warnings)


def render(skills):
    """The prompt's catalogue section: names and descriptions only, and how to load one."""
    if not skills:
        return ""
    lines = ["# Skills", "",
             "Packaged know-how for particular kinds of task. Only each skill's name and "
             "description are listed here. When one fits what you are about to do, load it with "
             "the `skill` tool ({\"name\": NAME}) before you start and follow it: you get its "
             "full text (SKILL.md) and a list of its supporting files. A project skill lives in "
             "this project under .overlord/skills/NAME/ (open its files with read_file; you may "
             "improve it or write a new one there -- it is a file change the operator reviews); "
             "a machine skill was installed by the operator (open its files with the `skill` "
             "tool's `file` input).", ""]
    for s in skills:
        when = f" (when: {escape_text(s['when'])})" if s.get("when") else ""
        lines.append(f"- {s['name']} ({s['source']}): {escape_text(s['description'])}{when}")
    return "\n".join(lines)


def from_record(recorded):
    """The Offered a session recorded at open (meta["skills"]); an empty one for none."""
    recorded = recorded or {}
    skills = [dict(s) for s in recorded.get("offered") or []]
    return Offered(skills, render(skills), list(recorded.get("warnings") or []))


# -- the tool -----------------------------------------------------------------------------------

SPEC = {
    "name": "skill",
    "description": "Load a skill from the catalogue in the system prompt: its full text "
                   "(SKILL.md) and a list of its supporting files. With `file`, read one of "
                   "those supporting files instead.",
    "input_schema": {"type": "object", "properties": {
        "name": {"type": "string", "description": "The skill's name, as the catalogue lists it."},
        "file": {"type": "string", "description": "A supporting file of the skill, as its "
                 "listing names it (a path inside the skill's folder)."}},
        "required": ["name"]},
}

# $2: .overlord/skills/NAME/FILE, $3: .overlord/skills/NAME, $4: "list" to list the folder.
# Every component must be itself (realpath = the path as written: no symlink anywhere).
LOAD = r'''[ -e "$3" ] || [ -L "$3" ] || exit 6
[ "$p" = "$root/$2" ] || { echo "refused: $2 passes through a symlink (a skill is read without following links)" >&2; exit 3; }
[ -e "$p" ] || { echo "no such file: $2" >&2; exit 4; }
[ -f "$p" ] || { echo "$2 is not a regular file" >&2; exit 4; }
[ "$(stat -c %s -- "$p")" -le "$5" ] || { echo "$2 is larger than $(($5 / 1024)) KiB" >&2; exit 4; }
if [ "$4" = list ]; then
  find "$root/$3" -mindepth 1 -maxdepth ''' + str(DEPTH_MAX + 1) + r''' \( -type f -o -type l \) -printf '%y %s %P\0' | head -z -n ''' + \
    str(LIST_MAX + 1) + r'''
fi
printf -- '--\0'
exec cat -- "$p"
'''


def tools(session, record, offered):
    """[the `skill` tool] when the session was offered any skill (or told of a broken one);
    [] otherwise. record: the live transcript, used only when a call runs."""
    if not offered.skills and not offered.warnings:
        return []

    def run(toolbox, args, cause):
        return _load(session, record, offered, toolbox, args, cause)
    return [T.Extra(SPEC, run, label="name")]


def _error(text):
    return T.Outcome(text, is_error=True)


def _file_arg(file):
    """The supporting file's path inside the skill folder, or (None, why)."""
    if "\0" in file or not file.strip():
        return None, "skill: `file` must be a path inside the skill's folder"
    norm = posixpath.normpath(file)
    if posixpath.isabs(file) or norm == ".." or norm.startswith("../") or norm == ".":
        return None, f"refused: {escape_text(file)} is not a path inside the skill's folder"
    return norm, None


def _load(session, record, offered, toolbox, args, cause):
    name, file = args["name"], args.get("file")
    if check_name(name):
        return _error(f"skill: no skill named {escape_text(name)!r} ({check_name(name)})")
    rel = None
    if file is not None:
        rel, why = _file_arg(file)
        if why:
            return _error(why)
    got = _project_load(toolbox, name, rel, cause)
    if got is None:
        got = _machine_load(session, offered, name, rel)
    if isinstance(got, str):
        return _error(got)
    outcome, event = got
    if record is not None:
        record.record("skill_load", name=name, turn=cause.get("turn"), call=cause.get("call"),
                      **event)
    return outcome


def _project_load(toolbox, name, rel, cause):
    """(Outcome, event fields) of a project skill read inside the session; an error string;
    None when the session's tree holds no project folder of that name."""
    folder = "/".join(PROJECT_DIR + (name,))
    path = f"{folder}/{rel or SKILL_FILE}"
    cap = toolbox.script("skill", [path, folder, "list" if rel is None else "",
                               str(FILE_MAX if rel else SKILL_MAX)],
                         cause, cap=1 << 20, text=T.RESOLVE + LOAD)
    if cap.exit_code == NO_PROJECT_SKILL and not cap.timed_out:
        return None
    failed = toolbox.failed(cap)
    if failed:
        return f"skill {name} (project): {failed.content}"
    if cap.truncated:
        return f"skill {name} (project): the output was larger than the tool returns"
    head, sep, data = cap.stdout.partition(b"--\0")
    if not sep:
        return f"skill {name} (project): the read did not finish"
    entries = [e.decode("utf-8", "surrogateescape") for e in head.split(b"\0") if e]
    files, more = [], len(entries) > LIST_MAX
    for e in entries[:LIST_MAX]:
        kind, _, rest = e.partition(" ")
        size, _, p = rest.partition(" ")
        if kind == "f" and p != SKILL_FILE:       # names the tree chose: escaped, one line each
            files.append({"path": escape_path(p), "size": int(size) if size.isdigit() else None})
        elif kind == "l":
            files.append({"path": escape_path(p), "size": None, "symlink": True})
    digest = hashlib.sha256(data).hexdigest()
    if rel is not None:
        return _file_outcome(name, "project", rel, data), \
            {"source": "project", "sha256": digest, "files": [], "file": rel}
    try:
        head = parse(data)
    except Malformed as exc:
        return f"skill {name} (project): {path} is malformed: {exc}"
    if head["name"] != name:
        return f"skill {name} (project): {path} names itself {head['name']!r}, not {name!r}"
    text = _skill_text(name, "project", data, files, f"{folder}/", more)
    return _ok(text), {"source": "project", "sha256": digest,
                       "files": [f["path"] for f in files]}


def _machine_load(session, offered, name, rel):
    if not any(s["name"] == name and s["source"] == "machine" for s in offered.skills):
        if any(s["name"] == name for s in offered.skills):
            return (f"skill {name}: the project skill is no longer in the project "
                    f"(.overlord/skills/{name}/ is gone from the session's tree)")
        names = ", ".join(s["name"] for s in offered.skills) or "none"
        return (f"skill: no skill named {name!r} was offered to this session (offered: {names}; "
                f"a project skill is read from .overlord/skills/{name}/ in the project)")
    try:
        allowed = policy.rule(session.target)["skills"]
    except OverlordError as exc:
        return f"skill {name}: refused, the policy cannot be read now ({exc})"
    if not permits(allowed, name):
        return (f"skill {name}: refused, the policy no longer allows this machine skill in this "
                f"folder (skills: {_allowed_text(allowed)}); it was offered when the session opened")
    root = machine_root()
    try:
        fd = open_path(store.home(), (MACHINE_DIR, name),
                       lambda sub: escape_path(os.path.join(store.home(), *sub)))
        if fd is None:
            return f"skill {name}: the machine skill is no longer installed"
        try:
            if rel is not None:
                parts = rel.split("/")
                sub = open_path_fd(fd, parts[:-1], lambda sub: f"{name}/{'/'.join(sub)}")
                if sub is None:
                    return f"skill {name}: no such file: {escape_text(rel)}"
                try:
                    data = read_file(sub, parts[-1], escape_text(rel), FILE_MAX)
                finally:
                    os.close(sub)
                if data is None:
                    return f"skill {name}: no such file: {escape_text(rel)}"
                return _file_outcome(name, "machine", rel, data), \
                    {"source": "machine", "sha256": hashlib.sha256(data).hexdigest(),
                     "files": [], "file": rel}
            skill = read_skill(fd, name, "machine", os.path.join(root, name))
        finally:
            os.close(fd)
    except (Malformed, Unsafe) as exc:
        return f"skill {name}: refused: {exc}"
    except OSError as exc:
        return f"skill {name}: {exc.strerror or exc}"
    data = skill.text.encode("utf-8")
    text = _skill_text(name, "machine", data, skill.files, None, len(skill.files) >= LIST_MAX)
    return _ok(text), {"source": "machine", "sha256": skill.sha256,
                       "files": [f["path"] for f in skill.files]}


def _allowed_text(allowed):
    if allowed == "*":
        return '"*"'
    return "[" + ", ".join(repr(n) for n in allowed) + "]" if allowed else "[] (none)"


def _ok(text):
    return T.Outcome(text, exit_code=0)


def _skill_text(name, source, data, files, prefix, more):
    """What the model reads on a load: the SKILL.md text, then its files and how to open them."""
    text = data.decode("utf-8", "replace")
    lines = [f"[skill {name} ({source}): its SKILL.md follows]", text.rstrip("\n"), ""]
    if not files:
        lines.append(f"[skill {name} has no supporting files]")
    else:
        how = (f"open them with read_file at {prefix}PATH" if prefix else
               f"open one with the skill tool: {{\"name\": \"{name}\", \"file\": PATH}}")
        lines.append(f"[skill {name}: its supporting files ({how})]")
        for f in files:
            size = "symlink, not followed" if f.get("symlink") else f"{f['size']} bytes"
            lines.append(f"  {f['path']}  ({size})")
        if more:
            lines.append(f"  [more files were left out: at most {LIST_MAX} are listed]")
    return "\n".join(lines)


def _file_outcome(name, source, rel, data):
    if b"\0" in data[:8192]:
        return T.Outcome(f"[skill {name} ({source}): {rel} is a binary file of {len(data)} bytes]",
                         exit_code=0)
    return T.Outcome(f"[skill {name} ({source}): {rel}]\n" + data.decode("utf-8", "replace"),
                     exit_code=0)
