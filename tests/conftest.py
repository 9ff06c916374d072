from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from stabletoolbench_mirror.config import Settings, load_settings
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.serving.server import create_app, uvicorn_options
from tests.helpers import paths
from tests.helpers.live import UvicornThread

# CI runs property tests derandomized (reproducible); local runs keep exploring new examples
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

REPO = paths.REPO
REFERENCE = REPO.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``../shared/reference`` (read-only); tests using it skip cleanly when it is absent."""
    if not (REFERENCE / "calls.jsonl").is_file():
        pytest.skip(f"reference data not found at {REFERENCE}")
    return REFERENCE


@pytest.fixture(scope="session")
def reference_calls(reference_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (reference_dir / "calls.jsonl").read_text().splitlines() if line.strip()]


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings with the store under ``tmp_path``; no ``server_config.yml`` or STM_* variable is read."""
    empty = tmp_path / "empty_config.yml"
    empty.write_text("{}\n")
    data: dict[str, Any] = {"store": {"kind": "diskcache", "path": str(tmp_path / "store")}}
    data.update(overrides)
    return load_settings(empty, overrides=data, environ={})


@pytest.fixture
def settings_factory(tmp_path: Path):
    def factory(**overrides: Any) -> Settings:
        return make_settings(tmp_path, **overrides)

    return factory


@pytest.fixture
def serve():
    """Start the mirror app for given settings (or layer) on a real 127.0.0.1 port."""
    started: list[UvicornThread] = []

    def start(settings: Settings, layer: MirrorLayer | None = None) -> UvicornThread:
        server = UvicornThread(create_app(settings, layer), **uvicorn_options(settings)).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)
