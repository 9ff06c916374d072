"""Which entries of an upstream ``tool_response_cache`` tree are failure records.

A tree holds served bodies only.  An entry is a failure record (a miss that ended without a
usable answer, see :attr:`~.records.Record.is_failure`) when

* the tree's snapshot ``manifest.json`` lists it in ``failure_entries`` (``snapshot`` writes
  them), or
* it is upstream's own failed answer, ``{"error": "Failed to generate fake response",
  "response": ""}``, which upstream's server saves like any answer.

Frozen caches and ``cache import`` use this, so a failure keeps being a failure wherever it goes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.protocol import encode_answer, simulation_failed_answer

log = logging.getLogger(__name__)

UPSTREAM_FAILURE_BODY = encode_answer(simulation_failed_answer())
#: the provenance a failure record read from a tree gets
TREE_FAILURE_REASON = "recorded as a failure"
MANIFEST_NAME = "manifest.json"
"""A snapshot's manifest, beside the tree's category folders (it lists the tree's failure entries)."""


def failure_entries(manifest: Any) -> set[tuple[str, str]] | None:
    """The ``(api, key)`` pairs a manifest lists as failure records (none for older manifests);
    ``None`` when the list is malformed."""
    listed = manifest.get("failure_entries", []) if isinstance(manifest, dict) else []
    if not isinstance(listed, list):
        return None
    out: set[tuple[str, str]] = set()
    for item in listed:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            return None
        out.add((item[0], item[1]))
    return out


def failure_entries_hash(content_hash: Any, entries: set[tuple[str, str]]) -> str:
    """``sha256:<hex>`` binding a manifest's failure entries to its ``content_hash`` (its ``failure_entries_hash``)."""
    line = json.dumps([content_hash, sorted([api, key] for api, key in entries)], ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(line.encode("utf-8", "surrogatepass")).hexdigest()


#: the first version whose ``snapshot`` writes ``failure_entries_hash``; every version writes ``created_by``
HASH_SINCE = (0, 3, 0)
_CREATED_BY = re.compile(r"stabletoolbench-mirror (\d+)\.(\d+)\.(\d+)")


def written_before_the_hash(manifest: dict[str, Any]) -> bool:
    """Whether ``created_by`` names a version before :data:`HASH_SINCE` (0.1.0 and 0.2.0 wrote no hash)."""
    created_by = manifest.get("created_by")
    matched = _CREATED_BY.match(created_by) if isinstance(created_by, str) else None
    return matched is not None and tuple(int(n) for n in matched.groups()) < HASH_SINCE


def failure_entries_problem(manifest: Any) -> str | None:
    """Why a manifest's ``failure_entries`` cannot be trusted, or ``None``.

    A manifest written since ``failure_entries_hash`` was kept must carry it and list exactly the failure
    entries that hash covers (with its ``content_hash``); one whose ``created_by`` names a version before
    (0.2.0 listed ``failure_entries`` without a hash) is taken as it is.  The field removed, or ``created_by``
    with it, is refused as a changed list is: which version wrote a manifest is read from the manifest only.
    """
    if not isinstance(manifest, dict):
        return None
    if (recorded := manifest.get("failure_entries_hash")) is None:
        if written_before_the_hash(manifest):
            return None
        return (f"the manifest has no failure_entries_hash, which every snapshot written by stabletoolbench-mirror "
                f"{'.'.join(map(str, HASH_SINCE))} or later carries (created_by: {manifest.get('created_by')!r}): its "
                "failure_entries cannot be checked (failure records would be taken for answers); not used; take the "
                "snapshot as published or write it again with: stabletoolbench-mirror snapshot")
    listed = failure_entries(manifest)
    if listed is None or recorded != failure_entries_hash(manifest.get("content_hash"), listed):
        return ("failure_entries differ from what the manifest's failure_entries_hash covers: the manifest was changed "
                "after it was written (failure records would be taken for answers); not used; take the snapshot as published "
                "or write it again with: stabletoolbench-mirror snapshot")
    return None


def tree_failure_entries(root: str | os.PathLike[str]) -> set[tuple[str, str]]:
    """The failure entries listed by ``root``'s snapshot manifest (empty without one; a bad one is logged)."""
    path = Path(root, MANIFEST_NAME)
    if not path.is_file():
        return set()
    try:
        listed = failure_entries(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("manifest %s cannot be read: %s; no entry of the tree is taken for a failure", path, exc)
        return set()
    if listed is None:
        log.warning("manifest %s: failure_entries is malformed; no entry of the tree is taken for a failure", path)
        return set()
    return listed


def manifest_mtime_ns(root: str | os.PathLike[str]) -> int:
    """The modification time of ``root``'s manifest, ``-1`` when there is none."""
    try:
        return os.stat(Path(root, MANIFEST_NAME)).st_mtime_ns
    except OSError:
        return -1


def is_tree_failure(api: str, key: str, body: str, listed: set[tuple[str, str]] | frozenset[tuple[str, str]]) -> bool:
    """Whether a tree entry (its served ``body``) is a failure record."""
    return body == UPSTREAM_FAILURE_BODY or (api, key) in listed
