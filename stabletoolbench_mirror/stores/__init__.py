"""Cache backends: the writable :class:`Store` (diskcache, Redis) and read-only frozen trees."""

from .base import Store, StoreCounts, StoreError
from .diskcache_store import DiskcacheStore
from .frozen import FrozenCache

__all__ = ["Store", "StoreCounts", "StoreError", "DiskcacheStore", "FrozenCache"]
