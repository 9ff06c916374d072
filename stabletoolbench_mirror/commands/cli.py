"""The ``stabletoolbench-mirror`` command line: the parser, and how a command's end becomes an exit status.

Each command group lives in its own module and registers itself through a
``register(subparsers)`` function listed in :data:`COMMANDS`, in the order ``--help`` lists them.  A command line
naming a command imports that command's module only (a command starts without the imports of the others: about
0.2 s of CPU for each run of a short command such as ``cache stats``); ``--help``, ``--version`` or an unknown
command import them all.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from stabletoolbench_mirror.commands.cli_common import CommandError
from stabletoolbench_mirror.config import ConfigError

#: each command's name and the module whose ``register(subparsers)`` adds it
COMMANDS: dict[str, str] = {
    "serve": "stabletoolbench_mirror.commands.serve",
    "cache": "stabletoolbench_mirror.commands.cache",
    "report": "stabletoolbench_mirror.commands.report",
    "warm": "stabletoolbench_mirror.commands.warm",
    "snapshot": "stabletoolbench_mirror.commands.snapshot",
    "check": "stabletoolbench_mirror.commands.check",
    "sessions": "stabletoolbench_mirror.commands.sessions_export",
    "doctor": "stabletoolbench_mirror.commands.doctor",
    "fidelity": "stabletoolbench_mirror.commands.fidelity",
    "faults": "stabletoolbench_mirror.commands.faults_profile",
    "tools": "stabletoolbench_mirror.commands.tools_export",
    "mcp": "stabletoolbench_mirror.commands.mcp_stdio",
    "mcp-verify": "stabletoolbench_mirror.commands.mcp_verify",
    "score": "stabletoolbench_mirror.commands.score",
    "demo-models": "stabletoolbench_mirror.commands.demo_models",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``argv`` naming a command before any option, of that command only."""
    parser = argparse.ArgumentParser(
        prog="stabletoolbench-mirror",
        description="A stable, replayable virtual API server for StableToolBench.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__import__('stabletoolbench_mirror').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    named = argv[0] if argv else None
    for module in [COMMANDS[named]] if named in COMMANDS else COMMANDS.values():
        register_fn: Callable[[Any], None] = importlib.import_module(module).register
        register_fn(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    from stabletoolbench_mirror.serving.memory import tune_malloc

    tune_malloc()  # bulk commands and servers alike: freed file texts go back to the system
    # a name read from a store, a tree or a file may hold ESC sequences: every command's output shows them escaped
    # (the servers' logs are escaped by their filter; the stdio MCP server's stdout is its protocol)
    with contextlib.nullcontext() if getattr(args, "raw_output", False) else printable_output(), terminate_as_exception():
        return _run(args)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (as Ctrl-C is): ``finally`` blocks run, so what a command was writing (a
    download's ``.part``, a half-unpacked folder, a temporary work folder) is removed.  A ``BaseException``, as
    ``KeyboardInterrupt`` is: no ``except Exception`` takes it for a failure to recover from."""


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """SIGTERM as :class:`Terminated` in this process meanwhile; a second SIGTERM, or one in a forked child (which
    inherits the handler), ends the process at once as SIGTERM does.  An inherited "ignore", and a command run off the
    main thread (where no handler can be set), keep their own."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    owner = os.getpid()
    raised = False

    def handle(signum: int, _frame: Any) -> None:
        nonlocal raised
        if raised or os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raised = True
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except RuntimeError as exc:  # a StoreError (imported here: the stores stay out of every command's start)
        from stabletoolbench_mirror.stores.base import StoreError

        if not isinstance(exc, StoreError):
            raise
        print(f"error: {exc}", file=sys.stderr)  # a store that cannot be opened or read, wherever a command met it
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM


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
