"""The real MCP servers the connector tests talk to, installed by `.ci/run` with
`npm ci --prefix test/connectors/servers` (pinned in package-lock.json): missing, a test fails
on CI (OVERLORD_REQUIRE_BACKENDS) and skips elsewhere. Imported as `from servers import ...`."""
import os
import shutil

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "servers", "node_modules", ".bin")


def _require(name):
    path = os.path.join(BIN, name)
    missing = None if os.path.exists(path) else f"{path} is missing (run: npm ci --prefix {os.path.dirname(BIN)[:-len('/node_modules')]})"
    if missing is None and not shutil.which("node"):
        missing = "node is not installed"
    if missing:
        if os.environ.get("OVERLORD_REQUIRE_BACKENDS"):
            pytest.fail(f"the real MCP server {name} is unavailable on a host that must have it: {missing}")
        pytest.skip(missing)
    return path


def everything_argv():
    """@modelcontextprotocol/server-everything on stdio."""
    return [_require("mcp-server-everything"), "stdio"]


def filesystem_argv(directory):
    """@modelcontextprotocol/server-filesystem serving one directory."""
    return [_require("mcp-server-filesystem"), str(directory)]
