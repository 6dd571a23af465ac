"""Connectors: the outside world's tools, through the Model Context Protocol.

    client.py   the MCP client (stdio and streamable HTTP; both protocol generations)
    config.py   OVERLORD_HOME/mcp.json: the configured servers and the approval mode
    names.py    the names tools are offered under (mcp__<server>__<tool>), shell-shaped tools

A connector acts outside the jail and outside the transaction. What a session may use, the
approval gate and the audit acts that bind each call into the record live in overlord.ops.connectors.
"""
