"""What answers a cache miss: the real API and the simulator share one small interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.records import Record, Source

if TYPE_CHECKING:
    from stabletoolbench_mirror.engine.stats import Stats


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


# -- optional capabilities: small protocols, each checked once when the layer is built --------------


@runtime_checkable
class CountsEvents(Protocol):
    """A responder with counters of its own in ``/stats`` (the simulator's parse retries, shadow answers)."""

    def use_stats(self, stats: Stats) -> None:
        """Count its events in the server's counters (shared by every worker)."""
        ...

    def stats(self) -> dict[str, dict[str, int]]:
        """Its sections of ``/stats``."""
        ...


@runtime_checkable
class TakesExamples(Protocol):
    """A simulator that says whether its prompt uses cached answers of the same API (few-shot examples).

    A ``simulated`` responder that does not say gets them; other responders never do.
    """

    @property
    def wants_examples(self) -> bool: ...


class PromptSource(Protocol):
    def describe(self) -> dict[str, str]:
        """Where the system prompt comes from, and its sha256."""
        ...


@runtime_checkable
class Prompted(Protocol):
    """A simulator whose style and system prompt ``/stats`` shows."""

    style: str
    prompt: PromptSource


def wants_examples(responder: Responder) -> bool:
    """Whether a miss asks the store for examples before ``responder`` answers (a store scan per miss otherwise)."""
    if responder.source != "simulated":
        return False
    return responder.wants_examples if isinstance(responder, TakesExamples) else True
