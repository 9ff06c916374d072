"""``cache export --format chat-jsonl``: the store as chat training data for the MirrorAPI styles.

One ``{"messages": [system, user, assistant]}`` line per recorded call.  The system and user
turns are built by the code that builds the live prompt (:func:`~.simulator.prompts.mirrorapi_messages`,
with the system prompt ``simulator.system_prompt_file`` gives the style); the assistant turn
is the recorded answer in the form the style's model outputs: ``{"error", "response"}`` as
JSON, and for ``mirrorapi-cot`` ``{"mechanism_of_the_api", "error", "response"}`` (so only
records that kept a rationale are exported for it).  Records are deduplicated by API and
canonical input (the earliest wins); the file is written whole or not at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.core.files import atomic_write
from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.core.selection import RecordFilter

CHAT_STYLES = ("mirrorapi-sft", "mirrorapi-cot", "mirrorapi-cache")


@dataclass
class ChatExportSummary:
    written: int = 0
    duplicates: int = 0
    filtered: int = 0
    without_rationale: int = 0
    unusable: int = 0
    failures: int = 0

    def lines(self) -> list[str]:
        out = [f"lines written:    {self.written}", f"duplicates:       {self.duplicates}", f"filtered out:     {self.filtered}"]
        if self.without_rationale:
            out.append(f"no rationale (skipped for CoT): {self.without_rationale}")
        if self.failures:
            out.append(f"failure records (no answer to train on, skipped): {self.failures}")
        if self.unusable:
            out.append(f"keys that are not Python literals (skipped): {self.unusable}")
        return out


def assistant_turn(answer: Any, meta: Mapping[str, Any] | None, style: str) -> str | None:
    """The recorded answer as the style's model writes it; ``None`` for CoT without a rationale."""
    error = answer.get("error", "") if isinstance(answer, dict) else ""
    response = answer.get("response", "") if isinstance(answer, dict) else answer
    if style != "mirrorapi-cot":
        return json.dumps({"error": error, "response": response}, ensure_ascii=False)
    meta = meta or {}
    rationale = meta.get("mechanism_of_the_api") or meta.get("text_before_answer")
    if not rationale:
        return None
    return json.dumps({"mechanism_of_the_api": rationale, "error": error, "response": response}, ensure_ascii=False)


def unique_records(records: Iterable[Record], summary: ChatExportSummary, wanted: RecordFilter) -> list[Record]:
    """The records that pass the filters, one per API and canonical input (the earliest), in a stable order."""
    chosen: dict[tuple[str, str], Record] = {}
    for record in records:
        if record.is_failure:
            summary.failures += 1
            continue
        if not wanted.matches(record):
            summary.filtered += 1
            continue
        identity = (record.api, canonical_from_upstream_key(record.key) or record.key)
        kept = chosen.get(identity)
        if kept is None:
            chosen[identity] = record
            continue
        summary.duplicates += 1
        if (record.created_at, record.key) < (kept.created_at, kept.key):
            chosen[identity] = record
    return sorted(chosen.values(), key=lambda r: (r.api, r.created_at, r.key))


def export_chat_jsonl(
    store: Any,
    out: str | os.PathLike[str],
    settings: Settings,
    *,
    style: str,
    source: str | None = None,
    categories: Iterable[str] | None = None,
    progress: bool = True,
) -> ChatExportSummary:
    from stabletoolbench_mirror.core.progress import progress_bar
    from stabletoolbench_mirror.core.record_calls import call_of_record
    from stabletoolbench_mirror.responders.simulator import system_prompt_for
    from stabletoolbench_mirror.responders.simulator.prompts import mirrorapi_messages
    from stabletoolbench_mirror.upstream.tooldocs import tool_docs_for

    if style not in CHAT_STYLES:
        raise ValueError(f"--style must be one of {', '.join(CHAT_STYLES)}")
    system = system_prompt_for(settings, style).text
    docs = tool_docs_for(settings)
    summary = ChatExportSummary()
    wanted = RecordFilter(sources=frozenset([source] if source is not None else ()), categories=frozenset(categories or ()))
    records = unique_records(progress_bar(store, desc="read store", unit="entry", disable=not progress), summary, wanted)
    with atomic_write(out, newline="\n") as handle:
        for record in progress_bar(records, desc="export", unit="record", disable=not progress):
            call = call_of_record(record, docs)
            if call is None:
                summary.unusable += 1
                continue
            answer_text = assistant_turn(record.answer, record.meta, style)
            if answer_text is None:
                summary.without_rationale += 1
                continue
            doc = docs.find(call.names) if docs is not None else None
            messages = mirrorapi_messages(system, call, doc, style) + [{"role": "assistant", "content": answer_text}]
            handle.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
            summary.written += 1
    return summary
