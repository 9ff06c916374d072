"""What ``warm`` works on: the distinct calls to make (the plan) and what became of them (the report)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.upstream.answers import answer_payload
from stabletoolbench_mirror.upstream.queries import ApiRef

#: the kinds of input warm reads: query files, answer files, JSONL of /virtual bodies
INPUT_KINDS = ("queries", "answers", "payloads")


class WarmInputError(ValueError):
    """An input that cannot be read, or a store that cannot be: the run cannot start (the command exits with 2)."""


@dataclass(frozen=True)
class WarmItem:
    input_kind: str
    """``queries``, ``answers`` or ``payloads``: the kind of input the call was first found in."""
    location: str
    """Where: ``file#query_id/api``, ``file:path.in.file`` or ``file:line``."""
    call: ToolCall


@dataclass
class KindCounts:
    """The calls of one input kind and what became of them (a row of the summary table)."""

    calls: int = 0
    """Distinct calls first seen in inputs of this kind."""
    new: int = 0
    cached: int = 0
    failed: int = 0
    skipped: int = 0
    """Calls that never reach the store: unparsable arguments, ``chat_with_user``, unknown functions."""


@dataclass
class Failure:
    """A call that failed or was skipped, with the ``/virtual`` body to retry it (``--failures`` file)."""

    input_kind: str
    location: str
    reason: str
    payload: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"input_kind": self.input_kind, "location": self.location, "reason": self.reason}
        if self.payload is not None:
            data["payload"] = self.payload
        return data


def payload_of(call: ToolCall) -> dict[str, Any]:
    """A ``/virtual`` body for ``call`` (no key), as the client would send it."""
    return answer_payload(ApiRef(call.category, call.tool_name, call.api_name), json.dumps(call.tool_input, ensure_ascii=False))


def fresh_counts() -> dict[str, KindCounts]:
    return {kind: KindCounts() for kind in INPUT_KINDS}


@dataclass
class WarmPlan:
    """The distinct calls to warm, in input order, and what was skipped while collecting them."""

    items: list[WarmItem] = field(default_factory=list)
    counts: dict[str, KindCounts] = field(default_factory=fresh_counts)
    skipped: list[Failure] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def add(self, input_kind: str, location: str, call: ToolCall) -> bool:
        ident = (call.api, call.canonical)
        if ident in self._seen:
            return False
        self._seen.add(ident)
        self.items.append(WarmItem(input_kind, location, call))
        self.counts[input_kind].calls += 1
        return True

    def skip(self, input_kind: str, location: str, reason: str, payload: dict[str, Any] | None = None) -> None:
        self.counts[input_kind].skipped += 1
        self.skipped.append(Failure(input_kind, location, reason, payload))

    def copy_counts(self) -> dict[str, KindCounts]:
        return {kind: KindCounts(**vars(c)) for kind, c in self.counts.items()}


@dataclass
class WarmReport:
    counts: dict[str, KindCounts]
    failures: list[Failure]
    skipped: list[Failure]
    elapsed_s: float = 0.0
    attempted: int = 0
    interrupted: bool = False
    stopped: str = ""
    """Why the run stopped early (its first calls all failed for one cause), or empty."""

    @property
    def total(self) -> KindCounts:
        return KindCounts(**{f.name: sum(getattr(c, f.name) for c in self.counts.values()) for f in fields(KindCounts)})

    def as_json(self) -> dict[str, Any]:
        """``warm --json``: the table's rows (``by_input``, ``total``), the calls made, every failure and skip."""
        return {
            "by_input": {name: vars(c).copy() for name, c in self.counts.items() if c.calls or c.skipped},
            "total": vars(self.total).copy(),
            "attempted": self.attempted,
            "elapsed_s": round(self.elapsed_s, 3),
            "interrupted": self.interrupted,
            "stopped": self.stopped or None,
            "failures": [f.as_json() for f in self.failures],
            "skipped": [f.as_json() for f in self.skipped],
        }

    def table(self) -> str:
        header = f"{'input':<10} {'calls':>8} {'new':>8} {'cached':>8} {'failed':>8} {'skipped':>8}"
        rows = [header, "-" * len(header)]
        for name, c in list(self.counts.items()) + [("total", self.total)]:
            if name != "total" and not (c.calls or c.skipped):
                continue
            rows.append(f"{name:<10} {c.calls:>8} {c.new:>8} {c.cached:>8} {c.failed:>8} {c.skipped:>8}")
        rate = self.attempted / self.elapsed_s if self.elapsed_s > 0 else 0.0
        rows.append(f"{self.attempted} calls made in {self.elapsed_s:.1f} s ({rate:.1f} calls/s)")
        if self.interrupted:
            rows.append("interrupted: run the same command again to resume")
        if self.stopped:
            rows.append(f"stopped early: {self.stopped}")
        return "\n".join(rows)
