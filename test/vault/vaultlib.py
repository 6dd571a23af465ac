"""What the vault tests share: a real resolver script (a small Python program the test writes,
run by OVERLORD as any resolver would be), the secret values it hands out, and the check that
none of them was written anywhere under OVERLORD_HOME. Imported as `from vaultlib import ...`
(test/agent and test/connectors are put on the path for their fakes)."""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "agent"))
sys.path.insert(0, os.path.join(HERE, "..", "connectors"))

# Prints the file store/<name> byte for byte; records every run's argv in calls.jsonl; exits 3
# (with a line on stderr) for a name it does not hold. A few names act out failures.
RESOLVER = r'''#!{python}
import json, os, signal, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
name = sys.argv[1] if len(sys.argv) > 1 else ""
if name == "act/slow":
    time.sleep(60)
if name == "act/leaky":
    sys.stderr.write("denied: the value would have been LEAKY-STDERR-9d8c7b\nsecond line\n")
    sys.exit(4)
if name == "act/killed":
    os.kill(os.getpid(), signal.SIGKILL)
if name == "act/huge":
    sys.stdout.write("x" * (65 * 1024))
    sys.exit(0)
try:
    with open(os.path.join(here, "store", name), "rb") as f:
        data = f.read()
except OSError:
    sys.stderr.write("no secret named %s\n" % name)
    sys.exit(3)
sys.stdout.buffer.write(data)
'''

# the values the store holds (each must appear nowhere under OVERLORD_HOME after a test)
VALUES = {
    "db/password": "pw-Vault-7f3e2a91c0",
    "providers/anthropic": "sk-ant-vault-ProviderKey-42c9",
    "providers/openai": "sk-openai-vault-Key-5e1d",
    "conn/probe": "probe-from-vault-8b2c",
    "conn/bearer": "Bearer mcp-vault-token-3a7f",
    "sso/client": "s:cret",
    "keys/anthropic": "sk-ant-stored-Ref-77aa",
}


class Resolver:
    """The resolver's folder: the script, its store and its call log."""

    def __init__(self, folder):
        self.dir = folder
        self.store = folder / "store"
        self.store.mkdir(parents=True)
        self.script = folder / "resolve.py"
        self.script.write_text(RESOLVER.replace("{python}", sys.executable))
        self.script.chmod(0o755)
        self.log = folder / "calls.jsonl"
        for name, value in VALUES.items():
            self.put(name, value + "\n")

    def put(self, name, data):
        path = self.store / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())

    @property
    def command(self):
        return f"{self.script} {{name}}"

    def calls(self):
        """[argv] of every run so far (argv without the program)."""
        try:
            return [json.loads(line) for line in self.log.read_text().splitlines()]
        except FileNotFoundError:
            return []


@pytest.fixture
def resolver(tmp_path):
    return Resolver(tmp_path / "resolver")


def assert_nowhere(home, values=None, extra=()):
    """No secret value in any file under home (names, contents: every byte searched)."""
    wanted = [v.encode() for v in (values or VALUES).values() if len(v) >= 6] + \
        [e.encode() for e in extra]
    for base, dirs, files in os.walk(home):
        for name in files + dirs:
            for w in wanted:
                assert w not in name.encode(), (name, w)
        for name in files:
            path = os.path.join(base, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            for w in wanted:
                assert w not in data, (path, w)


def audit_lines(home, action=None):
    path = home / "audit.jsonl"
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in out if action is None or e["action"] == action]
