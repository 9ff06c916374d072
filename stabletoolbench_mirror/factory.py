"""Build what a :class:`Settings` asks for: the store, the frozen caches, the responders and the layer.

:func:`build_layer` is the one place a :class:`~.layer.MirrorLayer` is assembled (the server,
``warm``, ``warm --engine vllm-offline`` and ``check`` all use it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from stabletoolbench_mirror.config import ConfigError, Mode, Settings
from stabletoolbench_mirror.stores import DiskcacheStore, FrozenCache, Store
from stabletoolbench_mirror.stores.kinds import StoreSpec, StoreSpecError

if TYPE_CHECKING:  # the layer's parts are imported by the functions that build them: a command opening a store only
    # (``cache stats``, ``snapshot``) starts without the engine, the simulator's client and the tool docs
    from stabletoolbench_mirror.engine.layer import MirrorLayer
    from stabletoolbench_mirror.engine.local_tools import LocalTools
    from stabletoolbench_mirror.engine.responders import Responder
    from stabletoolbench_mirror.engine.served_copies import ServedCopies
    from stabletoolbench_mirror.engine.sessions import Sessions
    from stabletoolbench_mirror.responders.shadow import ShadowedResponder
    from stabletoolbench_mirror.stores.sessions import SessionStore
    from stabletoolbench_mirror.upstream.tooldocs import ToolDocs

T = TypeVar("T")

def build_store(settings: Settings, *, read_only: bool = False) -> Store:
    """The record store ``store`` describes (``read_only``: an existing one, opened without writing)."""
    return _configured(lambda: StoreSpec.of(settings).open(read_only=read_only))


def _configured(open_it: Callable[[], T]) -> T:
    """What ``open_it`` opens; a store spec naming no usable backend is a :class:`ConfigError` (it names the key)."""
    try:
        return open_it()
    except StoreSpecError as exc:
        raise ConfigError(str(exc)) from exc


def build_frozen(settings: Settings) -> list[FrozenCache]:
    """The frozen caches, in their listed order, sharing ``frozen_memory_mb`` between them."""
    paths = [_frozen_folder(settings, i, p) for i, p in enumerate(settings.frozen_caches)]
    budget = int(settings.frozen_memory_mb * 1024 * 1024 / max(1, len(paths)))
    max_file = int(settings.frozen_max_file_mb * 1024 * 1024)
    return [FrozenCache(p, memory_budget=budget, allow_symlinks=settings.allow_symlinks, max_file_bytes=max_file) for p in paths]


def _frozen_folder(settings: Settings, i: int, configured: str) -> str:
    """A ``frozen_caches`` entry's folder; an archive or URL fetched and checked (see :mod:`.upstream.archives`)."""
    from stabletoolbench_mirror.upstream.archives import ArchiveError, frozen_folder

    try:
        return frozen_folder(settings, configured)
    except ArchiveError as exc:
        raise ConfigError(f"frozen_caches[{i}]: {exc}") from exc


def build_responders(settings: Settings) -> list[Responder]:
    """The miss chain in order: the real API (when enabled), then the simulator (when enabled)."""
    from stabletoolbench_mirror.responders.simulator import build_simulator

    responders: list[Responder] = []
    if not (settings.real.enabled or settings.simulator.enabled):
        return responders
    shared = build_tool_docs(settings)  # one registry, shared by both
    if settings.real.enabled:
        from stabletoolbench_mirror.responders.real import build_real_responder

        real: Responder = build_real_responder(settings, docs=shared)
        if settings.real.shadow_simulate:
            real = _shadowed(real, settings, shared)
        responders.append(real)
    if settings.simulator.enabled:
        responders.append(build_simulator(settings, docs=shared))
    return responders


def build_shadow_store(settings: Settings) -> Store:
    """The shadow store (``real.shadow_simulate``): the main store's settings, moved aside."""
    from stabletoolbench_mirror.responders.shadow import SHADOW_SUFFIX

    return _configured(lambda: StoreSpec.of(settings).aside(SHADOW_SUFFIX).open())


def _shadowed(real: Responder, settings: Settings, docs: ToolDocs | None) -> ShadowedResponder:
    """``real`` with shadow simulations, the simulator built from ``simulator.*`` (enabled or not)."""
    from stabletoolbench_mirror.responders.shadow import ShadowedResponder
    from stabletoolbench_mirror.responders.simulator import build_simulator

    simulator = build_simulator(settings, docs=docs)
    try:
        store = build_shadow_store(settings)
    except BaseException:
        simulator.close()
        raise
    return ShadowedResponder(real, simulator, store)


def build_layer(
    settings: Settings,
    *,
    store: Store | None = None,
    mode: Mode | str | None = None,
    responders: Sequence[Responder] | None = None,
    max_pending_misses: int | None = None,
) -> MirrorLayer:
    """The layer ``settings`` describe; each keyword, when given, replaces what ``settings`` would build.

    ``responders=[]`` gives a layer that answers from the caches only (``check`` in replay mode,
    ``warm``'s look at what is cached already).
    """
    from stabletoolbench_mirror.engine.faults import FaultPlan
    from stabletoolbench_mirror.engine.layer import MirrorLayer
    from stabletoolbench_mirror.engine.refresh import RefreshScope

    owned = store is None
    build_local_tools(settings)  # a local_tools file that cannot be imported stops the start before anything opens
    store = build_store(settings) if store is None else store
    try:
        return MirrorLayer(
            store,
            mode=Mode(mode if mode is not None else settings.mode),
            frozen=build_frozen(settings),
            responders=build_responders(settings) if responders is None else responders,
            save=settings.save,
            retry_failures=settings.record.retry_failures,
            max_pending_misses=max_pending_misses or settings.limits.max_pending_misses,
            pending_timeout_s=settings.limits.queue_timeout_s,
            sessions=build_sessions(settings, store),
            local_tools=build_local_tools(settings),
            faults=FaultPlan.from_config(settings.faults),
            refresh=RefreshScope.from_config(settings.refresh),
            served=build_served_copies(settings),
        )
    except BaseException:
        if owned:
            store.close()
        raise


def build_served_copies(settings: Settings) -> ServedCopies | None:
    """``record.served_store``: the store every served answer is copied into (``None`` when unset)."""
    from stabletoolbench_mirror.engine.served_copies import ServedCopies

    path = settings.record.served_store
    if path is None:
        return None
    return ServedCopies(DiskcacheStore(settings.resolve(path)))


# -- sessions and local tools ---------------------------------------------------------------------


def build_session_store(settings: Settings) -> SessionStore:
    """Where sessions are kept: beside the records (``<store.path>/sessions``, or the same Redis)."""
    return _configured(lambda: StoreSpec.of(settings).sessions(settings.sessions.idle_expiry_s))


def build_sessions(settings: Settings, store: Store) -> Sessions:
    """Sessions kept beside ``store``; the calls of one session are serialised by the store's lock."""
    from stabletoolbench_mirror.engine.sessions import LOCK_NAMESPACE, Sessions

    return Sessions(
        build_session_store(settings),
        lambda session_id: store.flight_lock(LOCK_NAMESPACE, session_id),
        settings.sessions,
        history=settings.simulator.history,
    )


def build_local_tools(settings: Settings) -> LocalTools | None:
    """The local tools of the ``local_tools`` files (only those files are imported) and API-Bank's, or ``None``."""
    if settings.apibank is not None:
        from stabletoolbench_mirror.apibank import build_apibank_tools

        return build_apibank_tools(settings)
    if not settings.local_tools:
        return None
    from stabletoolbench_mirror.engine.local_tools import LocalTools

    return LocalTools.load([settings.resolve(p) for p in settings.local_tools], timeout_s=settings.local_tools_timeout_s)


def build_tool_docs(settings: Settings) -> ToolDocs | None:
    """The tool docs of ``tools_folder`` plus those registered for tools that run here (API-Bank), or ``None``."""
    from stabletoolbench_mirror.upstream.tooldocs import tool_docs_for

    docs = tool_docs_for(settings)
    if settings.apibank is not None:
        from stabletoolbench_mirror.apibank import register_apibank_docs

        docs = register_apibank_docs(settings, docs)
    return docs
