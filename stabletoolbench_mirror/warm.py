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
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

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


def run_warm(
    layer: MirrorLayer,
    plan: WarmPlan,
    *,
    concurrency: int = 8,
    progress: bool = True,
    handler: Handler | None = None,
    stop: threading.Event | None = None,
) -> WarmReport:
    """Make every call of ``plan`` that the layer cannot answer yet, ``concurrency`` at a time."""
    handle = handler or layer.handle_call
    counts = {s: SourceCounts(**vars(c)) for s, c in plan.counts.items()}
    failures: list[Failure] = []
    todo: list[WarmItem] = []
    for item in plan.items:
        try:
            cached = layer.lookup(item.call) is not None
        except StoreError as exc:
            raise WarmInputError(f"the store cannot be read: {exc}") from None
        if cached:
            counts[item.source].cached += 1
        else:
            todo.append(item)
    stop = stop or threading.Event()
    lock = threading.Lock()
    queue = iter(todo)
    bar = tqdm(total=len(todo), desc="warm", unit="call", disable=not progress, dynamic_ncols=True, smoothing=0.1)
    attempted = 0
    started = time.monotonic()

    def work() -> None:
        nonlocal attempted
        while not stop.is_set():
            with lock:
                item = next(queue, None)
            if item is None:
                return
            try:
                outcome = handle(item.call)
            except Exception as exc:  # noqa: BLE001 - one bad call must not end the run
                log.exception("warming %s failed", item.call.namespace)
                outcome = None
                reason = f"error: {type(exc).__name__}: {exc}"
            with lock:
                attempted += 1
                c = counts[item.source]
                if outcome is not None and outcome.kind == "recorded":
                    c.new += 1
                elif outcome is not None and outcome.kind == "hit":
                    c.cached += 1
                else:
                    c.failed += 1
                    failures.append(Failure(item.source, item.origin, reason if outcome is None else _reason(outcome), payload_of(item.call)))
                bar.update(1)
                bar.set_postfix(failed=len(failures), refresh=False)

    threads = [threading.Thread(target=work, name=f"warm-{i}", daemon=True) for i in range(max(1, min(concurrency, len(todo) or 1)))]
    for t in threads:
        t.start()
    interrupted = False
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        for t in threads:
            t.join(timeout=30)
    bar.close()
    return WarmReport(
        counts=counts,
        failures=failures,
        skipped=list(plan.skipped),
        elapsed_s=time.monotonic() - started,
        attempted=attempted,
        interrupted=interrupted or stop.is_set() and attempted < len(todo),
    )


def warm_settings(settings: Any, concurrency: int) -> Any:
    """The settings for a warming layer: record mode, room for ``concurrency`` misses in flight."""
    limits = settings.limits.model_copy(update={"max_pending_misses": max(settings.limits.max_pending_misses, concurrency)})
    simulator = settings.simulator.model_copy(update={"max_concurrency": max(settings.simulator.max_concurrency, concurrency)})
    updated = settings.model_copy(update={"mode": "record", "limits": limits, "simulator": simulator})
    updated.base_dir = settings.base_dir
    return updated


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
    if args.engine == "vllm-offline":
        from .warm_offline import OfflineEngineError, offline_layer

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
        layer, handler = MirrorLayer.from_settings(settings), None
        if not layer.responders and not args.dry_run:
            layer.close()
            print("error: neither the real API nor the simulator is enabled: nothing can answer a miss", file=sys.stderr)
            return 2
    try:
        if args.dry_run:
            report = run_warm(layer, _nothing_to_do(layer, plan), concurrency=1, progress=False)
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
        if layer.lookup(item.call) is not None:
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
