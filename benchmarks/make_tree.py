"""Generate a realistic StableToolBench ``tool_response_cache`` tree, a matching tools folder and payloads.

    python benchmarks/make_tree.py OUT --entries 165000 --files 3000 [--seed 1]

writes, deterministically for a seed:

* ``OUT/tool_response_cache/<Category>/<tool>_for_<Category>/<api>.json``: upstream's layout, each
  file a JSON object from ``str(tool_input)`` to ``{"error": "", "response": "..."}``;
* ``OUT/tools/<Category>/<tool>.json``: a ToolBench-format doc per tool (its APIs and parameters);
* ``OUT/payloads/first_pass.jsonl``: one hit per API file (shuffled): ``/virtual`` bodies;
* ``OUT/payloads/hits.jsonl`` / ``misses.jsonl``: ``--samples`` bodies each, the API drawn uniformly;
* ``OUT/payloads/calls.jsonl``: ``--check-samples`` ``{"payload", "observed"}`` lines for ``check``;
* ``OUT/tree.json``: the parameters and totals.

Entries per file follow a Zipf law (rank r gets a share proportional to ``1 / r**zipf``, at least one
entry, at most ``--max-per-file``): a few APIs hold thousands of entries, most a handful.  Answer sizes
are log-normal around a median of ``--median-bytes`` (1 KB), cut to ``[--min-bytes, --max-bytes]``
(tens of bytes to 50 KB).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

CATEGORIES = [
    "Data", "Finance", "Sports", "Entertainment", "Travel", "Location", "Science", "Food", "Music",
    "Business", "Social", "Tools", "Email", "Weather", "Health_and_Fitness", "eCommerce", "Gaming",
    "Education", "Movies", "News_Media", "Communication", "Cryptography", "Mapping", "Search",
    "Translation", "Video_Images", "Sms", "Events", "Database", "Devices", "Energy", "Jobs", "Logistics",
    "Medical", "Monitoring", "Other", "Payments", "Reward", "Storage", "Transportation",
]
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
    "romeo sierra tango uniform victor whiskey xray yankee zulu price market city team player score weather "
    "forecast recipe order stock quote news video image track album artist flight hotel route station "
    "search result page item list detail user account token value index rate currency country language"
).split()
PARAMS = ["query", "q", "city", "symbol", "page", "limit", "lang", "country", "is_id", "category", "date", "sort"]


def zipf_counts(total: int, files: int, exponent: float, cap: int) -> list[int]:
    """``files`` counts summing to ``total``: Zipf shares, each in ``[1, cap]`` (water-filling at the cap)."""
    if files > total:
        raise SystemExit(f"--files {files} is more than --entries {total}")
    if cap * files < total:
        raise SystemExit(f"--max-per-file {cap} x --files {files} cannot hold {total} entries")
    weights = [1.0 / (rank ** exponent) for rank in range(1, files + 1)]
    counts = [1] * files
    capped: set[int] = set()
    left = total - files
    while True:
        free = [i for i in range(files) if i not in capped]
        share = sum(weights[i] for i in free)
        room = left - sum(counts[i] - 1 for i in capped)
        exact = {i: room * weights[i] / share for i in free}
        over = [i for i in free if 1 + exact[i] > cap]
        if not over:
            break
        for i in over:
            counts[i] = cap
            capped.add(i)
    floors = {i: int(exact[i]) for i in free}
    for i in free:
        counts[i] = 1 + floors[i]
    rest = total - sum(counts)
    for i in sorted(free, key=lambda i: exact[i] - floors[i], reverse=True)[:rest]:
        counts[i] += 1
    assert sum(counts) == total and all(1 <= c <= cap for c in counts)
    return counts


class Texts:
    """Answer texts of a given length, cut from one seeded blob (fast for millions of answers)."""

    def __init__(self, rng: random.Random, size: int = 1 << 20) -> None:
        parts: list[str] = []
        length = 0
        while length < size:
            word = rng.choice(WORDS)
            parts.append(word)
            length += len(word) + 1
        self.blob = " ".join(parts)

    def text(self, rng: random.Random, n: int) -> str:
        if n >= len(self.blob):
            return (self.blob * (n // len(self.blob) + 1))[:n]
        start = rng.randrange(0, len(self.blob) - n)
        return self.blob[start : start + n]


class Api:
    def __init__(self, index: int, category: str, tool: str, api: str, params: list[str], count: int, seed: int) -> None:
        self.index, self.category, self.tool, self.api = index, category, tool, api
        self.params, self.count, self.seed = params, count, seed

    @property
    def folder(self) -> str:
        return f"{self.tool}_for_{self.category}"

    def tool_input(self, i: int) -> dict[str, Any]:
        """The input of entry ``i`` (``i < 0``: an input that is not in the file)."""
        value: dict[str, Any] = {}
        for n, name in enumerate(self.params):
            if n == 0:
                value[name] = f"{WORDS[(i * 7 + self.index) % len(WORDS)]} {i}"
            elif name in ("page", "limit"):
                value[name] = (i % 9) + 1
            else:
                value[name] = WORDS[(i + n * 13 + self.index) % len(WORDS)]
        if self.index % 5 == 0:
            value["filters"] = {"tags": [WORDS[i % len(WORDS)], WORDS[(i // 3) % len(WORDS)]], "strict": i % 2 == 0}
        return value

    def payload(self, i: int) -> dict[str, Any]:
        return {"category": self.category, "tool_name": self.tool, "api_name": self.api,
                "tool_input": json.dumps(self.tool_input(i)), "strip": "", "toolbench_key": ""}


def answer_size(rng: random.Random, median: int, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, int(rng.lognormvariate(math.log(median), sigma))))


def make_apis(entries: int, files: int, seed: int, exponent: float, cap: int) -> list[Api]:
    rng = random.Random(seed)
    counts = zipf_counts(entries, files, exponent, cap)
    # the big files are spread over the tree, not all in the first category
    order = list(range(files))
    rng.shuffle(order)
    apis: list[Api] = []
    tool_no = 0
    position = 0
    while position < files:
        category = CATEGORIES[tool_no % len(CATEGORIES)]
        tool = f"tool_{tool_no:05d}_{rng.choice(WORDS)}"
        for _ in range(min(rng.randint(1, 8), files - position)):
            params = rng.sample(PARAMS, rng.randint(1, 4))
            api_name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{position:05d}"
            apis.append(Api(position, category, tool, api_name, params, counts[order[position]], seed * 1_000_003 + position))
            position += 1
        tool_no += 1
    return apis


def write_api_file(path: Path, api: Api, texts: Texts, args: argparse.Namespace) -> int:
    rng = random.Random(api.seed)
    lines = []
    for i in range(api.count):
        size = answer_size(rng, args.median_bytes, args.sigma, args.min_bytes, args.max_bytes)
        answer = {"error": "", "response": texts.text(rng, size)}
        lines.append("    " + json.dumps(str(api.tool_input(i)), ensure_ascii=False) + ": " + json.dumps(answer, ensure_ascii=False))
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    path.write_text(text, encoding="utf-8")
    return len(text)


def tool_doc(tool: str, category: str, apis: list[Api]) -> dict[str, Any]:
    return {
        "tool_name": tool.replace("_", " ").title(),
        "tool_description": f"Generated tool {tool} for scale benchmarks.",
        "standardized_name": tool,
        "api_list": [
            {
                "name": a.api,
                "description": f"Generated API {a.api}.",
                "method": "GET",
                "url": f"https://{tool.replace('_', '-')}.example.invalid/{a.api}",
                "required_parameters": [{"name": p, "type": "STRING", "description": p, "default": ""} for p in a.params[:1]],
                "optional_parameters": [{"name": p, "type": "STRING", "description": p, "default": ""} for p in a.params[1:]],
                "template_response": {"response": "str"},
            }
            for a in apis
        ],
    }


def write_jsonl(path: Path, rows: list[Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output folder (created; must not hold a tree yet)")
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of entries per file (default 1.0)")
    ap.add_argument("--max-per-file", type=int, default=5000)
    ap.add_argument("--median-bytes", type=int, default=1000)
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of answer sizes")
    ap.add_argument("--min-bytes", type=int, default=20)
    ap.add_argument("--max-bytes", type=int, default=50_000)
    ap.add_argument("--samples", type=int, default=20_000, help="lines of hits.jsonl and misses.jsonl")
    ap.add_argument("--check-samples", type=int, default=10_000, help="lines of calls.jsonl")
    ap.add_argument("--quiet", "-q", action="store_true")
    args = ap.parse_args(argv)

    out = Path(args.out)
    cache = out / "tool_response_cache"
    if cache.exists():
        print(f"error: {cache} exists; generate into a new folder", file=sys.stderr)
        return 2
    started = time.perf_counter()
    apis = make_apis(args.entries, args.files, args.seed, args.zipf, args.max_per_file)
    rng = random.Random(args.seed + 17)
    texts = Texts(random.Random(args.seed + 29))

    # which entries the payload files name, drawn before the files are written (API uniformly, then entry)
    hit_rows = [(a.index, rng.randrange(a.count)) for a in (rng.choice(apis) for _ in range(args.samples))]
    miss_rows = [(rng.choice(apis).index, -1 - rng.randrange(1_000_000)) for _ in range(args.samples)]
    check_rows = [(a.index, rng.randrange(a.count)) for a in (rng.choice(apis) for _ in range(args.check_samples))]
    wanted: dict[int, set[int]] = {}
    for index, i in check_rows:
        wanted.setdefault(index, set()).add(i)

    total_bytes = 0
    observed: dict[tuple[int, int], Any] = {}
    by_tool: dict[tuple[str, str], list[Api]] = {}
    for n, api in enumerate(apis):
        folder = cache / api.category / api.folder
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{api.api}.json"
        total_bytes += write_api_file(path, api, texts, args)
        if api.index in wanted:
            data = json.loads(path.read_text(encoding="utf-8"))
            for i in wanted[api.index]:
                observed[(api.index, i)] = data[str(api.tool_input(i))]
        by_tool.setdefault((api.category, api.tool), []).append(api)
        if not args.quiet and (n + 1) % 500 == 0:
            print(f"  {n + 1}/{len(apis)} files, {total_bytes / 1e6:.0f} MB", file=sys.stderr, flush=True)

    for (category, tool), tool_apis in by_tool.items():
        folder = out / "tools" / category
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{tool}.json").write_text(json.dumps(tool_doc(tool, category, tool_apis), indent=2), encoding="utf-8")

    payloads = out / "payloads"
    payloads.mkdir(parents=True, exist_ok=True)
    first = [a.payload(rng.randrange(a.count)) for a in apis]
    rng.shuffle(first)
    write_jsonl(payloads / "first_pass.jsonl", first)
    write_jsonl(payloads / "hits.jsonl", [apis[index].payload(i) for index, i in hit_rows])
    write_jsonl(payloads / "misses.jsonl", [apis[index].payload(i) for index, i in miss_rows])
    write_jsonl(payloads / "calls.jsonl", [{"payload": apis[index].payload(i), "observed": observed[(index, i)]} for index, i in check_rows])

    counts = sorted((a.count for a in apis), reverse=True)
    summary = {
        "entries": args.entries, "files": len(apis), "tools": len(by_tool), "seed": args.seed, "zipf": args.zipf,
        "max_per_file": args.max_per_file, "largest_files": counts[:5], "median_per_file": counts[len(counts) // 2],
        "bytes": total_bytes, "seconds": round(time.perf_counter() - started, 1),
    }
    (out / "tree.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if not args.quiet:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
