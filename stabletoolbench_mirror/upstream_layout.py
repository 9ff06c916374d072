"""StableToolBench's ``tool_response_cache`` folder layout.

``<root>/<Category>/<tool>_for_<Category>/<api>.json``, each file a JSON object from the
upstream key (``str(parsed_input)``) to the answer ``{"error": ..., "response": ...}``.

A name that cannot be one folder or file name as it is (empty, ``.``, ``..``, with ``/``,
``\\``, a control character or a lone surrogate, or one that starts with the marker ``%%``)
is written *encoded*: ``%%`` followed by the name with each of ``%``, ``/``, ``\\``, control
characters and surrogates replaced by ``%XX`` (its UTF-8 bytes, percent-encoded).  Reading
a tree decodes such names, so ``cache export`` / ``snapshot`` followed by ``cache import`` or
a frozen cache gives back the same API names.  Names longer than
:data:`MAX_NAME_BYTES` bytes (encoded) cannot be written at all.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote_to_bytes

from .naming import is_safe_path_component

ENCODED_PREFIX = "%%"
#: the longest folder or file name (without ``.json``) written, in UTF-8 bytes
MAX_NAME_BYTES = 240
_ESCAPED = re.compile(r"[%/\\\x00-\x1f\x7f\ud800-\udfff]")
_NEEDS_ENCODING = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def encode_name(name: str) -> str | None:
    """The folder or file name (without ``.json``) under which ``name`` is written; ``None`` if it is too long."""
    if is_safe_path_component(name) and not name.startswith(ENCODED_PREFIX) and not _NEEDS_ENCODING.search(name):
        return name
    encoded = ENCODED_PREFIX + _ESCAPED.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass")), name)
    return encoded if len(encoded.encode("utf-8")) <= MAX_NAME_BYTES else None


def decode_name(component: str) -> str:
    """The name a folder or file name (without ``.json``) stands for (see :func:`encode_name`)."""
    if not component.startswith(ENCODED_PREFIX):
        return component
    return unquote_to_bytes(component[len(ENCODED_PREFIX) :]).decode("utf-8", "surrogatepass")


def split_namespace(namespace: str) -> tuple[str, str, str] | None:
    """``(category, tool folder, api)``; the category and API never hold a ``/``, a raw tool folder may."""
    category, sep, rest = namespace.partition("/")
    tool, sep2, api = rest.rpartition("/")
    if not (sep and sep2):
        return None
    return category, tool, api


def namespace_path(root: str | os.PathLike[str], namespace: str) -> Path | None:
    """The cache file of ``namespace`` under ``root`` (names encoded as needed); ``None`` if it cannot have one.

    The path never leaves ``root``: every part is one plain folder or file name.
    """
    parts = split_namespace(namespace)
    if parts is None:
        return None
    names = [encode_name(p) for p in parts]
    if any(n is None for n in names):
        return None
    return Path(root, names[0], names[1], names[2] + ".json")  # type: ignore[operator]


def iter_cache_files(root: str | os.PathLike[str]) -> Iterator[tuple[str, Path]]:
    """``(namespace, path)`` of every API file of an upstream tree, sorted."""
    base = Path(root)
    if not base.is_dir():
        return
    for category in sorted(p for p in base.iterdir() if p.is_dir()):
        for tool in sorted(p for p in category.iterdir() if p.is_dir()):
            for api_file in sorted(tool.glob("*.json")):
                if api_file.is_file():
                    yield f"{decode_name(category.name)}/{decode_name(tool.name)}/{decode_name(api_file.stem)}", api_file


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
