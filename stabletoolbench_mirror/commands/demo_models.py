"""``stabletoolbench-mirror demo-models``: the scripted agent, judge and simulator (:mod:`~stabletoolbench_mirror.scoring.demo_models`)
served on 127.0.0.1, so that ``score`` can be tried with no key (docs/reproduce-a-score.md, "Try it with no key")."""

from __future__ import annotations

from typing import Any

from stabletoolbench_mirror.commands.cli_common import CommandError

DEFAULT_PORT = 8091


def cmd_demo_models(args: Any) -> int:
    import uvicorn

    from stabletoolbench_mirror.commands.serve import listen_problem
    from stabletoolbench_mirror.scoring.demo_models import AGENT, JUDGE, SIMULATOR, create_app

    problem = listen_problem(args.host, args.port)
    if problem:
        raise CommandError(problem)
    print(f"demo models on http://{args.host}:{args.port}/v1: the agent {AGENT}, the judge {JUDGE}, the simulator {SIMULATOR} "
          f"(scripted answers that measure nothing; Ctrl-C stops them)", flush=True)
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")
    return 0


def register(sub: Any) -> None:
    demo = sub.add_parser("demo-models", help="serve a scripted agent, judge and simulator (OpenAI-compatible) to try score with no key")
    demo.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port (default {DEFAULT_PORT})")
    demo.set_defaults(func=cmd_demo_models, raw_output=True)
