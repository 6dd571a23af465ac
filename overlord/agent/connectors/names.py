"""The names a connector's tools are offered to the model under, and which tools look like a shell.

A tool is offered as `mcp__<server>__<tool>`. Providers limit tool names (Anthropic and OpenAI:
[A-Za-z0-9_-], at most 64 characters; Gemini is no looser), so a name outside that is changed
deterministically: characters outside the set become "_", the name is cut to fit, and a short
hash of the original (server, tool) is appended -- two long names that share a prefix do not
collide by accident, and the same tool is offered under the same name in every run. A
collision that remains (or one with a built-in tool) is refused when the run starts.

A shell-shaped tool -- named like a shell AND taking a command line -- is a general shell on
the host, the one capability the transaction exists to contain: the session withholds it
unless it holds the connector_shell grant.
"""
import hashlib
import re

from overlord.errors import OverlordError

PREFIX = "mcp__"
LIMIT = 64
SAFE_RE = re.compile(r"[A-Za-z0-9_-]+\Z")
UNSAFE_RE = re.compile(r"[^A-Za-z0-9_-]")
HASH_LEN = 8


def offered(server, tool):
    """The name the model is offered `tool` of `server` under."""
    name = f"{PREFIX}{server}__{tool}"
    if tool and SAFE_RE.match(name) and len(name) <= LIMIT:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode("utf-8", "surrogatepass")).hexdigest()
    suffix = "_" + digest[:HASH_LEN]
    return UNSAFE_RE.sub("_", name)[:LIMIT - len(suffix)] + suffix


def table(tools_by_server, builtins=()):
    """{offered name: (server, tool)} for {server: [tool name or tool dict]}; a name two
    tools would share, or a built-in tool's name, is an OverlordError naming both."""
    out = {}
    builtins = set(builtins)
    for server, tools in tools_by_server.items():
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else tool
            if not isinstance(name, str) or not name:
                raise OverlordError(f"connector {server}: a tool without a name ({name!r})")
            off = offered(server, name)
            if off in builtins:
                raise OverlordError(f"connector {server}'s tool {name!r} would be offered as "
                                    f"{off}, the name of a built-in tool")
            if off in out:
                other = out[off]
                what = f"lists the tool {name!r} twice" if other == (server, name) else \
                    f"tool {name!r} and connector {other[0]}'s tool {other[1]!r} would both be " \
                    f"offered as {off}"
                raise OverlordError(f"tool name collision: connector {server} {what}")
            out[off] = (server, name)
    return out


# -- shell-shaped tools ------------------------------------------------------------------------

# A name is shell-shaped when a word of it is a shell's, or when it is an exec verb with at most
# command-ish words beside it (run_command, exec, spawn_process; not run_tests, execute_query).
SHELL_WORDS = {"shell", "bash", "sh", "zsh", "fish", "ksh", "csh", "tcsh", "powershell", "pwsh",
               "cmd", "terminal", "subprocess", "cmdline", "commandline", "console", "tty",
               "pty", "repl", "ssh", "psexec", "winrm"}
EXEC_VERBS = {"exec", "execute", "run", "spawn", "system", "popen", "launch", "invoke", "eval",
              "start"}
COMMAND_WORDS = {"command", "commands", "cmd", "script", "scripts", "process", "program",
                 "line", "in", "on", "a", "the", "host", "os", "local", "remote", "raw",
                 "arbitrary", "any", "sync", "async", "background", "code"}
# An input that takes a command line: one of these properties, a string or a list of strings.
COMMAND_PROPS = {"command", "commands", "cmd", "cmdline", "command_line", "commandline",
                 "shell_command", "script", "argv", "args", "shell", "bash"}
# A description that says it takes a command line.
SHELL_TEXT_RE = re.compile(r"\b(shell|bash|zsh|sh -c|powershell|pwsh|cmd\.exe|in (a |the )?terminal|"
                           r"command[- ]?line|cli commands?|system commands?|os commands?|"
                           r"host commands?|arbitrary commands?)\b|/bin/\w*sh\b", re.I)
COMMAND_TEXT_RE = re.compile(r"\b(run|runs|running|execute|executes|executing|exec|spawn|"
                             r"spawns)\b.{0,40}\bcommands?\b", re.I | re.S)
NOT_A_SHELL_RE = re.compile(r"\b(sql|database|query|queries|statement|redis|graphql)\b", re.I)


def words(name):
    """A tool name as lowercase words: runShellCommand, run-shell_command -> run shell command."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", name.lower()) if w]


def _named_like_a_shell(name):
    ws = words(name)
    if not ws:
        return False
    if any(w in SHELL_WORDS for w in ws):
        return True
    return any(w in EXEC_VERBS for w in ws) and all(w in EXEC_VERBS or w in COMMAND_WORDS
                                                    for w in ws)


def _takes_a_string(schema):
    """A property schema that admits a string or a list of strings (or says nothing)."""
    if not isinstance(schema, dict):
        return schema is True
    kinds = schema.get("type")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds} if kinds else None
    if kinds is None:
        alts = [s for key in ("anyOf", "oneOf") for s in schema.get(key) or ()]
        return not alts or any(_takes_a_string(s) for s in alts)
    if "string" in kinds:
        return True
    if "array" in kinds:
        items = schema.get("items")
        return items is None or _takes_a_string(items)
    return False


def _takes_a_command_line(tool):
    schema = tool.get("inputSchema")
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    for key, prop in props.items():
        if isinstance(key, str) and "_".join(words(key)) in COMMAND_PROPS and _takes_a_string(prop):
            return True
    desc = tool.get("description")
    desc = desc if isinstance(desc, str) else ""
    if SHELL_TEXT_RE.search(desc):
        return True
    return bool(COMMAND_TEXT_RE.search(desc)) and not NOT_A_SHELL_RE.search(desc)


def shell_shaped(tool):
    """True when a tool (the server's dict) is named like a shell AND its description or
    input schema takes a command line."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        return False
    return _named_like_a_shell(tool["name"]) and _takes_a_command_line(tool)
