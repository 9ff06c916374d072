"""StableToolBench's name standardisation rules, reproduced exactly.

StableToolBench lays out its response cache and maps agent function names back
to tools with three small functions (``standardize``, ``change_name`` and the
category rule).  Every quirk is kept on purpose, because a cache written by the
upstream server must be found by this one:

* ``standardize`` replaces every character outside CJK, ``a-z``, ``A-Z``,
  ``0-9``, ``_`` **and** ``^`` (the upstream character class contains literal
  carets) with ``_``, collapses runs of ``_``, lower-cases, strips ``_`` at both
  ends and prefixes ``get_`` when the result starts with a digit.
* ``change_name`` prefixes ``is_`` to a handful of Python keywords/names.
* categories only have spaces, commas and slashes replaced, followed by a
  *single* ``"__" -> "_"`` replacement pass (so ``___`` becomes ``__``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

_OUTSIDE_NAME_CHARS = re.compile("[^\\u4e00-\\u9fa5^a-zA-Z0-9_]")
_UNDERSCORE_RUNS = re.compile(r"(_)\1+")
_RENAMED = frozenset({"from", "class", "return", "false", "true", "id", "and"})


def standardize(name: str) -> str:
    """Upstream ``standardize()``: the tool/API/parameter name rule."""
    name = _OUTSIDE_NAME_CHARS.sub("_", name)
    name = _UNDERSCORE_RUNS.sub("_", name).lower().strip("_")
    if name and name[0].isdigit():
        name = "get_" + name
    return name


def change_name(name: str) -> str:
    """Upstream ``change_name()``: ``id`` -> ``is_id`` and the like (exact match only)."""
    return "is_" + name if name in _RENAMED else name


def standardize_category(category: str) -> str:
    """Upstream category rule: spaces, commas, slashes to ``_``, one ``__`` -> ``_`` pass."""
    return category.replace(" ", "_").replace(",", "_").replace("/", "_").replace("__", "_")


def parameter_name(name: str) -> str:
    """The name under which StableToolBench shows a doc parameter to the agent."""
    return change_name(standardize(name))


@dataclass(frozen=True)
class CallNames:
    """The names of one call, resolved exactly as StableToolBench's ``/virtual`` server does."""

    category: str
    """Standardised category, e.g. ``Data`` or ``Artificial_Intelligence_Machine_Learning``."""
    tool: str
    """Standardised tool name without the ``_for_<category>`` suffix."""
    tool_folder: str
    """Cache folder of the tool: ``<tool>_for_<category>``."""
    api_name: str
    """Standardised API name (the cache file is ``<api_name>.json``)."""

    @cached_property  # read several times by every request (the names themselves are kept by resolve_names)
    def api(self) -> str:
        """``<category>/<tool_folder>/<api_name>``: the API, named by its upstream cache file minus ``.json``."""
        return f"{self.category}/{self.tool_folder}/{self.api_name}"


@dataclass(frozen=True)
class ApiPath:
    """An API path, ``<category>/<tool>/<api name>``, split under upstream's one rule (:meth:`parse`)."""

    category: str
    tool: str
    """The tool folder (a standardised name) or a raw tool name: the one part that may hold a ``/``."""
    name: str

    @classmethod
    def parse(cls, path: str) -> ApiPath | None:
        """The category ends at the first ``/`` and the API name starts after the last one; the tool is all
        between, ``/`` included (upstream keeps a raw tool folder's name as sent, and a category or API name is
        standardised with no ``/`` left).  ``None`` with fewer than two ``/``."""
        category, sep, rest = path.partition("/")
        tool, sep2, name = rest.rpartition("/")
        return cls(category, tool, name) if sep and sep2 else None

    @property
    def tool_path(self) -> str:
        """``<category>/<tool>``: the path of the tool's folder."""
        return f"{self.category}/{self.tool}"


def category_of(path: str) -> str:
    """The category of an API path (or of a tool's): all before the first ``/``."""
    return path.partition("/")[0]


@lru_cache(maxsize=1024)  # a pure function of three names: a run's calls use a few hundred APIs again and again
def resolve_names(category: str, tool_name: str, api_name: str) -> CallNames:
    """Resolve the raw names of a ``/virtual`` payload like upstream ``prepare_tool_name_and_url``.

    The API name is ``change_name(standardize(api_name))`` cut at ``_for_<raw tool_name>``;
    a tool name that already ends in ``_for_<category>`` is kept as the folder name.
    """
    std_category = standardize_category(category)
    api = change_name(standardize(api_name)).split(f"_for_{tool_name}")[0]
    suffix = f"_for_{std_category}"
    if tool_name.endswith(suffix):
        folder = tool_name
        tool = standardize(tool_name[: -len(suffix)])
    else:
        tool = standardize(tool_name)
        folder = tool + suffix
    return CallNames(category=std_category, tool=tool, tool_folder=folder, api_name=api)


def is_safe_path_component(name: str) -> bool:
    """Whether ``name`` can be used as one file-system path component without escaping its folder."""
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and len(name.encode("utf-8", "surrogatepass")) <= 240
    )
