"""``report SOURCE --html OUT.html [--json OUT.json]``: what a run's environment did, as one page.

``SOURCE`` is one of

* ``store`` (the default: the store of ``--config`` / ``--store-path``), a diskcache folder (it holds
  ``cache.db``) or ``redis://host:port/db[#prefix=P]``: every record is read once, streamed;
* a snapshot folder (``manifest.json`` beside an upstream tree), or its archive (``.tar.gz``, or an
  ``http(s)://`` URL ending in one, fetched and checked as ``frozen_caches`` fetches it);
* a running server, ``http://HOST:PORT``: its ``/stats`` and ``/health``.

The figures (see docs/report.md) are gathered into one JSON object (:func:`collect`), which
:mod:`.report_html` renders as a self-contained page: inline SVG charts and tables, no script, no
style sheet, font or image from anywhere else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.commands.cli_common import add_config_arguments, settings_from_args
from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.core.files import write_text
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import Store, StoreError
from stabletoolbench_mirror.upstream.archives import ARCHIVE_SUFFIXES, ArchiveError, ArchiveLimits, is_archive, local_tree
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME, failure_entries
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file

FORMAT = "stabletoolbench-mirror-report"
FORMAT_VERSION = 1
#: the slowest APIs listed (by mean latency)
SLOWEST = 15
#: how a request of ``/stats`` ended, by the section of the page it is shown in
NOT_SERVED = ("rejected", "refused", "store_errors", "errors")
NEW_ANSWERS = ("recorded", "shared", "replaced", "unrecorded")
OUTCOMES = ("hits", "recorded", "shared", "failed", "replaced", "unrecorded", "unanswered", "local", *NOT_SERVED)


class ReportError(RuntimeError):
    """The source cannot be read (the message names it and the fix)."""


# -- the parts of a name ----------------------------------------------------------------------------


def category_of(api: str) -> str:
    return api.split("/", 1)[0]


def tool_of(api: str) -> str:
    """``Category/tool_for_Category`` of ``Category/tool_for_Category/api``."""
    return api.rsplit("/", 1)[0] if api.count("/") >= 2 else api


def _sorted_counts(counts: Counter[str] | dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _nested(table: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
    """``{name: {column: n}}`` with a ``total``, names by their total (largest first)."""
    rows = {name: {**dict(sorted(c.items())), "total": sum(c.values())} for name, c in table.items()}
    return dict(sorted(rows.items(), key=lambda item: (-item[1]["total"], item[0])))


# -- records (a store, or a snapshot's tree) --------------------------------------------------------


@dataclass
class _Latency:
    calls: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.calls += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)


@dataclass
class RecordTally:
    """The report's counts of a store's records (each record once)."""

    entries: int = 0
    by_source: Counter[str] = field(default_factory=Counter)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    by_category: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    by_tool: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    models: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Simulated records by (origin, meta model, meta prompt_sha256)."""
    model_failures: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    token_records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency: dict[str, _Latency] = field(default_factory=lambda: defaultdict(_Latency))

    def add(self, record: Record) -> None:
        self.entries += 1
        self.by_source[record.source] += 1
        column = "failure" if record.is_failure else record.source
        if record.is_failure:
            self.failure_reasons[record.reason or "(no reason recorded)"] += 1
        self.by_category[category_of(record.api)][column] += 1
        self.by_tool[tool_of(record.api)][column] += 1
        meta = record.meta or {}
        if record.source == "simulated":
            generation = (record.origin, str(meta.get("model") or ""), str(meta.get("prompt_sha256") or ""))
            self.models[generation] += 1
            self.model_failures[generation] += record.is_failure
        self._add_meta(record.api, meta)

    def _add_meta(self, api: str, meta: Any) -> None:
        prompt, completion = meta.get("prompt_tokens"), meta.get("completion_tokens")
        if isinstance(prompt, int) or isinstance(completion, int):
            self.token_records += 1
            self.prompt_tokens += prompt if isinstance(prompt, int) else 0
            self.completion_tokens += completion if isinstance(completion, int) else 0
        latency = meta.get("latency_s")
        if isinstance(latency, (int, float)) and not isinstance(latency, bool) and latency >= 0:
            self.latency[api].add(float(latency))

    def to_json(self) -> dict[str, Any]:
        simulated = self.by_source.get("simulated", 0)
        return {
            "entries": self.entries,
            "by_source": dict(sorted(self.by_source.items())),
            "failures": sum(self.failure_reasons.values()),
            "failure_reasons": _sorted_counts(self.failure_reasons),
            "by_category": _nested(self.by_category),
            "by_tool": _nested(self.by_tool),
            "simulated": {
                "entries": simulated,
                "share": round(simulated / self.entries, 6) if self.entries else 0.0,
                "by_model": [
                    {"origin": origin, "model": model or None, "prompt_sha256": prompt or None, "entries": n,
                     "failures": self.model_failures[(origin, model, prompt)]}
                    for (origin, model, prompt), n in sorted(self.models.items(), key=lambda item: (-item[1], item[0]))
                ],
            },
            "tokens": self._tokens(),
            "slowest_apis": slowest(self.latency),
        }

    def _tokens(self) -> dict[str, int] | None:
        if not self.token_records:
            return None
        return {"records": self.token_records, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def slowest(latency: dict[str, _Latency], n: int = SLOWEST) -> list[dict[str, Any]]:
    """The ``n`` APIs of the highest mean recorded latency."""
    means = sorted(((-lat.total_s / lat.calls, api) for api, lat in latency.items() if lat.calls))[:n]
    return [{"api": api, "calls": latency[api].calls, "mean_s": round(-negative, 6), "max_s": round(latency[api].max_s, 6)}
            for negative, api in means]


def store_records(store: Store) -> dict[str, Any]:
    tally = RecordTally()
    for record in store:
        tally.add(record)
    return tally.to_json()


# -- a snapshot ---------------------------------------------------------------------------------------


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


def snapshot_records(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The report's counts of a snapshot: the manifest's totals, the tree's entries per category and tool.

    A snapshot's files hold the served answers only (no provenance), so per category and tool it says
    how many entries and failure entries there are; sources and models are the manifest's totals.
    """
    failed = failure_entries(manifest) or set()
    by_category: dict[str, Counter[str]] = defaultdict(Counter)
    by_tool: dict[str, Counter[str]] = defaultdict(Counter)
    entries = 0
    for api, path in sorted(iter_cache_files(root, allow_symlinks=False)):
        try:
            keys = read_cache_file(path).keys()
        except (OSError, ValueError) as exc:
            raise ReportError(f"{path}: unreadable ({exc}): check the snapshot with `stabletoolbench-mirror snapshot --verify`") from exc
        for key in keys:
            column = "failure" if (api, key) in failed else "answer"
            by_category[category_of(api)][column] += 1
            by_tool[tool_of(api)][column] += 1
            entries += 1
    by_source = _mapping(manifest.get("by_source"))
    simulated = int(by_source.get("simulated", 0))
    models = _mapping(manifest.get("models"))
    return {
        "entries": entries,
        "by_source": dict(sorted(by_source.items())),
        "failures": manifest.get("failures", sum(c["failure"] for c in by_category.values())),
        "failure_reasons": manifest.get("failure_reasons") or {},
        "by_category": _nested(by_category),
        "by_tool": _nested(by_tool),
        "simulated": {
            "entries": simulated,
            "share": round(simulated / entries, 6) if entries else 0.0,
            "by_model": [{"origin": origin, "model": None, "prompt_sha256": None, "entries": n, "failures": None}
                         for origin, n in _sorted_counts(models).items()],
        },
        "tokens": None,
        "slowest_apis": [],
    }


def _mapping(value: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int)} if isinstance(value, dict) else {}


def environment(manifest: dict[str, Any]) -> dict[str, Any]:
    """What identifies a snapshot: its content hash and how it was made."""
    keys = ("content_hash", "hash_method", "created_at", "created_by", "entries", "files", "store")
    return {key: manifest.get(key) for key in keys}


# -- a running server -----------------------------------------------------------------------------------


def _get_json(url: str, timeout_s: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - an http(s) URL given by the user
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        hint = " (the server wants a token: the report reads /stats without one)" if exc.code == 401 else ""
        raise ReportError(f"{url}: HTTP {exc.code}{hint}") from exc
    except (OSError, ValueError) as exc:
        raise ReportError(f"{url}: cannot be read ({exc}): is `stabletoolbench-mirror serve` running there?") from exc


def server_requests(stats: dict[str, Any], health: dict[str, Any] | None) -> dict[str, Any]:
    """The report's counts of a running server's ``/stats`` (each request once)."""
    by_source = {k: int(v) for k, v in (stats.get("by_source") or {}).items()}
    outcomes = {name: int(stats.get(name, 0)) for name in OUTCOMES}
    by_category: dict[str, Counter[str]] = defaultdict(Counter)
    by_tool: dict[str, Counter[str]] = defaultdict(Counter)
    for api, counts in (stats.get("by_api") or {}).items():
        for name, n in counts.items():
            if name in OUTCOMES:
                by_category[category_of(api)][name] += int(n)
                by_tool[tool_of(api)][name] += int(n)
    requests = int(stats.get("requests", sum(outcomes.values())))
    simulated = by_source.get("simulated", 0)
    return {
        "requests": requests,
        "outcomes": outcomes,
        "misses": int(stats.get("misses", 0)),
        "answered": answered(outcomes, by_source, list((health or {}).get("responders") or [])),
        "by_source": dict(sorted(by_source.items())),
        "failure_records": int(stats.get("failure_records", 0)),
        "failure_hits": int(stats.get("failure_hits", 0)),
        "retries": int(stats.get("retries", 0)),
        "failures": _sorted_counts({k: int(v) for k, v in (stats.get("failures") or {}).items()}),
        "faults": _sorted_counts({k: int(v) for k, v in (stats.get("faults") or {}).items()}),
        "refusals": _sorted_counts({k: int(v) for k, v in (stats.get("refusals") or {}).items()}),
        "by_category": _nested(by_category),
        "by_tool": _nested(by_tool),
        "simulated_share": round(simulated / requests, 6) if requests else 0.0,
        "simulator_prompt": (health or {}).get("simulator_prompt"),
        "mode": (health or {}).get("mode"),
        "version": (health or {}).get("version"),
    }


def answered(outcomes: dict[str, int], by_source: dict[str, int], responders: list[str]) -> dict[str, int]:
    """Each request once, by what answered it: the frozen cache, the store, a responder, ...

    ``/stats`` counts the source of a store hit and of a new answer alike, so new answers are
    ``real`` or ``simulated`` only when one of them is configured (``/health``'s ``responders``);
    with both they are counted as ``real_or_simulated``.
    """
    frozen = by_source.get("frozen", 0)
    new = sum(outcomes[name] for name in NEW_ANSWERS)
    out = {"frozen_cache": frozen, "store": max(outcomes["hits"] - frozen, 0)}
    named = [r for r in responders if r in ("real", "simulated")]
    if len(set(named)) == 1:
        out[named[0]] = new
    elif new:
        out["real_or_simulated"] = new
    out["local"] = outcomes["local"]
    out["failure"] = outcomes["failed"] + outcomes["unanswered"]
    out["not_served"] = sum(outcomes[name] for name in NOT_SERVED)
    return out


# -- gathering ----------------------------------------------------------------------------------------


def is_server_url(spec: str) -> bool:
    location = spec.partition("#")[0]
    return location.startswith(("http://", "https://")) and not urllib.parse.urlsplit(location).path.endswith(ARCHIVE_SUFFIXES)


def _base(report_source: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "created_by": f"stabletoolbench-mirror {__version__}",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source": report_source,
            "environment": None, "records": None, "requests": None}


def collect(spec: str, settings: Settings, *, timeout_s: float = 30.0, progress: bool = False) -> dict[str, Any]:
    """The report of ``spec`` (see the module docstring), as the JSON object ``--json`` writes."""
    if is_server_url(spec):
        base = spec.rstrip("/").removesuffix("/stats").removesuffix("/virtual")
        report = _base({"kind": "server", "location": base})
        stats = _get_json(base + "/stats", timeout_s)
        health = _get_json(base + "/health", timeout_s)
        report["requests"] = server_requests(stats, health)
        return report
    if is_archive(spec):
        try:
            root = Path(local_tree(spec, settings.resolve(settings.download_dir), progress=progress, limits=ArchiveLimits.of(settings)))
        except ArchiveError as exc:
            raise ReportError(str(exc)) from exc
        return _snapshot_report(root, {"kind": "archive", "location": spec, "unpacked": str(root)})
    if spec != "store" and (Path(spec) / MANIFEST_NAME).is_file():
        return _snapshot_report(Path(spec), {"kind": "snapshot", "location": os.path.abspath(spec)})
    store, where = _open_store(spec, settings)
    with store:
        report = _base({"kind": "store", "location": where, "store": store.kind})
        report["records"] = store_records(store)
    return report


def _snapshot_report(root: Path, report_source: dict[str, Any]) -> dict[str, Any]:
    manifest = read_manifest(root)
    report = _base(report_source)
    report["environment"] = environment(manifest)
    report["records"] = snapshot_records(root, manifest)
    return report


def _no_password(url: str) -> str:
    """``url`` without its user and password (a report is meant to be shared)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")))


def _open_store(spec: str, settings: Settings) -> tuple[Store, str]:
    from stabletoolbench_mirror.factory import build_store
    from stabletoolbench_mirror.stores import DiskcacheStore

    try:
        if spec == "store":
            store = build_store(settings, read_only=True)
            where = _no_password(settings.store.url or "") if settings.store.kind == "redis" else settings.resolve(settings.store.path)
            return store, where
        if spec.startswith(("redis://", "rediss://", "unix://")):
            from stabletoolbench_mirror.stores.redis_store import RedisStore

            url, _, fragment = spec.partition("#")
            prefix = fragment.removeprefix("prefix=") if fragment.startswith("prefix=") else settings.store.prefix
            return RedisStore(url, prefix=prefix, memory_bytes=0), _no_password(spec)
        if (Path(spec) / "cache.db").is_file():
            return DiskcacheStore(spec, read_only=True), os.path.abspath(spec)
    except StoreError as exc:
        raise ReportError(str(exc)) from exc
    raise ReportError(f"{spec}: not a store, a snapshot or a server: give `store` (the configured one), a diskcache folder "
                      f"(with cache.db), redis://HOST:PORT/DB, a snapshot folder (with {MANIFEST_NAME}) or archive (.tar.gz), "
                      "or a running server's http://HOST:PORT")


# -- command line -------------------------------------------------------------------------------------


def _write(path: str, text: str) -> None:
    write_text(path, text)


def summary_lines(report: dict[str, Any]) -> Iterable[str]:
    source = report["source"]
    yield f"source:        {source['kind']} {source['location']}"
    if report["environment"]:
        yield f"content hash:  {report['environment']['content_hash']}"
    if report["records"]:
        records = report["records"]
        yield f"entries:       {records['entries']} (failure records {records['failures']})"
        yield "by source:     " + ", ".join(f"{k} {v}" for k, v in records["by_source"].items())
    if report["requests"]:
        requests = report["requests"]
        yield f"requests:      {requests['requests']}"
        yield "answered by:   " + ", ".join(f"{k} {v}" for k, v in requests["answered"].items() if v)


def cmd_report(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.commands.report_html import render

    if not args.html and not args.json:
        print("error: say where to write the report: --html OUT.html and/or --json OUT.json", file=sys.stderr)
        return 2
    try:
        settings = settings_from_args(args)
        report = collect(args.source, settings, timeout_s=args.timeout, progress=not args.quiet)
    except (ReportError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        _write(args.json, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    if args.html:
        _write(args.html, render(report))
    for line in summary_lines(report):
        print(line)
    for path in (args.html, args.json):
        if path:
            print(f"written:       {path}")
    return 0


def register_report(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="one self-contained HTML page (and JSON) of how a store, snapshot or running server answered",
        description="Report how each call was answered (cache, store, real API, simulator, local tool, failure, fault), "
        "per category and tool, the simulated share by model and prompt, failures, faults, model tokens, the slowest "
        "APIs and a snapshot's content hash. See docs/report.md.",
    )
    parser.add_argument("source", nargs="?", default="store",
                        help="store (default: the configured store), a diskcache folder, redis://..., a snapshot folder, "
                             "a snapshot archive (.tar.gz or a URL to one), or a running server's http://HOST:PORT")
    parser.add_argument("--html", metavar="OUT.html", help="write the page here")
    parser.add_argument("--json", metavar="OUT.json", help="write the figures as JSON here")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a server's /stats (default 30)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_config_arguments(parser)
    parser.set_defaults(func=cmd_report)

