"""List one query's tools on stabletoolbench-mirror's MCP front and call each with an input it has an answer for.

Over HTTP (``serve`` with ``mcp: {enabled: true, queries: ...}``), each tool called with an input recorded
in the frozen cache the server replays (``--frozen``), so the calls come back with answers:

    python examples/mcp/client.py http://127.0.0.1:8080/mcp/queries/G1_instruction/3 --frozen /path/to/tool_response_cache

Without ``--frozen`` (or for a tool the tree has no file of) the tool's example values are sent: the
call an agent makes when it copies them, which a replayed cache seldom holds (an ``isError`` answer).

Over stdio (the client starts the server itself):

    python examples/mcp/client.py --stdio -- stabletoolbench-mirror mcp --config server_config.yml --query G1_instruction/3

Prints one JSON line per tool: its name, the arguments sent, whether the answer is an error, and the
answer's text (the ``/virtual`` body, ``{"error", "response"}``).  Needs only the official MCP SDK (``pip install mcp``).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import glob
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


def recorded_arguments(tree: str, tool_name: str) -> dict | None:
    """An input the frozen cache ``tree`` holds an answer for, for the MCP tool ``tool_name`` (``<api>_for_<tool>``).

    The tree's files are ``<Category>/<tool>_for_<Category>/<api>.json``, keyed by ``str()`` of the input
    (``"{'city': 'Paris'}"``, read back with ``ast.literal_eval``); the first object input with a usable
    answer (an empty ``error``) is taken.
    """
    parts = tool_name.split("_for_")
    for i in range(1, len(parts)):
        api, tool = "_for_".join(parts[:i]), "_for_".join(parts[i:])
        for path in sorted(glob.glob(os.path.join(glob.escape(tree), "*", glob.escape(tool) + "_for_*", glob.escape(api) + ".json"))):
            with open(path, encoding="utf-8") as fh:
                entries = json.load(fh)
            for key, answer in entries.items():
                try:
                    arguments = ast.literal_eval(key)
                except (ValueError, SyntaxError):
                    continue
                if isinstance(arguments, dict) and isinstance(answer, dict) and not answer.get("error"):
                    return arguments
    return None


async def run(server: object, frozen: str | None = None) -> None:
    async with Client(server) as client:
        page = await client.list_tools()
        tools = list(page.tools)
        while page.next_cursor is not None:  # the listing comes in pages (MCP's nextCursor)
            page = await client.list_tools(cursor=page.next_cursor)
            tools += page.tools
        print(json.dumps({"tools": [tool.name for tool in tools]}))
        for tool in tools:
            recorded = recorded_arguments(frozen, tool.name) if frozen else None
            arguments = recorded if recorded is not None else example_arguments(tool.input_schema)
            result = await client.call_tool(tool.name, arguments)
            print(json.dumps({"tool": tool.name, "arguments": arguments, "isError": result.is_error, "text": result.content[0].text},
                             ensure_ascii=False))


def main(argv: list[str]) -> int:
    stdio: list[str] = []
    if "--stdio" in argv:  # everything after --stdio (and an optional --) is the server's command
        argv, stdio = argv[: argv.index("--stdio")], argv[argv.index("--stdio") + 1:]
        stdio = stdio[1:] if stdio[:1] == ["--"] else stdio
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="--stdio [--] COMMAND...: start this server command "
                                     "and talk to it over its stdin/stdout")
    parser.add_argument("url", nargs="?", help="the MCP endpoint, e.g. http://127.0.0.1:8080/mcp/queries/G1_instruction/3")
    parser.add_argument("--token", help="the server's auth_token (sent as a bearer token)")
    parser.add_argument("--frozen", metavar="TREE", help="the frozen cache (tool_response_cache) the server replays: "
                        "call each tool with an input it holds (default: the tools' example values)")
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
    asyncio.run(run(server, args.frozen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
