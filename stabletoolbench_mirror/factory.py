"""Build the store and the responders a :class:`Settings` asks for."""

from __future__ import annotations

from .config import ConfigError, Settings
from .responders import Responder
from .stores import DiskcacheStore, FrozenCache, Store
from .tooldocs import tool_docs_for


def build_store(settings: Settings) -> Store:
    cfg = settings.store
    if cfg.kind == "diskcache":
        return DiskcacheStore(settings.resolve(cfg.path))
    if cfg.kind == "redis":
        if not cfg.url:
            raise ConfigError("store.url: required when store.kind is 'redis'")
        try:
            from .stores.redis_store import RedisStore
        except ImportError as exc:  # the redis extra is missing
            raise ConfigError(f"store.kind: 'redis' needs the redis extra (pip install 'stabletoolbench-mirror[redis]'): {exc}") from exc
        return RedisStore(cfg.url, prefix=cfg.prefix, lock_ttl_s=cfg.lock_ttl_s, timeout_s=cfg.timeout_s)
    raise ConfigError(f"store.kind: unknown store kind {cfg.kind!r}")


def build_frozen(settings: Settings) -> list[FrozenCache]:
    """The frozen caches, in their listed order, sharing ``frozen_memory_mb`` between them."""
    paths = settings.frozen_caches
    budget = int(settings.frozen_memory_mb * 1024 * 1024 / max(1, len(paths)))
    return [FrozenCache(settings.resolve(p), memory_budget=budget, allow_symlinks=settings.allow_symlinks) for p in paths]


def build_responders(settings: Settings) -> list[Responder]:
    """The miss chain in order: the real API (when enabled), then the simulator (when enabled)."""
    responders: list[Responder] = []
    docs = tool_docs_for(settings)  # one registry, shared by the real API and the simulator
    if settings.real.enabled:
        from .real import build_real_responder

        real = build_real_responder(settings, docs=docs)
        if settings.real.shadow_simulate:
            from .shadow import shadowed

            real = shadowed(real, settings, docs)
        responders.append(real)
    if settings.simulator.enabled:
        from .simulator import build_simulator

        responders.append(build_simulator(settings, docs=docs))
    return responders
