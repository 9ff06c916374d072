"""The registry of store kinds: ``store.kind`` -> its backend's class, named as ``module:Class``.

A module of data that imports nothing, so that the settings (a layer below ``stores``) can check
``store.kind`` against it without importing a backend; :mod:`.kinds` imports the class named when a
store is opened.  Adding a backend is its module and one line here.
"""

KINDS: dict[str, str] = {
    "diskcache": "stabletoolbench_mirror.stores.diskcache_store:DiskcacheStore",
    "redis": "stabletoolbench_mirror.stores.redis_store:RedisStore",
    "memory": "stabletoolbench_mirror.stores.memory_store:MemoryStore",
}
"""Every ``store.kind`` and its backend's class (``module:Class``); the first is the default."""
