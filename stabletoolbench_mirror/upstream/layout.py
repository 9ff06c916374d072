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
import logging
import os
import re
from collections.abc import Callable, Iterator
from functools import lru_cache
from json.decoder import scanstring  # type: ignore[attr-defined]  # public since Python 2, not in typeshed
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

from stabletoolbench_mirror.core.files import atomic_write
from stabletoolbench_mirror.core.naming import ApiPath, is_safe_path_component

log = logging.getLogger(__name__)

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SCAN_ONCE = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.load uses

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


@lru_cache(maxsize=1024)  # pure; looked up by every hit on a frozen tree
def api_file_parts(api: str) -> tuple[str, str, str] | None:
    """The folder, subfolder and file name (without ``.json``) of ``api``'s cache file, encoded as needed;
    ``None`` if it cannot have one.  Each is one plain name: a path made of them never leaves its root."""
    path = ApiPath.parse(api)
    if path is None:
        return None
    category, tool, name = (encode_name(p) for p in (path.category, path.tool, path.name))
    if category is None or tool is None or name is None:
        return None
    return category, tool, name


def api_path(root: str | os.PathLike[str], api: str) -> Path | None:
    """The cache file of ``api`` under ``root`` (names encoded as needed); ``None`` if it cannot have one."""
    parts = api_file_parts(api)
    return None if parts is None else Path(root, parts[0], parts[1], parts[2] + ".json")


class OutsideTree(ValueError):
    """A path that leads (through a symbolic link) out of the tree it was found in."""


def check_inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> None:
    """Raise :class:`OutsideTree` when ``path`` resolves (symbolic links followed) outside ``root``."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise OutsideTree(f"{path} is a symbolic link out of {root} (to {real}); set allow_symlinks: true to follow it")


def iter_cache_files(
    root: str | os.PathLike[str], *, allow_symlinks: bool = True, refused: list[str] | None = None
) -> Iterator[tuple[str, Path]]:
    """``(api, path)`` of every API file of an upstream tree, sorted, walked without reading a file.

    With ``allow_symlinks=False`` a folder or file whose real path is outside ``root`` is left
    out with a warning (and its message appended to ``refused`` when given).
    """
    base = Path(root)
    if not base.is_dir():
        return

    def inside(path: Path) -> bool:
        if allow_symlinks or not path.is_symlink():
            return True
        try:
            check_inside(path, base)
        except OutsideTree as exc:
            log.warning("refused: %s", exc)
            if refused is not None:
                refused.append(str(exc))
            return False
        return True

    for category in _sorted_dirs(base):
        if not inside(category):
            continue
        for tool in _sorted_dirs(category):
            if not inside(tool):
                continue
            try:
                names = sorted(e.name for e in os.scandir(tool) if e.name.endswith(".json"))
            except OSError:
                continue
            for name in names:
                api_file = tool / name
                if api_file.is_file() and inside(api_file):
                    yield f"{decode_name(category.name)}/{decode_name(tool.name)}/{decode_name(name[: -len('.json')])}", api_file


def _sorted_dirs(folder: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(folder) if e.is_dir())
    except OSError:
        return []


def iter_cache_spans(
    text: str, path: str | os.PathLike[str] = "<text>", *, bodies: bool = True
) -> Iterator[tuple[str, Any, str, int, int]]:
    """``(key, answer, served body, start, end)`` of each entry of one API file's text, in file order.

    ``text[start:end]`` is the answer's JSON text.  Entries are parsed one at a time (with the same
    C scanner as ``json.load``), so a thread parsing a large file lets others run between entries.
    Raises ``ValueError`` naming the file when the text is not a JSON object, nests too deeply
    (e.g. 100,000 brackets), or holds a key or answer that cannot be served as UTF-8 (a lone
    ``\\ud800`` surrogate escape): such a file is refused as a whole, never served in part.
    Later duplicates of a key win, as with ``json.load``.  With ``bodies=False`` the served body is
    not made (``""``) unless the text holds a surrogate escape that needs checking (faster).
    """
    # a lone surrogate can only come from a \uD8xx-\uDFxx escape (raw UTF-8 cannot carry one)
    check = bodies or _SURROGATE_ESCAPE.search(text) is not None
    # the pattern matches the empty string: ``match`` never returns None here
    ws: Callable[[str, int], re.Match[str]] = _WHITESPACE.match  # type: ignore[assignment]
    end = len(text)
    idx = ws(text, 0).end()
    if text[idx : idx + 1] != "{":
        raise ValueError(f"{path}: not a JSON object of cache entries")
    idx = ws(text, idx + 1).end()
    if text[idx : idx + 1] == "}":
        idx += 1
    else:
        while True:
            key, value, body, start, idx = _entry(text, idx, path, check, ws)
            yield key, value, body, start, idx
            idx = ws(text, idx).end()
            sep = text[idx : idx + 1]
            if sep == ",":
                idx = ws(text, idx + 1).end()
            elif sep == "}":
                idx += 1
                break
            else:
                raise ValueError(f"{path}: expected ',' or '}}' at character {idx}")
    if ws(text, idx).end() != end:
        raise ValueError(f"{path}: extra data after the JSON object at character {idx}")


def _entry(text: str, idx: int, path: str | os.PathLike[str], check: bool,
           ws: Callable[[str, int], re.Match[str]]) -> tuple[str, Any, str, int, int]:
    """:func:`iter_cache_spans`'s entry at ``idx``: its key, answer, served body (``""`` unless ``check``),
    the answer's start and end; ``ValueError`` naming the file when it cannot be read or served."""
    if text[idx : idx + 1] != '"':
        raise ValueError(f"{path}: expected a key at character {idx}")
    try:
        key, idx = scanstring(text, idx + 1, True)
        idx = ws(text, idx).end()
        if text[idx : idx + 1] != ":":
            raise ValueError(f"expected ':' at character {idx}")
        start = idx = ws(text, idx + 1).end()
        value, idx = _SCAN_ONCE(text, idx)
        body = json.dumps(value, ensure_ascii=False, separators=(",", ":")) if check else ""
    except StopIteration as exc:
        raise ValueError(f"{path}: invalid JSON at character {exc.value}") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply near character {idx}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not key.isascii() and not is_utf8_encodable(key):
        raise ValueError(f"{path}: a key contains a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape)")
    if not body.isascii() and not is_utf8_encodable(body):
        raise ValueError(f"{path}: an answer contains a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape)")
    return key, value, body, start, idx


def is_utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_cache_text(path: str | os.PathLike[str]) -> str:
    """The text of one API file (``ValueError`` naming it when it is not UTF-8)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8: {exc}") from None


def iter_cache_entries(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """``(key, answer, served body)`` of one API file; ``ValueError`` as :func:`iter_cache_spans`."""
    for key, value, body, _start, _end in iter_cache_spans(read_cache_text(path), path):
        yield key, value, body


def read_cache_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The entries of one API file; raise ``ValueError`` (naming the file) when it cannot be served.

    See :func:`iter_cache_entries` for what is refused.
    """
    return {key: value for key, value, _body in iter_cache_entries(path)}


def write_cache_file(path: str | os.PathLike[str], entries: dict[str, Any]) -> None:
    """Write one API file atomically (temp file + rename), indented like upstream (4 spaces)."""
    with atomic_write(path) as fh:
        json.dump(entries, fh, indent=4, ensure_ascii=False)
        fh.write("\n")
