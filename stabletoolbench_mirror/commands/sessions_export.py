"""``stabletoolbench-mirror sessions export``: every session as one JSON line (task, calls, answers, provenance)."""

from __future__ import annotations

import json
import time
from typing import Any

from stabletoolbench_mirror.commands.cli_common import CommandError, add_config_arguments, add_json_argument, print_json, settings_from_args
from stabletoolbench_mirror.core.files import atomic_write
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.engine.sessions import public_view
from stabletoolbench_mirror.factory import build_session_store
from stabletoolbench_mirror.stores.sessions import SessionStore


def export_sessions(store: SessionStore, out_path: str, *, progress: bool = True) -> int:
    """Write every session as one JSON line (task, calls, answers, provenance); the number written.

    The file appears whole or not at all (written beside it, then renamed).
    """
    written = 0
    with atomic_write(out_path) as out:
        for doc in progress_bar(store, total=len(store), desc="sessions", unit="session", disable=not progress):
            out.write(json.dumps(public_view(doc), ensure_ascii=False) + "\n")
            written += 1
    return written


def cmd_sessions_export(args: Any) -> int:
    settings = settings_from_args(args)
    started = time.perf_counter()
    store = build_session_store(settings)
    try:
        written = export_sessions(store, args.out, progress=not args.quiet)
    except OSError as exc:
        raise CommandError(f"cannot write {args.out}: {exc}") from None
    finally:
        store.close()
    if args.json:
        print_json({"out": args.out, "sessions": written, "elapsed_s": round(time.perf_counter() - started, 3)})
    else:
        print(f"exported {written} sessions to {args.out}")
    return 0


def register(sub: Any) -> None:
    sessions = sub.add_parser("sessions", help="trajectories of sessions (X-STM-Session)")
    sessions_sub = sessions.add_subparsers(dest="sessions_command", required=True)
    export = sessions_sub.add_parser("export", help="write every session as one JSON line: task, calls, answers, provenance")
    export.add_argument("out", help="the .jsonl file to write")
    add_config_arguments(export)
    export.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_json_argument(export)
    export.set_defaults(func=cmd_sessions_export)
