"""What the memory suites share: the agent CLI on either backend, and readers of what a session
was told. The kernel backend runs the agent jailed (its default); the fuse backend cannot jail,
so there it runs with --no-jail --net host (inside the transaction all the same)."""
import hashlib
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))

from agentlib import AgentOvl, call, of_type, read_jsonl, require, results, tree, write_script  # noqa: E402,F401
from conftest import backend_params  # noqa: E402

FLAGS = {"kernel": (), "fuse": ("--no-jail", "--net", "host")}


class MemOvl(AgentOvl):
    def scripted(self, target, tmp_path, turns, *flags, task="do the task", **kw):
        return super().scripted(target, tmp_path, turns, *FLAGS[self.backend], *flags,
                                task=task, **kw)

    def system(self, sid):
        return of_type(self.events(sid), "system")[0]

    def memory_md(self):
        path = self.home / "memory.md"
        return path.read_bytes() if path.exists() else None

    def audit(self, action):
        return json.loads(self("audit", "show", "--json", "--action", action, check=0).out)


@pytest.fixture(params=backend_params())
def aovl(request, home):
    """The agent CLI on each backend (an unavailable one skips; fails on CI)."""
    require(request.param)
    return MemOvl(home, request.param)


@pytest.fixture
def kmem(home):
    """Where one backend is enough (nothing of the engine differs): the kernel's."""
    require("kernel")
    return MemOvl(home, "kernel")


def sha(data):
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def done(text="done."):
    return {"text": text}
