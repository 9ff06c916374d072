"""A live MCP tool's miss answered by the simulator, from the tool's recorded schema (as an MCP ``CallToolResult``).

When the server is down (or ``live: false``), the simulator is asked with the ``world-model`` system prompt
(the prompt this project's simulator has for tools without StableToolBench docs) and one user turn holding the
tool as its server listed it (name, description, ``inputSchema``), the session's last calls of that server and
their results, and the new call.  Its ``{"error", "response"}`` answer becomes a ``CallToolResult``: one text
content (the error when there is one, else the response), ``isError`` when ``error`` is not empty.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.responders.mcp_live.tools import LiveTool
from stabletoolbench_mirror.responders.simulator.client import ChatError
from stabletoolbench_mirror.responders.simulator.parsing import parse_output
from stabletoolbench_mirror.responders.simulator.prompt_files import built_in_prompt
from stabletoolbench_mirror.responders.simulator.responder import Simulator

log = logging.getLogger(__name__)

#: the longest earlier result shown to the simulator (characters)
MAX_EARLIER_CHARS = 2000
#: the longest description and schema shown (characters of their JSON)
MAX_SCHEMA_CHARS = 20_000


@dataclass(frozen=True)
class Simulated:
    """The simulator's result (``None`` when it gave none that can be used), why not, and what it knew."""

    result: dict[str, Any] | None
    detail: str = ""
    meta: Mapping[str, Any] | None = None


def result_text(body: str) -> str:
    """The text contents of a ``CallToolResult`` (its JSON text), joined (for the session's history)."""
    try:
        result = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    contents = result.get("content") if isinstance(result, dict) else None
    parts = [c.get("text", "") for c in contents or () if isinstance(c, dict) and c.get("type") == "text"]
    return "\n".join(p for p in parts if isinstance(p, str))[:MAX_EARLIER_CHARS]


def messages(tool: LiveTool, arguments: Mapping[str, Any], earlier: Sequence[tuple[str, Any, str]]) -> list[dict[str, str]]:
    """The chat the simulator is asked: the world-model prompt, the tool's schema, the session's last calls, the call."""
    doc = {"server": tool.server, "tool": tool.name, "description": tool.listed.get("description", ""),
           "inputSchema": tool.listed.get("inputSchema", {})}
    parts = []
    if earlier:
        parts.append("Earlier calls in this session, oldest first:")
        parts += [f"- {name} {json.dumps(args, ensure_ascii=False)[:MAX_EARLIER_CHARS]} -> {text}" for name, args, text in earlier]
        parts.append("")
    parts += ["API documentation:", json.dumps(doc, ensure_ascii=False)[:MAX_SCHEMA_CHARS], "",
              f"New call: {tool.server}/{tool.name}", f"input: {json.dumps(dict(arguments), ensure_ascii=False)}"]
    return [{"role": "system", "content": built_in_prompt("world-model").text}, {"role": "user", "content": "\n".join(parts)}]


def simulate(simulator: Simulator, tool: LiveTool, arguments: Mapping[str, Any], earlier: Sequence[tuple[str, Any, str]]) -> Simulated:
    """The simulator's ``CallToolResult`` for a call (in a worker thread)."""
    try:
        completion = simulator.client.complete(messages(tool, arguments, earlier))
    except ChatError as exc:
        return Simulated(None, f"simulator unavailable: {clip(exc.detail, 300)}")
    parsed = parse_output(completion.content)
    answer = parsed.answer
    if not isinstance(answer, dict) or "response" not in answer:
        return Simulated(None, "simulator output not parsable")
    error, response = answer.get("error") or "", answer.get("response")
    text = str(error) if error else response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
    result = {"content": [{"type": "text", "text": simulator.redactor.text(text)}], "isError": bool(error)}
    meta = {"simulated_from": "the recorded tools/list schema", "model": simulator.origin,
            "finish_reason": completion.finish_reason, "earlier_calls": len(earlier)}
    return Simulated(result, meta=meta)
