"""The functions StableToolBench's agent is offered, built exactly as its client builds them.

StableToolBench's environment (``toolbench/inference/Downstream_tasks/rapidapi.py``,
``rapidapi_wrapper``) turns a query's ``api_list`` into OpenAI ``tools`` entries in three steps,
reproduced here rule for rule (the test ``tests/integration/test_functions_export.py`` compares
the result with upstream's own code for all 765 solvable queries):

1. **Which tool docs** (``get_white_list`` / ``contain``): every ``<Category>/<stem>.json`` of the
   tools folder is indexed by ``standardize(tool_name)`` (one index for all categories: a later
   category's file replaces an earlier one's; files are read in sorted order here).  A query whose
   tools are not all indexed is skipped by upstream's task list: :func:`query_functions` returns
   ``None`` for it.
2. **Which APIs** (``fetch_api_json``): for each ``api_list`` entry the doc
   ``<tools>/<category_name>/<standardize(tool_name)>.json`` is read and its first API whose
   ``change_name(standardize(name))`` equals the entry's is taken, with the doc's own name,
   description and parameters.  An entry without a match is left out (and then the standard tool
   names are looked up again for the APIs that are left, as upstream does).
3. **The schema** (``api_json_to_openai_json``): the name ``<api>_for_<stem>`` cut to its last 64
   characters; the description ``This is the subfunction for tool "<stem>", you can use this tool.``
   followed, for a non-blank doc description, by ``The description of this function is: "<text>"``
   where ``<text>`` is the stripped description with the API's doc name replaced by the function
   name, cut to 256 characters; each parameter under ``change_name(standardize(name))``, typed
   ``NUMBER`` -> ``integer``, ``STRING`` -> ``string``, ``BOOLEAN`` -> ``boolean``, anything else
   ``string``, its description cut to 256 characters and ``example_value`` the doc default when
   ``len(str(default)) != 0`` (so a ``null`` default is shown as ``null``); ``required`` and
   ``optional`` lists that start with ``""``.  Upstream's quirk is kept: optional parameters are
   only shown for an API that has required ones.  ``Finish`` comes last.

:func:`mcp_tool` turns one such function into a clean JSON Schema tool (no ``""`` entries, no
``optional`` key, ``example_value`` as ``examples``).

**Names given to two APIs.**  Upstream's names are not unique (the 64-character cut, one tool stem
in two categories): where one list holds a name for more than one API, every API sharing it is
offered as ``<name cut to its last 56 characters>__<6 hex>`` where the hex digits are the start
of ``sha256("<category>/<stem>/<api>")`` of that API (:func:`unique_names`).  The suffix depends
on the API alone, so the name is the same whatever else is listed beside it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.naming import change_name, standardize
from stabletoolbench_mirror.upstream.queries import FUNCTION_NAME_MAX, function_name, iter_query_files, schema_type
from stabletoolbench_mirror.upstream.tooldocs import doc_text

DESCRIPTION_MAX = 256
CLASH_HEX = 6
#: the last characters of a clashing name kept before ``__<hex>`` (the whole stays within 64)
CLASH_KEEP = FUNCTION_NAME_MAX - 2 - CLASH_HEX

FINISH_FUNCTION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "Finish",
        "description": "If you believe that you have obtained a result that can answer the task, please call this function to provide the final answer. Alternatively, if you recognize that you are unable to proceed with the task in the current state, call this function to restart. Remember: you must ALWAYS call this function at the end of your attempt, and the only part that will be shown to the user is the final answer, so it should contain sufficient information.",  # noqa: E501
        "parameters": {
            "type": "object",
            "properties": {
                "return_type": {
                    "type": "string",
                    "enum": ["give_answer", "give_up_and_restart"],
                },
                "final_answer": {
                    "type": "string",
                    "description": "The final answer you want to give the user. You should have this field if \"return_type\"==\"give_answer\"",
                },
            },
            "required": ["return_type"],
        },
    },
}


class ToolsFolderError(ValueError):
    """A tools folder or tool doc that cannot be read where upstream's client needs it."""


@dataclass(frozen=True)
class Target:
    """The API a function name reaches: the names the client puts in its ``/virtual`` payload."""

    category: str
    """The query's ``category_name`` (the category folder)."""
    tool_name: str
    """The standard tool name (the tool doc's file stem)."""
    api_name: str
    """``change_name(standardize(api name))``."""

    def as_json(self) -> dict[str, str]:
        return {"category": self.category, "tool_name": self.tool_name, "api_name": self.api_name}

    def payload(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The ``/virtual`` body upstream's client sends for a call with ``arguments``."""
        return {**self.as_json(), "tool_input": json.dumps(arguments), "strip": "", "toolbench_key": ""}


@dataclass(frozen=True)
class Function:
    """One function as upstream offers it (``schema``: the OpenAI ``tools`` entry) and the API it reaches."""

    schema: dict[str, Any]
    target: Target

    @property
    def name(self) -> str:
        return str(self.schema["function"]["name"])


def _param_prompt(param: dict[str, Any]) -> dict[str, Any]:
    prompt: dict[str, Any] = {
        "type": schema_type(param.get("type")),
        "description": doc_text(param.get("description"))[:DESCRIPTION_MAX],
    }
    default = param.get("default")
    if len(str(default)) != 0:
        prompt["example_value"] = default
    return prompt


def _params(value: Any) -> list[dict[str, Any]]:
    return [p for p in value if isinstance(p, dict) and isinstance(p.get("name"), str)] if isinstance(value, list) else []


def api_json(category: str, api: dict[str, Any]) -> dict[str, Any]:
    """Upstream's ``api_json`` of one ``api_list`` entry of a tool doc (what :func:`openai_function` reads)."""
    return {
        "category_name": category,
        "api_name": api["name"],
        "api_description": api.get("description"),
        "required_parameters": api.get("required_parameters") or [],
        "optional_parameters": api.get("optional_parameters") or [],
    }


def openai_function(api: dict[str, Any], standard_tool_name: str) -> dict[str, Any]:
    """Upstream's ``api_json_to_openai_json``: the ``tools`` entry of one API doc entry.

    ``api`` has upstream's ``api_json`` fields: ``api_name`` (the doc's spelling),
    ``api_description``, ``required_parameters``, ``optional_parameters``.
    """
    name = function_name(api["api_name"], standard_tool_name)
    description = f"This is the subfunction for tool \"{standard_tool_name}\", you can use this tool."
    doc_description = doc_text(api.get("api_description"))
    if doc_description.strip() != "":
        cut = doc_description.strip().replace(api["api_name"], name)[:DESCRIPTION_MAX]
        description += f"The description of this function is: \"{cut}\""
    properties: dict[str, Any] = {}
    required = [""]
    optional = [""]
    required_params = _params(api.get("required_parameters"))
    if required_params:  # upstream shows optional parameters only beside required ones
        for param in required_params:
            key = change_name(standardize(param["name"]))
            properties[key] = _param_prompt(param)
            required.append(key)
        for param in _params(api.get("optional_parameters")):
            key = change_name(standardize(param["name"]))
            properties[key] = _param_prompt(param)
            optional.append(key)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required, "optional": optional},
        },
    }


def finish_function() -> dict[str, Any]:
    """Upstream's ``Finish`` function (a fresh copy)."""
    return copy.deepcopy(FINISH_FUNCTION)


def mcp_tool(function: dict[str, Any]) -> dict[str, Any]:
    """One ``tools`` entry as an MCP tool: ``name``, ``description`` and a clean JSON Schema ``inputSchema``.

    The ``""`` entries and the ``optional`` list are dropped (a name listed twice is listed once)
    and each ``example_value`` becomes ``examples: [value]``.
    """
    fn = function["function"]
    params = fn.get("parameters") or {}
    properties: dict[str, Any] = {}
    for key, prop in (params.get("properties") or {}).items():
        clean = {k: v for k, v in prop.items() if k != "example_value"}
        if "example_value" in prop:
            clean["examples"] = [prop["example_value"]]
        properties[key] = clean
    required = list(dict.fromkeys(n for n in params.get("required") or [] if n))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return {"name": fn["name"], "description": fn.get("description", ""), "inputSchema": schema}


# -- the tools folder, as upstream's client reads it -----------------------------------------------


class UpstreamTools:
    """A tools folder read the way ``rapidapi_wrapper`` reads it (whole files, on first use)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ToolsFolderError(f"{self.root}: the tools folder does not exist (tools_folder / --tools)")
        self._docs: dict[Path, dict[str, Any] | None] = {}
        self._white_list: dict[str, str] | None = None

    def doc(self, category: str, stem: str) -> dict[str, Any] | None:
        """The tool doc ``<root>/<category>/<stem>.json``, or ``None`` when missing or unreadable."""
        path = self.root / category / f"{stem}.json"
        if path not in self._docs:
            doc: dict[str, Any] | None = None
            if ".." not in Path(category).parts and ".." not in Path(stem).parts and path.is_file():
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, ValueError, RecursionError):
                    data = None
                doc = data if isinstance(data, dict) else None
            self._docs[path] = doc
        return self._docs[path]

    def white_list(self) -> dict[str, str]:
        """Upstream's ``get_white_list``: ``standardize(tool_name)`` -> the file stem (the standard tool name)."""
        if self._white_list is None:
            white: dict[str, str] = {}
            for category in sorted(p for p in self.root.iterdir() if p.is_dir()):
                for path in sorted(category.glob("*.json")):
                    doc = self.doc(category.name, path.stem)
                    if doc is not None and isinstance(doc.get("tool_name"), str):
                        white[standardize(doc["tool_name"])] = path.name.split(".")[0]
            self._white_list = white
        return self._white_list

    def fetch_api(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """Upstream's ``fetch_api_json`` for one ``api_list`` entry: its ``api_json``, or ``None`` without a match."""
        category = doc_text(entry.get("category_name"))
        doc = self.doc(category, standardize(doc_text(entry.get("tool_name"))))
        if doc is None:
            return None
        wanted = change_name(standardize(doc_text(entry.get("api_name"))))
        for api in doc.get("api_list") or []:
            if isinstance(api, dict) and isinstance(api.get("name"), str) and change_name(standardize(api["name"])) == wanted:
                return {**api_json(category, api), "tool_name": doc.get("tool_name")}
        return None

    def _stems(self, apis: list[dict[str, Any]]) -> list[str] | None:
        """The white list's tool stem of each API's ``tool_name``; ``None`` when one has none."""
        white = self.white_list()
        stems = [white.get(standardize(doc_text(a.get("tool_name")))) for a in apis]
        found = [stem for stem in stems if stem is not None]
        return found if len(found) == len(stems) else None

    def query_functions(self, query: dict[str, Any]) -> list[Function] | None:
        """The functions of one query, ``Finish`` left out; ``None`` when upstream skips the query."""
        api_list = [a for a in query.get("api_list") or [] if isinstance(a, dict)]
        stems = self._stems(api_list)
        if stems is None:
            return None  # upstream's task list leaves the query out (``contain`` is False)
        fetched = [self.fetch_api(a) for a in api_list]
        apis = [a for a in fetched if a is not None]
        if len(apis) != len(api_list):
            # upstream looks the standard tool names up again for the APIs that were found
            stems = self._stems(apis)
            if stems is None:
                return None
        out = []
        for api, stem in zip(apis, stems):
            schema = openai_function(api, stem)
            out.append(Function(schema, Target(api["category_name"], stem, change_name(standardize(api["api_name"])))))
        return out


def all_functions(tools: Iterable[tuple[str, str, dict[str, Any]]]) -> list[Function]:
    """The function of every API of ``tools`` (``(category folder, stem, doc)``), in their order."""
    out = []
    for category, stem, doc in tools:
        seen: set[str] = set()
        for api in doc.get("api_list") or []:
            if not isinstance(api, dict) or not isinstance(api.get("name"), str):
                continue
            pure = change_name(standardize(api["name"]))
            if pure in seen:  # upstream's lookup takes the first API of a tool with this name
                continue
            seen.add(pure)
            out.append(Function(openai_function(api_json(category, api), stem), Target(category, stem, pure)))
    return out


def clash_name(name: str, target: Target) -> str:
    """The name offered for an API whose upstream name ``name`` another API in the same list has too."""
    digest = hashlib.sha256(f"{target.category}/{target.tool_name}/{target.api_name}".encode()).hexdigest()
    return f"{name[-CLASH_KEEP:]}__{digest[:CLASH_HEX]}"


def unique_names(functions: Sequence[Function]) -> dict[str, Function]:
    """Name -> function, every name unique: a name shared by several APIs becomes :func:`clash_name` for each.

    The same API listed twice is listed once (the first).
    """
    by_name: dict[str, list[Function]] = {}
    for fn in functions:
        group = by_name.setdefault(fn.name, [])
        if all(other.target != fn.target for other in group):
            group.append(fn)
    out: dict[str, Function] = {}
    for name, group in by_name.items():
        if len(group) == 1:
            out[name] = group[0]
        else:
            for fn in group:
                out[clash_name(name, fn.target)] = fn
    return out


# -- query files -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryFunctions:
    group: str
    """The query file's stem (``G1_instruction``)."""
    query_id: str
    functions: list[Function]


def iter_query_functions(paths: Sequence[str | os.PathLike[str]], tools: UpstreamTools) -> Iterator[QueryFunctions | tuple[str, str]]:
    """Each query of the files in ``paths`` with its functions, or ``(group, query_id)`` for one upstream skips."""
    for path, queries in iter_query_files(paths):
        for index, query in enumerate(queries):
            qid = str(query.get("query_id", index))
            functions = tools.query_functions(query)
            yield (path.stem, qid) if functions is None else QueryFunctions(path.stem, qid, functions)


def export_line(item: QueryFunctions, fmt: str) -> dict[str, Any]:
    """One line of ``tools export``: ``group``, ``query_id``, ``functions`` (``Finish`` last) and ``apis``.

    ``apis`` maps each function name to the API it reaches.  ``fmt`` is ``openai`` (upstream's
    entries, exactly) or ``mcp`` (:func:`mcp_tool` of each; names made unique by :func:`unique_names`).
    """
    if fmt == "openai":
        functions = [fn.schema for fn in item.functions] + [finish_function()]
        apis: dict[str, Any] = {}
        for fn in item.functions:
            apis.setdefault(fn.name, fn.target.as_json())
    else:
        named = unique_names(item.functions)
        functions = [{**mcp_tool(fn.schema), "name": name} for name, fn in named.items()] + [mcp_tool(finish_function())]
        apis = {name: fn.target.as_json() for name, fn in named.items()}
    return {"group": item.group, "query_id": item.query_id, "functions": functions, "apis": apis}
