"""The diskcache store's keys and the values it reads back.

Keys are text: a kind (``e`` an entry, ``c`` a canonical pointer, ``n`` an API that holds records,
``s`` a counter, ``g`` a generation, ``m`` the format marker), a NUL, then the parts NUL-separated.
Values are text (a record's JSON, a key) or counts; anything else is refused as
not a store of this program's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import formats, rules
from stabletoolbench_mirror.stores.base import StoreError

ENTRY = "e"
CANONICAL = "c"
NAMESPACE = "n"
COUNT = "s"
#: present when the counters below were kept since the store was empty (so they count everything)
COUNTED = f"{COUNT}\x00counted"
#: bumped by every ``delete``: each process then forgets which APIs it knew to have their key
DELETES = "g\x00deletes"
#: bumped by every ``delete`` and ``replace``: an in-process copy of records must be dropped when it moves
CHANGES = "g\x00changes"
#: the store's format marker (:mod:`.formats`)
FORMAT = "m\x00format"


def entry_key(api: str, key: str) -> str:
    return f"{ENTRY}\x00{_no_nul(api)}\x00{key}"


def canonical_key(api: str, canonical: str) -> str:
    return f"{CANONICAL}\x00{_no_nul(api)}\x00{canonical}"


def api_range(kind: str, api: str) -> tuple[str, str]:
    """The lowest key of one API's keys of one ``kind`` (included) and a bound above them all."""
    return f"{kind}\x00{_no_nul(api)}\x00", f"{kind}\x00{api}\x01"


def _no_nul(api: str) -> str:
    # the first NUL after the kind ends the API, so ``(api, key)`` -> diskcache key is
    # one-to-one only while APIs hold no NUL (``/virtual`` refuses control characters in names)
    if "\x00" in api:
        raise ValueError(f"an API must not contain NUL: {api[:200]!r}")
    return api


def count_key(*parts: str) -> str:
    return "\x00".join((COUNT, *parts))


def counted_as(counts: rules.Counts) -> Counter[str]:
    """The rules' counter changes under this store's counter keys (``s\x00<name>\x00<value>``)."""
    return Counter({count_key(*name): n for name, n in counts.items() if n})


def stored_text(value: object) -> str:
    """A value this store wrote as text (a record's JSON, a key a canonical pointer names)."""
    if not isinstance(value, str):
        raise StoreError(f"diskcache store holds a {type(value).__name__} where text belongs: not a store of this program's")
    return value


def format_marker(cache: Any) -> formats.Marker | None:
    value = cache.get(FORMAT)
    return formats.parse(None if value is None else stored_text(value))


def stored_record(value: object) -> Record:
    """A stored record; :class:`StoreError` for one that cannot be read (a value file truncated beside a live store)."""
    try:
        return Record.from_json(stored_text(value))
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"diskcache store holds an unreadable record: {type(exc).__name__}: {exc}") from exc


def stored_int(value: object) -> int:
    if not isinstance(value, int):
        raise StoreError(f"diskcache store holds a {type(value).__name__} where a count belongs: not a store of this program's")
    return value


def failure_shares_a_key(items: list[tuple[Record, str | None]], entry_keys: list[str], pointer_keys: list[str | None]) -> bool:
    """Whether a failure record of the batch shares its key or canonical key with another record of it."""
    failures = [i for i, (record, _) in enumerate(items) if record.is_failure]
    if not failures:
        return False
    seen = Counter(entry_keys)
    seen.update(k for k in pointer_keys if k is not None)
    return any(seen[entry_keys[i]] > 1 or seen[pointer_keys[i] or ""] > 1 for i in failures)
