"""What answers a cache miss: the real API and the simulator share one small interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from stabletoolbench_mirror.call import ToolCall
from stabletoolbench_mirror.records import Record, Source


@dataclass(frozen=True)
class Attempt:
    """The result of asking one responder.

    ``answer`` is a usable answer that will be recorded; when it is ``None`` the
    layer goes on to the next responder, and serves ``fallback`` (unrecorded) if
    no responder answers.
    """

    answer: Any | None
    origin: str
    """The endpoint or model that answered (never a secret)."""
    detail: str = ""
    """Why there is no usable answer, for logs and stats."""
    fallback: Any | None = None
    meta: Mapping[str, Any] | None = None
    """What the generation knew (simulator: rationale, model, prompt hash, tokens, ...), kept on the record, never served."""


class Responder(Protocol):
    """The real API or a simulator."""

    source: Source

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        """Answer ``call``; ``examples`` are cached answers of the same API (for few-shot prompts)."""
        ...

    def close(self) -> None:
        ...
