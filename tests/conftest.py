from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fasteners
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

TIMED = {
    "test_archive_limits.py": "memory", "test_mcp_sessions.py": "memory", "test_memory_bounds.py": "memory",
    "test_model_front_limits.py": "memory",
    "test_fairness.py": "load", "test_overload.py": "load", "test_scale.py": "load",
}
"""Files whose tests measure a server's memory, or its answers under load against time bounds: under pytest-xdist
(setup.cfg's ``--dist loadgroup``) each kind is one group, run one test after another on one worker, so no two
memory tests (no two load tests) run side by side."""


WHOLE = frozenset({
    "test_apibank.py", "test_bulk_paths.py", "test_import_probe.py", "test_prompt_parity.py", "test_real_relay.py", "test_report.py",
    "test_report_bundle.py", "test_reproduce_a_score.py", "test_score.py", "test_upstream_configs.py",
    "test_upstream_pipeline_direct.py", "test_simulator_prompts.py",
})
"""Files with module-scoped fixtures (a tree, a score run, a checkout): each runs whole on one worker, which builds
them once (spread over workers, each would build them, again whenever its next test is another file's)."""


def _xdist_group(item: pytest.Item) -> str | None:
    if item.path.name in TIMED:
        return TIMED[item.path.name]
    return item.path.name if item.path.name in WHOLE else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


ALONE = frozenset({"test_tool_hits_keep_their_latency_beside_large_model_bodies"})
"""Tests comparing a latency with one measured in the same run: no other test of the suite runs beside them."""


@pytest.fixture(autouse=True)
def _alone_or_beside(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under pytest-xdist, a test of ``ALONE`` holds the run's write lock (the other workers wait), every other test a read
    lock; a write lock is waited for holding the gate that every test passes first, so readers never starve it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    run = tmp_path_factory.getbasetemp().parent  # the run's folder, shared by its workers
    turns = fasteners.InterProcessReaderWriterLock(run / "turns.lock")
    alone = getattr(request.node, "originalname", request.node.name) in ALONE
    with fasteners.InterProcessLock(run / "gate.lock"):
        turns.acquire_write_lock() if alone else turns.acquire_read_lock()
    try:
        yield
    finally:
        turns.release_write_lock() if alone else turns.release_read_lock()


README_PORT = 8080
"""The port the README's first command serves on: the suite runs with it taken, as it is while that server runs."""


class _Taken(http.server.BaseHTTPRequestHandler):
    """Answers every request with HTTP 503 naming the guard: a test that talks to the README's port fails at once."""

    def _refuse(self) -> None:
        body = f"port {README_PORT} is held by the test suite (tests/conftest.py): a test must use a free port\n".encode()
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _refuse  # noqa: N815 - the handler's names

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session", autouse=True)
def _readme_port_taken() -> Iterator[None]:
    """127.0.0.1:8080 held by a server for the whole run (when nothing holds it already: the README's server, another
    worker's guard), so a test that needs it free, or talks to it, fails in every run, not only beside a running server."""
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", README_PORT), _Taken)
    except OSError:  # taken already, which is what this guard makes sure of
        yield
        return
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="port-8080-guard", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


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
