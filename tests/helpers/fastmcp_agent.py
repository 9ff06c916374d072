"""An agent framework's MCP client, FastMCP's ``Client``, run in a venv of its own (``STM_CI_MCP_CLIENT_VENV``):
every tool listed, then the calls given, at the URL given; prints one JSON object of what it saw.

    python tests/helpers/fastmcp_agent.py URL CALLS.json

``CALLS.json``: ``[[tool, arguments], ...]``.  Printed: ``{"tools": [tool, ...], "results": [result, ...]}``,
each as FastMCP's ``mcp`` types dump them (JSON mode, by alias, without ``None``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


async def main(url: str, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    from fastmcp import Client

    async with Client(url, timeout=120) as client:
        tools = await client.list_tools()
        results = [await client.call_tool(name, arguments, raise_on_error=False) for name, arguments in calls]

    def dump(item: Any) -> Any:
        return item.model_dump(mode="json", by_alias=True, exclude_none=True)

    return {"tools": [dump(t) for t in tools],
            "results": [{"content": [dump(c) for c in r.content], "isError": r.is_error} for r in results]}


if __name__ == "__main__":
    with open(sys.argv[2], encoding="utf-8") as file:
        print(json.dumps(asyncio.run(main(sys.argv[1], json.load(file)))))
