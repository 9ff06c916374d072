"""Injected faults (``faults:``): the same failures in every run, served and never recorded.

Whether a call is served a fault, and which one, is a function of ``faults.seed``, the call's API
(``Category/tool/api``) and its exact record key (inside a session the key carries the session's
history hash) and nothing else: sha256 of those, never Python's ``hash()``, so every run, worker
and host serves the same faults for the same calls.  The first 8 bytes of the digest decide
*whether* (below ``rate``), the next 8 *which* kind (by the weights, in the fixed order of
:data:`~stabletoolbench_mirror.core.fault_kinds.KINDS`).

The fault is applied to what is served, after the lookup and after a miss was filled and recorded
(:meth:`FaultPlan.serve`, called by the server on every ``/virtual`` answer): the store, the
session's history and a snapshot only ever see the clean answer, so the same calls without
faults are clean hits.  A fault replaces the body (``slow`` keeps it and waits ``slow_s``) and
names its kind in ``Outcome.fault`` (``X-STM-Fault``, ``/stats`` ``faults``, ``/metrics``).

Only answers to tool calls are faulted: HTTP 200 outcomes of a call that reached the lookup (hits,
misses filled or not, failures); never bad input, ``chat_with_user``, local tools, refusals or
store errors.  With ``faults.rate: 0`` (the default) there is no plan: the layer's ``faults``
is ``None`` and the request path pays one attribute check.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import anyio

from stabletoolbench_mirror.config import FaultsConfig
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.fault_kinds import ERROR_KINDS, KINDS
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind

#: the outcomes of a tool call a fault may replace (all HTTP 200)
FAULTABLE = frozenset(
    {
        OutcomeKind.HIT,
        OutcomeKind.RECORDED,
        OutcomeKind.SHARED,
        OutcomeKind.FAILED,
        OutcomeKind.REPLACED,
        OutcomeKind.UNRECORDED,
        OutcomeKind.UNANSWERED,
    }
)
#: the request header with which a client (``check``) asks for the unfaulted answer
NO_FAULTS_HEADER = b"x-stm-faults"
NO_FAULTS_VALUE = b"off"
_SCALE = float(1 << 64)
_DOMAIN = b"stabletoolbench-mirror faults v1"


def draw(seed: int, api: str, key: str) -> tuple[float, float]:
    """Two numbers in [0, 1) fixed by ``(seed, api, key)``: whether a call is faulted, and which kind."""
    digest = hashlib.sha256(b"\0".join((_DOMAIN, str(seed).encode(), api.encode("utf-8", "surrogatepass"),
                                        key.encode("utf-8", "surrogatepass")))).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE, int.from_bytes(digest[8:16], "big") / _SCALE


class FaultPlan:
    """Which calls get which fault (from ``faults:``), and the faulted answers."""

    def __init__(self, config: FaultsConfig) -> None:
        self.seed = config.seed
        self.rate = config.rate
        self.slow_s = config.slow_s
        weighted = [(kind, float(config.kinds[kind])) for kind in KINDS if config.kinds.get(kind, 0) > 0]
        total = sum(weight for _kind, weight in weighted)
        self.kinds = tuple(kind for kind, _weight in weighted)
        """The kinds drawn from, in :data:`KINDS` order."""
        self.weights = tuple(weight / total for _kind, weight in weighted)
        """Their shares (summing to 1)."""
        bounds, running = [], 0.0
        for share in self.weights:
            running += share
            bounds.append(running)
        bounds[-1] = 1.0
        self._bounds = tuple(bounds)
        self._apis = frozenset(config.apis)
        self._tools = frozenset(config.tools)
        self._categories = frozenset(config.categories)

    @classmethod
    def from_config(cls, config: FaultsConfig) -> FaultPlan | None:
        """The plan of ``faults:``, or ``None`` when faults are off (``rate: 0``)."""
        return cls(config) if config.enabled else None

    # -- the decision -----------------------------------------------------------------------------

    def in_scope(self, call: ToolCall) -> bool:
        """Whether ``call`` is in ``faults.apis`` / ``tools`` / ``categories`` (each one given must match)."""
        names = call.names
        if self._categories and not self._categories & {call.category, names.category}:
            return False
        if self._tools and not self._tools & {call.tool_name, names.tool, names.tool_folder}:
            return False
        if self._apis and not self._apis & {call.api, call.api_name, names.api_name, f"{call.category}/{call.tool_name}/{call.api_name}"}:
            return False
        return True

    def kind_for(self, api: str, key: str) -> str | None:
        """The fault the call of ``api`` with record key ``key`` gets, or ``None`` (scope aside)."""
        whether, which = draw(self.seed, api, key)
        if whether >= self.rate:
            return None
        for kind, bound in zip(self.kinds, self._bounds):
            if which < bound:
                return kind
        return self.kinds[-1]  # pragma: no cover - the last bound is 1.0

    def fault_for(self, call: ToolCall, outcome: Outcome, in_session: bool = False) -> str | None:
        """The fault to serve instead of ``outcome`` (the answer to ``call``), or ``None``.

        Inside a session the key is the one the call was answered under (``outcome.key``, with
        the history hash); an outcome without one (a refused session call) is never faulted.
        """
        if outcome.status != 200 or outcome.kind not in FAULTABLE or outcome.fault is not None:
            return None
        key = outcome.key if in_session else call.key
        if key is None or not self.in_scope(call):
            return None
        return self.kind_for(call.api, key)

    # -- the faulted answer -------------------------------------------------------------------------

    def apply(self, outcome: Outcome, kind: str) -> Outcome:
        """``outcome`` with the body of fault ``kind`` (``slow``: the same body; the caller waits)."""
        return replace(outcome, body=faulted_body(outcome.body, kind), fault=kind)

    async def serve(self, call: ToolCall, outcome: Outcome, in_session: bool = False) -> Outcome:
        """What the server sends for ``outcome``: faulted when the plan says so (a ``slow`` one after ``slow_s``)."""
        kind = self.fault_for(call, outcome, in_session)
        if kind is None:
            return outcome
        if kind == "slow":
            await anyio.sleep(self.slow_s)  # on the event loop: a slow answer holds no worker thread
        return self.apply(outcome, kind)

    def mcp_kind(self, server: str, tool: str, api: str, key: str, outcome: Outcome) -> str | None:
        """The fault a live MCP server's tool call gets (:func:`mcp_faulted`), or ``None``.  The scope's names are the
        call's: ``categories`` ``@mcp``, ``tools`` the server's name, ``apis`` the tool's name or ``@mcp/<server>/<tool>``;
        the draw is ``(seed, api, key)`` as every call's."""
        if outcome.status != 200 or outcome.kind not in FAULTABLE or outcome.fault is not None:
            return None
        if self._categories and "@mcp" not in self._categories or self._tools and server not in self._tools:
            return None
        if self._apis and not self._apis & {tool, f"@mcp/{server}/{tool}", api}:
            return None
        return self.kind_for(api, key)

    def serve_blocking(self, call: ToolCall, outcome: Outcome) -> Outcome:
        """:meth:`serve` without the wait of a ``slow`` fault, for a caller without an event loop (``check --with-faults``
        in process)."""
        kind = self.fault_for(call, outcome)
        return outcome if kind is None else self.apply(outcome, kind)

    def describe(self) -> str:
        """One line for the start-up summary."""
        shares = ", ".join(f"{kind} {share:.0%}" for kind, share in zip(self.kinds, self.weights))
        scope = []
        for name, values in (("apis", self._apis), ("tools", self._tools), ("categories", self._categories)):
            if values:
                scope.append(f"{name} {', '.join(sorted(values))}")
        where = "; only " + "; ".join(scope) if scope else ""
        slow = f" (slow: {self.slow_s:g} s)" if "slow" in self.kinds else ""
        return f"seed {self.seed}, {self.rate:.1%} of calls: {shares}{slow}{where}; served only, never recorded"


def faulted_body(body: str, kind: str) -> str:
    """The body served for fault ``kind`` in place of the clean ``body``."""
    if kind in ERROR_KINDS:
        return protocol.encode_answer(protocol.answer(ERROR_KINDS[kind], ""))
    if kind == "empty":
        return protocol.encode_answer(protocol.answer("", ""))
    if kind == "truncated":
        return _truncated(body)
    if kind == "malformed":
        # a JSON object's text cut before its closing brace is never JSON: the client's "request invalid"
        return body[: max(1, len(body) // 2)]
    if kind == "slow":
        return body
    raise ValueError(f"unknown fault kind {kind!r}")


def mcp_faulted(body: str, kind: str) -> str:
    """The ``CallToolResult`` (JSON text) served for fault ``kind`` in place of the clean one ``body``: an error kind is an
    ``isError`` result whose text is StableToolBench's error text, ``empty`` a result without content, ``truncated``
    each text content cut in half (its ``structuredContent`` left out), ``malformed`` a text content holding the result's JSON cut in half (never valid
    JSON), ``slow`` the clean result."""
    if kind == "slow":
        return body
    if kind in ERROR_KINDS:
        return protocol.encode_answer({"content": [{"type": "text", "text": ERROR_KINDS[kind]}], "isError": True})
    if kind == "empty":
        return protocol.encode_answer({"content": []})
    if kind == "malformed":
        return protocol.encode_answer({"content": [{"type": "text", "text": body[: max(1, len(body) // 2)]}]})
    if kind != "truncated":
        raise ValueError(f"unknown fault kind {kind!r}")
    try:
        result: Any = json.loads(body)
    except ValueError:
        result = None
    if not isinstance(result, dict) or not isinstance(result.get("content"), list):
        return protocol.encode_answer({"content": [{"type": "text", "text": body[: len(body) // 2]}]})
    cut = [{**part, "text": part["text"][: len(part["text"]) // 2]}
           if isinstance(part, dict) and isinstance(part.get("text"), str) else part for part in result["content"]]
    kept = {name: value for name, value in result.items() if name != "structuredContent"}
    return protocol.encode_answer({**kept, "content": cut})


def _truncated(body: str) -> str:
    """The answer with its ``response`` text cut in half (a JSON response as its text)."""
    try:
        answer: Any = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return protocol.encode_answer(protocol.answer("", body[: len(body) // 2]))
    response = answer.get("response", "")
    text = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
    error = answer.get("error", "")
    return protocol.encode_answer(protocol.answer(error if isinstance(error, str) else "", text[: len(text) // 2]))


def wants_no_faults(headers: Any) -> bool:
    """Whether a request's ASGI headers ask for the unfaulted answer (``X-STM-Faults: off``, sent by ``check``)."""
    for name, value in headers:
        if name == NO_FAULTS_HEADER:
            return value.strip().lower() == NO_FAULTS_VALUE
    return False
