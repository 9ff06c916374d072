"""Searching written files for text that must not be there (keys, tokens)."""

from __future__ import annotations

from pathlib import Path


def files_containing(folder: Path, needles: tuple[str, ...]) -> list[str]:
    """``"path: needle"`` for every file under ``folder`` that holds one of ``needles``."""
    hits = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path}: {n}" for n in needles if n.encode() in data]
    return hits
