"""Cache tiers: the writable :class:`Store` (diskcache, Redis) and read-only frozen trees."""

from .base import CacheTier, Store, StoreCounts, StoreError
from .diskcache_store import DiskcacheStore
from .frozen import FrozenCache

__all__ = ["CacheTier", "Store", "StoreCounts", "StoreError", "DiskcacheStore", "FrozenCache"]
