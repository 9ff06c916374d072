"""The order the cache tiers are read in (the "Cache keys" order of docs/cache-keys.md) and the key a call
is read with in each: :func:`lookup_order`'s steps, which :class:`.layer.MirrorLayer` walks for every lookup.

A call inside a session (``X-STM-Session``, an MCP session) is keyed with the session's history hash,
which no frozen StableToolBench cache has: it is read with its session keys first, then, in the frozen
caches only, with the keys StableToolBench's client gives the same call (its ``sessionless`` keys).
So an MCP client in a session answers from a frozen cache as a sessionless one does, and the answers
it records still carry the history (a replay of the same trajectory hits them).  The writable store
is never read with sessionless keys for a session's call: its records of sessionless calls were made
without the session's history (a simulator's answer for another state), while a frozen cache holds
upstream's answers, which no state conditions.  Local tools (API-Bank's included) never reach a lookup:
they run with the session's own state.
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
    are looked up as upstream looks them up, the writable store never (see :mod:`.keys`).  Last, a
    session's call is read in the frozen tiers with its sessionless keys, in the same order (see the
    module's text).  Each step is ``(get, aget, key_of)``: the tier's sync and async reads, and the
    key a call is read with there (``None``: skip the step).
    """
    for tier in tiers:
        yield tier.get, _own_async(tier, "aget"), _record_key
    for tier in tiers:
        if not isinstance(tier, Store):
            yield tier.get, _own_async(tier, "aget"), _upstream_key_if_other
    for tier in tiers:
        yield tier.get_canonical, _own_async(tier, "aget_canonical"), _canonical_key
    # a session's call, then, in the frozen caches: as StableToolBench's client keys it (see the module's text)
    frozen = [tier for tier in tiers if not isinstance(tier, Store)]
    for tier in frozen:
        yield tier.get, _own_async(tier, "aget"), _sessionless_key
    for tier in frozen:
        yield tier.get, _own_async(tier, "aget"), _sessionless_upstream_key_if_other
    for tier in frozen:
        yield tier.get_canonical, _own_async(tier, "aget_canonical"), _sessionless_canonical_key


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


def _sessionless_key(call: ToolCall) -> str | None:
    return None if call.sessionless is None else call.sessionless.key


def _sessionless_upstream_key_if_other(call: ToolCall) -> str | None:
    return None if call.sessionless is None else _upstream_key_if_other(call.sessionless)


def _sessionless_canonical_key(call: ToolCall) -> str | None:
    return None if call.sessionless is None else call.sessionless.canonical
