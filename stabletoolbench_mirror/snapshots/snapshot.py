"""Frozen snapshots: the store as an upstream ``tool_response_cache`` tree plus a ``manifest.json``, written and verified.

``stabletoolbench-mirror snapshot OUT`` writes every entry of the store into ``OUT`` in
StableToolBench's layout (so upstream's own server, or this one as a frozen cache, can serve
it) and a manifest: entry counts by source and by category, the models and other origins
that produced the answers, the settings that produced it (secrets removed) and a
**content hash**.  ``snapshot --verify OUT`` recomputes the hash from the files and
compares.

The content hash is SHA-256 over the *canonical entries*, one line per entry,
``[api, upstream key, answer]`` as compact JSON (the answer in its served encoding,
``{"error", "response"}`` in their order), lines sorted by ``(api, key)``.  It depends
on nothing but what is served: not on file order, entry order inside a file, indentation,
recording times, provenance or the machine, so the same store snapshotted twice (or the same
answers recorded in another order elsewhere) gives the same hash.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.core.files import write_text
from stabletoolbench_mirror.core.naming import category_of
from stabletoolbench_mirror.core.progress import progress_bar
from stabletoolbench_mirror.core.secrets import public_settings
from stabletoolbench_mirror.responders.mcp_live.tools import server_of
from stabletoolbench_mirror.snapshots.tree_export import ExportSummary, Tally, count, iter_export
from stabletoolbench_mirror.stores import Store
from stabletoolbench_mirror.upstream.content_hash import HASH_METHOD, ContentHash
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME, failure_entries, failure_entries_hash, failure_entries_problem
from stabletoolbench_mirror.upstream.layout import api_path, iter_cache_files, read_cache_file

FORMAT = "stabletoolbench-mirror-snapshot"
FORMAT_VERSION = 1
class SnapshotError(RuntimeError):
    """A snapshot cannot be written or read."""


# -- writing --------------------------------------------------------------------------------------


def _check_target(out: Path) -> None:
    if out.exists():
        if not out.is_dir():
            raise SnapshotError(f"{out} exists and is not a folder")
        if any(out.iterdir()):
            raise SnapshotError(f"{out} is not empty: snapshot into a new or empty folder")


def write_snapshot(
    store: Store,
    out: str | os.PathLike[str],
    *,
    settings: Settings | None = None,
    progress: bool = False,
    exclude_failures: bool = False,
) -> dict[str, Any]:
    """Export the store into ``out`` (new or empty) and write ``manifest.json`` beside it; return the manifest.

    Failure records are written like any entry (their served body as the value, as upstream's
    server saves its failed answers), counted, and listed in the manifest's ``failure_entries``
    so a frozen cache of the snapshot knows them; ``exclude_failures`` leaves them out.

    Entries that cannot be written (API names too long for a file name even encoded) are
    counted in the manifest's ``left_out``; :func:`verify_snapshot` then reports the
    snapshot as incomplete.
    """
    root = Path(out)
    _check_target(root)
    root.mkdir(parents=True, exist_ok=True)
    summary = ExportSummary()
    written = Tally()
    digest = ContentHash()
    failures: list[list[str]] = []
    simulated_mcp: list[list[str]] = []
    excluded = store.counts()
    excluded_before = excluded.by_outcome.get("failure", 0) if excluded is not None and exclude_failures else None
    for exported in iter_export(store, root, progress=progress, desc="snapshot", exclude_failures=exclude_failures):
        count(summary, exported)
        if exported.path is None:
            continue
        mcp = server_of(exported.api) is not None
        for record in exported.records:
            written.add(record)
            if record.is_failure:
                failures.append([exported.api, record.key])
            elif mcp and record.source == "simulated":  # a tree keeps no provenance: the report reads it here
                simulated_mcp.append([exported.api, record.key])
        digest.add_api_bodies(exported.api, ((r.key, r.body) for r in exported.records))
    tally = written.to_json()
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_by": f"stabletoolbench-mirror {__version__}",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "content_hash": digest.hexdigest(),
        "hash_method": HASH_METHOD,
        "entries": summary.entries,
        "files": summary.files,
        "encoded_names": summary.encoded_names,
        "store_entries": summary.entries + summary.left_out_entries,
        "left_out": dict(sorted(summary.left_out.items())),
        "by_source": tally["by_source"],
        "by_category": tally["by_category"],
        "models": tally["models"],
        "origins": tally["origins"],
        "failures": tally["failure_records"],
        "failure_reasons": tally["failure_reasons"],
        "excluded_failures": _excluded(store, exclude_failures, excluded_before),
        "failure_entries": sorted(failures),
        "mcp_simulated_entries": sorted(simulated_mcp),
        "failure_entries_hash": failure_entries_hash(digest.hexdigest(), {(api, key) for api, key in failures}),
        "api_hashes": digest.apis,
        "store": store.kind,
        "settings": public_settings(settings.with_servers_read()) if settings is not None else None,
    }
    write_text(root / MANIFEST_NAME, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def _excluded(store: Store, exclude_failures: bool, counted: int | None) -> int:
    """How many failure records ``--exclude-failures`` left out (from the store's counters, else a scan)."""
    if not exclude_failures:
        return 0
    if counted is not None:
        return counted
    return sum(1 for record in store if record.is_failure)


# -- verifying ------------------------------------------------------------------------------------


@dataclass
class Verification:
    ok: bool
    expected_hash: str | None
    actual_hash: str | None
    entries: int = 0
    files: int = 0
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"manifest hash:  {self.expected_hash}",
            f"computed hash:  {self.actual_hash}",
            f"entries: {self.entries}  files: {self.files}",
            "OK: the snapshot matches its manifest" if self.ok else "FAILED: the snapshot does not match its manifest",
        ]
        out.extend(f"  - {p}" for p in self.problems)
        return out


def tree_entries(
    root: str | os.PathLike[str], problems: list[str], *, progress: bool = False, paths: dict[str, Path] | None = None
) -> Iterator[tuple[str, str, Any]]:
    """``(api, key, answer)`` of every entry of an upstream tree, one API file at a time, in api order.

    Files that cannot be read are reported in ``problems`` and skipped.  ``paths`` gets each API's file.
    """
    for api, path in progress_bar(sorted(iter_cache_files(root)), desc="verify", unit="file", disable=not progress):
        if paths is not None:
            paths[api] = path
        try:
            data = read_cache_file(path)
        except (OSError, ValueError) as exc:
            problems.append(f"unreadable file {path}: {exc}")
            continue
        for key, answer in data.items():
            yield api, key, answer


def verify_snapshot(out: str | os.PathLike[str], *, allow_left_out: bool = False, progress: bool = False) -> Verification:
    """Recompute the content hash and counts of a snapshot folder and compare them with its manifest.

    A snapshot whose manifest says store entries were left out fails too (unless
    ``allow_left_out``): it does not hold everything the store served.
    """
    root = Path(out)
    problems: list[str] = []
    manifest = _read_manifest(root)
    if isinstance(manifest, Verification):
        return manifest
    if manifest.get("format_version") != FORMAT_VERSION:
        problems.append(f"unsupported format_version {manifest.get('format_version')!r}")
    listed = failure_entries(manifest)
    scan = _scan_tree(root, {api for api, _key in listed or ()}, problems, progress)
    actual = scan.digest.hexdigest()
    expected = manifest.get("content_hash")
    if actual != expected:
        problems.append("content hash differs: an entry was added, removed or changed")
        problems.extend(changed_apis(root, manifest.get("api_hashes"), scan.digest.apis, scan.paths))
    if manifest.get("entries") != scan.entries:
        problems.append(f"entry count differs: manifest {manifest.get('entries')}, files {scan.entries}")
    if isinstance(manifest.get("by_category"), dict) and manifest["by_category"] != dict(sorted(scan.by_category.items())):
        problems.append("entry counts by category differ from the manifest")
    _check_failures(manifest, listed, scan.present, problems)
    _check_left_out(manifest, allow_left_out, problems)
    return Verification(not problems, expected, actual, scan.entries, scan.files, problems)


def _read_manifest(root: Path) -> dict[str, Any] | Verification:
    """The snapshot's manifest, or the failed verification saying why there is none to use."""
    try:
        manifest = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except OSError as exc:
        return Verification(False, None, None, problems=[f"no readable {MANIFEST_NAME} in {root}: {exc}"])
    except ValueError as exc:
        return Verification(False, None, None, problems=[f"{MANIFEST_NAME} is not JSON: {exc}"])
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return Verification(False, None, None, problems=[f"{MANIFEST_NAME} is not a {FORMAT} manifest"])
    return manifest


@dataclass
class _TreeScan:
    """What a snapshot's files hold: their content hash, counts, and the failure entries found."""

    digest: ContentHash
    entries: int = 0
    files: int = 0
    by_category: Counter[str] = field(default_factory=Counter)
    present: set[tuple[str, str]] = field(default_factory=set)
    """``(api, key)`` of the entries of APIs the manifest lists failure entries of."""
    paths: dict[str, Path] = field(default_factory=dict)


def _scan_tree(root: Path, listed_apis: set[str], problems: list[str], progress: bool) -> _TreeScan:
    scan = _TreeScan(ContentHash())
    for api, group in groupby(tree_entries(root, problems, progress=progress, paths=scan.paths), key=lambda e: e[0]):
        items = [(key, answer) for _, key, answer in group]
        if api in listed_apis:
            scan.present.update((api, key) for key, _ in items)
        scan.digest.add_api(api, items)
        scan.files += 1
        scan.entries += len(items)
        scan.by_category[category_of(api)] += len(items)
    return scan


def _check_failures(manifest: dict[str, Any], listed: set[tuple[str, str]] | None, present: set[tuple[str, str]], problems: list[str]) -> None:
    """The manifest's failure entries: a list of pairs, each in the files, as many as its ``failures``."""
    if listed is None:
        problems.append("failure_entries is not a list of [api, key] pairs")
        return
    changed = failure_entries_problem(manifest)
    if changed is not None:
        problems.append(changed)
    missing = [entry for entry in listed if entry not in present]
    if missing:
        problems.append(f"{len(missing)} failure entries of the manifest are not in the files")
    if manifest.get("failures", len(listed)) != len(listed):
        problems.append(f"failure count differs: manifest {manifest.get('failures')}, listed {len(listed)}")


def _check_left_out(manifest: dict[str, Any], allow_left_out: bool, problems: list[str]) -> None:
    """A problem when the store held entries the snapshot left out (unless ``allow_left_out``)."""
    left_out = manifest.get("left_out") or {}
    if left_out and not allow_left_out:
        n = sum(left_out.values()) if isinstance(left_out, dict) else len(left_out)
        problems.append(
            f"incomplete: the store held {n} more entries ({len(left_out)} APIs with names too long for a file name) "
            "that the snapshot left out (--skip-unsafe accepts that)"
        )


#: APIs named per kind of change (changed, missing, added) when a verification fails
NAMED_CHANGES = 20


def changed_apis(root: Path, recorded: Any, computed: dict[str, str], paths: dict[str, Path]) -> list[str]:
    """The APIs (and their files) whose entries differ from the manifest's ``api_hashes``."""
    if not isinstance(recorded, dict):
        return ["the manifest has no api_hashes (written before they were kept): it cannot say which files changed; "
                "snapshot the store again to get them"]

    def where(api: str) -> str:
        path = paths.get(api) or api_path(root, api)
        return str(path.relative_to(root)) if path is not None and path.is_relative_to(root) else "no file"

    def count(value: Any) -> str:
        return str(value).split(":", 1)[0] if isinstance(value, str) else "?"

    found: dict[str, list[str]] = {"changed": [], "missing": [], "added": []}
    for api in sorted(set(recorded) | set(computed)):
        if api not in computed:
            found["missing"].append(f"missing: {api} ({where(api)}): the manifest has {count(recorded[api])} entries, the files none")
        elif api not in recorded:
            found["added"].append(f"added: {api} ({where(api)}): {count(computed[api])} entries the manifest does not have")
        elif recorded[api] != computed[api]:
            was, now = count(recorded[api]), count(computed[api])
            what = "entries changed" if was == now else f"entries: manifest {was}, files {now}"
            found["changed"].append(f"changed: {api} ({where(api)}): {what}")
    out: list[str] = []
    for kind, lines in found.items():
        out += lines[:NAMED_CHANGES]
        if len(lines) > NAMED_CHANGES:
            out.append(f"... and {len(lines) - NAMED_CHANGES} more {kind} APIs")
    return out
