"""``stabletoolbench-mirror fidelity``: score a simulator (or a second recorded set) against real answers."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.commands.cli_common import add_answer_file_arguments, add_command, add_config_arguments, settings_from_args
from stabletoolbench_mirror.commands.fidelity import EmbeddingClient, FidelityReport, Judge, Pair, score_pairs, write_atomically, write_json
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.engine.responders import TakesExamples
from stabletoolbench_mirror.upstream.expectations import load_answer_expectations, load_calls_jsonl


def no_store_references(where: str, seen: Counter[str]) -> str:
    """Why ``--from-store`` found nothing to score, and what to do about it."""
    held = ", ".join(f"{n} {what}" for what, n in sorted(seen.items(), key=lambda item: (-item[1], item[0])))
    what = f"holds no real answers ({sum(seen.values())} entries: {held})" if seen else "is empty"
    return (
        f"--from-store: nothing to score: the store at {where} {what}. fidelity scores candidates against answers "
        "the real API gave: record some first (real.enabled: true, then serve in record mode or warm), "
        "or give the reference answers with --calls FILE.jsonl or --answers PATH"
    )


#: few-shot examples looked at per call (the call's own answer is left out of them)
EXAMPLE_POOL = 20


class FidelityInputError(ValueError):
    """A reference or candidate source that cannot be used."""


# -- references -----------------------------------------------------------------------------------


def _answer_of(observed: Any, text: bool) -> Any:
    if not text:
        return observed
    try:
        answer = json.loads(observed)
    except ValueError:
        raise FidelityInputError("the observation is not a whole JSON answer (cut at the client's 1,024 characters?)") from None
    if not isinstance(answer, dict):
        raise FidelityInputError("the observation is not a JSON object")
    return answer


def pairs_from_expectations(expectations: Any, problems: list[str]) -> list[Pair]:
    """Pairs (reference only) from ``check``'s expectations: calls files and answer files."""
    from pydantic import ValidationError

    from stabletoolbench_mirror.core.call import ToolCall
    from stabletoolbench_mirror.core.protocol import ToolInputParseError, VirtualRequest

    pairs = []
    for exp in expectations:
        try:
            call = ToolCall.from_request(VirtualRequest.model_validate(exp.payload))
            reference = _answer_of(exp.observed, exp.text)
        except ValidationError as exc:
            problems.append(f"{exp.location}: not a /virtual payload: {exc.errors(include_url=False)[0]['msg']}")
            continue
        except ToolInputParseError:
            problems.append(f"{exp.location}: tool_input is not JSON")
            continue
        except FidelityInputError as exc:
            problems.append(f"{exp.location}: {exc}")
            continue
        if not protocol.is_encodable(reference):
            # a "\ud800" escape: no UTF-8 report (nor store) can hold it
            problems.append(f"{exp.location}: observed contains a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape): fix or drop the line")
            continue
        pairs.append(Pair(call.api, call.key, reference, origin=exp.location, call=call))
    return pairs


def pairs_from_store(store: Any, problems: list[str], *, progress: bool, docs: Any = None, seen: Counter[str] | None = None) -> list[Pair]:
    """Pairs (reference only) from the store's ``real`` records, in a stable order.

    With ``docs``, a call gets its tool and API names as the docs spell them (as a client sends them).
    ``seen`` counts the entries read by source, real failure records as ``real failure records``.
    """
    from stabletoolbench_mirror.core.progress import progress_bar
    from stabletoolbench_mirror.core.record_calls import call_of_record

    seen = seen if seen is not None else Counter()
    pairs = []
    for record in progress_bar(store, desc="read store", unit="entry", disable=not progress):
        seen["real failure records" if record.source == "real" and record.is_failure else record.source] += 1
        if record.source != "real" or record.is_failure:
            continue  # a failure record holds what was served when no usable answer came: no reference
        call = call_of_record(record, docs)
        if call is None:
            problems.append(f"{record.api} {record.key[:100]}: the record's key is not a Python literal")
            continue
        pairs.append(Pair(record.api, record.key, record.answer, origin="store", call=call))
    pairs.sort(key=lambda p: (p.api, p.key))
    return pairs


# -- candidates -----------------------------------------------------------------------------------


def attach_candidates(pairs: list[Pair], candidates: dict[tuple[str, str], Any], what: str, problems: list[str]) -> list[Pair]:
    """Give each pair the candidate of its call (matched by API and canonical input); drop the others."""
    kept = []
    for pair in pairs:
        found = candidates.get((pair.api, pair.call.canonical))
        if found is None:
            problems.append(f"{pair.origin}: {pair.api} {pair.key[:100]}: no answer in {what}")
            continue
        pair.candidate = found
        kept.append(pair)
    return kept


def candidates_from_calls(paths: list[str], problems: list[str]) -> dict[tuple[str, str], Any]:
    found: dict[tuple[str, str], Any] = {}
    for path in paths:
        for pair in pairs_from_expectations(load_calls_jsonl(path), problems):
            found.setdefault((pair.api, pair.call.canonical), pair.reference)
    return found


def candidates_from_shadow(pairs: list[Pair], shadow: Any) -> dict[tuple[str, str], Any]:
    found: dict[tuple[str, str], Any] = {}
    for pair in pairs:
        record = shadow.get(pair.api, pair.key) or shadow.get_canonical(pair.api, pair.call.canonical)
        if record is not None and not record.is_failure:
            found[(pair.api, pair.call.canonical)] = record.answer
    return found


class SimulatorCandidate:
    """The configured simulator, asked directly (never the cache); records only with ``record=True``."""

    def __init__(self, simulator: Any, store: Any, frozen: list[Any], *, record: bool = False) -> None:
        self.simulator = simulator
        self.store = store
        self.frozen = frozen
        self.record = record

    def examples(self, call: Any) -> list[Any]:
        """Cached answers of the same API for a few-shot prompt, without the call's own answer."""
        found = list(self.store.sample(call.api, EXAMPLE_POOL)) if self.store is not None else []
        for frozen in self.frozen:
            found += frozen.sample(call.api, EXAMPLE_POOL)
        return [
            r for r in found if not r.is_failure and r.key != call.key and canonical_from_upstream_key(r.key) != call.canonical
        ]

    def __call__(self, pair: Pair) -> Any:
        from stabletoolbench_mirror.core.records import Record

        call = pair.call
        examples = self.examples(call) if isinstance(self.simulator, TakesExamples) and self.simulator.wants_examples else []
        attempt = self.simulator.respond(call, examples)
        if attempt.answer is not None and not protocol.is_encodable(attempt.answer):
            # as the server does: an answer with a lone surrogate can be neither stored nor written as UTF-8
            return protocol.miss_answer(call.api, "the simulator's answer contains a lone UTF-16 surrogate")
        if attempt.answer is not None:
            if self.record and self.store is not None:
                self.store.add(Record.from_answer(call.api, call.key, attempt.answer, "simulated", attempt.origin, attempt.meta), call.canonical)
            return attempt.answer
        if attempt.fallback is not None:
            return attempt.fallback
        return protocol.miss_answer(call.api, "the simulator gave no usable answer")


# -- the command --------------------------------------------------------------------------------------


def cmd_fidelity(args: argparse.Namespace) -> int:
    """Score candidate answers against reference (real) answers, per call, per category and overall. References: --calls,
    --answers or --from-store (the store's real records). Candidates: the configured simulator asked directly (default;
    never the cache, nothing recorded unless --record), --candidate-calls, or the shadow store (--from-store --shadow)."""
    code = _check_arguments(args)
    if code is not None:
        return code
    settings = settings_from_args(args)
    progress = not args.quiet
    report = FidelityReport()
    problems = report.problems
    with ExitStack() as closers:
        try:
            pairs, store = _load_pairs(args, settings, problems, closers, progress)
            if pairs is None:
                return 1
            pairs, candidate = _attach_candidate(args, settings, pairs, store, problems, closers)
        except ValueError as exc:  # CheckInputError, QueryFileError, the answer files' function index
            print(f"error: {exc}", file=sys.stderr)
            return 2
        embeddings, judge = _build_scorers(args, closers)
        report.pairs = score_pairs(
            pairs, candidate=candidate, embeddings=embeddings, judge=judge, concurrency=args.concurrency, progress=progress
        )
        report.scored = what_was_scored(args, settings, report.pairs, store)
    return _write_reports(args, report)


def what_was_scored(args: argparse.Namespace, settings: Any, pairs: list[Pair], store: Any) -> dict[str, Any]:
    """The report's ``scored`` block: the candidate (simulator style, model, endpoints, system prompt's sha256,
    or the recorded candidates), the references (where from, the sha256 of every scored reference answer,
    the store, each frozen snapshot's content hash) and the date (UTC)."""
    import hashlib
    import time

    from stabletoolbench_mirror.core.secrets import public_url
    from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME

    sim = settings.simulator
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.candidate_calls:
        out["candidate"] = "recorded calls: " + ", ".join(args.candidate_calls)
    elif args.shadow:
        out["candidate"] = "the shadow store (shadow simulations)"
    else:
        out["candidate"] = "simulator"
        out.update({"simulator": sim.style, "model": sim.model, "endpoints": [public_url(e) for e in sim.endpoints]})
    if not args.candidate_calls:
        from stabletoolbench_mirror.config import ConfigError
        from stabletoolbench_mirror.responders.simulator import system_prompt_for

        try:
            out["prompt_sha256"] = system_prompt_for(settings).sha256
        except ConfigError:
            out["prompt_sha256"] = None
    out["references"] = [*(f"calls: {p}" for p in args.calls or []), *(f"answers: {p}" for p in args.answers or []),
                         *(["the store's real answers"] if args.from_store else [])]
    digest = hashlib.sha256()
    for pair in sorted(pairs, key=lambda p: (p.api, p.key)):
        digest.update(json.dumps([pair.api, pair.key, pair.reference], sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    out["references_sha256"] = digest.hexdigest()
    if store is not None:
        out["store"] = f"{settings.store.kind} at " + (settings.resolve(settings.store.path) if settings.store.kind == "diskcache"
                                                       else public_url(settings.store.url or ""))
    snapshots = {}
    for tree in settings.frozen_caches:
        try:
            manifest = json.loads((Path(settings.resolve(tree)) / MANIFEST_NAME).read_text(encoding="utf-8"))
            snapshots[tree] = manifest.get("content_hash")
        except (OSError, ValueError, AttributeError):
            continue
    if snapshots:
        out["snapshots"] = snapshots
    return out


def _check_arguments(args: argparse.Namespace) -> int | None:
    """Exit status 2 (with the message printed) for flags that cannot go together or a missing dependency, else ``None``."""
    if not (args.calls or args.answers or args.from_store):
        print("error: give the reference answers: --calls FILE.jsonl, --answers PATH or --from-store", file=sys.stderr)
        return 2
    if args.shadow and not args.from_store:
        print("error: --shadow scores the shadow store against the store's real records: add --from-store", file=sys.stderr)
        return 2
    if args.shadow and args.candidate_calls:
        print("error: --shadow and --candidate-calls are two different candidates: give one", file=sys.stderr)
        return 2
    try:
        import rouge_score  # noqa: F401
        import sacrebleu  # noqa: F401
    except ImportError as exc:
        print(f"error: fidelity needs sacrebleu and rouge-score: pip install 'stabletoolbench-mirror[fidelity]' ({exc})", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print("error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    for flag, out in (("--json", args.json), ("--html", args.html)):
        folder = os.path.dirname(os.path.abspath(out)) if out else None
        if folder is not None and not os.path.isdir(folder):
            print(f"error: {flag} {out}: the folder {folder} does not exist", file=sys.stderr)
            return 2
    return None


def _load_pairs(
    args: argparse.Namespace, settings: Any, problems: list[str], closers: ExitStack, progress: bool
) -> tuple[list[Pair] | None, Any]:
    """The reference pairs (``--calls``, ``--answers``, ``--from-store``, then ``--category`` and ``--limit``)
    and the store when one is needed (closed by ``closers``).

    The pairs are ``None`` (the error printed) when ``--from-store`` is the only source and gives nothing.
    """
    from stabletoolbench_mirror.upstream.answers import function_index

    pairs: list[Pair] = []
    for path in args.calls or []:
        pairs += pairs_from_expectations(load_calls_jsonl(path), problems)
    if args.answers:
        tools = args.tools_folder or (settings.resolve(settings.tools_folder) if settings.tools_folder else None)
        found, bad = load_answer_expectations(args.answers, function_index(args.queries or [], tools))
        problems.extend(bad)
        pairs += pairs_from_expectations(found, problems)
    store = None
    if args.from_store or not (args.candidate_calls or args.shadow):
        from stabletoolbench_mirror.factory import build_store

        store = build_store(settings)
        closers.callback(store.close)
    if args.from_store:
        from_store = _pairs_from_store(settings, store, problems, progress, have_others=bool(pairs))
        if from_store is None:
            return None, store
        pairs += from_store
    if args.category:
        wanted = set(args.category)
        pairs = [p for p in pairs if p.category in wanted]
    if args.limit is not None:
        pairs = pairs[: args.limit]
    return pairs, store


def _pairs_from_store(settings: Any, store: Any, problems: list[str], progress: bool, *, have_others: bool) -> list[Pair] | None:
    """``--from-store``'s pairs; when there are none, a warning, or an error (``None``) without ``have_others``."""
    from stabletoolbench_mirror.upstream.tooldocs import tool_docs_for

    seen: Counter[str] = Counter()
    from_store = pairs_from_store(store, problems, progress=progress, docs=tool_docs_for(settings), seen=seen)
    if not from_store:
        message = no_store_references(str(getattr(store, "path", None) or getattr(store, "url", "?")), seen)
        if not have_others:
            print(f"error: {message}", file=sys.stderr)
            return None
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
            write_atomically(args.html, report.html().encode("utf-8", "backslashreplace"))
    except OSError as exc:
        print(f"error: the report cannot be written: {exc}", file=sys.stderr)
        return 1
    if not report.pairs:
        print(f"error: nothing was scored: none of the {len(report.problems)} calls read could be (see above)" if report.problems
              else "error: nothing was scored: no reference answer was found or left (--category, --limit)", file=sys.stderr)
        return 1
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
