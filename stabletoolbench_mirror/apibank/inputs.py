"""An API-Bank call's inputs, typed from the class's ``input_parameters`` as its ToolManager types them.

ToolManager (``tool_manager.py``, ``api_call``) takes each argument by name (an unknown name is an
error), turns ``int`` and ``float`` text into numbers (text that is not one is an error), passes
``str`` as it is and makes ``bool`` ``value == 'True'``.  Its inputs are always text, so beside
its rules this also takes what a JSON ``tool_input`` carries:

* ``int`` / ``float``: a JSON number as it is (an ``int`` of an integral float);
* ``bool``: JSON ``true``/``false`` as they are, and the texts ``True``/``true``/``False``/``false``
  (ToolManager makes a JSON ``true`` ``False``);
* ``list`` / ``list(str)``: a JSON list as it is, and a list written as text, in JSON or as
  Python writes it (``"['John', 'Jane']"``, how API-Bank's dialogues record them), read by
  :func:`read_literal`, which builds only lists, dicts, strings, numbers, booleans and ``None``.

Nothing is evaluated: :func:`read_literal` walks the parsed text's syntax tree and refuses any
other node.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

#: the longest list text :func:`read_literal` reads
MAX_LITERAL_CHARS = 1_000_000
MAX_LITERAL_DEPTH = 64


class InputError(ValueError):
    """An input ToolManager would refuse: its message is ToolManager's own where it has one."""


def _number_text(value: str, kind: str) -> bool:
    return value.isdigit() if kind == "int" else value.replace(".", "", 1).isdigit()


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise InputError(f"invalid parameter type. parameter: {value}")
    if isinstance(value, str):
        if not _number_text(value, "int"):
            raise InputError(f"invalid parameter type. parameter: {value}")
        return int(value)
    if isinstance(value, float) and not value.is_integer():
        raise InputError(f"invalid parameter type. parameter: {value}")
    if isinstance(value, (int, float)):
        return int(value)
    raise InputError(f"invalid parameter type. parameter: {value}")


def _float(value: Any) -> float:
    if isinstance(value, str):
        if not _number_text(value, "float"):
            raise InputError("invalid parameter type.")
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise InputError("invalid parameter type.")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("True", "true", "False", "false"):
        return value in ("True", "true")
    return value == "True"  # ToolManager's rule for anything else


def _list(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return read_literal(text)
            except ValueError:
                return value  # not a list after all: passed on as it is, as ToolManager does
    return value


def type_inputs(inputs: Mapping[str, Any], parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the API's ``call``; :class:`InputError` as ToolManager would fail."""
    typed: dict[str, Any] = {}
    for name, value in inputs.items():
        if name not in parameters:
            raise InputError(f"invalid parameter name. parameter: {name}")
        spec = parameters[name]
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        if kind == "int":
            typed[name] = _int(value)
        elif kind == "float":
            typed[name] = _float(value)
        elif kind == "str":
            typed[name] = value
        elif kind in ("list", "list(str)"):
            typed[name] = _list(value)
        elif kind == "bool":
            typed[name] = _bool(value)
        else:
            raise InputError("invalid parameter type.")
    return typed


def read_literal(text: str) -> Any:
    """A JSON or Python literal of lists, dicts, strings, numbers, booleans and ``None``; ``ValueError`` otherwise."""
    if len(text) > MAX_LITERAL_CHARS:
        raise ValueError(f"a list text over {MAX_LITERAL_CHARS} characters")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not a list: {exc}") from None
    return _literal(tree.body, 0)


_NAMES = {"None": None, "True": True, "False": False, "null": None, "true": True, "false": False}


def _literal(node: ast.AST, depth: int) -> Any:
    if depth > MAX_LITERAL_DEPTH:
        raise ValueError("nested too deeply")
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        return _dict(node, depth)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant):
        number = node.operand.value
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return -number if isinstance(node.op, ast.USub) else number
    raise ValueError(f"not a plain value: {type(node).__name__}")


def _dict(node: ast.Dict, depth: int) -> dict[Any, Any]:
    """:func:`_literal` of a dict display: plain keys only, no ``**``."""
    out: dict[Any, Any] = {}
    for k, v in zip(node.keys, node.values):
        if k is None:
            raise ValueError("'**' in a literal")
        key = _literal(k, depth + 1)
        if not isinstance(key, (str, int, float, bool, type(None))):
            raise ValueError("a dict key that is not a plain value")
        out[key] = _literal(v, depth + 1)
    return out
