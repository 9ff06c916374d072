"""Replaying recorded calls and judging the answers: what ``check`` computes (the command is :mod:`stabletoolbench_mirror.commands.check`).

Each call is sent to a target (the layer in this process, :class:`LayerTarget`, or a running server, :class:`UrlTarget`), the answer
compared with what was observed as the StableToolBench client would see it, and counted per API as **identical**,
**different** or a **miss**; of the identical ones, how many are failures (``identical_failure``).
"""

from __future__ import annotations

import enum
import json
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from stabletoolbench_mirror.client import Client, MirrorError
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.protocol import answer as make_answer
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.upstream.answers import DEFAULT_MAX_OBSERVATION_LENGTH, observation_text
from stabletoolbench_mirror.upstream.expectations import CheckInputError, Expectation


class Verdict(enum.StrEnum):
    """What a replayed call gave, compared with what was observed."""

    IDENTICAL = "identical"
    DIFFERENT = "different"
    MISS = "miss"
    """Nothing recorded for the call (the target answered ``unanswered``)."""


IDENTICAL, DIFFERENT, MISS = Verdict.IDENTICAL, Verdict.DIFFERENT, Verdict.MISS
VERDICTS = tuple(Verdict)
#: counted besides the verdicts: the identical answers that are failures (both runs saw the same failure)
IDENTICAL_FAILURE = "identical_failure"
COUNTS = (IDENTICAL, IDENTICAL_FAILURE, DIFFERENT, MISS)


@dataclass(frozen=True)
class TargetReply:
    """What a target answered: HTTP status, body text and (for this project's server) the outcome kind."""

    status: int
    body: str
    outcome: str | None = None
    failure: bool | None = None
    """Whether the answer is a failure, as this project's server says (``X-STM-Failure``); ``None``: unknown."""


class Target(Protocol):
    def send(self, payload: dict[str, Any]) -> TargetReply: ...

    def close(self) -> None: ...


class LayerTarget:
    """The mirror layer in this process."""

    def __init__(self, layer: MirrorLayer, *, with_faults: bool = False) -> None:
        self.layer = layer
        self.faults = layer.faults if with_faults else None
        """``check --with-faults``: the layer's faults applied as the server applies them (a slow one without the wait)."""

    def send(self, payload: dict[str, Any]) -> TargetReply:
        prepared = self.layer.prepare(payload)
        if isinstance(prepared, Outcome):
            outcome = prepared
        else:
            outcome = self.layer.handle_call(prepared)
            if self.faults is not None:
                outcome = self.faults.serve_blocking(prepared, outcome)
        return TargetReply(outcome.status, outcome.body, outcome.kind, outcome.failure or outcome.fault is not None)

    def close(self) -> None:
        self.layer.close()


# -- comparing ------------------------------------------------------------------------------------


def client_answer(reply: TargetReply) -> Any:
    """The answer object the StableToolBench client makes of a reply (its exact error texts)."""
    if reply.status != 200:
        return make_answer(f"request invalid, data error. status_code={reply.status}", "")
    try:
        return json.loads(reply.body)
    except ValueError:
        return make_answer("request invalid, data error", "")


def is_failure(reply: TargetReply) -> bool:
    """Whether a reply's answer is a failure: as the server says, else an answer with a non-empty ``error``."""
    if reply.failure is not None:
        return reply.failure
    got = client_answer(reply)
    return not isinstance(got, dict) or bool(got.get("error"))


def verdict(expectation: Expectation, reply: TargetReply, max_observation_length: int = DEFAULT_MAX_OBSERVATION_LENGTH) -> Verdict:
    if reply.outcome == OutcomeKind.UNANSWERED:
        return MISS
    got = client_answer(reply)
    if expectation.text:
        same = observation_text(got, max_observation_length) == expectation.observed
    else:
        try:
            same = encode_answer(got) == encode_answer(expectation.observed)
        except (TypeError, ValueError):
            same = False
    return IDENTICAL if same else DIFFERENT


@dataclass
class Mismatch:
    location: str
    api: str
    tool_input: str
    verdict: Verdict
    expected: str
    got: str


#: mismatches kept in detail (the counts per API always cover every call)
MAX_MISMATCHES = 10_000


@dataclass
class CheckReport:
    per_api: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    mismatches: list[Mismatch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    mismatches_left_out: int = 0
    seconds: float = 0.0

    @property
    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.per_api.values():
            total.update(counts)
        return total

    @property
    def calls(self) -> int:
        totals = self.totals
        return sum(totals[v] for v in VERDICTS)

    def ok(self) -> bool:
        totals = self.totals
        return totals[DIFFERENT] == 0 and totals[MISS] == 0

    def to_json(self) -> dict[str, Any]:
        totals = self.totals
        return {
            "calls": self.calls,
            "totals": {v: totals[v] for v in COUNTS},
            "identical_fraction": (totals[IDENTICAL] / self.calls) if self.calls else None,
            "per_api": {api: {v: c[v] for v in COUNTS} for api, c in sorted(self.per_api.items())},
            "mismatches": [m.__dict__ for m in self.mismatches],
            "mismatches_left_out": self.mismatches_left_out,
            "problems": self.problems,
            "seconds": round(self.seconds, 3),
        }

    def lines(self, *, max_details: int = 20) -> list[str]:
        totals = self.totals
        n = self.calls
        share = f"{100.0 * totals[IDENTICAL] / n:.1f}%" if n else "n/a"
        width = max([len(api) for api in self.per_api] + [3])
        out = [f"{'API':<{width}}  {'identical':>9}  {'failures':>8}  {'different':>9}  {'miss':>5}"]
        for api, counts in sorted(self.per_api.items()):
            out.append(f"{api:<{width}}  {counts[IDENTICAL]:>9}  {counts[IDENTICAL_FAILURE]:>8}  {counts[DIFFERENT]:>9}  {counts[MISS]:>5}")
        out.append(f"{'total':<{width}}  {totals[IDENTICAL]:>9}  {totals[IDENTICAL_FAILURE]:>8}  {totals[DIFFERENT]:>9}  {totals[MISS]:>5}")
        out.append(f"{n} calls: {totals[IDENTICAL]} identical ({share}), {totals[DIFFERENT]} different, {totals[MISS]} miss")
        failures = totals[IDENTICAL_FAILURE]
        out.append(f"identical: {totals[IDENTICAL] - failures} answers, {failures} failures")
        if self.seconds:
            out.append(f"time: {self.seconds:.1f} s ({n / self.seconds:,.0f} calls/s)")
        for m in self.mismatches[:max_details]:
            out.append(f"{m.verdict.upper()} {m.api} input={m.tool_input[:200]} ({m.location})")
            if m.verdict == DIFFERENT:
                out.append(f"    expected: {m.expected[:300]}")
                out.append(f"    got:      {m.got[:300]}")
        if len(self.mismatches) > max_details:
            out.append(f"... and {len(self.mismatches) - max_details} more (see --json)")
        if self.problems:
            out.append(f"{len(self.problems)} calls could not be checked:")
            out.extend(f"  {p}" for p in self.problems[:max_details])
        return out


def run_check(
    expectations: Iterable[Expectation],
    target: Target,
    *,
    max_observation_length: int = DEFAULT_MAX_OBSERVATION_LENGTH,
    report: CheckReport | None = None,
    concurrency: int = 1,
    progress: bool = False,
    total: int | None = None,
) -> CheckReport:
    """Send every expectation to ``target`` (``concurrency`` at a time) and count the verdicts.

    Expectations are read as they are sent and results taken in input order, so memory stays
    flat for any number of calls and the report does not depend on the concurrency.
    """
    from stabletoolbench_mirror.core.progress import progress_bar

    report = report or CheckReport()
    started = time.perf_counter()
    with progress_bar(total=total, desc="check", unit="call", disable=not progress) as bar:
        if concurrency <= 1:
            for expectation in expectations:
                _judge(report, expectation, target.send(expectation.payload), max_observation_length)
                bar.update(1)
        else:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                pending: deque[tuple[Expectation, Future[TargetReply]]] = deque()
                for expectation in expectations:
                    pending.append((expectation, pool.submit(target.send, expectation.payload)))
                    if len(pending) >= 4 * concurrency:
                        done, future = pending.popleft()
                        _judge(report, done, future.result(), max_observation_length)
                        bar.update(1)
                while pending:
                    done, future = pending.popleft()
                    _judge(report, done, future.result(), max_observation_length)
                    bar.update(1)
    report.seconds += time.perf_counter() - started
    return report


def _judge(report: CheckReport, expectation: Expectation, reply: TargetReply, max_observation_length: int) -> None:
    result = verdict(expectation, reply, max_observation_length)
    api = expectation.api
    report.per_api[api][result] += 1
    if result == IDENTICAL:
        if is_failure(reply):
            report.per_api[api][IDENTICAL_FAILURE] += 1
        return
    if len(report.mismatches) >= MAX_MISMATCHES:
        report.mismatches_left_out += 1
        return
    got = client_answer(reply)
    report.mismatches.append(
        Mismatch(
            location=expectation.location,
            api=api,
            tool_input=str(expectation.payload.get("tool_input", "")),
            verdict=result,
            expected=expectation.observed if expectation.text else json.dumps(expectation.observed, ensure_ascii=False),
            got=observation_text(got, max_observation_length) if expectation.text else json.dumps(got, ensure_ascii=False),
        )
    )


class UrlTarget:
    """A running ``/virtual`` server (this project's or upstream's), through :class:`~stabletoolbench_mirror.client.Client`."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 300.0, with_faults: bool = False,
                 connections: int = 10) -> None:
        try:
            self.client = Client(url, token=token, timeout=timeout_s, connections=connections)
        except MirrorError:
            raise CheckInputError(f"--url must be http://HOST:PORT or https://HOST:PORT (got {url!r})") from None
        self.url = self.client.url + "/virtual"
        self.with_faults = with_faults  # else compared with the unfaulted record (this project's server leaves its faults out)

    def send(self, payload: dict[str, Any]) -> TargetReply:
        try:
            reply = self.client.call(payload, faults=self.with_faults)
        except MirrorError as exc:
            raise CheckInputError(f"cannot reach {self.url}: {exc.reason}") from None
        outcome = reply.headers.get("X-STM-Outcome")
        # this project's server says whether an answer is a failure; another's is judged by content
        failure = None if outcome is None else reply.headers.get("X-STM-Failure") == "true" or bool(reply.headers.get("X-STM-Fault"))
        return TargetReply(reply.status, reply.body, outcome, failure)

    def close(self) -> None:
        self.client.close()
