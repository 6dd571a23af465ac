"""The content gate: findings in what a session adds, each with the severity policy gives its
kind. `commit` runs it (block refuses, countersign needs a fresh complete approval), `check`
shows it, the review dossier includes it. docs/GATE.md describes the rules for people.

Only the session's side is read: the layer's copy (`change.entry.src`) of every added or
modified regular file, never through a symlink, the target text of every added or modified
symlink, and the name of every added path. The real tree is read only for the before
side of a modified file or link that holds a secret finding, so a secret the file already
held is not blamed on the session (a finding is dropped when its matched bytes were already
in the file). Kinds:

  secrets       private key blocks, cloud and model-provider key shapes, and high-entropy
                values assigned to key/secret/token/password-like names, in file contents,
                symlink targets and added names. A file is scanned whole, in chunks of
                SECRETS_CHUNK_MIB overlapping by SECRETS_OVERLAP, up to SECRETS_SCAN_MIB; the
                unscanned rest of a longer file is a finding with the secrets severity (a
                file the gate could not read whole never passes a laxer rule than one it could)
  binaries      a file with a NUL byte in its first 8 KiB, or whose first 8 KiB is not UTF-8
                and holds control bytes (path only)
  dependencies  a change (added, modified, deleted, type changed) to a dependency manifest,
                by basename (DEPENDENCY_NAMES, DEPENDENCY_GLOBS)
  git_exec      a change to what makes git run a program on the person's machine once the
                session is committed: a git directory's `config` (core.fsmonitor, core.hooksPath,
                aliases, filter and diff drivers, ...) or anything under its `hooks/`, in any
                `.git` directory of the tree (a nested or new repository's too)
  size          a file over checks["size_mb"] MiB (always a warning)

Git's own storage under `.git/` (objects, packs, the index) is binary by nature and is not
held to `binaries`; a loose object is inflated (zlib) and its content scanned for secrets, so a
secret committed to git inside the session and deleted from the work tree is still found; a
pack cannot be read that way and is a finding of the secrets severity.

A Finding's `what` never holds a secret's value: at most the well-known prefix of its shape
(`AKIA`, `ghp_`, `sk-ant-`) and its length; for an assignment, the name it is assigned to. A
Finding's `path` is masked (mask()) when the path itself holds a secret.

mask(data, lo, hi) / redact(text): the same rules, used to show content without its secrets:
every matched secret replaced by its short form (`AKIA…(20 chars, masked)`). The review
dossier and the reviewer's read_file use them, so a found secret never leaves the machine.
"""
import collections
import dataclasses
import math
import os
import re
import stat
import zlib

from overlord.errors import OverlordError
from overlord.trust.checks import DEFAULTS, KINDS, LEVELS, SEVERITIES  # noqa: F401 (the table)
from overlord.txn import changes as C

MIB = 1 << 20
SECRETS_SCAN_MIB = 256         # MiB of one file the secret scan reads at most (the rest: a finding)
SECRETS_CHUNK_MIB = 16         # ...in chunks of this many MiB
CONTEXT = 4096                 # bytes around a secret that decide it (longer than any match's reach)
MASK_CONTEXT = 16384           # ...and that take in a private key's body whole, for mask()
SECRETS_OVERLAP = 2 * CONTEXT  # by which consecutive chunks overlap
BINARY_SNIFF = 8192            # bytes that decide whether a file is binary

# -- the rules ----------------------------------------------------------------------------------

DEPENDENCY_NAMES = frozenset((
    # JavaScript / TypeScript
    "package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml",
    "pnpm-workspace.yaml", "bun.lockb", "bun.lock", "deno.json", "deno.lock",
    # Python
    "Pipfile", "Pipfile.lock", "poetry.lock", "pyproject.toml", "setup.py", "setup.cfg",
    "uv.lock", "pdm.lock", "environment.yml", "environment.yaml", "conda-lock.yml",
    # Rust, Go, Ruby, PHP
    "Cargo.toml", "Cargo.lock", "go.mod", "go.sum", "go.work", "go.work.sum",
    "Gemfile", "Gemfile.lock", "gems.rb", "gems.locked", "composer.json", "composer.lock",
    # JVM, .NET
    "pom.xml", "build.gradle", "build.gradle.kts", "settings.gradle", "settings.gradle.kts",
    "gradle.lockfile", "libs.versions.toml", "build.sbt", "packages.config",
    "Directory.Packages.props", "paket.dependencies", "paket.lock",
    # others
    "mix.exs", "mix.lock", "Package.swift", "Package.resolved", "Podfile", "Podfile.lock",
    "Cartfile", "Cartfile.resolved", "pubspec.yaml", "pubspec.lock", "vcpkg.json",
    "conanfile.txt", "conanfile.py", "flake.nix", "flake.lock", "rebar.config", "cpanfile",
    "DESCRIPTION", "renv.lock", "stack.yaml", "cabal.project", "Project.toml", "Manifest.toml",
))
DEPENDENCY_GLOBS = re.compile(r"(?:requirements[^/]*\.(?:txt|in)|constraints[^/]*\.txt|"
                              r"[^/]+\.gemspec|[^/]+\.csproj|[^/]+\.fsproj|[^/]+\.vbproj|"
                              r"[^/]+\.cabal|[^/]+\.nimble)", re.DOTALL)
DEPENDENCY_DIRS = ("requirements",)       # requirements/base.txt, requirements/dev.in
_DEPENDENCY_ENDS = (".txt", ".in", ".gemspec", ".csproj", ".fsproj", ".vbproj", ".cabal",
                    ".nimble")                # what a DEPENDENCY_GLOBS name ends with

# Where a secret can be: a run of at least MIN_RUN bytes of these (the characters of every
# key shape, of base64, and of a password's punctuation). One translate + one find of such a
# run per file decides whether anything closer is needed; most source files have none.
RUN_CHARS = (b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
             b"+/_-.~!@#$%^&*?")
MIN_RUN = 20
_RUN_TABLE = bytes(0x61 if c in RUN_CHARS else 0x20 for c in range(256))
_RUN = b"a" * MIN_RUN

# Key shapes: (marker, label, regex, shown prefix length, needs a random-looking body),
# matched inside a run only when its marker is there.
_EDGE = rb"(?<![A-Za-z0-9_\-])"
_SHAPES = tuple((mark, label, re.compile(rx), shown, rnd) for mark, label, rx, shown, rnd in (
    (b"AKIA", "AWS access key", rb"(?<![A-Z0-9])AKIA[A-Z0-9]{16}(?![A-Z0-9])", 4, False),
    (b"ASIA", "AWS access key", rb"(?<![A-Z0-9])ASIA[A-Z0-9]{16}(?![A-Z0-9])", 4, False),
    (b"AIza", "Google API key", _EDGE + rb"AIza[0-9A-Za-z_\-]{35}(?![A-Za-z0-9_\-])", 4, False),
    (b"gh", "GitHub token", _EDGE + rb"gh[pousr]_[A-Za-z0-9]{36,255}(?![A-Za-z0-9])", 4, False),
    (b"github_pat_", "GitHub token", _EDGE + rb"github_pat_[A-Za-z0-9_]{22,255}", 11, False),
    (b"xox", "Slack token", _EDGE + rb"xox[abprs]-(?:[0-9]+-){1,4}[A-Za-z0-9]{8,250}", 5, False),
    (b"_live_", "Stripe live key", _EDGE + rb"[sr]k_live_[A-Za-z0-9]{20,250}", 8, False),
    (b"sk-ant-", "Anthropic API key", _EDGE + rb"sk-ant-[A-Za-z0-9_\-]{20,250}", 7, True),
    (b"sk-", "OpenAI API key",
     _EDGE + rb"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,250}", 3, True),
    (b"eyJ", "JSON web token",
     _EDGE + rb"eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}", 3, False),
))

_MARKS_RX = re.compile(b"|".join(re.escape(mark) for mark, *_ in _SHAPES))

_PEM_RX = re.compile(rb"-----BEGIN ((?:[A-Z0-9]+ ){0,3})PRIVATE KEY( BLOCK)?-----"
                     rb"[\s\S]{0,400}?[A-Za-z0-9+/]{40,}")

# names a secret is assigned to: a name holding one of these (case-insensitive), then an
# operator (= : := =>), then the value, quoted or bare
SECRET_NAMES = (b"key", b"secret", b"token", b"pass", b"pwd", b"credential")
_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
# a bare value ends its line (or is followed by ; , or a comment): in prose it is one word of many
# ...and a bare `module.Name`, `cls.ATTR`, `snake_case_name`, `ALL_CAPS_NAME` is code
_DOTTED = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+|"
                     rb"[a-z][a-z0-9]*(?:_[a-z0-9]+)+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_BARE_END = re.compile(rb"[ \t]*[;,]?[ \t]*(?:(?:#|//)[^\n]*)?(?:\r?\n|$)")
_VALUE_RX = re.compile(rb"[ \t]{0,8}(?:\"([^\"\n\r]{20,512})\"|'([^'\n\r]{20,512})'|"
                       rb"([A-Za-z0-9+/=_\-.~]{20,512}))")
_HEX_RX = re.compile(rb"[0-9a-f]+|[0-9A-F]+")
_PLACEHOLDER = (b"${", b"{{", b"<", b"%(", b"$(", b"%s", b"{}", b"process.env", b"os.environ",
                b"getenv")
ENTROPY_FACTOR, ENTROPY_CAP, HEX_ENTROPY = 0.84, 4.4, 3.0


def entropy_threshold(value):
    """The Shannon entropy (bits per character) a value of this length and alphabet must
    reach to count as random: hex digits 3.0; anything else min(0.84 * log2(len), 4.4)
    (a random string cannot have more than log2(len) bits per character). With looks_random's
    other tests, 98.5% of random base64 strings of 20 characters pass, 99.2% of 32, 99.6% of
    40, all of 64; 97% of random hex strings of 20, all from 32 on; English phrases, paths
    and identifiers do not."""
    if _HEX_RX.fullmatch(value):
        return HEX_ENTROPY
    return min(ENTROPY_FACTOR * math.log2(len(value)), ENTROPY_CAP)


def entropy(value):
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in collections.Counter(value).values())


_DIGIT = re.compile(rb"[0-9]")
_LETTERS = re.compile(rb"[A-Za-z]{2,}")
_CAPS = re.compile(rb"[A-Z](?=[A-Z])")


def looks_random(value):
    """Could this be a random string? 20 characters or more; a digit, or else at least two
    capitals next to capitals and letters whose case flips between neighbours at least 40%
    of the time (about half the time in a random string, where one capital in two is
    followed by another; names are otherwise: `max_completion_tokens` never flips,
    `TryGetKeyValueResponse` has no two capitals together, `HTTPSConnectionPool` flips 25%);
    and the entropy above."""
    if len(value) < 20:
        return False
    if _DIGIT.search(value) is None:
        if len(_CAPS.findall(value)) < 2:
            return False
        pairs = flips = 0
        for run in _LETTERS.findall(value):
            lower = [c > 0x60 for c in run]
            pairs += len(run) - 1
            flips += sum(a != b for a, b in zip(lower, lower[1:]))
        if flips < 0.4 * pairs:
            return False
    return entropy(value) >= entropy_threshold(value)


# -- findings -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Finding:
    kind: str            # secrets | binaries | dependencies | git_exec | size
    path: str
    line: int            # 1-based; None where no line applies
    what: str            # what was found, never a secret's value whole
    severity: str        # block | countersign | warn

    def as_dict(self):
        return dataclasses.asdict(self)


def levels(checks):
    """The effective severities: {kind: level} and size_mb, defaults filled in. A level that
    is not one of LEVELS is refused naming the key."""
    out = dict(DEFAULTS)
    for key, value in (checks or {}).items():
        if key in ("secrets", "binaries", "dependencies", "git_exec"):
            if value not in LEVELS:
                raise OverlordError(f"checks.{key}: {value!r} is not one of {', '.join(LEVELS)}")
            out[key] = value
        elif key == "size_mb":
            if value not in (None, "off") and (isinstance(value, bool) or
                                               not isinstance(value, (int, float)) or value < 0):
                raise OverlordError(f"checks.size_mb: {value!r} is not a number of MiB")
            out[key] = value
    return out


def partition(findings):
    """(blocking, countersign, warnings): the findings by severity."""
    by = {s: [f for f in findings if f.severity == s] for s in SEVERITIES}
    return by["block"], by["countersign"], by["warn"]


def scan(target, plan, checks):
    """[Finding] in what the plan adds, in plan order (then by line). checks: policy's
    `checks` ({kind: block|countersign|warn|off, size_mb: N}), defaults for what is missing."""
    lv = levels(checks)
    secrets, binaries, deps = lv["secrets"], lv["binaries"], lv["dependencies"]
    git_exec = lv["git_exec"]
    configured = Configured(target) if git_exec != "off" else None
    size_mb = lv["size_mb"]
    size_cap = None if size_mb in (None, "off") or size_mb <= 0 else size_mb * MIB
    out = []
    for change in plan:
        entry, path = change.entry, change.path
        shown = _shown(path)
        if secrets != "off" and change.kind == "added" and len(path) - path.rfind("/") > MIN_RUN:
            for _, what, _ in _secrets(os.fsencode(path[path.rfind("/") + 1:]), lines=False):
                out.append(Finding("secrets", shown, None, f"{what} in its name", secrets))
        if deps != "off" and _dependency(change):
            out.append(Finding("dependencies", shown, None,
                               f"dependency manifest {_dep_verb(change)}", deps))
        storage = git_storage(path)
        if git_exec != "off" and storage is None:
            why = change.kind != "deleted" and (git_exec_path(path, entry.kind) or
                                                configured.named(path))
            if why == CONFIG and entry.kind == "file":
                why = _config_risk(target, change)
            if why and not (change.kind == "modified" and change.content_same and
                            entry.kind == "file" and not entry.st.st_mode & 0o111):
                out.append(Finding("git_exec", shown, None, why, git_exec))
        if change.kind not in ("added", "modified") or change.content_same:
            continue
        if storage and entry.kind == "file":
            if secrets != "off":
                out += _git_object_secrets(entry, shown, storage, secrets)
            continue
        if entry.kind == "symlink" and secrets != "off":
            out += [Finding("secrets", shown, None, f"{what} in the symlink's target", secrets)
                    for what in _link_secrets(target, change)]
        if entry.kind != "file":
            continue
        size = entry.st.st_size
        if size_cap is not None and size > size_cap:
            out.append(Finding("size", shown, None,
                               f"{_mib(size)} (over {size_mb:g} MiB)", "warn"))
        if size == 0 or (secrets == "off" and binaries == "off"):
            continue
        want = min(size, SECRETS_CHUNK_MIB * MIB) if secrets != "off" else min(size, BINARY_SNIFF)
        data = _read_head(entry.src, want)
        binary = _is_binary(data[:BINARY_SNIFF])
        if binaries != "off" and binary:
            out.append(Finding("binaries", shown, None, binary, binaries))
        if secrets == "off":
            continue
        if size > len(data) == want:
            found, scanned = _file_secrets(entry.src, data, size, lines=not binary)
        else:
            found, scanned = _secrets(data, lines=not binary), size
        if found and change.kind == "modified" and change.real is not None and \
                stat.S_ISREG(change.real.st_mode):
            held = _held(C.real_path(target, path), {f[2] for f in found})
            found = [f for f in found if f[2] not in held]
        for line, what, _ in found:
            out.append(Finding("secrets", shown, line, what, secrets))
        if scanned < size:
            out.append(Finding("secrets", shown, None,
                               f"not scanned for secrets past its first {_mib(scanned)} (the "
                               f"file is {_mib(size)}): the rest is held to checks.secrets",
                               secrets))
    return out


# -- git ------------------------------------------------------------------------------------------

# in a `.git` directory, or a bare repository's `NAME.git` (a heuristic: a bare one by another
# name is not seen): config, hooks, and the files that send git to another git directory
_HOOKS_OR_CONFIG = re.compile(r"(?:^|.*/)[^/]*\.git/(?:(?:modules/.+|worktrees/[^/]+)/)?"
                              r"(?:(config(?:\.worktree)?)|(hooks)(/.+)?|(commondir|gitdir))")
_LOOSE = re.compile(r"(?:^|.*/)\.git/(?:modules/.+/)?objects/[0-9a-f]{2}/[0-9a-f]{38,62}")
_STORAGE = re.compile(r"(?:^|.*/)\.git/(?:modules/.+/)?(?:objects/pack/[^/]+|index|"
                      r"objects/info/[^/]+)")


def git_exec_path(path, kind="file"):
    """What a path is, when a change to it makes git run a program on the person's machine
    (a hook, a git directory's configuration, what sends git to another git directory -- and
    so to its config and hooks), else None. kind: the session's entry kind (a `.git` or
    `hooks` that is no directory points somewhere else)."""
    name = path.rpartition("/")[2]
    if name == ".git" and kind not in ("dir", None):
        return "a .git that is not a directory (it sends git to a git directory elsewhere)"
    m = _HOOKS_OR_CONFIG.fullmatch(path)
    if not m:
        return None
    if m.group(4):
        return f"{m.group(4)} (it sends git to another git directory, its config and hooks)"
    if m.group(2):
        if m.group(3) is None and kind == "dir":
            return None              # the hooks folder itself: what is in it is checked
        if path.endswith(".sample"):                      # git never runs a *.sample
            return None
        return "a git hook (git runs it on your machine)"
    return CONFIG


CONFIG = "git configuration (it can name programs git runs: core.fsmonitor, hooks, aliases, filters)"
# keys git reads as data, never as a program to run: what `git init`, `clone`, `remote add`,
# `branch -u`, `submodule` and `config user.*` write. Any other key set or changed is a finding.
INERT_KEYS = re.compile(r"core\.(?:repositoryformatversion|filemode|bare|logallrefupdates|"
                        r"ignorecase|precomposeunicode|symlinks|autocrlf|eol|safecrlf|"
                        r"abbrev|quotepath)|extensions\.(?:objectformat|worktreeconfig)|"
                        r"init\.defaultbranch|user\.(?:name|email)|gc\.auto|"
                        r"remote\.[^\n]+\.(?:url|fetch|pushurl|tagopt|prune)|"
                        r"branch\.[^\n]+\.(?:remote|merge|rebase|description)|"
                        r"submodule\.[^\n]+\.(?:url|active|branch|path)")


def _config_risk(target, change):
    """The git_exec finding's text for a changed git config, or None when every key it sets or
    changes is inert (INERT_KEYS). A file this cannot parse is a finding."""
    new = _config_entries(_read_head(change.entry.src, 1 << 20))
    old = []
    if change.kind == "modified" and change.real is not None:
        old = _config_entries(_read_head(C.real_path(target, change.path), 1 << 20, real=True))
    if new is None:
        return CONFIG + ", not parsed"
    left = collections.Counter(old or [])
    added = []
    for item in new:
        if left[item]:
            left[item] -= 1
        else:
            added.append(item)
    risky = sorted({key for key, _ in added if not INERT_KEYS.fullmatch(key)})
    if not risky:
        return None
    names = ", ".join(risky[:4]) + (f" and {len(risky) - 4} more" if len(risky) > 4 else "")
    return f"git configuration sets {names} (keys that can name programs git runs)"


HOOK_NAMES = frozenset((
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
    "post-merge", "pre-push", "pre-receive", "update", "proc-receive", "post-receive",
    "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite",
    "sendemail-validate", "fsmonitor-watchman", "post-index-change"))


class Configured:
    """Where the real repository's own config (and the person's global one) sends git for
    programs inside the tree: core.hooksPath folders and include.path files. A session's
    change there is a git_exec finding too (husky's `.husky/pre-commit`)."""

    def __init__(self, target):
        self.hooks, self.includes = [], []
        home = os.path.expanduser("~")
        for cfg, base in ((os.path.join(target, ".git", "config"), os.path.join(target, ".git")),
                          (os.path.join(home, ".gitconfig"), home)):
            for key, value in _config_entries(_read_head(cfg, 1 << 20, real=True)) or ():
                value = value.strip('"')
                if key == "core.hookspath" and value:
                    self._add(self.hooks, target, value, target)
                elif (key == "include.path" or (key.startswith("includeif.") and
                                                key.endswith(".path"))) and value:
                    self._add(self.includes, target, value, base)

    @staticmethod
    def _add(into, target, value, base):
        if value.startswith("~"):
            value = os.path.expanduser(value)
        full = os.path.normpath(os.path.join(base, value))
        rel = os.path.relpath(full, target)
        if rel != ".." and not rel.startswith("../"):
            into.append("" if rel == "." else rel)

    def named(self, path):
        for hp in self.hooks:
            inside = path.startswith(hp + "/") if hp else ("/" not in path and path in HOOK_NAMES)
            if path == hp or inside:
                return f"a hook in core.hooksPath {hp or '.'} (git runs it on your machine)"
        if path in self.includes:
            return "a file the repository's config includes (it can name programs git runs)"
        return None


_SECTION = re.compile(r'\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\\n]|\\.)*)")?\s*\]')
_KEY = re.compile(r"([A-Za-z][A-Za-z0-9-]*)\s*(?:=(.*))?")


def _config_entries(data):
    """[(section[.subsection].key lowercased but the subsection, value)] of a git config file,
    or None when a line is not one this reader is sure of (so it cannot hide a key)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    out, section = [], None
    for line in text.splitlines():
        line = line.strip()
        if line.endswith("\\"):        # a continuation (or a comment git does not continue):
            return None                 # which one is git's call, so not this reader's
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            m = _SECTION.match(line)
            if not m or line[m.end():].strip()[:1] not in ("", "#", ";"):
                return None
            section = m.group(1).lower() + (f".{m.group(2)}" if m.group(2) is not None else "")
            continue
        m = _KEY.fullmatch(line)
        if not m or section is None:
            return None
        out.append((f"{section}.{m.group(1).lower()}", (m.group(2) or "").strip()))
    return out


def git_storage(path):
    """"loose" for a loose object, "pack" for a pack or git's other binary storage, else None."""
    if _LOOSE.fullmatch(path):
        return "loose"
    if _STORAGE.fullmatch(path):
        return "pack" if "/objects/pack/" in path and path.endswith(".pack") else "other"
    return None


GIT_OBJECT_CAP = SECRETS_CHUNK_MIB * MIB      # inflated bytes of one loose object scanned


def _git_object_secrets(entry, shown, storage, severity):
    """Secrets in what a loose object holds (inflated); a pack, which this cannot read, is a
    finding of the secrets severity; git's other storage (index, pack indexes) holds no content."""
    if storage == "pack":
        return [Finding("secrets", shown, None, "a git pack: its objects are not scanned for "
                        "secrets (held to checks.secrets)", severity)]
    if storage != "loose":
        return []
    raw = _read_head(entry.src, min(entry.st.st_size, GIT_OBJECT_CAP))
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(raw, GIT_OBJECT_CAP)
    except zlib.error:
        return [Finding("secrets", shown, None, "a git object that does not inflate: not scanned "
                        "for secrets (held to checks.secrets)", severity)]
    body = data[data.find(b"\0") + 1:]
    out = [Finding("secrets", shown, None, f"{what} in the git object's content", severity)
           for _, what, _ in _secrets(body, lines=False)]
    if inflate.unconsumed_tail or len(raw) < entry.st.st_size:
        out.append(Finding("secrets", shown, None, "a git object larger than the scan: the rest "
                           "is held to checks.secrets", severity))
    return out


def _shown(path):
    """The path as a finding names it: masked when it holds a secret (rare: one translate)."""
    return path if len(path) < MIN_RUN else redact(path)


def _link_secrets(target, change):
    """[what] of the secrets in an added or modified symlink's target text that the real
    tree's link there did not already hold."""
    found = _secrets(os.fsencode(os.readlink(change.entry.src)), lines=False)
    if found and change.kind == "modified" and change.real is not None and \
            stat.S_ISLNK(change.real.st_mode):
        try:
            before = os.fsencode(os.readlink(C.real_path(target, change.path)))
        except OSError:
            before = b""
        found = [f for f in found if f[2] not in before]
    return [what for _, what, _ in found]


def _file_secrets(path, head, size, lines=True):
    """([(line, what, raw)], bytes scanned) of a file longer than one chunk: its head (the
    first chunk, already read) and then chunks overlapping by SECRETS_OVERLAP, to
    SECRETS_SCAN_MIB. A hit belongs to the chunk where it has CONTEXT on both sides (the
    first chunk's start and the last chunk's end are the file's)."""
    chunk, cap = SECRETS_CHUNK_MIB * MIB, min(size, SECRETS_SCAN_MIB * MIB)
    out, base, newlines, data = [], 0, 0, head
    fd = _open(path)
    try:
        while True:
            last = base + len(data) >= cap or len(data) < chunk
            lo = CONTEXT if base else 0
            hi = len(data) if last else len(data) - CONTEXT
            line, pos = newlines + 1, 0
            for offset, what, raw, _ in _hits(data):
                if lo <= offset < hi:
                    if lines:
                        line += data.count(b"\n", pos, offset)
                        pos = offset
                    out.append((line if lines else None, what, raw))
            if last:
                return out, base + len(data)
            step = len(data) - SECRETS_OVERLAP
            newlines += data.count(b"\n", 0, step) if lines else 0
            base += step
            data = os.pread(fd, min(chunk, cap - base), base)
    finally:
        os.close(fd)


def _held(path, raws):
    """The raws the real tree's file at path already holds (in its first SECRETS_SCAN_MIB;
    an unreadable file holds none)."""
    fd = _open(path, real=True)
    if fd is None:
        return set()
    keep, held, base, tail = max(map(len, raws)) - 1, set(), 0, b""
    try:
        while base < SECRETS_SCAN_MIB * MIB and len(held) < len(raws):
            chunk = os.pread(fd, min(SECRETS_CHUNK_MIB * MIB, SECRETS_SCAN_MIB * MIB - base), base)
            if not chunk:
                break
            data = tail + chunk
            held.update(r for r in raws if r in data)
            tail, base = data[len(data) - keep:] if keep else b"", base + len(chunk)
        return held
    finally:
        os.close(fd)


def _mib(n):
    return f"{n / MIB:.1f} MiB" if n >= MIB // 10 else f"{n / 1024:.1f} KiB"


def _dependency(change):
    if change.kind == "modified" and change.content_same:
        return False                   # a chmod of package.json changes no dependency
    path = change.path
    name = path[path.rfind("/") + 1:]
    if name in DEPENDENCY_NAMES:
        return True
    if not name.endswith(_DEPENDENCY_ENDS):
        return False
    if DEPENDENCY_GLOBS.fullmatch(name):
        return True
    parent = path.rpartition("/")[0].rpartition("/")[2]
    return parent in DEPENDENCY_DIRS and name.endswith((".txt", ".in"))


def _dep_verb(change):
    if change.kind == "modified":
        e, r = change.entry, change.real
        if r is not None and C.kind_of(r) != e.kind:
            return "replaced"
    return {"added": "added", "modified": "modified", "deleted": "deleted"}.get(change.kind,
                                                                               "replaced")


def _open(path, real=False):
    """A read-only fd of a regular file, never through a symlink. A file of our own layer that
    the command left unreadable is opened through changes.readable; the real tree's file is
    never chmodded: an unreadable one, or one that is not a regular file, is None."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except PermissionError:
        if real:
            return None
        with C.readable(path):
            return os.open(path, flags)
    except OSError:
        if real:
            return None
        raise
    if real and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)               # (a sealed layer's entry is a regular file: no fstat)
        return None
    return fd


def _read_head(path, n, real=False):
    """Up to n bytes from the start of a regular file, never through a symlink (_open; the
    real tree's unreadable or irregular file reads as empty)."""
    fd = _open(path, real)
    if fd is None:
        return b""
    try:
        data = os.read(fd, n)
        if 0 < len(data) < n:      # a short read: go on to n or the end
            chunks = [data]
            while n - len(data) > 0:
                chunk = os.read(fd, n - len(data))
                if not chunk:
                    break
                chunks.append(chunk)
                data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


_CONTROLS = bytes(c for c in range(32) if c not in b"\t\n\r\f\v\b\x1b") + b"\x7f"
_CONTROL_TABLE = bytes.maketrans(_CONTROLS, b"\0" * len(_CONTROLS))


def _is_binary(head):
    """Why a file's first bytes are not text ('' when they are): a NUL byte, or bytes that
    are not UTF-8 of which at least 1% are control characters."""
    if b"\0" in head:
        return "binary content (a NUL byte in its first 8 KiB)"
    try:
        head.decode("utf-8")
        return ""
    except UnicodeDecodeError as exc:
        if exc.start >= len(head) - 3 and exc.reason == "unexpected end of data":
            return ""                  # a character cut at the sniff's edge
    controls = head.translate(_CONTROL_TABLE).count(b"\0")
    if controls * 100 >= len(head):
        return "binary content (not UTF-8 text, control bytes in its first 8 KiB)"
    return ""


# -- secrets --------------------------------------------------------------------------------------

def _secrets(data, lines=True):
    """[(line or None, what, matched bytes)] of the secrets in data, by offset. lines: False
    for a binary file (no line numbers)."""
    out, line, pos = [], 1, 0
    for offset, what, raw, _ in _hits(data):
        if lines:
            line += data.count(b"\n", pos, offset)
            pos = offset
        out.append((line if lines else None, what, raw))
    return out


def _hits(data):
    """[(offset, what, matched bytes, how many of them a finding may show)], by offset."""
    hits = []
    if b"-----BEGIN" in data:
        for m in _PEM_RX.finditer(data):
            label = m.group(1).decode("ascii").strip()
            block = " block" if m.group(2) else ""
            what = f"private key{block} ({label})" if label else f"private key{block}"
            hits.append((m.start(), what, m.group(0), data.index(b"-----", m.start() + 5) + 5 -
                         m.start()))
    runs = data.translate(_RUN_TABLE)
    at = runs.find(_RUN)
    while at >= 0:
        end = runs.find(b" ", at)
        end = len(data) if end < 0 else end
        if not (hits and _inside(at, hits)):
            hits.extend(_in_run(data, at, end))
        at = runs.find(_RUN, end)
    hits.sort(key=lambda h: h[0])
    return hits


def _inside(offset, hits):
    return any(start <= offset < start + len(raw) for start, _, raw, _ in hits)


# -- masking: content shown without its secrets --------------------------------------------------

_B64_LINE = re.compile(rb"\r?\n[+\- ]?[A-Za-z0-9+/=]{40,}(?=\r?\n|$)")
_B64_TAIL = re.compile(rb"[A-Za-z0-9+/=]*")
_PEM_END = re.compile(rb"\r?\n[+\- ]?(?:[A-Za-z0-9+/=]{1,80}\r?\n[+\- ]?)?"
                      rb"-----END [A-Z0-9 ]{0,40}-----")


def spans(data):
    """[(start, end, short form)] of the secrets in data (bytes), by offset, not overlapping.
    A private key's span runs on over the base64 lines of its body (a line of 40 or more
    base64 characters each, as in a PEM file or a diff of one, a one-character diff prefix
    allowed) and its END line, no further: masking must not hide anything but the key."""
    out = []
    for offset, what, raw, shown in _hits(data):
        end = offset + len(raw)
        if what.startswith("private key"):
            end = _B64_TAIL.match(data, end).end()
            m = _B64_LINE.match(data, end)
            while m is not None:
                end = m.end()
                m = _B64_LINE.match(data, end)
            m = _PEM_END.match(data, end)
            end = m.end() if m is not None else end
        if out and offset < out[-1][1]:          # inside the last one: one span
            start, last, form = out.pop()
            out.append((start, max(last, end), form))
            continue
        form = data[offset:offset + shown] + f"…({end - offset} chars, masked)".encode()
        out.append((offset, end, form))
    return out


def mask(data, lo=0, hi=None):
    """(masked, lo, hi): data[lo:hi] (bytes) with every secret in data replaced by its short
    form, lo and hi moved out to take in a secret they cut. Pass data with MASK_CONTEXT bytes
    beyond lo and hi on either side (where the file has them) so a secret across an edge is
    recognized and a private key's body masked whole."""
    hi = len(data) if hi is None else hi
    parts, pos = [], lo
    for start, end, form in spans(data):
        if end <= lo or start >= hi:
            continue
        if start < pos:
            lo = pos = start
        parts += [data[pos:start], form]
        pos, hi = end, max(hi, end)
    if not parts:
        return data[lo:hi], lo, hi
    parts.append(data[pos:hi])
    return b"".join(parts), lo, hi


def redact(text):
    """text (str or bytes) with every secret in it replaced by its short form."""
    if isinstance(text, str):
        return mask(text.encode("utf-8", "surrogateescape"))[0].decode("utf-8", "surrogateescape")
    return mask(text)[0]


def _in_run(data, at, end):
    """The secrets of one run of RUN_CHARS, data[at:end]: key shapes inside it, else a
    high-entropy value assigned to a secret-like name that the run begins."""
    out = []
    if _MARKS_RX.search(data, at, end) is None:
        hit = _assignment(data, at)
        return [hit] if hit is not None else []
    run = data[at:end]
    for mark, label, rx, shown, random_body in _SHAPES:
        if mark not in run:
            continue
        for m in rx.finditer(data, max(at - 1, 0), end + 1):
            raw = m.group(0)
            if random_body and not looks_random(raw[shown:]):
                continue
            if not (out and _inside(m.start(), out)):
                out.append((m.start(), f"{label} {raw[:shown].decode('ascii')}…({len(raw)} chars)",
                            raw, shown))
    if out:
        return out
    hit = _assignment(data, at)
    return [hit] if hit is not None else []


def _assignment(data, at):
    """(offset of the value, what, value, 0) when the run at `at` is (the start of) a value
    assigned to a secret-like name -- `NAME = "..."`, `"name": "..."`, `name: ...`,
    `NAME=...`, `name => '...'` -- of high entropy; else None."""
    i = at
    if i > 0 and data[i - 1] in b"\"'":
        i -= 1
    op = i
    while op > 0 and data[op - 1] in b" \t":
        op -= 1
    j = op
    while j > 0 and op - j < 2 and data[j - 1] in b"=:>":
        j -= 1
    if j == op or data[j:op] not in (b"=", b":", b":=", b"=>"):
        return None
    k = j
    while k > 0 and j - k < 8 and data[k - 1] in b" \t":
        k -= 1
    if k > 0 and data[k - 1] in b"\"'":
        k -= 1
    name_end = k
    while k > 0 and name_end - k < 64 and data[k - 1] in _NAME_CHARS:
        k -= 1
    name = data[k:name_end]
    lowered = name.lower()
    if not name or not any(n in lowered for n in SECRET_NAMES):
        return None
    m = _VALUE_RX.match(data, op)
    if m is None:
        return None
    g = 1 if m.group(1) is not None else 2 if m.group(2) is not None else 3
    value = m.group(g)
    if g == 3 and (_BARE_END.match(data, m.end(g)) is None or _DOTTED.fullmatch(value)):
        return None
    if any(p in value for p in _PLACEHOLDER) or not looks_random(value):
        return None
    return (m.start(g), f"high-entropy value ({len(value)} chars) assigned to "
            f"{name.decode('ascii')}", value, 0)
