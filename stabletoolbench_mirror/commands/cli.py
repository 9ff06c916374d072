"""The ``stabletoolbench-mirror`` command line.

Each command group lives in its own module and registers itself through a
``register(subparsers)`` function listed in :data:`COMMAND_MODULES`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from stabletoolbench_mirror.commands.cli_common import add_config_arguments, add_json_argument, print_json, settings_from_args
from stabletoolbench_mirror.config import ConfigError, Settings

if TYPE_CHECKING:
    from stabletoolbench_mirror.responders.simulator.vllm_launch import VllmServer

#: modules with a ``register(subparsers)`` function adding their commands
COMMAND_MODULES: list[str] = [
    "stabletoolbench_mirror.commands.cli",
    "stabletoolbench_mirror.commands.warm",
    "stabletoolbench_mirror.commands.snapshot",
    "stabletoolbench_mirror.commands.check",
    "stabletoolbench_mirror.commands.sessions_export",
    "stabletoolbench_mirror.commands.startup",
    "stabletoolbench_mirror.commands.fidelity_cli",
    "stabletoolbench_mirror.commands.faults_profile",
    "stabletoolbench_mirror.commands.tools_export",
    "stabletoolbench_mirror.commands.mcp_stdio",
    "stabletoolbench_mirror.commands.score",
]


# -- serve ---------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.commands.startup import start_checks
    from stabletoolbench_mirror.core.logs import setup_logging

    settings = settings_from_args(args, host=args.host, port=args.port, workers=args.workers)
    try:
        setup_logging(settings.log_level, settings.secrets(), settings.resolve(settings.log_file) if settings.log_file else None)
    except OSError as exc:
        raise ConfigError(f"log_file: cannot open {settings.log_file}: {exc}") from None
    problem = listen_problem(settings.host, settings.port)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
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
        try:
            build_layer(settings).close()
            store = build_store(settings)
        except StoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            hold_private_run(settings, store, run)
        except StoreError as exc:
            store.close()
            print(f"error: {exc}", file=sys.stderr)
            return 2
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

    try:
        app = create_app(settings)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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


# -- cache ---------------------------------------------------------------------------------------


def _open_store(args: argparse.Namespace):
    """The store a command reads: opened read-only, so a mistyped path is an error (exit 2), never an empty store made there."""
    from stabletoolbench_mirror.factory import build_store

    return build_store(settings_from_args(args), read_only=True)


def cmd_cache_import(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.commands.cache_tools import ImportFailed, import_tree
    from stabletoolbench_mirror.upstream.archives import ArchiveError, ArchiveLimits, is_archive, local_tree, manifest_problem
    from stabletoolbench_mirror.upstream.trees import frozen_cache_problem

    settings = settings_from_args(args)
    try:  # a snapshot archive or a URL to one: fetched into download_dir and checked first
        if is_archive(args.directory):
            args.directory = local_tree(args.directory, settings.resolve(settings.download_dir), progress=not args.quiet, limits=ArchiveLimits.of(settings))
    except ArchiveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # a folder with no cache files (often one level above or below the tree) would import nothing
    problem = frozen_cache_problem(os.path.abspath(args.directory)) or manifest_problem(args.directory)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from stabletoolbench_mirror.factory import build_store

    with build_store(settings) as store:
        try:
            summary = import_tree(store, args.directory, progress=not args.quiet, allow_symlinks=settings.allow_symlinks, jobs=args.jobs,
                                  max_file_bytes=int(settings.frozen_max_file_mb * 1024 * 1024))
        except ImportFailed as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted: the entries written so far are kept; run the same command again to go on "
                  "(entries already present are skipped)", file=sys.stderr)
            return 130
    if args.json:
        print_json({"source": args.directory, **summary.to_json()})
    else:
        print("\n".join(summary.lines()))
    return 1 if summary.bad_files else 0


def cmd_cache_export(args: argparse.Namespace) -> int:
    if args.format == "chat-jsonl":
        return _export_chat(args)
    if args.style or args.source or args.category:
        print("error: --style, --source and --category belong to --format chat-jsonl", file=sys.stderr)
        return 2
    from stabletoolbench_mirror.commands.cache_tools import export_tree

    with _open_store(args) as store:
        summary = export_tree(store, args.directory, progress=not args.quiet)
    incomplete = bool(summary.left_out) and not args.skip_unsafe
    if args.json:
        print_json({"out": args.directory, "format": "tree", "ok": not incomplete, **summary.to_json()})
    else:
        print("\n".join(summary.lines()))
    if incomplete:
        print("error: the export is incomplete (--skip-unsafe accepts that)", file=sys.stderr)
        return 1
    return 0


def _export_chat(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.commands.chat_export import export_chat_jsonl
    from stabletoolbench_mirror.factory import build_store

    if not args.style:
        print("error: --format chat-jsonl needs --style mirrorapi-sft, mirrorapi-cot or mirrorapi-cache", file=sys.stderr)
        return 2
    if os.path.isdir(args.directory):
        print(f"error: {args.directory} is a folder; chat-jsonl is written to a file (e.g. train.jsonl)", file=sys.stderr)
        return 2
    settings = settings_from_args(args)
    started = time.perf_counter()
    with build_store(settings, read_only=True) as store:
        summary = export_chat_jsonl(
            store, args.directory, settings, style=args.style, source=args.source, categories=args.category, progress=not args.quiet
        )
    if args.json:
        print_json({"out": args.directory, "format": "chat-jsonl", "style": args.style, **asdict(summary),
                    "elapsed_s": round(time.perf_counter() - started, 3)})
    else:
        print("\n".join(summary.lines()))
    return 0


def cmd_cache_stats(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.commands.cache_tools import store_stats
    from stabletoolbench_mirror.factory import build_store
    from stabletoolbench_mirror.stores import StoreError

    try:
        # counting writes nothing: a diskcache folder through a read-only SQLite connection (a server may
        # hold it open meanwhile), Redis through reads only (HGETALL, SCARD, INFO)
        with build_store(settings_from_args(args), read_only=True) as store:
            stats = store_stats(store)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json(stats)
        return 0
    print(f"entries: {stats['entries']}  apis: {stats['apis']}  (from {stats['counted_by']})")
    if stats["bytes_per_entry"] is not None:
        size = stats["disk_bytes"] if stats["disk_bytes"] is not None else stats["memory_bytes"]
        where = "on disk" if stats["disk_bytes"] is not None else "in memory"
        print(f"size: {size / 1e6:,.1f} MB {where}, {stats['bytes_per_entry']:,} bytes per entry")
    print(f"failure records: {stats['failure_records']}  answers that replaced one: {stats['replaced_failures']}")
    for reason, n in (stats["failure_reasons"] or {}).items():
        print(f"  {n:>8}  {reason}")
    print("by source:")
    for source, n in stats["by_source"].items():
        print(f"  {source:<10} {n}")
    print("by category:")
    for category, n in stats["by_category"].items():
        print(f"  {category:<40} {n}")
    return 0


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes from 0 to 64")
    return value


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

    cache = sub.add_parser("cache", help="import, export and inspect the response store")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    imp = cache_sub.add_parser("import", help="copy an upstream tool_response_cache tree into the store")
    imp.add_argument("directory", help="a tool_response_cache tree, a snapshot archive (.tar.gz), or an http(s):// URL to one [#sha256=<hex>]")
    imp.add_argument("--jobs", "-j", type=_jobs, metavar="N",
                     help="processes that parse the files while this one writes (default: one per core, at most 4, "
                          "for a tree of 16 MB or more; 0: parse in this process)")
    exp = cache_sub.add_parser(
        "export", help="write the store as an upstream tool_response_cache tree, or as chat training data (--format chat-jsonl)"
    )
    exp.add_argument("directory", metavar="OUT", help="the tree's folder (tree), or the .jsonl file (chat-jsonl)")
    exp.add_argument("--format", choices=["tree", "chat-jsonl"], default="tree", help="tree (default) or chat-jsonl")
    exp.add_argument("--style", choices=["mirrorapi-sft", "mirrorapi-cot", "mirrorapi-cache"], help="chat-jsonl: the prompt style")
    exp.add_argument("--source", choices=["real", "simulated", "imported"], help="chat-jsonl: only records of this source")
    exp.add_argument("--category", action="append", help="chat-jsonl: only this category (standardised name; repeatable)")
    exp.add_argument("--skip-unsafe", action="store_true", help="exit 0 even when entries had to be left out (API names too long for a file name)")
    stats = cache_sub.add_parser("stats", help="count the store's entries")
    for p, fn in ((imp, cmd_cache_import), (exp, cmd_cache_export), (stats, cmd_cache_stats)):
        add_config_arguments(p)
        add_json_argument(p)
        p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
        p.set_defaults(func=fn)
    from stabletoolbench_mirror.commands.curation import register_cache

    register_cache(cache_sub)  # ls, show, delete, diff
    from stabletoolbench_mirror.commands.report import register_report

    register_report(sub)  # report SOURCE --html OUT.html


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stabletoolbench-mirror",
        description="A stable, replayable virtual API server for StableToolBench.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__import__('stabletoolbench_mirror').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        register_fn: Callable[[Any], None] = importlib.import_module(name).register
        register_fn(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from stabletoolbench_mirror.serving.memory import tune_malloc

    tune_malloc()  # bulk commands and servers alike: freed file texts go back to the system
    # a name read from a store, a tree or a file may hold ESC sequences: every command's output shows them escaped
    # (the servers' logs are escaped by their filter; the stdio MCP server's stdout is its protocol)
    with contextlib.nullcontext() if getattr(args, "raw_output", False) else printable_output():
        return _run(args)


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` through :class:`~stabletoolbench_mirror.core.logs.PrintableStream` meanwhile."""
    from stabletoolbench_mirror.core.logs import PrintableStream

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(out), PrintableStream(err, keep_cr=True)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def _run(args: argparse.Namespace) -> int:
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone by now is a closed pipe too (below), not an error at exit
        return code
    except BrokenPipeError:
        return closed_pipe()
    except ConfigError as exc:
        print(f"configuration error:\n{exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a StoreError (imported here: the stores stay out of every command's start)
        from stabletoolbench_mirror.stores.base import StoreError

        if not isinstance(exc, StoreError):
            raise
        print(f"error: {exc}", file=sys.stderr)  # a store that cannot be opened or read, wherever a command met it
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def closed_pipe() -> int:
    """The reader of stdout went away (``cache ls | head -1``): end quietly with exit status 0.

    What was still buffered goes to ``os.devnull``, so the flush at exit finds no closed pipe either
    (Python's own advice for SIGPIPE, https://docs.python.org/3/library/signal.html#note-on-sigpipe).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file descriptor (a test's capture): nothing to point away
        pass
    finally:
        os.close(devnull)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
