"""List one query's tools on stabletoolbench-mirror's MCP front and call each with its example values.

Over HTTP (``serve`` with ``mcp: {enabled: true, queries: ...}``):

    python examples/mcp/client.py http://127.0.0.1:8080/mcp/queries/G1_instruction/3 [--token TOKEN]

Over stdio (the client starts the server itself):

    python examples/mcp/client.py --stdio -- stabletoolbench-mirror mcp --config server_config.yml --query G1_instruction/3

Prints one JSON line per tool: its name, whether the answer is an error, and the answer's text
(the ``/virtual`` body, ``{"error", "response"}``).  Needs only the official MCP SDK (``pip install mcp``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def example_arguments(schema: dict) -> dict:
    """The call an agent makes when it copies each required parameter's example value."""
    properties = schema.get("properties") or {}
    return {
        name: properties[name]["examples"][0]
        for name in schema.get("required") or []
        if properties.get(name, {}).get("examples")
    }


async def run(server: object) -> None:
    async with Client(server) as client:
        listed = await client.list_tools()
        print(json.dumps({"tools": [tool.name for tool in listed.tools]}))
        for tool in listed.tools:
            result = await client.call_tool(tool.name, example_arguments(tool.input_schema))
            print(json.dumps({"tool": tool.name, "isError": result.is_error, "text": result.content[0].text}, ensure_ascii=False))


def main(argv: list[str]) -> int:
    stdio: list[str] = []
    if "--stdio" in argv:  # everything after --stdio (and an optional --) is the server's command
        argv, stdio = argv[: argv.index("--stdio")], argv[argv.index("--stdio") + 1:]
        stdio = stdio[1:] if stdio[:1] == ["--"] else stdio
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="--stdio [--] COMMAND...: start this server command "
                                     "and talk to it over its stdin/stdout")
    parser.add_argument("url", nargs="?", help="the MCP endpoint, e.g. http://127.0.0.1:8080/mcp/queries/G1_instruction/3")
    parser.add_argument("--token", help="the server's auth_token (sent as a bearer token)")
    args = parser.parse_args(argv)
    if stdio:
        # the SDK starts the server with a minimal environment; PYTHONPATH is passed on when set
        env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else None
        server: object = StdioServerParameters(command=stdio[0], args=stdio[1:], env=env)
    elif args.url:
        headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
        server = streamable_http_client(args.url, http_client=httpx2.AsyncClient(headers=headers, timeout=60))
    else:
        parser.error("give the endpoint's URL, or --stdio COMMAND")
    asyncio.run(run(server))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
