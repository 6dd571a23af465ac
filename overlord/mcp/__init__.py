"""`overlord mcp serve`: OVERLORD as a Model Context Protocol server (issue 12)."""
