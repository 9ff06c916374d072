"""Reproducibility reports: replay recorded calls and compare the answers with what was observed.

``stabletoolbench-mirror check`` takes

* a JSONL file of ``{"payload": <the /virtual body>, "observed": <the answer>}`` lines
  (``observed`` may also be the observation *text* the agent saw), or
* StableToolBench answer files / folders (each call's arguments and recorded observation),

sends each call to a running server (``--url``) or to the layer in-process (built from the
settings, in ``replay`` mode unless ``--mode record`` is given, so a check records nothing),
and reports per API how many answers are **identical**, **different** or a **miss**
(nothing recorded for the call).  Identical answers that are failures (a failure record
replayed: the simulator's ``Failed to generate fake response``, an error answer) are also
counted apart as ``identical_failure``, so a report shows how much of its agreement is
agreement on failures.  The answer compared is what the StableToolBench client
makes of the HTTP reply: the JSON body for a 200, its ``request invalid`` error otherwise.
The exit status is 1 when anything differs or misses (unless ``--report-only``): the
report a user attaches to a score.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol

from .answers import DEFAULT_MAX_OBSERVATION_LENGTH, answer_payload, iter_answer_files, observation_text, read_answer_file
from .naming import resolve_names
from .protocol import answer as make_answer
from .protocol import encode_answer

IDENTICAL, DIFFERENT, MISS = "identical", "different", "miss"
VERDICTS = (IDENTICAL, DIFFERENT, MISS)
#: counted besides ``identical``: the identical answers that are failures
IDENTICAL_FAILURE = "identical_failure"
COUNTS = (IDENTICAL, IDENTICAL_FAILURE, DIFFERENT, MISS)


class CheckInputError(ValueError):
    """A calls file or answer file that cannot be used."""


@dataclass(frozen=True)
class Expectation:
    """One call to replay and what was observed for it."""

    payload: dict[str, Any]
    observed: Any
    """An answer object, or (``text=True``) the observation text the agent saw."""
    origin: str
    text: bool = False

    @property
    def namespace(self) -> str:
        try:
            return resolve_names(
                str(self.payload.get("category", "")), str(self.payload.get("tool_name", "")), str(self.payload.get("api_name", ""))
            ).namespace
        except Exception:  # noqa: BLE001 - a malformed payload still gets a report line
            return "?"


@dataclass(frozen=True)
class Reply:
    """What a target answered: HTTP status, body text and (for this project's server) the outcome kind."""

    status: int
    body: str
    outcome: str | None = None
    failure: bool | None = None
    """Whether the answer is a failure, as this project's server says (``X-STM-Failure``); ``None``: unknown."""


class Target(Protocol):
    def send(self, payload: dict[str, Any]) -> Reply: ...

    def close(self) -> None: ...


# -- inputs ---------------------------------------------------------------------------------------


def load_calls_jsonl(path: str | Path) -> list[Expectation]:
    """``{"payload", "observed"}`` lines; blank lines are skipped, a bad line is an error naming it."""
    out: list[Expectation] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CheckInputError(f"{path}: cannot read: {exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise CheckInputError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(item, dict) or not isinstance(item.get("payload"), dict) or "observed" not in item:
            raise CheckInputError(f'{path}:{number}: expected an object with "payload" (object) and "observed"')
        observed = item["observed"]
        out.append(Expectation(item["payload"], observed, f"{path}:{number}", text=isinstance(observed, str)))
    return out


def load_answer_expectations(paths: Iterable[str | Path], index: Any) -> tuple[list[Expectation], list[str]]:
    """Expectations from answer files: every call with a recorded observation whose function resolves."""
    out: list[Expectation] = []
    problems: list[str] = []
    try:
        files = list(iter_answer_files(paths))
    except ValueError as exc:
        raise CheckInputError(str(exc)) from None
    for path in files:
        try:
            calls = read_answer_file(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        for call in calls:
            if call.observation is None:
                continue
            ref, reason = index.resolve(call.function, call.query_id)
            if ref is None:
                problems.append(f"{call.origin}: {reason}")
                continue
            out.append(Expectation(answer_payload(ref, call.arguments), call.observation, call.origin, text=True))
    return out, problems


# -- targets --------------------------------------------------------------------------------------


class UrlTarget:
    """A running ``/virtual`` server (this project's or upstream's)."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 300.0) -> None:
        import requests

        self.url = url if url.rstrip("/").endswith("/virtual") else url.rstrip("/") + "/virtual"
        self._session = requests.Session()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout_s

    def send(self, payload: dict[str, Any]) -> Reply:
        import requests

        headers = dict(self._headers)
        headers["toolbench_key"] = str(payload.get("toolbench_key", ""))
        try:
            response = self._session.post(self.url, json=payload, headers=headers, timeout=self._timeout)
        except requests.RequestException as exc:
            raise CheckInputError(f"cannot reach {self.url}: {exc}") from None
        outcome = response.headers.get("X-STM-Outcome")
        # this project's server says whether an answer is a failure; another server's answers are judged by content
        failure = None if outcome is None else response.headers.get("X-STM-Failure") == "true"
        return Reply(response.status_code, response.text, outcome, failure)

    def close(self) -> None:
        self._session.close()


class LayerTarget:
    """The mirror layer in this process."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer

    def send(self, payload: dict[str, Any]) -> Reply:
        outcome = self.layer.handle_payload(payload)
        return Reply(outcome.status, outcome.body, outcome.kind, outcome.failure)

    def close(self) -> None:
        self.layer.close()


# -- comparing ------------------------------------------------------------------------------------


def client_answer(reply: Reply) -> Any:
    """The answer object the StableToolBench client makes of a reply (its exact error texts)."""
    if reply.status != 200:
        return make_answer(f"request invalid, data error. status_code={reply.status}", "")
    try:
        return json.loads(reply.body)
    except ValueError:
        return make_answer("request invalid, data error", "")


def is_failure(reply: Reply) -> bool:
    """Whether a reply's answer is a failure: as the server says, else an answer with a non-empty ``error``."""
    if reply.failure is not None:
        return reply.failure
    got = client_answer(reply)
    return not isinstance(got, dict) or bool(got.get("error"))


def verdict(expectation: Expectation, reply: Reply, max_observation_length: int = DEFAULT_MAX_OBSERVATION_LENGTH) -> str:
    if reply.outcome == "unanswered":
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
    origin: str
    namespace: str
    tool_input: str
    verdict: str
    expected: str
    got: str


@dataclass
class CheckReport:
    per_api: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    mismatches: list[Mismatch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.per_api.values():
            total.update(counts)
        return total

    @property
    def calls(self) -> int:
        return sum(self.totals.values())

    def ok(self) -> bool:
        totals = self.totals
        return totals[DIFFERENT] == 0 and totals[MISS] == 0

    def to_json(self) -> dict[str, Any]:
        totals = self.totals
        return {
            "calls": self.calls,
            "totals": {v: totals[v] for v in COUNTS},
            "identical_fraction": (totals[IDENTICAL] / self.calls) if self.calls else None,
            "per_api": {ns: {v: c[v] for v in COUNTS} for ns, c in sorted(self.per_api.items())},
            "mismatches": [m.__dict__ for m in self.mismatches],
            "problems": self.problems,
        }

    def lines(self, *, max_details: int = 20) -> list[str]:
        totals = self.totals
        n = self.calls
        share = f"{100.0 * totals[IDENTICAL] / n:.1f}%" if n else "n/a"
        width = max([len(ns) for ns in self.per_api] + [3])
        out = [f"{'API':<{width}}  {'identical':>9}  {'failures':>8}  {'different':>9}  {'miss':>5}"]
        for ns, counts in sorted(self.per_api.items()):
            out.append(f"{ns:<{width}}  {counts[IDENTICAL]:>9}  {counts[IDENTICAL_FAILURE]:>8}  {counts[DIFFERENT]:>9}  {counts[MISS]:>5}")
        out.append(f"{'total':<{width}}  {totals[IDENTICAL]:>9}  {totals[IDENTICAL_FAILURE]:>8}  {totals[DIFFERENT]:>9}  {totals[MISS]:>5}")
        out.append(f"{n} calls: {totals[IDENTICAL]} identical ({share}), {totals[DIFFERENT]} different, {totals[MISS]} miss")
        answers, failures = totals[IDENTICAL] - totals[IDENTICAL_FAILURE], totals[IDENTICAL_FAILURE]
        out.append(f"identical: {answers} answers, {failures} failures")
        for m in self.mismatches[:max_details]:
            out.append(f"{m.verdict.upper()} {m.namespace} input={m.tool_input[:200]} ({m.origin})")
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
) -> CheckReport:
    report = report or CheckReport()
    for expectation in expectations:
        reply = target.send(expectation.payload)
        result = verdict(expectation, reply, max_observation_length)
        namespace = expectation.namespace
        report.per_api[namespace][result] += 1
        if result == IDENTICAL and is_failure(reply):
            report.per_api[namespace][IDENTICAL_FAILURE] += 1
        if result != IDENTICAL:
            got = client_answer(reply)
            report.mismatches.append(
                Mismatch(
                    origin=expectation.origin,
                    namespace=namespace,
                    tool_input=str(expectation.payload.get("tool_input", "")),
                    verdict=result,
                    expected=expectation.observed if expectation.text else json.dumps(expectation.observed, ensure_ascii=False),
                    got=observation_text(got, max_observation_length) if expectation.text else json.dumps(got, ensure_ascii=False),
                )
            )
    return report


# -- command line ---------------------------------------------------------------------------------


def _layer(settings: Any) -> Any:
    """The in-process layer; in replay mode without responders (nothing may fill a miss anyway)."""
    from .factory import build_store
    from .layer import MirrorLayer
    from .stores import FrozenCache

    if settings.mode != "replay":
        return MirrorLayer.from_settings(settings)
    frozen = [FrozenCache(settings.resolve(p)) for p in settings.frozen_caches]
    return MirrorLayer(build_store(settings), mode="replay", frozen=frozen)


def cmd_check(args: argparse.Namespace) -> int:
    from .cli import settings_from_args
    from .queries import FunctionIndex, QueryFileError

    if not args.calls and not args.answers:
        print("error: give --calls FILE.jsonl and/or --answers PATH", file=sys.stderr)
        return 2
    settings = settings_from_args(args, mode=args.mode or "replay")
    report = CheckReport()
    expectations: list[Expectation] = []
    try:
        for path in args.calls or []:
            expectations.extend(load_calls_jsonl(path))
        if args.answers:
            index = FunctionIndex()
            if args.queries:
                index.add_query_files(args.queries)
            tools = args.tools_folder or (settings.resolve(settings.tools_folder) if settings.tools_folder else None)
            if tools:
                index.add_tools_folder(tools)
            if not len(index):
                print("error: answer files need --queries (query files) or --tools-folder to map function names to APIs", file=sys.stderr)
                return 2
            found, problems = load_answer_expectations(args.answers, index)
            expectations.extend(found)
            report.problems.extend(problems)
    except (CheckInputError, QueryFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.url:
        token = settings.auth_token.get_secret_value() if settings.auth_token else None
        target: Target = UrlTarget(args.url, token=token)
    else:
        target = LayerTarget(_layer(settings))
    try:
        run_check(expectations, target, max_observation_length=args.max_observation_length, report=report)
    except CheckInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        target.close()
    print("\n".join(report.lines()))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.report_only:
        return 0
    return 0 if report.ok() else 1


def register(sub: argparse._SubParsersAction) -> None:
    from .cli import add_config_arguments

    parser = sub.add_parser(
        "check",
        help="replay recorded calls and report identical / different / miss per API",
        description="Replay a JSONL of {payload, observed} calls or StableToolBench answer files against a "
        "running server (--url) or the layer in-process (replay mode), and report per API. "
        "Exit status 1 when anything differs or misses.",
    )
    parser.add_argument("--calls", action="append", metavar="FILE.jsonl", help='JSONL of {"payload", "observed"} lines (repeatable)')
    parser.add_argument("--answers", action="append", metavar="PATH", help="StableToolBench answer files or folders (repeatable)")
    parser.add_argument("--queries", action="append", metavar="PATH", help="query files/folders mapping answer-file function names to APIs")
    parser.add_argument("--tools-folder", help="a ToolBench tools folder, also used to map function names (default: 'tools_folder')")
    parser.add_argument("--url", help="a running server (http://HOST:PORT or .../virtual); default: the layer in-process")
    parser.add_argument(
        "--max-observation-length", type=int, default=DEFAULT_MAX_OBSERVATION_LENGTH, help="the client's cut for observation texts (1024)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the full report as JSON")
    parser.add_argument("--report-only", action="store_true", help="exit 0 even when something differs")
    add_config_arguments(parser)
    parser.set_defaults(func=cmd_check)
