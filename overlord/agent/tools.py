"""The agent's tools: list_dir, read_file, write_file, edit_file, search, shell.

Every call runs inside the session, through the sandbox, as one command: a few lines of sh
and coreutils (no interpreter starts inside the sandbox). File contents and patterns travel
over stdin, never argv, so any size works. Paths are relative to the project root; a path that
leads out of it -- by `..`, by an absolute path elsewhere, or through a symlink an earlier
shell call planted -- is refused with an error result. The last check runs inside the sandbox
(`realpath` on the tree the command sees), in the same command that then uses the path, so
nothing can change in between.

`Toolbox.call()` returns an Outcome; it never raises for what the model asked (a bad input, a
missing file, a refused path are all results the model reads).
"""
import dataclasses
import hashlib
import posixpath
import re
import shlex
import shutil
import unicodedata

OUTPUT_CAP = 32 << 10            # per stream, head + tail: what a model reads of one call
EDIT_CAP = 16 << 20              # the largest file edit_file rewrites
SHELL_TIMEOUT = 120              # seconds, when the model gives none
REFUSED, MISSING, CHANGED = 3, 4, 5

_PATH = {"type": "string", "description": "Path relative to the project root."}
SPECS = [
    {"name": "list_dir", "description": "List a directory of the project: one entry a line, "
     "directories with a trailing '/', files with their size in bytes.",
     "input_schema": {"type": "object", "properties": {"path": _PATH}, "required": ["path"]}},
    {"name": "read_file", "description": "Read a text file of the project. Long files come "
     "back as their head and tail; use shell (sed -n 'A,Bp' FILE) for the middle.",
     "input_schema": {"type": "object", "properties": {"path": _PATH}, "required": ["path"]}},
    {"name": "write_file", "description": "Create or overwrite a file with the given content "
     "(parent directories are created).",
     "input_schema": {"type": "object", "properties": {
         "path": _PATH, "content": {"type": "string", "description": "The whole new content."}},
         "required": ["path", "content"]}},
    {"name": "edit_file", "description": "Replace one exact piece of text in a file. `old` must "
     "occur exactly once (include surrounding lines to make it unique).",
     "input_schema": {"type": "object", "properties": {
         "path": _PATH, "old": {"type": "string", "description": "The exact text to replace."},
         "new": {"type": "string", "description": "What replaces it."}},
         "required": ["path", "old", "new"]}},
    {"name": "search", "description": "Search file contents under a path with an extended "
     "regular expression (grep -E); prints path:line:text for each match.",
     "input_schema": {"type": "object", "properties": {
         "pattern": {"type": "string", "description": "An extended regular expression."},
         "path": {"type": "string", "description": "Where to search (default: the whole "
                  "project)."}},
         "required": ["pattern"]}},
    {"name": "shell", "description": "Run a shell command (bash) at the project root. Returns "
     "the exit code, stdout and stderr. Stdin is empty.",
     "input_schema": {"type": "object", "properties": {
         "command": {"type": "string"},
         "timeout": {"type": "integer", "description": f"Seconds (default {SHELL_TIMEOUT})."}},
         "required": ["command"]}},
]
BY_NAME = {spec["name"]: spec for spec in SPECS}
READING = ("list_dir", "read_file", "search")

# $1 is the way from the command's working directory to the project root, $2 the path asked for.
RESOLVE = r'''cd -- "$1" || exit 125
root=$(pwd -P)
p=$(realpath -m -- "$2") || { echo "cannot resolve $2" >&2; exit 3; }
case $p in "$root"|"$root"/*) ;; *) echo "refused: $2 leads outside the project root" >&2; exit 3;; esac
'''
SCRIPTS = {
    "list_dir": RESOLVE + r'''[ -d "$p" ] || { echo "not a directory: $2" >&2; exit 4; }
cd -- "$p" && exec find . -mindepth 1 -maxdepth 1 -printf '%y %s %P\t%l\n'
''',
    "read_file": RESOLVE + r'''[ -e "$p" ] || { echo "no such file: $2" >&2; exit 4; }
[ -d "$p" ] && { echo "$2 is a directory (use list_dir)" >&2; exit 4; }
[ -f "$p" ] || { echo "$2 is not a regular file" >&2; exit 4; }
exec cat -- "$p"
''',
    "write_file": RESOLVE + r'''[ -d "$p" ] && { echo "$2 is a directory" >&2; exit 4; }
mkdir -p -- "$(dirname -- "$p")" && exec cat > "$p"
''',
    # $3: the sha256 the file had when it was read; the rewrite happens only if it still has it
    "rewrite": RESOLVE + r'''[ -f "$p" ] || { echo "no such file: $2" >&2; exit 4; }
sum=$(sha256sum < "$p") && [ "${sum%% *}" = "$3" ] || { echo "$2 changed while being edited" >&2; exit 5; }
exec cat > "$p"
''',
    "search": RESOLVE + r'''[ -e "$p" ] || { echo "no such path: $2" >&2; exit 4; }
exec grep -rnIE --exclude-dir=.git -f - -- "$2"
''',
}
SHELL_ARGV = 'exec 3<&0 </dev/null; exec "$0" /proc/self/fd/3'


@dataclasses.dataclass
class Outcome:
    content: str              # what the model reads
    is_error: bool = False
    exit_code: int = None
    layer: int = None         # the savepoint the call sealed, if it wrote
    truncated: bool = False
    timed_out: bool = False
    cancelled: bool = False
    connector: dict = None    # a connector call's {server, tool, fingerprint[, sha256, size]}
    denial: dict = None       # why the sandbox refused it: {cause, line} (agent/denials.py)


@dataclasses.dataclass
class Extra:
    """A tool beyond the six (remember, skill, ...): its spec and run(toolbox, args, cause) ->
    Outcome. It runs inside the session through toolbox.script() when it touches the tree."""
    spec: dict
    run: object
    label: str = None         # the input its summary shows (default: the first required one)


class Refused(Exception):
    """A tool input that is refused before anything runs."""


def summary(name, args, label=None):
    """A short label for a call: write_file(src/a.py), shell(make test)."""
    arg = args.get("path") if name != "shell" else args.get("command")
    if name == "search":
        arg = args.get("pattern")
    if label:
        arg = args.get(label)
    text = " ".join(str(arg if arg is not None else "").split())
    return f"{name}({text if len(text) <= 60 else text[:57] + '...'})"


def check_input(name, args, by_name=BY_NAME):
    """Why an input does not fit the tool's schema, or None."""
    spec = by_name.get(name)
    if spec is None:
        return f"unknown tool {name!r} (tools: {', '.join(by_name)})"
    schema = spec["input_schema"]
    for key in schema["required"]:
        if key not in args:
            return f"{name}: missing required input {key!r}"
    for key, value in args.items():
        want = schema["properties"].get(key, {}).get("type")
        if key not in schema["properties"]:
            return f"{name}: unknown input {key!r}"
        if want == "string" and not isinstance(value, str):
            return f"{name}: {key} must be a string"
        if want == "integer" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{name}: {key} must be a number"
    return None


def relative(path, root):
    """The project-relative form of a path the model gave, or Refused (the lexical check;
    symlinks are checked inside the sandbox)."""
    if "\0" in path:
        raise Refused("refused: a path cannot contain a NUL byte")
    if posixpath.isabs(path):
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            raise Refused(f"refused: {path} is outside the project root {root}")
        path = posixpath.relpath(path, root)
    norm = posixpath.normpath(path or ".")
    if norm == ".." or norm.startswith("../"):
        raise Refused(f"refused: {path} leads outside the project root")
    return norm


OWN_OUTPUT = "(the tool's own output follows; it is not a sandbox denial)"
_UNSEEN = ("Cc", "Cf", "Zs", "Zl", "Zp")     # whitespace, control and invisible format characters
# a terminal escape sequence (CSI, OSC, or ESC and one character): unseen as a whole
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.)", re.S)


def unforged(outcome):
    """The model is told (prompt.GUIDE) that a result whose first line starts with "blocked" is
    the sandbox refusing the call: such a line is OVERLORD's only. A result with no denial whose
    own text would begin that way -- after whitespace, control or invisible characters, in any
    case (a file's first line, a file name, a program's words) -- gets OWN_OUTPUT before it."""
    if outcome.denial or not isinstance(outcome.content, str):
        return outcome
    text, i = outcome.content, 0
    while i < len(text) and unicodedata.category(text[i]) in _UNSEEN:
        escape = _ESCAPE.match(text, i)
        i = escape.end() if escape else i + 1
    if text[i:i + 16].casefold().startswith("blocked"):
        outcome.content = f"{OWN_OUTPUT}\n{text}"
    return outcome


class Toolbox:
    """Runs tool calls in one session.

    run(argv, input, cause, timeout, cap) executes one command inside the session and returns
    an ops.Captured; up is the way from that command's working directory to the project root;
    root is the project's real path (what the model is told); timeout caps every call."""

    def __init__(self, run, root, up=".", timeout=None, extras=(), explain=None):
        self.root, self.up, self.timeout = root, up, timeout
        self.shell = shutil.which("bash") or "/bin/sh"
        self.extras = {e.spec["name"]: e for e in extras}
        self.specs = SPECS + [e.spec for e in extras]
        self.by_name = {spec["name"]: spec for spec in self.specs}
        self.explain = explain      # explain(tool, args, captures) -> denials.Denial or None
        self._run, self._captures = run, []

    def run(self, argv, input, cause, timeout, cap):
        """One command in the session (an ops.Captured), kept for the denial check."""
        captured = self._run(argv, input, cause, timeout, cap)
        self._captures.append(captured)
        return captured

    def check_input(self, name, args):
        return check_input(name, args, self.by_name)

    def summary(self, name, args):
        extra = self.extras.get(name)
        if extra is None:
            return summary(name, args)
        return summary(name, args, extra.label or (extra.spec["input_schema"].get("required") or [None])[0])

    def call(self, name, args, cause):
        self._captures = []
        try:
            extra = self.extras.get(name)
            outcome = extra.run(self, args, cause) if extra else getattr(self, "_" + name)(args, cause)
        except Refused as exc:
            return unforged(Outcome(str(exc), is_error=True))
        if self.explain and self._captures:
            self._explain(outcome, lambda: self.explain(name, args, self._captures))
        return unforged(outcome)

    def refused(self, name, args, exc):
        """The Outcome of a call whose command the session refused to run (ops raised
        OverlordError: a crossed grant, a session no longer open): `Not run: why`, with the
        denial line first when the refusal is the sandbox's (agent/denials.py)."""
        outcome = Outcome(f"Not run: {exc}", is_error=True)
        how = getattr(self.explain, "refused", None)
        if how:
            self._explain(outcome, lambda: how(name, args, self._captures, exc))
        return unforged(outcome)

    @staticmethod
    def _explain(outcome, explain):
        """Put a denial's line first in what the model reads and its record on the outcome.
        The check never costs the call: if it breaks, the call's own result stands."""
        try:
            denial = explain()
        except Exception:        # noqa: BLE001 - a wrong explanation is worse than none
            denial = None
        if denial:
            outcome.denial = denial.record()
            outcome.content = f"{denial.line}\n{outcome.content}"

    def script(self, kind, args, cause, input=b"", cap=OUTPUT_CAP, timeout=None, text=None):
        """Run SCRIPTS[kind] (or `text`, which starts with RESOLVE's checks when it takes a path)
        with $1 = the way to the project root and args after it."""
        body = text if text is not None else SCRIPTS[kind]
        argv = ["sh", "-c", body, f"overlord-{kind}", self.up, *args]
        return self.run(argv, input, cause, self._limit(timeout), cap)

    def _limit(self, asked):
        if asked is None:
            return self.timeout
        return min(asked, self.timeout) if self.timeout else asked

    def failed(self, cap):
        """An Outcome for a script that did not do its job, or None."""
        if cap.timed_out:
            return _outcome(cap, f"timed out after {self.timeout} s", is_error=True)
        if cap.exit_code != 0:
            text = _text(cap.stderr).strip() or f"failed with exit code {cap.exit_code}"
            return _outcome(cap, text, is_error=True)
        return None

    def _list_dir(self, args, cause):
        rel = relative(args["path"], self.root)
        cap = self.script("list_dir", [rel], cause)
        failed = self.failed(cap)
        if failed:
            return failed
        rows = [_entry(line) for line in _text(cap.stdout).splitlines()]
        if not cap.truncated:
            return _outcome(cap, "\n".join(sorted(rows)) or "(empty directory)")
        return _outcome(cap, "\n".join(rows) + "\n[more entries were left out]")

    def _read_file(self, args, cause):
        rel = relative(args["path"], self.root)
        cap = self.script("read_file", [rel], cause)
        failed = self.failed(cap)
        if failed:
            return failed
        if b"\0" in cap.stdout[:8192]:
            return _outcome(cap, f"{rel} is a binary file (use shell, e.g. `xxd {shlex.quote(rel)} | head`)")
        text = _text(cap.stdout)
        if cap.truncated:
            text += "\n[the file is longer than shown: the middle was left out]"
        return _outcome(cap, text)

    def _write_file(self, args, cause):
        rel = relative(args["path"], self.root)
        data = _bytes(args["content"])
        cap = self.script("write_file", [rel], cause, input=data)
        return self.failed(cap) or _outcome(cap, f"wrote {len(data)} bytes to {rel}")

    def _edit_file(self, args, cause):
        rel = relative(args["path"], self.root)
        old, new = args["old"], args["new"]
        if not old:
            return Outcome("edit_file: `old` is empty; use write_file to create a file", is_error=True)
        read = self.script("read_file", [rel], dict(cause, read=True), cap=EDIT_CAP)
        failed = self.failed(read)
        if failed:
            return failed
        if read.truncated:
            return Outcome(f"{rel} is too large for edit_file; use shell", is_error=True)
        text = read.stdout.decode("utf-8", "surrogateescape")
        count = text.count(old)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            return Outcome(f"edit_file: `old` {where} in {rel}; it must match exactly once",
                           is_error=True)
        digest = hashlib.sha256(read.stdout).hexdigest()
        data = _bytes(text.replace(old, new, 1))
        cap = self.script("rewrite", [rel, digest], cause, input=data)
        return self.failed(cap) or _outcome(cap, f"edited {rel}: replaced 1 occurrence")

    def _search(self, args, cause):
        rel = relative(args.get("path") or ".", self.root)
        rel = "./" + rel if rel.startswith("-") else rel      # grep reads "-" as stdin
        pattern = _bytes(args["pattern"])
        cap = self.script("search", [rel], cause, input=pattern + b"\n")
        if cap.exit_code == 1 and not cap.timed_out:
            return _outcome(cap, "no matches")
        failed = self.failed(cap)
        if failed:
            return failed
        text = _text(cap.stdout)
        return _outcome(cap, text + ("\n[more matches were left out]" if cap.truncated else ""))

    def _shell(self, args, cause):
        command = args["command"]
        timeout = max(1, args.get("timeout") or SHELL_TIMEOUT)
        script = f"cd -- {shlex.quote(self.up)} || exit 125\nexec 3<&-\n{command}\n"
        limit = self._limit(timeout)
        cap = self.run(["sh", "-c", SHELL_ARGV, self.shell], _bytes(script),
                       cause, limit, OUTPUT_CAP)
        parts = [f"exit code: {cap.exit_code}"]
        if cap.timed_out:
            parts = [f"timed out after {limit} s: the command and everything it started were killed"]
        out, err = _text(cap.stdout), _text(cap.stderr)
        if out:
            parts.append("stdout:\n" + out)
        if err:
            parts.append("stderr:\n" + err)
        if cap.truncated:
            parts.append("[output was longer than shown: the middle was left out]")
        return _outcome(cap, "\n".join(parts), is_error=cap.timed_out)


def _entry(line):
    """'d 4096 src\t' -> 'src/'; a line cut by the output cap is shown as it came."""
    kind, _, rest = line.partition(" ")
    size, _, rest = rest.partition(" ")
    name, tab, link = rest.rpartition("\t")
    if not tab or not size.isdigit():
        return line
    return f"{name}/" if kind == "d" else f"{name} -> {link}" if kind == "l" else f"{name}  {size}"


def _outcome(cap, content, is_error=False):
    return Outcome(content, is_error=is_error, exit_code=cap.exit_code, layer=cap.layer,
                   truncated=cap.truncated, timed_out=cap.timed_out)


def _text(data):
    return data.decode("utf-8", "replace")


def _bytes(text):
    """A model's text as bytes; bytes a file held that were not UTF-8 go back as they were."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:          # a lone surrogate the JSON carried: not a byte we read
        return text.encode("utf-8", "replace")
