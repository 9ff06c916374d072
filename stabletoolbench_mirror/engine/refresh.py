"""``mode: refresh``: which records are asked again (vcrpy's ``all`` record mode, narrowed by ``refresh``).

In scope, a call whose record is a usable answer goes to the responders again; a usable answer
replaces the record (:meth:`~stabletoolbench_mirror.stores.base.Store.replace`, the previous
provenance kept in ``replaced``), a failure never replaces it (the recorded answer is served).
Out of scope, and for failure records, a call behaves as in ``record`` mode.

A record is refreshed once per run: one written since the scope was made (the server's start,
``warm``'s) is this run's own answer, served as a hit, so ``replaced`` keeps the answer the run
found, never an answer of the same run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stabletoolbench_mirror.config import DAY_S, RefreshConfig
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.core.selection import RecordFilter


@dataclass(frozen=True)
class RefreshScope:
    """The records ``refresh`` names (``refresh.apis``, ``categories``, ``sources``, ``older_than_days``), written in this run
    or not."""

    chosen: RecordFilter = RecordFilter()
    older_than_s: float | None = None
    since: float = field(default_factory=time.time)
    """When this run started: records written since are its own answers, never asked again."""

    @classmethod
    def from_config(cls, config: RefreshConfig) -> RefreshScope:
        older = None if config.older_than_days is None else config.older_than_days * DAY_S
        return cls(RecordFilter(apis=frozenset(config.apis), categories=frozenset(config.categories), sources=frozenset(config.sources)), older)

    def covers(self, record: Record) -> bool:
        """Whether ``record`` (a usable answer) is to be asked again (never one written in this run)."""
        if record.created_at >= self.since or not self.chosen.matches(record):
            return False
        return self.older_than_s is None or record.created_at < time.time() - self.older_than_s
