"""Network probes of the endpoints a configuration points at: the real API relay and the simulator.

Each endpoint gets one ``GET`` (the simulator's ``/models``), all at once, with a short
timeout; one that does not answer is a warning, never fatal (it may come up later).  A
simulator endpoint that answers ``/models`` without a models list (some OpenAI-compatible
servers have no ``/models``) is asked one chat completion of one token, as ``warm`` and the
server would ask it: when that answers, the endpoint is usable (a note, no error).  The
results are written to the start-up report, :class:`StartupReport` (kept here, below :mod:`.checks`, which writes the rest of it).
No key is ever printed: URLs are shown without user info or query string.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.core.secrets import public_url


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

    def as_json(self) -> dict[str, Any]:
        """``doctor --json``: ``ok``, the summary ``lines`` as ``{label, text}``, ``errors`` and ``warnings`` as ``{key, message}``."""
        return {
            "ok": not self.errors,
            "lines": [{"label": label, "text": text} for label, text in self.lines],
            "errors": [{"key": f.key, "message": f.message} for f in self.errors],
            "warnings": [{"key": f.key, "message": f.message} for f in self.warnings],
        }

    def render(self, title: str = "stabletoolbench-mirror") -> str:
        width = max((len(label) for label, _ in self.lines), default=0) + 1
        out = [title]
        out += [f"  {label + ':':<{width}} {text}" for label, text in self.lines]
        out += [f.line() for f in self.findings]
        return "\n".join(out)


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
    chat: bool = False
    """For a simulator endpoint without a models list: whether a chat completion of the model was answered."""

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


def _ask(method: str, url: str, headers: dict[str, str], timeout_s: float, body: Any = None) -> tuple[int, Any]:
    """One request, redirects not followed: its status and, for a 200, its JSON body (up to 1 MB; ``None`` when it is
    not JSON or breaks off: an answer all the same).  ``requests.RequestException`` when nothing answered."""
    import requests

    response = requests.request(method, url, json=body, headers=headers, timeout=(timeout_s, timeout_s), allow_redirects=False, stream=True)
    try:
        raw = response.raw.read(1024 * 1024, decode_content=True) if response.status_code == 200 else b""
    except Exception:  # noqa: BLE001 - a broken body still proves the endpoint answers
        raw = b""
    finally:
        response.close()
    try:
        return response.status_code, json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return response.status_code, None


def probe(url: str, *, timeout_s: float = 3.0, headers: dict[str, str] | None = None) -> tuple[Probe, Any]:
    """GET ``url``: any HTTP answer counts as answered.  Returns the probe and the parsed JSON body (or ``None``)."""
    import requests

    try:
        status, body = _ask("GET", url, headers or {}, timeout_s)
    except requests.RequestException as exc:
        return Probe(public_url(url), False, detail=_cause(exc)), None
    return Probe(public_url(url), True, status), body


def probe_simulator(api_base: str, model: str, api_key: str | None, timeout_s: float, chat_timeout_s: float | None = None) -> Probe:
    """``GET <api_base>/models`` of an OpenAI-compatible endpoint; notes whether ``model`` is listed.

    Without a models list, one chat completion of ``model`` (:func:`probe_chat`, within ``chat_timeout_s``)
    says whether the endpoint answers what the simulator asks it all the same.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    result, body = probe(api_base.rstrip("/") + "/models", timeout_s=timeout_s, headers=headers)
    if not result.answered:
        return Probe(public_url(api_base), False, detail=result.detail)
    models: tuple[str, ...] | None = None
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        models = tuple(str(m.get("id")) for m in body["data"] if isinstance(m, dict) and m.get("id") is not None)
    if result.status in (401, 403):
        return Probe(public_url(api_base), True, result.status, "refused: check simulator.api_key", models)
    if models is not None:
        return Probe(public_url(api_base), True, result.status, f"serves '{model}'" if model in models else f"does not list '{model}'", models)
    chat_status = probe_chat(api_base, model, headers, chat_timeout_s or timeout_s)
    if chat_status == 200:
        return Probe(public_url(api_base), True, result.status,
                     f"no models list at /models, but a chat completion of '{model}' was answered", chat=True)
    said = f"chat completion: HTTP {chat_status}" if isinstance(chat_status, int) else f"chat completion: {chat_status}"
    return Probe(public_url(api_base), True, result.status, f"no models list; {said}")


#: the one chat completion a probe asks: one token, nothing the model has to think about
PROBE_MESSAGES = [{"role": "user", "content": "ping"}]


def probe_chat(api_base: str, model: str, headers: dict[str, str], timeout_s: float) -> int | str:
    """``POST <api_base>/chat/completions`` of one token: ``200`` when it answered a completion (a JSON object
    with ``choices``), else the HTTP status, or why nothing came (``connection refused``, ``not a completion``)."""
    import requests

    body = {"model": model, "messages": PROBE_MESSAGES, "max_tokens": 1, "temperature": 0}
    try:
        status, answer = _ask("POST", api_base.rstrip("/") + "/chat/completions", headers, timeout_s, body)
    except requests.RequestException as exc:
        return _cause(exc)
    if status != 200:
        return status
    return 200 if isinstance(answer, dict) and isinstance(answer.get("choices"), list) else "HTTP 200, not a chat completion"


#: the longest a probe's chat completion may take
CHAT_PROBE_MAX_S = 30.0
#: the longest a model server's probe before a run waits for its connection, then for its answer
MODEL_PROBE_TIMEOUT_S = 3.0


def probe_model_servers(settings: Settings, roles: Mapping[str, str], server_url: str | None = None, *,
                        timeout_s: float = MODEL_PROBE_TIMEOUT_S) -> list[str]:
    """Before a run: each ``llm.upstreams`` entry that answers one of ``roles``' models (``{"agent": model, ...}``)
    probed as a simulator endpoint is (:func:`probe_simulator`, with its key), and ``server_url``'s ``/health``, all
    at once, within ``timeout_s``; one line for each that does not answer or refuses the key, naming the entry, its
    URL, the model and the fix (empty: all answer)."""
    from stabletoolbench_mirror.responders.model_servers import ModelServers

    servers = ModelServers(settings.llm)
    try:
        needed: dict[int, list[tuple[str, str]]] = {}
        for role, model in roles.items():
            found = servers.for_model(model)
            if found is not None:
                needed.setdefault(list(servers.items).index(found), []).append((role, model))
    finally:
        servers.close()
    upstreams = settings.llm.upstreams
    jobs: dict[str, Any] = {
        str(i): (lambda u=upstreams[i], model=asked[0][1]: probe_simulator(u.base_url, model, u.api_key(), timeout_s))
        for i, asked in needed.items()}
    if server_url is not None:
        jobs["server"] = lambda: probe(server_url.rstrip("/") + "/health", timeout_s=timeout_s)[0]
    results = _run_probes(jobs)
    out = []
    server = results.pop("server", None)
    if server is not None and not server.answered:
        out.append(f"--server: nothing answers at --server {public_url(server_url or '')} ({server.detail}): start the server with the --config given "
                   "(stabletoolbench-mirror serve --config ...), or name its host and port")
    for name, probed in results.items():
        i = int(name)
        what = f"llm.upstreams[{i}] ({probed.url}, for {' and '.join(f'the {role} {model!r}' for role, model in needed[i])})"
        if not probed.answered:
            out.append(f"{what} does not answer ({probed.detail}): start that model server, or point llm.upstreams[{i}].base_url at "
                       "its OpenAI-compatible /v1")
        elif probed.status in (401, 403):
            key = upstreams[i].api_key_env
            fix = f"check the key in ${key}" if key else "name the variable holding its key in llm.upstreams[].api_key_env"
            out.append(f"{what} refused the request (HTTP {probed.status}): {fix}")
    return out


def _probe_timeout(configured: float) -> float:
    return max(0.2, min(configured, 3.0))


def check_endpoints(settings: Settings, report: StartupReport, *, probe_endpoints: bool = True, doctor: bool = False) -> None:
    """Probe the relay and the simulator endpoints (all at once); warnings for those that do not answer.

    ``doctor``: a simulator endpoint that answers without a models list (HTTP 404: a wrong path) is an error.
    In ``replay`` mode neither is ever asked: they are said to be unused, not probed, and nothing is warned.
    """
    if settings.mode == "replay":
        for label, section in (("real API", settings.real), ("simulator", settings.simulator)):
            report.add(label, "not used: replay mode answers from the caches only" if section.enabled else "off")
        return
    jobs = _probe_jobs(settings, report, probe_endpoints)
    results = _run_probes(jobs)
    _report_real(settings, report, results)
    if settings.simulator.enabled:
        _report_simulator(settings, report, results, doctor=doctor)
    else:
        report.add("simulator", "off")


def _probe_jobs(settings: Settings, report: StartupReport, probe_endpoints: bool) -> dict[str, Any]:
    """The probes to run, by name (``real``, ``simulator<i>``); an error when the relay URL is missing."""
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
        # a completion may wait its turn behind a busy server's batch: up to the simulator's own read timeout, at most 30 s
        chat_timeout = max(_probe_timeout(sim.connect_timeout_s), min(sim.read_timeout_s, CHAT_PROBE_MAX_S))
        for i, endpoint in enumerate(sim.endpoints):
            jobs[f"simulator{i}"] = (lambda e=endpoint: probe_simulator(e, sim.model, key, _probe_timeout(sim.connect_timeout_s), chat_timeout))
    return jobs


def _run_probes(jobs: dict[str, Any]) -> dict[str, Probe]:
    """Run every probe at once; their results by name."""
    if not jobs:
        return {}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def _report_real(settings: Settings, report: StartupReport, results: dict[str, Probe]) -> None:
    """The ``real API`` line, and a warning when its endpoint does not answer."""
    real = settings.real
    if not real.enabled:
        report.add("real API", "off")
        return
    found = results.get("real")
    if real.backend == "relay":
        report.add("real API", f"relay {found.describe() if found else public_url(real.relay_url or '') + ' (not checked)'}")
        if found is not None and not found.answered:
            report.warning("real.relay_url", f"{found.url} does not answer ({found.detail}): real calls will fail and fall through to the simulator")
        return
    where = found.describe() if found else "each API's own host (not checked)"
    report.add("real API", f"rapidapi, {where}")
    if found is not None and not found.answered:
        report.warning("real.rapidapi_base_url", f"{found.url} does not answer ({found.detail}): real calls will fail")


def _report_simulator(settings: Settings, report: StartupReport, results: dict[str, Probe], *, doctor: bool = False) -> None:
    """The simulator's lines (style, prompt, each endpoint) and a warning for each endpoint that is not usable."""
    sim = settings.simulator
    report.add("simulator", f"{sim.style}, model '{sim.model}'")
    if settings.style_source:
        report.add("simulator style", settings.style_source)
    check_system_prompt(settings, report)
    for i, endpoint in enumerate(sim.endpoints):
        found = results.get(f"simulator{i}")
        label = f"simulator endpoint {i}" if len(sim.endpoints) > 1 else "simulator endpoint"
        report.add(label, found.describe() if found else f"{public_url(endpoint)} (not checked)")
        if found is not None:
            _warn_endpoint(sim.model, found, report, doctor=doctor)


def _warn_endpoint(model: str, found: Probe, report: StartupReport, *, doctor: bool = False) -> None:
    """A warning when a simulator endpoint does not answer, refuses the key, or does not serve ``model``;
    one that answers neither a models list nor a chat completion is an error in ``doctor`` (a warning at start).
    One that answers a chat completion without a models list is usable: its summary line says so."""
    if found.chat:
        return
    if found.answered and found.status not in (401, 403) and found.models is None:
        (report.error if doctor else report.warning)(
            "simulator.api_base",
            f"{found.url} answered HTTP {found.status} without a models list at {found.url.rstrip('/')}/models, and no chat "
            f"completion at {found.url.rstrip('/')}/chat/completions ({found.detail.removeprefix('no models list; ')}): it is not "
            "an OpenAI-compatible endpoint at that path; api_base is the URL before /chat/completions "
            "(vLLM: http://HOST:PORT/v1)",
        )
    elif not found.answered:
        report.warning("simulator.api_base", f"{found.url} does not answer ({found.detail}): simulated calls will fail until it does")
    elif found.status in (401, 403):
        report.warning("simulator.api_key", f"{found.url} refused the request (HTTP {found.status}): check simulator.api_key (STM_SIMULATOR__API_KEY)")
    elif found.models is not None and model not in found.models:
        listed = ", ".join(found.models[:5]) or "none"
        report.warning("simulator.model", f"'{model}' is not among the models {found.url} serves ({listed}): set simulator.model")


def check_system_prompt(settings: Settings, report: StartupReport) -> None:
    """The simulator's system prompt: where it comes from, or why ``simulator.system_prompt_file`` cannot give it."""
    from stabletoolbench_mirror.config import ConfigError
    from stabletoolbench_mirror.responders.simulator import system_prompt_for

    key = "simulator.system_prompt_file"
    try:
        prompt = system_prompt_for(settings)
    except ConfigError as exc:
        report.add("simulator prompt", "NOT USABLE")
        report.error(key, str(exc).removeprefix(f"{key}: "))
        return
    report.add("simulator prompt", f"{prompt.source} (sha256 {prompt.sha256[:12]})")
