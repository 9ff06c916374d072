"""Recent hits, served again while nothing they were looked up in has changed.

A hit's lookup walks the tiers: the store (a kept read, :mod:`..stores.recent_reads`), then each
frozen cache (a ``stat`` of the API's file, its index, the kept answer), then builds the record and
the answer.  For a call answered lately, all of that gives the same answer as long as

* the store's change token is the same (no process wrote to the store since: SQLite's own
  ``data_version``, see :mod:`..stores.recent_reads`), and
* every frozen cache holds the same index of the call's API file (its ``stat`` unchanged: same
  inode, size and modification time, and the index not dropped from memory meanwhile).

Both are read *before* the lookup they vouch for, so a change that lands during it makes the kept
hit stale at once.  Only hits are kept (a miss goes the full way), only when the store gives a
change token (diskcache; not Redis, which keeps its own memory), at most :data:`MAX_HITS` of them (the least recently used
forgotten first), and
only answers of up to :data:`MAX_BODY_CHARS` characters.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from cachetools import LRUCache

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.outcomes import Outcome

MAX_HITS = 4096
MAX_BODY_CHARS = 16384

Token = tuple[Any, ...]


class RecentHits:
    """The answers of recent hits by call, each with the token of what it was looked up in (the event loop's: no lock,
    a cachetools cache is not thread-safe)."""

    __slots__ = ("_store_token", "_frozen", "_hits")

    def __init__(self, store_token: Callable[[], Hashable | None], frozen: Sequence[Any]) -> None:
        """``store_token``: the store's change token (``None``: keep nothing now); ``frozen``: the frozen caches (``state_token``)."""
        self._store_token = store_token
        self._frozen = tuple(f.state_token for f in frozen)
        self._hits: LRUCache[tuple[str, str, str, str], tuple[Token, Outcome]] = LRUCache(MAX_HITS)

    def token(self, api: str) -> Token | None:
        """What a hit of ``api`` now depends on, or ``None`` when nothing can be kept now."""
        store = self._store_token()
        if store is None:
            return None
        return (store, *[state(api) for state in self._frozen])

    def get(self, call: ToolCall, token: Token) -> Outcome | None:
        try:  # one lookup: LRUCache.get looks twice (a hit is the common case here)
            kept = self._hits[(call.api, call.key, call.upstream, call.canonical)]
        except KeyError:
            return None
        return kept[1] if kept[0] == token else None

    def put(self, call: ToolCall, token: Token, outcome: Outcome) -> None:
        if len(outcome.body) > MAX_BODY_CHARS:
            return
        self._hits[(call.api, call.key, call.upstream, call.canonical)] = (token, outcome)
