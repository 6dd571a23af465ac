"""Protected paths: the changes that need a fresh, complete countersignature to commit and are
refused `--force` outright.

A path is protected when it matches one of the policy rule's `protect` globs, or when it is
OVERLORD's own code: `overlord/**` when the target is a checkout, `D/overlord/**` for a
checkout D below the target, everything when the target is the package itself or lies inside
the running one (the harness's own modules: an agent that edits the code containing it must
not approve itself into it).

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


MARKERS = ("ops/__init__.py", "sandbox/jail.py", "agent/loop.py")   # what makes a package ours


def _package():
    return os.path.dirname(os.path.realpath(overlord.__file__))


def _is_package(path):
    return all(os.path.isfile(os.path.join(path, p)) for p in MARKERS)


def own_source(target):
    """Whether the working folder is OVERLORD's source: this checkout, or another one."""
    here = os.path.dirname(_package())
    return os.path.realpath(target) == here or _is_package(os.path.join(target, "overlord"))


def effective_globs(target, globs, paths=()):
    """The rule's globs plus OVERLORD's own code wherever the target holds it: `overlord/**` on
    a checkout; everything when the target is the package itself or lies inside the running
    one; the package of a checkout below the target (a workspace holding one) that a changed
    path lies in, or that a removed directory held. paths: the changed paths (or Changes)."""
    out = list(globs or ())
    real = os.path.realpath(target)
    package = _package()
    if _is_package(target) or _inside(real, package):
        return out + ["**"]
    if _inside(package, real):
        out.append(os.path.relpath(package, real) + "/**")
    if own_source(target):
        out.append(OWN_GLOB)
    for root in _checkouts_below(target, paths):
        out.append(root + "/" + OWN_GLOB)
    return list(dict.fromkeys(out))


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _may_be_dir(item):
    """Could the path itself hold a checkout? A bare path might; a Change only when either
    side of it is a directory (a file's own path is never a checkout's root)."""
    real, entry = getattr(item, "real", None), getattr(item, "entry", None)
    if entry is None and real is None:
        return not hasattr(item, "path")
    return (real is not None and stat.S_ISDIR(real.st_mode)) or getattr(entry, "kind", None) == "dir"


def _checkouts_below(target, paths):
    """Every directory D below the target, D an ancestor of (or equal to) a changed path,
    whose real D/overlord is an OVERLORD package. Each candidate is looked at once."""
    seen, found = {}, []
    for item in paths:
        comps = getattr(item, "path", item).split("/")
        last = len(comps) if _may_be_dir(item) else len(comps) - 1
        for i in range(1, last + 1):
            root = "/".join(comps[:i])
            if root in seen:
                continue
            seen[root] = hit = _is_package(os.path.join(target, root, "overlord"))
            if hit:
                found.append(root)
    return found


def protected(target, paths, globs):
    """Sorted [path] of `paths` that are protected (see the module's doc). Each item is a path
    relative to the target or a Change (overlord/txn/changes.py): for a Change that deletes
    or replaces a directory, what the real tree holds below it is matched too."""
    paths = list(paths)
    rx = compile_globs(effective_globs(target, globs, paths))
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
