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
imported or evaluated, and no key is ever printed.  What a tree or a tools folder holds is read by
:mod:`stabletoolbench_mirror.upstream.trees`, the endpoints are probed by :mod:`.probes`; this module writes the report.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.config import UPSTREAM_CONFIG_FILE, ConfigError, Settings
from stabletoolbench_mirror.core.protocol import MISS_ERROR
from stabletoolbench_mirror.core.secrets import public_url
from stabletoolbench_mirror.responders.simulator import NO_DOCS_MARK
from stabletoolbench_mirror.startup.probes import StartupReport, check_endpoints
from stabletoolbench_mirror.stores.kinds import StoreSpec
from stabletoolbench_mirror.upstream.tooldocs import tools_folder_problem
from stabletoolbench_mirror.upstream.trees import TreeCount, count_tools, count_tree, frozen_cache_problem

# -- frozen caches ---------------------------------------------------------------------------------


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def _describe_tree(count: TreeCount) -> str:
    """``3 files, 1 tool, 1 category, 2 models, 14 entries (12 model calls)``: a snapshot's model calls counted too."""
    entries = _n(count.entries, "entry", "entries") if count.entries is not None else f"entries not counted ({count.bytes / 1e6:,.0f} MB)"
    if count.model_entries:
        entries += f" ({_n(count.model_entries, 'model call')})"
    models = f", {_n(count.models, 'model')}" if count.models else ""
    return f"{_n(count.files, 'file')}, {_n(count.tools, 'tool')}, {_n(count.categories, 'category', 'categories')}{models}, {entries}"


def check_frozen_caches(settings: Settings, report: StartupReport, *, count_entries: bool | None = None) -> None:
    if not settings.frozen_caches:
        report.add("frozen caches", "none")
    from stabletoolbench_mirror.upstream.archives import ArchiveError, frozen_folder

    for i, configured in enumerate(settings.frozen_caches):
        key = f"frozen_caches[{i}]"
        try:
            path = frozen_folder(settings, configured)  # an archive or URL: fetched and checked now
        except ArchiveError as exc:
            report.add(f"frozen cache {i}", f"{configured}: NOT USABLE")
            report.error(key, str(exc))
            continue
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


def check_tools_folder(settings: Settings, report: StartupReport, *, count_apis: bool | None = None) -> None:
    problem = tools_folder_problem(settings)
    sim = settings.simulator
    simulating = sim.enabled and settings.mode != "replay"  # a replay never asks the simulator
    if problem is None:
        _count_tool_docs(settings, report, count_apis)
        return
    if settings.apibank is not None and not settings.tools_folder:
        report.add("tools folder", "none: the simulator has API-Bank's tool docs only")
        return
    report.add("tools folder", problem if settings.tools_folder else "none")
    _no_tool_docs(settings, report, problem, simulating)


def _count_tool_docs(settings: Settings, report: StartupReport, count_apis: bool | None) -> None:
    """The tools folder's line: its tools, APIs and categories (and a warning for the docs that cannot be read)."""
    assert settings.tools_folder
    path = settings.resolve(settings.tools_folder)
    count = count_tools(path, count_apis=count_apis)
    apis = _n(count.apis, "API") if count.apis is not None else "APIs not counted (a large folder)"
    report.add("tools folder", f"{path}: {_n(count.tools, 'tool')}, {apis}, {_n(count.categories, 'category', 'categories')}")
    if count.unreadable:
        shown = ", ".join(count.unreadable[:3]) + (" ..." if len(count.unreadable) > 3 else "")
        report.warning("tools_folder", f"{len(count.unreadable)} tool docs cannot be read: {shown}")


def _no_tool_docs(settings: Settings, report: StartupReport, problem: str, simulating: bool) -> None:
    """No tool docs: an error when the simulator would answer without them, else a warning."""
    sim = settings.simulator
    if simulating and not sim.allow_without_docs:
        what = "is not set" if not settings.tools_folder else f"gives no tool docs: {problem}"
        report.error(
            "tools_folder",
            f"{what}, but simulator.enabled is true: the simulator would answer without any API doc and those "
            "answers would be recorded for good. Set tools_folder to a ToolBench tools folder (<Category>/<tool>.json), "
            f"or set simulator.allow_without_docs: true to simulate anyway (their records are marked '{NO_DOCS_MARK.strip()}')",
        )
    elif simulating:
        report.warning(
            "simulator.allow_without_docs",
            f"simulating without tool docs (tools_folder {problem}): answers are made from the names alone; "
            f"their records' origin ends with '{NO_DOCS_MARK}'",
        )
    elif settings.tools_folder:
        needed = settings.real.enabled and settings.real.backend == "rapidapi" and settings.mode != "replay"
        report.warning("tools_folder", problem + ("; real.backend 'rapidapi' builds every call from its tool doc" if needed else ""))


# -- the whole report ------------------------------------------------------------------------------


def check_store(settings: Settings, report: StartupReport, *, open_store: bool) -> None:
    spec = StoreSpec.of(settings)
    if not open_store:
        report.add("store", f"{spec.kind} at {spec.where}")
        return
    from stabletoolbench_mirror.config import ConfigError
    from stabletoolbench_mirror.factory import build_store
    from stabletoolbench_mirror.stores import StoreError

    where = spec.where
    if spec.backend.folder and not Path(where).exists():
        # a check changes nothing: the store is created by the first serve or warm
        parent = next((p for p in Path(where).parents if p.exists()), None)
        if parent is None or not os.access(parent, os.W_OK | os.X_OK):
            report.add("store", f"{spec.kind} at {where}: NOT USABLE")
            report.error("store.path", f"{where} does not exist and cannot be created under {parent}")
        else:
            report.add("store", f"{spec.kind} at {where}: does not exist yet (created at the first start)")
            report.store_entries = 0
        return
    try:
        with build_store(settings) as store:
            store.get("Check/doctor_for_Check/read", "{}")
            entries = len(store)
    except (StoreError, ConfigError, OSError) as exc:
        report.add("store", f"{spec.kind} at {where}: NOT USABLE")
        report.error("store", f"cannot be opened: {exc}")
        return
    report.add("store", f"{spec.kind} at {where}: {entries:,} entries")
    report.store_entries = entries


def check_anything_answers(settings: Settings, report: StartupReport, *, doctor: bool, simulator_launched: bool = False) -> None:
    """Nothing can answer: the store is empty, no frozen cache is usable, and nothing fills a miss
    (replay mode, or record mode with neither the real API nor the simulator), and no local tools:
    every call a miss.

    An error for ``doctor``; ``serve`` and ``warm`` warn and start (another process may fill the store
    while a server runs: ``cache import``, ``warm``, a server recording into the same Redis).
    A server of model calls (``llm.upstreams`` in a mode that asks them) is no mistake: a warning.
    When no config file was found (``serve`` run outside the folder of its config, the store then a new,
    empty one in the current folder), the message says so and names the config to pass.
    Record mode with no responder but something cached says so in the ``mode`` line.
    """
    fills = settings.real.enabled or settings.simulator.enabled or simulator_launched
    if settings.mode in ("record", "refresh") and not fills:
        note = " (neither real.enabled nor simulator.enabled: misses are not filled)"
        report.lines = [(label, text + note if label == "mode" else text) for label, text in report.lines]
    if (settings.mode in ("record", "refresh") and fills) or _something_cached(settings, report):
        return
    # a server of model calls only (llm.upstreams: the judge re-scoring answers) is no mistake: said, not refused
    model_calls = bool(settings.llm.upstreams) and (settings.llm.mode or settings.mode) != "replay"
    refuse = doctor and not model_calls
    (report.error if refuse else report.warning)("mode", _nothing_answers(settings))


def _something_cached(settings: Settings, report: StartupReport) -> bool:
    """A usable frozen cache, local tools (they answer their own calls) or a store that is not empty."""
    bad_frozen = {f.key for f in report.errors if f.key.startswith("frozen_caches[")}
    if len(settings.frozen_caches) > len(bad_frozen) or settings.local_tools or settings.apibank:
        return True
    entries = report.store_entries
    if entries is None:
        entries = _store_entries(settings)
    return entries != 0


def _nothing_answers(settings: Settings) -> str:
    """What :func:`check_anything_answers` says: why every call will be a miss, and the fixes."""
    frozen = "no frozen cache is usable" if settings.frozen_caches else "no frozen cache is configured (frozen_caches)"
    if settings.mode == "replay":
        what = "replay mode with nothing to replay"
        fix = "or set mode: record with the real API or the simulator enabled"
    else:
        what = "record mode with nothing to answer a miss (neither real.enabled nor simulator.enabled) and nothing recorded"
        fix = "or enable the real API (real.enabled, upstream's toolbench_url) or the simulator (simulator.enabled)"
    return (f"{_no_config_found(settings)}{what}: the store is empty and {frozen}, so every call will be a miss, answered "
            f"'{MISS_ERROR}'. Point frozen_caches at a tool_response_cache tree (upstream cache_folder) or store.path at a "
            f"recorded store, {fix}")


def _no_config_found(settings: Settings) -> str:
    """When no config file was found: what was used instead, and the config to pass (the demo's, run from a
    checkout); else ``""``."""
    from stabletoolbench_mirror.config import NO_CONFIG_FILE, demo_config_file

    if not (settings.config_source.startswith("defaults") and f"({NO_CONFIG_FILE} in " in settings.config_source):
        return ""
    demo = demo_config_file()
    where = f"pass --config FILE (the demo caches: --config {demo})" if demo is not None else "pass --config FILE"
    return (f"no config file was found in {settings.base_dir} ({NO_CONFIG_FILE}): the built-in defaults were used, so the "
            f"store is {settings.resolve(settings.store.path)}, in this folder, and no frozen cache is served; run from the "
            f"folder of your config or {where}. ")


def _store_entries(settings: Settings) -> int | None:
    """The store's entry count (0 when a diskcache folder does not exist yet), or ``None`` when it cannot be opened."""
    from stabletoolbench_mirror.config import ConfigError
    from stabletoolbench_mirror.factory import build_store
    from stabletoolbench_mirror.stores import StoreError

    spec = StoreSpec.of(settings)
    if spec.backend.folder and not Path(spec.path).exists():
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
    doctor = open_store and full_counts
    report.add("config", settings.config_source)
    unused = f"./{UPSTREAM_CONFIG_FILE} not used:"
    if unused in settings.config_source:
        report.warning("config", settings.config_source[settings.config_source.index(unused) : -1])
    mode = settings.mode + ("" if settings.save else " (save: false, nothing is recorded)")
    report.add("mode", mode)
    check_store(settings, report, open_store=open_store)
    check_frozen_caches(settings, report, count_entries=True if full_counts else None)
    check_tools_folder(settings, report, count_apis=True if full_counts else None)
    check_endpoints(settings, report, probe_endpoints=probe_endpoints, doctor=doctor)
    check_local_tools(settings, report)
    check_faults(settings, report)
    check_trusted_proxies(settings, report)
    check_apibank(settings, report)
    check_model_calls(settings, report)
    check_anything_answers(settings, report, doctor=doctor, simulator_launched=simulator_launched)
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
    report.add("local tools", f"{', '.join(str(p) for p in paths)} (timeout {settings.local_tools_timeout_s:g} s; "
                              "their code runs in this process: name only files you trust)")
    for path in paths:
        if not path.is_file():
            report.error("local_tools", f"{path}: no such file")
        elif path.suffix != ".py":
            report.error("local_tools", f"{path}: not a .py file")


def check_faults(settings: Settings, report: StartupReport) -> None:
    """``faults:``: one line saying which faults are served (only when they are on)."""
    from stabletoolbench_mirror.engine.faults import FaultPlan

    plan = FaultPlan.from_config(settings.faults)
    if plan is not None:
        report.add("faults", plan.describe())
def check_model_calls(settings: Settings, report: StartupReport) -> None:
    """``llm:``: the recorded model calls at ``/v1``, one line (only when configured), and what cannot work."""
    llm = settings.llm
    if not llm.upstreams and llm.mode is None and llm.run is None:
        return
    mode = llm.mode or settings.mode
    upstreams = "; ".join(
        f"{public_url(u.base_url)} for {', '.join(u.models)} (key: ${u.api_key_env})" if u.api_key_env
        else f"{public_url(u.base_url)} for {', '.join(u.models)} (key: the client's)" for u in llm.upstreams)
    if mode == "replay":  # no upstream is asked: nothing about their keys to warn of
        report.add("model calls", "/v1, replay: only recorded calls are answered" + (f" (upstreams not used: {upstreams})" if upstreams else ""))
        return
    report.add("model calls", f"/v1, {mode}; " + (upstreams or "no upstream: only recorded calls are answered"))
    if not llm.reuse_answers and mode == "record" and not settings.record.served_store:
        report.error("llm.reuse_answers", "false answers model calls only from record.served_store, which is not set: "
                     "set record.served_store to a fresh diskcache folder, or llm.reuse_answers: true")
    if not llm.upstreams:
        report.warning("llm.upstreams", f"llm mode is {mode} but no upstream is configured: every model call not "
                       "recorded gets HTTP 404; add llm.upstreams: [{base_url: ..., models: [...]}]")
    _check_upstream_keys(settings, report)


def _check_upstream_keys(settings: Settings, report: StartupReport) -> None:
    """A warning for each model upstream whose key is not where a call would find it."""
    for i, upstream in enumerate(settings.llm.upstreams):
        if upstream.api_key_env and not os.environ.get(upstream.api_key_env):
            report.warning(f"llm.upstreams[{i}].api_key_env", f"${upstream.api_key_env} is not set: the client's own key "
                           "is passed through instead; export it before serve")
        elif not upstream.api_key_env and settings.auth_token is not None:
            report.warning(f"llm.upstreams[{i}].api_key_env", "with auth_token set, the client's key is the server's token "
                           "and is never passed on: name the upstream's key in api_key_env")


def check_trusted_proxies(settings: Settings, report: StartupReport) -> None:
    """``limits.trusted_proxies``: a warning when it names the address every local client connects from."""
    trusted = settings.limits.trusted_proxies
    if not trusted:
        return
    report.add("trusted proxies", ", ".join(trusted))
    loopback = [t for t in trusted if _takes_in_loopback(t)]
    if loopback:
        report.warning("limits.trusted_proxies", f"{', '.join(loopback)} takes in 127.0.0.1 or ::1, where every local client connects from: "
                       "any of them may name itself another client in X-Forwarded-For and get past limits.max_in_flight_per_client; "
                       "bind the proxy to an address of its own (nginx: proxy_bind 127.0.0.2;) and name that one")


def _takes_in_loopback(item: str) -> bool:
    import ipaddress

    if item == "*":
        return True
    net = ipaddress.ip_network(item, strict=False)
    return any(a.version == net.version and a in net for a in (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")))


def check_apibank(settings: Settings, report: StartupReport) -> None:
    """``apibank``: its folder loaded (imported once per process), the APIs that run here and those that take the miss path."""
    if settings.apibank is None:
        return
    from stabletoolbench_mirror.apibank import load_suites
    from stabletoolbench_mirror.apibank.loader import describe

    try:
        suites = load_suites(settings)
    except ConfigError as exc:
        report.error("apibank.path", str(exc).removeprefix("apibank.path: "))
        return
    report.add("API-Bank", f"{settings.resolve(settings.apibank.path)}: its API modules were imported, which ran their code "
                           "in this process (doctor too): name only a folder you trust")
    for line in describe(suites):
        report.add("API-Bank" if not line.startswith(" ") else "API-Bank miss", line.strip())


def print_report(report: StartupReport, stream: Any = None) -> None:
    from stabletoolbench_mirror.core.logs import printable

    # serve's output is not escaped as a command's is (cli.main): the names of a tree's files it lists are here
    print(printable(report.render()), file=stream or sys.stderr, flush=True)


def start_checks(settings: Settings, *, probe_endpoints: bool = True, simulator_launched: bool = False) -> bool:
    """The checks ``serve`` and ``warm`` run before they start: print the summary; ``False`` on an error."""
    from stabletoolbench_mirror.core.logs import to_log_file

    report = inspect(settings, probe_endpoints=probe_endpoints, simulator_launched=simulator_launched)
    print_report(report)
    to_log_file(report.render())
    if report.errors:
        print(f"not starting: {len(report.errors)} configuration error(s) above", file=sys.stderr, flush=True)
        return False
    return True
