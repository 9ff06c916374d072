"""The store interface every cache backend implements."""

from __future__ import annotations

import abc
import contextlib
from typing import ContextManager, Iterator

from ..records import Record


class StoreError(RuntimeError):
    """The store cannot be read or written right now (disk full, read-only, server down)."""


class Store(abc.ABC):
    """A persistent map from ``(namespace, upstream key)`` to a :class:`Record`.

    Each record is also findable by its canonical key (see :mod:`stabletoolbench_mirror.keys`).
    Writes are add-if-absent: the first record for a key wins and is never torn or
    overwritten, so concurrent writers (threads, processes, hosts) agree on one answer.
    The one exception is a failure record (:attr:`Record.is_failure`): a usable answer
    replaces it, and a canonical pointer naming a failure is moved to the usable answer,
    so a failure never hides an answer recorded for the same call.  A usable answer is
    never replaced.  Implementations raise :class:`StoreError` for backend failures.
    """

    #: a short name for logs and stats
    kind: str = "store"
    #: lookups touch only local files (no network): the server may run them on its event loop
    is_local: bool = False

    @abc.abstractmethod
    def get(self, namespace: str, key: str) -> Record | None:
        """The record stored under exactly this upstream key."""

    @abc.abstractmethod
    def get_canonical(self, namespace: str, canonical: str) -> Record | None:
        """A record whose input has this canonical key."""

    @abc.abstractmethod
    def add(self, record: Record, canonical: str | None) -> bool:
        """Store ``record`` unless its key holds a record (a failure record is replaced by an answer).

        Return whether ``record`` was written.  ``canonical`` names ``record``'s key unless it
        already names another key holding a usable answer.  Atomic across processes and hosts.
        """

    def sample(self, namespace: str, limit: int) -> Iterator[Record]:
        """Up to ``limit`` records of one namespace (few-shot examples); backends may do better than a scan."""
        count = 0
        for record in self:
            if count >= limit:
                return
            if record.namespace == namespace:
                count += 1
                yield record

    #: the store offers :meth:`aget` / :meth:`aget_canonical`, for the server's event loop (remote stores)
    reads_async: bool = False

    async def aget(self, namespace: str, key: str) -> Record | None:
        """:meth:`get` without blocking an event loop (only when :attr:`reads_async`)."""
        raise NotImplementedError

    async def aget_canonical(self, namespace: str, canonical: str) -> Record | None:
        """:meth:`get_canonical` without blocking an event loop (only when :attr:`reads_async`)."""
        raise NotImplementedError

    def flight_lock(self, namespace: str, canonical: str) -> ContextManager[None]:
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

    def close(self) -> None:  # pragma: no cover - trivial default
        """Release the backend's resources."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
