"""How close simulated answers are to real ones: ``stabletoolbench-mirror fidelity``.

A *pair* is one call with a **reference** answer (what the real API answered) and a
**candidate** answer (what a simulator answers, or a second recorded set).  References come
from a calls file (``{"payload", "observed"}`` lines, as ``check`` reads), StableToolBench
answer files, or the store's ``real`` records; candidates from the configured simulator,
asked directly (never the cache; the call's own recorded answer is never one of its
few-shot examples), from a second calls file, or from the shadow store (``--shadow``).

Metrics per pair, compared on the ``response`` texts (a response that is not a string is
compared as its JSON text, :func:`response_text`):

``exact``            1 when the whole answers are equal (``error`` and ``response``), else 0
``json_valid``       1 when the candidate's response is JSON, else 0
``error_agreement``  1 when both ``error`` fields are empty or both are not, else 0
``key_jaccard``      Jaccard index of the object keys (at any depth) of the two responses
                     parsed as JSON; ``null`` when neither is JSON
``bleu``             sacrebleu's sentence BLEU with its default settings (0-100)
``rouge_l``          rouge-score's ROUGE-L F1 without stemming (0-1): its tokenizer and F-measure;
                     the LCS length by rapidfuzz's ``LCSseq`` instead of its Python table
                     (the same number, much faster; a test compares the two)
``cosine``           cosine similarity of the two texts' embeddings from an OpenAI-compatible
                     ``/v1/embeddings`` endpoint (optional; one request per pair)
``judge``            an LLM judge's score from 1 to 5 (optional; one chat request per pair,
                     with this project's own judge prompt, :data:`JUDGE_SYSTEM_PROMPT`)

Aggregates are means over the pairs where a metric has a value (``null`` when none has).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz.distance import LCSseq

from stabletoolbench_mirror.core.files import write_bytes
from stabletoolbench_mirror.core.naming import category_of
from stabletoolbench_mirror.reporting.page import bar_chart, esc, page, table

log = logging.getLogger(__name__)

METRICS = ("exact", "json_valid", "error_agreement", "key_jaccard", "bleu", "rouge_l", "cosine", "judge")
#: the range of each metric (for histograms)
RANGES = {"bleu": (0.0, 100.0), "judge": (1.0, 5.0)}
JUDGE_SCALE = (1, 5)
MAX_JUDGE_TEXT_CHARS = 6000

JUDGE_SYSTEM_PROMPT = """\
You grade an API simulator. You get one call of an API (its name and input), the response the \
real API gave, and the response the simulator gave for the same call. Judge how well the \
simulated response could stand in for the real one for an agent that uses the API: the same \
kind of content, the same structure and fields, a plausible level of detail, and no error where \
the real API succeeded (or the other way round). Concrete values (ids, numbers, names) need not \
match the real ones, but they must fit the input.

Use this scale:
1 - unusable: wrong kind of answer, an error, or empty
2 - poor: related, but most of the structure or content is missing or wrong
3 - fair: the right kind of answer with clear gaps or mistakes
4 - good: close in structure and content, minor differences
5 - as useful as the real response

Reply with one JSON object and nothing else: {"score": <an integer from 1 to 5>}"""


# -- texts ----------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """A string itself, else its JSON text (``None``: empty)."""
    return "" if value is None else value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def response_text(answer: Any) -> str:
    """The text of an answer's ``response`` (of the answer itself when it is no object)."""
    return _text(answer.get("response", "") if isinstance(answer, Mapping) else answer)


def error_text(answer: Any) -> str:
    return _text(answer.get("error", "")) if isinstance(answer, Mapping) else ""


def _json_value(answer: Any) -> tuple[bool, Any]:
    """Whether the response is JSON, and its value."""
    value = answer.get("response") if isinstance(answer, Mapping) else answer
    if isinstance(value, (dict, list)):
        return True, value
    if not isinstance(value, str):
        return False, None
    try:
        return True, json.loads(value)
    except (ValueError, RecursionError):
        return False, None


def key_set(value: Any) -> set[str]:
    """Every object key in a JSON value, at any depth."""
    keys: set[str] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            keys.update(str(k) for k in current)
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return keys


def _same_answer(a: Any, b: Any) -> bool:
    try:
        return json.dumps(a, ensure_ascii=False, sort_keys=False) == json.dumps(b, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        return False


def import_rouge() -> tuple[Any, Any]:
    """rouge-score's ``rouge_scorer`` and ``tokenizers`` modules, with absl's logging defused.

    rouge-score imports absl, whose (unattached) log handler keeps the ``sys.stderr`` of the
    moment it was imported and *closes* it when any later ``logging.config.dictConfig`` (e.g.
    uvicorn starting) shuts the existing handlers down, unless it is the current
    ``sys.stderr``.  Pointing that handler at the process's real stderr makes the close a no-op.
    """
    import sys

    from rouge_score import rouge_scorer, tokenizers

    try:
        from absl import logging as absl_logging

        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
    except (ImportError, AttributeError):  # another absl version: nothing to defuse
        pass
    return rouge_scorer, tokenizers


class Scorer:
    """The local metrics of a pair (sacrebleu and rouge-score objects are built once)."""

    def __init__(self) -> None:
        from sacrebleu.metrics import BLEU

        rouge_scorer, tokenizers = import_rouge()

        # exactly what sacrebleu.sentence_bleu(hyp, [ref]) builds, kept for all pairs
        self._bleu = BLEU(tokenize="13a", smooth_method="exp", lowercase=False, effective_order=True)
        from rouge_score import scoring

        # rouge-score's default tokenizer without stemming, as RougeScorer(["rougeL"], use_stemmer=False) uses it
        self._tokenizer = tokenizers.DefaultTokenizer(use_stemmer=False)
        self._fmeasure = scoring.fmeasure

    def score(self, reference: Any, candidate: Any) -> dict[str, Any]:
        ref_text, cand_text = response_text(reference), response_text(candidate)
        ref_json, ref_value = _json_value(reference)
        cand_json, cand_value = _json_value(candidate)
        if ref_json or cand_json:
            ref_keys = key_set(ref_value) if ref_json else set()
            cand_keys = key_set(cand_value) if cand_json else set()
            union = ref_keys | cand_keys
            jaccard: float | None = len(ref_keys & cand_keys) / len(union) if union else float(ref_json == cand_json)
        else:
            jaccard = None
        return {
            "exact": float(_same_answer(reference, candidate)),
            "json_valid": float(cand_json),
            "error_agreement": float(bool(error_text(reference)) == bool(error_text(candidate))),
            "key_jaccard": jaccard,
            "bleu": self._bleu.sentence_score(cand_text, [ref_text]).score,
            "rouge_l": self.rouge_l(ref_text, cand_text),
        }

    def rouge_l(self, reference: str, candidate: str) -> float:
        """rouge-score's ROUGE-L F1 (``RougeScorer(["rougeL"], use_stemmer=False).score(reference, candidate)``)."""
        target, prediction = self._tokenizer.tokenize(reference), self._tokenizer.tokenize(candidate)
        if not target or not prediction:
            return 0
        lcs = LCSseq.similarity(target, prediction)
        return self._fmeasure(lcs / len(prediction), lcs / len(target))


# -- optional remote metrics ------------------------------------------------------------------------


class EmbeddingClient:
    """Cosine similarity through an OpenAI-compatible ``/v1/embeddings`` endpoint (one request per pair)."""

    def __init__(self, api_base: str, model: str, *, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        import requests

        self.url = api_base.rstrip("/") + "/embeddings"
        self.model = model
        self._session = requests.Session()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout_s

    def cosine(self, reference: str, candidate: str) -> float | None:
        import requests

        body = {"model": self.model, "input": [reference or " ", candidate or " "]}
        try:
            response = self._session.post(self.url, json=body, headers=self._headers, timeout=self._timeout)
            data = response.json()
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            rows = sorted(data["data"], key=lambda r: r.get("index", 0))
            a, b = rows[0]["embedding"], rows[1]["embedding"]
        except (requests.RequestException, ValueError, KeyError, IndexError, TypeError) as exc:
            log.warning("embedding request failed: %s", str(exc)[:200])
            return None
        return cosine(a, b)

    def close(self) -> None:
        self._session.close()


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    if len(a) != len(b) or not a:
        return None
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else None


class Judge:
    """An LLM judge through an OpenAI-compatible chat endpoint (one request per pair)."""

    def __init__(self, api_base: str, model: str, *, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        from stabletoolbench_mirror.responders.simulator.client import ChatClient

        self.client = ChatClient(
            api_base, model=model, api_key=api_key, temperature=0.0, max_tokens=32, seed=0, read_timeout_s=timeout_s, max_retries=2
        )

    @staticmethod
    def messages(api: str, tool_input: str, reference: str, candidate: str) -> list[dict[str, str]]:
        cut = MAX_JUDGE_TEXT_CHARS
        user = (
            f"API: {api}\nInput: {tool_input[:cut]}\n\n"
            f"Real response:\n{reference[:cut]}\n\nSimulated response:\n{candidate[:cut]}"
        )
        return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def score(self, api: str, tool_input: str, reference: str, candidate: str) -> float | None:
        from stabletoolbench_mirror.responders.simulator.client import ChatError

        try:
            completion = self.client.complete(self.messages(api, tool_input, reference, candidate))
        except ChatError as exc:
            log.warning("judge request failed: %s", exc.detail)
            return None
        return parse_judge_score(completion.content)

    def close(self) -> None:
        self.client.close()


def parse_judge_score(text: str) -> float | None:
    """The judge's score: ``{"score": N}``, else the first integer on the scale in the text."""
    low, high = JUDGE_SCALE
    match = re.search(r'"score"\s*:\s*"?(\d+(?:\.\d+)?)', text or "")
    if match is None:
        match = re.search(r"(?<![\d.])([1-9])(?![\d.])", text or "")
    if match is None:
        return None
    value = float(match.group(1))
    return value if low <= value <= high else None


# -- pairs and the report ----------------------------------------------------------------------------


@dataclass
class Pair:
    """One call with its reference and candidate answers."""

    api: str
    """The api ``<category>/<tool>_for_<category>/<api>``."""
    key: str
    """The upstream key of the input."""
    reference: Any
    candidate: Any = None
    origin: str = ""
    scores: dict[str, Any] = field(default_factory=dict)
    call: Any = field(default=None, repr=False)
    """The :class:`~stabletoolbench_mirror.core.call.ToolCall` (for asking a simulator)."""

    @property
    def category(self) -> str:
        return category_of(self.api)

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "api": self.api,
            "category": self.category,
            "key": self.key,
            "reference": self.reference,
            "candidate": self.candidate,
        }
        row.update({m: self.scores.get(m) for m in METRICS})
        row["origin"] = self.origin
        return row


def aggregate(pairs: Sequence[Pair]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(pairs)}
    for metric in METRICS:
        values = [p.scores[metric] for p in pairs if p.scores.get(metric) is not None]
        out[metric] = sum(values) / len(values) if values else None
    return out


@dataclass
class FidelityReport:
    pairs: list[Pair] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    scored: dict[str, Any] = field(default_factory=dict)
    """What was scored (the candidate, its model and prompt, the references and their hash, the date):
    see :func:`.pairs.what_was_scored`."""

    def to_json(self) -> dict[str, Any]:
        by_category: dict[str, list[Pair]] = defaultdict(list)
        for pair in self.pairs:
            by_category[pair.category].append(pair)
        return {
            "scored": dict(self.scored),
            "aggregate": aggregate(self.pairs),
            "by_category": {c: aggregate(ps) for c, ps in sorted(by_category.items())},
            "calls": [p.to_json() for p in self.pairs],
            "problems": list(self.problems),
        }

    def lines(self, data: dict[str, Any]) -> list[str]:
        """The summary table of ``data`` (:meth:`to_json`) and the calls that could not be scored."""
        rows = [("all", data["aggregate"])] + list(data["by_category"].items())
        width = max(len(name) for name, _ in rows)
        header = f"{'category':<{width}}  {'n':>5}" + "".join(f"  {m:>15}" for m in METRICS)
        out = [header]
        for name, agg in rows:
            out.append(f"{name:<{width}}  {agg['n']:>5}" + "".join(f"  {_fmt(agg[m]):>15}" for m in METRICS))
        if self.problems:
            out.append(f"{len(self.problems)} calls could not be scored:")
            out.extend(f"  {p}" for p in self.problems[:20])
            if len(self.problems) > 20:
                out.append(f"  ... and {len(self.problems) - 20} more (see --json)")
        return out


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def score_pairs(
    pairs: Sequence[Pair],
    *,
    candidate: Callable[[Pair], Any] | None = None,
    embeddings: EmbeddingClient | None = None,
    judge: Judge | None = None,
    concurrency: int = 1,
    progress: bool = False,
    scorer: Scorer | None = None,
) -> list[Pair]:
    """Fill each pair's candidate (when ``candidate`` is given) and scores; returns the pairs in order."""
    from concurrent.futures import ThreadPoolExecutor

    from stabletoolbench_mirror.core.progress import progress_bar

    scorer = scorer or Scorer()

    def work(pair: Pair) -> Pair:
        if candidate is not None:
            pair.candidate = candidate(pair)
        pair.scores = scorer.score(pair.reference, pair.candidate)
        ref_text, cand_text = response_text(pair.reference), response_text(pair.candidate)
        pair.scores["cosine"] = embeddings.cosine(ref_text, cand_text) if embeddings is not None else None
        pair.scores["judge"] = judge.score(pair.api, pair.key, ref_text, cand_text) if judge is not None else None
        return pair

    with progress_bar(total=len(pairs), desc="fidelity", unit="call", disable=not progress) as bar, \
            ThreadPoolExecutor(max_workers=concurrency) as pool:
        # one pair at a time in this thread (the pool starts no thread then), else ``concurrency`` at a time in the pool
        for _ in map(work, pairs) if concurrency <= 1 else pool.map(work, pairs):
            bar.update(1)
    return list(pairs)


# -- HTML ------------------------------------------------------------------------------------------------


def _histogram(metric: str, values: Sequence[float], low: float, high: float, bins: int = 10) -> str:
    """The calls' values of ``metric`` counted in ``bins`` equal ranges from ``low`` to ``high``, drawn as bars."""
    counts = [0] * bins
    span = (high - low) or 1.0
    for value in values:
        counts[min(bins - 1, max(0, int((value - low) / span * bins)))] += 1
    rows = [(f"{low + span * i / bins:g} to {low + span * (i + 1) / bins:g}", float(n), "#4c78a8") for i, n in enumerate(counts)]
    return bar_chart(f"histogram-{metric}", f"{metric}: calls per range of values", rows)


def render_html(data: dict[str, Any], title: str = "stabletoolbench-mirror fidelity") -> str:
    """The self-contained page of ``data`` (:meth:`FidelityReport.to_json`), drawn by :mod:`..reporting.page`."""
    scored = [(k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) for k, v in data.get("scored", {}).items()]
    means = [[name, agg["n"], *(_fmt(agg[m]) for m in METRICS)]
             for name, agg in [("all", data["aggregate"]), *data["by_category"].items()]]
    parts = [f"<h1>{esc(title)}</h1><h2>What was scored</h2>", table("scored", ["", ""], scored, [False, False]),
             "<h2>Means</h2>", table("means", ["category", "n", *METRICS], means, [False, True, *([False] * len(METRICS))]),
             "<h2>Distributions</h2>"]
    for metric in METRICS:
        values = [c[metric] for c in data["calls"] if c.get(metric) is not None]
        low, high = RANGES.get(metric, (0.0, 1.0))
        parts.append(_histogram(metric, values, low, high) if values else f'<p class="note">{esc(metric)}: not computed</p>')
    worst = sorted(data["calls"], key=lambda c: (c.get("bleu") is None, c.get("bleu") or 0.0))[:50]
    rows = [[c["api"], c["key"][:200], _fmt(c.get("bleu")), _fmt(c.get("rouge_l")), response_text(c["reference"])[:300],
             response_text(c["candidate"])[:300]] for c in worst]
    parts += ["<h2>Lowest BLEU (up to 50 calls)</h2>",
              table("lowest", ["api", "input", "bleu", "rouge_l", "reference", "candidate"], rows, [False] * 6)]
    return page(title, parts, note="The same figures as JSON: <code>stabletoolbench-mirror fidelity --json FILE</code>.")


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file beside it, then renamed).

    Text no UTF-8 can hold (a lone surrogate) is written as its JSON escape, never a crash halfway.
    """
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        encoded = (json.dumps(data, indent=2, ensure_ascii=True) + "\n").encode("ascii")
    write_bytes(path, encoded, fsync=True)
