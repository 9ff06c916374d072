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

**Input kinds.**  ``str()`` forgets a value's kind: the string ``"{'city': 'Rome'}"`` (the input
``"\"{'city': 'Rome'}\""``) has the very key of the object ``{"city": "Rome"}``, and so do ``"5"``
and ``5``, ``"None"`` and ``null``; a string may even spell a session key.  Upstream looks such
calls up as one, so a client could plant an answer for another call.  In the writable store a
call's *record key* (:func:`record_key`) is therefore its upstream key except for a string
input that reads like another kind's key (or a session key): that one gets
:data:`STRING_MARK` appended, a suffix no other kind's ``str()`` ends with.  Objects (the
inputs agents send), lists, numbers and every other string keep upstream's key exactly, and
frozen upstream trees are looked up with the upstream key as upstream does.  Canonical keys
are JSON and keep kinds apart already.
"""

from __future__ import annotations

import ast
import json
from typing import Any

MAX_LITERAL_KEY_CHARS = 200_000


STRING_MARK = " #input=str"
"""Ends the record key of a string input whose text reads like another kind's key (see :func:`record_key`)."""


def upstream_key(value: Any) -> str:
    """StableToolBench's cache key: ``str()`` of the parsed input."""
    return str(value)


def record_key(value: Any, upstream: str | None = None) -> str:
    """The key a call's record has in the writable store: :func:`upstream_key`, kind-marked when ambiguous.

    A string input that ``str()`` of an object, a list, a number, a boolean or ``None`` could
    spell, or that ends like a session key or like a marked key, gets :data:`STRING_MARK`
    appended; every other input keeps upstream's key.  So a string input never answers an
    object input (nor the reverse), and no input outside a session reaches a session key.
    ``upstream``: ``str(value)`` when the caller has it already.
    """
    key = str(value) if upstream is None else upstream
    return key + STRING_MARK if isinstance(value, str) and _spells_another_kind(key) else key


def _spells_another_kind(text: str) -> bool:
    # ``str()`` of a dict starts with "{", of a list with "[", of a number is a float literal
    # ("5", "-1.5", "1e+100", "inf", "nan"), of a boolean or None its name; being generous
    # here only marks a few more strings
    if text[:1] in ("{", "[") or text in ("True", "False", "None"):
        return True
    if text.endswith(STRING_MARK) or plain_key(text) != text:
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


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
    """Parse an upstream key (a Python literal) back into a value; raise ``ValueError`` if it is not one.

    A kind-marked record key (:func:`record_key`) gives back its string.
    """
    if len(key) > MAX_LITERAL_KEY_CHARS:
        raise ValueError("key too long to parse")
    if key.endswith(STRING_MARK):
        text = key[: -len(STRING_MARK)]
        if _spells_another_kind(text):
            return text
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


# -- sessions ---------------------------------------------------------------------------------
#
# Inside a session (``X-STM-Session``) a call's record keys are its usual keys plus the
# session's *history hash*: a SHA-256 chain over the session's task and every earlier
# (call, answer) pair that was answered from a record or a local tool.  The same task and
# the same earlier calls with the same answers give the same keys (a replay hits); any
# other history gives other keys (an answer made in one state is never served in another).

SESSION_KEY_MARK = " #history="
HISTORY_HASH_CHARS = 32


def history_start(task: str) -> str:
    """The history hash of a session before its first call."""
    return _sha256_hex(json.dumps(["stm-session-v1", task], ensure_ascii=False))


def history_next(previous: str, api: str, canonical: str, body: str) -> str:
    """The history hash after one more call (``canonical`` input) answered with ``body``."""
    return _sha256_hex(json.dumps([previous, api, canonical, body], ensure_ascii=False))


def session_key(key: str, history: str) -> str:
    """A record key inside a session: the usual (upstream or canonical) key plus the history hash."""
    return f"{key}{SESSION_KEY_MARK}{history[:HISTORY_HASH_CHARS]}"


def plain_key(key: str) -> str:
    """``key`` without a session's history suffix (the key as the agent's input gives it)."""
    head, mark, tail = key.rpartition(SESSION_KEY_MARK)
    return head if mark and len(tail) == HISTORY_HASH_CHARS else key


def _sha256_hex(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
