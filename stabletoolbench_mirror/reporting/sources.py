"""What a report is made from: a source named on the command line, read into the report's JSON object.

A source is one of (see docs/report.md)

* ``store`` (the default: the store of ``--config`` / ``--store-path``), a diskcache folder (it holds
  ``cache.db``) or ``redis://host:port/db[#prefix=P]``: every record read once, streamed;
* a snapshot folder (``manifest.json`` beside an upstream tree);
* a score bundle folder (``bundle.json``, made by ``score``);
* an archive of either (``.tar.gz``, or an ``http(s)://`` URL ending in one, ``#sha256=`` allowed):
  fetched and unpacked as ``frozen_caches`` fetches a snapshot, a snapshot's content hash checked there,
  a bundle's seal checked by its report;
* a running server, ``http://HOST:PORT``: its ``/stats`` and ``/health``.

:func:`collect` reads one; :func:`collect_pair` two bundles side by side.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from pathlib import Path
from typing import Any

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.reporting.bundles import bundle_report, compare, is_bundle
from stabletoolbench_mirror.reporting.server import read_server, server_models, server_requests
from stabletoolbench_mirror.reporting.tally import ReportError, snapshot_tallies, store_tallies
from stabletoolbench_mirror.scoring.bundle import BUNDLE_FILE, BundleError
from stabletoolbench_mirror.scoring.bundle import read_manifest as read_seal
from stabletoolbench_mirror.stores import Store, StoreError
from stabletoolbench_mirror.stores.kinds import StoreSpec
from stabletoolbench_mirror.upstream.archives import (
    ARCHIVE_SUFFIXES,
    SNAPSHOT,
    ArchiveError,
    ArchiveKind,
    ArchiveLimits,
    is_archive,
    local_tree,
)
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME

FORMAT = "stabletoolbench-mirror-report"
FORMAT_VERSION = 2
#: the parts of a report, each ``null`` where its source has no figures for it (docs/report.md)
PARTS = ("environment", "records", "requests", "models", "mcp", "bundle", "score", "labels", "answers")


def _check_unpacked(root: Path, progress: bool) -> str:
    """An unpacked bundle's seal must be readable (its files are checked by its report, which names every
    change); an unpacked snapshot is checked as ``frozen_caches`` checks one."""
    if not (root / BUNDLE_FILE).is_file():
        return SNAPSHOT.check(root, progress)
    try:
        return str(read_seal(root)["content_hash"])
    except BundleError as exc:
        raise ArchiveError(str(exc)) from None


#: what ``report`` unpacks: a score bundle or a snapshot
BUNDLE_OR_SNAPSHOT = ArchiveKind((BUNDLE_FILE, MANIFEST_NAME), "a score bundle or a snapshot",
                                 "stabletoolbench-mirror score ... --out BUNDLE.tar.gz, or snapshot OUT.tar.gz", _check_unpacked)


def is_server_url(spec: str) -> bool:
    location = spec.partition("#")[0]
    return location.startswith(("http://", "https://")) and not urllib.parse.urlsplit(location).path.endswith(ARCHIVE_SUFFIXES)


def base(report_source: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "created_by": f"stabletoolbench-mirror {__version__}",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source": report_source,
            **{part: None for part in PARTS}, "problems": []}


def collect(spec: str, settings: Settings, *, timeout_s: float = 30.0, max_bytes: int = 64 << 20, progress: bool = False,
            limits: ArchiveLimits | None = None) -> dict[str, Any]:
    """The report of ``spec`` (see the module docstring), as the JSON object ``--json`` prints; an archive is fetched and
    unpacked within ``limits`` (default: the settings')."""
    if is_server_url(spec):
        location = spec.rstrip("/").removesuffix("/stats").removesuffix("/virtual")
        report = base({"kind": "server", "location": location})
        stats, health = read_server(location, timeout_s, max_bytes)
        report["requests"] = server_requests(stats, health)
        report["models"] = server_models(stats)
        return report
    if is_archive(spec):
        try:
            root = Path(local_tree(spec, settings.resolve(settings.download_dir), progress=progress,
                                   limits=limits or ArchiveLimits.of(settings), kind=BUNDLE_OR_SNAPSHOT))
        except ArchiveError as exc:
            raise ReportError(str(exc)) from exc
        kind = "bundle" if is_bundle(root) else "archive"
        return _folder_report(root, {"kind": kind, "location": spec, "unpacked": str(root)}, progress)
    if spec != "store" and (is_bundle(spec) or (Path(spec) / MANIFEST_NAME).is_file()):
        kind = "bundle" if is_bundle(spec) else "snapshot"
        return _folder_report(Path(spec), {"kind": kind, "location": os.path.abspath(spec)}, progress)
    store, where = _open_store(spec, settings)
    with store:
        report = base({"kind": "store", "location": where, "store": store.kind})
        report["records"], report["models"], report["mcp"] = store_tallies(store)
    return report


def collect_pair(spec_a: str, spec_b: str, settings: Settings, *, progress: bool = False,
                 limits: ArchiveLimits | None = None) -> dict[str, Any]:
    """Two bundles side by side: each one's report and where they differ (:func:`.bundles.compare`)."""
    sides = []
    for spec in (spec_a, spec_b):
        report = collect(spec, settings, progress=progress, limits=limits)
        if report["source"]["kind"] != "bundle":
            raise ReportError(f"{spec}: a {report['source']['kind']}, not a score bundle: `report A B` compares two bundles "
                              "(folders with bundle.json, or their .tar.gz)")
        sides.append(report)
    a, b = sides
    roots = [Path(r["source"].get("unpacked") or r["source"]["location"]) for r in sides]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "created_by": a["created_by"], "created_at": a["created_at"],
            "a": a, "b": b, "comparison": compare(a, b, roots[0], roots[1])}


def _folder_report(root: Path, report_source: dict[str, Any], progress: bool) -> dict[str, Any]:
    report = base(report_source)
    if report_source["kind"] == "bundle":
        report.update(bundle_report(root, progress, unpacked="unpacked" in report_source))
        return report
    manifest = read_manifest(root)
    report["environment"] = environment(manifest)
    report["records"], report["models"], report["mcp"] = snapshot_tallies(root, manifest)
    return report


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read: {exc}") from exc
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON ({exc}): not a snapshot made by `stabletoolbench-mirror snapshot`") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("content_hash"), str):
        raise ReportError(f"{path}: has no content_hash: not a snapshot made by `stabletoolbench-mirror snapshot`")
    return manifest


def environment(manifest: dict[str, Any]) -> dict[str, Any]:
    """What identifies a snapshot: its content hash and how it was made."""
    keys = ("content_hash", "hash_method", "created_at", "created_by", "entries", "files", "store")
    return {key: manifest.get(key) for key in keys}


def _open_store(spec: str, settings: Settings) -> tuple[Store, str]:
    from stabletoolbench_mirror.factory import build_store

    try:
        if spec == "store":
            return build_store(settings, read_only=True), StoreSpec.of(settings).where
        named = StoreSpec.parse(spec, StoreSpec.of(settings))
        if named is not None:
            return named.open(read_only=True), named.where
    except StoreError as exc:
        raise ReportError(str(exc)) from exc
    raise ReportError(f"{spec}: not a store, a snapshot, a score bundle or a server: give `store` (the configured one), a "
                      f"diskcache folder (with cache.db), redis://HOST:PORT/DB, a snapshot folder (with {MANIFEST_NAME}), a score "
                      f"bundle (with {BUNDLE_FILE}), an archive of either (.tar.gz), or a running server's http://HOST:PORT")
