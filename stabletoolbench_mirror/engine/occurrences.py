"""Where a model call's occurrence number is counted: the server's own run in bounded memory, every other run in the store.

A run's counter of one request (:class:`~stabletoolbench_mirror.stores.rules.Occurrences`) must never hand
out a number twice, and must not stall the server while it waits for a store.  :class:`RunCounters` is the
one door:

* the server's **private run** (one worker, no run named: nobody else can share it) is counted in this
  process's memory by :class:`PrivateRun`, so a hit writes nothing.  Its memory is bounded: at most
  ``limit`` requests' counters (:data:`PRIVATE_RUN_LIMIT`), the least recently used spilled (in batches, by
  a worker thread) to a SQLite file of the run's own in the temporary folder, which is removed when the
  server stops.  A request whose counter may have been spilled (a Bloom filter of 2 MiB says so, never
  wrongly "no") is counted in that file from then on, after every spill waiting to be written is; while a
  spill cannot be written, new requests are refused (:class:`StoreError`, HTTP 503) rather than counted
  from 1 again;
* any other run (``llm.run``, ``X-STM-Run``, the workers of ``serve --workers N``) is counted in the store,
  shared by every process (and, with Redis, every host): on the event loop when the store can do it at
  once (diskcache's :meth:`~stabletoolbench_mirror.stores.base.Store.claim_occurrence_now`: one short SQLite
  transaction when nobody holds the lock), else in a worker thread of its own pool, waited for at most
  ``store.timeout_s``.  A claim that answers only after that is given back when it does, so a number
  nobody got is never lost.

Bounded maps with eviction exist as libraries (``cachetools``), but none spills what it evicts where a
later lookup finds it again, which is what keeps numbers unique; written here for that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

from stabletoolbench_mirror.stores import rules
from stabletoolbench_mirror.stores.base import Store, StoreError
from stabletoolbench_mirror.stores.occurrence_file import OccurrenceFile

log = logging.getLogger(__name__)

#: the private run's requests counted in memory (about 180 bytes each: 18 MiB); beyond, the least recently used are spilled
PRIVATE_RUN_LIMIT = 100_000
#: counters written to the spill file in one transaction
SPILL_BATCH = 4096
#: the Bloom filter of spilled requests, in bits (2 MiB; four bits per request: 1 in 500 false "maybe" at 1,000,000 spilled)
BLOOM_BITS = 1 << 24
#: threads for store waits (a hung store holds these, never the upstream calls' or the event loop)
STORE_THREADS = 8

_Held = int | rules.Occurrences
"""A counter in memory: its next number alone (the usual case: nothing given back), or the whole :class:`Occurrences`."""


def _compact(held: rules.Occurrences) -> _Held:
    return held.next if not held.free else held


def _whole(held: _Held) -> rules.Occurrences:
    return held if isinstance(held, rules.Occurrences) else rules.Occurrences(held)


class _Counters(LRUCache[bytes, _Held]):
    """The counters in memory, least recently used first; each one evicted goes to ``evicted`` (cachetools' eviction
    hook is :meth:`popitem`)."""

    def __init__(self, limit: int, evicted: Callable[[bytes, _Held], None]) -> None:
        super().__init__(limit)
        self._evicted = evicted

    def popitem(self) -> tuple[bytes, _Held]:
        key, state = super().popitem()
        self._evicted(key, state)
        return key, state


class PrivateRun:
    """The counters of the server's private run: in memory up to ``limit`` requests, spilled beyond (see the module)."""

    def __init__(self, run: str, limit: int = PRIVATE_RUN_LIMIT, batch: int = SPILL_BATCH, bloom_bits: int = BLOOM_BITS) -> None:
        self.run = run
        self.limit = limit
        self.batch = batch
        self._held = _Counters(limit, self._evict)
        self._pending: dict[bytes, rules.Occurrences] = {}
        """Counters evicted from memory, not yet written to the spill file (their keys are in the Bloom filter)."""
        if bloom_bits & (bloom_bits - 1) or bloom_bits < 8:
            raise ValueError("bloom_bits must be a power of two")
        self._bits = bloom_bits
        self._bloom = bytearray(bloom_bits // 8)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._file_lock = threading.Lock()
        self._folder: str | None = None
        self._file: OccurrenceFile | None = None

    # -- on the event loop: never waits ----------------------------------------------------------

    def claim_now(self, digest: str) -> int | None:
        """The number of ``digest``'s request, counted in memory; ``None``: it is counted in the spill file
        (:meth:`claim`, in a worker thread)."""
        key = bytes.fromhex(digest)
        with self._lock:
            held = self._held.get(key)
            if held is None and (self._maybe_spilled(key) or len(self._pending) >= 2 * self.batch):
                self._mark(key)  # counted in the file from now on: never in memory again
                return None
            if held is None or isinstance(held, int):  # nothing given back: the next number (the rule's usual case, no objects)
                number = held or 1
                self._held[key] = number + 1
            else:
                number, after = rules.claim_occurrence(held)
                self._held[key] = _compact(after)
            return number

    def _evict(self, key: bytes, state: _Held) -> None:
        """A counter past ``limit`` (the least recently used), to be spilled; under ``_lock``."""
        self._mark(key)
        self._pending[key] = _whole(state)

    def release_now(self, digest: str, number: int) -> bool:
        """Give ``number`` back in memory; ``False`` when the counter is not in memory (:meth:`release`, in a thread)."""
        key = bytes.fromhex(digest)
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return False
            self._held[key] = _compact(rules.release_occurrence(_whole(held), number))
            return True

    def wants_spill(self) -> bool:
        """Whether a batch of evicted counters waits to be written (:meth:`spill`, in a worker thread)."""
        return len(self._pending) >= self.batch and not self._flush_lock.locked()

    # -- in worker threads ---------------------------------------------------------------------------

    def claim(self, digest: str) -> int:
        """:meth:`claim_now`'s ``None``: the number from the spill file, once every evicted counter is written there."""
        return self._in_file(digest, rules.claim_occurrence)

    def release(self, digest: str, number: int) -> None:
        self._in_file(digest, lambda held: (number, rules.release_occurrence(held, number)))

    def _in_file(self, digest: str, decide: Callable[[rules.Occurrences], tuple[int, rules.Occurrences]]) -> int:
        self.spill()
        try:
            return self._spill_file().apply(self.run, digest, decide)
        except (sqlite3.Error, ValueError, KeyError) as exc:
            raise StoreError(f"the private run's spilled occurrence counter failed: {exc}") from exc

    def spill(self) -> None:
        """Write every evicted counter to the spill file (one transaction); :class:`StoreError` when it cannot
        (they stay in memory, and the requests counted in the file wait for them)."""
        with self._flush_lock:
            with self._lock:
                batch = dict(self._pending)
            if not batch:
                return
            spilled = self._spill_file()
            try:
                spilled.put_many(self.run, ((key.hex(), held) for key, held in batch.items()))
            except sqlite3.Error as exc:
                raise StoreError(f"the private run's spilled occurrence counters cannot be written: {exc}") from exc
            with self._lock:
                for key in batch:
                    self._pending.pop(key, None)

    def _spill_file(self) -> OccurrenceFile:
        if self._file is None:
            with self._file_lock:
                if self._file is None:
                    try:
                        self._folder = self._folder or tempfile.mkdtemp(prefix="stm-private-run-")
                        self._file = OccurrenceFile(self._folder, durable=False)
                    except (OSError, sqlite3.Error) as exc:
                        raise StoreError(f"the private run's spill file cannot be made: {exc}") from exc
        return self._file

    def close(self) -> None:
        """Remove the spill file: the run ends with the server, and nobody else can ever use it."""
        if self._file is not None:
            self._file.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._file = self._folder = None

    # -- the Bloom filter of spilled keys ----------------------------------------------------------------

    def _positions(self, key: bytes) -> tuple[int, int, int, int]:
        # the key is a SHA-256: its bits are already uniform, four 32-bit slices of it are four independent hashes
        n, mask = int.from_bytes(key[:16], "big"), self._bits - 1
        return n & mask, (n >> 32) & mask, (n >> 64) & mask, (n >> 96) & mask

    def _maybe_spilled(self, key: bytes) -> bool:
        bloom = self._bloom
        a, b, c, d = self._positions(key)
        return bool(bloom[a >> 3] & (1 << (a & 7)) and bloom[b >> 3] & (1 << (b & 7)) and
                    bloom[c >> 3] & (1 << (c & 7)) and bloom[d >> 3] & (1 << (d & 7)))

    def _mark(self, key: bytes) -> None:
        for p in self._positions(key):
            self._bloom[p >> 3] |= 1 << (p & 7)


class RunCounters:
    """The one door to occurrence numbers (see the module): ``private`` for the server's own run, the store for the rest."""

    def __init__(self, store: Store, private: PrivateRun | None, timeout_s: float) -> None:
        self.store = store
        self.private = private
        self.timeout_s = timeout_s
        """``store.timeout_s``: the longest a claim or a release waits for the store."""
        self._pool = concurrent.futures.ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="stm-occurrences")
        self._spilling: set[asyncio.Future[Any]] = set()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.private is not None:
            self.private.close()

    async def claim(self, run: str, digest: str) -> int:
        """``digest``'s number in ``run``; :class:`StoreError` when the store cannot count it within ``store.timeout_s``."""
        private = self.private if self.private is not None and run == self.private.run else None
        if private is not None:
            number = private.claim_now(digest)
            if private.wants_spill():
                self._spill_soon(private)
            if number is not None:
                return number
            return int(await self.waited(private.claim, digest, late=lambda n: private.release(digest, n)))
        number = self.store.claim_occurrence_now(run, digest)
        if number is not None:
            return number
        return int(await self.waited(self.store.claim_occurrence, run, digest,
                                      late=lambda n: self.store.release_occurrence(run, digest, n)))

    async def release(self, run: str, digest: str, number: int) -> None:
        """Give ``number`` back (its request got no answer); a failure is logged, never the request's."""
        private = self.private if self.private is not None and run == self.private.run else None
        try:
            if private is not None:
                if not private.release_now(digest, number):
                    await self.waited(private.release, digest, number)
            elif not self.store.release_occurrence_now(run, digest, number):
                await self.waited(self.store.release_occurrence, run, digest, number)
        except StoreError as exc:
            log.warning("model call: occurrence %d of %s not given back (%s)", number, digest[:16], exc)

    async def waited(self, fn: Callable[..., Any], *args: Any, late: Callable[[int], None] | None = None) -> Any:
        """``fn(*args)`` in a store thread, waited for at most ``timeout_s``.  A claim that answers later is given
        back then (``late``), so the number it took goes to the next request."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            if late is not None:
                future.add_done_callback(lambda done: self._give_back_late(done, late))
            raise StoreError(f"the store did not answer within {self.timeout_s:g} s (store.timeout_s): another process "
                             f"holds its lock, or it is unreachable") from None

    def _give_back_late(self, done: asyncio.Future[Any], late: Callable[[int], None]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        try:
            self._pool.submit(late, done.result())
        except RuntimeError:  # the pool is shut down: the server is stopping
            pass

    def _spill_soon(self, private: PrivateRun) -> None:
        """Write the private run's evicted counters in a store thread (one batch at a time)."""
        if self._spilling:
            return
        future = asyncio.get_running_loop().run_in_executor(self._pool, private.spill)
        self._spilling.add(future)

        def done(finished: asyncio.Future[Any]) -> None:
            self._spilling.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                log.warning("model call: %s", finished.exception())

        future.add_done_callback(done)
