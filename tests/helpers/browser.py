"""A real headless browser for tests: Debian's ``chromium`` driven by Playwright's Python package.

``playwright install`` (a download) is not used: the browser is the system's ``/usr/bin/chromium``.
When it or the ``playwright`` package is missing, :func:`require_chromium` skips the test on a
developer machine and fails it in CI (``$CI`` set), where ``.ci/run`` installs both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message + "; .ci/run must install it", pytrace=False)
    pytest.skip(message)


def require_chromium() -> str:
    """The chromium path; skip (locally) or fail (CI) when it or Playwright's package is not installed."""
    path = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if path is None:
        _missing("chromium is not installed (Debian: apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("Playwright's Python package is not installed (pip install -e '.[test]', or pip install playwright)")
    assert path is not None
    return path


@dataclass
class Opened:
    """What a page did in the browser: every request it made, and what ``inspect`` returned."""

    url: str
    requests: list[str] = field(default_factory=list)
    result: Any = None
    screenshot: Path | None = None


def open_page(page_file: Path, inspect: Callable[[Any], Any], *, screenshot: Path | None = None) -> Opened:
    """Open ``page_file`` in headless chromium, record its requests, run ``inspect(page)``, save a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    opened = Opened(page_file.resolve().as_uri())
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("request", lambda request: opened.requests.append(request.url))
            page.goto(opened.url, wait_until="load")
            opened.result = inspect(page)
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
                opened.screenshot = screenshot
        finally:
            browser.close()
    return opened


def drawn_charts(page: Any) -> list[dict[str, Any]]:
    """Every ``svg.chart`` of the page: its id, its bounding box and the bounding boxes of its bars (``rect.bar``)."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('svg.chart')).map(svg => {
            const box = svg.getBoundingClientRect();
            const bars = Array.from(svg.querySelectorAll('rect.bar')).map(r => {
                const b = r.getBoundingClientRect(); return {width: b.width, height: b.height};
            });
            return {id: svg.id, width: box.width, height: box.height, bars: bars};
        })"""
    )


def table_rows(page: Any, table_id: str) -> list[list[str]]:
    """The text of each cell of each body row of ``table#table_id``, as the page shows it."""
    return page.evaluate(
        """(id) => { const t = document.getElementById(id); if (!t) return null;
            return Array.from(t.querySelectorAll('tbody tr')).map(tr => Array.from(tr.cells).map(td => td.innerText.trim())); }""",
        table_id,
    )
