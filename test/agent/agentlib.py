"""What the agent's end-to-end tests share: a kernel-backend CLI runner, scripts for the
scripted provider, and readers for a session's transcript and provenance.

The agent runs jailed by default and the jail needs the kernel backend, so these tests need it:
where it is missing they skip with the reason (and fail with OVERLORD_REQUIRE_BACKENDS=1, as
the engine suites do). Imported by the test modules (`from agentlib import kovl, ...`) rather
than living in a second conftest.py that would compete for the module name `conftest`.
"""
import json

import pytest

from conftest import SESSION_RE, Ovl, require_backend, tree  # noqa: F401 -- tree re-exported
from fakes import KEY

ENV = {"OVERLORD_RETRY_SCALE": "0", "OVERLORD_PROVIDER_RETRIES": "2",
       "ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": KEY, "AZURE_OPENAI_API_KEY": KEY,
       "GEMINI_API_KEY": KEY, "OPENAI_COMPAT_API_KEY": "",
       "http_proxy": "", "https_proxy": "", "HTTP_PROXY": "", "HTTPS_PROXY": "", "no_proxy": "*"}


def require(backend):
    require_backend(backend)


class AgentOvl(Ovl):
    """The CLI on the kernel backend, with fake provider keys and instant retries."""

    def env(self, extra=None):
        return super().env(dict(ENV, **(extra or {})))

    def agent(self, target, task, *flags, check=None, **kw):
        """`overlord agent -t target [flags] task`: (sid, proc)."""
        proc = self("agent", "-t", target, *flags, task, check=check, **kw)
        m = SESSION_RE.search(proc.out)
        return (m.group(1) if m else None), proc

    def scripted(self, target, tmp_path, turns, *flags, task="do the task", **kw):
        script = write_script(tmp_path, turns)
        return self.agent(target, task, "--provider", "scripted", "--script", script, *flags, **kw)

    def events(self, sid):
        return read_jsonl(self.home / "sessions" / sid / "transcript.jsonl")

    def meta(self, sid):
        return json.loads((self.home / "sessions" / sid / "meta.json").read_text())

    def caused_by(self, sid):
        """{path: cause} from `log --json`."""
        data = json.loads(self("log", sid, "--json", check=0).out)
        return {c["path"]: c["caused_by"] for c in data["changes"]}


@pytest.fixture
def kovl(home):
    require("kernel")
    return AgentOvl(home, "kernel")


def write_script(tmp_path, turns, model="scripted-test"):
    path = tmp_path / f"script-{len(list(tmp_path.glob('script-*.json')))}.json"
    path.write_text(json.dumps({"model": model, "turns": turns}))
    return path


def read_jsonl(path):
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def of_type(events, kind):
    return [e for e in events if e["type"] == kind]


def results(events):
    """{call id: tool_result event}"""
    return {e["call"]: e for e in of_type(events, "tool_result")}


def call(name, **args):
    return {"name": name, "input": args}
