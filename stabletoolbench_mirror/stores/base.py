"""The store interface every cache backend implements."""

from __future__ import annotations

import abc
from typing import Iterator

from ..records import Record


class StoreError(RuntimeError):
    """The store cannot be read or written right now (disk full, read-only, server down)."""


class Store(abc.ABC):
    """A persistent map from ``(namespace, upstream key)`` to a :class:`Record`.

    Each record is also findable by its canonical key (see :mod:`stabletoolbench_mirror.keys`).
    Writes are add-if-absent: the first record for a key wins and is never torn or
    overwritten, so concurrent writers (threads, processes, hosts) agree on one answer.
    Implementations raise :class:`StoreError` for backend failures.
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
        """Store ``record`` unless its key is present; return whether it was added."""

    def sample(self, namespace: str, limit: int) -> Iterator[Record]:
        """Up to ``limit`` records of one namespace (few-shot examples); backends may do better than a scan."""
        count = 0
        for record in self:
            if count >= limit:
                return
            if record.namespace == namespace:
                count += 1
                yield record

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
