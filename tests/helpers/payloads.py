"""``/virtual`` bodies made from the reference solvable queries, as StableToolBench's client posts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio

from stabletoolbench_mirror.core.outcomes import Outcome
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.upstream.queries import default_calls


def answer_payload(layer: MirrorLayer, payload: Any) -> Outcome:
    """A decoded ``/virtual`` body answered as the server answers it: :meth:`MirrorLayer.prepare`, then
    :meth:`MirrorLayer.answer_async` (the server's one entry per call)."""
    prepared = layer.prepare(payload)
    return prepared if isinstance(prepared, Outcome) else anyio.run(layer.answer_async, prepared)


def distinct_default_payloads(reference_dir: Path, n: int | None = None) -> list[dict[str, Any]]:
    """The distinct default calls of the solvable queries (the first ``n`` when given), one body each."""
    calls, _problems = default_calls([reference_dir / "solvable_queries"])
    seen: set[tuple[str, str]] = set()
    payloads: list[dict[str, Any]] = []
    for item in calls:
        call = item.call
        if (call.api, call.key) in seen:
            continue
        seen.add((call.api, call.key))
        payloads.append({"category": call.category, "tool_name": call.tool_name, "api_name": call.api_name,
                         "tool_input": json.dumps(call.tool_input), "strip": "truncate", "toolbench_key": ""})
        if len(payloads) == n:
            break
    return payloads
