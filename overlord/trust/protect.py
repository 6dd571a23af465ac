"""Protected paths: the changes that need a fresh, complete countersignature to commit and are
refused `--force` outright.

A path is protected when it matches one of the policy rule's `protect` globs, or, when the
target is OVERLORD's own checkout, `overlord/**` (the harness's own modules: an agent that
edits the code containing it must not approve itself into it).

Glob semantics (every pattern is relative to the target and anchored at its root):
  *      any run of characters within one path component (never `/`); it matches a leading
         dot too (`*.pem` matches `.pem`: protection fails closed)
  ?      one character other than `/`
  [abc]  one character of the class (`[!abc]` / `[^abc]`: any but them), never `/`
  **     as a whole component: zero or more components (`**/*.pem` is every .pem at any
         depth, `a/**/b` is a/b, a/x/b, a/x/y/b); inside a component it is `*`
  a leading `/` or `./` is dropped (both still mean the target's root); repeated `/` are one.
A pattern matches everything below a path it matches, so `secrets`, `secrets/`, `secrets/**`
all protect the directory and all it holds (a trailing `/` only says what was meant). The empty
pattern matches nothing; `/`, `.` and `**` match every path (the target root included).
Deleting or replacing a directory changes everything it held: such a change is protected
when anything the real tree holds below it matches (given the plan's Change, not a bare path).
Matching is case-sensitive and exact on the path's bytes (surrogate-escaped names included).
"""
import os
import re
import stat

import overlord

OWN_GLOB = "overlord/**"


def own_source(target):
    """Whether the working folder is OVERLORD's source: this checkout, or another one."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(overlord.__file__)))
    return os.path.realpath(target) == here or all(
        os.path.isfile(os.path.join(target, "overlord", p))
        for p in ("ops/__init__.py", "sandbox/jail.py", "agent/loop.py"))


def effective_globs(target, globs):
    """The rule's globs plus `overlord/**` on OVERLORD's own checkout."""
    out = list(globs or ())
    if own_source(target) and OWN_GLOB not in out:
        out.append(OWN_GLOB)
    return out


def protected(target, paths, globs):
    """Sorted [path] of `paths` that are protected (see the module's doc). Each item is a path
    relative to the target or a Change (overlord/txn/changes.py): for a Change that deletes
    or replaces a directory, what the real tree holds below it is matched too."""
    rx = compile_globs(effective_globs(target, globs))
    if rx is None:
        return []
    out = set()
    for item in paths:
        path = getattr(item, "path", item)
        if rx.fullmatch(path) or (hasattr(item, "kind") and _removes_matching(target, item, rx)):
            out.add(path)
    return sorted(out, key=lambda p: p.split("/"))


def matches(path, globs):
    """Does one path match any of the globs (no own-checkout rule)?"""
    rx = compile_globs(globs)
    return bool(rx and rx.fullmatch(path))


def compile_globs(globs):
    """One regex for a list of globs (None when there are none that can match). A glob that
    cannot be read (a class with a reversed range, `[z-a]`) raises ValueError naming it."""
    parts = []
    for glob in globs or ():
        part = translate(glob)
        if part is not None:
            try:
                re.compile(part)
            except re.error as exc:
                raise ValueError(f"protect glob {glob!r}: {exc}") from None
            parts.append(part)
    if not parts:
        return None
    return re.compile("(?:" + "|".join(parts) + r")(?:/.*)?", re.DOTALL)


def check_glob(glob):
    """Raise ValueError (TypeError for a non-string) naming a glob that cannot be read."""
    compile_globs([glob])


def translate(glob):
    """The regex (without anchors, to be fullmatched) for one glob; None for the empty one."""
    if not isinstance(glob, str):
        raise TypeError(f"a protect glob is a string, not {type(glob).__name__}")
    text = glob
    while text.startswith("./"):
        text = text[2:]
    comps = []
    for c in text.split("/"):
        if c and c != "." and not (c == "**" and comps[-1:] == ["**"]):
            comps.append(c)
    if not comps:
        return ".*" if glob else None
    out, prefix = [], ""
    for i, comp in enumerate(comps):
        if comp == "**":
            if i == len(comps) - 1:
                out.append(".*" if not out else "(?:/.*)?")   # below anything matches anyway
            else:
                out.append(prefix + "(?:[^/]+/)*" if out else "(?:[^/]+/)*")
            prefix = ""
            continue
        out.append(prefix + "(?=[^/])" + _component(comp))     # a component is never empty
        prefix = "/"
    return "".join(out)


def _component(comp):
    out, i, n = [], 0, len(comp)
    while i < n:
        ch = comp[i]
        if ch == "*":
            while i + 1 < n and comp[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            j = i + 1
            if j < n and comp[j] in "!^":
                j += 1
            if j < n and comp[j] == "]":
                j += 1
            while j < n and comp[j] != "]":
                j += 1
            if j >= n:                       # no closing bracket: a literal '['
                out.append(re.escape(ch))
            else:
                body = comp[i + 1:j]
                neg = body[:1] in ("!", "^")
                if neg:
                    body = body[1:]
                body = re.sub(r"([\\^\[\]&~|])", r"\\\1", body)
                out.append(f"[^/{body}]" if neg else f"(?!/)[{body}]")
                i = j
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def _removes_matching(target, change, rx):
    """A deleted or replaced real directory holding a path the globs match."""
    real = change.real
    if change.kind not in ("deleted", "replaced-dir", "modified") or real is None or \
            not stat.S_ISDIR(real.st_mode):
        return False
    if change.kind == "modified" and getattr(change.entry, "kind", None) == "dir":
        return False                  # the directory stays one: its children are listed
    root = os.path.join(target, change.path)
    for base, dirs, files in os.walk(root):
        rel = os.path.relpath(base, target)
        for name in dirs + files:
            if rx.fullmatch(f"{rel}/{name}"):
                return True
    return False
