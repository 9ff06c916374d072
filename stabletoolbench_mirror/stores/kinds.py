"""The store kinds: one registry (``store.kind`` -> its backend's class) and :class:`StoreSpec`, one store named.

A backend is one module whose :class:`~.base.Store` subclass says what it is: how a spec opens it
(:meth:`~.base.Store.open_spec`, :meth:`~.base.Store.open_sessions`), where it is in words a user may be
shown (:meth:`~.base.Store.where`, credentials never in it), what a spec string naming it looks like
(:meth:`~.base.Store.spec_of`), and its capabilities (``reads_wait``, ``folder``, ``across_processes``).
:data:`.registry.KINDS` names its module.  The settings' validation, ``factory``, the commands and the report ask
these; none of them tests a kind by name.  The backends are imported when first asked for (Redis's
is an optional extra).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stabletoolbench_mirror.stores.base import StoreError
from stabletoolbench_mirror.stores.registry import KINDS as KINDS

if TYPE_CHECKING:
    from stabletoolbench_mirror.config import Settings
    from stabletoolbench_mirror.stores.base import Store
    from stabletoolbench_mirror.stores.sessions import SessionStore


LOCK_TTL_S = 15.0  # the lease of Redis's single-flight lock, renewed while held: a holder that dies blocks the others this long


class StoreSpecError(StoreError, ValueError):
    """A store spec that names no usable backend (unknown kind, a missing extra, a missing setting);
    the message names the setting (``store.kind``, ``store.url``)."""


def backend(kind: str) -> type[Store]:
    """The class of ``kind``'s backend."""
    try:
        target = KINDS[kind]
    except KeyError:
        raise StoreSpecError(f"store.kind: unknown store kind {kind!r} (one of: {', '.join(KINDS)})") from None
    module, _, name = target.partition(":")
    try:
        found: type[Store] = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise StoreSpecError(f"store.kind: {kind!r} needs the {kind} extra (pip install 'stabletoolbench-mirror[{kind}]'): {exc}") from exc
    return found


@dataclass(frozen=True)
class StoreSpec:
    """One store: the settings' ``store`` section (its folder resolved), or a store named on a command line."""

    kind: str = next(iter(KINDS))
    path: str = ""
    """The folder (a local backend) or the name (in memory)."""
    url: str | None = None
    """A server's URL (a network backend)."""
    prefix: str = "stm"
    """The key prefix on a shared server."""
    lock_ttl_s: float = LOCK_TTL_S
    timeout_s: float = 2.0

    @classmethod
    def of(cls, settings: Settings) -> StoreSpec:
        """The configured store (``store.path`` resolved)."""
        cfg = settings.store
        return cls(cfg.kind, settings.resolve(cfg.path), cfg.url, cfg.prefix, timeout_s=cfg.timeout_s)

    @property
    def backend(self) -> type[Store]:
        return backend(self.kind)

    @property
    def where(self) -> str:
        """Where the store is, as the start-up report, ``fidelity`` and ``report`` show it (no credentials)."""
        return self.backend.where(self)

    def open(self, *, read_only: bool = False) -> Store:
        """The record store (``read_only``: an existing one, opened without writing)."""
        return self.backend.open_spec(self, read_only)

    def sessions(self, ttl_s: float) -> SessionStore:
        """The session store kept beside the records."""
        return self.backend.open_sessions(self, ttl_s)

    def aside(self, suffix: str) -> StoreSpec:
        """Another store of the same backend beside this one (the shadow store: ``<path><suffix>``, ``<prefix><suffix>``)."""
        return dataclasses.replace(self, path=self.path.rstrip("/") + suffix, prefix=self.prefix + suffix)

    @classmethod
    def parse(cls, text: str, configured: StoreSpec) -> StoreSpec | None:
        """The store ``text`` names (a diskcache folder holding ``cache.db``, ``redis://HOST:PORT/DB[#prefix=P]``),
        or ``None`` when it names none; what it does not say is ``configured``'s."""
        for kind in KINDS:
            try:
                found = backend(kind).spec_of(text, configured)
            except StoreSpecError:
                continue  # a backend not installed names nothing
            if found is not None:
                return found
        return None
