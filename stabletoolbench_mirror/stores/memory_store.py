"""The in-memory store (``store.kind: memory``): records and sessions in this process's memory, gone when it exits.

For tests and throwaway runs.  Every instance opened with one ``store.path`` in a process shares one
:class:`_Shelf` (as two connections to one diskcache folder share its records), never another process's.
Each write reads what the shelf holds, asks :mod:`.rules`, and applies the plan under the shelf's lock.
Written by hand: it is a dict and a lock; the libraries that keep records in memory (cachetools,
diskcache's ``memory`` SQLite) would add eviction or SQL that this needs none of.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import rules
from stabletoolbench_mirror.stores.base import Store, StoreCounts, StoreError
from stabletoolbench_mirror.stores.kinds import StoreSpec
from stabletoolbench_mirror.stores.sessions import SessionStore


@dataclass
class _Shelf:
    """One named store's records, canonical pointers, counters, flight locks and sessions."""

    records: defaultdict[str, dict[str, Record]] = field(default_factory=lambda: defaultdict(dict))
    pointers: dict[tuple[str, str], str] = field(default_factory=dict)
    counts: rules.Counts = field(default_factory=Counter)
    lock: threading.RLock = field(default_factory=threading.RLock)
    flights: defaultdict[tuple[str, str], threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock))
    sessions: dict[str, tuple[float, dict[str, Any], list[dict[str, Any]]]] = field(default_factory=dict)
    """Session id -> (expires at, head, calls)."""


_SHELVES: dict[str, _Shelf] = {}
"""Every store's shelf by name (``setdefault``: one shelf per name, whichever thread comes first)."""


class MemoryStore(Store):
    """Records in a :class:`_Shelf` of this process, by name."""

    kind = "memory"
    reads_wait = False
    across_processes = False

    def __init__(self, name: str, *, read_only: bool = False) -> None:
        self.name, self.read_only = name, read_only
        self._shelf = _SHELVES.setdefault(name, _Shelf())

    @classmethod
    def open_spec(cls, spec: StoreSpec, read_only: bool) -> Store:
        return cls(spec.path, read_only=read_only)

    @classmethod
    def open_sessions(cls, spec: StoreSpec, ttl_s: float) -> SessionStore:
        return MemorySessionStore(_SHELVES.setdefault(spec.path, _Shelf()), ttl_s)

    def get(self, api: str, key: str) -> Record | None:
        return self._shelf.records.get(api, {}).get(key)

    def get_canonical(self, api: str, canonical: str) -> Record | None:
        with self._shelf.lock:
            key = self._shelf.pointers.get((api, canonical))
            return None if key is None else self.get(api, key)

    def add(self, record: Record, canonical: str | None) -> bool:
        return self._write(rules.add, record, canonical)

    def replace(self, record: Record, canonical: str | None) -> bool:
        return self._write(rules.replace, record, canonical)

    def _write(self, rule: Any, record: Record, canonical: str | None) -> bool:
        if self.read_only:
            raise StoreError(f"memory store {self.name} was opened read-only")
        shelf = self._shelf
        with shelf.lock:
            target = None if canonical is None else shelf.pointers.get((record.api, canonical))
            pointed = self.get(record.api, target) if rules.needs_target_record(record, canonical, target) and target else None
            plan: rules.Plan = rule(record, canonical, rules.Holding(self.get(record.api, record.key), target, pointed is None or pointed.is_failure))
            if plan.write:
                shelf.records[record.api][record.key] = record
            if plan.point and canonical is not None:
                shelf.pointers[record.api, canonical] = record.key
            shelf.counts.update(plan.counts)
            return plan.write

    def delete(self, api: str, keys: Iterable[str]) -> int:
        shelf = self._shelf
        with shelf.lock:
            held = shelf.records.get(api, {})
            removed = [held.pop(key) for key in dict.fromkeys(keys) if key in held]
            gone = {record.key for record in removed}
            for pointer in [p for p, key in shelf.pointers.items() if p[0] == api and key in gone]:
                del shelf.pointers[pointer]
            if not held:
                shelf.records.pop(api, None)
            shelf.counts.update(rules.delete(removed))
            return len(removed)

    def counts(self) -> StoreCounts:
        with self._shelf.lock:
            held = (record for records in self._shelf.records.values() for record in records.values())
            return StoreCounts.of([*self._shelf.counts.items(), (("apis",), len(self._shelf.records))],
                                  memory_bytes=sum(len(record.key) + len(record.body) for record in held))

    @contextlib.contextmanager
    def flight_lock(self, api: str, canonical: str) -> Iterator[None]:
        with self._shelf.lock:
            lock = self._shelf.flights[api, canonical]
        with lock:
            yield

    def __iter__(self) -> Iterator[Record]:
        with self._shelf.lock:
            held = [record for records in self._shelf.records.values() for record in records.values()]
        return iter(held)


class MemorySessionStore(SessionStore):
    """Sessions on a :class:`_Shelf`: each a head and its calls, expiring ``ttl_s`` after its last write."""

    def __init__(self, shelf: _Shelf, ttl_s: float) -> None:
        super().__init__(ttl_s)
        self._shelf = shelf

    def _raw_head(self, session_id: str) -> dict[str, Any] | None:
        held = self._shelf.sessions.get(session_id)
        return None if held is None or held[0] < time.monotonic() else dict(held[1])

    def load_head(self, session_id: str) -> dict[str, Any] | None:
        return self._raw_head(session_id)

    def calls(self, session_id: str, indexes: Sequence[int]) -> list[dict[str, Any]]:
        held = self._shelf.sessions.get(session_id)
        calls = [] if held is None else held[2]
        return [dict(calls[n]) for n in indexes if 0 <= n < len(calls)]

    def create(self, head: Mapping[str, Any]) -> bool:
        with self._shelf.lock:
            if self._raw_head(head["id"]) is not None:
                return False
            self._shelf.sessions[head["id"]] = (time.monotonic() + self.ttl_s, dict(head), [])
            return True

    def append(self, head: Mapping[str, Any], call: Mapping[str, Any]) -> bool:
        with self._shelf.lock:
            if self._raw_head(head["id"]) is None:
                return False
            calls = self._shelf.sessions[head["id"]][2]
            del calls[int(head["n_calls"]) - 1:]
            calls.append(dict(call))
            self._shelf.sessions[head["id"]] = (time.monotonic() + self.ttl_s, dict(head), calls)
            return True

    def delete(self, session_id: str) -> bool:
        with self._shelf.lock:
            return self._raw_head(session_id) is not None and self._shelf.sessions.pop(session_id) is not None

    def _ids(self) -> list[str]:
        return list(self._shelf.sessions)
