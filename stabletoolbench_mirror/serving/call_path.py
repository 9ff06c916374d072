"""The one path from a ``/virtual`` call to its counted answer, shared by ``POST /virtual`` and the MCP front.

:class:`CallPath` validates a payload (a body seen lately skips its parse, :mod:`.prepared`), hands
the call to the engine's one entry (``MirrorLayer.answer_async``: a hit on the event loop; sessions,
local tools and misses in a worker thread shared fairly between clients; ``faults:`` on what is
served), and counts the outcome once.
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import anyio

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.fair import FairLimiter
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.serving.prepared import PreparedCalls

log = logging.getLogger(__name__)


def _parse_body(body: bytes) -> Any:
    """The decoded ``/virtual`` body, or the 400 answer to one that is not UTF-8 JSON."""
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return Outcome.error(400, "request body is not UTF-8")
    except (ValueError, RecursionError):
        return Outcome.error(400, "request body is not JSON")


def _internal_error() -> Outcome:
    """The answer to a bug (never to bad input): still a JSON answer, and logged with its trace."""
    log.exception("internal error while answering /virtual")
    return Outcome.error(500, "stabletoolbench-mirror: internal error (see the server log)", OutcomeKind.ERROR)


class CallPath:
    """The one path from a ``/virtual`` call (and its session) to its answer, counted once.

    ``POST /virtual`` (:meth:`answer_body`) and the MCP front's tool calls (:meth:`answer`) both
    answer here: the same validation, keys, cache tiers, responders, records, sessions and faults,
    and one count in ``/stats`` and ``/metrics`` by the outcome.
    """

    def __init__(self, layer: MirrorLayer, threads: FairLimiter) -> None:
        self.layer = layer
        self.threads = threads
        # anyio only enters its limiter (``async with``), which a FairLimiter does as a CapacityLimiter would
        self._limiter = cast(anyio.CapacityLimiter, self.threads)
        """The worker threads of ``/virtual`` (local tools, sessions, store I/O, misses), shared fairly between clients."""
        self.calls = PreparedCalls()
        """The calls of bodies seen lately: a repeated body is not parsed again (:mod:`.prepared`)."""

    async def answer(self, payload: Any, session: str | None | Outcome = None, faults: bool = True) -> Outcome:
        """The answer to one decoded payload (a session id, ``None``, or the answer to a bad session id), counted.

        ``faults``: whether ``faults:`` may fault it (``check`` asks for clean answers with ``X-STM-Faults: off``).
        """
        try:
            prepared = self._prepare(payload, session)
            if isinstance(prepared, Outcome):
                outcome = prepared
            else:
                assert not isinstance(session, Outcome)  # answered by _prepare
                outcome = await self.layer.answer_async(prepared, session, faults=faults, limiter=self._limiter)
        except Exception:
            outcome = _internal_error()
        self.layer.stats.count(outcome)
        return outcome

    async def answer_body(self, body: bytes, session: str | None | Outcome = None, faults: bool = True) -> Outcome:
        """:meth:`answer` for a ``/virtual`` body's bytes; a body seen lately skips its parse."""
        try:
            prepared: ToolCall | Outcome | None = self.calls.get(body)
            if prepared is None:
                payload = _parse_body(body)
                prepared = payload if isinstance(payload, Outcome) else self._prepare(payload, session)
                if isinstance(prepared, ToolCall):
                    self.calls.put(body, prepared)
            elif isinstance(session, Outcome):
                prepared = session
            if isinstance(prepared, Outcome):
                outcome = prepared
            else:
                assert not isinstance(session, Outcome)  # answered above
                # the engine's one entry: every tier, the miss, the faults (engine.layer)
                outcome = await self.layer.answer_async(prepared, session, faults=faults, limiter=self._limiter)
        except Exception:
            outcome = _internal_error()
        self.layer.stats.count(outcome)
        return outcome

    def _prepare(self, payload: Any, session: str | None | Outcome) -> ToolCall | Outcome:
        if not isinstance(payload, dict):
            return Outcome.error(422, "request body must be a JSON object")
        if isinstance(session, Outcome):
            return session
        return self.layer.prepare(payload)
