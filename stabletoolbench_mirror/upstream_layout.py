"""StableToolBench's ``tool_response_cache`` folder layout.

``<root>/<Category>/<tool>_for_<Category>/<api>.json``, each file a JSON object from the
upstream key (``str(parsed_input)``) to the answer ``{"error": ..., "response": ...}``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .naming import is_safe_path_component


def api_path(root: str | os.PathLike[str], api: str) -> Path | None:
    """The cache file of ``api`` under ``root``, or ``None`` if a part of it could escape ``root``."""
    parts = api.split("/")
    if len(parts) != 3 or not all(is_safe_path_component(p) for p in parts):
        return None
    return Path(root, parts[0], parts[1], parts[2] + ".json")


def iter_cache_files(root: str | os.PathLike[str]) -> Iterator[tuple[str, Path]]:
    """``(api, path)`` of every API file of an upstream tree, sorted."""
    base = Path(root)
    if not base.is_dir():
        return
    for category in sorted(p for p in base.iterdir() if p.is_dir()):
        for tool in sorted(p for p in category.iterdir() if p.is_dir()):
            for api_file in sorted(tool.glob("*.json")):
                if api_file.is_file():
                    yield f"{category.name}/{tool.name}/{api_file.stem}", api_file


def read_cache_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The entries of one API file; raise ``ValueError`` when it is not a JSON object."""
    with open(path, "r", encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object of cache entries")
    return data


def write_cache_file(path: str | os.PathLike[str], entries: dict[str, Any]) -> None:
    """Write one API file atomically (temp file + rename), indented like upstream (4 spaces)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(entries, fh, indent=4, ensure_ascii=False)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
