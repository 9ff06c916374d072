"""How a ``/virtual`` request ended: the :class:`OutcomeKind` vocabulary and the :class:`Outcome` served.

Every request ends in exactly one outcome.  The server counts it once, when it is final
(see :meth:`stabletoolbench_mirror.engine.stats.Stats.count`), and names it in the
``X-STM-Outcome`` response header.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from stabletoolbench_mirror.core import protocol


class OutcomeKind(enum.StrEnum):
    """How a request was answered."""

    HIT = "hit"
    """Found in the store or a frozen cache at the first lookup."""
    RECORDED = "recorded"
    """A miss this request filled: the real API or the simulator answered, and it was recorded."""
    SHARED = "shared"
    """A miss another request was filling: this one waited and was served that answer."""
    FAILED = "failed"
    """A miss nothing answered usably: the error answer served (upstream's texts), recorded as a
    failure record; or a failure record tried again that failed again (its recorded body served)."""
    REPLACED = "replaced"
    """A failure record tried again in ``record`` mode (``record.retry_failures``): the usable answer
    now given replaced it."""
    UNRECORDED = "unrecorded"
    """A miss answered by the real API or the simulator that the store could not record (disk full,
    Redis down): served anyway, and ``/health`` says ``degraded``."""
    UNANSWERED = "unanswered"
    """A miss nothing may fill (``replay`` mode, or no real API or simulator configured)."""
    LOCAL = "local"
    """Answered without the cache (``chat_with_user``)."""
    REJECTED = "rejected"
    """Bad input: HTTP 4xx, or upstream's ``Tool input parse error...`` answer."""
    REFUSED = "refused"
    """Turned away by a server limit (HTTP 503 or 408): a full wait queue, a wait past
    ``limits.queue_timeout_s``, a body slower than ``limits.body_timeout_s``; ``limit`` names it."""
    STORE_ERROR = "store_error"
    """The store could not be read or written (HTTP 503)."""
    ERROR = "error"
    """A bug: HTTP 500, logged with its traceback."""

    @property
    def is_miss(self) -> bool:
        """Whether the request missed the cache and went on to the real API / simulator step."""
        return self in _MISSES


_MISSES = frozenset(
    {OutcomeKind.RECORDED, OutcomeKind.SHARED, OutcomeKind.FAILED, OutcomeKind.UNANSWERED, OutcomeKind.REPLACED, OutcomeKind.UNRECORDED}
)


@dataclass(frozen=True)
class Outcome:
    """What the layer answers: the JSON text to serve, its HTTP status and how it was produced."""

    body: str
    kind: OutcomeKind
    status: int = 200
    source: str | None = None
    """For answers from a record: ``real``, ``simulated``, ``imported`` or ``frozen``."""
    origin: str = ""
    api: str | None = None
    """The ``Category/tool/api`` path of the call, once known (for per-API counts)."""
    problems: tuple[str, ...] = ()
    """Why each responder tried gave no usable answer (for ``/stats`` ``failures``)."""
    limit: str | None = None
    """For ``refused``: the setting whose limit turned the request away (for ``/stats`` ``refusals``)."""
    failure: bool = False
    """The body is a failure: a failure record served, or a miss that ended without a usable answer
    (``X-STM-Failure: true``)."""
    retried: bool = False
    """The request found a failure record and tried the call again (``/stats`` ``retries``)."""
    new_failure_record: bool = False
    """The request wrote a new failure record (``/stats`` ``failure_records``)."""
    key: str | None = None
    """Inside a session: the record key the call was answered under (with the history hash), for faults."""
    fault: str | None = None
    """The injected fault served instead of the answer (``faults:``; ``X-STM-Fault``, ``/stats`` ``faults``)."""

    @property
    def answer(self) -> Any:
        return json.loads(self.body)

    @classmethod
    def error(cls, status: int, message: str, kind: OutcomeKind = OutcomeKind.REJECTED, limit: str | None = None) -> Outcome:
        """An answer of this server's own (bad input, a limit, a fault): ``{"error": message, "response": ""}``."""
        return cls(protocol.encode_answer(protocol.answer(message, "")), kind, status=status, limit=limit)
