"""Which calls may go to the real API: allow and deny lists of categories and tools.

Entries are compared after StableToolBench's standardisation (categories: spaces,
commas, slashes to ``_``; tools: ``standardize``), case-insensitively, so
``"Video/Images"``, ``"Video_Images"`` and the client's spelling all name the same
category.  An empty allow list allows everything; a deny entry always wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.naming import standardize, standardize_category


def _category(name: str) -> str:
    return standardize_category(name.strip()).lower()


def _tool(name: str) -> str:
    return standardize(name.strip())


@dataclass(frozen=True)
class CallPolicy:
    allow_categories: frozenset[str] = frozenset()
    deny_categories: frozenset[str] = frozenset()
    allow_tools: frozenset[str] = frozenset()
    deny_tools: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        allow_categories: Iterable[str] = (),
        deny_categories: Iterable[str] = (),
        allow_tools: Iterable[str] = (),
        deny_tools: Iterable[str] = (),
    ) -> CallPolicy:
        return cls(
            frozenset(map(_category, allow_categories)),
            frozenset(map(_category, deny_categories)),
            frozenset(map(_tool, allow_tools)),
            frozenset(map(_tool, deny_tools)),
        )

    def refusal(self, call: ToolCall) -> str:
        """Why ``call`` may not go to the real API, or ``""`` when it may."""
        category = call.names.category.lower()
        tool = call.names.tool
        if category in self.deny_categories:
            return "category denied by real.deny_categories"
        if tool in self.deny_tools:
            return "tool denied by real.deny_tools"
        if self.allow_categories and category not in self.allow_categories:
            return "category not in real.allow_categories"
        if self.allow_tools and tool not in self.allow_tools:
            return "tool not in real.allow_tools"
        return ""
