"""Protected paths: the glob semantics docs/GATE.md promises, the directory that is deleted or
replaced with protected paths inside, and OVERLORD's own checkout."""
import os

import pytest

from conftest import REPO
from overlord.trust import protect as P
from overlord.txn import changes as C
from overlord.txn import layers as L


@pytest.mark.parametrize("glob,yes,no", [
    ("*.pem", ["k.pem", ".pem", "k.pem/inside"], ["d/k.pem", "k.pemx", ""]),
    ("**/*.pem", ["k.pem", "a/k.pem", "a/b/c/k.pem"], ["a/k.pemx", "k.pem.txt"]),
    ("deploy", ["deploy", "deploy/x", "deploy/a/b"], ["deployx", "x/deploy", "deplo"]),
    ("deploy/", ["deploy", "deploy/x/y"], ["deployed"]),
    ("deploy/**", ["deploy", "deploy/x/y"], ["deployed", "a/deploy"]),
    ("a/**/b", ["a/b", "a/x/b", "a/x/y/b", "a/x/b/c"], ["ab", "a/bb", "b", "a/x/bb"]),
    ("a/*/c", ["a/b/c", "a/.b/c"], ["a/c", "a/b/b/c"]),
    ("a/*", ["a/b", "a/b/c"], ["a", "ab"]),
    ("*", ["a", "a/b", ".git"], [""]),
    ("**", ["", "a", "a/b/c"], []),
    ("/", ["", "x/y"], []),
    (".", ["", "x"], []),
    ("./etc//passwd", ["etc/passwd"], ["etc", "etc/passwd2"]),
    ("**/**/x", ["x", "a/x", "a/b/x"], ["a/xx"]),
    ("[a-c]?.txt", ["b1.txt", "cz.txt"], ["d1.txt", "b/.txt", "b12.txt"]),
    ("[!a]x", ["bx", ".x"], ["ax", "/x"]),
    ("x[", ["x["], ["x", "xa"]),
    ("a**b", ["ab", "axxb"], ["a/b"]),
    ("CI.yml", ["CI.yml"], ["ci.yml"]),
    ("we\nird", ["we\nird"], ["we"]),
    ("bad\udcff*", ["bad\udcffname"], ["badname"]),
    ("", [], ["", "x"]),
])
def test_glob_semantics(glob, yes, no):
    for path in yes:
        assert P.matches(path, [glob]), (glob, path)
    for path in no:
        assert not P.matches(path, [glob]), (glob, path)


def test_protected_is_sorted_and_takes_several_globs(tmp_path):
    paths = ["src/a.py", "deploy/prod.yml", "README", "keys/id.pem", "deploy"]
    assert P.protected(str(tmp_path), paths, ["deploy/**", "**/*.pem"]) == \
        ["deploy", "deploy/prod.yml", "keys/id.pem"]
    assert P.protected(str(tmp_path), paths, []) == []
    assert P.protected(str(tmp_path), [], ["**"]) == []


def test_a_bad_glob_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"protect glob '\[z-a\]'"):
        P.protected(str(tmp_path), ["x"], ["[z-a]"])
    with pytest.raises(ValueError):
        P.check_glob("[z-a]")
    with pytest.raises(TypeError):
        P.check_glob(3)
    P.check_glob("ok/**")


def _change(target, path, kind, entry_kind):
    real = os.lstat(os.path.join(target, path))
    return C.Change(path, kind, L.Entry(path, entry_kind, layer=0), real, {}, None)


def test_deleting_a_directory_with_protected_paths_inside(tmp_path):
    target = tmp_path / "t"
    (target / "conf" / "deep").mkdir(parents=True)
    (target / "conf" / "deep" / "prod.yml").write_text("x")
    (target / "docs").mkdir()
    (target / "docs" / "a.md").write_text("x")
    gone = [_change(str(target), "conf", "deleted", "whiteout"),
            _change(str(target), "docs", "replaced-dir", "dir")]
    assert P.protected(str(target), gone, ["**/*.yml"]) == ["conf"]
    assert P.protected(str(target), gone, ["docs/a.md", "conf/deep/*.yml"]) == ["conf", "docs"]
    assert P.protected(str(target), [c.path for c in gone], ["**/*.yml"]) == []   # bare paths
    swapped = [_change(str(target), "conf", "modified", "file")]      # a file in its place
    assert P.protected(str(target), swapped, ["conf/deep/prod.yml"]) == ["conf"]
    kept = [_change(str(target), "conf", "modified", "dir")]          # chmod: children listed
    assert P.protected(str(target), kept, ["conf/deep/prod.yml"]) == []


def test_own_checkout(tmp_path):
    assert P.own_source(REPO)
    assert P.own_source(REPO + "/")
    assert not P.own_source(str(tmp_path))
    assert P.protected(REPO, ["overlord/ops/decide.py", "overlord", "docs/GATE.md"], []) == \
        ["overlord", "overlord/ops/decide.py"]
    assert P.protected(REPO, ["docs/GATE.md", "README.md"], ["*.md"]) == ["README.md"]   # anchored
    other = tmp_path / "checkout"
    for rel in ("overlord/ops/__init__.py", "overlord/sandbox/jail.py"):
        os.makedirs(other / os.path.dirname(rel), exist_ok=True)
        (other / rel).write_text("")
    assert not P.own_source(str(other))                  # two of the three marks
    assert P.protected(str(other), ["overlord/x.py"], []) == []
    (other / "overlord" / "agent").mkdir()
    (other / "overlord" / "agent" / "loop.py").write_text("")
    assert P.own_source(str(other))                      # another checkout of OVERLORD
    assert P.protected(str(other), ["overlord/x.py", "overlordx"], []) == ["overlord/x.py"]
    link = tmp_path / "via-link"
    os.symlink(REPO, link)
    assert P.own_source(str(link))


def test_agent_uses_the_same_own_source():
    import importlib
    assert importlib.import_module("overlord.ops.agent").own_source is P.own_source
