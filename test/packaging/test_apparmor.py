"""packaging/apparmor/overlord: parsed by a real AppArmor 4.x parser, and read for what it grants.

The parser is Debian 13's (apparmor 4.1), installed in a fresh trixie root (test/packaging/
rootfs.py): this host is Debian 12, whose apparmor_parser is 3.0.x. That parser does not know
AppArmor 4's `userns` rule (nor `abi <abi/4.0>`'s features): it stops with a lexer error on
`userns,` -- the very line the profile exists for -- so a 3.x parser cannot check this file, and
the profile cannot be loaded on a 3.x system (Debian 12 does not restrict user namespaces, so
install.sh places no profile there). The host's parser is therefore never used here.

The parse runs with -Q (skip the kernel load) and -K (skip the cache): the root has no
securityfs, so the kernel's feature set is given as a file (-M /etc/apparmor.d/abi/4.0, the
features of the AppArmor 4.0 ABI the profile declares), and the parser compiles the policy for
it. Negative controls show the check can fail: a broken copy is refused by the same parse, a
broken local/overlord is reached through the profile's include, and copies that parse fine
but attach to the interpreter or to a glob, or grant more, are refused by the structural check.
"""
import os
import re

import pytest

import rootfs

PROFILE = os.path.join(rootfs.REPO, "packaging", "apparmor", "overlord")
LAUNCHER = "/usr/local/bin/overlord"
PARSE = "apparmor_parser -Q -K -M /etc/apparmor.d/abi/4.0 --base /etc/apparmor.d"

# Every non-comment line of the profile, in order: nothing else may be in it.
EXPECTED_RULES = [
    "abi <abi/4.0>,",
    "include <tunables/global>",
    f"profile overlord {LAUNCHER} flags=(unconfined) {{",
    "userns,",
    "include if exists <local/overlord>",
    "}",
]


def rules(text):
    """The profile's lines without comments and blank lines. `#include` is AppArmor's old
    include syntax, not a comment: it is kept (and so refused, being no expected rule)."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#include")):
            continue
        out.append(re.sub(r"\s+#(?!include).*$", "", stripped))
    return out


def problems(text):
    """What is wrong with a profile for OVERLORD's launcher; empty when it is right."""
    body = rules(text)
    found = []
    headers = [r for r in body if r.endswith("{")]
    if len(headers) != 1:
        found.append(f"{len(headers)} profile headers (exactly one expected): {headers}")
    for header in headers:
        m = re.match(r"profile\s+(\S+)\s+(\S+)\s+flags=\(unconfined\)\s*\{$", header)
        if not m:
            found.append(f"not a named, attached, unconfined profile: {header!r}")
            continue
        name, attach = m.groups()
        if name != "overlord":
            found.append(f"profile name {name!r}")
        if attach != LAUNCHER:
            found.append(f"attached to {attach!r}, not exactly {LAUNCHER}")
        if re.search(r"[*?\[\]{}]", attach):
            found.append(f"attachment {attach!r} is a glob")
        if "python" in attach:
            found.append(f"attachment {attach!r} is the interpreter")
    if "userns," not in body:
        found.append("no `userns,` rule")
    if not body or body[0] != "abi <abi/4.0>,":
        found.append("does not start with abi <abi/4.0>")
    for rule in body:
        word = rule.split()[0].lstrip("#").rstrip(",")
        if word in ("capability", "file", "network", "mount", "remount", "umount",
                    "pivot_root", "ptrace", "signal", "dbus", "unix", "change_profile"):
            found.append(f"grants {word}: {rule!r}")
        if re.search(r"\b(ux|Ux|pux|PUx|pix|Pix|cix|Cix|px|Px|cx|Cx|ix)\b", rule):
            found.append(f"exec transition rule: {rule!r}")
    if body != EXPECTED_RULES:
        found.append(f"rules differ from the expected ones: {body}")
    return found


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A fresh Debian 13 root with Debian's apparmor (the 4.x parser and its abi/tunables)."""
    rootfs.require()
    r = rootfs.fresh(tmp_path_factory.mktemp("apparmor"))
    r.run("apt-get update -qq && apt-get install -y -qq --no-install-recommends apparmor >/dev/null")
    return r


def place(root, text, inner):
    with open(root.host(inner), "w") as f:
        f.write(text)
    return inner


def source():
    with open(PROFILE) as f:
        return f.read()


def test_parser_is_4x(root):
    out = root.run("apparmor_parser --version").stdout
    assert re.match(r"AppArmor parser version 4\.\d+", out), out


def test_profile_parses_with_the_4x_parser(root):
    inner = place(root, source(), "/etc/apparmor.d/overlord")     # where install.sh puts it
    proc = root.run(f"{PARSE} {inner}", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr            # not even a warning
    # the profiles it defines: exactly one, named overlord
    names = root.run(f"{PARSE} -N {inner}").stdout.split()
    assert names == ["overlord"]
    # compiled to a binary policy for the 4.0 feature set (what a load would hand the kernel)
    root.run(f"{PARSE} -o /tmp/overlord.bin {inner}")
    with open(root.host("/tmp/overlord.bin"), "rb") as f:
        blob = f.read()
    assert b"overlord\0" in blob and len(blob) > 100


def test_a_broken_copy_fails_the_same_parse(root):
    for broken in (source().replace("userns,", "userns bogus,"),
                   source().replace("userns,", "userns"),
                   source().replace("flags=(unconfined) {", "flags=(unconfined)")):
        assert broken != source()
        inner = place(root, broken, "/tmp/broken")
        proc = root.run(f"{PARSE} /tmp/broken", check=False)
        assert proc.returncode != 0, broken
        assert "AppArmor parser error" in proc.stderr, proc.stderr
        os.unlink(root.host(inner))


def test_local_additions_are_included(root):
    """The include of local/overlord is live: a broken local file breaks the parse."""
    place(root, source(), "/etc/apparmor.d/overlord")
    local = root.host("/etc/apparmor.d/local/overlord")
    try:
        with open(local, "w") as f:
            f.write("this is not a rule\n")
        proc = root.run(f"{PARSE} /etc/apparmor.d/overlord", check=False)
        assert proc.returncode != 0 and "local/overlord" in proc.stderr, proc.stderr
        with open(local, "w") as f:
            f.write("# site additions\n")
        root.run(f"{PARSE} /etc/apparmor.d/overlord")
    finally:
        os.unlink(local)


def test_structure():
    assert problems(source()) == []
    assert rules(source()) == EXPECTED_RULES


@pytest.mark.parametrize("bad, why", [
    (lambda t: t.replace(LAUNCHER + " flags", "/usr/bin/python3.13 flags"), "interpreter"),
    (lambda t: t.replace(LAUNCHER + " flags", "/usr/bin/python3* flags"), "glob"),
    (lambda t: t.replace(LAUNCHER + " flags", "/usr/local/bin/* flags"), "glob"),
    (lambda t: t.replace(LAUNCHER + " flags", "/usr/local/bin/overlord{,-x} flags"), "glob"),
    (lambda t: t.replace("  userns,\n", "  userns,\n  capability sys_admin,\n"), "capability"),
    (lambda t: t.replace("  userns,\n", "  userns,\n  file,\n"), "file"),
    (lambda t: t.replace("  userns,\n", "  userns,\n  network,\n"), "network"),
    (lambda t: t.replace("  userns,\n", "  userns,\n  mount,\n"), "mount"),
    (lambda t: t.replace("  userns,\n", "  userns,\n  /usr/bin/** ux,\n"), "exec transition"),
    (lambda t: t.replace("  userns,\n", "  userns,\n  /usr/bin/** pix,\n"), "exec transition"),
    (lambda t: t.replace("  userns,\n", "  userns,\n  #include <abstractions/base>\n"), "differ"),
    (lambda t: t.replace("  userns,\n", ""), "userns"),
    (lambda t: t.replace("abi <abi/4.0>,", "abi <abi/3.0>,"), "abi"),
    (lambda t: t + "\nprofile other /usr/bin/other flags=(unconfined) {\n  userns,\n}\n",
     "profile headers"),
    (lambda t: t.replace("  include if exists <local/overlord>\n",
                         "  include if exists <local/overlord>\n  profile child {\n  }\n"),
     "profile headers"),
])
def test_structure_refuses(root, bad, why):
    """Each bad copy is refused by the structural check -- and the ones AppArmor accepts show
    the parser alone would not have caught them."""
    text = bad(source())
    assert text != source()
    found = problems(text)
    assert any(why in p for p in found), found
    inner = place(root, text, "/tmp/variant")
    parsed = root.run(f"{PARSE} {inner}", check=False)
    if why in ("interpreter", "glob", "capability", "file", "network", "exec transition"):
        assert parsed.returncode == 0, parsed.stderr     # valid AppArmor, wrong for us
    os.unlink(root.host(inner))

