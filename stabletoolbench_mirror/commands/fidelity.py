"""``stabletoolbench-mirror fidelity``: score a simulator (or a second recorded set) against real answers.

What a pair is and how it is scored: :mod:`stabletoolbench_mirror.fidelity`."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from contextlib import ExitStack
from typing import Any

from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_answer_file_arguments,
    add_command,
    add_config_arguments,
    settings_from_args,
)
from stabletoolbench_mirror.core.files import write_bytes
from stabletoolbench_mirror.fidelity.metrics import EmbeddingClient, FidelityReport, Judge, Pair, render_html, score_pairs, write_json
from stabletoolbench_mirror.fidelity.pairs import (
    SimulatorCandidate,
    attach_candidates,
    candidates_from_calls,
    candidates_from_shadow,
    no_store_references,
    pairs_from_expectations,
    pairs_from_store,
    what_was_scored,
)
from stabletoolbench_mirror.upstream.expectations import load_answer_expectations, load_calls_jsonl


def cmd_fidelity(args: argparse.Namespace) -> int:
    """Score candidate answers against reference (real) answers, per call, per category and overall. References: --calls,
    --answers or --from-store (the store's real records). Candidates: the configured simulator asked directly (default;
    never the cache, nothing recorded unless --record), --candidate-calls, or the shadow store (--from-store --shadow)."""
    _check_arguments(args)
    settings = settings_from_args(args)
    progress = not args.quiet
    report = FidelityReport()
    problems = report.problems
    with ExitStack() as closers:
        try:
            pairs, store = _load_pairs(args, settings, problems, closers, progress)
            pairs, candidate = _attach_candidate(args, settings, pairs, store, problems, closers)
        except ValueError as exc:  # CheckInputError, QueryFileError, the answer files' function index
            raise CommandError(str(exc)) from None
        embeddings, judge = _build_scorers(args, closers)
        report.pairs = score_pairs(
            pairs, candidate=candidate, embeddings=embeddings, judge=judge, concurrency=args.concurrency, progress=progress
        )
        references = [*(f"calls: {p}" for p in args.calls or []), *(f"answers: {p}" for p in args.answers or []),
                      *(["the store's real answers"] if args.from_store else [])]
        report.scored = what_was_scored(settings, report.pairs, store, references=references,
                                        candidate_calls=args.candidate_calls or [], shadow=args.shadow)
    return _write_reports(args, report)


def _check_arguments(args: argparse.Namespace) -> None:
    """:class:`CommandError` (exit status 2) for flags that cannot go together or a missing dependency."""
    if not (args.calls or args.answers or args.from_store):
        raise CommandError("give the reference answers: --calls FILE.jsonl, --answers PATH or --from-store")
    if args.shadow and not args.from_store:
        raise CommandError("--shadow scores the shadow store against the store's real records: add --from-store")
    if args.shadow and args.candidate_calls:
        raise CommandError("--shadow and --candidate-calls are two different candidates: give one")
    try:
        import rouge_score  # noqa: F401
        import sacrebleu  # noqa: F401
    except ImportError as exc:
        raise CommandError(f"fidelity needs sacrebleu and rouge-score: pip install 'stabletoolbench-mirror[fidelity]' ({exc})") from None
    if args.concurrency < 1:
        raise CommandError("--concurrency must be at least 1")
    for flag, out in (("--json", args.json), ("--html", args.html)):
        folder = os.path.dirname(os.path.abspath(out)) if out else None
        if folder is not None and not os.path.isdir(folder):
            raise CommandError(f"{flag} {out}: the folder {folder} does not exist")


def _load_pairs(
    args: argparse.Namespace, settings: Any, problems: list[str], closers: ExitStack, progress: bool
) -> tuple[list[Pair], Any]:
    """The reference pairs (``--calls``, ``--answers``, ``--from-store``, then ``--category`` and ``--limit``)
    and the store when one is needed (closed by ``closers``)."""
    pairs = _pairs_from_files(args, settings, problems)
    store = None
    if args.from_store or not (args.candidate_calls or args.shadow):
        from stabletoolbench_mirror.factory import build_store

        store = build_store(settings)
        closers.callback(store.close)
    if args.from_store:
        pairs += _pairs_from_store(settings, store, problems, progress, have_others=bool(pairs))
    if args.category:
        wanted = set(args.category)
        pairs = [p for p in pairs if p.category in wanted]
    return pairs[: args.limit], store


def _pairs_from_files(args: argparse.Namespace, settings: Any, problems: list[str]) -> list[Pair]:
    """The reference pairs of ``--calls`` and ``--answers``, in that order."""
    from stabletoolbench_mirror.upstream.answers import function_index

    pairs: list[Pair] = []
    for path in args.calls or []:
        pairs += pairs_from_expectations(load_calls_jsonl(path), problems)
    if args.answers:
        tools = args.tools_folder or (settings.resolve(settings.tools_folder) if settings.tools_folder else None)
        found, bad = load_answer_expectations(args.answers, function_index(args.queries or [], tools))
        problems.extend(bad)
        pairs += pairs_from_expectations(found, problems)
    return pairs


def _pairs_from_store(settings: Any, store: Any, problems: list[str], progress: bool, *, have_others: bool) -> list[Pair]:
    """``--from-store``'s pairs; when there are none, a warning, or without ``have_others`` an error (exit status 1)."""
    from stabletoolbench_mirror.upstream.tooldocs import tool_docs_for

    seen: Counter[str] = Counter()
    from_store = pairs_from_store(store, problems, progress=progress, docs=tool_docs_for(settings), seen=seen)
    if not from_store:
        message = no_store_references(str(getattr(store, "path", None) or getattr(store, "url", "?")), seen)
        if not have_others:
            raise CommandError(message, status=1)
        print(f"warning: {message}", file=sys.stderr)
    return from_store


def _attach_candidate(
    args: argparse.Namespace, settings: Any, pairs: list[Pair], store: Any, problems: list[str], closers: ExitStack
) -> tuple[list[Pair], SimulatorCandidate | None]:
    """The pairs with their candidates attached (``--candidate-calls``, ``--shadow``), or the simulator to ask."""
    if args.candidate_calls:
        return attach_candidates(pairs, candidates_from_calls(args.candidate_calls, problems), "--candidate-calls", problems), None
    if args.shadow:
        from stabletoolbench_mirror.factory import build_shadow_store

        shadow = build_shadow_store(settings)
        closers.callback(shadow.close)
        return attach_candidates(pairs, candidates_from_shadow(pairs, shadow), "the shadow store", problems), None
    from stabletoolbench_mirror.factory import build_frozen
    from stabletoolbench_mirror.responders.simulator import build_simulator

    simulator = build_simulator(settings)
    closers.callback(simulator.close)
    frozen = build_frozen(settings)
    return pairs, SimulatorCandidate(simulator, store, frozen, record=args.record)


def _build_scorers(args: argparse.Namespace, closers: ExitStack) -> tuple[EmbeddingClient | None, Judge | None]:
    """The optional scorers: embeddings (``--embeddings-api-base``) and the judge (``--judge-api-base``)."""
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    embeddings = judge = None
    if args.embeddings_api_base:
        embeddings = EmbeddingClient(args.embeddings_api_base, args.embeddings_model, api_key=key)
        closers.callback(embeddings.close)
    if args.judge_api_base:
        judge = Judge(args.judge_api_base, args.judge_model, api_key=key)
        closers.callback(judge.close)
    return embeddings, judge


def _write_reports(args: argparse.Namespace, report: FidelityReport) -> int:
    """Print the summary, write ``--json`` and ``--html``; exit 1 when they cannot be written or nothing was scored."""
    data = report.to_json()
    print("\n".join(report.lines(data)))
    try:
        if args.json:
            write_json(args.json, data)
        if args.html:
            write_bytes(args.html, render_html(data).encode("utf-8", "backslashreplace"), fsync=True)
    except OSError as exc:
        raise CommandError(f"the report cannot be written: {exc}", status=1) from None
    if not report.pairs:
        raise CommandError(f"nothing was scored: none of the {len(report.problems)} calls read could be (see above)" if report.problems
                           else "nothing was scored: no reference answer was found or left (--category, --limit)", status=1)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "fidelity", cmd_fidelity, summary="score a simulator against real answers (exact, JSON, BLEU, ROUGE-L, optional embeddings and judge)")
    ref = parser.add_argument_group("reference answers")
    ref.add_argument("--calls", action="append", metavar="FILE.jsonl", help='JSONL of {"payload", "observed"} lines (repeatable)')
    add_answer_file_arguments(ref)
    ref.add_argument("--from-store", action="store_true", help="the store's real records")
    ref.add_argument("--category", action="append", help="only this category (standardised name; repeatable)")
    ref.add_argument("--limit", type=int, help="score at most this many calls")
    cand = parser.add_argument_group("candidate answers (default: the simulator of --config, asked directly)")
    cand.add_argument("--candidate-calls", action="append", metavar="FILE.jsonl", help="a second recorded set, matched by API and input")
    cand.add_argument("--shadow", action="store_true", help="the shadow store's answers (real.shadow_simulate), with --from-store")
    cand.add_argument("--record", action="store_true", help="record the simulator's answers in the store (default: nothing is recorded)")
    cand.add_argument("--concurrency", type=int, default=4, help="calls scored at once (default 4)")
    extra = parser.add_argument_group("optional metrics")
    extra.add_argument("--embeddings-api-base", metavar="URL", help="an OpenAI-compatible /v1 base for embedding cosine similarity")
    extra.add_argument("--embeddings-model", default="embedding", help="its model name")
    extra.add_argument("--judge-api-base", metavar="URL", help="an OpenAI-compatible /v1 base for an LLM judge (score 1-5)")
    extra.add_argument("--judge-model", default="judge", help="its model name")
    extra.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key of those endpoints")
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="OUT", help="write the full report as JSON")
    out.add_argument("--html", metavar="OUT", help="write a self-contained HTML report with a histogram per metric")
    out.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_config_arguments(parser)
