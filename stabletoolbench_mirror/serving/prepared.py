"""The calls of recent ``/virtual`` bodies, kept by the body's bytes: a repeated call skips its parse.

Turning a body into a :class:`~stabletoolbench_mirror.core.call.ToolCall` (JSON, validation, names,
the three cache keys) is a pure function of the body's bytes and most of a hit's own cost; an
evaluation sends the same calls again and again.  Only calls are kept (never an answer: every
request still looks its answer up), only of bodies up to :data:`MAX_BODY_BYTES`, at most
:data:`MAX_CALLS` of them (the oldest dropped first), so memory stays bounded whatever clients send.
"""

from __future__ import annotations

from cachetools import FIFOCache

from stabletoolbench_mirror.core.call import ToolCall

MAX_CALLS = 2048
MAX_BODY_BYTES = 4096


class PreparedCalls(FIFOCache[bytes, ToolCall]):
    """A bounded map from a body's bytes to its call (event-loop use: no lock)."""

    def __init__(self) -> None:
        super().__init__(MAX_CALLS)

    def put(self, body: bytes, call: ToolCall) -> None:
        if len(body) <= MAX_BODY_BYTES:
            self[body] = call
