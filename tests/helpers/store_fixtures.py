"""``spec`` and ``store``: one fresh store of each backend (diskcache, and Redis when redis-server is there)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.stores import Store
from tests.helpers.redis_server import RedisServer
from tests.helpers.store_workers import open_store


@pytest.fixture(params=["diskcache", pytest.param("redis", marks=pytest.mark.redis)])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """How to open one fresh store (in this process or another)."""
    if request.param == "diskcache":
        return {"kind": "diskcache", "path": str(tmp_path / "store")}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"kind": "redis", "url": server.url, "prefix": request.getfixturevalue("redis_prefix")}


@pytest.fixture
def store(spec: dict[str, Any]) -> Iterator[Store]:
    s = open_store(spec)
    yield s
    s.close()
