"""Per-file unified diffs of a session's change: as data the web pages render (file_diff)
and as text like `git diff` prints (render, for `overlord diff --patch`).

The change itself is ops.diff (the plan commit will execute); this only reads the two sides of
each changed path -- the real file and the session's version of it -- and compares them. Nothing
is followed through a symlink (a link is shown as its text), binary files and large files are
summarized rather than compared, and a long diff is cut with a note saying how much was left out.
"""
import os
import stat

from overlord.text import escape_path, escape_text

MAX_BYTES = 512 << 10          # a side larger than this is summarized, not compared
MAX_LINES = 2000               # diff lines per file, at most
CONTEXT = 3
DIR_WORDS = {"added": "directory added", "deleted": "directory deleted",
             "replaced-dir": "directory replaced: its old contents go",
             "modified": "directory metadata changed"}


def file_diff(target, change):
    """{path, kind, layer, summary, binary, large, hunks: [{header, lines: [[tag, text]]}],
    added, removed, truncated} for one ops.diff Change."""
    out = blank(change.path, change.kind, change.layer)
    entry = change.entry
    new_kind = entry.kind if entry.kind not in ("whiteout", "invalid") else None
    old_st = change.real
    old_kind = _kind(old_st)
    if change.kind == "invalid-whiteout":
        out["summary"] = "an invalid whiteout: commit will refuse it"
        return out
    if new_kind == "dir" or (new_kind is None and old_kind == "dir"):
        out["directory"] = True
        out["summary"] = DIR_WORDS.get(change.kind, "directory")
        return out
    if "symlink" in (new_kind, old_kind):
        old = _link(os.path.join(target, change.path)) if old_kind == "symlink" else None
        new = _link(entry.src) if new_kind == "symlink" else None
        out["summary"] = link_summary(old_kind, new_kind, old, new)
        return out
    if "other" in (new_kind, old_kind):
        out["summary"] = "a special file (device, fifo or socket)"
        return out
    old = _read(os.path.join(target, change.path), old_st) if old_kind == "file" else b""
    new = _read(entry.src, entry.st) if new_kind == "file" else b""
    return compare(out, change.kind, old, new)


def blank(path, kind, layer):
    """file_diff's answer before anything is known of the two sides."""
    return {"path": path, "kind": kind, "layer": layer, "summary": None, "directory": False,
            "binary": False, "large": False, "hunks": [], "added": 0, "removed": 0,
            "truncated": False}


def link_summary(old_kind, new_kind, old, new):
    """The words for a change with a symlink on either side (old/new: the link texts)."""
    words = " ".join(x for x in (
        f"symlink \u2192 {old}" if old is not None else None,
        "becomes" if old is not None and new is not None else None,
        f"symlink \u2192 {new}" if new is not None else None) if x)
    if old_kind not in (None, "symlink") or new_kind not in (None, "symlink"):
        words += f" (was a {old_kind or 'nothing'}, now a {new_kind or 'nothing'})"
    return words


def compare(out, kind, old, new):
    """Fill `out` (blank()) from the two sides' bytes: b"" for absent, an int (the size) when
    too large to compare, None when unreadable."""
    if old is None or new is None:
        out["summary"] = "unreadable"
        return out
    if isinstance(old, int) or isinstance(new, int):
        out["large"] = True
        out["summary"] = f"large file, not compared: {_sizes(kind, old, new)}"
        return out
    old_text, new_text = _text(old), _text(new)
    if old_text is None or new_text is None:
        out["binary"] = True
        out["summary"] = f"binary file: {_sizes(kind, old, new)}"
        return out
    if old_text == new_text:
        out["summary"] = "metadata only (mode or owner)" if kind == "modified" else \
            ("empty file" if not new_text else None)
        return out
    _hunks(out, old_text.splitlines(), new_text.splitlines())
    return out


def _hunks(out, a, b):
    budget = MAX_LINES
    for group in grouped(opcodes(a, b), CONTEXT):
        first, last = group[0], group[-1]
        header = (f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@")
        lines = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [[" ", t] for t in a[i1:i2]]
                continue
            if tag in ("replace", "delete"):
                lines += [["-", t] for t in a[i1:i2]]
                out["removed"] += i2 - i1
            if tag in ("replace", "insert"):
                lines += [["+", t] for t in b[j1:j2]]
                out["added"] += j2 - j1
        if budget <= 0:
            out["truncated"] = True
            continue
        if len(lines) > budget:
            lines = lines[:budget]
            out["truncated"] = True
        budget -= len(lines)
        out["hunks"].append({"header": header, "lines": lines})


def opcodes(a, b):
    """difflib's opcodes, with the common head and tail set aside first: a change of a few
    lines in a long file costs the few lines, not the file."""
    n = min(len(a), len(b))
    head = 0
    while head < n and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < n - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    ops = [("equal", 0, head, 0, head)] if head else []
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    if mid_a and mid_b:
        import difflib       # only a --patch or a dossier pays for it
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_opcodes():
            ops.append((tag, i1 + head, i2 + head, j1 + head, j2 + head))
    elif mid_a:
        ops.append(("delete", head, len(a) - tail, head, head))
    elif mid_b:
        ops.append(("insert", head, head, head, len(b) - tail))
    if tail:
        ops.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
    return ops


def grouped(ops, n):
    """Opcodes in hunks with n lines of context (as difflib.SequenceMatcher.get_grouped_opcodes)."""
    if not ops:
        return
    if ops[0][0] == "equal":
        tag, i1, i2, j1, j2 = ops[0]
        ops[0] = tag, max(i1, i2 - n), i2, max(j1, j2 - n), j2
    if ops[-1][0] == "equal":
        tag, i1, i2, j1, j2 = ops[-1]
        ops[-1] = tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)
    group = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal" and i2 - i1 > 2 * n:
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


def _range(start, stop):
    length = stop - start
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1 if length else start},{length}"


def _kind(st):
    if st is None:
        return None
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "other"


def _read(path, st):
    """The file's bytes; its size (an int) when too large to compare; None if unreadable."""
    if st is not None and st.st_size > MAX_BYTES:
        return st.st_size
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return len(data) if len(data) > MAX_BYTES else data


def _link(path):
    try:
        return os.fsdecode(os.readlink(path))
    except OSError:
        return "?"


def _text(data):
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _sizes(kind, old, new):
    if kind == "added":
        return _size(new)
    if kind == "deleted":
        return f"{_size(old)} removed"
    return f"{_size(old)} \u2192 {_size(new)}"


def _size(n):
    if not isinstance(n, int):
        n = len(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


# -- as text, like `git diff` --------------------------------------------------------------------

def render(target, change, words=""):
    """The unified diff of one change as text a terminal may show: `diff --git a/P b/P`, the
    mode lines git writes (new file mode 100644, old mode / new mode, deleted file mode), then
    `--- a/P` / `+++ b/P` and the hunks, with `\\ No newline at end of file` where it applies.
    A symlink's side is its link text (as git shows it); binary and large files, directories,
    special files and invalid whiteouts get one summary line instead of hunks. words: what the
    change is beyond its kind (ops.describe), shown as a `# ...` line. Paths and lines are
    escaped (a command chose them), so bytes that are not printable text never reach the
    terminal; a patch holding such bytes is for reading, not for `git apply`."""
    path = escape_path(change.path)
    entry = change.entry
    new_st = entry.st if entry.kind not in ("whiteout", "invalid") else None
    old_st = change.real
    new_kind, old_kind = _kind(new_st), _kind(old_st)
    head = [f"diff --git a/{path} b/{path}"]
    if change.kind == "invalid-whiteout":
        return _join(head + ["# an invalid whiteout: commit will refuse it"])
    if old_st is None and new_st is not None:
        head.append(f"new file mode {new_st.st_mode:06o}")
    elif new_st is None and old_st is not None:
        head.append(f"deleted file mode {old_st.st_mode:06o}")
    elif old_st is not None and new_st is not None and old_st.st_mode != new_st.st_mode:
        head += [f"old mode {old_st.st_mode:06o}", f"new mode {new_st.st_mode:06o}"]
    if words:
        head.append(f"# {words}")
    if "dir" in (new_kind, old_kind) and new_kind in ("dir", None) and old_kind in ("dir", None):
        what = DIR_WORDS.get(change.kind, "directory")
        return _join(head + [f"# {what}"])
    old = _side(os.path.join(target, change.path), old_st, old_kind)
    new = _side(entry.src, new_st, new_kind) if new_st is not None else b""
    if old is _SPECIAL or new is _SPECIAL:
        return _join(head + ["# a special file (device, fifo or socket): no content to compare"])
    a_name = f"a/{path}" if old_st is not None and old_kind != "dir" else "/dev/null"
    b_name = f"b/{path}" if new_st is not None and new_kind != "dir" else "/dev/null"
    if old is None or new is None:
        return _join(head + ["# unreadable: not compared"])
    if isinstance(old, int) or isinstance(new, int):
        return _join(head + [f"# large file, not compared: {_sizes(change.kind, old, new)}"])
    old_text, new_text = _text(old), _text(new)
    if old_text is None or new_text is None:
        return _join(head + [f"Binary files {a_name} and {b_name} differ"])
    if old_text == new_text:
        return _join(head)
    lines = head + [f"--- {a_name}", f"+++ {b_name}"]
    a, b = _lines(old_text), _lines(new_text)
    for group in grouped(opcodes(a, b), CONTEXT):
        first, last = group[0], group[-1]
        lines.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += _marked(" ", a[i1:i2])
                continue
            if tag in ("replace", "delete"):
                lines += _marked("-", a[i1:i2])
            if tag in ("replace", "insert"):
                lines += _marked("+", b[j1:j2])
    return _join(lines)


_SPECIAL = object()


def _side(path, st, kind):
    """The bytes to compare for one side: a file's content, a symlink's text, b"" when
    absent; an int (the size) when too large, None when unreadable, _SPECIAL when the side has
    no content (a device, fifo or socket)."""
    if st is None or kind == "dir":
        return b""                 # absent, or a directory facing a file: compared with nothing
    if kind == "file":
        return _read(path, st)
    if kind == "symlink":
        try:
            return os.readlink(os.fsencode(path))
        except OSError:
            return None
    return _SPECIAL


def _lines(text):
    """Lines with their newline kept; a last line without one stays without."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _marked(tag, lines):
    out = []
    for line in lines:
        out.append(tag + escape_text(line[:-1] if line.endswith("\n") else line))
        if not line.endswith("\n"):
            out.append("\\ No newline at end of file")
    return out


def _join(lines):
    return "\n".join(lines) + "\n"
