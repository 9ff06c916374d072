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
    python benchmarks/model_calls.py --before /path/to/old/checkout

With ``--before CHECKOUT``, the same servers of another checkout (its own code through ``PYTHONPATH``, its
own store) against the same stub, both up at once: the misses measured in chunks and the rounds of hits
interleaved between the checkouts, so each meets the same swings of the machine's load, and the figures of
both printed side by side with their ratio.

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
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loadgen import run_list  # noqa: E402
from _procs import REPO, free_port, process, serve_checkout, stub_args  # noqa: E402


def virtual_body(i: int) -> dict:
    return {"category": "Weather", "tool_name": "Bench Weather", "api_name": "Current Weather",
            "tool_input": json.dumps({"city": f"City {i}"}), "strip": "", "toolbench_key": ""}


PROMPT_WORDS = 200
KINDS = ("/virtual", "/v1", "/v1 X-STM-Run")


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


@dataclass
class Checkout:
    label: str
    path: Path
    config: Path
    url: str
    settings: dict


def configure(label: str, path: Path, tmp: Path, stub: str) -> Checkout:
    port = free_port()
    settings = {
        "mode": "record", "port": port, "log_level": "warning", "store": {"path": str(tmp / f"store-{label}")},
        "simulator": {"enabled": True, "api_base": stub, "allow_without_docs": True, "validity": "off", "style": "gpt-fewshot"},
        "llm": {"upstreams": [{"base_url": stub}]},
    }
    config = tmp / f"server_config-{label}.yml"
    config.write_text(json.dumps(settings))
    return Checkout(label, path, config, f"http://127.0.0.1:{port}", settings)


def misses(checkouts: list[Checkout], stub: str, n: int, chunk: int = 20) -> dict[str, dict[str, dict[str, float]]]:
    """Per checkout and kind: the median direct and through latencies and the median added; the checkouts' chunks
    interleaved (each checkout has a store of its own: the same requests are misses in each)."""
    session = requests.Session()
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for label, route, body_of, direct_of in (
        ("/virtual", "/virtual", virtual_body, lambda i: model_body(10_000_000 + i)),
        ("/v1", "/v1/chat/completions", model_body, model_body),
    ):
        for start in range(0, n, chunk):
            for checkout in checkouts:
                for i in range(start, min(n, start + chunk)):
                    direct = timed_post(session, stub + "/chat/completions", direct_of(i))
                    through = timed_post(session, checkout.url + route, body_of(i))
                    samples.setdefault((checkout.label, label), []).append((direct, through))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (checkout, label), pairs in samples.items():
        out.setdefault(checkout, {})[label] = {
            "direct_ms": statistics.median(d for d, _ in pairs) * 1000,
            "through_ms": statistics.median(t for _, t in pairs) * 1000,
            "added_ms": statistics.median(t - d for d, t in pairs) * 1000}
    return out


def record_all(url: str, bodies: list[bytes], concurrency: int) -> None:
    result = run_list(url, bodies, concurrency=concurrency)
    if result.errors or set(result.statuses) != {200}:
        raise SystemExit(f"{url}: {result.errors} errors while recording ({result.statuses})")


def hit_rounds(checkouts: list[Checkout], bodies: dict[str, list[bytes]], rounds: int, concurrency: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per checkout and kind, the median requests/s and p50 of ``rounds`` rounds, the checkouts' rounds interleaved:
    disjoint slices of the recorded bodies (each recorded once); ``/v1 X-STM-Run``: the same slice in every round,
    each round a run the client names (counted in the store).  The checkouts take turns going first."""
    size = len(bodies["/virtual"]) // rounds
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(rounds):
        for kind in KINDS:
            for checkout in checkouts if r % 2 == 0 else checkouts[::-1]:  # neither checkout always goes first
                route = "/virtual" if kind == "/virtual" else "/v1/chat/completions"
                named = kind == "/v1 X-STM-Run"
                part = bodies[kind][:size] if named else bodies[kind][r * size:(r + 1) * size]
                headers = {"X-STM-Run": f"hits-{checkout.label}-{r}-{time.time()}"} if named else None
                result = run_list(checkout.url + route, part, concurrency=concurrency, headers=headers)
                if result.errors or set(result.statuses) != {200}:
                    raise SystemExit(f"{checkout.label} {kind}: {result.errors} errors in a round of hits ({result.statuses})")
                got.setdefault((checkout.label, kind), []).append((result.rps, result.p50_ms))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (checkout, kind), values in got.items():
        out.setdefault(checkout, {})[kind] = {"rps": statistics.median(v for v, _ in values),
                                              "p50_ms": statistics.median(p for _, p in values)}
    return out


def report(label: str, missed: dict[str, dict[str, float]], hit: dict[str, dict[str, float]], concurrency: int) -> None:
    title = f" ({label})" if label else ""
    print(f"{title:14} {'miss: direct':>13} {'through':>9} {'added':>8} {'hits/s (c=' + str(concurrency) + ')':>15} {'hit p50':>9}")
    for kind in KINDS:
        m, h = missed.get(kind), hit[kind]
        miss = f"{m['direct_ms']:10.2f} ms {m['through_ms']:6.2f} ms {m['added_ms']:5.2f} ms" if m else f"{'':30}"
        print(f"{kind:14} {miss} {h['rps']:15.0f} {h['p50_ms']:6.2f} ms")
    print(f"model hits/s over tool hits/s: {hit['/v1']['rps'] / hit['/virtual']['rps']:.2f}x (a run the client names: "
          f"{hit['/v1 X-STM-Run']['rps'] / hit['/virtual']['rps']:.2f}x); added by a recorded model miss: "
          f"{missed['/v1']['added_ms']:.2f} ms (a tool miss: {missed['/virtual']['added_ms']:.2f} ms)")


def main() -> int:
    global PROMPT_WORDS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="distinct requests of each kind")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of hits (the median is reported)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-words", type=int, default=200,
                    help="words of the model request's prompt (0: a body about the size of a tool call's)")
    ap.add_argument("--before", help="another checkout (its repository root): its servers measured in the same run, "
                                     "interleaved with this checkout's")
    args = ap.parse_args()
    PROMPT_WORDS = args.prompt_words
    n = args.requests
    bodies = {
        "/virtual": [json.dumps(virtual_body(i)).encode() for i in range(n * args.rounds)],
        "/v1": [json.dumps(model_body(i)).encode() for i in range(n * args.rounds)],
    }
    bodies["/v1 X-STM-Run"] = bodies["/v1"]
    with tempfile.TemporaryDirectory() as tmp:
        stub_port = free_port()
        stub = f"http://127.0.0.1:{stub_port}/v1"
        paths = [("after" if args.before else "", REPO)] + ([("before", Path(args.before).resolve())] if args.before else [])
        checkouts = [configure(label or "this", path, Path(tmp), stub) for label, path in paths]
        with process(stub_args(stub_port, 0.0), stub + "/models"):
            with ExitStack() as stack:
                for c in checkouts:
                    stack.enter_context(serve_checkout(c.path, c.config, int(c.url.rsplit(":", 1)[1])))
                missed = misses(checkouts, stub, n)
                for c in checkouts:  # the rest recorded (the first n of each kind were the misses)
                    record_all(c.url + "/virtual", bodies["/virtual"][n:], args.concurrency)
                    record_all(c.url + "/v1/chat/completions", bodies["/v1"][n:], args.concurrency)
            # fresh servers in replay: their own runs, so every recorded model call is occurrence 1 again
            for c in checkouts:
                c.config.write_text(json.dumps({**c.settings, "mode": "replay"}))
            with ExitStack() as stack:
                for c in checkouts:
                    stack.enter_context(serve_checkout(c.path, c.config, int(c.url.rsplit(":", 1)[1])))
                hit = hit_rounds(checkouts, bodies, args.rounds, args.concurrency)
    for label, _ in paths:
        key = label or "this"
        report(label, missed[key], hit[key], args.concurrency)
    if args.before:
        print("after / before:", ", ".join(f"{kind} hits/s {hit['after'][kind]['rps'] / hit['before'][kind]['rps']:.2f}x"
                                           for kind in KINDS),
              "; added miss latency /v1 {:.2f} vs {:.2f} ms, /virtual {:.2f} vs {:.2f} ms".format(
                  missed["after"]["/v1"]["added_ms"], missed["before"]["/v1"]["added_ms"],
                  missed["after"]["/virtual"]["added_ms"], missed["before"]["/virtual"]["added_ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
