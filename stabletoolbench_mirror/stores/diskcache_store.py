"""The embedded default store: a diskcache (SQLite + files) folder, safe across threads and processes."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import diskcache

from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import diskcache_layout as layout
from stabletoolbench_mirror.stores import formats, rules
from stabletoolbench_mirror.stores.base import Store, StoreCounts, StoreError, _recording_order
from stabletoolbench_mirror.stores.diskcache_keys import (
    CANONICAL,
    CHANGES,
    COUNT,
    COUNTED,
    DELETES,
    ENTRY,
    FORMAT,
    NAMESPACE,
    api_range,
    canonical_key,
    count_key,
    counted_as,
    entry_key,
    failure_shares_a_key,
    format_marker,
    stored_int,
    stored_record,
    stored_text,
)
from stabletoolbench_mirror.stores.filelock import ByteRangeLocks, PrivateRunLock
from stabletoolbench_mirror.stores.leases import wait_for_lock
from stabletoolbench_mirror.stores.occurrence_file import OccurrenceFile
from stabletoolbench_mirror.stores.recent_reads import UNKNOWN, ChangeWatch, RecentReads

if TYPE_CHECKING:
    from stabletoolbench_mirror.stores.kinds import StoreSpec
    from stabletoolbench_mirror.stores.sessions import SessionStore

log = logging.getLogger(__name__)

_SCAN_PAGE = 1000
_MAX_KNOWN_APIS = 100_000


T = TypeVar("T")
_WRITE_FAILURES = (OSError, sqlite3.Error, diskcache.Timeout)
_FAILURES = {"read": (OSError, sqlite3.Error), "write": _WRITE_FAILURES, "delete": _WRITE_FAILURES, "lock": (OSError,),
             "occurrence counter": (sqlite3.Error, ValueError, KeyError)}


@contextlib.contextmanager
def _failing(what: str) -> Iterator[None]:
    """The storage's errors in the block as :class:`StoreError` (``diskcache <what> failed: ...``)."""
    try:
        yield
    except _FAILURES[what] as exc:
        raise StoreError(f"diskcache {what} failed: {exc}") from exc


class DiskcacheStore(Store):
    """Records as JSON text in a :class:`diskcache.Cache` (no pickles: the data stays inspectable).

    Several processes (``serve --workers N``, ``warm``) may use one folder at once: SQLite
    serialises the writes, each write is one transaction (never torn), and ``add`` is
    add-if-absent, so the first answer for a key wins in every process.  :meth:`flight_lock`
    is a kernel byte-range lock on a file in the folder, so the processes of one host also
    share single flight (one simulation per call).
    """

    kind = "diskcache"
    reads_wait = False
    folder = True

    @classmethod
    def open_spec(cls, spec: StoreSpec, read_only: bool) -> Store:
        return cls(spec.path, read_only=read_only, timeout_s=spec.timeout_s)

    @classmethod
    def open_sessions(cls, spec: StoreSpec, ttl_s: float) -> SessionStore:
        from stabletoolbench_mirror.stores.sessions import DiskcacheSessionStore

        return DiskcacheSessionStore(os.path.join(spec.path, "sessions"), ttl_s)

    @classmethod
    def spec_of(cls, text: str, configured: StoreSpec) -> StoreSpec | None:
        """A folder holding ``cache.db``."""
        if not os.path.isfile(os.path.join(text, "cache.db")):
            return None
        return dataclasses.replace(configured, kind=cls.kind, path=os.path.abspath(text))

    #: the lock file beside SQLite's (diskcache's consistency check skips names containing ``cache.db``)
    LOCK_FILE = "cache.db-flightlock"
    #: who holds the store's private model-call run (:meth:`hold_private_run`): a line for the refusal's message
    PRIVATE_RUN_FILE = "cache.db-privaterun"

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False,
                 timeout_s: float = 60.0) -> None:
        """``read_only``: open an existing store for reading only (``cache stats``): nothing in the
        folder is written, a store that is not there is an error, and ``add`` raises :class:`StoreError`.
        ``timeout_s``: the longest a model call's occurrence claim waits for another process's lock (``store.timeout_s``)."""
        self.path = os.fspath(path)
        self.timeout_s = float(timeout_s)
        self.read_only = read_only
        self._write_lock = threading.Lock()
        self._known_apis: set[str] = set()
        """APIs known to have their key already: no write to find out again (forgotten after a ``delete``)."""
        self._deletes_seen: object = None
        self._occurrence_file: OccurrenceFile | None = None
        """The occurrence counters of model calls, opened at the first claim."""
        self._private_run: PrivateRunLock | None = None
        """The store's private model-call run (:meth:`hold_private_run`); none in a read-only store."""
        if read_only:
            try:
                self._cache: Any = layout.ReadOnlyCache(self.path)
                layout.check(self._cache)
                formats.decide(format_marker(self._cache), self.path)  # refuses a newer format
            except (OSError, sqlite3.Error) as exc:
                raise StoreError(f"cannot open diskcache store at {self.path} for reading: {exc}") from exc
            self._locks: ByteRangeLocks | None = None
            # a read-only store serves a command (cache stats, ls): nothing is kept, every read goes to SQLite
            self._reads: RecentReads | None = None
            return
        try:
            os.makedirs(self.path, exist_ok=True)
            # no eviction: a response cache that forgets is not reproducible.  Statement journals in
            # memory (``temp_store``, applied to every connection diskcache opens): each row of a
            # bulk insert would otherwise spill the pages it changes into a temporary file
            self._cache = diskcache.Cache(
                self.path, eviction_policy="none", size_limit=2**62, cull_limit=0, timeout=60, sqlite_temp_store=2
            )
            layout.check(self._cache)
            if formats.decide(format_marker(self._cache), self.path) == "mark":
                self._cache.set(FORMAT, formats.current().to_text())
            self._locks = ByteRangeLocks(os.path.join(self.path, self.LOCK_FILE))
            self._private_run = PrivateRunLock(self._locks, os.path.join(self.path, self.PRIVATE_RUN_FILE))
            try:
                self._reads = RecentReads(ChangeWatch.of(os.path.join(self.path, "cache.db")))
            except sqlite3.Error as exc:  # no change watch: nothing kept, every read goes to SQLite
                log.warning("diskcache store at %s: reads are not kept (no change watch: %s)", self.path, exc)
                self._reads = None
            if COUNTED not in self._cache and layout.first_key(self._cache, ENTRY + "\x00", ENTRY + "\x01") is None:
                # an empty store: the counters kept from now on count every record
                self._cache.add(COUNTED, 1)
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise StoreError(f"cannot open diskcache store at {self.path}: {exc}") from exc

    def get(self, api: str, key: str) -> Record | None:
        reads = self._reads
        if reads is not None:  # a read kept while no process wrote to the store (:mod:`.recent_reads`)
            now = reads.watch.token()
            kept = reads.get((ENTRY, api, key), now)
            if kept is not UNKNOWN:
                return kept
        try:
            raw = self._cache.get(entry_key(api, key))
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache read failed: {exc}") from exc
        record = None if raw is None else stored_record(raw)
        if reads is not None:
            reads.put((ENTRY, api, key), now, record, 0 if record is None else len(record.body))
        return record

    def get_canonical(self, api: str, canonical: str) -> Record | None:
        reads = self._reads
        if reads is not None:
            now = reads.watch.token()
            kept = reads.get((CANONICAL, api, canonical), now)
            if kept is not UNKNOWN:
                return None if kept is None else self.get(api, kept)
        try:
            key = self._cache.get(canonical_key(api, canonical))
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"diskcache read failed: {exc}") from exc
        if reads is not None:
            reads.put((CANONICAL, api, canonical), now, None if key is None else stored_text(key))
        return None if key is None else self.get(api, stored_text(key))

    def change_token(self) -> int | None:
        """SQLite's word on whether the store changed (:class:`~.recent_reads.ChangeWatch`), or ``None`` without a watch."""
        reads = self._reads
        return None if reads is None else reads.watch.token()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction; once it has ended, this process's kept reads are stale (other
        processes' watches see the commit by themselves), and so are those of a 0.2.0 reader."""
        try:
            with self._cache.transact(retry=True):
                yield
        finally:
            if self._reads is not None:
                self._reads.watch.changed()
            formats.touch_legacy_generation(self.path)

    def _occurrence_now(self, run: str, digest: str, decide: rules.Decide) -> int | None:
        """:meth:`_occurrence` in one short transaction when nobody holds the counters' lock (``None`` otherwise,
        and before the counters' file is opened, which removes expired rows: a worker thread's work)."""
        counters = self._occurrence_file
        if self.read_only:
            return super()._occurrence(run, digest, decide)
        if counters is None:
            return None
        with _failing("occurrence counter"):
            return counters.apply_now(run, digest, decide)

    def hold_private_run(self, run: str) -> str | None:
        """One byte of the flight-lock file, locked for as long as the store is open (:class:`~.filelock.PrivateRunLock`)."""
        if self._private_run is None:
            return None
        return self._private_run.hold(f"process {os.getpid()} (run {run!r}, since {time.strftime('%Y-%m-%d %H:%M:%S')})", log)

    def release_private_run(self) -> None:
        if self._private_run is not None:
            self._private_run.release()

    def _occurrence(self, run: str, digest: str, decide: rules.Decide) -> int:
        """One counter's read, decision and write, in the store's occurrence file (:mod:`.occurrence_file`);
        a read-only store counts in this process (what it cannot write, it cannot share)."""
        if self.read_only:
            return super()._occurrence(run, digest, decide)
        counters = self._occurrence_file
        if counters is None:
            with self._write_lock:
                if self._occurrence_file is None:
                    try:
                        self._occurrence_file = OccurrenceFile(self.path, self.timeout_s)
                    except sqlite3.Error as exc:
                        raise StoreError(f"diskcache occurrence counters at {self.path} cannot be opened: {exc}") from exc
            counters = self._occurrence_file
        with _failing("occurrence counter"):
            return counters.apply(run, digest, decide)

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"diskcache store at {self.path} was opened read-only")

    def add(self, record: Record, canonical: str | None) -> bool:
        # the bulk path for one record: one read of its keys and one insert for a new one
        # (the same rows and counters as _add_in_transaction, in 3 statements instead of 7)
        return self.add_many([(record, canonical)])[0]

    def _written(self, what: str, change: Callable[[], T], apis: Iterable[str] = ()) -> T:
        """``change`` in one write transaction (the entries, their pointers and the counters, or nothing);
        one writer at a time per process: threads queue on a lock instead of on SQLite's busy loop.
        ``apis`` have their key once it committed."""
        self._writable()
        with self._write_lock:
            with _failing(what), self._transaction():
                self._see_deletes()
                done = change()
            self._remember_apis(apis)
        return done

    def _holding(self, record: Record, canonical: str | None) -> rules.Holding:
        """What the store holds for ``record``'s key and canonical key (read inside the write transaction)."""
        raw = self._cache.get(entry_key(record.api, record.key))
        found = None if canonical is None else self._cache.get(canonical_key(record.api, canonical))
        target = None if found is None else stored_text(found)
        failing = False
        if rules.needs_target_record(record, canonical, target):  # whether the target's entry is a failure (or missing)
            target_raw = self._cache.get(entry_key(record.api, target or ""))
            failing = target_raw is None or stored_record(target_raw).is_failure
        return rules.Holding(None if raw is None else stored_record(raw), target, failing)

    def _apply(self, record: Record, canonical: str | None, plan: rules.Plan, deltas: Counter[str]) -> None:
        """Apply a plan of :mod:`.rules` (inside the caller's transaction); its counts go into ``deltas``."""
        cache = self._cache
        if plan.write:
            cache.set(entry_key(record.api, record.key), record.to_json())
        if plan.point and canonical is not None:
            cache.set(canonical_key(record.api, canonical), record.key)
        deltas.update(counted_as(plan.counts))
        if plan.write and record.api not in self._known_apis and cache.add(f"{NAMESPACE}\x00{record.api}", 1):
            deltas[count_key("apis")] += 1

    def _add_in_transaction(self, record: Record, canonical: str | None, deltas: Counter[str]) -> bool:
        """Add one record by :func:`.rules.add`; its counts go into ``deltas`` (the caller applies them in the same transaction)."""
        plan = rules.add(record, canonical, self._holding(record, canonical))
        self._apply(record, canonical, plan, deltas)
        return plan.write

    def _remember_apis(self, apis: Iterable[str]) -> None:
        """After a commit: these APIs have their key now (so later adds skip the write that checks it)."""
        if len(self._known_apis) >= _MAX_KNOWN_APIS:
            self._known_apis.clear()
        self._known_apis.update(apis)

    def add_many(self, items: Iterable[tuple[Record, str | None]]) -> list[bool]:
        """Add records in one transaction (bulk import): one commit, one lookup of the keys already
        present, one multi-row insert, and each counter updated once.  Same result as ``add`` each."""
        items = list(items)
        return self._written("write", lambda: self._insert_batch(items), [record.api for record, _ in items])

    def _insert_batch(self, items: list[tuple[Record, str | None]]) -> list[bool]:
        entry_keys = [entry_key(record.api, record.key) for record, _ in items]
        pointer_keys = [canonical_key(record.api, canonical) if canonical is not None else None for record, canonical in items]
        api_keys = [f"{NAMESPACE}\x00{api}" for api in {record.api for record, _ in items} - self._known_apis]
        record_keys = entry_keys + [k for k in pointer_keys if k is not None]
        present = layout.present(self._cache, record_keys + api_keys)
        deltas: Counter[str] = Counter()
        if not present.isdisjoint(record_keys) or failure_shares_a_key(items, entry_keys, pointer_keys):
            # keys already there, or a failure record sharing a key in the batch (an answer may replace
            # a failure, or take its canonical key): one by one
            added = [self._add_in_transaction(record, canonical, deltas) for record, canonical in items]
        else:
            added = self._insert_new(items, entry_keys, pointer_keys, present, deltas)
        layout.increment(self._cache, deltas)  # as incr of each, with one read of all the counters
        return added

    def _insert_new(self, items: list[tuple[Record, str | None]], entry_keys: list[str], pointer_keys: list[str | None],
                    present: set[str], deltas: Counter[str]) -> list[bool]:
        """Nothing of the batch is there yet: the rules decide for the batch as a whole, one insert writes it
        (rows written exactly as diskcache's own ``add`` writes them: no expiry, no tag)."""
        now = time.time()
        rows: list[layout.Row] = []

        def row(key: str, value: object) -> None:
            present.add(key)
            rows.append(layout.row(self._cache, key, value, now))

        plans = rules.batch_adds(items, [rules.Holding(None)] * len(items))
        for (record, _canonical), entry, pointer, plan in zip(items, entry_keys, pointer_keys, plans):
            if plan.write:
                row(entry, record.to_json())
                api_key = f"{NAMESPACE}\x00{record.api}"
                if record.api not in self._known_apis and api_key not in present:
                    row(api_key, 1)
                    deltas[count_key("apis")] += 1
            if plan.point and pointer is not None:
                row(pointer, record.key)
            deltas.update(counted_as(plan.counts))
        if rows:
            layout.insert(self._cache, rows)
        return [plan.write for plan in plans]

    def _see_deletes(self) -> None:
        """Forget the APIs known to have their key when a ``delete`` (in any process) may have removed one."""
        seen = self._cache.get(DELETES)
        if seen != self._deletes_seen:
            self._known_apis.clear()
            self._deletes_seen = seen

    def delete(self, api: str, keys: Iterable[str]) -> int:
        self._writable()
        keys = list(dict.fromkeys(keys))
        return self._written("delete", lambda: self._delete_in_transaction(api, keys)) if keys else 0

    def _delete_in_transaction(self, api: str, keys: list[str]) -> int:
        cache = self._cache
        removed: list[Record] = []
        for key in keys:
            entry = entry_key(api, key)
            raw = cache.get(entry)
            if raw is None:
                continue
            removed.append(stored_record(raw))
            cache.delete(entry)
        if not removed:
            return 0
        deltas = counted_as(rules.delete(removed))
        gone = {record.key for record in removed}
        pointers = [k for k, v in layout.scan(cache, *api_range(CANONICAL, api), inclusive=True, page=_SCAN_PAGE) if v in gone]
        for pointer in pointers:
            cache.delete(pointer)
        if layout.first_key(cache, *api_range(ENTRY, api)) is None:
            if cache.delete(f"{NAMESPACE}\x00{api}"):
                deltas[count_key("apis")] -= 1
        cache.incr(DELETES, 1)
        cache.incr(CHANGES, 1)
        layout.increment(self._cache, deltas)  # as incr of each, with one read of all the counters
        self._known_apis.discard(api)
        return len(removed)

    def replace(self, record: Record, canonical: str | None) -> bool:
        self._written("write", lambda: self._replace_in_transaction(record, canonical), [record.api])
        return True

    def _replace_in_transaction(self, record: Record, canonical: str | None) -> None:
        held = self._holding(record, canonical)
        deltas: Counter[str] = Counter()
        self._apply(record, canonical, rules.replace(record, canonical, held), deltas)
        if held.current is not None:
            self._cache.incr(CHANGES, 1)
        layout.increment(self._cache, deltas)  # as incr of each, with one read of all the counters

    def counts(self) -> StoreCounts | None:
        """The store's counters (no scan), or ``None`` when they were not kept since the store was empty."""
        with _failing("read"):
            if COUNTED not in self._cache:
                return None
            counters = [(tuple(key.split("\x00")[1:]), stored_int(value)) for key, value in self._scan_values(COUNT)]
        return StoreCounts.of(counters, disk_bytes=self._disk_bytes())

    def _disk_bytes(self) -> int:
        total = 0
        for folder, _dirs, files in os.walk(self.path):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(folder, name))
        return total

    def _scan_values(self, kind: str) -> Iterator[tuple[str, object]]:
        """``(key, value)`` of the keys of one kind in key order, a page of rows at a time."""
        return layout.scan(self._cache, kind + "\x00", kind + "\x01", inclusive=False, page=_SCAN_PAGE)

    def iter_groups(self) -> Iterator[tuple[str, list[Record]]]:
        """``(api, records)`` in api order, one API in memory at a time (a key-range scan)."""
        with _failing("read"):
            records = (stored_record(raw) for _key, raw in self._scan_values(ENTRY))
            for api, group in itertools.groupby(records, key=lambda record: record.api):
                yield api, _recording_order(list(group))

    def iter_api(self, api: str) -> Iterator[Record]:
        low, high = api_range(ENTRY, api)
        with _failing("read"):
            for _key, raw in layout.scan(self._cache, low, high, inclusive=True, page=_SCAN_PAGE):
                yield stored_record(raw)

    def sample(self, api: str, limit: int) -> Iterator[Record]:
        # a key-range scan over diskcache's SQLite table (string keys are stored raw), one page of ``limit`` rows
        rows = layout.scan(self._cache, *api_range(ENTRY, api), inclusive=True, page=max(limit, 1))
        with _failing("read"):
            for _key, raw in itertools.islice(rows, max(limit, 0)):
                yield stored_record(raw)

    @contextlib.contextmanager
    def flight_lock(self, api: str, canonical: str) -> Iterator[None]:
        """A byte-range lock on ``cache.db-flightlock`` in the store folder (see :mod:`.filelock`).

        Shared by every process that opens this folder on this host; the kernel drops it when
        its holder exits, even on ``kill -9``.  A waiter polls every :data:`~.leases.POLL_S` and goes
        ahead without it after :data:`~.leases.MAX_LOCK_WAIT_S`.
        """
        self._writable()
        locks = self._locks
        assert locks is not None  # a writable store has its lock file
        name = f"{api}\x00{canonical}"
        with _failing("lock"):
            offset = wait_for_lock(lambda: locks.try_acquire(name), api, log)
        if self._reads is not None:
            # whoever held the lock may have recorded the answer in another process: look now
            self._reads.watch.check()
        try:
            yield
        finally:
            if offset is not None:
                try:
                    locks.release(offset)
                except OSError as exc:  # pragma: no cover - unlocking an open file does not fail
                    log.warning("single-flight lock for %s not released: %s", clip(api), exc)

    def __iter__(self) -> Iterator[Record]:
        with _failing("read"):
            for _key, raw in self._scan_values(ENTRY):
                yield stored_record(raw)

    def _count_records(self) -> int:
        with _failing("read"):
            return layout.count_range(self._cache, ENTRY + "\x00", ENTRY + "\x01")

    def close(self) -> None:
        if self._locks is not None:
            self._locks.close()
        if self._occurrence_file is not None:
            self._occurrence_file.close()
        reads, self._reads = self._reads, None
        if reads is not None:
            reads.watch.release()  # before SQLite's own connections close (see ChangeWatch)
        self._cache.close()

