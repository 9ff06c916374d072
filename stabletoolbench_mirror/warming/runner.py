"""Making the calls of a plan in this process: ``concurrency`` threads through the layer's own chain."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stabletoolbench_mirror.config import Mode, Settings
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.stores import StoreError
from stabletoolbench_mirror.warming.plan import Failure, KindCounts, WarmInputError, WarmItem, WarmPlan, WarmReport, payload_of

log = logging.getLogger(__name__)

Handler = Callable[[ToolCall], Outcome]

#: a shorter GIL switch interval while warming: dozens of threads wait on sockets, and a
#: thread whose answer arrived should not wait the default 5 ms for its turn
SWITCH_INTERVAL_S = 0.001


def warm_settings(settings: Settings, concurrency: int) -> Settings:
    """The settings for a warming layer: record mode (``refresh`` kept: its records are asked again),
    room for ``concurrency`` misses in flight."""
    limits = settings.limits.model_copy(update={"max_pending_misses": max(settings.limits.max_pending_misses, concurrency)})
    simulator = settings.simulator.model_copy(update={"max_concurrency": max(settings.simulator.max_concurrency, concurrency)})
    updated = settings.model_copy(update={"mode": Mode.REFRESH if settings.mode is Mode.REFRESH else Mode.RECORD, "limits": limits, "simulator": simulator})
    updated.base_dir = settings.base_dir
    return updated


def split(layer: MirrorLayer, plan: WarmPlan) -> tuple[dict[str, KindCounts], list[WarmItem]]:
    """Per-input-kind counts with the already cached calls counted, and the calls still to make."""
    counts = plan.copy_counts()
    todo: list[WarmItem] = []
    for item in plan.items:
        try:
            # a failure record counts as cached only when record mode would not try it again
            cached = layer.settled(item.call)
        except StoreError as exc:
            raise WarmInputError(f"the store cannot be read: {exc}") from None
        if cached:
            counts[item.input_kind].cached += 1
        else:
            todo.append(item)
    return counts, todo


def failure_reason(outcome: Outcome) -> str:
    """Why a call failed: what each responder said (the cause), and the answer served."""
    text = _served_text(outcome)
    problems = outcome.problems
    if problems:
        return f"{outcome.kind}: {'; '.join(problems)}"[:800] + f" (answered: {text[:300]})"
    return f"{outcome.kind}: {text[:300]}"


def _served_text(outcome: Outcome) -> str:
    try:
        answer = outcome.answer
        return f"{answer.get('error', '')} {answer.get('response', '')}".strip()
    except (ValueError, AttributeError):
        return outcome.body


def failure_cause(outcome: Outcome, call: ToolCall) -> str:
    """What the early stop compares: why the responders failed, without the call's own traces.

    The served text names the API (``no recorded response for Category/tool/api``), so two
    calls of a dead simulator would never share a message; they share this.
    """
    problems = outcome.problems
    return same_cause(f"{outcome.kind}: {'; '.join(problems) if problems else _served_text(outcome)}"[:800], call)


def same_cause(text: str, call: ToolCall) -> str:
    """``text`` without the call's own API path (``Category/tool/api``), which differs from API to API."""
    return text.replace(call.api, "<api>") if call.api else text


#: the outcomes that leave the call's answer in the store
ANSWERED = (OutcomeKind.RECORDED, OutcomeKind.HIT, OutcomeKind.SHARED)


def make_call(handle: Handler, call: ToolCall) -> tuple[OutcomeKind | None, str, str]:
    """``(outcome kind, failure reason, failure cause)`` of one call; ``(None, why, why)`` when it raised.

    The reason is what the report lists; the cause (:func:`failure_cause`) what the early stop compares.
    """
    try:
        outcome = handle(call)
    except Exception as exc:  # noqa: BLE001 - one bad call must not end the run
        log.exception("warming %s failed", call.api)
        reason = f"error: {type(exc).__name__}: {exc}"
        return None, reason, same_cause(reason[:800], call)
    # a failure record (new, or served again) is a failed call: listed, and tried again by the next warm
    kind = OutcomeKind.FAILED if outcome.failure else OutcomeKind.RECORDED if outcome.kind is OutcomeKind.REPLACED else outcome.kind
    if kind in ANSWERED:
        return kind, "", ""
    return kind, failure_reason(outcome), failure_cause(outcome, call)


#: ``warm --stop-after-failures`` default: a run whose first this many calls all fail for one cause stops
STOP_AFTER_FAILURES = 5


class FirstCalls:
    """Watches the first ``n`` calls of a run: when every one failed for the same cause, the run should stop.

    A dead simulator or relay otherwise costs every call its timeouts and retries.  One success,
    or two different causes, among the first ``n`` and the run goes on to the end.
    """

    def __init__(self, n: int) -> None:
        self.n = max(0, n)
        self.seen = 0
        self.cause: str | None = None

    @staticmethod
    def _same(cause: str) -> str:
        # object addresses in exception texts differ from call to call
        return re.sub(r"0x[0-9a-fA-F]+", "0x", cause)

    def see(self, ok: bool, cause: str) -> str | None:
        """Count one finished call; the cause once the first ``n`` all failed for it, else ``None``.

        ``cause``: see :func:`failure_cause`; object addresses in it are not compared.
        """
        if self.seen >= self.n:
            return None
        self.seen += 1
        same = self._same(cause)
        if ok or (self.cause is not None and same != self.cause):
            self.seen = self.n  # decided: the run goes on
            return None
        self.cause = same
        return cause if self.seen == self.n else None


class Tracker:
    """Counts outcomes and drives the progress bar (thread-safe); sets ``stop`` when the first calls all fail alike."""

    def __init__(
        self,
        counts: dict[str, KindCounts],
        total: int,
        progress: bool,
        *,
        stop_after_failures: int = 0,
        stop: Any = None,
    ) -> None:
        self.counts = counts
        self.failures: list[Failure] = []
        self.attempted = 0
        self.stopped = ""
        # (a run no longer than that has nothing to save by stopping)
        self._first = FirstCalls(stop_after_failures if 0 < stop_after_failures < total else 0)
        self._stop = stop
        self._lock = threading.Lock()
        self._bar = progress_bar(total=total, desc="warm", unit="call", disable=not progress, dynamic_ncols=True, smoothing=0.1)

    def done(self, item: WarmItem, kind: OutcomeKind | None, reason: str, cause: str = "", *, made: bool = True) -> None:
        """Count one call; ``cause`` (:func:`failure_cause`, ``reason`` when not given) is what the early stop compares."""
        with self._lock:
            shared = self._first.see(not reason, cause or reason) if made else None
            if shared is not None:
                self.stopped = (
                    f"the first {self._first.n} calls all failed with the same cause: {shared}\n"
                    "fix it and run the same command again (calls already recorded are skipped)"
                )
                if self._stop is not None:
                    self._stop.set()
            self.attempted += 1 if made else 0
            c = self.counts[item.input_kind]
            if kind is OutcomeKind.RECORDED:
                c.new += 1
            elif kind in (OutcomeKind.HIT, OutcomeKind.SHARED):
                # cached already, or recorded meanwhile by another process
                c.cached += 1
            else:
                c.failed += 1
                self.failures.append(Failure(item.input_kind, item.location, reason, payload_of(item.call)))
            self._bar.update(1)
            if self.failures:
                self._bar.set_postfix(failed=len(self.failures), refresh=False)

    def report(self, plan: WarmPlan, started: float, interrupted: bool) -> WarmReport:
        self._bar.close()
        return WarmReport(
            counts=self.counts,
            failures=self.failures,
            skipped=list(plan.skipped),
            elapsed_s=time.monotonic() - started,
            attempted=self.attempted,
            interrupted=interrupted and not self.stopped,
            stopped=self.stopped,
        )


def run_warm(
    layer: MirrorLayer,
    plan: WarmPlan,
    *,
    concurrency: int = 8,
    progress: bool = True,
    stop_after_failures: int = 0,
) -> WarmReport:
    """Make every call of ``plan`` that the layer cannot answer yet, ``concurrency`` at a time, in this process.

    ``stop_after_failures``: stop early when the first this many calls all fail for the same cause.
    """
    counts, todo = split(layer, plan)
    stop = threading.Event()
    queue_lock = threading.Lock()
    queue = iter(todo)
    tracker = Tracker(counts, len(todo), progress, stop_after_failures=stop_after_failures, stop=stop)
    started = time.monotonic()

    def work() -> None:
        while not stop.is_set():
            with queue_lock:
                item = next(queue, None)
            if item is None:
                return
            kind, reason, cause = make_call(layer.handle_call, item.call)
            tracker.done(item, kind, reason, cause)

    threads = [threading.Thread(target=work, name=f"warm-{i}", daemon=True) for i in range(max(1, min(concurrency, len(todo) or 1)))]
    interrupted = False
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.2)
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
            for t in threads:
                t.join(timeout=30)
    finally:
        sys.setswitchinterval(previous)
    return tracker.report(plan, started, interrupted or (stop.is_set() and tracker.attempted < len(todo)))
