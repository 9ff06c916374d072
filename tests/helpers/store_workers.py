"""Functions run in child processes (``multiprocessing`` spawn) by the store tests."""

from __future__ import annotations

import time
from typing import Any

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import Store
from stabletoolbench_mirror.stores.kinds import StoreSpec


def open_store(spec: dict[str, Any]) -> Store:
    """The store of these ``store`` settings (``kind``, ``path`` or ``url`` and ``prefix``, ``lock_ttl_s``)."""
    return StoreSpec(**spec).open()


def add_many(spec: dict[str, Any], writer: int, keys: int, start_at: float) -> list[int]:
    """Add ``keys`` records (the same keys in every writer, bodies naming the writer); return the won keys."""
    store = open_store(spec)
    while time.time() < start_at:
        time.sleep(0.001)
    won = []
    try:
        for i in range(keys):
            record = Record.from_answer(f"Cat/tool_for_Cat/api{i % 7}", f"{{'i': {i}}}", {"error": "", "response": f"writer {writer}"}, "simulated", f"w{writer}")
            if store.add(record, f"canon-{i}"):
                won.append(i)
    finally:
        store.close()
    return won


def hold_lock_forever(spec: dict[str, Any], api: str, canonical: str, ready: Any) -> None:
    """Take the flight lock, say so, and never let go (the test kills this process)."""
    store = open_store(spec)
    with store.flight_lock(api, canonical):
        ready.set()
        time.sleep(3600)


def claim_occurrences(spec: dict[str, Any], run: str, digest: str, count: int, start_at: float) -> list[int]:
    """Claim ``count`` occurrence numbers of one request (run in several processes at once)."""
    store = open_store(spec)
    while time.time() < start_at:
        time.sleep(0.001)
    try:
        return [store.claim_occurrence(run, digest) for _ in range(count)]
    finally:
        store.close()
