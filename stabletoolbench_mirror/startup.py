"""Start-up checks: what a configuration points at, checked before anything is served.

One set of checks, used by ``serve`` (before it listens), ``warm`` (before it records) and
``doctor`` (the checks alone):

* each frozen cache exists and holds upstream cache files; when it holds none, a folder just
  below or above it that does is suggested (the usual mistake is one level off);
* the simulator has tool docs to work from (a readable ``tools_folder``), unless
  ``simulator.allow_without_docs`` says to simulate without them;
* the real API relay and the simulator endpoints answer (a warning, never fatal: they may
  come up later);
* a summary of what was loaded: config file(s), mode, store, frozen caches with file and
  entry counts, the tools folder with tool and API counts, the endpoints and whether they answered.

Everything here reads folder listings, small files and endpoints' ``/models``; nothing is
imported or evaluated, and no key is ever printed.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .config import UPSTREAM_CONFIG_FILE, Settings
from .protocol import MISS_ERROR
from .secrets import public_url
from .simulator import NO_DOCS_MARK
from .tooldocs import json_files, subfolders, tools_folder_problem
from .upstream_layout import iter_cache_spans

#: the layout of an upstream cache tree, for messages
TREE_LAYOUT = "<Category>/<tool>_for_<Category>/<api>.json"
#: entries of frozen trees are counted (by parsing their files) only up to this many bytes in total
COUNT_ENTRIES_MAX_BYTES = 16 * 1024 * 1024
#: APIs of a tools folder are counted (by parsing the tool docs) only up to this many tool files
COUNT_APIS_MAX_TOOLS = 5000
#: folder entries a search for a nearby tree may look at (a hint must stay cheap)
NEAR_SEARCH_BUDGET = 20_000
"""Appended to the origin of records simulated without any tool doc (``simulator.allow_without_docs``)."""


@dataclass(frozen=True)
class Finding:
    """One problem: ``error`` stops the start, ``warning`` is printed."""

    level: str
    key: str
    """The configuration key it is about."""
    message: str

    def line(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


@dataclass
class StartupReport:
    """The summary lines (label, text) and the findings of one run of the checks."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    store_entries: int | None = None
    """Entries of the store when it was opened (or 0 when it does not exist yet), else ``None``."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    def add(self, label: str, text: str) -> None:
        self.lines.append((label, text))

    def error(self, key: str, message: str) -> None:
        self.findings.append(Finding("error", key, message))

    def warning(self, key: str, message: str) -> None:
        self.findings.append(Finding("warning", key, message))

    def render(self, title: str = "stabletoolbench-mirror") -> str:
        width = max((len(label) for label, _ in self.lines), default=0) + 1
        out = [title]
        out += [f"  {label + ':':<{width}} {text}" for label, text in self.lines]
        out += [f.line() for f in self.findings]
        return "\n".join(out)


# -- frozen caches ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeCount:
    """What an upstream ``tool_response_cache`` tree holds (from its listing; entries optional)."""

    categories: int = 0
    tools: int = 0
    files: int = 0
    bytes: int = 0
    entries: int | None = None
    """Entries over all files, or ``None`` when not counted (a large tree)."""
    unreadable: tuple[str, ...] = ()
    """Files that could not be parsed while counting entries."""


def _tool_dirs(root: Path | str, follow: bool = False) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """``(category, tool folder)`` of every tool folder laid out as upstream's: ``<tool>_for_<category>``."""
    for category in subfolders(root, follow):
        suffix = f"_for_{category.name}"
        for tool in subfolders(category.path, follow):
            if tool.name.endswith(suffix):
                yield category.name, tool


def count_tree(root: str | os.PathLike[str], *, count_entries: bool | None = None, follow_symlinks: bool = False) -> TreeCount:
    """Count a tree's API files from its listing; its entries too when it is small (or when asked).

    Entries are counted with the frozen cache's own reader, so a file it would refuse (not a JSON
    object, nested too deeply, a lone surrogate) is listed as unreadable here too.
    """
    categories: set[str] = set()
    tools = files = size = 0
    paths: list[str] = []
    for category, tool in _tool_dirs(root, follow_symlinks):
        api_files = json_files(tool.path, follow_symlinks)
        if not api_files:
            continue
        categories.add(category)
        tools += 1
        files += len(api_files)
        for entry in api_files:
            try:
                size += entry.stat(follow_symlinks=follow_symlinks).st_size
            except OSError:
                pass
            paths.append(entry.path)
    if count_entries is None:
        count_entries = size <= COUNT_ENTRIES_MAX_BYTES
    entries: int | None = None
    unreadable: list[str] = []
    if count_entries:
        entries = 0
        for path in paths:
            try:
                with open(path, encoding="utf-8") as fh:
                    entries += sum(1 for _ in iter_cache_spans(fh.read(), path, bodies=False))
            except (OSError, ValueError, RecursionError, MemoryError):
                unreadable.append(path)
    return TreeCount(len(categories), tools, files, size, entries, tuple(unreadable))


def looks_like_tree(path: str | os.PathLike[str], budget: list[int] | None = None, *, follow_symlinks: bool = False) -> bool:
    """Whether ``path`` holds at least one upstream cache file (stops at the first one found)."""
    budget = budget if budget is not None else [NEAR_SEARCH_BUDGET]
    for category in subfolders(path, follow_symlinks):
        budget[0] -= 1
        if budget[0] <= 0:
            return False
        suffix = f"_for_{category.name}"
        for tool in subfolders(category.path, follow_symlinks):
            budget[0] -= 1
            if budget[0] <= 0:
                return False
            if tool.name.endswith(suffix) and json_files(tool.path, follow_symlinks):
                return True
    return False


def nearby_tree(path: str | os.PathLike[str]) -> tuple[str, Path] | None:
    """A folder just below (one or two levels) or above (one or two levels) ``path`` that is a cache tree.

    ``("below", folder)``, ``("above", folder)`` or ``("beside it", folder)``; a folder named
    ``tool_response_cache`` is preferred.
    """
    base = Path(path)
    budget = [NEAR_SEARCH_BUDGET]
    children = sorted(subfolders(base), key=lambda e: (e.name != "tool_response_cache", e.name))
    for child in children:
        if looks_like_tree(child.path, budget):
            return "below", Path(child.path)
    for child in children:
        for grandchild in sorted(subfolders(child.path), key=lambda e: (e.name != "tool_response_cache", e.name)):
            if looks_like_tree(grandchild.path, budget):
                return "below", Path(grandchild.path)
            if budget[0] <= 0:
                return None
    for parent in (base.parent, base.parent.parent):
        if parent != base and looks_like_tree(parent, budget):
            return "above", parent
    # e.g. the tools folder given instead of the cache tree beside it
    for sibling in sorted(subfolders(base.parent), key=lambda e: (e.name != "tool_response_cache", e.name)):
        if Path(sibling.path) != base and looks_like_tree(sibling.path, budget):
            return "beside it", Path(sibling.path)
        if budget[0] <= 0:
            break
    return None


def frozen_cache_problem(path: str | os.PathLike[str], *, follow_symlinks: bool = False) -> str | None:
    """Why ``path`` cannot be a frozen cache (with a hint where one is near), or ``None``.

    Used at start for every frozen cache and by ``cache import``.
    """
    p = Path(path)
    if not p.exists():
        # a path relative to the wrong folder: look below the nearest folder that exists
        existing = next((a for a in p.parents if a.is_dir()), None)
        if existing is not None and looks_like_tree(existing):
            return f"{p} does not exist; {existing} above it looks like a tool_response_cache tree: use that path"
        near = nearby_tree(existing) if existing is not None and existing != Path(existing.anchor) else None
        if near is not None and near[0] == "below":
            return f"{p} does not exist; {near[1]} looks like a tool_response_cache tree: use that path"
        return f"{p} does not exist"
    if not p.is_dir():
        return f"{p} is not a folder"
    if looks_like_tree(p, follow_symlinks=follow_symlinks):
        return None
    message = f"{p} has no cache files ({TREE_LAYOUT})"
    near = nearby_tree(p)
    if near is None:
        return message + ", nor has any folder just below or above it"
    where, folder = near
    return f"{message}; the folder {where}, {folder}, looks like a tool_response_cache tree: use that path"


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def _describe_tree(count: TreeCount) -> str:
    entries = _n(count.entries, "entry", "entries") if count.entries is not None else f"entries not counted ({count.bytes / 1e6:,.0f} MB)"
    return f"{_n(count.files, 'file')}, {_n(count.tools, 'tool')}, {_n(count.categories, 'category', 'categories')}, {entries}"


def check_frozen_caches(settings: Settings, report: StartupReport, *, count_entries: bool | None = None) -> None:
    if not settings.frozen_caches:
        report.add("frozen caches", "none")
    for i, configured in enumerate(settings.frozen_caches):
        path = settings.resolve(configured)
        key = f"frozen_caches[{i}]"
        problem = frozen_cache_problem(path, follow_symlinks=settings.allow_symlinks)
        if problem is not None:
            report.add(f"frozen cache {i}", f"{path}: NOT USABLE")
            report.error(key, problem)
            continue
        count = count_tree(path, count_entries=count_entries, follow_symlinks=settings.allow_symlinks)
        report.add(f"frozen cache {i}", f"{path}: {_describe_tree(count)}")
        if count.unreadable:
            shown = ", ".join(count.unreadable[:3]) + (" ..." if len(count.unreadable) > 3 else "")
            report.warning(key, f"{len(count.unreadable)} cache files cannot be read and are skipped: {shown}")


# -- the tools folder ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolsCount:
    categories: int = 0
    tools: int = 0
    apis: int | None = None
    """APIs over all tool docs, or ``None`` when not counted (a large folder)."""
    unreadable: tuple[str, ...] = ()


def count_tools(root: str | os.PathLike[str], *, count_apis: bool | None = None) -> ToolsCount:
    """Count the tool docs of a ToolBench tools folder (``<Category>/<tool>.json``); APIs when small or asked."""
    categories = 0
    paths: list[str] = []
    for category in subfolders(root):
        found = json_files(category.path)
        if found:
            categories += 1
            paths += [e.path for e in found]
    if count_apis is None:
        count_apis = len(paths) <= COUNT_APIS_MAX_TOOLS
    apis: int | None = None
    unreadable: list[str] = []
    if count_apis:
        apis = 0
        for path in paths:
            try:
                with open(path, "rb") as fh:
                    data = json.loads(fh.read())
                api_list = data.get("api_list") if isinstance(data, dict) else None
            except (OSError, ValueError, RecursionError, MemoryError):
                api_list = None
            if not isinstance(api_list, list):
                unreadable.append(path)
                continue
            apis += len(api_list)
    return ToolsCount(categories, len(paths), apis, tuple(unreadable))


def check_tools_folder(settings: Settings, report: StartupReport, *, count_apis: bool | None = None) -> None:
    problem = tools_folder_problem(settings)
    sim = settings.simulator
    if problem is None:
        assert settings.tools_folder
        path = settings.resolve(settings.tools_folder)
        count = count_tools(path, count_apis=count_apis)
        apis = _n(count.apis, "API") if count.apis is not None else "APIs not counted (a large folder)"
        report.add("tools folder", f"{path}: {_n(count.tools, 'tool')}, {apis}, {_n(count.categories, 'category', 'categories')}")
        if count.unreadable:
            shown = ", ".join(count.unreadable[:3]) + (" ..." if len(count.unreadable) > 3 else "")
            report.warning("tools_folder", f"{len(count.unreadable)} tool docs cannot be read: {shown}")
        return
    report.add("tools folder", problem if settings.tools_folder else "none")
    if sim.enabled and not sim.allow_without_docs:
        what = "is not set" if not settings.tools_folder else f"gives no tool docs: {problem}"
        report.error(
            "tools_folder",
            f"{what}, but simulator.enabled is true: the simulator would answer without any API doc and those "
            "answers would be recorded for good. Set tools_folder to a ToolBench tools folder (<Category>/<tool>.json), "
            f"or set simulator.allow_without_docs: true to simulate anyway (their records are marked '{NO_DOCS_MARK.strip()}')",
        )
    elif sim.enabled:
        report.warning(
            "simulator.allow_without_docs",
            f"simulating without tool docs (tools_folder {problem}): answers are made from the names alone; "
            f"their records' origin ends with '{NO_DOCS_MARK}'",
        )
    elif settings.tools_folder:
        needed = settings.real.enabled and settings.real.backend == "rapidapi"
        report.warning("tools_folder", problem + ("; real.backend 'rapidapi' builds every call from its tool doc" if needed else ""))


# -- endpoints -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """Whether an endpoint answered an HTTP request."""

    url: str
    """Shown without user info or query string."""
    answered: bool
    status: int | None = None
    detail: str = ""
    models: tuple[str, ...] | None = None
    """For a simulator endpoint: the models its ``/models`` lists, when it does."""

    def describe(self) -> str:
        if not self.answered:
            return f"{self.url}: NOT ANSWERING ({self.detail})"
        return f"{self.url}: answered (HTTP {self.status}{', ' + self.detail if self.detail else ''})"


def _cause(exc: BaseException) -> str:
    """A short, stable cause for a failed request: ``connection refused``, ``no answer within 2 s``, ..."""
    import requests

    if isinstance(exc, requests.Timeout):
        return "timed out"
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror.lower()
        if isinstance(current, BaseException):
            stack += [current.__cause__, current.__context__, *[a for a in current.args if isinstance(a, BaseException)]]
            reason = getattr(current, "reason", None)
            if isinstance(reason, BaseException):
                stack.append(reason)
    text = str(exc)
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "host name not found"
    if "refused" in text.lower():
        return "connection refused"
    return f"{type(exc).__name__}: {text[:200]}"


def probe(url: str, *, timeout_s: float = 3.0, headers: dict[str, str] | None = None) -> tuple[Probe, Any]:
    """GET ``url``: any HTTP answer counts as answered.  Returns the probe and the parsed JSON body (or ``None``)."""
    import requests

    shown = public_url(url)
    try:
        response = requests.get(url, timeout=(timeout_s, timeout_s), headers=headers or {}, allow_redirects=False, stream=True)
    except requests.RequestException as exc:
        return Probe(shown, False, detail=_cause(exc)), None
    try:
        raw = response.raw.read(1024 * 1024, decode_content=True) if response.status_code == 200 else b""
    except Exception:  # noqa: BLE001 - a broken body still proves the endpoint answers
        raw = b""
    finally:
        response.close()
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        body = None
    return Probe(shown, True, response.status_code), body


def probe_simulator(api_base: str, model: str, api_key: str | None, timeout_s: float) -> Probe:
    """``GET <api_base>/models`` of an OpenAI-compatible endpoint; notes whether ``model`` is listed."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    result, body = probe(api_base.rstrip("/") + "/models", timeout_s=timeout_s, headers=headers)
    if not result.answered:
        return Probe(public_url(api_base), False, detail=result.detail)
    models: tuple[str, ...] | None = None
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        models = tuple(str(m.get("id")) for m in body["data"] if isinstance(m, dict) and m.get("id") is not None)
    detail = ""
    if result.status in (401, 403):
        detail = "refused: check simulator.api_key"
    elif models is not None:
        detail = f"serves '{model}'" if model in models else f"does not list '{model}'"
    return Probe(public_url(api_base), True, result.status, detail, models)


def _probe_timeout(configured: float) -> float:
    return max(0.2, min(configured, 3.0))


def check_endpoints(settings: Settings, report: StartupReport, *, probe_endpoints: bool = True) -> dict[str, Probe]:
    """Probe the relay and the simulator endpoints (all at once); warnings for those that do not answer."""
    real, sim = settings.real, settings.simulator
    jobs: dict[str, Any] = {}
    if real.enabled:
        if real.backend == "relay":
            if not real.relay_url:
                report.error("real.relay_url", "not set, but real.enabled is true with backend 'relay': set the ToolBench relay URL (upstream toolbench_url)")
            elif probe_endpoints:
                jobs["real"] = lambda: probe(real.relay_url or "", timeout_s=_probe_timeout(real.connect_timeout_s))[0]
        elif real.rapidapi_base_url and probe_endpoints:
            jobs["real"] = lambda: probe(real.rapidapi_base_url or "", timeout_s=_probe_timeout(real.connect_timeout_s))[0]
    if sim.enabled and probe_endpoints:
        key = sim.api_key.get_secret_value() if sim.api_key is not None else None
        for i, endpoint in enumerate(sim.endpoints):
            jobs[f"simulator{i}"] = (lambda e=endpoint: probe_simulator(e, sim.model, key, _probe_timeout(sim.connect_timeout_s)))
    results: dict[str, Probe] = {}
    if jobs:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            futures = {name: pool.submit(job) for name, job in jobs.items()}
            results = {name: f.result() for name, f in futures.items()}
    # the real API
    if not real.enabled:
        report.add("real API", "off")
    elif real.backend == "relay":
        found = results.get("real")
        report.add("real API", f"relay {found.describe() if found else public_url(real.relay_url or '') + ' (not checked)'}")
        if found is not None and not found.answered:
            report.warning("real.relay_url", f"{found.url} does not answer ({found.detail}): real calls will fail and fall through to the simulator")
    else:
        found = results.get("real")
        where = found.describe() if found else "each API's own host (not checked)"
        report.add("real API", f"rapidapi, {where}")
        if found is not None and not found.answered:
            report.warning("real.rapidapi_base_url", f"{found.url} does not answer ({found.detail}): real calls will fail")
    # the simulator
    if not sim.enabled:
        report.add("simulator", "off")
        return results
    report.add("simulator", f"{sim.style}, model '{sim.model}'")
    if settings.style_source:
        report.add("simulator style", settings.style_source)
    check_system_prompt(settings, report)
    for i, endpoint in enumerate(sim.endpoints):
        found = results.get(f"simulator{i}")
        label = f"simulator endpoint {i}" if len(sim.endpoints) > 1 else "simulator endpoint"
        report.add(label, found.describe() if found else f"{public_url(endpoint)} (not checked)")
        if found is None:
            continue
        key = "simulator.api_base"
        if not found.answered:
            report.warning(key, f"{found.url} does not answer ({found.detail}): simulated calls will fail until it does")
        elif found.status in (401, 403):
            report.warning("simulator.api_key", f"{found.url} refused the request (HTTP {found.status}): check simulator.api_key (STM_SIMULATOR__API_KEY)")
        elif found.models is not None and sim.model not in found.models:
            listed = ", ".join(found.models[:5]) or "none"
            report.warning("simulator.model", f"'{sim.model}' is not among the models {found.url} serves ({listed}): set simulator.model")
    return results


def check_system_prompt(settings: Settings, report: StartupReport) -> None:
    """The simulator's system prompt: where it comes from, or why ``simulator.system_prompt_file`` cannot give it."""
    from .config import ConfigError
    from .simulator import system_prompt_for

    key = "simulator.system_prompt_file"
    try:
        prompt = system_prompt_for(settings)
    except ConfigError as exc:
        report.add("simulator prompt", "NOT USABLE")
        report.error(key, str(exc).removeprefix(f"{key}: "))
        return
    report.add("simulator prompt", f"{prompt.source} (sha256 {prompt.sha256[:12]})")


# -- the whole report ------------------------------------------------------------------------------


def check_store(settings: Settings, report: StartupReport, *, open_store: bool) -> None:
    cfg = settings.store
    where = settings.resolve(cfg.path) if cfg.kind == "diskcache" else public_url(cfg.url or "") + f" (prefix '{cfg.prefix}')"
    if not open_store:
        report.add("store", f"{cfg.kind} at {where}")
        return
    from .config import ConfigError
    from .factory import build_store
    from .stores import StoreError

    if cfg.kind == "diskcache" and not Path(where).exists():
        # a check changes nothing: the store is created by the first serve or warm
        parent = next((p for p in Path(where).parents if p.exists()), None)
        if parent is None or not os.access(parent, os.W_OK | os.X_OK):
            report.add("store", f"diskcache at {where}: NOT USABLE")
            report.error("store.path", f"{where} does not exist and cannot be created under {parent}")
        else:
            report.add("store", f"diskcache at {where}: does not exist yet (created at the first start)")
            report.store_entries = 0
        return
    try:
        with build_store(settings) as store:
            store.get("Check/doctor_for_Check/read", "{}")
            entries = len(store)
    except (StoreError, ConfigError, OSError) as exc:
        report.add("store", f"{cfg.kind} at {where}: NOT USABLE")
        report.error("store", f"cannot be opened: {exc}")
        return
    report.add("store", f"{cfg.kind} at {where}: {entries:,} entries")
    report.store_entries = entries


def check_anything_answers(settings: Settings, report: StartupReport, *, doctor: bool, simulator_launched: bool = False) -> None:
    """Nothing can answer: the store is empty, no frozen cache is usable, and nothing fills a miss
    (replay mode, or record mode with neither the real API nor the simulator), and no local tools:
    every call a miss.

    ``doctor`` reports it as an error, ``serve`` and ``warm`` as a warning (they start anyway).
    Record mode with no responder but something cached says so in the ``mode`` line.
    """
    fills = settings.real.enabled or settings.simulator.enabled or simulator_launched
    if settings.mode == "record" and not fills:
        note = " (neither real.enabled nor simulator.enabled: misses are not filled)"
        report.lines = [(label, text + note if label == "mode" else text) for label, text in report.lines]
    if settings.mode == "record" and fills:
        return
    bad_frozen = {f.key for f in report.errors if f.key.startswith("frozen_caches[")}
    if len(settings.frozen_caches) > len(bad_frozen) or settings.local_tools:
        return  # local tools answer their own calls
    entries = report.store_entries
    if entries is None:
        entries = _store_entries(settings)
    if entries != 0:
        return
    frozen = "no frozen cache is usable" if settings.frozen_caches else "no frozen cache is configured (frozen_caches)"
    if settings.mode == "replay":
        what = "replay mode with nothing to replay"
        fix = "or set mode: record with the real API or the simulator enabled"
    else:
        what = "record mode with nothing to answer a miss (neither real.enabled nor simulator.enabled) and nothing recorded"
        fix = "or enable the real API (real.enabled, upstream's toolbench_url) or the simulator (simulator.enabled)"
    (report.error if doctor else report.warning)(
        "mode",
        f"{what}: the store is empty and {frozen}, so every call will be a miss, answered '{MISS_ERROR}'. "
        f"Point frozen_caches at a tool_response_cache tree (upstream cache_folder) or store.path at a recorded store, {fix}",
    )


def _store_entries(settings: Settings) -> int | None:
    """The store's entry count (0 when a diskcache folder does not exist yet), or ``None`` when it cannot be opened."""
    from .config import ConfigError
    from .factory import build_store
    from .stores import StoreError

    cfg = settings.store
    if cfg.kind == "diskcache" and not Path(settings.resolve(cfg.path)).exists():
        return 0
    try:
        with build_store(settings) as store:
            return len(store)
    except (StoreError, ConfigError, OSError):
        return None


def inspect(
    settings: Settings,
    *,
    probe_endpoints: bool = True,
    open_store: bool = False,
    full_counts: bool = False,
    simulator_launched: bool = False,
) -> StartupReport:
    """Run every check on ``settings``: the summary lines and the problems found.

    ``open_store`` opens the store and counts its entries (``doctor``; ``serve`` opens it anyway);
    ``full_counts`` counts entries and APIs however large the trees are (both ``doctor``, where
    nothing answering is an error); ``simulator_launched``: ``serve --launch-vllm`` starts one.
    """
    report = StartupReport()
    report.add("config", settings.config_source)
    unused = f"./{UPSTREAM_CONFIG_FILE} not used:"
    if unused in settings.config_source:
        report.warning("config", settings.config_source[settings.config_source.index(unused) : -1])
    mode = settings.mode + ("" if settings.save else " (save: false, nothing is recorded)")
    report.add("mode", mode)
    check_store(settings, report, open_store=open_store)
    check_frozen_caches(settings, report, count_entries=True if full_counts else None)
    check_tools_folder(settings, report, count_apis=True if full_counts else None)
    check_endpoints(settings, report, probe_endpoints=probe_endpoints)
    check_local_tools(settings, report)
    check_anything_answers(settings, report, doctor=open_store and full_counts, simulator_launched=simulator_launched)
    if settings.log_file:
        path = Path(settings.resolve(settings.log_file))
        report.add("log file", str(path))
        writable = os.access(path, os.W_OK) if path.exists() else path.parent.is_dir() and os.access(path.parent, os.W_OK | os.X_OK)
        if not writable or path.is_dir():
            report.error("log_file", f"{path} cannot be written: check the folder exists and is writable")
    return report


def check_local_tools(settings: Settings, report: StartupReport) -> None:
    """The ``local_tools`` files: listed, and each one present (they are imported when the layer is built)."""
    if not settings.local_tools:
        return
    paths = [Path(settings.resolve(p)) for p in settings.local_tools]
    report.add("local tools", f"{', '.join(str(p) for p in paths)} (timeout {settings.local_tools_timeout_s:g} s)")
    for path in paths:
        if not path.is_file():
            report.error("local_tools", f"{path}: no such file")
        elif path.suffix != ".py":
            report.error("local_tools", f"{path}: not a .py file")


def print_report(report: StartupReport, stream: Any = None) -> None:
    print(report.render(), file=stream or sys.stderr, flush=True)


def start_checks(settings: Settings, *, probe_endpoints: bool = True, simulator_launched: bool = False) -> bool:
    """The checks ``serve`` and ``warm`` run before they start: print the summary; ``False`` on an error."""
    from .logs import to_log_file

    report = inspect(settings, probe_endpoints=probe_endpoints, simulator_launched=simulator_launched)
    print_report(report)
    to_log_file(report.render())
    if report.errors:
        print(f"not starting: {len(report.errors)} configuration error(s) above", file=sys.stderr, flush=True)
        return False
    return True


# -- doctor ----------------------------------------------------------------------------------------


def cmd_doctor(args: Any) -> int:
    """``stabletoolbench-mirror doctor``: every start-up check, without serving; exit 1 on any error."""
    from .cli_common import settings_from_args

    settings = settings_from_args(args)
    if args.keys:
        return _doctor_keys(settings)
    report = inspect(settings, probe_endpoints=not args.no_probe, open_store=True, full_counts=True)
    print(report.render("stabletoolbench-mirror doctor"))
    if report.errors:
        print(f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)")
        return 1
    print(f"no errors, {len(report.warnings)} warning(s)")
    return 0


def register(sub: Any) -> None:
    from .cli_common import add_config_arguments

    parser = sub.add_parser(
        "doctor",
        help="check a configuration without serving (paths, tool docs, store, endpoints)",
        description="Run every start-up check: frozen caches (with a hint when a path is one level off), the tools "
        "folder, the store, the real API relay and the simulator endpoints. Exit status 1 on any error.",
    )
    add_config_arguments(parser)
    parser.add_argument("--no-probe", action="store_true", help="do not contact the relay or the simulator")
    parser.add_argument(
        "--keys", action="store_true",
        help="scan the store once for records a string input wrote under another kind's key (exit 1 when any)",
    )
    parser.set_defaults(func=cmd_doctor)


def _doctor_keys(settings: Settings) -> int:
    from .factory import build_store
    from .key_report import planted_records, render

    with build_store(settings) as store:
        found = list(planted_records(store, progress=sys.stderr.isatty()))
    print(render(found))
    return 1 if found else 0
