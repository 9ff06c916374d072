"""``serve``: the /virtual server, started in this process or in uvicorn's workers, with ``--launch-vllm`` beside it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from stabletoolbench_mirror.commands.cli_common import CommandError, add_config_arguments, settings_from_args
from stabletoolbench_mirror.config import ConfigError, Settings

if TYPE_CHECKING:
    from stabletoolbench_mirror.responders.simulator.vllm_launch import VllmServer


def cmd_serve(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.core.logs import setup_logging
    from stabletoolbench_mirror.startup.checks import start_checks

    settings = settings_from_args(args, host=args.host, port=args.port, workers=args.workers)
    try:
        setup_logging(settings.log_level, settings.secrets(), settings.resolve(settings.log_file) if settings.log_file else None)
    except OSError as exc:
        raise ConfigError(f"log_file: cannot open {settings.log_file}: {exc}") from None
    problem = listen_problem(settings.host, settings.port)
    if problem:
        raise CommandError(problem)
    # the summary of what was loaded, and the checks that stop a wrong configuration at start
    # (with --launch-vllm the simulator is not up yet: vLLM's launch waits for its first answer)
    if not start_checks(settings, probe_endpoints=not args.launch_vllm, simulator_launched=bool(args.launch_vllm)):
        return 2
    if not args.launch_vllm:
        return run_server(settings)
    import signal

    # uvicorn re-raises the SIGTERM it handled once it has shut down; make that an exit
    # that unwinds through the ``finally`` below, so the vLLM child is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    vllm = launch_vllm(settings, args)
    try:
        # the simulator talks to the vLLM server this process started
        settings.simulator.enabled = True
        settings.simulator.api_base = vllm.api_base
        return run_server(settings)
    finally:
        vllm.stop()


def launch_vllm(settings: Settings, args: argparse.Namespace) -> VllmServer:
    """Start vLLM's OpenAI-compatible server for ``serve --launch-vllm`` and wait until it completes a chat."""
    from urllib.parse import urlsplit

    from stabletoolbench_mirror.responders.simulator.vllm_launch import VllmLaunchError, VllmServer, find_free_port

    port = args.vllm_port
    if port is None:
        endpoints = settings.simulator.endpoints
        parts = urlsplit(endpoints[0]) if len(endpoints) == 1 else None
        port = parts.port if parts is not None and parts.hostname in ("127.0.0.1", "localhost") else None
    port = port or find_free_port()
    if not _port_is_free(port):
        raise SystemExit(f"cannot launch vLLM on port {port}: something already listens there (use --vllm-port)")
    server = VllmServer(
        args.launch_vllm,
        port=port,
        served_model_name=settings.simulator.model,
        python=args.vllm_python,
        max_model_len=args.vllm_max_model_len,
        extra_args=list(args.vllm_arg or []),
        startup_timeout=args.vllm_startup_timeout,
        log_path=args.vllm_log,
    )
    print(f"starting vLLM for {args.launch_vllm} on {server.api_base} (log: {server.log_path}) ...", file=sys.stderr, flush=True)
    try:
        server.start()
    except VllmLaunchError as exc:
        server.stop()
        raise SystemExit(f"vLLM did not start: {exc}") from None
    print(f"vLLM is answering on {server.api_base} as '{settings.simulator.model}'", file=sys.stderr, flush=True)
    return server


def _port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def listen_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on ``host:port`` (bound the way uvicorn binds), else ``None``.

    Checked before anything starts, so a port in use is one line naming the port and the fix,
    not uvicorn's bare errno after the start-up summary (or after vLLM's launch).
    """
    import errno
    import socket

    if port == 0:
        return None
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    with socket.socket(family=family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                return (f"cannot listen on {where}: port {port} is already in use (another server, or an earlier "
                        f"serve still running); stop it, or choose a free port with --port (or `port:` in the config)")
            if exc.errno == errno.EACCES:
                return f"cannot listen on {where}: permission denied for port {port}; choose a port above 1023 with --port"
            return f"cannot listen on {where}: {exc.strerror or exc}; check `host`, or choose another port with --port"
    return None


def run_server(settings: Settings) -> int:
    import uvicorn

    from stabletoolbench_mirror.stores import StoreError

    _warn_about_prompt(settings)
    if settings.workers > 1:
        from stabletoolbench_mirror.engine.model_calls import new_run_id
        from stabletoolbench_mirror.factory import build_layer, build_store
        from stabletoolbench_mirror.serving.model_front import hold_private_run

        # a store or simulator that cannot be built fails here, once, with a clear message,
        # rather than in every worker process; a store stays open while the workers serve, holding the
        # store's private model-call run when nobody named the run (no second server may record beside it)
        run = new_run_id()
        build_layer(settings).close()  # a StoreError is the command line's exit 2 (commands.cli)
        store = build_store(settings)
        try:
            hold_private_run(settings, store, run)
        except StoreError:  # the command line's exit 2
            store.close()
            raise
        if settings.llm.run is None:
            # one run per start of serve: every worker counts identical model calls together (in the store)
            settings.llm.run = run
        from stabletoolbench_mirror.engine.metrics import SharedCountsFolder
        from stabletoolbench_mirror.serving.handoff import SettingsHandoff
        from stabletoolbench_mirror.serving.server import uvicorn_options

        # the workers read the settings (keys included) from a private file, never from the environment;
        # they add their counts up in a shared folder, so /stats and /metrics show every worker's
        with store, SettingsHandoff(settings, workers=settings.workers), SharedCountsFolder():
            uvicorn.run(
                "stabletoolbench_mirror.serving.server:app_from_environment",
                factory=True,
                host=settings.host,
                port=settings.port,
                workers=settings.workers,
                log_level=settings.log_level,
                **uvicorn_options(settings),
            )
        return 0
    from stabletoolbench_mirror.serving.server import create_app, freeze_startup_objects, uvicorn_options

    app = create_app(settings)
    freeze_startup_objects()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, **uvicorn_options(settings))
    return 0


def _warn_about_prompt(settings: Settings) -> None:
    """One WARNING when a MirrorAPI style runs on the built-in prompt (the model was trained on another)."""
    import logging

    from stabletoolbench_mirror.responders.simulator import prompt_warning

    warning = prompt_warning(settings)
    if warning:
        logging.getLogger("stabletoolbench_mirror.responders.simulator").warning(warning)


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run the /virtual server")
    add_config_arguments(serve)
    serve.add_argument("--host", help="override 'host' (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="override 'port' (default 8080)")
    serve.add_argument("--workers", type=int, help="uvicorn worker processes (default 1)")
    vllm = serve.add_argument_group("launching vLLM (the 'vllm' extra, or an interpreter with vLLM in --vllm-python)")
    vllm.add_argument("--launch-vllm", metavar="MODEL_PATH", help="start vLLM's OpenAI-compatible server on this model and simulate with it")
    vllm.add_argument("--vllm-port", type=int, help="its port (default: the port of simulator.api_base, else a free one)")
    vllm.add_argument("--vllm-python", help="interpreter that has vLLM (default: $STM_VLLM_PYTHON, else this one)")
    vllm.add_argument("--vllm-max-model-len", type=int, default=4096)
    vllm.add_argument("--vllm-arg", action="append", metavar="ARG", help="extra argument for vLLM's server (repeatable), e.g. --vllm-arg=--dtype=float32")
    vllm.add_argument("--vllm-startup-timeout", type=float, default=900.0, help="seconds to wait for the first completion")
    vllm.add_argument("--vllm-log", help="vLLM's log file (default: a temporary file)")
    serve.set_defaults(func=cmd_serve, raw_output=True)
