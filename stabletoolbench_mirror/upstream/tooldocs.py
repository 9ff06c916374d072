"""Tool docs: a ToolBench/StableToolBench tools folder, looked up by standardised names.

The folder holds one JSON file per tool, ``<Category>/<tool>.json``, with
``tool_name``, ``tool_description`` and ``api_list[]`` (``name``, ``description``,
``method``, ``url``, ``required_parameters``, ``optional_parameters``, maybe
``template_response``).  The full ToolBench folder has about 16,000 tools, so the
registry only lists file names at first use (one directory scan, no file read) and
parses a tool's file the first time one of its APIs is asked for, keeping a bounded
number of parsed tools in memory.

Lookups use StableToolBench's names (:func:`stabletoolbench_mirror.core.naming.resolve_names`):
the category folder, the standardised tool name (the file's stem) and
``change_name(standardize(api name))``.  A name that is slightly off (an agent's typo, a
different standardisation) falls back to rapidfuzz matching above a configurable score;
every such match is logged.  A missing doc is not an error: :meth:`ToolDocs.find` returns
``None`` and the simulator works from the names alone.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from cachetools import LRUCache
from rapidfuzz import fuzz, process

from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.naming import CallNames, change_name, standardize, standardize_category
from stabletoolbench_mirror.upstream.layout import OutsideTree, check_inside
from stabletoolbench_mirror.upstream.nearby import json_files, nearby, subfolders

if TYPE_CHECKING:
    from stabletoolbench_mirror.config import Settings

log = logging.getLogger(__name__)

MAX_DOC_BYTES = 32 * 1024 * 1024
#: parsed tool docs kept in memory, also bounded by the total size of their files
MAX_LOADED_DOC_BYTES = 64 * 1024 * 1024
MAX_LOADED_TOOLS = 4096
#: resolutions remembered (hits and misses), so fuzzy matching runs once per distinct name;
#: the names are client text, so the table is bounded by their total length too
MAX_REMEMBERED = 50_000
MAX_REMEMBERED_CHARS = 8 * 1024 * 1024
#: where tools given by :meth:`ToolDocs.register` are filed (no file holds them)
REGISTERED_ROOT = Path("<registered>")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Bounded(LRUCache[K, tuple[V, int]], Generic[K, V]):
    """``(value, size)`` pairs, least recently used dropped first, within a count and a total size: each
    pair is charged its size, and at least ``max_size // max_items``, so neither bound is passed."""

    def __init__(self, max_items: int, max_size: int) -> None:
        floor = max_size // max(1, max_items)
        super().__init__(max(1, max_size), getsizeof=lambda pair: max(pair[1], floor))

    def keep(self, key: K, value: V, size: int) -> None:
        """Keep ``value`` under ``key`` unless it alone is over the size bound."""
        if self.getsizeof((value, size)) <= self.maxsize:
            self[key] = (value, size)


@dataclass(frozen=True)
class ApiDoc:
    """One API's documentation, with the tool it belongs to."""

    category: str
    """The category folder the doc was found in (standardised form)."""
    tool_name: str
    """The tool's name as the doc spells it (``tool_name``), or the file stem."""
    tool_description: str
    name: str
    """The API's name as the doc spells it."""
    description: str
    method: str = ""
    url: str = ""
    required_parameters: list[Any] = field(default_factory=list)
    optional_parameters: list[Any] = field(default_factory=list)
    host: str = ""
    """The RapidAPI host: the API entry's ``host``, else the tool's."""
    fuzzy: bool = False
    """Whether a fuzzy match (not the exact standardised names) found this doc."""

    def as_api_entry(self) -> dict[str, Any]:
        """The doc as a ToolBench ``api_list`` entry (what direct RapidAPI calls are built from)."""
        entry: dict[str, Any] = {
            "name": self.name,
            "url": self.url,
            "method": self.method,
            "required_parameters": self.required_parameters,
            "optional_parameters": self.optional_parameters,
        }
        if self.host:
            entry["host"] = self.host
        return entry


@dataclass
class _Tool:
    tool_name: str
    tool_description: str
    apis: dict[str, dict[str, Any]]
    """``change_name(standardize(api name))`` -> the API's entry in ``api_list``."""
    host: str = ""


def doc_text(value: Any) -> str:
    """A tool doc's field as text (``""`` when missing)."""
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _params(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def parse_tool(data: Mapping[str, Any], stem: str) -> _Tool:
    """A tool doc (the JSON object of ``<Category>/<stem>.json``) as the registry keeps it."""
    apis: dict[str, dict[str, Any]] = {}
    for api in data.get("api_list") or []:
        if isinstance(api, dict) and isinstance(api.get("name"), str):
            apis.setdefault(change_name(standardize(api["name"])), api)
    return _Tool(
        tool_name=doc_text(data.get("tool_name")) or stem,
        tool_description=doc_text(data.get("tool_description")),
        apis=apis,
        host=doc_text(data.get("host")),
    )


class ToolDocs:
    """A lazily indexed tools folder (or none: ``root=None``), plus tools registered in memory; safe to share between threads."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None,
        *,
        fuzzy_score: float = 85.0,
        allow_symlinks: bool = False,
    ) -> None:
        self.root = Path(root) if root is not None else None
        self.allow_symlinks = allow_symlinks
        self.fuzzy_score = float(fuzzy_score)
        self._lock = threading.Lock()
        self._index: dict[str, dict[str, Path]] | None = None
        """std category -> std tool stem -> file."""
        self._tool_categories: dict[str, list[str]] = {}
        """std tool stem -> the categories that have it (for a call filed under another category)."""
        self._loaded: _Bounded[Path, _Tool | None] = _Bounded(MAX_LOADED_TOOLS, MAX_LOADED_DOC_BYTES)
        """file -> (parsed tool, file size)."""
        self._resolved: _Bounded[tuple[str, str, str], tuple[Path, str, bool] | None] = _Bounded(MAX_REMEMBERED, MAX_REMEMBERED_CHARS)
        """names -> (what they resolved to, their length)."""
        self._registered: dict[Path, tuple[_Tool, dict[str, Any]]] = {}
        """Tools given by :meth:`register`, by their place in the index (under :data:`REGISTERED_ROOT`)."""

    # -- tools no file holds ------------------------------------------------------------------

    def register(self, category: str, doc: Mapping[str, Any]) -> None:
        """Add a tool's doc (a ToolBench tool object: ``tool_name``, ``tool_description``, ``api_list``)
        that no tools-folder file holds, under ``category``; it is found like a file's (and wins over a
        file of the same names).  For tools that run here (API-Bank), so the simulator, ``tools
        export`` and MCP see them."""
        if not isinstance(doc.get("tool_name"), str) or not doc["tool_name"].strip():
            raise ValueError("a registered tool doc needs a tool_name")
        std = standardize_category(category)
        stem = standardize(doc["tool_name"])
        path = REGISTERED_ROOT / std / f"{stem}.json"
        kept = json.loads(json.dumps(dict(doc)))  # a copy of its own, JSON only
        with self._lock:
            self._registered[path] = (parse_tool(kept, stem), kept)
            if self._index is not None:
                self._add_registered(self._index, std, stem, path)
            self._resolved.clear()

    def _add_registered(self, index: dict[str, dict[str, Path]], std: str, stem: str, path: Path) -> None:
        index.setdefault(std, {})[stem] = path
        categories = self._tool_categories.setdefault(stem, [])
        if std not in categories:
            categories.append(std)

    # -- the index ----------------------------------------------------------------------------

    def _build_index(self) -> dict[str, dict[str, Path]]:
        index = self._build_folder_index() if self.root is not None else {}
        for path in self._registered:
            self._add_registered(index, path.parent.name, path.stem, path)
        return index

    def _build_folder_index(self) -> dict[str, dict[str, Path]]:
        index: dict[str, dict[str, Path]] = {}
        assert self.root is not None
        try:
            categories = sorted(os.scandir(self.root), key=lambda e: e.name)
        except OSError as exc:
            log.warning("tools folder %s cannot be read: %s", self.root, exc)
            return index
        for category in categories:
            if not category.is_dir() or not self._inside(category):
                continue
            tools: dict[str, Path] = {}
            try:
                entries = sorted(os.scandir(category.path), key=lambda e: e.name)
            except OSError as exc:
                log.warning("tools folder %s cannot be read: %s", category.path, exc)
                continue
            for entry in entries:
                if entry.name.endswith(".json") and entry.is_file() and self._inside(entry):
                    tools.setdefault(standardize(entry.name[: -len(".json")]), Path(entry.path))
            std = standardize_category(category.name)
            index.setdefault(std, {}).update(tools)
        for std, tools in index.items():
            for tool in tools:
                self._tool_categories.setdefault(tool, []).append(std)
        log.info("tools folder %s: %d categories, %d tools", self.root, len(index), sum(len(t) for t in index.values()))
        return index

    def _inside(self, entry: os.DirEntry[str]) -> bool:
        """Whether ``entry`` may be used: not a symbolic link out of the folder (unless allowed)."""
        if self.allow_symlinks or not entry.is_symlink() or self.root is None:
            return True
        try:
            check_inside(entry.path, self.root)
        except OutsideTree as exc:
            log.warning("tools folder: refused %s", exc)
            return False
        return True

    def _get_index(self) -> dict[str, dict[str, Path]]:
        index = self._index
        if index is None:
            with self._lock:
                if self._index is None:
                    self._index = self._build_index()
                index = self._index
        return index

    def __len__(self) -> int:
        """The number of tool files."""
        return sum(len(tools) for tools in self._get_index().values())

    def tools(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """Every tool doc: ``(category folder, file stem, the doc as read)``, sorted by category and tool.

        What lists all the tools (the MCP front's ``/mcp`` without queries) enumerates them here;
        the docs given by :meth:`register` (API-Bank's) are among them; a file that cannot be read,
        or is not an object with an ``api_list``, is left out.
        """
        for _std, tools in sorted(self._get_index().items()):
            for _stem, path in sorted(tools.items()):
                with self._lock:
                    registered = self._registered.get(path)
                if registered is not None:
                    yield path.parent.name, path.stem, json.loads(json.dumps(registered[1]))
                    continue
                try:
                    if path.stat().st_size > MAX_DOC_BYTES:
                        continue
                    data = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, ValueError, RecursionError):
                    continue
                if isinstance(data, dict) and isinstance(data.get("api_list"), list):
                    yield path.parent.name, path.stem, data

    # -- loading one tool ---------------------------------------------------------------------

    def _load(self, path: Path) -> _Tool | None:
        with self._lock:
            if path in self._registered:
                return self._registered[path][0]
            loaded = self._loaded.get(path)
            if loaded is not None:
                return loaded[0]
        tool, size = self._read(path)
        with self._lock:
            self._loaded.keep(path, tool, size)
        return tool

    def _read(self, path: Path) -> tuple[_Tool | None, int]:
        """The parsed tool (``None`` when unusable) and the size of its file."""
        try:
            size = path.stat().st_size
            if size > MAX_DOC_BYTES:
                log.warning("tool doc %s is larger than %d bytes; ignored", path, MAX_DOC_BYTES)
                return None, 0
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            log.warning("tool doc %s cannot be read: %s", path, exc)
            return None, 0
        if not isinstance(data, dict):
            log.warning("tool doc %s is not a JSON object; ignored", path)
            return None, 0
        return parse_tool(data, path.stem), size

    # -- lookup -------------------------------------------------------------------------------

    def _fuzzy(self, query: str, choices: Any) -> tuple[str, float] | None:
        if not query or not choices:
            return None
        best = process.extractOne(query, choices, scorer=fuzz.ratio, score_cutoff=self.fuzzy_score)
        if best is None:
            return None
        return best[0], float(best[1])

    def _resolve(self, category: str, tool: str, api: str) -> tuple[Path, str, bool] | None:
        found = self._tool_path(category, tool)
        if found is None:
            return None
        path, fuzzy = found
        loaded = self._load(path)
        if loaded is None:
            return None
        if api in loaded.apis:
            return path, api, fuzzy
        # an agent's function name, ``<api>_for_<standardised tool>``
        suffix = f"_for_{standardize(path.stem)}"
        if api.endswith(suffix) and api[: -len(suffix)] in loaded.apis:
            return path, api[: -len(suffix)], fuzzy
        match = self._fuzzy(api, list(loaded.apis))
        if match is None:
            return None
        log.info("tool doc: api %r matched to %r in %s (score %.1f)", clip(api), match[0], path, match[1])
        return path, match[0], True

    def _tool_path(self, category: str, tool: str) -> tuple[Path, bool] | None:
        """The tool's doc file, and whether a name was matched fuzzily: the category's, else the one category
        that files the tool, else a fuzzy match of the category, then of the tool."""
        index = self._get_index()
        fuzzy = False
        tools = index.get(category)
        path = tools.get(tool) if tools else None
        if path is None:
            # the same tool filed under another category
            others = self._tool_categories.get(tool) or []
            if len(others) == 1:
                path = index[others[0]][tool]
                log.info("tool doc: %s/%s found under category %s", clip(category), clip(tool), others[0])
        if path is None and tools is None:
            match = self._fuzzy(category, list(index))
            if match is not None:
                log.info("tool doc: category %r matched to %r (score %.1f)", clip(category), match[0], match[1])
                tools, fuzzy = index[match[0]], True
                path = tools.get(tool)
        if path is None and tools:
            match = self._fuzzy(tool, list(tools))
            if match is not None:
                log.info("tool doc: tool %r matched to %r in %s (score %.1f)", clip(tool), match[0], clip(category), match[1])
                path, fuzzy = tools[match[0]], True
        return None if path is None else (path, fuzzy)

    def find(self, names: CallNames) -> ApiDoc | None:
        """The doc of the API ``names`` resolve to, or ``None`` when no doc matches."""
        return self.find_by_names(names.category, names.tool, names.api_name)

    def find_by_names(self, category: str, tool: str, api: str) -> ApiDoc | None:
        """Look up by standardised category, tool (without ``_for_...``) and API names."""
        key = (category, tool, api)
        with self._lock:
            remembered = self._resolved.get(key)
        if remembered is not None:
            resolved = remembered[0]
        else:
            resolved = self._resolve(category, tool, api)
            if resolved is None:
                log.info("tool doc: no doc for %s/%s/%s", clip(category), clip(tool), clip(api))
            with self._lock:
                self._resolved.keep(key, resolved, len(category) + len(tool) + len(api))
        if resolved is None:
            return None
        path, api_key, fuzzy = resolved
        loaded = self._load(path)
        if loaded is None or api_key not in loaded.apis:
            return None
        entry = loaded.apis[api_key]
        return ApiDoc(
            category=standardize_category(path.parent.name),
            tool_name=loaded.tool_name,
            tool_description=loaded.tool_description,
            name=entry["name"],
            description=doc_text(entry.get("description")),
            method=doc_text(entry.get("method")),
            url=doc_text(entry.get("url")),
            required_parameters=_params(entry.get("required_parameters")),
            optional_parameters=_params(entry.get("optional_parameters")),
            host=doc_text(entry.get("host")) or loaded.host,
            fuzzy=fuzzy,
        )


def tool_docs_for(settings: Settings) -> ToolDocs | None:
    """The registry over ``settings.tools_folder`` (``None`` when none is configured)."""
    if not settings.tools_folder:
        return None
    return ToolDocs(
        settings.resolve(settings.tools_folder),
        fuzzy_score=settings.simulator.fuzzy_match_score,
        allow_symlinks=settings.allow_symlinks,
    )


# -- the tools folder as a whole ------------------------------------------------------------------


def tools_folder_problem(settings: Settings) -> str | None:
    """Why the configured tools folder gives no tool docs, or ``None`` when it has some."""
    if not settings.tools_folder:
        return "not set"
    return tools_dir_problem(settings.resolve(settings.tools_folder))


def tools_dir_problem(folder: str | os.PathLike[str]) -> str | None:
    """Why ``folder`` is no tools folder (with the folder near it that is one, as for a cache tree), or ``None``."""
    path = Path(folder)
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is not a folder"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{path} cannot be read"
    if has_tool_docs(path):
        return None
    message = f"{path} has no tool docs (<Category>/<tool>.json)"
    near = nearby_tools_folder(path)
    if near is None:
        return message
    where, found = near
    return f"{message}; the folder {where}, {found}, looks like a tools folder: use that path"


def has_tool_docs(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds at least one ``<Category>/<tool>.json``."""
    return any(json_files(category.path) for category in subfolders(path))


def nearby_tools_folder(path: Path) -> tuple[str, Path] | None:
    """A tools folder near ``path`` (:func:`~.nearby.nearby`, one named ``tools`` first): one or two levels below
    (``toolenv/`` given), above (a category folder given), or beside it (the cache tree given):
    ``("below", folder)``, ``("above", folder)`` or ``("beside it", folder)``."""
    def tools_folder(folder: str, budget: list[int]) -> bool:
        # a cache tree's category folder holds <tool_for_Category>/<api>.json: not a tools folder
        listed = list(subfolders(folder))
        budget[0] -= len(listed)
        tools = [e.name for e in listed if json_files(e.path)]
        return bool(tools) and not all(name.endswith(f"_for_{Path(folder).name}") for name in tools)

    return nearby(path, tools_folder, prefer="tools")


