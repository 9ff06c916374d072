"""Reading warm's inputs into a :class:`~.plan.WarmPlan`.

* ``queries``: StableToolBench query files or folders; one *default call* per API of each
  query's ``api_list`` (see :mod:`stabletoolbench_mirror.upstream.queries`);
* ``answers``: answer files or folders; every call the agent made (see
  :mod:`stabletoolbench_mirror.upstream.answers`), mapped back to its API through a function index;
* ``payloads``: JSONL of ``/virtual`` bodies, or ``{"payload": ...}`` lines such as the
  failures file a previous ``warm`` wrote.

Bodies read from answer and payload files are prepared exactly as the server prepares a
request (``prepare``, normally :meth:`MirrorLayer.prepare`), so a call the server would
answer without the cache (``chat_with_user``, a ``tool_input`` that is not JSON, an
invalid body) is skipped with the server's own reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.outcomes import OutcomeKind
from stabletoolbench_mirror.upstream.answers import iter_answer_calls
from stabletoolbench_mirror.upstream.queries import FunctionIndex, QueryFileError, default_calls, iter_jsonl
from stabletoolbench_mirror.warming.plan import WarmInputError, WarmPlan

#: a decoded ``/virtual`` body -> its call, or the final answer the server gives it without the cache
Prepare = Callable[[Any], Any]


def add_queries(plan: WarmPlan, paths: Sequence[str], *, include_optional: bool) -> None:
    try:
        calls, problems = default_calls(paths, include_optional=include_optional)
    except QueryFileError as exc:
        raise WarmInputError(str(exc)) from None
    for problem in problems:
        plan.skip("queries", problem.location, problem.message)
    for item in calls:
        plan.add("queries", item.location, item.call)


def add_answers(plan: WarmPlan, paths: Sequence[str], index: FunctionIndex, prepare: Prepare) -> None:
    try:
        for found in iter_answer_calls(paths, index):
            if found.payload is None:
                plan.skip("answers", found.location, found.problem)
            else:
                add_payload(plan, "answers", found.location, found.payload, prepare)
    except ValueError as exc:  # a path that does not exist
        raise WarmInputError(str(exc)) from None


def add_payloads(plan: WarmPlan, paths: Sequence[str], prepare: Prepare) -> None:
    for path in paths:
        try:
            for location, item in iter_jsonl(path):
                if isinstance(item, ValueError):
                    plan.skip("payloads", location, str(item))
                    continue
                wrapped = isinstance(item, dict) and isinstance(item.get("payload"), dict)
                add_payload(plan, "payloads", location, item["payload"] if wrapped else item, prepare)
        except QueryFileError as exc:
            raise WarmInputError(str(exc)) from None


def add_payload(plan: WarmPlan, input_kind: str, location: str, payload: Any, prepare: Prepare) -> None:
    """Add the call of a ``/virtual`` body as the server prepares it, or skip it with the server's reason."""
    if isinstance(payload, dict):
        payload = {**payload, "toolbench_key": ""}  # warming never carries a key of its own into a call
    prepared = prepare(payload)
    if isinstance(prepared, ToolCall):
        plan.add(input_kind, location, prepared)
    else:
        plan.skip(input_kind, location, refusal_reason(prepared), payload if isinstance(payload, dict) else None)


def refusal_reason(outcome: Any) -> str:
    """Why the server answers a body without the cache (an :class:`~stabletoolbench_mirror.engine.layer.Outcome`)."""
    if outcome.kind is OutcomeKind.LOCAL:
        return "chat_with_user is answered locally"
    try:
        error = str(outcome.answer.get("error", "")).strip()
    except (ValueError, AttributeError):
        error = outcome.body
    return f"not a call the server looks up: {error[:300]}"
