"""The tool call a record answers, rebuilt from its api and upstream key (for fidelity and export)."""

from __future__ import annotations

from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.keys import value_from_upstream_key
from stabletoolbench_mirror.core.naming import ApiPath
from stabletoolbench_mirror.core.records import Record


def call_of_record(record: Record, docs: Any = None) -> ToolCall | None:
    """The call of ``record``, or ``None`` when its key is not a Python literal or its api does not round-trip.

    A record keeps only the standardised names of its call (``<category>/<tool>_for_<category>/<api>``).
    When ``docs`` (a :class:`~stabletoolbench_mirror.upstream.tooldocs.ToolDocs`) has the API, the call
    gets the tool and API names as the doc spells them, which is what a client sends (so a
    prompt built for it is the live prompt); otherwise the standardised names.
    """
    path = ApiPath.parse(record.api)
    if path is None:
        return None
    try:
        tool_input = value_from_upstream_key(record.key)
    except ValueError:
        return None
    call = ToolCall.of(path.category, path.tool, path.name, tool_input)
    if call.api != record.api or call.key != record.key:
        return None
    doc = docs.find(call.names) if docs is not None else None
    if doc is not None and not doc.fuzzy:
        named = ToolCall.of(path.category, doc.tool_name, doc.name, tool_input)
        if named.api == record.api:
            return named
    return call
