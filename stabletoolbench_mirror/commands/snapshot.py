"""``stabletoolbench-mirror snapshot OUT`` and ``snapshot --verify OUT``: what a snapshot is, :mod:`stabletoolbench_mirror.snapshots.snapshot`."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.commands.cli_common import (
    CommandError,
    add_command,
    add_config_arguments,
    add_json_argument,
    print_json,
    settings_from_args,
)
from stabletoolbench_mirror.factory import build_store
from stabletoolbench_mirror.snapshots.snapshot import SnapshotError, verify_snapshot, write_snapshot
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Write the store as an upstream tool_response_cache tree plus manifest.json (counts, models, settings without
    secrets, content hash); --verify rechecks a snapshot."""
    started = time.perf_counter()
    return _verify(args, started) if args.verify else _write(args, started)


def _verify(args: argparse.Namespace, started: float) -> int:
    from stabletoolbench_mirror.upstream.archives import ArchiveError, ArchiveLimits, is_archive, local_tree

    out = args.out
    problem = _unreadable_snapshot(out)
    if problem is not None:  # nothing to verify: "cannot be read" (exit 2), never a mismatch (1)
        raise CommandError(problem)
    if is_archive(out):  # an archive or URL: unpacked into download_dir (its content hash checked there too)
        try:
            settings = settings_from_args(args)
            out = local_tree(out, settings.resolve(settings.download_dir), progress=not args.quiet, limits=ArchiveLimits.of(settings))
        except ArchiveError as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
    result = verify_snapshot(out, allow_left_out=args.skip_unsafe, progress=not args.quiet)
    if args.json:
        print_json({"snapshot": args.out, **asdict(result), "elapsed_s": round(time.perf_counter() - started, 3)})
        return 0 if result.ok else 1
    print("\n".join(result.lines()))
    print(f"time: {_throughput(result.entries, time.perf_counter() - started)}")
    return 0 if result.ok else 1


def _write(args: argparse.Namespace, started: float) -> int:
    settings = settings_from_args(args)
    try:
        with build_store(settings, read_only=True) as store, _written(args.out) as folder:  # a mistyped store path: exit 2
            manifest = write_snapshot(store, folder, settings=settings, progress=not args.quiet, exclude_failures=args.exclude_failures)
    except SnapshotError as exc:
        raise CommandError(str(exc)) from None
    incomplete = bool(manifest["left_out"]) and not args.skip_unsafe
    if args.json:
        print_json({"snapshot": args.out, "ok": not incomplete, "elapsed_s": round(time.perf_counter() - started, 3),
                    **{k: manifest[k] for k in SUMMARY_KEYS}})
        return 1 if incomplete else 0
    _print_written(args, manifest, time.perf_counter() - started)
    if incomplete:
        print("the snapshot is incomplete (--skip-unsafe accepts that)", file=sys.stderr)
        return 1
    return 0


def _print_written(args: argparse.Namespace, manifest: dict[str, Any], seconds: float) -> None:
    print(f"snapshot:      {args.out}")
    print(f"entries:       {manifest['entries']} in {manifest['files']} files")
    print("by source:     " + ", ".join(f"{k} {v}" for k, v in manifest["by_source"].items()))
    left = f", {manifest['excluded_failures']} left out" if args.exclude_failures else ""
    print(f"failures:      {manifest['failures']} included{left}")
    print(f"content hash:  {manifest['content_hash']}")
    print(f"time:          {_throughput(manifest['entries'], seconds)}")
    if manifest["encoded_names"]:
        print(f"encoded names: {manifest['encoded_names']} files (names unsafe as paths, written as %%...)")
    left_out = manifest["left_out"]
    if left_out:
        print(f"LEFT OUT:      {sum(left_out.values())} entries of {len(left_out)} APIs whose names are too long for a file name")
        for api in list(left_out)[:20]:
            print(f"  {api[:300]}")


def _unreadable_snapshot(out: str) -> str | None:
    """Why ``snapshot --verify OUT`` has nothing to check (a path that does not exist, a folder that is no
    snapshot), or ``None``.  A URL is fetched first: its problems are the archive's."""
    from stabletoolbench_mirror.upstream.archives import is_url, split_spec

    location = split_spec(out)[0]
    if is_url(location):
        return None
    path = Path(location)
    if not path.exists():
        return f"{location} does not exist: give a snapshot folder, a snapshot archive (.tar.gz) or a URL to one"
    if path.is_dir() and not (path / MANIFEST_NAME).exists():
        return f"{location} is no snapshot: it has no {MANIFEST_NAME} (snapshot OUT writes one)"
    return None


#: the manifest's keys ``snapshot --json`` prints (docs/json-output.md)
SUMMARY_KEYS = ("entries", "files", "by_source", "failures", "excluded_failures", "content_hash", "encoded_names", "left_out")


@contextlib.contextmanager
def _written(out: str) -> Iterator[str]:
    """The folder to write the snapshot into: ``out``, or for ``OUT.tar.gz`` a temporary one packed into it."""
    from stabletoolbench_mirror.upstream.archives import ARCHIVE_SUFFIXES, pack

    if not out.endswith(ARCHIVE_SUFFIXES):
        yield out
        return
    target = Path(out)
    if target.exists():
        raise SnapshotError(f"{out} exists: write a one-file snapshot to a new file")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".snapshot-", dir=target.parent) as folder:
        yield folder
        pack(Path(folder), target)


def _throughput(entries: int, seconds: float) -> str:
    return f"{seconds:.1f} s ({entries / seconds if seconds > 0 else 0:,.0f} entries/s)"


def register(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "snapshot", cmd_snapshot, summary="freeze the store into an upstream tool_response_cache tree with a manifest.json")
    parser.add_argument("out", help="the snapshot folder (new or empty), or OUT.tar.gz for one file (new); with --verify: an existing snapshot folder, archive or URL")
    parser.add_argument("--verify", action="store_true", help="recompute the content hash of OUT and compare with its manifest")
    parser.add_argument(
        "--skip-unsafe", action="store_true", help="exit 0 even when entries had to be left out (API names too long for a file name)"
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_json_argument(parser)
    parser.add_argument(
        "--exclude-failures", action="store_true", help="leave failure records out (a cache meant for other people's record runs)"
    )
    add_config_arguments(parser)
