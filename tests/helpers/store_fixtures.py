"""``spec`` and ``store``: one fresh store of each backend (Redis when redis-server is there); ``shared_spec``:
of each backend that other processes share (``Store.across_processes``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.stores import Store
from stabletoolbench_mirror.stores.kinds import KINDS, backend
from tests.helpers.redis_server import RedisServer
from tests.helpers.store_workers import open_store

SERVERS = {"redis": pytest.mark.redis}
"""The backends whose store is on a server a test starts (a fixture of its own in :func:`_fresh_spec`)."""

BACKENDS: list[Any] = [pytest.param(kind, marks=SERVERS[kind]) if kind in SERVERS else kind for kind in KINDS]
"""Every backend of the registry (``stores.registry.KINDS``): the store tests run over each, a backend added there
included (one of a folder or of memory needs nothing here)."""


def _kind(param: Any) -> str:
    return param if isinstance(param, str) else param.values[0]


SHARED_BACKENDS = [p for p in BACKENDS if backend(_kind(p)).across_processes]


def _fresh_spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A fresh store's ``store`` settings (a server's: its URL and a prefix of its own; else a folder or name of its own)."""
    if request.param != "redis":
        return {"kind": request.param, "path": str(tmp_path / "store")}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"kind": "redis", "url": server.url, "prefix": request.getfixturevalue("redis_prefix")}


@pytest.fixture(params=BACKENDS)
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """How to open one fresh store (in this process)."""
    return _fresh_spec(request, tmp_path)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """How to open one fresh store in this process or another."""
    return _fresh_spec(request, tmp_path)


@pytest.fixture
def store(spec: dict[str, Any]) -> Iterator[Store]:
    s = open_store(spec)
    yield s
    s.close()
