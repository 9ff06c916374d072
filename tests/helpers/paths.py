"""Where the tests find the repository (whatever folder below ``tests/`` a test file lives in)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (the folder holding ``stabletoolbench_mirror/`` and ``tests/``)."""
