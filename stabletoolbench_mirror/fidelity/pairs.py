"""The pairs ``fidelity`` scores: reference answers from calls files, answer files or the store's real records, and
their candidates from a second calls file, the shadow store or the configured simulator asked directly; and what was
scored, written in the report (:func:`what_was_scored`: the candidate, the references' sources and hash, the store, the
snapshots)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.engine.responders import TakesExamples
from stabletoolbench_mirror.fidelity.metrics import Pair
from stabletoolbench_mirror.upstream.expectations import load_calls_jsonl


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


def pairs_from_store(store: Any, problems: list[str], *, progress: bool, docs: Any, seen: Counter[str]) -> list[Pair]:
    """Pairs (reference only) from the store's ``real`` records, in a stable order.

    With ``docs``, a call gets its tool and API names as the docs spell them (as a client sends them).
    ``seen`` counts the entries read by source, real failure records as ``real failure records``.
    """
    from stabletoolbench_mirror.core.progress import progress_bar
    from stabletoolbench_mirror.core.record_calls import call_of_record

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


def what_was_scored(settings: Any, pairs: list[Pair], store: Any, *, references: list[str], candidate_calls: list[str],
                    shadow: bool) -> dict[str, Any]:
    """The report's ``scored`` block: the candidate (simulator style, model, endpoints, system prompt's sha256,
    or the recorded candidates, ``candidate_calls``, or the shadow store), the references (where from, as
    ``references`` names them, the sha256 of every scored reference answer, the store, each frozen snapshot's
    content hash) and the date (UTC)."""
    from stabletoolbench_mirror.stores.kinds import StoreSpec

    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **_candidate(settings, candidate_calls, shadow)}
    out["references"] = references
    out["references_sha256"] = _references_sha256(pairs)
    if store is not None:
        spec = StoreSpec.of(settings)
        out["store"] = f"{spec.kind} at {spec.where}"
    snapshots = _snapshot_hashes(settings)
    if snapshots:
        out["snapshots"] = snapshots
    return out


def _candidate(settings: Any, candidate_calls: list[str], shadow: bool) -> dict[str, Any]:
    """What answered: the recorded candidates, the shadow store or the simulator (and its system prompt's sha256)."""
    from stabletoolbench_mirror.config import ConfigError
    from stabletoolbench_mirror.core.secrets import public_url
    from stabletoolbench_mirror.responders.simulator import system_prompt_for

    if candidate_calls:
        return {"candidate": "recorded calls: " + ", ".join(candidate_calls)}
    sim = settings.simulator
    out: dict[str, Any] = {"candidate": "the shadow store (shadow simulations)"} if shadow else {
        "candidate": "simulator", "simulator": sim.style, "model": sim.model, "endpoints": [public_url(e) for e in sim.endpoints]}
    try:
        out["prompt_sha256"] = system_prompt_for(settings).sha256
    except ConfigError:
        out["prompt_sha256"] = None
    return out


def _references_sha256(pairs: list[Pair]) -> str:
    digest = hashlib.sha256()
    for pair in sorted(pairs, key=lambda p: (p.api, p.key)):
        digest.update(json.dumps([pair.api, pair.key, pair.reference], sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _snapshot_hashes(settings: Any) -> dict[str, Any]:
    """The content hash of each frozen cache that is a snapshot (has a readable manifest)."""
    from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME

    snapshots = {}
    for tree in settings.frozen_caches:
        try:
            manifest = json.loads((Path(settings.resolve(tree)) / MANIFEST_NAME).read_text(encoding="utf-8"))
            snapshots[tree] = manifest.get("content_hash")
        except (OSError, ValueError, AttributeError):
            continue
    return snapshots
