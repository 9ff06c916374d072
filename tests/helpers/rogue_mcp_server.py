"""A small stdio MCP server whose output a test chooses: many tools, odd names, huge results, a changed schema.

Written by hand (newline-delimited JSON-RPC, no SDK) so a test can make it misbehave in ways a real server
would not on purpose.  Run as ``python rogue_mcp_server.py [--tools N] [--odd-names] [--big-bytes N]
[--version V]``.  Tools: ``echo`` (answers its arguments and the version), ``big`` (``--big-bytes`` of text),
``tool_<i>`` for ``--tools N``, and with ``--odd-names`` ``../../escape`` and ``a/b\\c``; ``--version 2``
adds a required ``loud`` field to ``echo``'s schema.
"""

from __future__ import annotations

import argparse
import json
import sys


def tools(args: argparse.Namespace) -> list[dict]:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    if args.version >= 2:
        schema = {**schema, "properties": {**schema["properties"], "loud": {"type": "boolean"}}, "required": ["text", "loud"]}
    found = [{"name": "echo", "description": "Echo the text back.", "inputSchema": schema},
             {"name": "big", "description": "A large result.", "inputSchema": {"type": "object", "properties": {}}}]
    found += [{"name": f"tool_{i}", "description": f"Tool {i}.", "inputSchema": {"type": "object"}} for i in range(args.tools)]
    if args.odd_names:
        found += [{"name": name, "description": "odd", "inputSchema": {"type": "object"}} for name in ("../../escape", "a/b\\c")]
    return found


def answer(args: argparse.Namespace, method: str, params: dict) -> dict:
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                "serverInfo": {"name": "rogue", "version": str(args.version)}}
    if method == "tools/list":
        return {"tools": tools(args)}
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name == "big":
            return {"content": [{"type": "text", "text": "x" * args.big_bytes}], "isError": False}
        text = json.dumps({"tool": name, "arguments": arguments, "version": args.version}, sort_keys=True)
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    raise KeyError(method)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=0)
    parser.add_argument("--odd-names", action="store_true")
    parser.add_argument("--big-bytes", type=int, default=10)
    parser.add_argument("--version", type=int, default=1)
    args = parser.parse_args()
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if "id" not in message or "method" not in message:
            continue  # a notification or a response
        try:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(args, message["method"], message.get("params") or {})}
        except KeyError:
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": f"no method {message['method']}"}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
