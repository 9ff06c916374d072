"""The interfaces of the caches: :class:`CacheTier` (every cache) and :class:`Store` (the writable one)."""

from __future__ import annotations

import abc
import contextlib
from typing import ContextManager, Iterable, Iterator

from ..records import Record


class StoreError(RuntimeError):
    """The store cannot be read or written right now (disk full, read-only, server down)."""


class CacheTier(abc.ABC):
    """One place answers may be found: the writable store or a frozen upstream tree.

    The layer looks a call up in every tier, in the order the README's "Cache keys" section
    gives: the exact upstream key in each tier, then the canonical key in each tier (see
    :meth:`stabletoolbench_mirror.layer.MirrorLayer.lookup`).  Implementations raise
    :class:`StoreError` for backend failures.
    """

    #: a short name for logs, ``/health`` and stats
    kind: str = "tier"
    #: lookups touch only local files (no network): the server may run them on its event loop
    is_local: bool = False

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
        """:meth:`get` for the server's event loop; tiers read over the network override it."""
        return self.get(api, key)

    async def aget_canonical(self, api: str, canonical: str) -> Record | None:
        """:meth:`get_canonical` for the server's event loop; tiers read over the network override it."""
        return self.get_canonical(api, canonical)

    def close(self) -> None:  # noqa: B027 - most tiers hold nothing to release
        """Release the tier's resources."""


class Store(CacheTier):
    """A persistent map from ``(api, upstream key)`` to a :class:`Record`: the writable tier.

    Each record is also findable by its canonical key (see :mod:`stabletoolbench_mirror.keys`).
    Writes are add-if-absent: the first record for a key wins and is never torn or
    overwritten, so concurrent writers (threads, processes, hosts) agree on one answer.
    """

    kind = "store"

    @abc.abstractmethod
    def add(self, record: Record, canonical: str | None) -> bool:
        """Store ``record`` unless its key is present; return whether it was added."""

    def sample(self, api: str, limit: int) -> Iterator[Record]:
        """Up to ``limit`` records of one API; backends may do better than this scan."""
        count = 0
        for record in self:
            if count >= limit:
                return
            if record.api == api:
                count += 1
                yield record

    def flight_lock(self, api: str, canonical: str) -> ContextManager[None]:
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

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of records."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
