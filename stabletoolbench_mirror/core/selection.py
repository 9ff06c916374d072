"""Which records a selection names, written once: :class:`RecordFilter`, for ``cache ls`` and ``cache delete``
(:mod:`stabletoolbench_mirror.commands.curation`) and the scope of ``mode: refresh``
(:mod:`stabletoolbench_mirror.engine.refresh`); and :func:`api_names`, the APIs a user's text may name."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from stabletoolbench_mirror.core.model_calls import model_of
from stabletoolbench_mirror.core.naming import ApiPath, category_of, resolve_names
from stabletoolbench_mirror.core.records import Record, origin_key


def api_names(text: str) -> set[str]:
    """The API names ``text`` may mean: itself (``Category/tool_for_Category/api``, as ``/stats`` prints
    it), and the standardised name of raw upstream names ``category/tool/api``."""
    names = {text}
    path = ApiPath.parse(text)
    if path is not None and all((path.category, path.tool, path.name)):
        names.add(resolve_names(path.category, path.tool, path.name).api)
    return names


@dataclass(frozen=True)
class RecordFilter:
    """The records a selection names: every part given must match (an empty part matches every record)."""

    apis: frozenset[str] = frozenset()
    categories: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()
    """A record's origin as recorded, or as ``cache stats`` counts it (``<source>:<origin>``)."""
    keys: frozenset[str] = frozenset()
    failures: bool = False
    before: float | None = None
    models: tuple[str, ...] = ()
    """``fnmatch`` patterns of models: recorded model calls of a matching model only (``--model``)."""

    @property
    def empty(self) -> bool:
        return self == RecordFilter()

    def matches(self, record: Record) -> bool:
        checks = (
            not self.apis or record.api in self.apis,
            not self.categories or category_of(record.api) in self.categories,
            not self.sources or record.source in self.sources,
            not self.origins or record.origin in self.origins or origin_key(record) in self.origins,
            not self.keys or record.key in self.keys,
            not self.failures or record.is_failure,
            self.before is None or record.created_at < self.before,
            not self.models or _is_model_of(record.api, self.models),
        )
        return all(checks)


def _is_model_of(api: str, patterns: tuple[str, ...]) -> bool:
    model = model_of(api)
    return model is not None and any(fnmatch.fnmatchcase(model, p) for p in patterns)
