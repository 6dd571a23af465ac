"""What the skills suites share: the agent CLI on either backend (the kernel's runs the agent
jailed, its default; the fuse backend cannot jail, so there it runs with --no-jail --net host,
inside the transaction all the same), skill folders written for a test, the live policy, and
readers of what a session was offered and loaded. Imported as `from skilllib import ...`."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))

from agentlib import AgentOvl, call, of_type, read_jsonl, require, results, tree  # noqa: E402,F401
from conftest import Ovl, backend_params  # noqa: E402,F401

FLAGS = {"kernel": (), "fuse": ("--no-jail", "--net", "host")}


class SkillOvl(AgentOvl):
    def scripted(self, target, tmp_path, turns, *flags, task="do the task", **kw):
        return super().scripted(target, tmp_path, turns, *FLAGS[self.backend], *flags,
                                task=task, **kw)

    def system(self, sid):
        return of_type(self.events(sid), "system")[0]

    def loads(self, sid):
        return of_type(self.events(sid), "skill_load")

    def results(self, sid):
        """The tool results in call order."""
        return of_type(self.events(sid), "tool_result")

    def set_policy(self, tmp_path, data):
        path = tmp_path / f"policy-{len(list(tmp_path.glob('policy-*.json')))}.json"
        path.write_text(json.dumps(data))
        self("policy", "set", path, check=0)

    def acts(self, action):
        return [json.loads(line) for line in (self.home / "audit.jsonl").read_text().splitlines()
                if json.loads(line)["action"] == action] if (self.home / "audit.jsonl").exists() else []


@pytest.fixture(params=backend_params())
def aovl(request, home):
    """The agent CLI on each backend (an unavailable one skips; fails on CI)."""
    require(request.param)
    return SkillOvl(home, request.param)


@pytest.fixture
def sovl(home):
    """The CLI where no session opens (list, show, add, new, rm): no backend needed."""
    return SkillOvl(home)


def skill_md(name, description, body="", when=None, extra=""):
    head = f"---\nname: {name}\ndescription: {description}\n"
    if when:
        head += f"when: {when}\n"
    return head + extra + "---\n" + body


def make_skill(where, name, description="does things", body="", when=None, files=None,
               folder=None, text=None):
    """where/<folder or name>/SKILL.md (+ files {rel: text}); returns the folder."""
    d = where / (folder or name)
    d.mkdir(parents=True, exist_ok=True)
    (d / "SKILL.md").write_text(text if text is not None else skill_md(name, description, body, when))
    for rel, content in (files or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(content)
    return d


def machine(home, name, **kw):
    """A machine skill written straight into OVERLORD_HOME/skills (as `skills add` leaves it)."""
    return make_skill(home / "skills", name, **kw)


def project(target, name, **kw):
    return make_skill(target / ".overlord" / "skills", name, **kw)


def snapshot(home):
    """What `skills add` / `rm` may change: the machine skills and the audit chain."""
    skills = tree(home / "skills") if (home / "skills").exists() else {}
    log = (home / "audit.jsonl").read_bytes() if (home / "audit.jsonl").exists() else b""
    return skills, log


REPO_SKILLS = __import__("pathlib").Path(__file__).resolve().parents[2] / "skills"
