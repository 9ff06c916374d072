"""The one configuration model, loaded from ``server_config.yml``, env vars and CLI flags.

Precedence (later wins): built-in defaults < the YAML file < ``STM_*`` environment
variables < command-line flags.  Environment variables name a key path with ``__``
between levels and take YAML values, e.g. ``STM_MODE=replay``,
``STM_SIMULATOR__API_BASE=http://127.0.0.1:8000/v1``, ``STM_FROZEN_CACHES='[a, b]'``.
Secrets can also come from ``STM_REAL__TOOLBENCH_KEY``, ``STM_REAL__RAPIDAPI_KEY``,
``STM_SIMULATOR__API_KEY`` and ``STM_AUTH_TOKEN`` so that they stay out of files.

Unknown or invalid keys fail at start with a :class:`ConfigError` that names the key.
Relative paths are resolved against the folder of the config file (the current
folder when there is no file).
"""

from __future__ import annotations

import difflib
import enum
import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from stabletoolbench_mirror.core.secrets import url_password

ENV_PREFIX = "STM_"
DEFAULT_CONFIG_FILE = "server_config.yml"
#: ``STM_*`` variables that are not settings keys: the config file's path, the serve master's
#: hand-over to its workers, and the tooling's own (``STM_VLLM_*`` for the vLLM tier, ``STM_CI_*``)
NOT_SETTINGS_ENV = frozenset({"STM_CONFIG", "STM_SERVE_SETTINGS_FILE", "STM_REDIS_URL"})
NOT_SETTINGS_ENV_PREFIXES = ("STM_VLLM_", "STM_CI_")


#: upper bounds of durations and counts: a value past them cannot work (a timeout over ~9.2e9 s overflows
#: the platform's time_t, and every wait with it fails) or is a typo; the error names the key and the bound
HOUR_S = 3600.0
DAY_S = 24 * HOUR_S
MAX_WORKERS = 256
#: what a bounded key is for, added to the error of a value past its bound
BOUND_HINTS = {
    "limits.queue_timeout_s": "the longest a request waits for a slot or a miss turn, in seconds: minutes, at most a day",
    "simulator.read_timeout_s": "how long one completion may take, in seconds: minutes for a slow model, at most an hour",
    "real.read_timeout_s": "how long one real API call may take, in seconds: at most an hour",
    "faults.rate": "the share of calls served a fault: from 0 (faults off) to 1 (every call)",
    "workers": f"uvicorn worker processes: about one per CPU core (this machine has {os.cpu_count() or 1})",
}


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


class Mode(enum.StrEnum):
    """What a miss may do (see the mode table in docs/configuration.md)."""

    REPLAY = "replay"
    """Answer only from the caches; a miss gets upstream's "API not working" answer."""
    RECORD = "record"
    """A miss goes to the real API, then the simulator; the answer is recorded."""
    REFRESH = "refresh"
    """As ``record``, but a call whose record is in ``refresh``'s scope is asked again: a usable answer
    replaces the record (its provenance kept), a failure never does (the record is served)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StoreConfig(_Section):
    kind: Literal["diskcache", "redis"] = "diskcache"
    path: str = "cache/store"
    """diskcache folder (``kind: diskcache``)."""
    url: str | None = None
    """Redis URL, e.g. ``redis://127.0.0.1:6379/0`` (``kind: redis``)."""
    prefix: str = "stm"
    """Key prefix in Redis, so that several caches can share one server."""
    lock_ttl_s: float = Field(default=15.0, gt=0, le=HOUR_S)
    """Lease of the cross-host single-flight lock (Redis): renewed while its holder works, so a
    holder that dies blocks the others for at most this long.  (diskcache's lock is a kernel
    file lock, dropped when its holder exits.)"""
    timeout_s: float = Field(default=2.0, gt=0, le=HOUR_S)
    """Redis connect and command timeout: how fast a Redis outage becomes an error answer."""


class RealConfig(_Section):
    enabled: bool = False
    backend: Literal["relay", "rapidapi"] = "relay"
    relay_url: str | None = None
    """StableToolBench's ``toolbench_url``: the ToolBench relay the real calls go to."""
    toolbench_key: SecretStr | None = None
    """Used when a request carries no ``toolbench_key``."""
    rapidapi_key: SecretStr | None = None
    rapidapi_base_url: str | None = None
    """Send direct RapidAPI calls here instead of the doc's URL host (tests, proxies)."""
    allow_categories: list[str] = Field(default_factory=list)
    deny_categories: list[str] = Field(default_factory=list)
    allow_tools: list[str] = Field(default_factory=list)
    deny_tools: list[str] = Field(default_factory=list)
    connect_timeout_s: float = Field(default=3.0, gt=0, le=HOUR_S)
    read_timeout_s: float = Field(default=10.0, gt=0, le=HOUR_S)
    breaker_failures: int = Field(default=5, ge=1)
    """Consecutive failures of one host that open its circuit breaker."""
    breaker_reset_s: float = Field(default=60.0, gt=0, le=DAY_S)
    """How long an open breaker skips real calls to its host."""
    strict_validity: bool = False
    """Use a stricter validity check than upstream's substring rules."""
    shadow_simulate: bool = False
    """When the real API answers a miss, also ask the simulator (``simulator.*`` settings) and keep
    its answer in the shadow store (never served) for ``fidelity --from-store --shadow``."""


SimulatorStyle = Literal["mirrorapi-sft", "mirrorapi-cot", "mirrorapi-cache", "gpt-fewshot", "world-model"]


class SimulatorConfig(_Section):
    enabled: bool = False
    style: SimulatorStyle = "mirrorapi-sft"
    api_base: str | list[str] = "http://127.0.0.1:12345/v1"
    """One OpenAI-compatible endpoint, or a list used round robin / least busy."""
    balance: Literal["round_robin", "least_busy"] = "least_busy"
    api_key: SecretStr | None = None
    model: str = "MirrorAPI"
    temperature: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=2048, ge=1)
    seed: int | None = 42
    connect_timeout_s: float = Field(default=3.0, gt=0, le=HOUR_S)
    read_timeout_s: float = Field(default=120.0, gt=0, le=HOUR_S)
    max_retries: int = Field(default=3, ge=0, le=100)
    backoff_s: float = Field(default=0.5, ge=0)
    system_prompt_file: str | None = None
    """The system prompt: a text file sent verbatim, StableToolBench's ``server/system_prompts.py``
    (its ``SFT_SYSTEM`` / ``COT_SYSTEM`` constant, read without running the file) or the folder of a
    StableToolBench checkout.  Unset: this project's own built-in prompts."""
    parse_retries: int | None = Field(default=None, ge=0, le=10)
    """Completions asked for again when an output cannot be parsed (with seed + 1, + 2, ...).
    Unset: 0 for the MirrorAPI styles, 3 for ``gpt-fewshot`` (as upstream's GPT server)."""
    structured_output: bool = False
    """Ask a vLLM endpoint for schema-constrained JSON (off: keep MirrorAPI's trained behaviour)."""
    structured_max_chars: int | None = Field(default=None, ge=1)
    """With ``structured_output``: a ``maxLength`` for each string of the schema (small models need one to stop)."""
    fuzzy_match_score: float = Field(default=85.0, ge=0, le=100)
    """Lowest rapidfuzz score at which a slightly-off API name is matched to a tool doc."""
    max_examples: int = Field(default=5, ge=0)
    """``gpt-fewshot``: cached examples of the same API put in the prompt."""
    examples_budget_chars: int = Field(default=2048, ge=0)
    max_concurrency: int = Field(default=64, ge=1)
    """Simulator calls in flight at once from one process."""
    history: int = Field(default=8, ge=0)
    """In a session (``gpt-fewshot`` and ``world-model``): the task and the last N calls and answers go in the prompt."""
    allow_without_docs: bool = False
    """Simulate without a readable ``tools_folder`` (else the start is refused); such records are marked."""
    validity: Literal["strict", "compatible", "off"] = "strict"
    """The real API's validity rules applied to simulated answers: ``strict`` (``real.strict_validity``'s
    rules), ``compatible`` (StableToolBench's substring rules) or ``off``.  A rejected answer is served
    but recorded as a failure record (tried again in ``record`` mode)."""

    @field_validator("api_base")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("needs at least one endpoint")
        return value

    @property
    def endpoints(self) -> list[str]:
        return [self.api_base] if isinstance(self.api_base, str) else list(self.api_base)


class RecordConfig(_Section):
    retry_failures: bool = True
    """In ``record`` mode, try a call whose record is a failure record again; a usable answer replaces it.
    ``false``: serve failure records as recorded.  ``replay`` mode never retries."""


class RefreshConfig(_Section):
    """Which records ``mode: refresh`` asks again (all of them when nothing is set; each set key narrows it)."""

    apis: list[str] = Field(default_factory=list)
    """APIs as ``/stats`` names them (``Category/tool_for_Category/api``)."""
    categories: list[str] = Field(default_factory=list)
    """Categories (standardised, as in ``cache stats``)."""
    sources: list[Literal["real", "simulated", "imported", "local", "frozen"]] = Field(default_factory=list)
    """Records of these sources (``frozen``: answers found only in a frozen cache)."""
    older_than_days: float | None = Field(default=None, ge=0)
    """Only records recorded more than this many days ago."""


class LimitsConfig(_Section):
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest accepted ``/virtual`` body; larger ones get HTTP 413."""
    max_in_flight_per_client: int = Field(default=64, ge=1)
    """Requests one client address has answered at once; more wait for a slot (in order, per client)."""
    max_pending_misses: int = Field(default=256, ge=1)
    """Misses being filled by the real API or simulator at once in one process; more wait for a turn."""
    queue_timeout_s: float = Field(default=600.0, gt=0, le=DAY_S)
    """Longest wait for a slot or a miss turn; a request still waiting then gets HTTP 503."""
    max_queued_requests: int = Field(default=100_000, ge=1)
    """Requests waiting for a slot across all clients; one more gets HTTP 503 at once."""
    max_queued_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)
    """Bytes of request bodies waiting for a slot across all clients; more get HTTP 503 at once."""
    header_timeout_s: float = Field(default=10.0, gt=0, le=HOUR_S)
    """A connection whose request headers are not complete this long after it opened (or after its
    previous answer) is closed."""
    body_timeout_s: float = Field(default=10.0, gt=0, le=HOUR_S)
    """A request whose body has not fully arrived this long after its headers gets HTTP 408 and is closed."""
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, le=HOUR_S)
    """An idle kept-alive connection is closed after this long."""
    send_timeout_s: float = Field(default=30.0, gt=0)
    """A client that reads nothing of its answer for this long is dropped (its unsent answer freed)."""
    trusted_proxies: list[str] = Field(default_factory=list)
    """Reverse proxies (addresses or networks such as ``10.0.0.0/8``; ``"*"``: any) whose
    ``X-Forwarded-For`` names the client for the per-client limits and fair sharing.  None by
    default: a client is the address it connects from, so it cannot name itself another client
    to get past ``max_in_flight_per_client``."""

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for item in value:
            if item != "*":
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError:
                    raise ValueError(f"{item!r} is not an IP address or network (e.g. 127.0.0.1, 10.0.0.0/8, or \"*\")") from None
        return value


class SessionsConfig(_Section):
    """Sessions (``X-STM-Session``, ``/sessions``): kept in the store beside the records."""

    idle_expiry_s: float = Field(default=7 * 24 * 3600.0, gt=0, le=3650 * DAY_S)
    """A session nobody called for this long is forgotten (its recorded answers stay)."""
    max_calls: int = Field(default=500, ge=1)
    """Calls one session may hold; more are refused with an error answer."""
    max_state_bytes: int = Field(default=1_048_576, ge=2)
    """Largest local-tool state (as JSON) one session may keep."""
    max_task_chars: int = Field(default=20_000, ge=0)
    """Longest ``task`` text accepted by ``POST /sessions``."""
    max_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest size one session may reach in the store (its calls, inputs and answers, and its state);
    a call that would make it larger is refused with an error answer and changes nothing."""
    allow_client_ids: bool = False
    """Accept session ids the server did not issue (an unknown ``X-STM-Session`` id then starts a
    session).  Off: only ids from ``POST /sessions`` are accepted; whoever knows an id owns it."""


def _fault_kinds(value: Any) -> Any:
    """``faults.kinds``: a list of kind names (equal weights) or a mapping of kind to weight."""
    from stabletoolbench_mirror.core.fault_kinds import KINDS

    if isinstance(value, (list, tuple)):
        value = {name: 1.0 for name in value}
    if not isinstance(value, dict):
        return value  # pydantic names the type error
    for name, weight in value.items():
        if name not in KINDS:
            near = nearest_key(str(name), list(KINDS))
            hint = f" (did you mean '{near}'?)" if near else ""
            raise ValueError(f"unknown fault kind {name!r}{hint}; the kinds are {', '.join(KINDS)}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
            raise ValueError(f"the weight of {name!r} must be a number of 0 or more (got {weight!r})")
    if not value or not any(value.values()):
        raise ValueError(f"needs at least one kind with a weight above 0 (the kinds are {', '.join(KINDS)}); "
                         "to turn faults off set faults.rate: 0")
    return value


class FaultsConfig(_Section):
    """Injected faults, the same in every run (see docs/faults.md): served, never recorded."""

    seed: int = 0
    """With the API and the call's exact key (in a session, its history hash), decides which calls fail and how."""
    rate: float = Field(default=0.0, ge=0, le=1)
    """The share of calls served a fault (0: faults off)."""
    kinds: dict[str, float] = Field(default_factory=lambda: _all_fault_kinds())
    """Kind name -> weight (a list of names: equal weights); default every kind, equal weights."""
    slow_s: float = Field(default=5.0, gt=0, le=HOUR_S)
    """How long a ``slow`` fault holds the answer, in seconds."""
    apis: list[str] = Field(default_factory=list)
    """Only these APIs (``Category/tool/api`` paths or API names, as sent or standardised); empty: every API."""
    tools: list[str] = Field(default_factory=list)
    categories: list[str] = Field(default_factory=list)

    @field_validator("kinds", mode="before")
    @classmethod
    def _kinds(cls, value: Any) -> Any:
        return _fault_kinds(value)

    @property
    def enabled(self) -> bool:
        return self.rate > 0


def _all_fault_kinds() -> dict[str, float]:
    from stabletoolbench_mirror.core.fault_kinds import KINDS

    return {name: 1.0 for name in KINDS}


class McpConfig(_Section):
    """The MCP front (``serve``'s ``/mcp``, the ``mcp`` command): the same layer, offered as MCP tools."""

    enabled: bool = False
    """Serve MCP over streamable HTTP at ``/mcp`` (needs the ``mcp`` extra and ``tools_folder``)."""
    queries: str | list[str] = Field(default_factory=list)
    """StableToolBench query files or folders: ``/mcp`` offers their tools, ``/mcp/queries/<group>/<query_id>``
    one query's; empty: ``/mcp`` offers every tool of ``tools_folder``."""
    sessions: bool = True
    """An MCP session (``Mcp-Session-Id``; the ``mcp`` command's whole run) is a server session: history-conditioned
    keys and simulation, local-tool state.  Off: its calls are sessionless, keyed as StableToolBench's client's
    (what answering from a frozen StableToolBench cache needs)."""
    max_sessions: int = Field(default=2048, ge=1)
    """MCP sessions open at once over HTTP, all clients together.  A new one beyond it closes the least recently
    used idle session of the client that holds the most; with none idle it is refused (HTTP 503 naming this key)."""
    max_sessions_per_client: int = Field(default=256, ge=1)
    """MCP sessions one client address holds at once.  A new one beyond it closes that client's least recently
    used idle session (its id then answers 404: the client initializes again); with none idle it is refused."""
    session_idle_timeout_s: float = Field(default=1800.0, gt=0, le=DAY_S)
    """An MCP session with no request for this long is closed (the SDK's own default, 30 minutes)."""

    @property
    def query_paths(self) -> list[str]:
        return [self.queries] if isinstance(self.queries, str) else list(self.queries)
class ApiBankConfig(_Section):
    """API-Bank as an environment (``apibank: {path: DIR}``): see docs/apibank.md."""

    path: str
    """An API-Bank folder (the ``api-bank/`` holding ``apis/`` and ``init_database/``); only its
    ``apis/`` (and ``lv3_apis/`` with ``level3``) is imported, once, at start."""
    level3: bool = False
    """Also serve ``lv3_apis/`` (its own tool, ``API-Bank Level-3``, so class names do not clash)."""
    remote: list[str] = Field(default_factory=list)
    """APIs (class names) that take the miss path (cache, then simulator) although they could be imported."""
    local: list[str] = Field(default_factory=list)
    """APIs run here although their imports look like they need the internet or a model."""


class Settings(_Section):
    mode: Mode = Mode.RECORD
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    auth_token: SecretStr | None = None
    store: StoreConfig = Field(default_factory=StoreConfig)
    frozen_caches: list[str] = Field(default_factory=list)
    download_dir: str = "cache/downloads"
    """Where snapshot archives given as ``http(s)://`` URLs (``frozen_caches``, ``cache import``) are
    downloaded and archives are unpacked; a second start uses the copy there."""
    frozen_memory_mb: float = Field(default=320, gt=0)
    """Memory for the indexes of frozen cache files (keys and answer offsets); the least recently used
    files are dropped beyond it and re-read when needed."""
    frozen_max_file_mb: float = Field(default=512, gt=0)
    """The largest frozen cache file (or file ``cache import`` reads) that is parsed; a larger one is
    skipped with one warning naming it (parsing takes about twice its size in memory).  A snapshot
    archive holding a larger member is refused before it is unpacked."""
    archive_max_total_mb: float = Field(default=16384, gt=0)
    """The most a snapshot archive (``frozen_caches``, ``cache import``, ``snapshot --verify``) may unpack
    to, by its members' sizes as its tar headers give them; a larger one is refused before anything is unpacked."""
    download_max_mb: float = Field(default=16384, gt=0)
    """The largest archive downloaded from an ``http(s)://`` URL; a larger one is refused (by its
    ``Content-Length``, else as it arrives) and nothing of it kept."""
    download_deadline_s: float = Field(default=3600, gt=0)
    """The longest one archive download may take, all of it."""
    download_min_kb_per_s: float = Field(default=10, ge=0)
    """A download slower than this over ``download_low_speed_s`` is given up (0: never)."""
    download_low_speed_s: float = Field(default=60, gt=0)
    """The window ``download_min_kb_per_s`` is measured over (also the longest wait for one read)."""
    archive_max_members: int = Field(default=100_000, gt=0)
    """The most members (files and folders) a snapshot archive may hold; one with more is refused before
    anything is unpacked."""
    allow_symlinks: bool = False
    """Follow symbolic links that lead out of a frozen cache tree or the tools folder (refused otherwise)."""
    tools_folder: str | None = None
    save: bool = True
    """Record new answers (upstream ``is_save``); when false, ``record`` answers but stores nothing."""
    real: RealConfig = Field(default_factory=RealConfig)
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    record: RecordConfig = Field(default_factory=RecordConfig)
    refresh: RefreshConfig = Field(default_factory=RefreshConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    faults: FaultsConfig = Field(default_factory=FaultsConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    local_tools: list[str] = Field(default_factory=list)
    """Python files of local, stateful tools (each defines ``TOOLS``); only these files are ever imported."""
    local_tools_timeout_s: float = Field(default=10.0, gt=0, le=HOUR_S)
    """A local tool running longer than this gets an error answer (its thread cannot be killed)."""
    apibank: ApiBankConfig | None = None
    """API-Bank's runnable APIs as local tools with a per-session environment (docs/apibank.md)."""
    workers: int = Field(default=1, ge=1, le=MAX_WORKERS)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_file: str | None = None
    """Also append the server's log to this file (upstream ``log_file``)."""
    base_dir: str = Field(default=".", exclude=True)
    """The folder relative paths are resolved against (the config file's folder)."""
    config_source: str = Field(default="defaults", exclude=True)
    """Where the settings came from (files, environment, flags), for the start-up summary."""
    style_source: str = Field(default="", exclude=True)
    """How ``simulator.style`` was chosen for a StableToolBench config file, for the start-up summary."""

    def resolve(self, path: str) -> str:
        return str(Path(self.base_dir, os.path.expanduser(path)).resolve())

    def secrets(self) -> list[str]:
        """Every secret value configured, for redaction (see :mod:`stabletoolbench_mirror.core.secrets`): the
        keys and the token, and any password in a configured URL."""
        found = [
            v.get_secret_value()
            for v in (self.auth_token, self.real.toolbench_key, self.real.rapidapi_key, self.simulator.api_key)
            if v is not None and v.get_secret_value()
        ]
        urls = [self.store.url, self.real.relay_url, self.real.rapidapi_base_url, *self.simulator.endpoints]
        return found + [p for p in (url_password(u) for u in urls if u) if p]


# -- StableToolBench's own config.yml ------------------------------------------------------------
# Its keys are accepted where they mean the same; an empty value means "not set".  Without a
# server_config.yml, a config.yml in the working folder is used when it holds only known keys.

UPSTREAM_CONFIG_FILE = "config.yml"
#: every key of upstream's server/config.yml
UPSTREAM_KEYS = (
    "api_key", "api_base", "model", "temperature", "toolbench_url", "rapidapi_url", "tools_folder", "cache_folder", "is_save", "port", "log_file",
)
_LEGACY_KEYS = ("cache_folder", "is_save", "toolbench_url", "rapidapi_url", "api_base", "api_key", "model", "temperature")
#: upstream's OpenAI client talks to OpenAI when ``api_base`` is empty
UPSTREAM_DEFAULT_API_BASE = "https://api.openai.com/v1"


@dataclass(frozen=True)
class UpstreamServer:
    """One of StableToolBench's simulator servers: the config file it reads and the prompt it sends."""

    config_file: str
    script: str
    style: str
    prompt: str
    """What its prompt is, for the start-up summary."""


#: upstream's three servers (``server/``), each hard-wired to its own config file
UPSTREAM_SERVERS = (
    UpstreamServer("config.yml", "main.py", "gpt-fewshot", "the GPT simulator's few-shot prompt with cached examples"),
    UpstreamServer("config_mirrorapi.yml", "main_mirrorapi.py", "mirrorapi-sft", "MirrorAPI's SFT_SYSTEM prompt, the doc's API name"),
    UpstreamServer(
        "config_mirrorapi_cache.yml", "main_mirrorapi_cache.py", "mirrorapi-cache", "MirrorAPI's SFT_SYSTEM prompt, the standardized API name"
    ),
)
#: keys upstream's GPT server (``main.py``) cannot start without; its MirrorAPI servers read none of them
UPSTREAM_GPT_ONLY_KEYS = ("cache_folder", "toolbench_url", "rapidapi_url", "is_save")
#: the model name upstream's MirrorAPI servers use when their file names none
UPSTREAM_MIRRORAPI_MODEL = "simulation-250123-qwen25-mixed"
#: the file upstream's MirrorAPI servers import their system prompt from (beside their config file)
UPSTREAM_PROMPTS_FILE = "system_prompts.py"


def upstream_server_for(path: Path | None, data: Mapping[str, Any]) -> tuple[UpstreamServer, str]:
    """Which of upstream's servers reads the config file ``path`` (holding ``data``), and why we think so.

    Each server opens one fixed file name, so the name decides; a file under another name is the GPT
    server's when it has one of the keys only that server reads, else a MirrorAPI server's (their
    files are alike: ``mirrorapi-sft`` is taken, the more general one).
    """
    by_name = {server.config_file: server for server in UPSTREAM_SERVERS}
    name = path.name if path is not None else ""
    if name in by_name:
        server = by_name[name]
        return server, f"{name} is the file StableToolBench's {server.script} reads"
    gpt_keys = [k for k in UPSTREAM_GPT_ONLY_KEYS if k in data]
    shown = name or "the file"
    if gpt_keys:
        return by_name["config.yml"], f"{shown} has {', '.join(gpt_keys)}, read only by StableToolBench's main.py"
    return by_name["config_mirrorapi.yml"], (
        f"{shown} has none of main.py's keys ({', '.join(UPSTREAM_GPT_ONLY_KEYS)}), as StableToolBench's MirrorAPI configs"
    )


def _translate_legacy(data: dict[str, Any], environ: Mapping[str, str] | None = None, path: Path | None = None) -> dict[str, Any]:
    """Map StableToolBench ``config.yml`` keys onto this model (only where they mean the same).

    The simulator style is that of the upstream server that reads the file (:func:`upstream_server_for`);
    a MirrorAPI server's file also gets the ``system_prompts.py`` beside it, as that server imports it.
    """
    if not any(k in data for k in _LEGACY_KEYS):
        return data
    server, _why = upstream_server_for(path, data)
    # upstream's file ships with empty values (``api_key:``, ``api_base:``): they mean "not set"
    data = {k: v for k, v in data.items() if not (k in UPSTREAM_KEYS and (v is None or v == ""))}
    _translate_legacy_files_and_relay(data)
    _translate_legacy_simulator(data, server, environ, path)
    return data


def _translate_legacy_files_and_relay(data: dict[str, Any]) -> None:
    """Upstream's ``cache_folder``, ``is_save``, ``rapidapi_url`` and ``toolbench_url``, in place."""
    if "cache_folder" in data:
        frozen = list(data.get("frozen_caches") or [])
        folder = data.pop("cache_folder")
        if folder not in frozen:
            frozen.append(folder)
        data["frozen_caches"] = frozen
    if "is_save" in data:
        data["save"] = data.pop("is_save")
    if "rapidapi_url" in data:  # its name in upstream's earlier config.yml: the same relay
        data.setdefault("toolbench_url", data["rapidapi_url"])
        data.pop("rapidapi_url")
    if "toolbench_url" in data:
        real = dict(data.get("real") or {})
        real.setdefault("relay_url", data.pop("toolbench_url"))
        real.setdefault("enabled", True)
        real.setdefault("backend", "relay")
        data["real"] = real


def _translate_legacy_simulator(
    data: dict[str, Any], server: UpstreamServer, environ: Mapping[str, str] | None, path: Path | None
) -> None:
    """Upstream's ``api_base``, ``api_key``, ``model`` and ``temperature``, in place, as the server reading the file takes them."""
    sim_keys = {"api_base": "api_base", "api_key": "api_key", "model": "model", "temperature": "temperature"}
    if not any(k in data for k in sim_keys):
        return
    sim = dict(data.get("simulator") or {})
    for old, new in sim_keys.items():
        if old in data:
            sim.setdefault(new, data.pop(old))
    sim.setdefault("enabled", True)
    # upstream's servers are OpenAI clients: without api_base they talk to OpenAI, and
    # without api_key they read OPENAI_API_KEY
    sim.setdefault("style", server.style)
    sim.setdefault("api_base", UPSTREAM_DEFAULT_API_BASE)
    if server.style != "gpt-fewshot":
        sim.setdefault("model", UPSTREAM_MIRRORAPI_MODEL)
        # ``from system_prompts import SFT_SYSTEM``: the file beside the server and its config
        if path is not None and (path.parent / UPSTREAM_PROMPTS_FILE).is_file():
            sim.setdefault("system_prompt_file", UPSTREAM_PROMPTS_FILE)
    openai_key = (environ or {}).get("OPENAI_API_KEY")
    if openai_key:
        sim.setdefault("api_key", openai_key)
    data["simulator"] = sim


def _upstream_file_problem(path: Path) -> str | None:
    """Why ``path`` (a ``config.yml`` found in the working folder) is not used, or ``None`` to use it."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read it: {exc}"
    except yaml.YAMLError as exc:
        return f"not valid YAML: {str(exc).splitlines()[0]}"
    if not isinstance(loaded, dict):
        return "its top level is not a mapping of keys"
    unknown = sorted(str(k) for k in loaded if k not in UPSTREAM_KEYS and k not in Settings.model_fields)
    if unknown and not clearly_upstream(loaded, unknown):
        known = [*UPSTREAM_KEYS, *(n for n, f in Settings.model_fields.items() if not f.exclude)]
        shown = [k + (f" (did you mean '{near}'?)" if (near := nearest_key(k, known)) else "") for k in unknown[:5]]
        return f"unknown keys {', '.join(shown)}: not StableToolBench's server config"
    # used; an unknown key of a file that is clearly upstream's is then an error naming it (a typo
    # such as ``is_sav`` must not start the server on the defaults)
    return None


def clearly_upstream(loaded: Mapping[Any, Any], unknown: list[str]) -> bool:
    """Whether a file is StableToolBench's despite ``unknown`` keys: most of its keys are upstream's, one only upstream has among them."""
    upstream = [k for k in loaded if k in UPSTREAM_KEYS]
    return any(k in _LEGACY_KEYS for k in loaded) and len(upstream) > len(unknown)


def discover_config_file(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The config file to use when none is given, and a note on how it was chosen (or why none was)."""
    if environ.get("STM_CONFIG"):
        return environ["STM_CONFIG"], ""
    if Path(DEFAULT_CONFIG_FILE).is_file():
        return DEFAULT_CONFIG_FILE, ""
    upstream = Path(UPSTREAM_CONFIG_FILE)
    if not upstream.is_file():
        return None, ""
    problem = _upstream_file_problem(upstream)
    if problem is None:
        return UPSTREAM_CONFIG_FILE, f"StableToolBench's {UPSTREAM_CONFIG_FILE}: no {DEFAULT_CONFIG_FILE} in this folder"
    return None, f"./{UPSTREAM_CONFIG_FILE} not used: {problem}; pass --config {UPSTREAM_CONFIG_FILE} to use it"


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS_ENV or name.startswith(NOT_SETTINGS_ENV_PREFIXES):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        # secrets and strings stay strings even when YAML would read a number
        if path[-1] in ("auth_token", "toolbench_key", "rapidapi_key", "api_key", "relay_url", "url", "path"):
            value = raw
        _set_path(out, path, value)
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _config_key(loc: tuple[Any, ...]) -> str:
    """The settings key an error is about: ``simulator.api_base``, ``frozen_caches[1]``.

    pydantic adds the members of a union to the location (``api_base.str``, ``api_base.list[str]``):
    below a field that is not a section, only list indexes are kept.
    """
    model: Any = Settings
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif model is not None:
            key += ("." if key else "") + str(part)
            field = model.model_fields.get(part)
            annotation = field.annotation if field is not None else None
            model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return key or "(top level)"


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys accepted in the section ``loc`` is in (upstream's too at the top level)."""
    model: Any = Settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    known = [name for name, field in model.model_fields.items() if not field.exclude]
    return known + list(UPSTREAM_KEYS) if model is Settings else known


def nearest_key(name: str, known: list[str]) -> str | None:
    """The known key ``name`` is most likely a typo of (difflib), or ``None`` when none is close."""
    found = difflib.get_close_matches(name, known, n=1, cutoff=0.75) or difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.75)
    if found:
        return found[0]
    # a key cut short or run on (``relay`` for ``relay_url``)
    cut = [k for k in known if len(name) >= 4 and (k.startswith(name.lower()) or name.lower().startswith(k))]
    return min(cut, key=lambda k: abs(len(k) - len(name))) if cut else None


def _did_you_mean(loc: tuple[Any, ...], key: str) -> str:
    """`` (did you mean 'simulator.temperature'?)`` for the unknown key ``key`` at ``loc``, or nothing."""
    found = nearest_key(str(loc[-1]), _keys_at(loc)) if loc else None
    if found is None:
        return ""
    parent = key[: len(key) - len(str(loc[-1]))]
    return f" (did you mean '{parent}{found}'?)"


def _format_error(exc: ValidationError, source: str) -> str:
    """One line per key: ``unknown key``, or ``invalid value`` with every reason given (a union gives several)."""
    lines: dict[tuple[str, str], list[str]] = {}
    for err in exc.errors():
        key = _config_key(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            lines.setdefault((key, ""), []).append(_did_you_mean(tuple(err["loc"]), key))
            continue
        got = "an empty value" if err.get("input") is None else repr(err.get("input"))
        reasons = lines.setdefault((key, got), [])
        msg = err["msg"]
        if err["type"] in ("less_than_equal", "less_than"):
            msg += f": {BOUND_HINTS.get(key, 'a value this large cannot work')}"
        if msg not in reasons:
            reasons.append(msg)
    return "\n".join(
        f"{source}: invalid value for '{key}': {', or '.join(reasons)} (got {got})" if got else f"{source}: unknown key '{key}'{reasons[0]}"
        for (key, got), reasons in lines.items()
    )


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Load settings: defaults < ``config_file`` < ``STM_*`` env vars < ``overrides`` (CLI flags).

    With ``config_file=None``, ``$STM_CONFIG`` or ``./server_config.yml`` is used when present, else
    StableToolBench's ``./config.yml`` when it holds only known keys (see :func:`discover_config_file`).
    """
    environ = os.environ if environ is None else environ
    note = style_source = ""
    if config_file is None:
        config_file, note = discover_config_file(environ)
    data: dict[str, Any] = {}
    source = "defaults"
    base_dir = Path.cwd()
    if config_file is not None:
        path = Path(config_file)
        source = str(path)
        data, style_source = _read_config_file(path, environ)
        base_dir = path.resolve().parent
    env = _env_overrides(environ)
    if env:
        data = _merge(data, env)
        source += " + STM_* environment"
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if given:
        data = _merge(data, given)
        source += " + command line"
    data.pop("base_dir", None)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, source)) from None
    settings.base_dir = str(base_dir)
    settings.config_source = f"{source} ({note})" if note else source
    if style_source:
        settings.style_source = _final_style_source(settings, style_source)
    return settings


def _read_config_file(path: Path, environ: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """A config file's keys (StableToolBench's translated) and, for StableToolBench's, how its simulator style was chosen."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    data = _translate_legacy(loaded, environ, path)
    style_source = ""
    if data is not loaded and isinstance(data.get("simulator"), dict) and "style" not in (loaded.get("simulator") or {}):
        style_source = _style_note(path, loaded)
    return data, style_source


def _final_style_source(settings: Settings, style_source: str) -> str:
    """The file's style note, or a note that the environment or command line set another style."""
    inferred, why = style_source.split(": ", 1)
    if settings.simulator.style != inferred:
        return f"{settings.simulator.style}: set by the environment or command line (the file alone gives {inferred}: {why.split('; choose')[0]})"
    return style_source


def _style_note(path: Path, loaded: Mapping[str, Any]) -> str:
    """``<style>: <why>; choose another with ...``: how a StableToolBench file's simulator style was chosen."""
    server, why = upstream_server_for(path, loaded)
    others = ", ".join(s for s in get_args(SimulatorStyle) if s != server.style)
    # run from upstream's server/ folder, the MirrorAPI configs lie beside config.yml
    beside = [s.config_file for s in UPSTREAM_SERVERS if s.style != server.style and (path.parent / s.config_file).is_file()]
    if server.style == "gpt-fewshot" and beside:
        why += f"; for MirrorAPI pass --config {' or '.join(beside)}"
    return (
        f"{server.style}: {why} ({server.prompt}); "
        f"choose another with STM_SIMULATOR__STYLE=<style> or 'simulator: {{style: <style>}}' in the file ({others})"
    )


# -- handing settings to another process (``serve --workers N``, ``warm --processes N``) ------------


def serialize_settings(settings: Settings) -> str:
    """``settings`` as JSON, secrets included, for :func:`deserialize_settings` in a child process."""
    data = settings.model_dump(mode="python")
    data["base_dir"] = settings.base_dir

    def reveal(value: Any) -> Any:
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        if isinstance(value, dict):
            return {k: reveal(v) for k, v in value.items()}
        if isinstance(value, list):
            return [reveal(v) for v in value]
        return value

    return json.dumps(reveal(data))


def deserialize_settings(text: str) -> Settings:
    """The settings :func:`serialize_settings` wrote."""
    data = json.loads(text)
    base_dir = data.pop("base_dir", ".")
    settings = Settings(**data)
    settings.base_dir = base_dir
    return settings
