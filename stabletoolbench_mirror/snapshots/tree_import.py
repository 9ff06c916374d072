"""An upstream ``tool_response_cache`` tree into the store (``cache import``).

The import streams: it reads one API file at a time (in reader processes for a large tree) and writes
it in batches, so memory stays flat however large the tree.  It shows a progress bar and prints its throughput.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.core.records import FAILURE, Record
from stabletoolbench_mirror.snapshots.interrupts import CtrlC
from stabletoolbench_mirror.stores import Store
from stabletoolbench_mirror.upstream.failures import TREE_FAILURE_REASON, is_tree_failure, tree_failure_entries
from stabletoolbench_mirror.upstream.layout import (
    is_utf8_encodable,
    iter_cache_entries,
    iter_cache_files,
)

log = logging.getLogger(__name__)

#: records written per store transaction during an import
IMPORT_BATCH = 1000


def rate(n: int, seconds: float, unit: str) -> str:
    """``n`` per second in ``unit``, as the summaries print it."""
    return f"{n / seconds:,.0f} {unit}/s" if seconds > 0 else "n/a"


@dataclass
class ImportSummary:
    files: int = 0
    entries: int = 0
    added: int = 0
    already_present: int = 0
    bad_files: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """``cache import --json`` (docs/json-output.md), without the tree it read."""
        return {"files": self.files, "entries": self.entries, "added": self.added, "already_present": self.already_present,
                "unreadable": list(self.bad_files), "elapsed_s": round(self.seconds, 3)}

    def lines(self) -> list[str]:
        out = [
            f"files read:       {self.files}",
            f"entries read:     {self.entries}",
            f"added:            {self.added}",
            f"already present:  {self.already_present}",
            f"time:             {self.seconds:.1f} s ({rate(self.entries, self.seconds, 'entries')})",
        ]
        if self.bad_files:
            out.append(f"unreadable files: {len(self.bad_files)}")
            out.extend(f"  {f}" for f in self.bad_files)
        return out


#: files of about this many bytes in all make one task for a reader process
_TASK_BYTES = 1 << 20
_TASK_FILES = 256
#: below this many bytes in all, files are read in this process (starting readers would cost more)
_PARALLEL_MIN_BYTES = 16 << 20


@dataclass(frozen=True)
class _FileRead:
    """What a reader made of one API file: its records (encoded), or why it was left out."""

    path: str
    items: list[tuple[Record, str | None]] | None
    error: str = ""


def _read_files(files: list[tuple[str, str]], origin_root: str, listed: frozenset[tuple[str, str]]) -> list[_FileRead]:
    """Parse API files into records ready to write (runs in a reader process, or in this one)."""
    out = []
    for api, path in files:
        try:
            # the whole file is checked before any of it is written: a crafted file is left out entirely
            entries = list(iter_cache_entries(path))
        except (OSError, ValueError) as exc:
            out.append(_FileRead(path, None, str(exc) if path in str(exc) else f"{path}: {exc}"))
            continue
        origin = f"import:{origin_root}/{api}.json"
        items = []
        for key, _answer, body in entries:
            record = Record(api=api, key=key, body=body, source="imported", origin=origin)
            if is_tree_failure(api, key, body, listed):
                record = replace(record, outcome=FAILURE, reason=TREE_FAILURE_REASON)
            items.append((record.keep_json(), canonical_from_upstream_key(key)))
        out.append(_FileRead(path, items))
    return out


def _tasks(files: list[tuple[str, Path, int]]) -> Iterator[list[tuple[str, str]]]:
    """The files (API, path, size) in order, grouped into tasks of about :data:`_TASK_BYTES` (or :data:`_TASK_FILES` files)."""
    task: list[tuple[str, str]] = []
    size = 0
    for api, path, file_size in files:
        task.append((api, str(path)))
        size += file_size
        if size >= _TASK_BYTES or len(task) >= _TASK_FILES:
            yield task
            task, size = [], 0
    if task:
        yield task


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


READER_DIED = (
    "a reader process died (out of memory?); what was written so far is kept: run the import "
    "again (entries already present are skipped), with --jobs 0 to read in one process"
)


class ImportFailed(RuntimeError):
    """The import stopped before the end (the entries written so far stay)."""


def default_jobs() -> int:
    """Reader processes for a large import: one per core, at most 4 (parsing is two thirds of the work)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 4))


def _reader_main(tasks: Any, results: Any, origin_root: str) -> None:
    """A reader process: parse each task it is sent and send the reads back, until ``None`` or the writer is gone."""
    # Ctrl-C reaches the whole process group: the writer stops the import and tells the readers to end
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while (job := tasks.recv()) is not None:
            files, listed = job
            results.send(_read_files(files, origin_root, listed))
    except (EOFError, OSError):  # the writer stopped (its ends of the pipes are closed)
        return


class _Readers:
    """``jobs`` reader processes, each with a pipe of its own for tasks and one for reads.

    Only the reader holds the writing end of its reads pipe, so a reader that dies (the kernel's
    out-of-memory killer), even halfway through sending, is an end of file here: never a wait
    for bytes that will not come (as a pool sharing one result pipe would wait).  A thread per
    reader takes its reads off the pipe as they come (at most one kept waiting), so a reader
    goes on to its next task while this process writes.
    """

    def __init__(self, jobs: int, origin_root: str) -> None:
        # spawn: a fresh interpreter per reader (no fork of a process that may hold threads or locks)
        ctx = multiprocessing.get_context("spawn")
        self._stop = threading.Event()
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._reads: list[Any] = []
        self._arrived: list[queue.Queue[list[_FileRead] | None]] = []
        self._threads: list[threading.Thread] = []
        try:
            for _ in range(jobs):
                task_out, task_in = ctx.Pipe(duplex=False)
                reads_out, reads_in = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_reader_main, args=(task_out, reads_in, origin_root), daemon=True, name="import-reader")
                proc.start()
                task_out.close()
                reads_in.close()
                arrived: queue.Queue[list[_FileRead] | None] = queue.Queue(maxsize=1)
                thread = threading.Thread(target=self._take, args=(reads_out, arrived), daemon=True, name="import-reads")
                thread.start()
                self._procs.append(proc)
                self._tasks.append(task_in)
                self._reads.append(reads_out)
                self._arrived.append(arrived)
                self._threads.append(thread)
        except BaseException:
            self.close()
            raise

    def _take(self, conn: Any, arrived: queue.Queue[list[_FileRead] | None]) -> None:
        while True:
            try:
                reads = conn.recv()
            except (EOFError, OSError):
                reads = None  # the reader is gone
            while not self._stop.is_set():
                try:
                    arrived.put(reads, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if reads is None or self._stop.is_set():
                return

    def send(self, reader: int, job: tuple[list[tuple[str, str]], frozenset[tuple[str, str]]]) -> None:
        try:
            self._tasks[reader].send(job)
        except OSError:
            raise ImportFailed(READER_DIED) from None

    def recv(self, reader: int) -> list[_FileRead]:
        reads = self._arrived[reader].get()
        if reads is None:
            raise ImportFailed(READER_DIED)
        return reads

    def close(self) -> None:
        self._stop.set()  # reads that still arrive are dropped: a reader never waits to send them
        for conn in self._tasks:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)  # each ends at its reader's end of file
        for conn in self._tasks + self._reads:
            conn.close()


def _read_in_order(tasks: list[list[tuple[str, str]]], origin_root: str, listed: set[tuple[str, str]],
                   jobs: int) -> Generator[list[_FileRead], None, None]:
    """Each task's reads, in task order: in this process (``jobs`` 0) or in ``jobs`` reader processes.

    Task ``i`` goes to reader ``i % jobs``, each reader holding two tasks, and is sent the next
    as its reads are taken: at most ``3 * jobs`` tasks are read ahead of the writing (memory
    stays flat however large the tree).
    """
    by_api: dict[str, list[tuple[str, str]]] = {}
    for api, key in listed:
        by_api.setdefault(api, []).append((api, key))

    def job(task: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], frozenset[tuple[str, str]]]:
        # a snapshot's failure records stay failure records: each task gets those of its files
        return task, frozenset(pair for api, _path in task for pair in by_api.get(api, ()))

    if jobs <= 0:
        for task in tasks:
            files, failures = job(task)
            yield _read_files(files, origin_root, failures)
        return
    try:
        readers = _Readers(jobs, origin_root)
    except OSError as exc:
        log.warning("cannot start reader processes (%s); reading the files in this process (--jobs 0)", exc)
        yield from _read_in_order(tasks, origin_root, listed, 0)
        return
    ahead = 2 * jobs
    try:
        for i, task in enumerate(tasks[:ahead]):
            readers.send(i % jobs, job(task))
        for i in range(len(tasks)):
            reads = readers.recv(i % jobs)
            if i + ahead < len(tasks):
                readers.send(i % jobs, job(tasks[i + ahead]))
            yield reads
    finally:
        readers.close()


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as text that can always be printed: bytes that are not UTF-8 shown as ``\\xff``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _files_to_import(root: str | os.PathLike[str], allow_symlinks: bool, max_file_bytes: int | None,
                     skipped: list[str]) -> list[tuple[str, Path, int]]:
    """``(api, path, size)`` of the files to read; those that cannot be imported go to ``skipped``, with a warning."""
    from stabletoolbench_mirror.stores.frozen import too_large

    files = []
    for api, path in iter_cache_files(root, allow_symlinks=allow_symlinks, refused=skipped):
        size = _size(path)
        if not is_utf8_encodable(api):
            why = (f"{shown_path(path)}: the name is not UTF-8 (an API's name is text): "
                   "rename the file or folder (e.g. convmv -f latin1 -t utf8) and import again")
        elif max_file_bytes is not None and size > max_file_bytes:
            why = too_large(shown_path(path), size, max_file_bytes)
        else:
            files.append((api, path, size))
            continue
        log.warning("skipping %s", why)
        skipped.append(why)
    return files


def import_tree(
    store: Store, root: str | os.PathLike[str], *, progress: bool = True, allow_symlinks: bool = False, jobs: int | None = None,
    max_file_bytes: int | None = None,
) -> ImportSummary:
    """Copy every entry of an upstream tree into ``store`` as ``imported`` (idempotent).

    A file that cannot be served (not JSON, nested too deeply, a lone surrogate, a symbolic link
    out of the tree, a name that is not UTF-8, larger than ``max_file_bytes``: ``frozen_max_file_mb``)
    is left out, reported in :attr:`ImportSummary.bad_files`, and the import goes on.
    Files are parsed by ``jobs`` reader processes (default :func:`default_jobs`; ``0``, and the
    default for a tree under 16 MB: in this process) while this process writes, in file order, in batches.
    """
    summary = ImportSummary()
    started = time.perf_counter()
    refused: list[str] = []
    files = _files_to_import(root, allow_symlinks, max_file_bytes, refused)
    summary.bad_files.extend(refused)
    origin_root = Path(root).name or str(root)
    tasks = list(_tasks(files))
    if jobs is None:
        jobs = default_jobs() if sum(size for _api, _path, size in files) >= _PARALLEL_MIN_BYTES else 0
    batch: list[tuple[Record, str | None]] = []

    def flush() -> None:
        for added in store.add_many(batch):
            if added:
                summary.added += 1
            else:
                summary.already_present += 1
        batch.clear()

    ctrl_c = CtrlC("stopping: the records read so far are written (Ctrl-C again to quit now)")
    reading = _read_in_order(tasks, origin_root, tree_failure_entries(root), min(jobs, len(tasks)))
    with ctrl_c, closing(reading), progress_bar(total=len(files), desc="import", unit="file", disable=not progress) as bar:
        for reads in reading:
            for read in reads:
                bar.update(1)
                if read.items is None:
                    log.warning("skipping %s", read.error)
                    summary.bad_files.append(read.error)
                    continue
                summary.files += 1
                summary.entries += len(read.items)
                batch.extend(read.items)
                if len(batch) >= IMPORT_BATCH:
                    flush()
            if progress:
                bar.set_postfix_str(f"{summary.entries:,} entries", refresh=False)
            if ctrl_c.pressed:
                break
    if batch:
        flush()
    if ctrl_c.pressed:
        # between two tasks (never inside a lock shared with the readers): what was read is written
        raise KeyboardInterrupt
    summary.seconds = time.perf_counter() - started
    return summary
