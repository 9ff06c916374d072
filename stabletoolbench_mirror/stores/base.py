"""The interfaces of the caches: :class:`CacheTier` (every cache) and :class:`Store` (the writable one)."""

from __future__ import annotations

import abc
import contextlib
import functools
import itertools
import threading
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import rules

if TYPE_CHECKING:
    from stabletoolbench_mirror.stores.kinds import StoreSpec
    from stabletoolbench_mirror.stores.sessions import SessionStore


class StoreError(RuntimeError):
    """The store cannot be read or written right now (disk full, read-only, server down)."""


@dataclass
class StoreCounts:
    """What ``cache stats`` reports, from counters kept on every write (no scan of the records)."""

    entries: int
    apis: int
    by_source: dict[str, int] = field(default_factory=dict)
    by_category: dict[str, int] = field(default_factory=dict)
    by_origin: dict[str, int] = field(default_factory=dict)
    """Records by :func:`origin_key` (``<source>:<origin>``)."""
    by_outcome: dict[str, int] = field(default_factory=dict)
    """``failure``: failure records now; ``replaced``: usable answers that replaced one."""
    disk_bytes: int | None = None
    memory_bytes: int | None = None

    @classmethod
    def of(cls, counters: Iterable[tuple[tuple[str, ...], int]], *, disk_bytes: int | None = None,
           memory_bytes: int | None = None) -> StoreCounts:
        """The counts of counters named as :mod:`.rules` names them (``("entries",)``, ``("apis",)``,
        ``(name, value)``; others are left out), as each backend keeps them; a count at 0 is left out."""
        out = cls(entries=0, apis=0, disk_bytes=disk_bytes, memory_bytes=memory_bytes)
        for name, n in counters:
            if name in (("entries",), ("apis",)):
                setattr(out, name[0], n)
            elif len(name) == 2 and n and name[0] in ("source", "category", "origin", "outcome"):
                getattr(out, f"by_{name[0]}")[name[1]] = n
        return out


def _recording_order(records: list[Record]) -> list[Record]:
    """One API's records in recording order (the order an export writes them in)."""
    records.sort(key=lambda r: (r.created_at, r.key))
    return records


class CacheTier(abc.ABC):
    """One place answers may be found: the writable store or a frozen upstream tree.

    The layer looks a call up in every tier, in the order the "Cache keys" section of docs/cache-keys.md
    gives: the exact upstream key in each tier, then the canonical key in each tier (see
    :meth:`stabletoolbench_mirror.engine.layer.MirrorLayer.lookup`).  Implementations raise
    :class:`StoreError` for backend failures.
    """

    #: a short name for logs, ``/health`` and stats
    kind: str = "tier"

    @abc.abstractmethod
    def get(self, api: str, key: str) -> Record | None:
        """The record under exactly this upstream key."""

    @abc.abstractmethod
    def get_canonical(self, api: str, canonical: str) -> Record | None:
        """A record whose input has this canonical key."""

    @abc.abstractmethod
    def sample(self, api: str, limit: int) -> Iterable[Record]:
        """Up to ``limit`` records of one API (few-shot examples)."""

    async def aget(self, api: str, key: str) -> Record | None:
        """:meth:`get` for the server's event loop.  The default reads at once (right for local
        reads that take microseconds); tiers that read over the network or parse files override it."""
        return self.get(api, key)

    async def aget_canonical(self, api: str, canonical: str) -> Record | None:
        """:meth:`get_canonical` for the server's event loop (see :meth:`aget`)."""
        return self.get_canonical(api, canonical)

    def use_threads(self, limiter: Any) -> None:  # noqa: B027 - most tiers do no work in threads
        """Do this tier's work in threads under ``limiter`` (the server's, shared fairly between clients:
        :class:`~stabletoolbench_mirror.core.fair.FairLimiter`, an anyio limiter)."""

    def close(self) -> None:  # noqa: B027 - most tiers hold nothing to release
        """Release the tier's resources."""


class Store(CacheTier):
    """A persistent map from ``(api, upstream key)`` to a :class:`Record`: the writable tier.

    Each record is also findable by its canonical key (see :mod:`stabletoolbench_mirror.core.keys`).
    Writes are add-if-absent: the first record for a key wins and is never torn or
    overwritten, so concurrent writers (threads, processes, hosts) agree on one answer.
    The one exception is a failure record (:attr:`Record.is_failure`): a usable answer
    replaces it, and a canonical pointer naming a failure moves to the usable answer, so a
    failure never hides an answer recorded for the same call.  A usable answer is replaced
    only by :meth:`replace` (``mode: refresh``), and records go only by :meth:`delete`
    (``cache delete``); both are seen at once by every process and host using the store.
    """

    kind = "store"

    # -- what a backend says of itself (see :mod:`.kinds`) -----------------------------------------

    reads_wait = True
    """Whether a read can wait (over the network): then a model call bounds it by ``store.timeout_s``."""
    folder = False
    """Whether the store is a local folder (``store.path``), created at the first start when it is not there."""
    across_processes = True
    """Whether other processes (and hosts) opening the same spec share the records, counters and locks."""

    @classmethod
    def open_spec(cls, spec: StoreSpec, read_only: bool) -> Store:
        """The store ``spec`` names (``read_only``: an existing one, opened without writing)."""
        raise NotImplementedError

    @classmethod
    def open_sessions(cls, spec: StoreSpec, ttl_s: float) -> SessionStore:
        """The session store kept beside the store ``spec`` names."""
        raise NotImplementedError

    @classmethod
    def where(cls, spec: StoreSpec) -> str:
        """Where the store ``spec`` names is, in words a user may be shown (never a credential)."""
        return spec.path

    @classmethod
    def spec_of(cls, text: str, configured: StoreSpec) -> StoreSpec | None:
        """The spec of this backend's store ``text`` names on a command line, or ``None`` (it names none)."""
        return None

    @abc.abstractmethod
    def add(self, record: Record, canonical: str | None) -> bool:
        """Store ``record`` unless its key holds a record (a failure record is replaced by an answer).

        Return whether ``record`` was written.  ``canonical`` names ``record``'s key unless it
        already names another key holding a usable answer.  Atomic across processes and hosts.
        """

    def sample(self, api: str, limit: int) -> Iterator[Record]:
        """Up to ``limit`` records of one API; backends may do better than this scan."""
        return itertools.islice(self.iter_api(api), max(limit, 0))

    def add_many(self, items: Iterable[tuple[Record, str | None]]) -> list[bool]:
        """:meth:`add` for a batch of ``(record, canonical)`` (bulk import); backends may batch the writes."""
        return [self.add(record, canonical) for record, canonical in items]

    def iter_api(self, api: str) -> Iterator[Record]:
        """Every record of one API, streamed (``cache ls --api``); backends read only that API."""
        return (record for record in self if record.api == api)

    def delete(self, api: str, keys: Iterable[str]) -> int:
        """Remove these keys' records of ``api`` (keys not there are skipped); return how many went.

        Counters follow, canonical pointers naming a removed key go with it, and an API left
        without records is no longer counted.  Atomic per call.
        """
        raise StoreError(f"a {self.kind} store cannot delete records")

    def replace(self, record: Record, canonical: str | None) -> bool:
        """Write ``record`` over whatever its key holds (``mode: refresh``); return whether it was written.

        ``canonical`` names its key when it names nothing or a failure record.  Counters move
        from the record replaced to this one.
        """
        raise StoreError(f"a {self.kind} store cannot replace records")

    def counts(self) -> StoreCounts | None:
        """Counts kept on every write, or ``None`` when the backend keeps none (``cache stats`` then scans)."""
        return None

    def iter_groups(self) -> Iterator[tuple[str, list[Record]]]:
        """``(api, records)`` in api order, each group in recording order.

        Backends that can read one API at a time override this, so that an export or a
        snapshot holds one API in memory, not the whole store.  The default groups in memory.
        """
        groups: dict[str, list[Record]] = defaultdict(list)
        for record in self:
            groups[record.api].append(record)
        for api in sorted(groups):
            yield api, _recording_order(groups[api])

    def change_token(self) -> Hashable | None:
        """A value that stays the same only while nobody (in any process) has changed the store.

        What a reader keeps in memory (a kept hit) is served again only while this is unchanged.
        ``None``: the backend cannot tell, so nothing may be kept on its word (the default).
        """
        return None

    def claim_occurrence(self, run: str, digest: str) -> int:
        """The occurrence number of this identical model request in ``run`` (1 for the first; see
        :func:`.rules.claim_occurrence`), counted with every process and host using the store.

        A backend shared by processes overrides :meth:`_occurrence`.
        """
        return self._occurrence(run, digest, rules.claim_occurrence)

    def release_occurrence(self, run: str, digest: str, number: int) -> None:
        """Give ``number`` back: its request got no answer, so the next identical one takes it."""
        self._occurrence(run, digest, rules.releasing(number))

    def claim_occurrence_now(self, run: str, digest: str) -> int | None:
        """:meth:`claim_occurrence` when it can be done at once, without waiting for anything (for the server's event
        loop); ``None`` when it cannot, and nothing was done: call :meth:`claim_occurrence` in a worker thread."""
        return self._occurrence_now(run, digest, rules.claim_occurrence)

    def release_occurrence_now(self, run: str, digest: str, number: int) -> bool:
        """:meth:`release_occurrence` when it can be done at once; ``False`` when it cannot (nothing done)."""
        return self._occurrence_now(run, digest, rules.releasing(number)) is not None

    def _occurrence(self, run: str, digest: str, decide: rules.Decide) -> int:
        """One counter's read, decision and write, atomic with every process counting with this store.

        The default counts in this process only (a store no other process opens)."""
        held, lock = self._occurrences
        with lock:
            number, after = decide(held.get((run, digest), rules.Occurrences()))
            if after.at_start:
                held.pop((run, digest), None)
            else:
                held[run, digest] = after
            return number

    def _occurrence_now(self, run: str, digest: str, decide: rules.Decide) -> int | None:
        """:meth:`_occurrence` when it can be done without waiting; ``None`` (nothing done) when it cannot.

        The default never can (a backend whose counters are local and never wait overrides it)."""
        return None

    @functools.cached_property
    def _occurrences(self) -> tuple[dict[tuple[str, str], rules.Occurrences], threading.Lock]:
        """The default's counters in this process's memory, and their lock."""
        return {}, threading.Lock()

    def hold_private_run(self, run: str) -> str | None:
        """Mark this process as the one that records model calls into this store in a run nobody named
        (``run``), for as long as the store is open; ``None`` when it now is, else who already is (a
        process of the same host: two such servers would each count identical requests from 1).

        The default holds nothing (a store no other process opens).
        """
        return None

    def release_private_run(self) -> None:  # noqa: B027 - the default holds nothing
        """Stop holding what :meth:`hold_private_run` took (closing the store does it too)."""

    def flight_lock(self, api: str, canonical: str) -> AbstractContextManager[None]:
        """A lock held while one miss is filled, shared with other processes (and hosts) using the store.

        While one holder asks the real API or the simulator, others wait, then find the
        recorded answer.  It is an optimisation only: the add-if-absent write is what keeps
        one answer per key.  Locks expire, so a holder that dies cannot block others for good.
        The default is no lock (single flight within one process only).
        """
        return contextlib.nullcontext()

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Record]:
        """Every record, in no particular order."""

    def __len__(self) -> int:
        """The number of records: the counters' when the backend keeps them (:meth:`counts`), else counted."""
        counts = self.counts()
        return counts.entries if counts is not None else self._count_records()

    def _count_records(self) -> int:
        """The number of records, counted without counters (a backend that keeps none overrides :meth:`__len__`)."""
        raise NotImplementedError

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
