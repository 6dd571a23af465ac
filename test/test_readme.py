"""The README as a newcomer meets it: every ```sh block runs verbatim, in order, in one shell,
right after its first command (less the apt-get part, which needs the network and root); and
every subcommand has a help line and a README mention (Datasette's test_docs idea)."""
import argparse
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO, require_backend
from overlord.cli import main as cli

README = os.path.join(REPO, "README.md")
APT = re.compile(r"^sudo=\$\(command -v sudo \|\| true\); \$sudo apt-get update -qq && "
                 r"\$sudo apt-get install [^&\n]*&& ")
NOT_RUN = {"python3 -m pytest": "the test suite itself"}


def readme():
    with open(README, encoding="utf-8") as f:
        return f.read()


def sh_blocks(text):
    return re.findall(r"^```sh\n(.*?)^```$", text, re.S | re.M)


def checkout_copy(dest):
    """The working tree as it is (uncommitted work too), without what a run leaves behind."""
    shutil.copytree(REPO, dest, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "build", ".pytest_cache", ".benchmarks",
        "demo", "app", "demo.json"))


def test_readme_has_the_blocks_this_test_runs():
    blocks = sh_blocks(readme())
    assert len(blocks) >= 3
    assert APT.match(blocks[0]), blocks[0]
    assert blocks[0].count("\n") == 1, "the first command is one line"
    assert [b.strip() for b in blocks if b.strip() in NOT_RUN] == ["python3 -m pytest"]


def test_readme_commands_run_verbatim(tmp_path):
    """The install line (after apt-get) and then every other block, as a person pastes them
    into one shell, from a copy of this checkout (the install puts `overlord` on PATH)."""
    require_backend("kernel")           # the demo's agent runs jailed, and the jail needs it
    blocks = sh_blocks(readme())
    first = APT.sub("", blocks[0], count=1)
    rest = [b for b in blocks[1:] if b.strip() not in NOT_RUN]
    repo = tmp_path / "repo"
    checkout_copy(repo)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OVERLORD_TEST_BACKEND")}
    env["OVERLORD_HOME"] = str(home)
    script = "set -euo pipefail\n" + first + "".join(rest)
    proc = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True,
                          timeout=900)
    out, err = proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, (proc.returncode, out[-3000:], err[-3000:])

    # the install line: a run, its diff, its commit
    assert (repo / ".venv" / "bin" / "overlord").exists()
    assert (repo / "demo" / "hello.txt").read_text() == "hello\nworld\n"
    assert (repo / "demo" / "new.txt").read_text() == "new\n"
    committed = re.findall(r"^committed (\d{8}-\d{6}-[0-9a-f]{6}): (.*)$", out, re.M)
    assert len(committed) == 4, out          # the install line, the agent demo, memory, git
    (first_sid, first_summary), (agent_sid, _) = committed[:2]
    assert first_summary.startswith("2 changes"), out
    # memory: the project note committed, your note accepted, the journal line
    assert "docs live in docs/" in (repo / "memory-demo" / "OVERLORD.md").read_text()
    assert "prefers British spelling" in (home / "memory.md").read_text()
    assert re.search(r"record what you learned", out) and "OVERLORD.md" in out
    # git: the session's commit and branch landed, and fsck passed (set -e)
    assert re.search(r"^git: .*new branch feature", out, re.M), out[-3000:]
    assert re.search(r"^[0-9a-f]{7,} second$", out, re.M), out[-3000:]
    # the scripted demo: agent -> diff -> savepoints -> transcript -> commit --drop -> blame
    assert re.search(r"^added\s+Makefile$", out, re.M) and re.search(r"^modified\s+greet\.py$", out, re.M)
    assert (repo / "app" / "greet.py").read_text() == 'def greet():\n    return "hello"\n'
    assert (repo / "app" / "Makefile").exists()
    assert not (repo / "app" / "__pycache__").exists()      # the shell tool's layer was dropped
    blame = [ln for ln in out.splitlines() if "return" in ln]
    assert blame and agent_sid in blame[-1] and "edit_file" in blame[-1], out[-2000:]
    assert "Traceback" not in err and "internal error" not in err, err


def subcommands():
    """{name: (parser, help line)} of every subcommand."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    return {name: (p, helps.get(name)) for name, p in sub.choices.items()}


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_subcommand_has_a_help_line_and_a_readme_mention(name):
    parser, help = subcommands()[name]
    assert help and help.strip() and "\n" not in help, f"`overlord {name}` has no help line"
    assert parser.description, f"`overlord {name} --help` has no description"
    assert re.search(rf"\boverlord {re.escape(name)}\b", readme()), \
        f"README.md does not mention `overlord {name}`"
