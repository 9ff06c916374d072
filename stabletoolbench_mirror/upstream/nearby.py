"""The one-level-off rule: the folder near a path that is what was meant, for a hint naming it.

The usual mistake with a path to StableToolBench's files is one level off: ``server/`` given for
``server/tool_response_cache``, ``toolenv/`` for ``toolenv/tools``, ``solvable_queries/`` for
``solvable_queries/test_instruction``, or a folder beside the right one.  :func:`nearby` looks,
in this order, one level below the path, two levels below, one and two levels above, then
beside it (its siblings), a folder of the preferred name first at each step, and stops after a
bounded number of folders (a hint must stay cheap).  What makes a folder the one meant is the
caller's test: a cache tree (:mod:`.trees`), a tools folder (:mod:`.tooldocs`), a folder of query
files (:mod:`.queries`).

Also the two folder listings those tests are made of (:func:`subfolders`, :func:`json_files`).
Everything here reads folder listings only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

#: folders a search for a nearby folder may look at (the caller's test may spend more of it)
NEAR_SEARCH_BUDGET = 20_000

Budget = list[int]
"""What is left of a search's budget, spent in place (one item: folders still to look at)."""
IsOne = Callable[[str, Budget], bool]
"""The caller's test of a folder: whether it is the kind of folder meant (it may spend of the budget)."""


def subfolders(path: str | os.PathLike[str], follow: bool = False) -> Iterator[os.DirEntry[str]]:
    """Sub-folders of ``path`` (symlinks followed only when ``follow``), sorted; nothing when it cannot be read."""
    try:
        with os.scandir(path) as it:
            entries = [e for e in it if e.is_dir(follow_symlinks=follow)]
    except OSError:
        return iter(())
    return iter(sorted(entries, key=lambda e: e.name))


def json_files(folder: str, follow: bool = False) -> list[os.DirEntry[str]]:
    """The ``*.json`` files directly in ``folder`` (none when it cannot be read)."""
    try:
        with os.scandir(folder) as it:
            return [e for e in it if e.name.endswith(".json") and e.is_file(follow_symlinks=follow)]
    except OSError:
        return []


def nearby(path: str | os.PathLike[str], is_one: IsOne, *, prefer: str, budget: int = NEAR_SEARCH_BUDGET) -> tuple[str, Path] | None:
    """A folder near ``path`` that ``is_one``: ``("below", folder)``, ``("above", folder)`` or ``("beside it", folder)``.

    Below (one level, then two), above (one level, then two), then beside; at each step a folder named
    ``prefer`` first (``tool_response_cache``, ``tools``, ``test_instruction``).  ``None`` when none is
    found within ``budget`` folders.
    """
    base = Path(path)
    left: Budget = [budget]

    def first(folders: Iterable[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
        return sorted(folders, key=lambda e: e.name != prefer)  # stable: otherwise in the order listed

    def found(folder: str | os.PathLike[str]) -> bool:
        left[0] -= 1
        return left[0] > 0 and is_one(os.fspath(folder), left)

    children = first(subfolders(base))
    for child in children:
        if found(child.path):
            return "below", Path(child.path)
    grandchildren: list[os.DirEntry[str]] = []
    for child in children:
        listed = list(subfolders(child.path))
        left[0] -= len(listed)
        grandchildren += listed
        if left[0] <= 0:
            return None
    for grandchild in first(grandchildren):
        if found(grandchild.path):
            return "below", Path(grandchild.path)
    for parent in (base.parent, base.parent.parent):
        if parent != base and found(parent):
            return "above", parent
    for sibling in first(subfolders(base.parent)):
        if Path(sibling.path) != base and found(sibling.path):
            return "beside it", Path(sibling.path)
    return None
