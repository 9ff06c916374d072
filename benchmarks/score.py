"""``score`` on the whole benchmark: a 765-query bundle recorded, replayed and re-scored, and what a recorded
judge call costs beside a tool hit.

Starts an agent, a judge (labelling at random at temperature 0.2) and a simulator, OpenAI-compatible stubs on
127.0.0.1 (tests/helpers, in threads of this process), then, each as its own ``stabletoolbench-mirror score``
process with ``--stand-ins``:

1. **record**: the six groups of ``../shared/reference``'s solvable queries (765, or ``--limit N`` per group),
   ``CoT@1``, ``--evaluate-times`` judge requests per answer, the reference's frozen cache and the simulator for
   the tools, into one bundle;
2. **replay** of that bundle with the stubs stopped (it must be identical: exit status 0);
3. **re-score** of it (the evaluation only, identical too);

printing each one's wall time and its phases' (summed over the groups).  Then a ``serve`` process in replay mode
over the bundle's records answers, one at a time on a keep-alive connection, every recorded judge request
(``/run/<name>/v1/chat/completions``, a fresh run: each a hit of its occurrence) and the ``/virtual`` calls of
the bundle's answer files (first pass, then again), and prints their median latencies.

    python benchmarks/score.py [--out DIR] [--limit N] [--evaluate-times 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import requests  # noqa: E402
import yaml  # noqa: E402
from _procs import free_port, process, serve_args  # noqa: E402

from stabletoolbench_mirror.scoring.bundle import open_bundle  # noqa: E402
from stabletoolbench_mirror.upstream.answers import function_index, iter_answer_calls  # noqa: E402
from tests.helpers.model_stubs import AgentStub, JudgeStub  # noqa: E402
from tests.helpers.openai_stub import OpenAIStub  # noqa: E402

REFERENCE = REPO.parent / "shared" / "reference"
UPSTREAM = REFERENCE / "stabletoolbench"
TOOLS = REFERENCE / "toolenv" / "tools"
GROUPS = "G1_instruction,G1_category,G1_tool,G2_instruction,G2_category,G3_instruction"
AGENT, JUDGE = "gpt-3.5-turbo-16k-0613", "gpt-3.5-turbo-16k"


def score(*args: str) -> tuple[dict[str, Any], float]:
    """One ``score`` process: its --json report and its wall time (exit status 0 required)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "score", "--stabletoolbench", str(UPSTREAM), "--tools", str(TOOLS),
                           "--stand-ins", "--quiet", "--json", *args], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"score {' '.join(args[:2])} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout), seconds


def by_phase(report: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for phase in report["phases"]:
        out[phase["phase"]] += phase["seconds"]
    return dict(out)


def record(out: Path, limit: int | None, evaluate_times: int) -> tuple[dict[str, Any], float, list[dict[str, Any]]]:
    with AgentStub() as agent, JudgeStub(seed=7) as judge, OpenAIStub() as simulator:
        config = out / "record.yml"
        config.write_text(yaml.safe_dump({
            "mode": "record", "store": {"path": str(out / "store")}, "frozen_caches": [str(REFERENCE / "cache")],
            "tools_folder": str(TOOLS), "log_level": "warning",
            "simulator": {"enabled": True, "style": "gpt-fewshot", "api_base": simulator.api_base, "model": "sim", "temperature": 0},
            "llm": {"upstreams": [{"base_url": agent.api_base, "models": [AGENT]}, {"base_url": judge.api_base, "models": [JUDGE]}]},
        }))
        limits = ["--limit", str(limit)] if limit else []
        report, seconds = score("--config", str(config), "--groups", GROUPS, "--method", "CoT@1", "--agent-model", AGENT,
                                "--evaluate-times", str(evaluate_times), *limits, "--out", str(out / "run.tar.gz"))
        return report, seconds, list(judge.requests)


def timed_posts(session: requests.Session, url: str, bodies: list[dict[str, Any]]) -> tuple[list[float], int]:
    """Each body posted one at a time: the latencies of the hits, and how many were no hit."""
    latencies, other = [], 0
    for body in bodies:
        started = time.perf_counter()
        answer = session.post(url, json=body, timeout=60)
        elapsed = time.perf_counter() - started
        if answer.status_code == 200 and answer.headers.get("x-stm-outcome") == "hit":
            latencies.append(elapsed)
        else:
            other += 1
    return latencies, other


def costs(out: Path, judge_bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """Median latency of a recorded judge call and of a tool hit, both served from the bundle's records."""
    bundle = open_bundle(str(out / "run.tar.gz"), out / "downloads")
    queries = [str(p) for p in (bundle.root / "queries").glob("*.json")]
    payloads = [c.payload for c in iter_answer_calls([bundle.root / "answers"], function_index(queries, TOOLS)) if c.payload]
    port = free_port()
    config = out / "costs.yml"
    config.write_text(yaml.safe_dump({"mode": "replay", "store": {"path": str(out / "costs-store")}, "frozen_caches": [str(bundle.records)],
                                      "log_level": "warning", "port": port}))
    url = f"http://127.0.0.1:{port}"
    with process(serve_args(config), url + "/health"), requests.Session() as session:
        judge, judge_missed = timed_posts(session, f"{url}/run/bench/v1/chat/completions", judge_bodies)
        if judge_missed:
            raise SystemExit(f"{judge_missed} recorded judge requests were not answered from the bundle's records")
        # an answer file's call is resolved to an API by its function's name; a call the tools folder names otherwise
        # than the agent's wrapper did (e.g. a name given the get_ prefix) is no hit here, and left out
        tools_first, tools_missed = timed_posts(session, url + "/virtual", payloads)
        tools_again, _ = timed_posts(session, url + "/virtual", payloads)
    return {"judge_calls": len(judge), "judge_ms": 1000 * statistics.median(judge), "tool_calls": len(tools_first),
            "tool_other": tools_missed, "tool_first_ms": 1000 * statistics.median(tools_first),
            "tool_again_ms": 1000 * statistics.median(tools_again)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="where the bundle and the work folders go (default: a temporary folder, removed)")
    parser.add_argument("--limit", type=int, help="only the first N queries of each group (default: all 765)")
    parser.add_argument("--evaluate-times", type=int, default=4)
    args = parser.parse_args()
    if not (UPSTREAM / "toolbench").is_dir():
        raise SystemExit(f"needs StableToolBench's files at {UPSTREAM}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="stm-bench-score-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        recorded, record_s, judge_bodies = record(out, args.limit, args.evaluate_times)
        replayed, replay_s = score("--replay", str(out / "run.tar.gz"), "--work", str(out / "replay"))
        rescored, rescore_s = score("--rescore", str(out / "run.tar.gz"), "--work", str(out / "rescore"))
        assert replayed["identical"] and rescored["identical"]
        cost = costs(out, judge_bodies)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    queries = sum(r["queries"] for r in recorded["score"]["pass_rate"].values())
    print(f"{queries} queries, {len(recorded['groups'])} groups, CoT@1, {args.evaluate_times} judge requests per answer; "
          f"SoPR {recorded['score']['pass_rate_average']:.1f}% (a random judge)")
    print(f"{'run':<9} {'wall s':>8} {'infer s':>8} {'convert s':>10} {'pass_rate s':>12}  identical")
    for name, report, seconds in (("record", recorded, record_s), ("replay", replayed, replay_s), ("re-score", rescored, rescore_s)):
        phases = by_phase(report)
        print(f"{name:<9} {seconds:>8.1f} {phases.get('infer', 0):>8.1f} {phases.get('convert', 0):>10.1f} "
              f"{phases.get('pass_rate', 0):>12.1f}  {report.get('identical', '-')}")
    print(f"recorded judge call (replay, /run/<name>/v1): median {cost['judge_ms']:.2f} ms over {cost['judge_calls']}; "
          f"tool hit (/virtual): median {cost['tool_first_ms']:.2f} ms first, {cost['tool_again_ms']:.2f} ms again, over "
          f"{cost['tool_calls']} hits ({cost['tool_other']} calls of the answer files not resolved to their recorded API left out); "
          f"{cost['judge_ms'] / cost['tool_first_ms']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
