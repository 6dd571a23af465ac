"""The connector configuration a face edits: `overlord mcp add|list|test|rm|approval`.

The face hands over what was typed (flags as strings); this layer parses KEY=VALUE and
`Name: value`, names the flag in every refusal, and returns data with every secret masked
(config.Server.masked). A refusal never quotes a value that may be a secret.
"""
import os

from overlord.agent.connectors import config, names
from overlord.errors import OverlordError, UsageError
from overlord.trust import audit
from overlord.txn import store

FLAGS = {"name": "NAME", "command": "--command", "args": "--arg", "env": "--env",
         "url": "--url", "headers": "--header"}


def _pairs(entries, sep, flag, what):
    """{key: value} from `K<sep>V` strings; the entry itself is never quoted (a secret)."""
    out = {}
    for i, entry in enumerate(entries or (), 1):
        key, found, value = entry.partition(sep)
        key = key.strip()
        if not found or not key:
            raise UsageError(f"{flag}: entry {i} is not {what} (its text is not shown: it may "
                             "be a secret)")
        if sep == ":":
            value = value.strip()
        if key.lower() in {k.lower() for k in out} if sep == ":" else key in out:
            raise UsageError(f"{flag}: {key!r} is given twice")
        out[key] = value
    return out


def _server(name, command, args, env, url, headers):
    if (command is None) == (url is None):
        raise UsageError("give --command CMD (a stdio server) or --url URL (an http server), "
                         "not both" if command is not None else
                         "give --command CMD (a stdio server) or --url URL (an http server)")
    if url is not None and (args or env):
        raise UsageError("--arg and --env go with --command (a stdio server), not --url")
    if command is not None and headers:
        raise UsageError("--header goes with --url (an http server), not --command")
    env = _pairs(env, "=", "--env", "KEY=VALUE")
    headers = _pairs(headers, ":", "--header", "'Name: value'")
    try:
        return config.Server(name, command=command, args=list(args or ()), env=env, url=url,
                             headers=headers)
    except config.Invalid as exc:
        raise UsageError(f"{FLAGS.get(exc.field, exc.field)}: {exc.reason}") from None


def _recorded(change, **details):
    """A configuration change is an audit act (connector.config): what changed, never a value
    of an env entry or a header. The chain must be writable before the change is made."""
    audit.ready()
    return lambda **more: audit.append("connector.config", change=change, **details, **more)


def mcp_add(name, *, command=None, args=(), env=(), url=None, headers=(), replace=False):
    """Configure a server; returns it masked."""
    server = _server(name, command, args, env, url, headers)
    record = _recorded("add", name=name, transport=server.transport, replace=bool(replace),
                       command=server.command, argc=len(server.args),   # argv may carry a key
                       url=config.mask_url(server.url)
                       if server.url else None, env=sorted(server.env), headers=sorted(server.headers))
    config.add(server, replace=replace)
    record()
    return server.masked()


def mcp_list():
    """{"file", "approval", "servers": [masked server]} -- nothing secret."""
    cfg = config.load()
    return {"file": config.path(), "approval": cfg.approval,
            "servers": [cfg.servers[n].masked() for n in sorted(cfg.servers)]}


def mcp_remove(name):
    """Forget a server; returns it masked."""
    record = _recorded("remove", name=name)
    removed = config.remove(name).masked()
    record()
    return removed


def mcp_approval(mode=None):
    """The approval mode; with mode, set it first. {"approval", "was"}."""
    if mode is None:
        return {"approval": config.load().approval, "was": None}
    record = _recorded("approval", approval=mode)
    was = config.set_approval(mode)
    record(was=was)
    return {"approval": mode, "was": was}


def test_log_path(name):
    return os.path.join(store.home(), f"mcp-test-{name}.log")


def mcp_test(name, *, start_timeout=None, cancel=None):
    """Connect to a configured server and list its tools as a session would be offered them:
    {"name", "transport", "server_info", "version", "era", "instructions", "approval", "log",
    "tools": [{"tool", "offered", "title", "description", "readonly", "withheld"}]}.
    A server that fails is a ConnectorError (an OverlordError) of one line."""
    from overlord.agent import tools as builtin     # here: `mcp list` and the workspace's
    from overlord.agent.connectors import client     # list never load the client
    from overlord.ops.connectors import START_TIMEOUT     # the one a session's start is held to
    start_timeout = start_timeout or START_TIMEOUT
    cfg = config.load()
    server = cfg.get(name)
    log = _fresh_log(name)
    try:
        c = client.open(server, log=log, start_timeout=start_timeout, cancel=cancel)
    except client.ConnectorError as exc:
        raise _with_log(exc, log) from None
    try:
        tools = c.list_tools(cancel=cancel, timeout=start_timeout)
        table = names.table({name: tools}, set(builtin.BY_NAME))
    except client.ConnectorError as exc:
        raise _with_log(exc, log) from None
    finally:
        c.close()
    offered = {pair[1]: off for off, pair in table.items()}
    rows = []
    for tool in tools:
        ann = tool.get("annotations")
        rows.append({"tool": tool["name"], "offered": offered[tool["name"]],
                     "title": _str(tool.get("title")),
                     "description": _str(tool.get("description")),
                     "readonly": isinstance(ann, dict) and ann.get("readOnlyHint") is True,
                     "withheld": names.shell_shaped(tool)})
    return {"name": name, "transport": server.transport, "server_info": c.server_info or {},
            "version": c.version, "era": c.era, "instructions": c.instructions,
            "approval": cfg.approval, "log": log, "tools": rows}


def _str(value):
    return value if isinstance(value, str) else None


def _fresh_log(name):
    """The server's stderr for this test, 0600 (a server may print its env), emptied first."""
    path = test_log_path(name)
    store.ensure_home()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600))
    return path


def _with_log(exc, log):
    """The error, pointing at the log (the server's stderr) when anything is in it."""
    try:
        said = os.path.getsize(log) > 0
    except OSError:
        said = False
    if not said:
        return exc
    return OverlordError(f"{exc} (the server's log: {log})")
