"""Fidelity scoring speed: seconds to score 1,000 pairs with the local metrics (no embeddings, no judge).

The reference answers are the recorded answers of ``../shared/reference/cache`` (cycled to
1,000); each candidate is its reference with words dropped and changed, so BLEU and ROUGE-L
do real work.  Scoring runs in this process, one thread, as ``fidelity --concurrency 1``.

Target (issue 11): <= 5 s for 1,000 pairs.

    python benchmarks/fidelity.py [--pairs 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stabletoolbench_mirror.fidelity.metrics import Pair, Scorer, score_pairs  # noqa: E402
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file  # noqa: E402


def reference_answers(root: Path) -> list[tuple[str, str, dict]]:
    out = []
    for api, path in iter_cache_files(root):
        for key, answer in read_cache_file(path).items():
            if isinstance(answer, dict):
                out.append((api, key, answer))
    return out


def perturb(answer: dict, rng: random.Random) -> dict:
    response = answer.get("response", "")
    text = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
    words = [w for w in text.split(" ") if rng.random() > 0.2]
    for i in range(0, len(words), 7):
        words[i] = words[i][::-1]
    return {"error": "", "response": " ".join(words)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", default=str(REPO.parent / "shared" / "reference" / "cache"))
    args = parser.parse_args()
    answers = reference_answers(Path(args.cache))
    if not answers:
        raise SystemExit(f"no reference answers under {args.cache}")
    rng = random.Random(0)
    base = [answers[i % len(answers)] for i in range(args.pairs)]
    chars = sum(len(json.dumps(a[2]["response"])) for a in base) / len(base)
    scorer = Scorer()
    times = []
    for _ in range(args.repeat):
        pairs = [Pair(ns, key, answer, perturb(answer, rng)) for ns, key, answer in base]
        started = time.perf_counter()
        score_pairs(pairs, scorer=scorer)
        times.append(time.perf_counter() - started)
    print(f"pairs: {args.pairs} (from {len(answers)} recorded answers, mean response {chars:.0f} chars)")
    print(f"seconds to score: median {statistics.median(times):.2f}, best {min(times):.2f} (runs: {', '.join(f'{t:.2f}' for t in times)})")
    print(f"target <= 5 s: {'met' if statistics.median(times) <= 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
