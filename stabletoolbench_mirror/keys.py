"""Cache keys.

StableToolBench keys a cached response by ``str(tool_input)``: the Python ``repr``
of the parsed input dict, e.g. ``"{'q': 'birthday party ideas'}"``.  That key is
sensitive to the order of the keys and to the types of the values.

This project looks an entry up in two steps:

1. the **upstream key**, exactly ``str(parsed_input)``, so that every entry of an
   upstream cache is found exactly as upstream finds it;
2. when that misses, the **canonical key**: the input as compact JSON with object keys
   sorted at every depth (``json.dumps(..., sort_keys=True, separators=(",", ":"),
   ensure_ascii=False)``).  ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` share one
   canonical key; ``{"a": 1}`` and ``{"a": "1"}`` do not (types still matter), nor do
   ``1`` and ``1.0`` or ``1`` and ``true``.

``NaN``, ``Infinity`` and ``-Infinity`` (which ``json.loads``, and so upstream, accepts) are
written as those bare tokens, so ``{"a": NaN}`` and ``{"a": "nan"}`` never share a key:
upstream keys them apart too (``{'a': nan}`` vs ``{'a': 'nan'}``).  A number too large for a
float (``1e999``) is ``Infinity`` in both keys, as it is upstream.

An upstream key read from a cache file is turned back into a value with
``ast.literal_eval`` (a literal parser, never ``eval``) to compute its canonical key.
"""

from __future__ import annotations

import ast
import json
from typing import Any

MAX_LITERAL_KEY_CHARS = 200_000


def upstream_key(value: Any) -> str:
    """StableToolBench's cache key: ``str()`` of the parsed input."""
    return str(value)


def _json_safe(value: Any) -> Any:
    # a Python literal key may hold tuples, sets, bytes or complex numbers: map them onto JSON
    # (non-finite floats stay floats: they are written as bare NaN / Infinity tokens)
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_json_safe(v) for v in value), key=repr)
    if isinstance(value, (bytes, complex)):
        return repr(value)
    return value


def canonical_key(value: Any) -> str:
    """The order-insensitive, type-sensitive key of a parsed input."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return json.dumps(_json_safe(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def value_from_upstream_key(key: str) -> Any:
    """Parse an upstream key (a Python literal) back into a value; raise ``ValueError`` if it is not one."""
    if len(key) > MAX_LITERAL_KEY_CHARS:
        raise ValueError("key too long to parse")
    try:
        return ast.literal_eval(key)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not a Python literal: {exc}") from None


def canonical_from_upstream_key(key: str) -> str | None:
    """The canonical key of an upstream key, or ``None`` when the key is not a Python literal."""
    try:
        return canonical_key(value_from_upstream_key(key))
    except ValueError:
        return None
