"""Cache tiers: the writable :class:`Store` (diskcache, Redis) and read-only frozen trees."""

from stabletoolbench_mirror.stores.base import CacheTier, Store, StoreCounts, StoreError
from stabletoolbench_mirror.stores.diskcache_store import DiskcacheStore
from stabletoolbench_mirror.stores.frozen import FrozenCache

__all__ = ["CacheTier", "Store", "StoreCounts", "StoreError", "DiskcacheStore", "FrozenCache"]
