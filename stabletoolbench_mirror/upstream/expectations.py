"""What a reproducibility check replays: recorded calls with what was observed for each.

Two inputs, both read from StableToolBench's own files: a JSONL file of
``{"payload": <the /virtual body>, "observed": <the answer or the observation text>}`` lines, and
StableToolBench answer files (each call's arguments and recorded observation).  ``check`` replays
them; ``fidelity`` scores a simulator against them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.naming import resolve_names
from stabletoolbench_mirror.upstream.answers import iter_answer_calls
from stabletoolbench_mirror.upstream.queries import QueryFileError, iter_jsonl


class CheckInputError(ValueError):
    """A calls file or answer file that cannot be used."""


@dataclass(frozen=True)
class Expectation:
    """One call to replay and what was observed for it."""

    payload: dict[str, Any]
    observed: Any
    """An answer object, or (``text=True``) the observation text the agent saw."""
    location: str
    """``file:line`` of a calls file, or where in an answer file the call is recorded."""
    text: bool = False

    @property
    def api(self) -> str:
        try:
            return resolve_names(
                str(self.payload.get("category", "")), str(self.payload.get("tool_name", "")), str(self.payload.get("api_name", ""))
            ).api
        except Exception:  # noqa: BLE001 - a malformed payload still gets a report line
            return "?"


def load_calls_jsonl(path: str | Path) -> list[Expectation]:
    """``{"payload", "observed"}`` lines; blank lines are skipped, a bad line is an error naming it."""
    return list(iter_calls_jsonl(path))


def iter_calls_jsonl(path: str | Path) -> Iterator[Expectation]:
    """:func:`load_calls_jsonl` one line at a time (flat memory for any number of calls)."""
    try:
        for location, item in iter_jsonl(path):
            if isinstance(item, ValueError):
                raise CheckInputError(f"{location}: {item}")
            if not isinstance(item, dict) or not isinstance(item.get("payload"), dict) or "observed" not in item:
                raise CheckInputError(f'{location}: expected an object with "payload" (object) and "observed"')
            observed = item["observed"]
            yield Expectation(item["payload"], observed, location, text=isinstance(observed, str))
    except QueryFileError as exc:
        raise CheckInputError(str(exc)) from None


def load_answer_expectations(paths: Iterable[str | Path], index: Any) -> tuple[list[Expectation], list[str]]:
    """Expectations from answer files: every call with a recorded observation whose function resolves."""
    out: list[Expectation] = []
    problems: list[str] = []
    try:
        for found in iter_answer_calls(paths, index):
            if found.file_error:
                problems.append(found.problem)
            elif found.observation is None:
                continue
            elif found.payload is None:
                problems.append(f"{found.location}: {found.problem}")
            else:
                out.append(Expectation(found.payload, found.observation, found.location, text=True))
    except ValueError as exc:
        raise CheckInputError(str(exc)) from None
    return out, problems
