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

import os
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Union
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

ENV_PREFIX = "STM_"
DEFAULT_CONFIG_FILE = "server_config.yml"
#: ``STM_*`` variables that are not settings keys: the config file's path, the serve master's
#: hand-over to its workers, and the tooling's own (``STM_VLLM_*`` for the vLLM tier, ``STM_CI_*``)
NOT_SETTINGS_ENV = frozenset({"STM_CONFIG", "STM_SERVE_SETTINGS_JSON", "STM_REDIS_URL"})
NOT_SETTINGS_ENV_PREFIXES = ("STM_VLLM_", "STM_CI_")


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StoreConfig(_Section):
    kind: Literal["diskcache", "redis"] = "diskcache"
    path: str = "cache/store"
    """diskcache folder (``kind: diskcache``)."""
    url: Optional[str] = None
    """Redis URL, e.g. ``redis://127.0.0.1:6379/0`` (``kind: redis``)."""
    prefix: str = "stm"
    """Key prefix in Redis, so that several caches can share one server."""
    lock_ttl_s: float = Field(default=15.0, gt=0)
    """Lease of the cross-host single-flight lock (Redis): renewed while its holder works, so a
    holder that dies blocks the others for at most this long.  (diskcache's lock is a kernel
    file lock, dropped when its holder exits.)"""
    timeout_s: float = Field(default=2.0, gt=0)
    """Redis connect and command timeout: how fast a Redis outage becomes an error answer."""


class RealConfig(_Section):
    enabled: bool = False
    backend: Literal["relay", "rapidapi"] = "relay"
    relay_url: Optional[str] = None
    """StableToolBench's ``toolbench_url``: the ToolBench relay the real calls go to."""
    toolbench_key: Optional[SecretStr] = None
    """Used when a request carries no ``toolbench_key``."""
    rapidapi_key: Optional[SecretStr] = None
    rapidapi_base_url: Optional[str] = None
    """Send direct RapidAPI calls here instead of the doc's URL host (tests, proxies)."""
    allow_categories: list[str] = Field(default_factory=list)
    deny_categories: list[str] = Field(default_factory=list)
    allow_tools: list[str] = Field(default_factory=list)
    deny_tools: list[str] = Field(default_factory=list)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    read_timeout_s: float = Field(default=10.0, gt=0)
    breaker_failures: int = Field(default=5, ge=1)
    """Consecutive failures of one host that open its circuit breaker."""
    breaker_reset_s: float = Field(default=60.0, gt=0)
    """How long an open breaker skips real calls to its host."""
    strict_validity: bool = False
    """Use a stricter validity check than upstream's substring rules."""


SimulatorStyle = Literal["mirrorapi-sft", "mirrorapi-cot", "gpt-fewshot"]


class SimulatorConfig(_Section):
    enabled: bool = False
    style: SimulatorStyle = "mirrorapi-sft"
    api_base: Union[str, list[str]] = "http://127.0.0.1:12345/v1"
    """One OpenAI-compatible endpoint, or a list used round robin / least busy."""
    balance: Literal["round_robin", "least_busy"] = "least_busy"
    api_key: Optional[SecretStr] = None
    model: str = "MirrorAPI"
    temperature: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=2048, ge=1)
    seed: Optional[int] = 42
    connect_timeout_s: float = Field(default=3.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=0.5, ge=0)
    system_prompt_file: Optional[str] = None
    """A file whose text is sent verbatim as the system prompt (e.g. MirrorAPI's training prompt)."""
    structured_output: bool = False
    """Ask a vLLM endpoint for schema-constrained JSON (off: keep MirrorAPI's trained behaviour)."""
    structured_max_chars: Optional[int] = Field(default=None, ge=1)
    """With ``structured_output``: a ``maxLength`` for each string of the schema (small models need one to stop)."""
    fuzzy_match_score: float = Field(default=85.0, ge=0, le=100)
    """Lowest rapidfuzz score at which a slightly-off API name is matched to a tool doc."""
    max_examples: int = Field(default=5, ge=0)
    """``gpt-fewshot``: cached examples of the same API put in the prompt."""
    examples_budget_chars: int = Field(default=2048, ge=0)
    max_concurrency: int = Field(default=64, ge=1)
    """Simulator calls in flight at once from one process."""
    validity: Literal["strict", "compatible", "off"] = "strict"
    """The real API's validity rules applied to simulated answers: ``strict`` (``real.strict_validity``'s
    rules), ``compatible`` (StableToolBench's substring rules) or ``off``.  A rejected answer is served
    but recorded as a failure record (retried in record mode)."""

    @field_validator("api_base")
    @classmethod
    def _non_empty(cls, value: Union[str, list[str]]) -> Union[str, list[str]]:
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


class LimitsConfig(_Section):
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest accepted ``/virtual`` body; larger ones get HTTP 413."""
    max_in_flight_per_client: int = Field(default=64, ge=1)
    """Requests one client address has answered at once; more wait for a slot (in order, per client)."""
    max_pending_misses: int = Field(default=256, ge=1)
    """Misses being filled by the real API or simulator at once in one process; more wait for a turn."""
    queue_timeout_s: float = Field(default=600.0, gt=0)
    """Longest wait for a slot or a miss turn; a request still waiting then gets HTTP 503."""
    max_queued_requests: int = Field(default=100_000, ge=1)
    """Requests waiting for a slot across all clients; one more gets HTTP 503 at once."""
    max_queued_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)
    """Bytes of request bodies waiting for a slot across all clients; more get HTTP 503 at once."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection whose request headers are not complete this long after it opened (or after its
    previous answer) is closed."""
    body_timeout_s: float = Field(default=10.0, gt=0)
    """A request whose body has not fully arrived this long after its headers gets HTTP 408 and is closed."""
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    """An idle kept-alive connection is closed after this long."""


class Settings(_Section):
    mode: Literal["replay", "record"] = "record"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    auth_token: Optional[SecretStr] = None
    store: StoreConfig = Field(default_factory=StoreConfig)
    frozen_caches: list[str] = Field(default_factory=list)
    tools_folder: Optional[str] = None
    save: bool = True
    """Record new answers (upstream ``is_save``); when false, ``record`` answers but stores nothing."""
    real: RealConfig = Field(default_factory=RealConfig)
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    record: RecordConfig = Field(default_factory=RecordConfig)
    workers: int = Field(default=1, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    base_dir: str = Field(default=".", exclude=True)
    """The folder relative paths are resolved against (the config file's folder)."""

    def resolve(self, path: str) -> str:
        return str(Path(self.base_dir, os.path.expanduser(path)).resolve())

    def secrets(self) -> list[str]:
        """Every secret value configured, for redaction."""
        values = [self.auth_token, self.real.toolbench_key, self.real.rapidapi_key, self.simulator.api_key]
        found = [v.get_secret_value() for v in values if v is not None and v.get_secret_value()]
        if self.store.url:
            try:
                password = urlsplit(self.store.url).password
            except ValueError:
                password = None
            if password:
                found.append(password)
        return found


# StableToolBench's own config.yml keys and where they go
_LEGACY_KEYS = ("cache_folder", "is_save", "toolbench_url", "api_base", "api_key", "model", "temperature")


def _translate_legacy(data: dict[str, Any]) -> dict[str, Any]:
    """Map StableToolBench ``config.yml`` keys onto this model (only where they mean the same)."""
    if not any(k in data for k in _LEGACY_KEYS):
        return data
    data = dict(data)
    if "cache_folder" in data:
        frozen = list(data.get("frozen_caches") or [])
        folder = data.pop("cache_folder")
        if folder not in frozen:
            frozen.append(folder)
        data["frozen_caches"] = frozen
    if "is_save" in data:
        data["save"] = data.pop("is_save")
    if "toolbench_url" in data:
        real = dict(data.get("real") or {})
        real.setdefault("relay_url", data.pop("toolbench_url"))
        real.setdefault("enabled", True)
        real.setdefault("backend", "relay")
        data["real"] = real
    sim_keys = {"api_base": "api_base", "api_key": "api_key", "model": "model", "temperature": "temperature"}
    if any(k in data for k in sim_keys):
        sim = dict(data.get("simulator") or {})
        for old, new in sim_keys.items():
            if old in data:
                sim.setdefault(new, data.pop(old))
        sim.setdefault("enabled", True)
        # upstream main.py is the GPT-style simulator
        sim.setdefault("style", "gpt-fewshot")
        data["simulator"] = sim
    return data


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


def _format_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
        else:
            lines.append(f"{source}: invalid value for '{key}': {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Load settings: defaults < ``config_file`` < ``STM_*`` env vars < ``overrides`` (CLI flags).

    With ``config_file=None``, ``$STM_CONFIG`` or ``./server_config.yml`` is used when present.
    """
    environ = os.environ if environ is None else environ
    if config_file is None:
        config_file = environ.get("STM_CONFIG") or (DEFAULT_CONFIG_FILE if Path(DEFAULT_CONFIG_FILE).is_file() else None)
    data: dict[str, Any] = {}
    source = "defaults"
    base_dir = Path.cwd()
    if config_file is not None:
        path = Path(config_file)
        source = str(path)
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
        data = _translate_legacy(loaded)
        base_dir = path.resolve().parent
    env = _env_overrides(environ)
    if env:
        data = _merge(data, env)
        source += " + STM_* environment"
    if overrides:
        data = _merge(data, {k: v for k, v in overrides.items() if v is not None})
        source += " + command line"
    data.pop("base_dir", None)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, source)) from None
    settings.base_dir = str(base_dir)
    return settings
