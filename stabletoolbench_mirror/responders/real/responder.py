"""The real-API responder: policy, backend call, validity rules, secret scrubbing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.records import Record, Source
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.engine.responders import Attempt
from stabletoolbench_mirror.responders.real.policy import CallPolicy
from stabletoolbench_mirror.responders.real.transport import Transport
from stabletoolbench_mirror.upstream.validity import classify


@dataclass(frozen=True)
class Fetched:
    """What a backend got: a candidate answer for the validity rules, or why there is none."""

    answer: Any | None
    origin: str
    """Where it came from (the relay URL or ``scheme://host``; never a key or query)."""
    detail: str = ""


class Backend(Protocol):
    origin: str

    def fetch(self, call: ToolCall) -> Fetched:
        ...


class RealResponder:
    """Answers a miss from the real API; only answers that pass the validity rules are returned."""

    source: Source = "real"

    def __init__(
        self,
        backend: Backend,
        transport: Transport,
        *,
        policy: CallPolicy | None = None,
        strict_validity: bool = False,
        secrets: Iterable[str] = (),
    ) -> None:
        self.backend = backend
        self.transport = transport
        self.policy = policy if policy is not None else CallPolicy()
        self.strict_validity = strict_validity
        self._redactor = Redactor(secrets)

    def respond(self, call: ToolCall, examples: Sequence[Record] = ()) -> Attempt:
        refusal = self.policy.refusal(call)
        if refusal:
            return Attempt(None, self.backend.origin, f"not called: {refusal}")
        fetched = self.backend.fetch(call)
        if fetched.answer is None:
            return Attempt(None, fetched.origin, fetched.detail)
        verdict = classify(fetched.answer, strict=self.strict_validity)
        if not verdict.valid:
            return Attempt(None, fetched.origin, f"invalid real answer: {verdict.reason}")
        # an API may echo the key it was called with: never let one reach the store
        return Attempt(self._redactor.plus(call.toolbench_key).data(fetched.answer), fetched.origin)

    def close(self) -> None:
        self.transport.close()

