"""Faces go through ops: no module of the CLI, the web face, the daemon or the MCP server
imports anything below the service layer (issue 12, item 7).

Every .py under the face packages is walked with `ast` -- every import statement, at module
level or inside a function, relative ones resolved; `__import__` / `importlib.import_module`
with a literal name; and any string constant that names a module below the line (a table of
names handed to a dynamic import) -- and each face module is also imported for real, so a
module the walk reads but Python cannot import (or the reverse) does not go unnoticed.
"""
import ast
import importlib
import os
import pkgutil

import pytest

import overlord

ROOT = os.path.dirname(os.path.abspath(overlord.__file__))
FACES = ("cli", "web", "daemon", "mcp")
# what a face may import from overlord: the service layer, the shared leaf modules, the faces
ALLOWED = {"ops", "errors", "text", *FACES}
# everything else directly under overlord/ is below the line, whatever is added there later
FORBIDDEN = sorted(f"overlord.{m.name}" for m in pkgutil.iter_modules([ROOT])
                   if m.name not in ALLOWED)
NAMED = ("overlord.txn", "overlord.sandbox", "overlord.linux", "overlord.agent", "overlord.trust")
DYNAMIC = {"__import__", "import_module"}


def forbidden(name):
    """The forbidden package `name` is or lies in, else None."""
    for bad in FORBIDDEN:
        if name == bad or name.startswith(bad + "."):
            return bad
    return None


def resolve(module, level, package):
    """The absolute name of `from <level dots><module> import ...` written in `package`."""
    if not level:
        return module or ""
    parts = package.split(".")
    if level > len(parts):
        return module or ""             # beyond the top: Python refuses it; nothing to name
    base = ".".join(parts[:len(parts) - level + 1])
    return f"{base}.{module}" if module else base


def imported_names(tree, package):
    """(line, absolute module name, how) for every import the source makes or names."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "import") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node.module, node.level, package)
            out.append((node.lineno, base, "from-import"))
            # `from overlord import txn` imports overlord.txn; `from overlord.ops import x` is fine
            out += [(node.lineno, f"{base}.{a.name}", "from-import") for a in node.names
                    if a.name != "*"]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            if name in DYNAMIC and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                target = node.args[0].value
                if target.startswith("."):          # import_module(".x", package)
                    anchor = package
                    if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                        anchor = node.args[1].value
                    dots = len(target) - len(target.lstrip("."))
                    target = resolve(target[dots:], dots, anchor)
                out.append((node.lineno, target, f"{name}()"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith("overlord.") and \
                all(p.isidentifier() for p in node.value.split(".")):
            out.append((node.lineno, node.value, "module name in a string"))
    return out


def violations(source, filename, package):
    tree = ast.parse(source, filename)
    found = {}
    for line, name, how in imported_names(tree, package):
        bad = forbidden(name)
        if bad:
            found.setdefault((line, bad), f"{filename}:{line}: {how} of {name} ({bad} is below "
                                          "the service layer: reach it through overlord.ops)")
    return [found[k] for k in sorted(found)]


def face_files():
    """(path relative to the repository, module name) of every .py under the face packages."""
    out = []
    for face in FACES:
        top = os.path.join(ROOT, face)
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    rel = os.path.relpath(path, os.path.dirname(ROOT))
                    parts = rel[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts.pop()
                    out.append((rel, ".".join(parts)))
    return out


def package_of(module, rel):
    return module if rel.endswith("__init__.py") else module.rpartition(".")[0]


def test_the_line_is_where_the_brief_draws_it():
    assert set(NAMED) <= set(FORBIDDEN)
    assert not {f"overlord.{a}" for a in ALLOWED} & set(FORBIDDEN)
    for face in FACES:
        assert os.path.isfile(os.path.join(ROOT, face, "__init__.py")), face


def test_no_face_module_imports_below_the_service_layer():
    files = face_files()
    assert len(files) >= 20, files          # the walk found the faces
    found = []
    for rel, module in files:
        with open(os.path.join(os.path.dirname(ROOT), rel), encoding="utf-8") as f:
            found += violations(f.read(), rel, package_of(module, rel))
    assert not found, "\n".join(found)


def test_a_face_does_not_reach_into_another_face():
    """web, daemon and mcp share what they share through ops (the launch token and its guard:
    ops.access); only the CLI, which starts every face, imports the others."""
    found = []
    for rel, module in face_files():
        face = module.split(".")[1]
        if face == "cli":
            continue
        with open(os.path.join(os.path.dirname(ROOT), rel), encoding="utf-8") as f:
            tree = ast.parse(f.read(), rel)
        for line, name, how in imported_names(tree, package_of(module, rel)):
            other = name.split(".")[1] if name.startswith("overlord.") and "." in name else None
            if other in FACES and other != face:
                found.append(f"{rel}:{line}: {how} of {name} (another face)")
    assert not found, "\n".join(found)


def test_every_face_module_imports_and_the_walk_sees_them_all():
    walked = {module for _, module in face_files()}
    seen = set()
    for face in FACES:
        package = importlib.import_module(f"overlord.{face}")
        seen.add(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            seen.add(info.name)
    assert seen == walked, (sorted(seen - walked), sorted(walked - seen))
    for module in sorted(walked):
        importlib.import_module(module)      # a module that fails to import fails here


PLANTS = [
    "import overlord.txn.store as s",
    "import os, overlord.sandbox",
    "from overlord import txn",
    "from overlord import errors, linux",
    "from overlord.sandbox import x",
    "from overlord.agent.cancel import Cancel",
    "from overlord.trust import policy",
    "from .. import txn",                       # in overlord.web: overlord.txn
    "from ..linux import caps",
    "def f():\n    from overlord.txn import store\n    return store",
    "class C:\n    def m(self):\n        import overlord.linux\n",
    "__import__('overlord.linux')",
    "importlib.import_module('overlord.txn.store')",
    "import_module('overlord.sandbox')",
    "importlib.import_module('..txn', 'overlord.web')",
    "MODULES = {'x': 'overlord.trust.gate'}\nimportlib.import_module(MODULES['x'])",
]


@pytest.mark.parametrize("source", PLANTS)
def test_a_planted_import_below_the_line_is_named_with_its_line(source):
    source = "import os\n\n" + source + "\n"
    found = violations(source, "overlord/web/planted.py", "overlord.web")
    assert found, source
    line = next(n for n, text in enumerate(source.splitlines(), 1)
                if "overlord" in text or "txn" in text or "linux" in text)
    assert found[0].startswith(f"overlord/web/planted.py:{line}: "), found


CLEAN = [
    "from overlord import ops, errors, text, __version__",
    "from overlord.ops import launcher\nfrom overlord.ops.cancel import Cancel",
    "import overlord.ops.execute as execute",
    "from . import settings\nfrom .stop import Stop\nfrom ..cli import render",
    "from overlord.web import server",
    "importlib.import_module('overlord.cli.main')",
    '"""Reaches overlord.txn only through ops."""',
    "import overlord_client\nimport txn",
]


@pytest.mark.parametrize("source", CLEAN)
def test_what_a_face_may_import_passes(source):
    assert violations(source, "overlord/web/clean.py", "overlord.web") == []
