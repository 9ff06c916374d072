"""The ToolBench relay (StableToolBench's ``toolbench_url``): one POST per call, as upstream sends it."""

from __future__ import annotations

import json
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.secrets import public_url
from stabletoolbench_mirror.responders.real.responder import Fetched
from stabletoolbench_mirror.responders.real.transport import Transport


def relay_tool_name(tool_name: str) -> str:
    """The tool name upstream sends to the relay: the client's spelling, cut at the first ``_for_``."""
    return tool_name.split("_for_")[0]


def relay_body(call: ToolCall, toolbench_key: str) -> dict[str, Any]:
    """The JSON body upstream POSTs to the relay for ``call``."""
    return {
        "category": call.names.category,
        "tool_name": relay_tool_name(call.tool_name),
        "api_name": call.names.api_name,
        "tool_input": call.tool_input,
        "strip": "",
        "toolbench_key": toolbench_key,
    }


class RelayBackend:
    """POSTs calls to a ToolBench relay with the request's ``toolbench_key`` (else the configured one)."""

    def __init__(self, transport: Transport, relay_url: str, default_key: str = "") -> None:
        self.transport = transport
        self.relay_url = relay_url
        self.default_key = default_key
        self.origin = public_url(relay_url)

    def fetch(self, call: ToolCall) -> Fetched:
        key = call.toolbench_key or self.default_key
        headers = {"accept": "application/json", "Content-Type": "application/json", "toolbench_key": key}
        reply = self.transport.send(
            "POST", self.relay_url, headers=headers, data=json.dumps(relay_body(call, key)).encode("utf-8")
        )
        if not reply.ok:
            return Fetched(None, self.origin, f"relay: {reply.failure}")
        if reply.status != 200:
            # upstream only looks at a 200 answer
            return Fetched(None, self.origin, f"relay: HTTP {reply.status}")
        try:
            answer = json.loads(reply.content)
        except (ValueError, RecursionError):
            return Fetched(None, self.origin, "relay: the answer is not JSON")
        return Fetched(answer, self.origin)
