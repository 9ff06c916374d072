"""Upstream cache trees and ToolBench tools folders, read from their listings.

The counts shown at start (files, tools, categories, entries of a ``tool_response_cache``
tree; tools and APIs of a tools folder) and the hints when a path is one level off (a cache
tree just below, above or beside it), used by the start-up checks and by ``cache import``.

Everything here reads folder listings and small files; nothing is imported or evaluated.
This is a low "upstream format" module: it imports no command, check or factory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stabletoolbench_mirror.core.model_calls import MODEL_CATEGORY
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME
from stabletoolbench_mirror.upstream.layout import iter_cache_spans
from stabletoolbench_mirror.upstream.nearby import NEAR_SEARCH_BUDGET, json_files, nearby, subfolders

#: the layout of an upstream cache tree, for messages
TREE_LAYOUT = "<Category>/<tool>_for_<Category>/<api>.json"
#: entries of frozen trees are counted (by parsing their files) only up to this many bytes in total
COUNT_ENTRIES_MAX_BYTES = 16 * 1024 * 1024
#: APIs of a tools folder are counted (by parsing the tool docs) only up to this many tool files
COUNT_APIS_MAX_TOOLS = 5000


# -- cache trees -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeCount:
    """What an upstream ``tool_response_cache`` tree holds (from its listing; entries optional)."""

    categories: int = 0
    tools: int = 0
    files: int = 0
    bytes: int = 0
    entries: int | None = None
    """Entries over all files (model calls included), or ``None`` when not counted (a large tree)."""
    unreadable: tuple[str, ...] = ()
    """Files that could not be parsed while counting entries."""
    models: int = 0
    """Models whose recorded calls the tree holds (``@model/<model>/chat_completions.json``: a snapshot's)."""
    model_entries: int | None = None
    """Of :attr:`entries`, the recorded model calls (``None`` when not counted)."""


def _tool_dirs(root: str | os.PathLike[str], follow: bool = False) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """``(category, tool folder)`` of every tool folder laid out as upstream's: ``<tool>_for_<category>``."""
    for category in subfolders(root, follow):
        suffix = f"_for_{category.name}"
        for tool in subfolders(category.path, follow):
            if tool.name.endswith(suffix):
                yield category.name, tool


def _model_dirs(root: str | os.PathLike[str], follow: bool = False) -> Iterator[os.DirEntry[str]]:
    """The folder of every model whose calls a snapshot recorded: ``<root>/@model/<model>/`` (see :mod:`..core.model_calls`)."""
    for category in subfolders(root, follow):
        if category.name == MODEL_CATEGORY:
            yield from subfolders(category.path, follow)


def count_tree(root: str | os.PathLike[str], *, count_entries: bool | None = None, follow_symlinks: bool = False) -> TreeCount:
    """Count a tree's API files from its listing; its entries too when it is small (or when asked).

    A snapshot's recorded model calls (``@model/<model>/chat_completions.json``) are files and entries
    too, counted apart as well (they are no tool's).  Entries are counted with the frozen cache's own
    reader, so a file it would refuse (not a JSON object, nested too deeply, a lone surrogate) is
    listed as unreadable here too.
    """
    categories: set[str] = set()
    tools = models = size = 0
    paths: list[tuple[str, bool]] = []
    folders = [(category, tool, False) for category, tool in _tool_dirs(root, follow_symlinks)]
    folders += [(MODEL_CATEGORY, model, True) for model in _model_dirs(root, follow_symlinks)]
    for category, folder, is_model in folders:
        api_files = json_files(folder.path, follow_symlinks)
        if not api_files:
            continue
        if is_model:
            models += 1
        else:
            categories.add(category)
            tools += 1
        for entry in api_files:
            try:
                size += entry.stat(follow_symlinks=follow_symlinks).st_size
            except OSError:
                pass
            paths.append((entry.path, is_model))
    if count_entries is None:
        count_entries = size <= COUNT_ENTRIES_MAX_BYTES
    entries: int | None = None
    model_entries: int | None = None
    unreadable: list[str] = []
    if count_entries:
        entries = model_entries = 0
        for path, is_model in paths:
            try:
                with open(path, encoding="utf-8") as fh:
                    n = sum(1 for _ in iter_cache_spans(fh.read(), path, bodies=False))
            except (OSError, ValueError, RecursionError, MemoryError):
                unreadable.append(path)
                continue
            entries += n
            model_entries += n if is_model else 0
    return TreeCount(len(categories), tools, len(paths), size, entries, tuple(unreadable), models, model_entries)


def looks_like_tree(path: str | os.PathLike[str], budget: list[int] | None = None, *, follow_symlinks: bool = False) -> bool:
    """Whether ``path`` holds at least one upstream cache file, or a snapshot's recorded model calls
    (``@model/<model>/chat_completions.json``); stops at the first one found."""
    budget = budget if budget is not None else [NEAR_SEARCH_BUDGET]
    for category in subfolders(path, follow_symlinks):
        budget[0] -= 1
        if budget[0] <= 0:
            return False
        suffix = f"_for_{category.name}"
        for tool in subfolders(category.path, follow_symlinks):
            budget[0] -= 1
            if budget[0] <= 0:
                return False
            if (category.name == MODEL_CATEGORY or tool.name.endswith(suffix)) and json_files(tool.path, follow_symlinks):
                return True
    return False


def is_snapshot(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a snapshot's ``manifest.json`` (a JSON object with a ``content_hash``).

    A snapshot is a frozen cache whatever it holds: tool answers, recorded model calls, both, or
    nothing at all (a store that was empty).
    """
    try:
        with open(Path(path, MANIFEST_NAME), "rb") as fh:
            manifest = json.loads(fh.read())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("content_hash"), str)


def nearby_tree(path: str | os.PathLike[str]) -> tuple[str, Path] | None:
    """A folder just below (one or two levels), above (one or two levels) or beside ``path`` that is a cache tree
    (:func:`~.nearby.nearby`, a folder named ``tool_response_cache`` first): ``("below", folder)``, ``("above", folder)``
    or ``("beside it", folder)``, e.g. the tools folder given instead of the cache tree beside it."""
    return nearby(path, lambda folder, budget: looks_like_tree(folder, budget), prefer="tool_response_cache")


def frozen_cache_problem(path: str | os.PathLike[str], *, follow_symlinks: bool = False) -> str | None:
    """Why ``path`` cannot be a frozen cache (with a hint where one is near), or ``None``.

    Used at start for every frozen cache and by ``cache import``.
    """
    p = Path(path)
    if not p.exists():
        # a path relative to the wrong folder: look below the nearest folder that exists
        existing = next((a for a in p.parents if a.is_dir()), None)
        if existing is not None and looks_like_tree(existing):
            return f"{p} does not exist; {existing} above it looks like a tool_response_cache tree: use that path"
        near = nearby_tree(existing) if existing is not None and existing != Path(existing.anchor) else None
        if near is not None and near[0] == "below":
            return f"{p} does not exist; {near[1]} looks like a tool_response_cache tree: use that path"
        return f"{p} does not exist"
    if not p.is_dir():
        return f"{p} is not a folder"
    if looks_like_tree(p, follow_symlinks=follow_symlinks) or is_snapshot(p):
        return None
    message = f"{p} has no cache files ({TREE_LAYOUT})"
    near = nearby_tree(p)
    if near is None:
        return message + ", nor has any folder just below or above it"
    where, folder = near
    return f"{message}; the folder {where}, {folder}, looks like a tool_response_cache tree: use that path"


# -- tools folders ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolsCount:
    categories: int = 0
    tools: int = 0
    apis: int | None = None
    """APIs over all tool docs, or ``None`` when not counted (a large folder)."""
    unreadable: tuple[str, ...] = ()


def count_tools(root: str | os.PathLike[str], *, count_apis: bool | None = None) -> ToolsCount:
    """Count the tool docs of a ToolBench tools folder (``<Category>/<tool>.json``); APIs when small or asked."""
    categories = 0
    paths: list[str] = []
    for category in subfolders(root):
        found = json_files(category.path)
        if found:
            categories += 1
            paths += [e.path for e in found]
    if count_apis is None:
        count_apis = len(paths) <= COUNT_APIS_MAX_TOOLS
    apis: int | None = None
    unreadable: list[str] = []
    if count_apis:
        apis = 0
        for path in paths:
            try:
                with open(path, "rb") as fh:
                    data = json.loads(fh.read())
                api_list = data.get("api_list") if isinstance(data, dict) else None
            except (OSError, ValueError, RecursionError, MemoryError):
                api_list = None
            if not isinstance(api_list, list):
                unreadable.append(path)
                continue
            apis += len(api_list)
    return ToolsCount(categories, len(paths), apis, tuple(unreadable))
