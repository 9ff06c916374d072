"""StableToolBench query files: their APIs, the calls an agent makes with the doc defaults, function names.

A query file (``solvable_queries/test_instruction/G1_instruction.json``) is a JSON list of
queries, each with ``query_id`` and an ``api_list`` of API docs (``category_name``,
``tool_name``, ``api_name``, ``required_parameters``, ``optional_parameters``; each
parameter with ``name``, ``type``, ``description`` and ``default``).

**How the StableToolBench client shows an API to the agent** (``api_json_to_openai_json``):
the function is ``<change_name(standardize(api_name))>_for_<standard tool name>`` cut to its
last 64 characters; each parameter is shown as ``change_name(standardize(name))`` with type
``NUMBER`` -> ``integer``, ``STRING`` -> ``string``, ``BOOLEAN`` -> ``boolean`` (exact,
case-sensitive match; every other type, ``string`` and ``ENUM`` included, -> ``string``)
and, when ``len(str(default)) != 0``, the doc default as ``example_value``.

**A default call** is the call an agent makes when it copies every ``example_value`` into its
arguments: the parameters in the order shown (required, then optional), under their
standardised names, with JSON values typed by the schema type as a function-calling model
emits them.  The one typing rule is :func:`typed_default`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.naming import change_name, parameter_name, standardize
from stabletoolbench_mirror.upstream.nearby import json_files, nearby

#: StableToolBench's ``map_type`` (exact keys); anything else is shown as ``string``
CLIENT_TYPE_MAP = {"NUMBER": "integer", "STRING": "string", "BOOLEAN": "boolean"}
FUNCTION_NAME_MAX = 64

_INTEGER = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})


class QueryFileError(ValueError):
    """A query file that cannot be read or is not a list of queries."""


def schema_type(doc_type: Any) -> str:
    """The JSON-schema type the client shows for a doc parameter type."""
    return CLIENT_TYPE_MAP.get(doc_type, "string") if isinstance(doc_type, str) else "string"


def shows_example(default: Any) -> bool:
    """Whether the client shows ``default`` as an ``example_value`` (its own ``len(str(default)) != 0`` test).

    ``None`` is treated as absent too: an agent has no value to copy from ``null``.
    """
    return default is not None and len(str(default)) != 0


def typed_default(doc_type: Any, default: Any) -> Any:
    """The JSON value an agent sends for a parameter whose ``example_value`` is ``default``.

    The rule, by the schema type the client shows (:func:`schema_type`):

    * ``integer`` (doc ``NUMBER``): numbers stay numbers (``5`` -> ``5``, ``40.7`` -> ``40.7``);
      a string holding a JSON-style integer becomes that integer (``"5"`` -> ``5``,
      ``"-3"`` -> ``-3``, ``"007"`` -> ``7``); one holding a decimal or exponent number
      becomes a float (``"7.8"`` -> ``7.8``, ``"1e3"`` -> ``1000.0``); surrounding blanks
      are ignored; anything else (``"abc"``, ``"1,5"``, ``[]``) is sent as given.
    * ``boolean`` (doc ``BOOLEAN``): booleans stay; ``"true"``/``"1"`` -> ``true``,
      ``"false"``/``"0"`` -> ``false`` (case-insensitive, blanks ignored), also the
      numbers ``1``/``0``; anything else is sent as given.
    * ``string`` (every other doc type): strings stay exactly as written (no trimming);
      other values are sent as their JSON text (``5`` -> ``"5"``, ``True`` -> ``"true"``,
      ``[]`` -> ``"[]"``).

    A model asked for an ``integer`` whose example is ``"5"`` emits the JSON number ``5``,
    so the agent's later call arrives as ``{"page": 5}`` and is keyed ``{'page': 5}``.
    """
    kind = schema_type(doc_type)
    if kind == "integer":
        return _as_integer(default)
    if kind == "boolean":
        return _as_boolean(default)
    if isinstance(default, str):
        return default
    try:
        return json.dumps(default, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(default)


def _as_integer(default: Any) -> Any:
    """:func:`typed_default` for an ``integer``: a string holding a number becomes that number."""
    if not isinstance(default, str):
        return default
    text = default.strip()
    if _INTEGER.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        value = float(text)
        return value if math.isfinite(value) else default
    return default


def _as_boolean(default: Any) -> Any:
    """:func:`typed_default` for a ``boolean``: ``1``/``0`` and the strings ``true``/``1``/``false``/``0`` become booleans."""
    if isinstance(default, bool):
        return default
    if isinstance(default, int) and default in (0, 1):
        return bool(default)
    if isinstance(default, str):
        text = default.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return default


def _parameters(api: dict[str, Any], field: str) -> list[dict[str, Any]]:
    params = api.get(field) or []
    if not isinstance(params, list):
        raise ValueError(f"{field} is not a list")
    out = []
    for param in params:
        if not isinstance(param, dict) or not isinstance(param.get("name"), str):
            raise ValueError(f"{field} holds a parameter without a name")
        out.append(param)
    return out


def default_input(api: dict[str, Any], *, include_optional: bool = False) -> dict[str, Any]:
    """The ``tool_input`` of the default call of one API doc (see the module docstring).

    Parameters whose default the client does not show (empty) are left out; a later
    parameter whose standardised name repeats an earlier one replaces it, as in the client.
    """
    fields = ["required_parameters"] + (["optional_parameters"] if include_optional else [])
    tool_input: dict[str, Any] = {}
    for field in fields:
        for param in _parameters(api, field):
            default = param.get("default")
            if shows_example(default):
                tool_input[parameter_name(param["name"])] = typed_default(param.get("type"), default)
    return tool_input


def function_name(api_name: str, standard_tool_name: str) -> str:
    """The function name the agent sees for an API: ``<api>_for_<tool>``, its last 64 characters."""
    return f"{change_name(standardize(api_name))}_for_{standard_tool_name}"[-FUNCTION_NAME_MAX:]


@dataclass(frozen=True)
class ApiRef:
    """One API as the client addresses it in a ``/virtual`` payload."""

    category: str
    tool_name: str
    api_name: str


def api_ref(api: dict[str, Any]) -> ApiRef:
    for field in ("category_name", "tool_name", "api_name"):
        if not isinstance(api.get(field), str) or not api[field]:
            raise ValueError(f"api entry without {field}")
    return ApiRef(api["category_name"], api["tool_name"], api["api_name"])


# -- files -------------------------------------------------------------------------------------


def iter_json_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Every ``*.json`` file named or found (recursively, sorted) under the folders named."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.json") if p.is_file())
        elif path.is_file():
            yield path
        else:
            raise QueryFileError(f"{path}: no such file or folder")


#: the start of a StableToolBench query file: a JSON list whose first query opens with one of its keys
_QUERY_FILE_START = re.compile(r'\s*\[\s*\{\s*"(?:api_list|query|query_id|relevant APIs)"')
#: bytes of a file read to tell a query file (its first query's first key is at its start)
_SNIFF_BYTES = 4096
#: query files looked at per folder when telling a folder of query files
_SNIFF_FILES = 8


def looks_like_query_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts as a StableToolBench query file does (its first few KB only are read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return _QUERY_FILE_START.match(fh.read(_SNIFF_BYTES)) is not None
    except OSError:
        return False


def holds_query_files(folder: str | os.PathLike[str], budget: list[int] | None = None) -> bool:
    """Whether ``folder`` itself holds StableToolBench query files (``solvable_queries/test_instruction``)."""
    files = sorted(json_files(os.fspath(folder)), key=lambda e: e.name)[:_SNIFF_FILES]
    if budget is not None:
        budget[0] -= len(files)
    return any(looks_like_query_file(e.path) for e in files)


def query_folder_hint(given: str | os.PathLike[str]) -> str:
    """For a ``--queries`` path one level off (``solvable_queries/`` for ``solvable_queries/test_instruction``, the
    checkout above it, ``test_query_ids/`` beside it): ``"; the folder below, X, holds StableToolBench query files:
    give that path"`` (the rule of :func:`~.nearby.nearby`), else ``""``."""
    path = Path(given)
    if not path.is_dir():  # a file, or a path that does not exist: look from the nearest folder that does
        path = next((p for p in path.parents if p.is_dir()), Path("."))
        if holds_query_files(path):
            return f"; {path} holds StableToolBench query files: give that path"
    elif holds_query_files(path):
        return ""
    near = nearby(path, holds_query_files, prefer="test_instruction")
    if near is None:
        return ""
    where, folder = near
    return f"; the folder {where}, {folder}, holds StableToolBench query files (<group>.json): give that path"


def iter_query_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """Each query file named or found under the folders named, with its queries, in order.

    :class:`QueryFileError` for a path that does not exist, a file that is no query file, or a folder that holds
    none, with :func:`query_folder_hint`'s hint when the folder meant is near.
    """
    for given in paths:
        found = False
        try:
            for path in iter_json_files([given]):
                found = True
                yield path, load_queries(path)
        except QueryFileError as exc:
            raise QueryFileError(f"{exc}{query_folder_hint(given)}") from None
        if not found:
            raise QueryFileError(f"{given}: no query files (*.json) in it{query_folder_hint(given)}")


def read_json_file(path: str | os.PathLike[str]) -> Any:
    """The value of a JSON file; :class:`QueryFileError` (a ``ValueError``) naming the file when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise QueryFileError(f"{path}: cannot read: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise QueryFileError(f"{path}: not JSON: {exc}") from None


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """``(location, value)`` of each non-blank line of a JSONL file, read line by line.

    ``location`` is ``file:line``; a line that is not JSON gives a :class:`ValueError` as its
    value (the caller decides whether that stops it); a file that cannot be read raises
    :class:`QueryFileError`.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    value: Any = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    value = ValueError(f"not JSON: {exc}")
                yield f"{path}:{number}", value
    except (OSError, UnicodeDecodeError) as exc:
        raise QueryFileError(f"{path}: cannot read: {exc}") from None


def load_queries(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The queries of one query file; :class:`QueryFileError` when it is not a list of query objects."""
    data = read_json_file(path)
    if not isinstance(data, list) or not all(isinstance(q, dict) for q in data):
        raise QueryFileError(f"{path}: not a StableToolBench query file (expected a JSON list of queries)")
    return data


@dataclass(frozen=True)
class DefaultCall:
    call: ToolCall
    location: str
    """``file#query_id/api_name``: where the call came from."""


@dataclass(frozen=True)
class Problem:
    location: str
    message: str


def default_calls(
    paths: Sequence[str | os.PathLike[str]], *, include_optional: bool = False
) -> tuple[list[DefaultCall], list[Problem]]:
    """The default call of every API of every query in ``paths`` (files or folders), in file order.

    Identical calls are kept (the caller deduplicates); API entries that cannot be read are
    returned as problems rather than raised.
    """
    calls: list[DefaultCall] = []
    problems: list[Problem] = []
    for path, queries in iter_query_files(paths):
        for index, query in enumerate(queries):
            qid = query.get("query_id", index)
            api_list = query.get("api_list")
            if not isinstance(api_list, list):
                problems.append(Problem(f"{path}#{qid}", "query without an api_list"))
                continue
            for api in api_list:
                location = f"{path}#{qid}"
                try:
                    if not isinstance(api, dict):
                        raise ValueError("api entry is not an object")
                    ref = api_ref(api)
                    location = f"{path}#{qid}/{ref.api_name}"
                    tool_input = default_input(api, include_optional=include_optional)
                except ValueError as exc:
                    problems.append(Problem(location, str(exc)))
                    continue
                calls.append(DefaultCall(ToolCall.of(ref.category, ref.tool_name, ref.api_name, tool_input), location))
    return calls, problems


# -- function names back to APIs (answer files) ----------------------------------------------------


class FunctionIndex:
    """Maps the function names an agent called back to the APIs, as the client does.

    Built from query files (each query's own ``api_list``, found by ``query_id``) and/or a
    ToolBench tools folder (``<Category>/<standard tool>.json``).  Within a query the client
    takes the first function whose name *ends with* the called name; without the query, a
    name is resolved only when it names exactly one API across everything indexed.
    """

    def __init__(self) -> None:
        self._by_query: dict[str, list[tuple[str, ApiRef]]] = {}
        self._global: dict[str, set[ApiRef]] = {}
        self._standard_tool: dict[tuple[str, str], str] = {}

    def __len__(self) -> int:
        return len(self._global)

    def _standard_tool_name(self, ref: ApiRef) -> str:
        return self._standard_tool.get((ref.category, standardize(ref.tool_name)), standardize(ref.tool_name))

    def client_ref(self, ref: ApiRef) -> ApiRef:
        """The names the client puts in the payload: category, standard tool name, standardised API name."""
        return ApiRef(ref.category, self._standard_tool_name(ref), change_name(standardize(ref.api_name)))

    def add_api(self, ref: ApiRef, query_id: str | None = None) -> None:
        name = function_name(ref.api_name, self._standard_tool_name(ref))
        self._global.setdefault(name, set()).add(self.client_ref(ref))
        if query_id is not None:
            self._by_query.setdefault(query_id, []).append((name, self.client_ref(ref)))

    def add_tools_folder(self, root: str | os.PathLike[str]) -> None:
        base = Path(root)
        if not base.is_dir():
            raise QueryFileError(f"{base}: the tools folder does not exist")
        for category in sorted(p for p in base.iterdir() if p.is_dir()):
            for tool_file in sorted(category.glob("*.json")):
                try:
                    doc = json.loads(tool_file.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if not isinstance(doc, dict) or not isinstance(doc.get("tool_name"), str):
                    continue
                self._standard_tool[(category.name, standardize(doc["tool_name"]))] = tool_file.stem
                for api in doc.get("api_list") or []:
                    if isinstance(api, dict) and isinstance(api.get("name"), str):
                        self.add_api(ApiRef(category.name, doc["tool_name"], api["name"]))

    def add_query_files(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        for _path, queries in iter_query_files(paths):
            for index, query in enumerate(queries):
                qid = str(query.get("query_id", index))
                for api in query.get("api_list") or []:
                    if isinstance(api, dict):
                        try:
                            self.add_api(api_ref(api), qid)
                        except ValueError:
                            continue

    def resolve(self, action: str, query_id: str | None = None) -> tuple[ApiRef | None, str]:
        """The API an agent's call of ``action`` reached, or ``None`` and the reason."""
        if query_id is not None and query_id in self._by_query:
            for name, ref in self._by_query[query_id]:
                if name.endswith(action):
                    return ref, ""
            return None, f"query {query_id} has no function {action!r} (the client answers 'No such function name')"
        refs = self._global.get(action)
        if not refs:
            return None, f"no indexed API has the function name {action!r}"
        if len(refs) > 1:
            listed = ", ".join(sorted(f"{r.category}/{r.tool_name}/{r.api_name}" for r in refs))
            return None, f"function name {action!r} is ambiguous without its query ({listed})"
        return next(iter(refs)), ""
