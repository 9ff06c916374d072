"""``doctor --keys``: the records a string input wrote under a key that an input of another kind has.

Before record keys carried an input's kind (:func:`~stabletoolbench_mirror.core.keys.record_key`),
a string input such as ``"{'city': 'Rome'}"`` was recorded under exactly the key of the object
``{"city": "Rome"}``, and that object call was then answered with the string call's record.
Such a record still answers both calls (it cannot tell them apart); this one-off scan finds
them.  A record is one when its key reads like another kind's (so a string input would be
marked today) and the string input's canonical key points at it: only a string input's
record writes that pointer.
"""

from __future__ import annotations

from collections.abc import Iterator

from stabletoolbench_mirror.core import keys
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import Store


def planted_records(store: Store, *, progress: bool = False) -> Iterator[Record]:
    """Every record of ``store`` a string input wrote under another kind's key (one scan, a read per candidate)."""
    for record in progress_bar(store, total=len(store), desc="keys", unit="record", disable=not progress):
        if not _could_be_planted(record.key):
            continue
        found = store.get_canonical(record.api, keys.canonical_key(record.key))
        if found is not None and found.key == record.key:
            yield record


def _could_be_planted(key: str) -> bool:
    # unmarked keys a string input would be marked under now (a session key's input is its head)
    return keys.record_key(key) != key and not key.endswith(keys.STRING_MARK)


def render(records: list[Record]) -> str:
    """What ``doctor --keys`` prints."""
    if not records:
        return "keys: no record of a string input shares its key with an input of another kind"
    lines = [
        f"keys: {len(records)} record(s) of a string input share their key with an input of another kind; "
        "those calls are answered with the string input's record (recorded before record keys carried the "
        "input's kind). Record the affected calls again in a fresh store to give each its own answer:"
    ]
    lines += [f"  {r.api}  {r.key[:200]!s}  ({r.source}, {r.origin or '-'})" for r in records]
    return "\n".join(lines)
