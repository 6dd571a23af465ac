"""The content gate: gate.scan() on hand-made plans (every shape, every kind, the caps, the
before side of a modified file) and `overlord run` + `overlord check` end to end on both
backends (each severity from a policy.json, --json, selections, bad input). Every secret here
is made at run time: none is in the source, and none may appear whole in any output."""
import json
import os
import random
import secrets
import string

import pytest

from conftest import tree
from overlord.errors import OverlordError
from overlord.trust import gate
from overlord.txn import changes as C
from overlord.txn import layers as L

ALNUM = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits


def rand(n, alphabet=ALNUM):
    return "".join(secrets.choice(alphabet) for _ in range(n))


def value(n, alphabet=ALNUM):
    """A fresh random value that passes the randomness test (a few in a thousand do not)."""
    while True:
        v = rand(n, alphabet)
        if gate.looks_random(v.encode()):
            return v


def shapes():
    """(label, a fresh secret of that shape)."""
    return [
        ("AWS access key", "AKIA" + rand(16, UPPER)),
        ("AWS access key", "ASIA" + rand(16, UPPER)),
        ("Google API key", "AIza" + rand(35)),
        ("GitHub token", "ghp_" + rand(36)),
        ("GitHub token", "ghs_" + rand(36)),
        ("GitHub token", "github_pat_" + rand(22) + "_" + rand(59)),
        ("Slack token", "xoxb-" + rand(12, string.digits) + "-" + rand(24)),
        ("Stripe live key", "sk_" + "live_" + rand(24)),
        ("Anthropic API key", "sk-" + "ant-api03-" + value(93) + "AA"),
        ("OpenAI API key", "sk-" + value(48)),
        ("OpenAI API key", "sk-" + "proj-" + value(120, ALNUM + "_-")),
        ("JSON web token", "eyJ" + rand(30) + ".eyJ" + rand(60) + "." + rand(43, ALNUM + "_-")),
    ]


def pem(kind="RSA ", block=""):
    body = "\n".join(rand(64, ALNUM + "+/") for _ in range(6))
    return (f"-----BEGIN {kind}PRIVATE KEY{block}-----\n{body}\n"
            f"-----END {kind}PRIVATE KEY{block}-----\n")


class Plan:
    """Hand-made plans: files in a fake layer, Changes over a fake real tree."""

    def __init__(self, root):
        self.layer, self.target = root / "layer", root / "target"
        self.layer.mkdir()
        self.target.mkdir()
        self.changes = []

    def add(self, path, data, kind="added", before=None, same=None):
        src = self.layer / path
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(data.encode() if isinstance(data, str) else data)
        real = None
        if before is not None:
            dst = self.target / path
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(before.encode() if isinstance(before, str) else before)
            real = os.lstat(dst)
            kind = "modified"
        entry = L.Entry(path, "file", str(src), os.lstat(src), layer=0, xattrs={}, forged=[])
        self.changes.append(C.Change(path, kind, entry, real, {}, same))
        return self

    def link(self, path, to, before=None):
        src = self.layer / path
        src.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(to, src)
        real = None
        if before is not None:
            (self.target / path).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(before, self.target / path)
            real = os.lstat(self.target / path)
        entry = L.Entry(path, "symlink", str(src), os.lstat(src), layer=0, xattrs={}, forged=[])
        self.changes.append(C.Change(path, "modified" if real else "added", entry, real, {},
                                     None if real is None else to == before))
        return self

    def dir(self, path):
        src = self.layer / path
        src.mkdir(parents=True)
        entry = L.Entry(path, "dir", str(src), os.lstat(src), layer=0, xattrs={}, forged=[])
        self.changes.append(C.Change(path, "added", entry, None, {}, None))
        return self

    def delete(self, path, before="x\n"):
        (self.target / path).write_text(before)
        self.changes.append(C.Change(path, "deleted", L.Entry(path, "whiteout", layer=0),
                                     os.lstat(self.target / path), {}, None))
        return self

    def scan(self, **checks):
        return gate.scan(str(self.target), self.changes, checks)


@pytest.fixture
def plan(tmp_path):
    return Plan(tmp_path)


def never_whole(findings, *values):
    text = json.dumps([f.as_dict() for f in findings], ensure_ascii=False)
    for v in values:
        assert v not in text
        assert v[:12] not in text or len(v) <= 12, (v[:12], text)


# -- secrets ----------------------------------------------------------------------------------

def test_every_key_shape_is_found_named_and_never_shown(plan):
    made = shapes()
    lines = ["import os", ""] + [f"v{i} = '{value}'" for i, (_, value) in enumerate(made)]
    plan.add("keys.py", "\n".join(lines) + "\n")
    found = plan.scan()
    assert [(f.kind, f.line, f.severity) for f in found] == \
        [("secrets", 3 + i, "countersign") for i in range(len(made))]
    for f, (label, value) in zip(found, made):
        assert f.what.startswith(label + " ") and f"({len(value)} chars)" in f.what, f.what
        assert f.path == "keys.py"
    never_whole(found, *[v for _, v in made])


@pytest.mark.parametrize("kind,block,label", [
    ("RSA ", "", "private key (RSA)"), ("EC ", "", "private key (EC)"),
    ("DSA ", "", "private key (DSA)"), ("OPENSSH ", "", "private key (OPENSSH)"),
    ("", "", "private key"), ("ENCRYPTED ", "", "private key (ENCRYPTED)"),
    ("PGP ", " BLOCK", "private key block (PGP)")])
def test_private_key_blocks(plan, kind, block, label):
    key = pem(kind, block)
    plan.add("id", "# deploy key\n" + key)
    found = plan.scan()
    assert [(f.kind, f.line, f.what) for f in found] == [("secrets", 2, label)]
    never_whole(found, key, key.splitlines()[1])


def test_a_private_key_header_alone_is_prose(plan):
    plan.add("doc.md", "A key file starts with -----BEGIN RSA PRIVATE KEY----- and ends "
             "with its END line.\n")
    assert plan.scan() == []


@pytest.mark.parametrize("template", [
    'API_KEY = "{v}"', "api_key='{v}'", '"apiKey": "{v}",', "password: {v}",
    "export GITHUB_SECRET={v}", "DB_PASS => '{v}'", "client_secret := \"{v}\"",
    "[auth]\ntoken = {v}", "aws_secret_access_key={v}", "Credentials: {v}"])
def test_high_entropy_assignments(plan, template):
    v = value(40, ALNUM + "+/")
    text = "x = 1\n" + template.format(v=v) + "\n"
    plan.add("settings.cfg", text)
    found = plan.scan()
    assert len(found) == 1 and found[0].kind == "secrets", found
    assert found[0].line == text[:text.index(v)].count("\n") + 1
    assert "high-entropy value (40 chars) assigned to " in found[0].what
    never_whole(found, v)


def test_hex_secrets_use_their_own_threshold(plan):
    value = secrets.token_hex(20)
    plan.add("a.env", f"SESSION_TOKEN={value}\n")
    assert [f.what for f in plan.scan()] == ["high-entropy value (40 chars) assigned to SESSION_TOKEN"]


@pytest.mark.parametrize("line", [
    'SECRET_KEY = os.environ["SECRET_KEY"]',
    "token = get_token_from_environment_variable()",
    'password = "correct horse battery staple"',
    'KEY_PATH = "/etc/ssl/private/server-key.pem"',
    'secret = "${DB_PASSWORD_FROM_THE_ENVIRONMENT}"',
    'cache_key = "user-profile-settings-cache"',
    'password = "change_me_in_production_please"',
    "api_key = settings.AWS_SECRET_ACCESS_KEY_ID",
    "primary_key=models.AutoField(primary_key=True)",
    'token = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"',
    "the task-management-service-long-name-here",
    "pip install sk-learn-something-and-more-words",
    "name = " + rand(40),                  # random, but not assigned to a secret-like name
    'call(tokens_field="max_completion_tokens")',
    "        registry_key = cls.REGISTRY_KEY_DEBUG",
    "_hkey=winreg.HKEY_PERFORMANCE_DATA,",
    "global___TryGetKeyValueResponse = TryGetKeyValueResponse",
    '"aws:TagKeys":"AmazonFSx.FileSystemId"',
    'key = "MaximumBatchingWindowInSeconds"',
    '"""Provider keys: OVERLORD_HOME/keys.json (mode 0600), with environment variables"""',
])
def test_ordinary_code_is_not_a_secret(plan, line):
    plan.add("app.py", line + "\n")
    assert plan.scan() == []


def test_entropy_threshold_is_what_the_doc_says():
    assert gate.entropy_threshold(b"0123456789abcdef0123") == 3.0
    assert gate.entropy_threshold(b"x" * 20) == pytest.approx(0.84 * 4.321928, abs=1e-4)
    assert gate.entropy_threshold(b"x" * 500) == 4.4
    assert gate.entropy(b"abab") == 1.0
    rnd = random.Random(7)
    for n, least in ((20, 970), (32, 980), (40, 985), (64, 1000)):     # the doc: 98.5% at 20
        hits = sum(gate.looks_random("".join(rnd.choice(ALNUM + "+/") for _ in range(n)).encode())
                   for _ in range(1000))
        assert hits >= least, (n, hits)


def test_an_existing_secret_in_a_modified_file_is_not_blamed(plan):
    old_key, new_key, old_assign = "AKIA" + rand(16, UPPER), "AKIA" + rand(16, UPPER), value(40)
    before = f"aws = '{old_key}'\nSECRET = '{old_assign}'\nx = 1\n"
    plan.add("config.py", before + "y = 2\n", before=before)             # secrets untouched
    plan.add("other.py", before.replace("x = 1", "x = 3") + f"new = '{new_key}'\n",
             before=before)
    found = plan.scan()
    assert [(f.path, f.line) for f in found] == [("other.py", 4)]
    assert "AKIA…(20 chars)" in found[0].what
    never_whole(found, old_key, new_key, old_assign)


def test_the_same_secret_in_a_new_file_is_blamed(plan):
    key = "AKIA" + rand(16, UPPER)
    plan.add("config.py", f"k = '{key}'\n", before=f"k = '{key}'\n# old\n")
    plan.add("copy.py", f"k = '{key}'\n")
    assert [f.path for f in plan.scan()] == ["copy.py"]


def test_a_metadata_only_change_adds_nothing(plan):
    key = "AKIA" + rand(16, UPPER)
    plan.add("package.json", f'{{"k": "{key}"}}\n', before=f'{{"k": "{key}"}}\n', same=True)
    assert plan.scan() == []


def test_symlinks_are_never_followed(plan, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text(f"k = '{'AKIA' + rand(16, UPPER)}'\n")
    plan.link("link.py", str(outside))
    assert plan.scan() == []


def test_a_long_file_is_scanned_whole_in_overlapping_chunks(plan, monkeypatch):
    monkeypatch.setattr(gate, "SECRETS_CHUNK_MIB", 1)
    line = "# " + "x" * 77 + "\n"                                 # 80 bytes
    per_chunk = (gate.MIB - gate.SECRETS_OVERLAP) // len(line)   # lines a chunk moves on by
    handoff = (gate.MIB - gate.CONTEXT) // len(line)            # the first chunk's last line
    at = [1, handoff, handoff + 1,                               # each side of the handoff,
          gate.MIB // len(line) + 1,                             # across the first chunk's end,
          3 * per_chunk + 7]                                     # in the fourth chunk
    keys = ["AKIA" + rand(16, UPPER) for _ in at]
    lines = [line] * (3 * per_chunk + 40)
    for n, key in zip(at, keys):
        lines[n - 1] = f"k = '{key}'" + "x" * (len(line) - 28) + "\n"
    data = "".join(lines)
    assert data.index(keys[3]) < gate.MIB < data.index(keys[3]) + 20
    plan.add("big.py", data)
    found = plan.scan()
    assert [(f.path, f.line, f.severity) for f in found] == [("big.py", n, "countersign") for n in at]
    never_whole(found, *keys)


@pytest.mark.parametrize("level", ["block", "countersign", "warn"])
def test_the_unscanned_rest_of_a_file_over_the_cap_carries_the_secrets_severity(
        plan, monkeypatch, level):
    monkeypatch.setattr(gate, "SECRETS_CHUNK_MIB", 1)
    monkeypatch.setattr(gate, "SECRETS_SCAN_MIB", 2)
    key = "AKIA" + rand(16, UPPER)
    pad = ("# " + "x" * 77 + "\n") * 14000                      # ~1.07 MiB
    plan.add("big.py", pad + f"a = '{key}'\n" + pad + pad)
    plan.add("small.py", pad)
    found = plan.scan(secrets=level)
    assert [(f.path, f.line, f.severity) for f in found] == \
        [("big.py", 14001, level), ("big.py", None, level)]
    assert "past its first 2.0 MiB" in found[1].what and "3.2 MiB" in found[1].what
    assert plan.scan(secrets="off") == []
    never_whole(found, key)


def test_a_secret_deep_in_a_long_modified_file_is_blamed_only_if_new(plan, monkeypatch):
    monkeypatch.setattr(gate, "SECRETS_CHUNK_MIB", 1)
    old, new = "AKIA" + rand(16, UPPER), "AKIA" + rand(16, UPPER)
    pad = ("# " + "x" * 77 + "\n") * 20000                      # ~1.5 MiB
    plan.add("big.py", pad + f"a = '{old}'\nb = '{new}'\n", before=pad + f"a = '{old}'\n")
    assert [(f.line, f.what) for f in plan.scan()] == [(20002, "AWS access key AKIA…(20 chars)")]


def test_a_secret_in_a_symlinks_target_is_found(plan, tmp_path):
    key, old = "AKIA" + rand(16, UPPER), "ghp_" + rand(36)
    plan.link("a", key)
    plan.link("d/b", f"../keys/{old}.txt", before=f"../keys/{old}.txt")   # unchanged
    plan.link("c", f"{old}/x", before=f"{old}/y")                 # the real link held it
    plan.link("e", str(tmp_path / "outside.py"))
    found = plan.scan(secrets="block")
    assert [(f.kind, f.path, f.line, f.what, f.severity) for f in found] == \
        [("secrets", "a", None, "AWS access key AKIA…(20 chars) in the symlink's target", "block")]
    never_whole(found, key)


def test_a_secret_in_an_added_name_is_found_and_the_name_masked(plan):
    key = "AKIA" + rand(16, UPPER)
    plan.dir(f"conf/{key}")
    plan.add(f"conf/{key}/package.json", "{}\n")
    plan.add("a_rather_long_but_ordinary_name.py", "x = 1\n")
    found = plan.scan()
    masked = "conf/AKIA…(20 chars, masked)"
    assert [(f.kind, f.path, f.what, f.severity) for f in found] == [
        ("secrets", masked, "AWS access key AKIA…(20 chars) in its name", "countersign"),
        ("dependencies", masked + "/package.json", "dependency manifest added", "warn")]
    never_whole(found, key)
    assert plan.scan(secrets="off")[0].kind == "dependencies"


# -- masking ------------------------------------------------------------------------------------

def test_mask_replaces_every_secret_with_its_short_form(plan):
    made = [v for _, v in shapes()]
    text = "".join(f"v{i} = '{v}'\n" for i, v in enumerate(made))
    key = pem()
    text += "API_TOKEN = '" + value(40) + "'\nbefore()\n" + key + "after()\n"
    out = gate.redact(text)
    for v in made:
        assert v[:12] not in out
    for line in key.splitlines()[1:-1]:
        assert line not in out
    assert out.count("masked)") == len(made) + 2
    assert "v0 = 'AKIA…(20 chars, masked)'\n" in out and "API_TOKEN = '…(40 chars, masked)'" in out
    assert f"before()\n-----BEGIN RSA PRIVATE KEY-----…({len(key) - 1} chars, masked)\nafter()\n" in out
    assert gate.redact(out) == out and gate.redact(out.encode()) == out.encode()
    assert gate.redact("nothing here = 1\n") == "nothing here = 1\n"


def test_a_masked_private_key_hides_its_body_and_nothing_after(plan):
    key = pem()
    diff = "".join(f"+{line}\n" for line in ("x = 1\n" + key + "run()\nA" + "b" * 40).splitlines())
    out = gate.redact(diff)
    assert out.startswith("+x = 1\n+-----BEGIN RSA PRIVATE KEY-----…(")
    assert out.endswith(" chars, masked)\n+run()\n+A" + "b" * 40 + "\n")
    cut = key.rsplit("-----END", 1)[0] + "code_after_a_key_with_no_end()\n"
    out = gate.redact(cut)
    assert out.endswith("masked)\ncode_after_a_key_with_no_end()\n")
    assert all(line not in out for line in cut.splitlines()[1:-1])


def test_mask_widens_a_window_to_whole_secrets():
    key = "AKIA" + rand(16, UPPER)
    data = b"a = 1\nk = '" + key.encode() + b"'\nz = 2\n"
    at = data.index(key.encode())
    for lo, hi in ((0, at + 3), (at + 5, len(data)), (at + 2, at + 9)):
        out, lo2, hi2 = gate.mask(data, lo, hi)
        assert key.encode()[:5] not in out[4:] and b"AKIA\xe2\x80\xa6(20 chars, masked)" in out
        assert lo2 == min(lo, at) and hi2 == max(hi, at + 20)
    assert gate.mask(data, 0, 5) == (data[:5], 0, 5)


# -- binaries, dependencies, size ---------------------------------------------------------------

def test_binaries(plan):
    plan.add("a.bin", b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    rnd = random.Random(1)
    plan.add("b.dat", bytes(rnd.randrange(1, 256) for _ in range(4096)))
    plan.add("latin1.txt", "caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 50)
    plan.add("utf8.txt", ("é" * 4095 + "x").encode())        # a character cut at 8 KiB
    plan.add("late-nul.txt", b"a" * 9000 + b"\0")
    found = plan.scan()
    assert [(f.kind, f.path, f.line, f.severity) for f in found] == [
        ("binaries", "a.bin", None, "warn"), ("binaries", "b.dat", None, "warn")]
    assert "NUL byte" in found[0].what and "not UTF-8" in found[1].what


def test_a_secret_in_a_binary_file_has_no_line(plan):
    key = "AKIA" + rand(16, UPPER)
    plan.add("blob", b"\0\1\2\n\n" + key.encode() + b"\0")
    assert [(f.kind, f.line) for f in plan.scan()] == [("binaries", None), ("secrets", None)]


@pytest.mark.parametrize("path", [
    "package.json", "web/package-lock.json", "yarn.lock", "pnpm-lock.yaml", "requirements.txt",
    "requirements-dev.txt", "requirements/base.txt", "constraints.txt", "Pipfile",
    "Pipfile.lock", "poetry.lock", "pyproject.toml", "setup.py", "setup.cfg", "Cargo.toml",
    "Cargo.lock", "go.mod", "go.sum", "Gemfile", "Gemfile.lock", "x.gemspec", "composer.json",
    "pom.xml", "build.gradle", "build.gradle.kts", "app/App.csproj", "uv.lock"])
def test_dependency_manifests(plan, path):
    plan.add(path, "x\n")
    assert [(f.kind, f.path, f.what, f.severity) for f in plan.scan()] == \
        [("dependencies", path, "dependency manifest added", "warn")]


def test_dependency_changes_of_every_kind_and_not_others(plan):
    plan.add("go.mod", "module b\n", before="module a\n")
    plan.delete("package.json")
    plan.add("setup.py", "x\n", before="x\n", same=True)               # a chmod
    plan.add("notes/requirements.md", "x\n")
    plan.add("package.json.bak", "x\n")
    assert [(f.path, f.what) for f in plan.scan()] == [
        ("go.mod", "dependency manifest modified"), ("package.json", "dependency manifest deleted")]


def test_size(plan):
    plan.add("big.log", b"x" * (3 * 1024 * 1024 // 2))
    plan.add("small.log", b"x" * 1000)
    assert plan.scan() == []                                              # default 50 MiB
    found = plan.scan(size_mb=1)
    assert [(f.kind, f.path, f.line, f.severity) for f in found] == [("size", "big.log", None, "warn")]
    assert found[0].what == "1.5 MiB (over 1 MiB)"
    assert plan.scan(size_mb=0.001, binaries="off") != []


# -- severities ---------------------------------------------------------------------------------

def test_each_severity_and_off(plan):
    plan.add("k.py", f"k = '{'ghp_' + rand(36)}'\n")
    plan.add("b.bin", b"\0")
    plan.add("Cargo.toml", "[package]\n")
    sev = lambda **c: sorted((f.kind, f.severity) for f in plan.scan(**c))   # noqa: E731
    assert sev() == [("binaries", "warn"), ("dependencies", "warn"), ("secrets", "countersign")]
    assert sev(secrets="block", binaries="countersign", dependencies="block") == \
        [("binaries", "countersign"), ("dependencies", "block"), ("secrets", "block")]
    assert sev(secrets="warn", binaries="off", dependencies="off") == [("secrets", "warn")]
    assert sev(secrets="off", binaries="off", dependencies="off") == []
    blocking, countersign, warnings = gate.partition(plan.scan(binaries="block"))
    assert [f.kind for f in blocking] == ["binaries"]
    assert [f.kind for f in countersign] == ["secrets"] and [f.kind for f in warnings] == ["dependencies"]


def test_a_bad_level_is_refused_naming_it(plan):
    with pytest.raises(OverlordError, match="checks.secrets: 'loud'"):
        plan.scan(secrets="loud")


# -- end to end: overlord run + overlord check ---------------------------------------------------

def policy(home, checks):
    (home / "policy.json").write_text(json.dumps({"default": {"checks": checks}}))


def check(ovl, sid, *flags, code=0):
    proc = ovl("check", sid, *flags, check=code)
    assert "Traceback" not in proc.err
    return proc


def test_check_reports_each_kind_and_never_echoes_a_secret(ovl, home, target, tmp_path):
    old_key, new_key, assigned = "AKIA" + rand(16, UPPER), "ghp_" + rand(36), value(40)
    (target / "config.py").write_text(f"aws = '{old_key}'\nx = 1\n")
    (target / "requirements.txt").write_text("requests==2.0\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.py").write_text(f"aws = '{old_key}'\nx = 2\ngh = '{new_key}'\n")
    (src / "app.env").write_text(f"# app\nAPP_SECRET={assigned}\n")
    (src / "logo.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    policy(home, {"size_mb": 0.001})
    (src / "big.txt").write_text("y" * 2048)
    sid, _ = ovl.sh(target, f"cp {src}/* . && echo 'flask==3' >> requirements.txt")
    proc = check(ovl, sid)
    lines = proc.out.splitlines()
    assert lines[:-1] == [
        "countersign  secrets  app.env:2  high-entropy value (40 chars) assigned to APP_SECRET",
        "warn  size  big.txt  2.0 KiB (over 0.001 MiB)",
        "countersign  secrets  config.py:3  GitHub token ghp_…(40 chars)",
        "warn  binaries  logo.bin  binary content (a NUL byte in its first 8 KiB)",
        "warn  dependencies  requirements.txt  dependency manifest modified",
    ], proc.out
    assert lines[-1] == (f"check {sid}: 5 findings: 2 need a fresh, complete second-model "
                         "approval, 3 warnings")
    js = check(ovl, sid, "--json")
    data = json.loads(js.out)
    assert data["sid"] == sid and data["blocks"] is False
    assert data["counts"] == {"block": 0, "countersign": 2, "warn": 3}
    assert data["checks"] == {"secrets": "countersign", "binaries": "warn",
                              "dependencies": "warn", "git_exec": "countersign", "size_mb": 0.001}
    assert data["sources"]["size_mb"] == "default" and data["sources"]["secrets"] == "built-in"
    assert {(f["kind"], f["path"], f["line"]) for f in data["findings"]} == {
        ("secrets", "app.env", 2), ("size", "big.txt", None), ("secrets", "config.py", 3),
        ("binaries", "logo.bin", None), ("dependencies", "requirements.txt", None)}
    for out in (proc.out + proc.err, js.out + js.err):
        for shown in (old_key, new_key, assigned, new_key[4:], assigned[:12]):
            assert shown not in out
    assert (target / "config.py").read_text() == f"aws = '{old_key}'\nx = 1\n"


@pytest.mark.parametrize("level,code", [("block", 1), ("countersign", 0), ("warn", 0), ("off", 0)])
def test_each_severity_from_policy(ovl, home, target, level, code):
    policy(home, {"secrets": level})
    key = "sk-" + "ant-api03-" + value(93) + "AA"
    (target / "k.txt").write_text(key + "\n")      # in the tree, not added by the session
    sid, _ = ovl.sh(target, "cp k.txt added.txt")
    proc = check(ovl, sid, code=code)
    data = json.loads(check(ovl, sid, "--json", code=code).out)
    assert key not in proc.out + proc.err
    if level == "off":
        assert data["findings"] == [] and proc.out == f"check {sid}: no findings\n"
        return
    assert [(f["path"], f["line"], f["severity"]) for f in data["findings"]] == \
        [("added.txt", 1, level)]
    assert proc.out.startswith(f"{level}  secrets  added.txt:1  Anthropic API key sk-ant-…(")
    assert data["blocks"] is (level == "block") and data["sources"]["secrets"] == "default"
    if level == "block":
        assert proc.out.splitlines()[-1] == f"check {sid}: 1 finding: 1 blocks the commit"


def test_selection_escaping_and_bad_input(ovl, home, target):
    sid, _ = ovl.sh(target, "printf '\\0' > 'x\033[31m.bin'")
    ovl("exec", sid, "--", "sh", "-c", "echo 'left-pad==1' > requirements.txt", check=0)
    proc = check(ovl, sid)
    assert "warn  binaries  x\\x1b[31m.bin  binary content" in proc.out and "\033" not in proc.out
    assert "requirements.txt" in proc.out
    only = check(ovl, sid, "--only", "layer:1")
    assert "requirements.txt" in only.out and ".bin" not in only.out
    dropped = check(ovl, sid, "--drop", "layer:1", "--json")
    assert [f["kind"] for f in json.loads(dropped.out)["findings"]] == ["binaries"]
    for args, code in ((("20200101-000000-abcdef",), 1), ((sid, "--only", "nope"), 2),
                       ((sid, "--only", "layer:7"), 2), (("not-a-sid",), (1, 2))):
        bad = ovl("check", *args)
        assert bad.returncode in ((code,) if isinstance(code, int) else code), bad
        assert bad.err.startswith("overlord: ") and bad.err.count("\n") == 1 and not bad.out
    (home / "policy.json").write_text("{not json")
    before = tree(target)
    bad = ovl("check", sid)
    assert bad.returncode == 1 and bad.err.startswith("overlord: policy ") and not bad.out
    (home / "policy.json").unlink()
    ovl("rollback", sid, check=0)
    bad = ovl("check", sid)
    assert bad.returncode == 1 and "rolled-back" in bad.err and bad.err.count("\n") == 1
    assert tree(target) == before


def test_check_matches_what_commit_enforces(ovl, home, target):
    policy(home, {"dependencies": "block"})
    sid, _ = ovl.sh(target, "echo '{}' > package.json")
    check(ovl, sid, code=1)
    proc = ovl("commit", sid, check=1)
    assert "content gate blocks dependencies in package.json" in proc.err
    assert not (target / "package.json").exists()
    policy(home, {"dependencies": "warn"})
    check(ovl, sid, code=0)
    proc = ovl("commit", sid, check=0)
    assert "overlord: note: warn  dependencies  package.json" in proc.err
    assert (target / "package.json").read_text() == "{}\n"


def test_a_file_the_command_made_unreadable_is_still_scanned(ovl, target, tmp_path):
    key = "ghp_" + rand(36)
    (tmp_path / "k").write_text(f"token: {key}\n")
    sid, _ = ovl.sh(target, f"cp {tmp_path}/k hidden && chmod 000 hidden")
    proc = check(ovl, sid)
    assert proc.out.startswith("countersign  secrets  hidden:1  GitHub token ghp_…(40 chars)")
    assert key not in proc.out
