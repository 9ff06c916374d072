"""``record.served_store``: a copy of every answer the server serves, whichever tier answered.

The configured store keeps what this server recorded; a run's answers also come from the store's older
records and from the frozen caches (a StableToolBench ``tool_response_cache``, a snapshot).  To replay one
run from its own files alone (``stabletoolbench-mirror score`` snapshots this store into a bundle's
``records/``), every answer served is copied here as it is served: new recordings, hits of the store,
hits of frozen caches (``source: frozen``, the tree named in ``origin``), failure records served, and the
recorded model calls the ``/v1`` front serves.  Add-if-absent, by the store's own rule (a usable answer
replaces a failure record of its key); an answer already held as served is not written again.

A copy that cannot be written is logged and counted (:attr:`ServedCopies.failed`), never an error of the
request: the answer was served all the same, and the run that needs the copies checks the count.
"""

from __future__ import annotations

import logging
import threading

from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores.base import Store, StoreError

log = logging.getLogger(__name__)


class ServedCopies:
    """Copies served records into a store of their own (see the module's docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.failed = 0
        """Copies that could not be written (each logged)."""
        self._lock = threading.Lock()

    def add(self, record: Record, canonical: str | None = None) -> None:
        """Copy ``record`` as served (``canonical``: the call's canonical key, as the store keeps it)."""
        try:
            held = self.store.get(record.api, record.key)
            if held is None or held.body != record.body:
                self.store.add(record, canonical)
        except StoreError as exc:
            with self._lock:
                self.failed += 1
            log.error("record.served_store: the answer served for %s key=%s was not copied: %s", clip(record.api), clip(record.key),
                      clip(exc, 500))

    def close(self) -> None:
        self.store.close()
