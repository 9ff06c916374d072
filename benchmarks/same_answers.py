#!/usr/bin/env python3
"""Do two checkouts of this project answer ``POST /virtual`` byte for byte alike?

Starts ``serve`` from each checkout (``--old`` and ``--new``, each on its own code through
``PYTHONPATH``) in ``replay`` mode over StableToolBench's reference cache, sends both the same
corpus, and compares each answer's status, body and headers (``date``, ``server`` and the
worker's pid aside).  The corpus: the reference calls (``calls.jsonl``), then a seeded corpus
of variations of them: key order and spacing, string, list, number and nested inputs, NaN and
huge numbers, deep nesting, invalid JSON, missing or mistyped fields, unknown names, unicode and lone
surrogates, ``chat_with_user``.  Prints the counts and the first differences; exit status 1 when
any answer differs.

    python benchmarks/same_answers.py --old /path/to/old/checkout [--new .] [--cases 2000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
from _procs import REPO, free_port, serve_checkout

SKIP_HEADERS = {"date", "server", "x-stm-worker"}
FIELDS = ("category", "tool_name", "api_name", "tool_input", "strip", "toolbench_key")


def corpus(calls: list[dict[str, Any]], cases: int, seed: int) -> Iterator[bytes]:
    """The reference payloads, then ``cases`` seeded variations of them, as request bodies."""
    for call in calls:
        yield json.dumps(call["payload"]).encode()
    rng = random.Random(seed)
    inputs = [
        lambda v: json.dumps(v), lambda v: json.dumps(dict(reversed(list(v.items())))) if isinstance(v, dict) else "[]",
        lambda v: json.dumps(v, indent=2), lambda v: json.dumps(str(v)), lambda v: json.dumps([v]),
        lambda v: "5", lambda v: '"5"', lambda v: "null", lambda v: '"None"', lambda v: "", lambda v: "{}",
        lambda v: "{bad", lambda v: '{"a": NaN}', lambda v: '{"a": 1e999}', lambda v: "[" * 300 + "]" * 300,
        lambda v: '{"q": "\\ud800"}', lambda v: '{"q": "caf\u00e9 \u6771\u4eac"}', lambda v: json.dumps({"x": v}),
        lambda v: '"' + str(v).replace('"', "'") + ' #history=' + "0" * 32 + '"',
    ]
    for _ in range(cases):
        payload = dict(rng.choice(calls)["payload"])
        try:
            value = json.loads(payload["tool_input"]) if payload["tool_input"] else {}
        except ValueError:
            value = {}
        payload["tool_input"] = rng.choice(inputs)(value)
        roll = rng.random()
        if roll < 0.05:
            payload.pop(rng.choice(FIELDS), None)
        elif roll < 0.10:
            payload[rng.choice(FIELDS)] = rng.choice([1, None, [], {"a": 1}, True])
        elif roll < 0.15:
            payload["api_name"] = rng.choice(["chat_with_user", "no such api", "../../etc/passwd", "x" * 300])
        elif roll < 0.20:
            payload["tool_name"] = payload["tool_name"].upper()
        body = json.dumps(payload)
        if rng.random() < 0.03:
            body = body[: rng.randrange(len(body))]  # a cut body
        yield body.encode()


def config(folder: Path, cache: Path) -> Path:
    path = folder / "server_config.yml"
    path.write_text(f"mode: replay\nfrozen_caches: [{json.dumps(str(cache))}]\nstore: {{path: {json.dumps(str(folder / 'store'))}}}\n")
    return path


def answer(session: requests.Session, url: str, body: bytes) -> tuple[int, bytes, list[tuple[str, str]]]:
    r = session.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=60)
    headers = sorted((k.lower(), v) for k, v in r.headers.items() if k.lower() not in SKIP_HEADERS)
    return r.status_code, r.content, headers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the other checkout (its repository root)")
    ap.add_argument("--new", default=str(REPO), help="this checkout (default: the one holding this script)")
    ap.add_argument("--reference", default=str(REPO.parent / "shared" / "reference"))
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    reference = Path(args.reference)
    calls = [json.loads(line) for line in (reference / "calls.jsonl").read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        old_dir, new_dir = Path(tmp, "old"), Path(tmp, "new")
        old_dir.mkdir(), new_dir.mkdir()
        old_port, new_port = free_port(), free_port()
        with serve_checkout(Path(args.old).resolve(), config(old_dir, reference / "cache"), old_port), \
                serve_checkout(Path(args.new).resolve(), config(new_dir, reference / "cache"), new_port):
            s_old, s_new = requests.Session(), requests.Session()
            total = same = hits = 0
            differences: list[str] = []
            for body in corpus(calls, args.cases, args.seed):
                total += 1
                a = answer(s_old, f"http://127.0.0.1:{old_port}/virtual", body)
                b = answer(s_new, f"http://127.0.0.1:{new_port}/virtual", body)
                if a == b:
                    same += 1
                    hits += ("x-stm-outcome", "hit") in a[2]
                elif len(differences) < 10:
                    differences.append(f"{body[:200]!r}\n  old: {a[0]} {a[1][:200]!r} {a[2]}\n  new: {b[0]} {b[1][:200]!r} {b[2]}")
    print(f"{total} requests ({len(calls)} reference calls, {args.cases} variations, seed {args.seed}): "
          f"{same} answered byte-identical (status, body, headers), {total - same} differ; {hits} of the identical were hits")
    for line in differences:
        print(line)
    return 0 if same == total else 1


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
