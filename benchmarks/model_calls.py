"""Model calls (``/v1/chat/completions``) beside tool calls (``/virtual``): what a hit costs, what a recorded miss adds.

Starts the OpenAI-compatible stub (tests/helpers/openai_stub.py, its own process) and
``stabletoolbench-mirror serve`` (record mode; the stub as the simulator of ``/virtual`` and as the
upstream of ``/v1``), then, in one run:

1. **a recorded miss**: N distinct requests one at a time, each first sent to the stub directly,
   then through the server (a tool call: the simulator's request of the same size; a model call: the same
   body), reporting the median latency each way and the median added by the server;
2. **hits**: ``--rounds`` x N requests of each kind recorded, then a fresh server in replay (its own run)
   answers them in rounds of N over ``--concurrency`` keep-alive connections, reporting the median
   requests/s and p50 of the rounds; and the first N model calls again in rounds each under a run the
   client names (``X-STM-Run``), whose occurrences are counted in the store.

    python benchmarks/model_calls.py [--requests 300] [--rounds 5] [--concurrency 8] [--prompt-words 200]

A model hit does more than a tool hit: it claims its occurrence number (in memory for the server's own
run with one worker; in the store, one small SQLite transaction, for a run shared by workers or named by
the client), then reads the record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loadgen import run_list  # noqa: E402
from _procs import free_port, process, serve_args, stub_args  # noqa: E402


def virtual_body(i: int) -> dict:
    return {"category": "Weather", "tool_name": "Bench Weather", "api_name": "Current Weather",
            "tool_input": json.dumps({"city": f"City {i}"}), "strip": "", "toolbench_key": ""}


PROMPT_WORDS = 200


def model_body(i: int) -> dict:
    """A judge's request: about 2 KB with the default ``--prompt-words``; its answer (the stub's echo) as long."""
    return {"model": "gpt-bench", "temperature": 0.2, "max_tokens": 512,
            "messages": [{"role": "system", "content": "You are a judge."},
                         {"role": "user", "content": f"Is answer {i} solved? " + "context " * PROMPT_WORDS}]}


def timed_post(session: requests.Session, url: str, body: dict, headers: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    got = session.post(url, json=body, headers=headers, timeout=60)
    elapsed = time.perf_counter() - start
    if got.status_code != 200:
        raise SystemExit(f"{url}: HTTP {got.status_code}: {got.text[:300]}")
    return elapsed


def misses(session: requests.Session, server: str, stub: str, n: int) -> dict[str, dict[str, float]]:
    out = {}
    for label, route, body_of, direct_of in (
        ("/virtual", "/virtual", virtual_body, lambda i: model_body(10_000_000 + i)),
        ("/v1", "/v1/chat/completions", model_body, model_body),
    ):
        direct, through = [], []
        for i in range(n):
            direct.append(timed_post(session, stub + "/chat/completions", direct_of(i)))
            through.append(timed_post(session, server + route, body_of(i)))
        added = [t - d for t, d in zip(through, direct, strict=True)]
        out[label] = {"direct_ms": statistics.median(direct) * 1000, "through_ms": statistics.median(through) * 1000,
                      "added_ms": statistics.median(added) * 1000}
    return out


def hit_rounds(url: str, bodies: list[bytes], rounds: int, concurrency: int, named_runs: bool = False) -> dict[str, float]:
    """``rounds`` rounds over disjoint slices of ``bodies`` (each recorded once); ``named_runs``: the same slice in
    every round, each round a run the client names (``X-STM-Run``, counted in the store)."""
    size = len(bodies) // rounds
    rps, p50 = [], []
    for r in range(rounds):
        part = bodies[:size] if named_runs else bodies[r * size:(r + 1) * size]
        headers = {"X-STM-Run": f"hits-{r}-{time.time()}"} if named_runs else None
        result = run_list(url, part, concurrency=concurrency, headers=headers)
        if result.errors:
            raise SystemExit(f"{url}: {result.errors} errors in a round of hits ({result.statuses})")
        rps.append(result.rps)
        p50.append(result.p50_ms)
    return {"rps": statistics.median(rps), "p50_ms": statistics.median(p50)}


def record_all(url: str, bodies: list[bytes], concurrency: int) -> None:
    result = run_list(url, bodies, concurrency=concurrency)
    if result.errors:
        raise SystemExit(f"{url}: {result.errors} errors while recording ({result.statuses})")


def main() -> int:
    global PROMPT_WORDS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="distinct requests of each kind")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of hits (the median is reported)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-words", type=int, default=200,
                    help="words of the model request's prompt (0: a body about the size of a tool call's)")
    args = ap.parse_args()
    PROMPT_WORDS = args.prompt_words
    n = args.requests
    tools = [json.dumps(virtual_body(i)).encode() for i in range(n * args.rounds)]
    models = [json.dumps(model_body(i)).encode() for i in range(n * args.rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        stub_port, port = free_port(), free_port()
        stub = f"http://127.0.0.1:{stub_port}/v1"
        config = Path(tmp, "server_config.yml")
        settings = {
            "mode": "record", "port": port, "log_level": "warning", "store": {"path": str(Path(tmp, "store"))},
            "simulator": {"enabled": True, "api_base": stub, "allow_without_docs": True, "validity": "off", "style": "gpt-fewshot"},
            "llm": {"upstreams": [{"base_url": stub}]},
        }
        config.write_text(json.dumps(settings))
        server = f"http://127.0.0.1:{port}"
        with process(stub_args(stub_port, 0.0), stub + "/models"):
            with process(serve_args(config), server + "/health"):
                missed = misses(requests.Session(), server, stub, n)
                record_all(server + "/virtual", tools[n:], args.concurrency)
                record_all(server + "/v1/chat/completions", models[n:], args.concurrency)
            # a fresh server in replay: its own run, so every recorded model call is occurrence 1 again
            config.write_text(json.dumps({**settings, "mode": "replay"}))
            with process(serve_args(config), server + "/health"):
                hit = {
                    "/virtual": hit_rounds(server + "/virtual", tools, args.rounds, args.concurrency),
                    "/v1": hit_rounds(server + "/v1/chat/completions", models, args.rounds, args.concurrency),
                    "/v1 X-STM-Run": hit_rounds(server + "/v1/chat/completions", models, args.rounds, args.concurrency, named_runs=True),
                }
    print(f"{'':14} {'miss: direct':>13} {'through':>9} {'added':>8} {'hits/s (c=' + str(args.concurrency) + ')':>15} {'hit p50':>9}")
    for label in ("/virtual", "/v1", "/v1 X-STM-Run"):
        m, h = missed.get(label), hit[label]
        miss = f"{m['direct_ms']:10.2f} ms {m['through_ms']:6.2f} ms {m['added_ms']:5.2f} ms" if m else f"{'':30}"
        print(f"{label:14} {miss} {h['rps']:15.0f} {h['p50_ms']:6.2f} ms")
    print(f"model hits/s over tool hits/s: {hit['/v1']['rps'] / hit['/virtual']['rps']:.2f}x (a run the client names: "
          f"{hit['/v1 X-STM-Run']['rps'] / hit['/virtual']['rps']:.2f}x); added by a recorded model miss: "
          f"{missed['/v1']['added_ms']:.2f} ms (a tool miss: {missed['/virtual']['added_ms']:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
