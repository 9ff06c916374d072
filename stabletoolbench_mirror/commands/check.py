"""Reproducibility reports: replay recorded calls and compare the answers with what was observed.

``stabletoolbench-mirror check`` takes

* a JSONL file of ``{"payload": <the /virtual body>, "observed": <the answer>}`` lines
  (``observed`` may also be the observation *text* the agent saw), or
* StableToolBench answer files / folders (each call's arguments and recorded observation),

sends each call to a running server (``--url``) or to the layer in-process (built from the
settings, in ``replay`` mode unless ``--mode record`` is given, so a check records nothing),
and reports per API how many answers are **identical**, **different** or a **miss**
(nothing recorded for the call); of the identical ones, how many are failures
(``identical_failure``: a failure record replayed, so both runs saw the same failure).  The answer compared is what the StableToolBench client
makes of the HTTP reply: the JSON body for a 200, its ``request invalid`` error otherwise.
The exit status is 1 when anything differs or misses (unless ``--report-only``): the
report a user attaches to a score.  Injected faults (``faults:``) are left out, so the answers are
compared with the unfaulted record (a server is asked with ``X-STM-Faults: off``);
``--with-faults`` compares with the faulted answers instead.
"""

from __future__ import annotations

import argparse
import enum
import itertools
import json
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stabletoolbench_mirror.commands.cli_common import add_answer_file_arguments, add_command, add_config_arguments, settings_from_args
from stabletoolbench_mirror.config import Mode, Settings
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.protocol import answer as make_answer
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.upstream.answers import DEFAULT_MAX_OBSERVATION_LENGTH, function_index, observation_text
from stabletoolbench_mirror.upstream.expectations import CheckInputError, Expectation, iter_calls_jsonl, load_answer_expectations


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


# -- targets --------------------------------------------------------------------------------------


class UrlTarget:
    """A running ``/virtual`` server (this project's or upstream's).

    Each checking thread keeps its own keep-alive connection (``http.client``: lean enough that a
    check of 100,000 calls is bound by the server, not by the client).
    """

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 300.0, with_faults: bool = False) -> None:
        from urllib.parse import urlsplit

        self.url = url if url.rstrip("/").endswith("/virtual") else url.rstrip("/") + "/virtual"
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CheckInputError(f"--url must be http://HOST:PORT or https://HOST:PORT (got {url!r})")
        self._parts = parts
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if not with_faults:  # compared with the unfaulted record (this project's server leaves its faults out)
            self._headers["X-STM-Faults"] = "off"
        self._timeout = timeout_s

    def _connection(self, fresh: bool = False) -> Any:
        import http.client

        conn = getattr(self._local, "conn", None)
        if conn is not None and fresh:
            conn.close()
            conn = None
        if conn is None:
            factory = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
            conn = self._local.conn = factory(self._parts.hostname or "", self._parts.port, timeout=self._timeout)
            with self._lock:
                self._connections.append(conn)
        return conn

    def send(self, payload: dict[str, Any]) -> TargetReply:
        import http.client

        body = json.dumps(payload).encode("utf-8")
        headers = dict(self._headers)
        headers["toolbench_key"] = str(payload.get("toolbench_key", ""))
        for attempt in (0, 1):
            conn = self._connection(fresh=attempt > 0)
            try:
                conn.request("POST", self._path, body=body, headers=headers)
                response = conn.getresponse()
                text = response.read().decode("utf-8", "replace")
                outcome = response.getheader("X-STM-Outcome")
                # this project's server says whether an answer is a failure; another's is judged by content
                failure = None if outcome is None else response.getheader("X-STM-Failure") == "true" or bool(response.getheader("X-STM-Fault"))
                return TargetReply(response.status, text, outcome, failure)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                # a keep-alive connection the server closed meanwhile: once more on a new one
                if attempt:
                    raise CheckInputError(f"cannot reach {self.url}: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                raise CheckInputError(f"cannot reach {self.url}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()


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
                outcome = self.faults.serve_blocking(prepared, outcome, wait=False)
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


# -- command line ---------------------------------------------------------------------------------


def _layer(settings: Settings) -> MirrorLayer:
    """The in-process layer; in replay mode without responders (nothing may fill a miss anyway)."""
    return build_layer(settings, responders=[] if settings.mode is Mode.REPLAY else None)


def cmd_check(args: argparse.Namespace) -> int:
    """Replay a JSONL of {payload, observed} calls or StableToolBench answer files against a running server (--url) or the
    layer in-process (replay mode), and report per API. Exit status 1 when anything differs or misses."""
    if args.apibank:
        from stabletoolbench_mirror.commands.apibank_check import cmd_apibank_check

        return cmd_apibank_check(args, settings_from_args(args, mode=args.mode or Mode.REPLAY))
    if not args.calls and not args.answers:
        print("error: give --calls FILE.jsonl and/or --answers PATH (or --apibank DIALOGUES)", file=sys.stderr)
        return 2
    settings = settings_from_args(args, mode=args.mode or Mode.REPLAY)
    report = CheckReport()
    expectations: list[Iterable[Expectation]] = []
    total = 0
    try:
        for path in args.calls or []:
            # read as the calls are sent; a first pass only counts lines (for the progress bar)
            total += _count_lines(path)
            expectations.append(iter_calls_jsonl(path))
        if args.answers:
            tools = args.tools_folder or (settings.resolve(settings.tools_folder) if settings.tools_folder else None)
            found, problems = load_answer_expectations(args.answers, function_index(args.queries or [], tools))
            expectations.append(found)
            total += len(found)
            report.problems.extend(problems)
    except ValueError as exc:  # CheckInputError, and the answer files' function index
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.url:
        token = settings.auth_token.get_secret_value() if settings.auth_token else None
        target: Target = UrlTarget(args.url, token=token, with_faults=args.with_faults)
    else:
        target = LayerTarget(_layer(settings), with_faults=args.with_faults)
    try:
        run_check(
            itertools.chain.from_iterable(expectations),
            target,
            max_observation_length=args.max_observation_length,
            report=report,
            concurrency=max(1, args.concurrency if args.url else 1),
            progress=not args.quiet,
            total=total,
        )
    except CheckInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        target.close()
    _print_report(report, args.json)
    if args.report_only:
        return 0
    return 0 if report.ok() else 1


def _print_report(report: CheckReport, json_to: str | None) -> None:
    """The report as text, and as JSON to the ``--json`` file (``--json`` alone: only the JSON, printed)."""
    if json_to == "-":
        print(json.dumps(report.to_json(), ensure_ascii=False))
        return
    print("\n".join(report.lines()))
    if json_to:
        Path(json_to).write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _count_lines(path: str | Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError as exc:
        raise CheckInputError(f"{path}: cannot read: {exc}") from None


def register(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "check", cmd_check, summary="replay recorded calls and report identical / different / miss per API")
    parser.add_argument("--calls", action="append", metavar="FILE.jsonl", help='JSONL of {"payload", "observed"} lines (repeatable)')
    add_answer_file_arguments(parser)
    parser.add_argument("--url", help="a running server (http://HOST:PORT or .../virtual); default: the layer in-process")
    parser.add_argument(
        "--max-observation-length", type=int, default=DEFAULT_MAX_OBSERVATION_LENGTH, help="the client's cut for observation texts (1024)"
    )
    parser.add_argument("--json", metavar="FILE", nargs="?", const="-", help="also write the full report as JSON to FILE; alone: print it instead")
    parser.add_argument("--apibank", metavar="DIALOGUES", help="API-Bank dialogues (.jsonl file or folder): replay each in a session, score with each API's own check")
    parser.add_argument("--concurrency", type=int, default=8, help="calls in flight at once against --url (default 8)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument("--report-only", action="store_true", help="exit 0 even when something differs")
    parser.add_argument(
        "--with-faults", action="store_true",
        help="compare the answers with the configured faults applied (default: the unfaulted record, see docs/faults.md)",
    )
    add_config_arguments(parser)
