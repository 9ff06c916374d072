"""Live MCP servers as an upstream tier: their tools served at ``/mcp``, recorded and replayed (docs/live-mcp.md)."""
