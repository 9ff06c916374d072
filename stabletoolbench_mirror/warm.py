"""Offline cache warming: fill the store with the calls a benchmark run will make, before it runs.

Sources:

* ``--queries``: StableToolBench query files or folders; one *default call* per API of each
  query's ``api_list`` (see :mod:`stabletoolbench_mirror.queries` for how the agent's own
  default call is keyed and typed);
* ``--answers``: StableToolBench / ToolBench answer files or folders; every call the agent
  made (see :mod:`stabletoolbench_mirror.answers`);
* ``--payloads``: JSONL of ``/virtual`` bodies (or ``{"payload": ...}`` lines, such as the
  failures file a previous ``warm`` wrote).

Identical calls are made once.  Calls already answered by the store or a frozen cache are
skipped, so an interrupted run resumes where it stopped: each answer is recorded the moment
it arrives (an atomic add-if-absent), and a killed run leaves no partial entry.  The rest go
through :meth:`MirrorLayer.handle_call` (the server's own real API -> simulator chain) with
``--concurrency`` calls in flight.  Failures are listed (and written with ``--failures``),
never recorded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue as queue_module
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from .answers import answer_payload, iter_answer_files, read_answer_file
from .call import ToolCall
from .layer import MirrorLayer, Outcome
from .naming import resolve_names
from .protocol import CHAT_WITH_USER_API, ToolInputParseError, VirtualRequest, parse_tool_input
from .queries import FunctionIndex, QueryFileError, default_calls
from .stores import StoreError

log = logging.getLogger(__name__)

SOURCES = ("queries", "answers", "payloads")


class WarmInputError(ValueError):
    """A source that cannot be read."""


@dataclass(frozen=True)
class WarmItem:
    source: str
    origin: str
    call: ToolCall


@dataclass
class SourceCounts:
    calls: int = 0
    """Distinct calls first seen in this source."""
    new: int = 0
    cached: int = 0
    failed: int = 0
    skipped: int = 0
    """Calls that never reach the store: unparsable arguments, ``chat_with_user``, unknown functions."""


@dataclass
class Failure:
    source: str
    origin: str
    reason: str
    payload: dict[str, Any] | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {"source": self.source, "origin": self.origin, "reason": self.reason}
        if self.payload is not None:
            data["payload"] = self.payload
        return json.dumps(data, ensure_ascii=False)


@dataclass
class WarmPlan:
    """The distinct calls to warm, in source order, and what was skipped while collecting them."""

    items: list[WarmItem] = field(default_factory=list)
    counts: dict[str, SourceCounts] = field(default_factory=lambda: {s: SourceCounts() for s in SOURCES})
    skipped: list[Failure] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def add(self, source: str, origin: str, call: ToolCall) -> bool:
        ident = (call.namespace, call.canonical)
        if ident in self._seen:
            return False
        self._seen.add(ident)
        self.items.append(WarmItem(source, origin, call))
        self.counts[source].calls += 1
        return True

    def skip(self, source: str, origin: str, reason: str, payload: dict[str, Any] | None = None) -> None:
        self.counts[source].skipped += 1
        self.skipped.append(Failure(source, origin, reason, payload))


@dataclass
class WarmReport:
    counts: dict[str, SourceCounts]
    failures: list[Failure]
    skipped: list[Failure]
    elapsed_s: float = 0.0
    attempted: int = 0
    interrupted: bool = False

    @property
    def total(self) -> SourceCounts:
        total = SourceCounts()
        for c in self.counts.values():
            for name in ("calls", "new", "cached", "failed", "skipped"):
                setattr(total, name, getattr(total, name) + getattr(c, name))
        return total

    def table(self) -> str:
        header = f"{'source':<10} {'calls':>8} {'new':>8} {'cached':>8} {'failed':>8} {'skipped':>8}"
        rows = [header, "-" * len(header)]
        for name, c in list(self.counts.items()) + [("total", self.total)]:
            if name != "total" and not (c.calls or c.skipped):
                continue
            rows.append(f"{name:<10} {c.calls:>8} {c.new:>8} {c.cached:>8} {c.failed:>8} {c.skipped:>8}")
        rate = self.attempted / self.elapsed_s if self.elapsed_s > 0 else 0.0
        rows.append(f"{self.attempted} calls made in {self.elapsed_s:.1f} s ({rate:.1f} calls/s)")
        if self.interrupted:
            rows.append("interrupted: run the same command again to resume")
        return "\n".join(rows)


# -- collecting the calls ---------------------------------------------------------------------------


def call_of_payload(payload: Any) -> tuple[ToolCall | None, str]:
    """The call a ``/virtual`` body makes, or ``None`` and why it never reaches the store."""
    if not isinstance(payload, dict):
        return None, "not a JSON object"
    try:
        request = VirtualRequest.model_validate(payload)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError and friends
        return None, f"invalid /virtual body: {exc}".splitlines()[0]
    names = resolve_names(request.category, request.tool_name, request.api_name)
    if names.api == CHAT_WITH_USER_API:
        return None, "chat_with_user is answered locally"
    try:
        tool_input = parse_tool_input(request.tool_input)
    except ToolInputParseError:
        return None, "tool_input is not JSON (upstream answers a parse error)"
    # warming never carries a key of its own into the call
    request = request.model_copy(update={"toolbench_key": ""})
    return ToolCall.build(request, tool_input, names), ""


def add_query_sources(plan: WarmPlan, paths: Sequence[str], *, include_optional: bool) -> None:
    try:
        calls, problems = default_calls(paths, include_optional=include_optional)
    except QueryFileError as exc:
        raise WarmInputError(str(exc)) from None
    for problem in problems:
        plan.skip("queries", problem.origin, problem.message)
    for item in calls:
        plan.add("queries", item.origin, item.call)


def add_answer_sources(plan: WarmPlan, paths: Sequence[str], index: FunctionIndex) -> None:
    try:
        files = list(iter_answer_files(paths))
    except ValueError as exc:
        raise WarmInputError(str(exc)) from None
    for path in files:
        try:
            calls = read_answer_file(path)
        except ValueError as exc:
            plan.skip("answers", str(path), str(exc))
            continue
        for found in calls:
            ref, reason = index.resolve(found.function, found.query_id)
            if ref is None:
                plan.skip("answers", found.origin, reason)
                continue
            payload = answer_payload(ref, found.arguments)
            call, reason = call_of_payload(payload)
            if call is None:
                plan.skip("answers", found.origin, reason, payload)
                continue
            plan.add("answers", found.origin, call)


def add_payload_sources(plan: WarmPlan, paths: Sequence[str]) -> None:
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise WarmInputError(f"{path}: cannot read: {exc}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            origin = f"{path}:{number}"
            try:
                item = json.loads(line)
            except ValueError as exc:
                plan.skip("payloads", origin, f"not JSON: {exc}")
                continue
            payload = item.get("payload") if isinstance(item, dict) and isinstance(item.get("payload"), dict) else item
            call, reason = call_of_payload(payload)
            if call is None:
                plan.skip("payloads", origin, reason)
                continue
            plan.add("payloads", origin, call)


def payload_of(call: ToolCall) -> dict[str, Any]:
    """A ``/virtual`` body for ``call`` (no key), e.g. for the failures file."""
    return {
        "category": call.category,
        "tool_name": call.tool_name,
        "api_name": call.api_name,
        "tool_input": json.dumps(call.tool_input, ensure_ascii=False),
        "strip": "",
        "toolbench_key": "",
    }


# -- running ----------------------------------------------------------------------------------------


def _reason(outcome: Outcome) -> str:
    try:
        answer = outcome.answer
        text = f"{answer.get('error', '')} {answer.get('response', '')}".strip()
    except (ValueError, AttributeError):
        text = outcome.body
    return f"{outcome.kind}: {text[:300]}"


Handler = Callable[[ToolCall], Outcome]

#: a shorter GIL switch interval while warming: dozens of threads wait on sockets, and a
#: thread whose answer arrived should not wait the default 5 ms for its turn
SWITCH_INTERVAL_S = 0.001


def warm_layer(settings: Any) -> MirrorLayer:
    """The layer ``warm`` uses: the server's chain from ``settings`` (see :func:`warm_settings`)."""
    return MirrorLayer.from_settings(settings)


def _split(layer: MirrorLayer, plan: WarmPlan) -> tuple[dict[str, SourceCounts], list[WarmItem]]:
    """Per-source counts with the already cached calls counted, and the calls still to make."""
    counts = {s: SourceCounts(**vars(c)) for s, c in plan.counts.items()}
    todo: list[WarmItem] = []
    for item in plan.items:
        try:
            cached = layer.settled(item.call)
        except StoreError as exc:
            raise WarmInputError(f"the store cannot be read: {exc}") from None
        if cached:
            counts[item.source].cached += 1
        else:
            todo.append(item)
    return counts, todo


class _Tracker:
    """Counts outcomes and drives the progress bar (thread-safe)."""

    def __init__(self, counts: dict[str, SourceCounts], total: int, progress: bool) -> None:
        self.counts = counts
        self.failures: list[Failure] = []
        self.attempted = 0
        self._lock = threading.Lock()
        self._bar = tqdm(total=total, desc="warm", unit="call", disable=not progress, dynamic_ncols=True, smoothing=0.1)

    def done(self, item: WarmItem, kind: str | None, reason: str, *, made: bool = True) -> None:
        with self._lock:
            self.attempted += 1 if made else 0
            c = self.counts[item.source]
            if kind == "recorded":
                c.new += 1
            elif kind == "hit":
                c.cached += 1
            else:
                c.failed += 1
                self.failures.append(Failure(item.source, item.origin, reason, payload_of(item.call)))
            self._bar.update(1)
            if self.failures:
                self._bar.set_postfix(failed=len(self.failures), refresh=False)

    def close(self) -> None:
        self._bar.close()


def _handle(handle: Handler, call: ToolCall) -> tuple[str | None, str]:
    try:
        outcome = handle(call)
    except Exception as exc:  # noqa: BLE001 - one bad call must not end the run
        log.exception("warming %s failed", call.namespace)
        return None, f"error: {type(exc).__name__}: {exc}"
    # a failure record (new or served again) is a failed call: listed, to be warmed again
    kind = "failed" if outcome.failure else "recorded" if outcome.kind == "replaced" else outcome.kind
    return kind, "" if kind in ("recorded", "hit") else _reason(outcome)


def run_warm(
    layer: MirrorLayer,
    plan: WarmPlan,
    *,
    concurrency: int = 8,
    progress: bool = True,
    handler: Handler | None = None,
    stop: threading.Event | None = None,
    switch_interval: float | None = SWITCH_INTERVAL_S,
) -> WarmReport:
    """Make every call of ``plan`` that the layer cannot answer yet, ``concurrency`` at a time, in this process."""
    handle = handler or layer.handle_call
    counts, todo = _split(layer, plan)
    stop = stop or threading.Event()
    queue_lock = threading.Lock()
    queue = iter(todo)
    tracker = _Tracker(counts, len(todo), progress)
    started = time.monotonic()

    def work() -> None:
        while not stop.is_set():
            with queue_lock:
                item = next(queue, None)
            if item is None:
                return
            kind, reason = _handle(handle, item.call)
            tracker.done(item, kind, reason)

    previous_interval = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    threads = [threading.Thread(target=work, name=f"warm-{i}", daemon=True) for i in range(max(1, min(concurrency, len(todo) or 1)))]
    interrupted = False
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
        sys.setswitchinterval(previous_interval)
        tracker.close()
    return WarmReport(
        counts=tracker.counts,
        failures=tracker.failures,
        skipped=list(plan.skipped),
        elapsed_s=time.monotonic() - started,
        attempted=tracker.attempted,
        interrupted=interrupted or (stop.is_set() and tracker.attempted < len(todo)),
    )


# -- several processes -------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the warm process dies (even by SIGKILL)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(settings_json: str, threads: int, tasks: Any, results: Any, stop: Any, parent_pid: int) -> None:
    """One warming process: ``threads`` threads take calls from ``tasks`` and report to ``results``."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates Ctrl-C
    if os.getppid() != parent_pid:
        return
    from .cli import deserialize_settings

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    layer = warm_layer(deserialize_settings(settings_json))

    def work() -> None:
        while not stop.is_set():
            try:
                task = tasks.get(timeout=1.0)
            except queue_module.Empty:
                if os.getppid() != parent_pid:
                    return
                continue
            if task is None:
                return
            index, call = task
            kind, reason = _handle(layer.handle_call, call)
            # short messages: one atomic pipe write each, so a kill cannot leave half a message
            results.put((index, kind, reason[:1000]))

    pool = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    layer.close()


def run_warm_processes(
    settings: Any,
    plan: WarmPlan,
    *,
    concurrency: int,
    processes: int,
    progress: bool = True,
) -> WarmReport:
    """Like :func:`run_warm` with the calls spread over ``processes`` worker processes.

    One Python process tops out at several hundred calls per second (the GIL); the
    workers share the store (diskcache and Redis are safe across processes) and each
    runs its share of the ``concurrency`` threads.
    """
    import multiprocessing

    from .cli import serialize_settings

    lookup_layer = warm_layer(settings.model_copy(update={"real": settings.real.model_copy(update={"enabled": False}), "simulator": settings.simulator.model_copy(update={"enabled": False})}))
    try:
        counts, todo = _split(lookup_layer, plan)
    finally:
        lookup_layer.close()
    started = time.monotonic()
    processes = max(1, min(processes, len(todo) or 1))
    shares = [max(1, concurrency // processes + (1 if i < concurrency % processes else 0)) for i in range(processes)]
    # fork where there is one: the workers start in milliseconds with everything imported
    # (no thread runs in this process yet, and each worker opens its own store connection)
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    # each worker has queues of its own: a worker killed while it holds a queue's lock (kill -9,
    # the OOM killer) then blocks no other worker, and the calls it had not answered are handed
    # to the others (a call it made without telling us is found cached, not made twice)
    stop = ctx.Event()
    tasks = [ctx.Queue() for _ in shares]
    results = [ctx.Queue() for _ in shares]
    for own in tasks:
        # calls still queued for a dead worker must not keep this process from exiting
        own.cancel_join_thread()
    settings_json = serialize_settings(settings)
    workers = [
        ctx.Process(target=_worker_main, args=(settings_json, share, tasks[i], results[i], stop, os.getpid()), daemon=True)
        for i, share in enumerate(shares)
    ]
    interrupted = False
    answered: set[int] = set()
    assigned: list[set[int]] = [set() for _ in workers]
    dead: set[int] = set()
    tracker: _Tracker | None = None

    def drain(i: int) -> int:
        got = 0
        while True:
            try:
                index, kind, reason = results[i].get_nowait()
            except (queue_module.Empty, OSError, ValueError):
                return got
            if index not in answered and tracker is not None:
                answered.add(index)
                tracker.done(todo[index], kind, reason)
                got += 1

    try:
        for w in workers:
            w.start()
        for index, item in enumerate(todo):
            assigned[index % len(workers)].add(index)
            tasks[index % len(workers)].put((index, item.call))
        tracker = _Tracker(counts, len(todo), progress)
        while len(answered) < len(todo):
            if sum(drain(i) for i in range(len(workers))):
                continue
            alive = [i for i, w in enumerate(workers) if w.is_alive()]
            if not alive:
                break
            for i, w in enumerate(workers):
                if i in alive or i in dead:
                    continue
                dead.add(i)
                drain(i)
                orphans = sorted(assigned[i] - answered)
                log.warning("a warm worker process exited (code %s); its %d unanswered calls go to the others", w.exitcode, len(orphans))
                for k, index in enumerate(orphans):
                    j = alive[k % len(alive)]
                    assigned[j].add(index)
                    tasks[j].put((index, todo[index].call))
            time.sleep(0.005)
        for i, w in enumerate(workers):
            if w.is_alive():
                for _ in range(shares[i]):
                    tasks[i].put(None)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
    finally:
        deadline = time.monotonic() + 30
        for w in workers:
            w.join(timeout=max(0.1, deadline - time.monotonic()))
            if w.is_alive():
                w.terminate()
        if tracker is None:
            tracker = _Tracker(counts, len(todo), False)
        # answers that arrived while the workers wound down
        for i in range(len(workers)):
            drain(i)
        if not interrupted:
            # calls no worker could make (every worker died: it could not open the store, ...)
            for index, item in enumerate(todo):
                if index not in answered:
                    tracker.done(item, None, "a worker process exited before making this call", made=False)
        tracker.close()
    return WarmReport(
        counts=tracker.counts,
        failures=tracker.failures,
        skipped=list(plan.skipped),
        elapsed_s=time.monotonic() - started,
        attempted=tracker.attempted,
        interrupted=interrupted,
    )


def warm_settings(settings: Any, concurrency: int) -> Any:
    """The settings for a warming layer: record mode, room for ``concurrency`` misses in flight."""
    limits = settings.limits.model_copy(update={"max_pending_misses": max(settings.limits.max_pending_misses, concurrency)})
    simulator = settings.simulator.model_copy(update={"max_concurrency": max(settings.simulator.max_concurrency, concurrency)})
    updated = settings.model_copy(update={"mode": "record", "limits": limits, "simulator": simulator})
    updated.base_dir = settings.base_dir
    return updated


def default_processes(concurrency: int) -> int:
    """Worker processes for a concurrency: one per 64 calls in flight, at most one per two CPUs.

    One process keeps about 64 calls in flight before the GIL limits it; on a small machine
    the simulator (or the stub standing in for it) needs the other cores.
    """
    return max(1, min((os.cpu_count() or 1) // 2, concurrency // 64))


# -- command line ---------------------------------------------------------------------------------


def build_plan(args: argparse.Namespace, settings: Any) -> WarmPlan:
    plan = WarmPlan()
    if args.queries:
        add_query_sources(plan, args.queries, include_optional=args.include_optional)
    if args.answers:
        index = FunctionIndex()
        try:
            index.add_query_files(args.queries or [])
            index.add_query_files(args.index or [])
            tools = args.tools_folder or (settings.resolve(settings.tools_folder) if settings.tools_folder else None)
            if tools:
                index.add_tools_folder(tools)
        except QueryFileError as exc:
            raise WarmInputError(str(exc)) from None
        if not len(index):
            raise WarmInputError("answer files need query files (--queries or --index) or a tools folder to map function names to APIs")
        add_answer_sources(plan, args.answers, index)
    if args.payloads:
        add_payload_sources(plan, args.payloads)
    return plan


def cmd_warm(args: argparse.Namespace) -> int:
    from .cli import settings_from_args
    from .logs import setup_logging

    if not (args.queries or args.answers or args.payloads):
        print("error: give at least one source: --queries, --answers or --payloads", file=sys.stderr)
        return 2
    if args.concurrency is None:
        args.concurrency = 256 if args.engine == "vllm-offline" else 8
    if args.concurrency < 1:
        print("error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    if args.mode == "replay":
        print("error: warm records answers; it cannot run in replay mode", file=sys.stderr)
        return 2
    settings = warm_settings(settings_from_args(args), args.concurrency)
    setup_logging("warning" if not args.verbose else "info", settings.secrets())
    if not settings.save:
        print("error: 'save' is false: warming would record nothing", file=sys.stderr)
        return 2
    try:
        plan = build_plan(args, settings)
    except WarmInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    processes = 1
    if args.engine == "vllm-offline":
        from .warm_offline import OfflineEngineError, offline_layer

        if args.processes not in (None, 1):
            print("error: --engine vllm-offline runs in one process (vLLM batches the calls)", file=sys.stderr)
            return 2
        try:
            layer, handler = offline_layer(
                settings, model=args.model, concurrency=args.concurrency, llm_options=_options(args.vllm_option or [])
            )
        except (OfflineEngineError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        if args.model:
            print("error: --model is for --engine vllm-offline", file=sys.stderr)
            return 2
        processes = default_processes(args.concurrency) if args.processes is None else args.processes
        if processes < 1:
            print("error: --processes must be at least 1", file=sys.stderr)
            return 2
        layer, handler = warm_layer(settings), None
        if not layer.responders and not args.dry_run:
            layer.close()
            print("error: neither the real API nor the simulator is enabled: nothing can answer a miss", file=sys.stderr)
            return 2
    try:
        if args.dry_run:
            report = run_warm(layer, _nothing_to_do(layer, plan), concurrency=1, progress=False)
        elif processes > 1:
            layer.close()  # the workers open their own store connections; none is carried across fork
            report = run_warm_processes(settings, plan, concurrency=args.concurrency, processes=processes, progress=not args.quiet)
        else:
            report = run_warm(layer, plan, concurrency=args.concurrency, progress=not args.quiet, handler=handler)
    except WarmInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        layer.close()
    print(report.table())
    if args.dry_run:
        total = report.total
        print(f"dry run: {total.calls - total.cached} of {total.calls} distinct calls would be made")
    for failure in report.failures[: args.show_failures]:
        print(f"FAILED {failure.origin}: {failure.reason}")
    if len(report.failures) > args.show_failures:
        print(f"... {len(report.failures) - args.show_failures} more failures" + ("" if args.failures else " (write them all with --failures FILE)"))
    if report.skipped and args.verbose:
        for skipped in report.skipped:
            print(f"SKIPPED {skipped.origin}: {skipped.reason}")
    if args.failures:
        with open(args.failures, "w", encoding="utf-8") as fh:
            for failure in report.failures:
                fh.write(failure.to_json() + "\n")
    if report.interrupted:
        return 130
    return 1 if report.failures else 0


def _options(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (values read as YAML: numbers, booleans, strings) for ``vllm.LLM``."""
    import yaml

    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--vllm-option expects KEY=VALUE, got {item!r}")
        try:
            options[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            options[key.strip()] = value
    return options


def _nothing_to_do(layer: MirrorLayer, plan: WarmPlan) -> WarmPlan:
    """``--dry-run``: count what is cached; report the rest as to do without calling anything."""
    dry = WarmPlan(counts={s: SourceCounts(**vars(c)) for s, c in plan.counts.items()}, skipped=list(plan.skipped))
    for item in plan.items:
        if layer.settled(item.call):
            dry.items.append(item)
    return dry


def register(sub: argparse._SubParsersAction) -> None:
    from .cli import add_config_arguments

    parser = sub.add_parser(
        "warm",
        help="fill the store from query files, answer files or payloads before a run",
        description="Make the calls a StableToolBench run will make and record their answers: the default "
        "call of every API in query files, the calls in answer files, or /virtual payloads. Cached calls are "
        "skipped (resumable); the rest go through the real API -> simulator chain.",
    )
    parser.add_argument("--queries", action="append", metavar="PATH", help="StableToolBench query files or folders (repeatable)")
    parser.add_argument("--answers", action="append", metavar="PATH", help="StableToolBench answer files or folders (repeatable)")
    parser.add_argument("--payloads", action="append", metavar="FILE.jsonl", help="JSONL of /virtual bodies (repeatable)")
    parser.add_argument("--index", action="append", metavar="PATH", help="query files used only to map answer-file function names")
    parser.add_argument("--tools-folder", help="ToolBench tools folder, to map answer-file function names (default: 'tools_folder')")
    parser.add_argument("--include-optional", action="store_true", help="default calls also fill the optional parameters")
    parser.add_argument("--concurrency", "-j", type=int, help="calls in flight; the offline engine's batch size (default 8; 256 with vllm-offline)")
    parser.add_argument(
        "--processes", type=int, help="worker processes sharing the concurrency (default: one per 64 in flight, at most one per two CPUs)"
    )
    parser.add_argument("--engine", choices=["http", "vllm-offline"], default="http", help="http: the configured chain (default); vllm-offline: in-process vLLM")
    parser.add_argument("--model", help="model path or name for --engine vllm-offline")
    parser.add_argument("--vllm-option", action="append", metavar="KEY=VALUE", help="extra vllm.LLM() argument, e.g. max_model_len=8192 (repeatable)")
    parser.add_argument("--failures", metavar="FILE.jsonl", help="write the failed calls here (usable again as --payloads)")
    parser.add_argument("--show-failures", type=int, default=20, help="failures to print (default 20)")
    parser.add_argument("--dry-run", action="store_true", help="count the calls and what is cached; call nothing")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", "-v", action="store_true", help="log more, list skipped calls")
    add_config_arguments(parser)
    parser.set_defaults(func=cmd_warm)
