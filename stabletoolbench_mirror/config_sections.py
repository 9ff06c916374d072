"""The sections of the settings (:class:`~stabletoolbench_mirror.config.Settings`): one model per YAML mapping.

Each field's docstring is what the key does (docs/configuration.md lists them); each bound names the
key when a value is past it (:data:`HOUR_S`, :data:`DAY_S`).  Every name here is importable from
:mod:`stabletoolbench_mirror.config` too.
"""

from __future__ import annotations

import enum
import ipaddress
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from stabletoolbench_mirror.config_loading import nearest_key
from stabletoolbench_mirror.stores.registry import KINDS

#: upper bounds of durations and counts: a value past them cannot work (a timeout over ~9.2e9 s overflows
#: the platform's time_t, and every wait with it fails) or is a typo; the error names the key and the bound
HOUR_S = 3600.0
DAY_S = 24 * HOUR_S
MAX_WORKERS = 256


class Mode(enum.StrEnum):
    """What a miss may do (see the mode table in docs/configuration.md)."""

    REPLAY = "replay"
    """Answer only from the caches; a miss gets upstream's "API not working" answer."""
    RECORD = "record"
    """A miss goes to the real API, then the simulator; the answer is recorded."""
    REFRESH = "refresh"
    """As ``record``, but a call whose record is in ``refresh``'s scope is asked again: a usable answer
    replaces the record (its provenance kept), a failure never does (the record is served)."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StoreConfig(Section):
    kind: str = next(iter(KINDS))
    """The backend, one of :data:`.stores.registry.KINDS`."""
    path: str = "cache/store"
    """diskcache folder (``kind: diskcache``)."""
    url: str | None = None
    """Redis URL, e.g. ``redis://127.0.0.1:6379/0`` (``kind: redis``)."""
    prefix: str = "stm"
    """Key prefix in Redis, so that several caches can share one server."""
    timeout_s: float = Field(default=2.0, gt=0, le=HOUR_S)
    """Redis connect and command timeout: how fast a Redis outage becomes an error answer, and the longest a request
    waits for Redis in all (after a timeout, Redis is not asked again for this long: ``stores.redis_connection.Outage``);
    for either store, the longest a model call (``/v1``) waits for the store (its occurrence counter, its record's read)."""

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in KINDS:
            *first, last = (repr(k) for k in KINDS)
            expected = f"{', '.join(first)} or {last}" if first else last
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value


class RealConfig(Section):
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
    strict_validity: bool = False
    """Use a stricter validity check than upstream's substring rules."""
    shadow_simulate: bool = False
    """When the real API answers a miss, also ask the simulator (``simulator.*`` settings) and keep
    its answer in the shadow store (never served) for ``fidelity --from-store --shadow``."""


SimulatorStyle = Literal["mirrorapi-sft", "mirrorapi-cot", "mirrorapi-cache", "gpt-fewshot", "world-model"]


class SimulatorConfig(Section):
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


class RecordConfig(Section):
    retry_failures: bool = True
    """In ``record`` mode, try a call whose record is a failure record again; a usable answer replaces it.
    ``false``: serve failure records as recorded.  ``replay`` mode never retries."""
    served_store: str | None = None
    """A diskcache folder that receives a copy of every answer served, in any mode and from any tier (new
    recordings, the store's hits, frozen caches' hits, recorded model calls), add-if-absent; snapshot it to
    replay a run from its own records alone (``score`` sets it to a fresh folder per run).  Unset: no copy."""


class RefreshConfig(Section):
    """Which records ``mode: refresh`` asks again (all of them when nothing is set; each set key narrows it)."""

    apis: list[str] = Field(default_factory=list)
    """APIs as ``/stats`` names them (``Category/tool_for_Category/api``)."""
    categories: list[str] = Field(default_factory=list)
    """Categories (standardised, as in ``cache stats``)."""
    sources: list[Literal["real", "simulated", "imported", "local", "frozen"]] = Field(default_factory=list)
    """Records of these sources (``frozen``: answers found only in a frozen cache)."""
    older_than_days: float | None = Field(default=None, ge=0)
    """Only records recorded more than this many days ago."""


class LimitsConfig(Section):
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest accepted ``/virtual`` body; larger ones get HTTP 413."""
    max_in_flight_per_client: int = Field(default=64, ge=1)
    """Requests one client address has answered at once; more wait for a slot (in order, per client)."""
    max_pending_misses: int = Field(default=256, ge=1)
    """Misses being filled by the real API or simulator at once in one process; more wait for a turn."""
    queue_timeout_s: float = Field(default=600.0, gt=0, le=DAY_S)
    """Longest wait for a slot or a miss turn; a request still waiting then gets HTTP 503."""
    max_queued_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)
    """Bytes of request bodies waiting for a slot across all clients; more get HTTP 503 at once."""
    body_timeout_s: float = Field(default=10.0, gt=0, le=HOUR_S)
    """A request whose body has not fully arrived this long after its headers gets HTTP 408 and is closed."""
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


class SessionsConfig(Section):
    """Sessions (``X-STM-Session``, ``/sessions``): kept in the store beside the records."""

    idle_expiry_s: float = Field(default=7 * 24 * 3600.0, gt=0, le=3650 * DAY_S)
    """A session nobody called for this long is forgotten (its recorded answers stay)."""
    max_calls: int = Field(default=500, ge=1)
    """Calls one session may hold; more are refused with an error answer."""
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


class FaultsConfig(Section):
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


class McpConfig(Section):
    """The MCP front (``serve``'s ``/mcp``, the ``mcp`` command): the same layer, offered as MCP tools."""

    enabled: bool = False
    """Serve MCP over streamable HTTP at ``/mcp`` (needs the ``mcp`` extra and ``tools_folder``)."""
    queries: str | list[str] = Field(default_factory=list)
    """StableToolBench query files or folders: ``/mcp`` offers their tools, ``/mcp/queries/<group>/<query_id>``
    one query's; empty: ``/mcp`` offers every tool of ``tools_folder``."""
    sessions: bool = True
    """An MCP session (``Mcp-Session-Id``; the ``mcp`` command's whole run) is a server session: history-conditioned
    keys and simulation, local-tool state (API-Bank's per-session environments need it).  A frozen StableToolBench
    cache, which has no history keys, still answers a session's calls (read with the keys StableToolBench's client
    gives them, see ``engine.lookup_order``).  Off: MCP calls are sessionless, keyed as StableToolBench's client's,
    and recorded so (``X-STM-Session`` still applies)."""
    max_sessions: int = Field(default=2048, ge=1)
    """MCP sessions open at once over HTTP, all clients together.  A new one beyond it closes the least recently
    used idle session of the client that holds the most; with none idle it is refused (HTTP 503 naming this key)."""
    max_sessions_per_client: int = Field(default=256, ge=1)
    """MCP sessions one client address holds at once.  A new one beyond it closes that client's least recently
    used idle session (its id then answers 404: the client initializes again); with none idle it is refused."""

    @property
    def query_paths(self) -> list[str]:
        return [self.queries] if isinstance(self.queries, str) else list(self.queries)
class McpServerConfig(BaseModel):
    """One live MCP server (``mcp_servers.<name>``), in the ``mcpServers`` shape MCP clients and benchmarks use:
    ``{command, args, env, cwd}`` (stdio) or ``{url, headers}`` (streamable HTTP).  Keys other MCP clients add
    (``type``, ``disabled``, ``description``, ...) are read and ignored, so their JSON files are read as they are.
    ``env`` and ``headers`` values may be ``${VAR}`` references: resolved when the server starts, never stored."""

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    command: str | None = None
    """The program that starts the server (stdio), e.g. ``uvx`` or ``npx``."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for the server, over a minimal inherited set (``HOME``, ``PATH``, ...)."""
    cwd: str | None = None
    url: str | None = None
    """A streamable HTTP server's URL (instead of ``command``)."""
    headers: dict[str, str] = Field(default_factory=dict)
    disabled: bool = False
    """Left out, as MCP clients leave it out."""
    matcher: Literal["by-order", "exact"] = "by-order"
    """How a call finds its record: ``by-order``, the n-th identical call of a run gets the n-th answer (stateful
    servers); ``exact``, every identical call gets the first answer (stateless servers)."""
    ignore_fields: list[str] = Field(default_factory=list)
    """Argument fields (dotted paths, ``meta.timestamp``) left out of a call's key, and out of ``mcp verify``'s comparison."""
    live: bool = True
    """In ``record`` mode, ask the live server on a miss; ``false``: the simulator answers misses (replay with simulation)."""
    start_timeout_s: float = Field(default=30.0, gt=0, le=HOUR_S)
    """The longest the server may take to start and answer ``initialize`` and ``tools/list``."""
    call_timeout_s: float = Field(default=60.0, gt=0, le=HOUR_S)
    """The longest one ``tools/call`` may take; then the call is the server's failure."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("needs either command (a stdio server) or url (a streamable HTTP server)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s):// URL (got {self.url[:100]!r})")
        return self


#: a server name: the first part of its records' API (``@mcp/<name>/<tool>``) and a folder of a snapshot
MCP_SERVER_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


def read_mcp_servers(value: dict[str, Any] | str, resolve: Any) -> dict[str, McpServerConfig]:
    """``mcp_servers`` as its servers: a mapping, or the path of an MCP client's JSON file (``{"mcpServers": {...}}``
    or the mapping itself), read as it is.  :class:`ValueError` naming the server and the fix."""
    import json
    import re

    if isinstance(value, str):
        try:
            with open(resolve(value), encoding="utf-8") as handle:
                data = json.loads(handle.read(8 << 20))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{value}: cannot be read as an MCP servers JSON file ({exc})") from None
        value = data.get("mcpServers", data) if isinstance(data, dict) else data
    if not isinstance(value, dict):
        raise ValueError('must map server names to {command, args, env} or {url, headers} (as "mcpServers" does)')
    servers = {}
    for name, spec in value.items():
        if not isinstance(name, str) or not re.fullmatch(MCP_SERVER_NAME, name):
            raise ValueError(f"server name {str(name)[:80]!r}: use letters, digits, '_', '.', '-' (at most 64)")
        try:
            server = spec if isinstance(spec, McpServerConfig) else McpServerConfig.model_validate(spec)
        except Exception as exc:  # pydantic's error, or the shape check above
            raise ValueError(f"{name}: {str(exc).splitlines()[-1] if str(exc) else exc}") from None
        if not server.disabled:
            servers[name] = server
    return servers


class ApiBankConfig(Section):
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


class ModelServerConfig(Section):
    """One OpenAI-compatible server that answers model calls (``llm.upstreams[]``)."""

    base_url: str
    """Its OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1`` (requests go to ``<base_url>/chat/completions``)."""
    models: list[str] = Field(default_factory=lambda: ["*"])
    """The models it answers: ``fnmatch`` patterns (``gpt-4*``); the first upstream whose pattern matches wins."""
    api_key_env: str | None = None
    """The environment variable holding its key; unset: the client's own ``Authorization`` is passed through.
    Either way the key is never stored, never part of a record's key and never logged."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s):// URL, e.g. http://127.0.0.1:8000/v1 (got {value[:100]!r})")
        return value.rstrip("/")

    @field_validator("models")
    @classmethod
    def _some_models(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError('needs at least one pattern (["*"] answers every model)')
        return value

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None if self.api_key_env else None


class LLMConfig(Section):
    """The recorded model calls at ``/v1`` (docs/model-calls.md): the agent's and the judge's chat completions."""

    upstreams: list[ModelServerConfig] = Field(default_factory=list)
    """Who answers a model call that is not recorded (none: every call must be recorded)."""
    mode: Mode | None = None
    """``record`` / ``replay`` / ``refresh`` for model calls; unset: the server's ``mode``."""
    run: str | None = Field(default=None, max_length=200)
    """The run whose identical requests are counted together (occurrence numbers); unset: each start of
    ``serve`` is a new run (all its workers together).  Name it to count several hosts of one Redis
    store together; a client names its own run with the ``X-STM-Run`` header."""
    reuse_answers: bool = True
    """In ``record`` mode, answer a model call from any recorded answer (the store's, the frozen caches').  ``false``:
    only from ``record.served_store`` (what this server's run was served already), every other call asked upstream
    and its answer written over the store's: a run of its own, never another run's answers (``score`` sets it
    unless ``--reuse-model-answers``).  ``false`` needs ``record.served_store``."""
    max_upstream_tokens: int | None = Field(default=None, ge=1)
    """Refuse upstream calls (HTTP 429, nothing recorded) once the upstream answers of this server's
    run used this many prompt plus completion tokens; unset: no budget."""
    timeout_s: float = Field(default=600.0, gt=0, le=DAY_S)
    """For one upstream call, from the request's first byte to the answer's last."""
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """The largest request body accepted (an agent's whole conversation)."""
