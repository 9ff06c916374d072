"""Frozen snapshots: the store as an upstream ``tool_response_cache`` tree plus a ``manifest.json``.

``stabletoolbench-mirror snapshot OUT`` writes every entry of the store into ``OUT`` in
StableToolBench's layout (so upstream's own server, or this one as a frozen cache, can serve
it) and a manifest: entry counts by source and by category, the models and other origins
that produced the answers, the settings that produced it (secrets removed) and a
**content hash**.  ``snapshot --verify OUT`` recomputes the hash from the files and
compares.

The content hash is SHA-256 over the *canonical entries*, one line per entry,
``[namespace, upstream key, answer]`` as compact JSON (the answer in its served encoding,
``{"error", "response"}`` in their order), lines sorted by ``(namespace, key)``.  It depends
on nothing but what is served: not on file order, entry order inside a file, indentation,
recording times, provenance or the machine, so the same store snapshotted twice (or the same
answers recorded in another order elsewhere) gives the same hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

from tqdm import tqdm

from . import __version__
from .cache_tools import group_by_namespace
from .config import Settings
from .failures import failure_entries
from .protocol import encode_answer
from .records import Record
from .stores import Store
from .upstream_layout import iter_cache_files, namespace_path, read_cache_file, write_cache_file

MANIFEST_NAME = "manifest.json"
FORMAT = "stabletoolbench-mirror-snapshot"
FORMAT_VERSION = 1
HASH_METHOD = (
    "sha256 over UTF-8 lines json.dumps([namespace, key, answer_json], ensure_ascii=False, "
    "separators=(',', ':')) + '\\n', sorted by (namespace, key); answer_json is the served compact encoding"
)
_SECRET_FIELDS = frozenset({"auth_token", "toolbench_key", "rapidapi_key", "api_key"})
_REDACTED = "<redacted>"


class SnapshotError(RuntimeError):
    """A snapshot cannot be written or read."""


# -- the content hash ------------------------------------------------------------------------------


def _served(answer: Any) -> str:
    return encode_answer(answer)


def entry_line(namespace: str, key: str, answer: Any) -> bytes:
    """The canonical line of one entry (see the module docstring)."""
    text = json.dumps([namespace, key, _served(answer)], ensure_ascii=False, separators=(",", ":"))
    return (text + "\n").encode("utf-8", "surrogatepass")


def content_hash(entries: Iterable[tuple[str, str, Any]]) -> str:
    """``sha256:<hex>`` over ``(namespace, key, answer)`` entries, in any order."""
    digest = hashlib.sha256()
    for namespace, key, answer in sorted(entries, key=lambda e: (e[0], e[1])):
        digest.update(entry_line(namespace, key, answer))
    return "sha256:" + digest.hexdigest()


# -- settings without secrets ---------------------------------------------------------------------


def _strip_userinfo(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.netloc or "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{_REDACTED}@{host}", parts.path, parts.query, parts.fragment))


def public_settings(settings: Settings) -> dict[str, Any]:
    """The settings as JSON data with every secret removed (keys, tokens, URL passwords)."""
    secrets = [s for s in settings.secrets() if s]
    data = settings.model_dump(mode="json")

    def clean(value: Any, key: str = "") -> Any:
        if key in _SECRET_FIELDS:
            return _REDACTED if value else None
        if isinstance(value, dict):
            return {k: clean(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, key) for v in value]
        if isinstance(value, str):
            if "://" in value:
                value = _strip_userinfo(value)
            for secret in secrets:
                if secret in value:
                    value = value.replace(secret, _REDACTED)
        return value

    return clean(data)


# -- writing --------------------------------------------------------------------------------------


def _origin_group(record: Record) -> str:
    # an import's origin names each file ("import:<root>/<namespace>.json"): keep the root
    if record.source == "imported":
        return record.origin.split("/", 1)[0]
    return record.origin


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
    """Write the store's entries and ``manifest.json`` into ``out`` (new or empty); return the manifest.

    Failure records are written like any entry (their served body as the value, as upstream's
    server saves its failed answers) and listed in the manifest's ``failure_entries``, so a
    frozen cache of the snapshot knows them; ``exclude_failures`` leaves them out.
    """
    root = Path(out)
    _check_target(root)
    root.mkdir(parents=True, exist_ok=True)
    records = list(tqdm(store, desc="read store", unit="entry", disable=not progress))
    excluded = sum(1 for r in records if r.is_failure) if exclude_failures else 0
    if exclude_failures:
        records = [r for r in records if not r.is_failure]
    groups = group_by_namespace(records)
    by_source: Counter[str] = Counter()
    by_category: Counter[str] = Counter()
    models: Counter[str] = Counter()
    origins: Counter[str] = Counter()
    skipped: list[str] = []
    entries: list[tuple[str, str, Any]] = []
    failures: list[list[str]] = []
    failure_reasons: Counter[str] = Counter()
    files = 0
    for namespace, group in tqdm(groups.items(), desc="snapshot", unit="file", disable=not progress):
        path = namespace_path(root, namespace)
        if path is None:
            skipped.append(namespace)
            continue
        answers = {r.key: r.answer for r in group}
        write_cache_file(path, answers)
        files += 1
        for record in group:
            entries.append((namespace, record.key, answers[record.key]))
            by_source[record.source] += 1
            by_category[namespace.split("/", 1)[0]] += 1
            origins[f"{record.source}:{_origin_group(record)}"] += 1
            if record.source == "simulated":
                models[record.origin] += 1
            if record.is_failure:
                failures.append([namespace, record.key])
                failure_reasons[record.reason] += 1
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_by": f"stabletoolbench-mirror {__version__}",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "content_hash": content_hash(entries),
        "hash_method": HASH_METHOD,
        "entries": len(entries),
        "files": files,
        "by_source": dict(sorted(by_source.items())),
        "by_category": dict(sorted(by_category.items())),
        "failures": len(failures),
        "failure_reasons": dict(failure_reasons.most_common()),
        "excluded_failures": excluded,
        "failure_entries": sorted(failures),
        "models": dict(sorted(models.items())),
        "origins": dict(sorted(origins.items())),
        "store": store.kind,
        "settings": public_settings(settings) if settings is not None else None,
        "skipped_namespaces": skipped,
    }
    tmp = root / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, root / MANIFEST_NAME)
    return manifest


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


def tree_entries(root: str | os.PathLike[str], problems: list[str]) -> Iterator[tuple[str, str, Any]]:
    for namespace, path in iter_cache_files(root):
        try:
            data = read_cache_file(path)
        except (OSError, ValueError) as exc:
            problems.append(f"unreadable file {path}: {exc}")
            continue
        for key, answer in data.items():
            yield namespace, key, answer


def verify_snapshot(out: str | os.PathLike[str]) -> Verification:
    """Recompute the content hash and counts of a snapshot folder and compare them with its manifest."""
    root = Path(out)
    problems: list[str] = []
    try:
        manifest = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except OSError as exc:
        return Verification(False, None, None, problems=[f"no readable {MANIFEST_NAME} in {root}: {exc}"])
    except ValueError as exc:
        return Verification(False, None, None, problems=[f"{MANIFEST_NAME} is not JSON: {exc}"])
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return Verification(False, None, None, problems=[f"{MANIFEST_NAME} is not a {FORMAT} manifest"])
    if manifest.get("format_version") != FORMAT_VERSION:
        problems.append(f"unsupported format_version {manifest.get('format_version')!r}")
    entries = list(tree_entries(root, problems))
    files = len({e[0] for e in entries})
    actual = content_hash(entries)
    expected = manifest.get("content_hash")
    if actual != expected:
        problems.append("content hash differs: an entry was added, removed or changed")
    if manifest.get("entries") != len(entries):
        problems.append(f"entry count differs: manifest {manifest.get('entries')}, files {len(entries)}")
    by_category: Counter[str] = Counter(e[0].split("/", 1)[0] for e in entries)
    if isinstance(manifest.get("by_category"), dict) and manifest["by_category"] != dict(sorted(by_category.items())):
        problems.append("entry counts by category differ from the manifest")
    listed = failure_entries(manifest)
    if listed is None:
        problems.append("failure_entries is not a list of [namespace, key] pairs")
    else:
        present = {(e[0], e[1]) for e in entries}
        if not listed <= present:
            problems.append(f"{len(listed - present)} failure entries of the manifest are not in the files")
        if manifest.get("failures", len(listed)) != len(listed):
            problems.append(f"failure count differs: manifest {manifest.get('failures')}, listed {len(listed)}")
    return Verification(not problems, expected, actual, len(entries), files, problems)


# -- command line ---------------------------------------------------------------------------------


def cmd_snapshot(args: argparse.Namespace) -> int:
    if args.verify:
        result = verify_snapshot(args.out)
        print("\n".join(result.lines()))
        return 0 if result.ok else 1
    from .cli import settings_from_args
    from .factory import build_store

    settings = settings_from_args(args)
    try:
        with build_store(settings) as store:
            manifest = write_snapshot(store, args.out, settings=settings, progress=not args.quiet, exclude_failures=args.exclude_failures)
    except SnapshotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"snapshot:      {args.out}")
    print(f"entries:       {manifest['entries']} in {manifest['files']} files")
    print("by source:     " + ", ".join(f"{k} {v}" for k, v in manifest["by_source"].items()))
    print(f"failures:      {manifest['failures']} included" + (f", {manifest['excluded_failures']} left out" if args.exclude_failures else ""))
    print(f"content hash:  {manifest['content_hash']}")
    if manifest["skipped_namespaces"]:
        print(f"skipped (names unsafe as paths): {len(manifest['skipped_namespaces'])}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from .cli import add_config_arguments

    parser = sub.add_parser(
        "snapshot",
        help="freeze the store into an upstream tool_response_cache tree with a manifest.json",
        description="Write the store as an upstream tool_response_cache tree plus manifest.json "
        "(counts, models, settings without secrets, content hash); --verify rechecks a snapshot.",
    )
    parser.add_argument("out", help="the snapshot folder (new or empty; with --verify: an existing snapshot)")
    parser.add_argument("--verify", action="store_true", help="recompute the content hash of OUT and compare with its manifest")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    parser.add_argument(
        "--exclude-failures", action="store_true",
        help="leave failure records out (a cache meant for other people's record runs)",
    )
    add_config_arguments(parser)
    parser.set_defaults(func=cmd_snapshot)
