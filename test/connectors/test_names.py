"""names: the offered tool names (limits, determinism, collisions) and shell-shaped tools."""
import re

import pytest

from overlord.agent.connectors import names
from overlord.errors import OverlordError
from servers import everything_argv, filesystem_argv

PROVIDER_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")     # the strictest of the providers' rules


# -- offered names -----------------------------------------------------------------------------

def test_a_plain_name_is_prefixed_and_kept():
    assert names.offered("github", "create_issue") == "mcp__github__create_issue"
    assert names.offered("everything", "get-sum") == "mcp__everything__get-sum"


@pytest.mark.parametrize("server, tool", [
    ("fs", "a.b"), ("fs", "with space"), ("fs", "ünïcode"), ("fs", "x" * 200),
    ("s" * 32, "t" * 40), ("docs", "search/all"), ("docs", ""), ("a", "\x1b[31mred"),
])
def test_a_name_outside_the_limits_is_changed_to_fit_with_a_hash(server, tool):
    name = names.offered(server, tool)
    assert PROVIDER_RE.match(name), name
    assert name.startswith(f"mcp__{server}__"[:64 - 9])
    assert re.search(r"_[0-9a-f]{8}$", name), name
    assert names.offered(server, tool) == name                   # deterministic


def test_a_name_at_exactly_64_is_kept_and_one_more_is_cut():
    server = "s" * 32
    tool = "t" * (64 - len(f"mcp__{server}__"))
    assert names.offered(server, tool) == f"mcp__{server}__{tool}"
    longer = names.offered(server, tool + "t")
    assert len(longer) == 64 and longer != f"mcp__{server}__{tool}"[:64]


def test_two_long_names_sharing_a_prefix_do_not_collide():
    a = names.offered("srv", "x" * 80 + "a")
    b = names.offered("srv", "x" * 80 + "b")
    assert a != b and a[:-8] == b[:-8]
    # the same tool of another server, and a name that only differs by an unsafe character
    assert names.offered("srv2", "x" * 80 + "a") != a
    assert names.offered("fs", "a.b") != names.offered("fs", "a/b")


def test_table_maps_offered_names_back_and_accepts_tool_dicts():
    t = names.table({"fs": ["read_file", {"name": "write_file"}], "gh": ["read_file"]},
                    {"read_file", "exec"})
    assert t == {"mcp__fs__read_file": ("fs", "read_file"),
                 "mcp__fs__write_file": ("fs", "write_file"),
                 "mcp__gh__read_file": ("gh", "read_file")}


def test_a_collision_names_both_tools():
    shortened = names.offered("fs", "a.b")                     # mcp__fs__a_b_<hash>
    natural = shortened[len("mcp__fs__"):]                     # a tool whose name is exactly that
    with pytest.raises(OverlordError) as e:
        names.table({"fs": ["a.b", natural]}, ())
    msg = str(e.value)
    assert "collision" in msg and "'a.b'" in msg and repr(natural) in msg and shortened in msg


def test_a_collision_with_a_built_in_and_a_tool_listed_twice_are_refused():
    with pytest.raises(OverlordError, match="built-in"):
        names.table({"x": ["y"]}, {"mcp__x__y"})
    with pytest.raises(OverlordError, match="twice"):
        names.table({"x": ["y", {"name": "y"}]}, ())
    with pytest.raises(OverlordError, match="without a name"):
        names.table({"x": [{"title": "no name"}]}, ())


# -- shell-shaped ------------------------------------------------------------------------------

def tool(name, description="", **props):
    return {"name": name, "description": description,
            "inputSchema": {"type": "object", "properties": props}}


STRING = {"type": "string"}
STRINGS = {"type": "array", "items": {"type": "string"}}

SHELLS = [
    tool("run_command", command=STRING),
    tool("runCommand", "Runs a command", cwd=STRING),
    tool("exec", commandLine=STRING),
    tool("shell", "Execute a shell command on the host", input=STRING),
    tool("Bash", "", script=STRING),
    tool("execute-command", argv=STRINGS),
    tool("terminal", "Run input in a terminal", input=STRING),
    tool("RunShell", cmd=STRING),
    tool("powershell", "Invoke a PowerShell pipeline", script=STRING),
    tool("spawn", args=STRINGS, cwd=STRING),
    tool("subprocess", "Runs /bin/sh with what you give it", text=STRING),
    tool("shell_exec", command={"type": ["string", "null"]}),
    tool("zsh", "", command={"anyOf": [STRING, {"type": "null"}]}),
    {"name": "exec", "description": "Run a command line on the server"},       # no schema at all
]

NOT_SHELLS = [
    tool("exec", "Execute a SQL command against the database", query=STRING),   # SQL, not a shell
    tool("run_command", "Run macro number N", command={"type": "integer"}),     # a number
    tool("run_tests", "Run the test suite with a shell command", pattern=STRING),  # not shell-named
    tool("execute_query", "Execute a query", command=STRING),
    tool("get_terminal_output", "Get the output of a terminal", terminal_id=STRING),
    tool("search_files", "Search shell scripts for a pattern", pattern=STRING),
    tool("run", "Run a saved workflow by id", workflow_id=STRING),
    tool("spawn", "Spawn a new game character", kind=STRING, args={"type": "object"}),
    tool("create_issue", "Create a GitHub issue", title=STRING, body=STRING),
    tool("command_palette", "List the editor's commands", filter=STRING),
    {"name": "shell"},                                             # no description, no schema
    {"name": 7, "description": "Run a shell command"},             # garbage: not a name
    "shell",                                                        # not a tool dict
]


@pytest.mark.parametrize("spec", SHELLS, ids=lambda t: t["name"])
def test_shell_shaped(spec):
    assert names.shell_shaped(spec) is True


@pytest.mark.parametrize("spec", NOT_SHELLS, ids=lambda t: str(t.get("name") if isinstance(t, dict) else t))
def test_not_shell_shaped(spec):
    assert names.shell_shaped(spec) is False


def test_words_normalize_case_camel_case_and_separators():
    for name in ("runShellCommand", "RunShellCommand", "run-shell_command", "RUN_SHELL_COMMAND",
                 "run.shell.command"):
        assert names.words(name) == ["run", "shell", "command"], name
    assert names.words("HTTPServerRun") == ["http", "server", "run"]


@pytest.mark.parametrize("which", ["everything", "filesystem"])
def test_no_tool_of_the_real_servers_is_shell_shaped_and_every_name_fits(which, tmp_path):
    from overlord.agent.connectors import client, config
    argv = everything_argv() if which == "everything" else filesystem_argv(tmp_path)
    server = config.Server(which, command=argv[0], args=argv[1:])
    c = client.open(server, log=str(tmp_path / "server.log"))
    try:
        tools = c.list_tools()
    finally:
        c.close()
    assert len(tools) >= 10
    assert [t["name"] for t in tools if names.shell_shaped(t)] == []
    table = names.table({which: tools}, ())
    assert all(PROVIDER_RE.match(n) for n in table) and len(table) == len(tools)
