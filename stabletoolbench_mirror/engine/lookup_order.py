"""The order the cache tiers are read in (the "Cache keys" order of docs/cache-keys.md) and the key a call
is read with in each: :func:`lookup_order`'s steps, which :class:`.layer.MirrorLayer` walks for every lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.stores import CacheTier, Store


def lookup_order(tiers: Sequence[CacheTier]) -> Iterator[tuple[Any, Any, KeyOf]]:
    """The "Cache keys" order of docs/cache-keys.md: the exact key in every tier, then the canonical key.

    Tiers come in their order (the store, then the frozen caches as listed).  The exact key is
    the call's record key (:attr:`ToolCall.key`) in every tier, then, for a call whose upstream
    key differs (a kind-marked string input), upstream's own key in the frozen tiers only: they
    are looked up as upstream looks them up, the writable store never (see :mod:`.keys`).  Each
    step is ``(get, aget, key_of)``: the tier's sync and async reads, and the key a call is read
    with there (``None``: skip the step).
    """
    for tier in tiers:
        yield tier.get, _own_async(tier, "aget"), _record_key
    for tier in tiers:
        if not isinstance(tier, Store):
            yield tier.get, _own_async(tier, "aget"), _upstream_key_if_other
    for tier in tiers:
        yield tier.get_canonical, _own_async(tier, "aget_canonical"), _canonical_key


def _own_async(tier: CacheTier, name: str) -> Any:
    """The tier's async read, or ``None`` where it is :class:`CacheTier`'s own (which only calls the sync
    read: :meth:`MirrorLayer.lookup_async` then calls that at once, without a coroutine)."""
    return None if getattr(type(tier), name) is getattr(CacheTier, name) else getattr(tier, name)


KeyOf = Callable[[ToolCall], "str | None"]


def _record_key(call: ToolCall) -> str:
    return call.key


def _upstream_key_if_other(call: ToolCall) -> str | None:
    return call.upstream if call.upstream != call.key else None


def _canonical_key(call: ToolCall) -> str:
    return call.canonical
