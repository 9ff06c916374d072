"""Turning a simulator's raw text into a ``{"error", "response"}`` answer.

MirrorAPI's output is JSON-like but about half the time not strict JSON: quotes inside
``response`` left unescaped (its own training example does this), text after the object,
code fences, a missing closing brace, the CoT ``mechanism_of_the_api`` field first.  The
parser tries, in order:

1. strict JSON (after removing code fences), also an object followed by other text;
2. a Python dict literal (``ast.literal_eval``, a literal parser: nothing is executed);
3. a tolerant field extractor that finds ``"error"``, ``"response"`` and
   ``"mechanism_of_the_api"`` by their keys and takes each value up to the next key
   (the last value up to the object's closing ``"}``).

The answer keeps only ``error`` and ``response``.  Output with neither (or with both
empty) gives ``None``: the caller serves ``Failed to generate fake response`` and records
nothing.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

FIELDS = ("mechanism_of_the_api", "error", "response")
MAX_PARSE_CHARS = 1_000_000

_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_-]*[ \t]*\r?\n?")
_KEY = re.compile(r'"(mechanism_of_the_api|error|response)"\s*:\s*')
_ESCAPES = frozenset('"\\/bfnrtu')


@dataclass(frozen=True)
class Parsed:
    answer: dict[str, Any] | None
    """``{"error": str, "response": ...}``, or ``None`` when nothing usable was found."""
    method: str
    """``json``, ``literal``, ``tolerant`` or ``failed``."""
    mechanism: str | None = None


def parse_output(text: str) -> Parsed:
    """Parse a simulator's raw output (see the module docs)."""
    if not isinstance(text, str) or not text.strip():
        return Parsed(None, "failed")
    text = text[:MAX_PARSE_CHARS]
    body = strip_fences(text)
    for candidate in (body, text) if body != text else (text,):
        value, rest = _strict(candidate)
        if value is not None and ("error" in value or "response" in value):
            parsed = _finish(value, "json")
            # an empty object followed by more text may be a value cut short by a bare quote
            if parsed.answer is not None or not rest.strip(" \t\r\n`"):
                return parsed
    value = _literal(body)
    if value is not None and ("error" in value or "response" in value):
        parsed = _finish(value, "literal")
        if parsed.answer is not None:
            return parsed
    fields = extract_fields(body)
    if fields:
        return _finish(fields, "tolerant")
    return Parsed(None, "failed")


def _finish(value: dict[str, Any], method: str) -> Parsed:
    if "error" not in value and "response" not in value:
        return Parsed(None, "failed")
    error = value.get("error")
    error = "" if error is None else error if isinstance(error, str) else json.dumps(error, ensure_ascii=False)
    response = value.get("response")
    if response is None:
        response = ""
    if not error and response in ("", [], {}):
        return Parsed(None, "failed")
    mechanism = value.get("mechanism_of_the_api")
    return Parsed({"error": error, "response": response}, method, mechanism if isinstance(mechanism, str) else None)


def strip_fences(text: str) -> str:
    """The text inside a Markdown code fence that opens before the object, else the text.

    The fenced part runs to the last fence (a value may itself hold backticks).
    """
    match = _FENCE.search(text)
    brace = text.find("{")
    if match is None or (0 <= brace < match.start()):
        return text.strip()
    rest = text[match.end() :]
    end = rest.rfind("```")
    return (rest if end < 0 else rest[:end]).strip()


def _strict(text: str) -> tuple[dict[str, Any] | None, str]:
    """The first JSON object in ``text`` and the text after it."""
    start = text.find("{")
    if start < 0:
        return None, ""
    try:
        value, end = json.JSONDecoder(strict=False).raw_decode(text, start)
    except (ValueError, RecursionError):
        return None, ""
    return (value, text[end:]) if isinstance(value, dict) else (None, "")


def _literal(text: str) -> dict[str, Any] | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start or "'" not in text:
        return None
    try:
        value = ast.literal_eval(text[start : end + 1])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def extract_fields(text: str) -> dict[str, Any]:
    """Find the known fields by their keys, tolerating unescaped quotes in the values."""
    found: dict[str, Any] = {}
    pos = 0
    remaining = list(FIELDS)
    while remaining:
        match = _first_key(text, pos, remaining)
        if match is None:
            break
        name = match.group(1)
        remaining.remove(name)
        start = match.end()
        if start < len(text) and text[start] == '"':
            value, pos = _string_value(text, start + 1, remaining)
            if value is None:
                break
            found[name] = value
        else:
            value, pos = _other_value(text, start)
            if value is None:
                break
            found[name] = value
    return found


def _first_key(text: str, pos: int, names: list[str]) -> re.Match[str] | None:
    for match in _KEY.finditer(text, pos):
        if match.group(1) in names:
            return match
    return None


def _boundary(names: list[str]) -> re.Pattern[str]:
    return re.compile(r'"\s*,\s*"(' + "|".join(re.escape(n) for n in names) + r')"\s*:')


def _string_value(text: str, start: int, remaining: list[str]) -> tuple[str | None, int]:
    """A string value starting at ``start`` (after its opening quote) and where to go on."""
    if remaining:
        boundary = _boundary(remaining).search(text, start)
        if boundary is not None:
            return decode_string(text[start : boundary.start()]), boundary.start() + 1
    # the last field: up to the object's closing quote and brace
    tail = text[start:].rstrip()
    closing = re.search(r'"\s*}\s*$', tail)
    if closing is not None:
        end = closing.start()
    elif tail.endswith('"'):
        end = len(tail) - 1  # the closing brace is missing
    else:
        closings = list(re.finditer(r'"\s*}', tail))
        if not closings:
            return None, len(text)  # an unterminated string: truncated output
        end = closings[-1].start()
    return decode_string(tail[:end]), len(text)


def _other_value(text: str, start: int) -> tuple[Any, int]:
    """A non-string JSON value (object, array, number, null) at ``start``; ``None`` if there is none."""
    try:
        return json.JSONDecoder(strict=False).raw_decode(text, start)
    except (ValueError, RecursionError):
        return None, len(text)


def decode_string(raw: str) -> str:
    """The text of a JSON string body that may hold unescaped quotes or bad escapes."""
    try:
        return json.loads(f'"{raw}"', strict=False)
    except ValueError:
        pass
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\":
            nxt = raw[i + 1] if i + 1 < len(raw) else ""
            if nxt in _ESCAPES and nxt:
                if nxt == "u" and not re.fullmatch(r"[0-9a-fA-F]{4}", raw[i + 2 : i + 6]):
                    out.append("\\\\")
                    i += 1
                    continue
                out.append(ch + nxt)
                i += 2
                continue
            out.append("\\\\")
            i += 1
            continue
        out.append('\\"' if ch == '"' else ch)
        i += 1
    try:
        return json.loads('"' + "".join(out) + '"', strict=False)
    except ValueError:
        return raw
