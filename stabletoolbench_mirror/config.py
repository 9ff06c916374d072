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

This module holds the model (:class:`Settings`; its sections are :mod:`.config_sections`') and its handing to another process;
reading a file and merging the environment and flags over it is :mod:`.config_loading`'s, StableToolBench's
own config files are :mod:`.config_upstream`'s.  The names other modules read of theirs are importable from here too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, SecretStr

from stabletoolbench_mirror import config_loading
from stabletoolbench_mirror.config_loading import NO_CONFIG_FILE as NO_CONFIG_FILE
from stabletoolbench_mirror.config_loading import NOT_SETTINGS_ENV as NOT_SETTINGS_ENV
from stabletoolbench_mirror.config_loading import NOT_SETTINGS_ENV_PREFIXES as NOT_SETTINGS_ENV_PREFIXES
from stabletoolbench_mirror.config_loading import ConfigError as ConfigError
from stabletoolbench_mirror.config_loading import demo_config_file as demo_config_file
from stabletoolbench_mirror.config_sections import DAY_S as DAY_S
from stabletoolbench_mirror.config_sections import HOUR_S as HOUR_S
from stabletoolbench_mirror.config_sections import MAX_WORKERS as MAX_WORKERS
from stabletoolbench_mirror.config_sections import ApiBankConfig as ApiBankConfig
from stabletoolbench_mirror.config_sections import FaultsConfig as FaultsConfig
from stabletoolbench_mirror.config_sections import LimitsConfig as LimitsConfig
from stabletoolbench_mirror.config_sections import LLMConfig as LLMConfig
from stabletoolbench_mirror.config_sections import McpConfig as McpConfig
from stabletoolbench_mirror.config_sections import McpServerConfig as McpServerConfig
from stabletoolbench_mirror.config_sections import Mode as Mode
from stabletoolbench_mirror.config_sections import ModelServerConfig as ModelServerConfig
from stabletoolbench_mirror.config_sections import RealConfig as RealConfig
from stabletoolbench_mirror.config_sections import RecordConfig as RecordConfig
from stabletoolbench_mirror.config_sections import RefreshConfig as RefreshConfig
from stabletoolbench_mirror.config_sections import Section as Section
from stabletoolbench_mirror.config_sections import SessionsConfig as SessionsConfig
from stabletoolbench_mirror.config_sections import SimulatorConfig as SimulatorConfig
from stabletoolbench_mirror.config_sections import SimulatorStyle as SimulatorStyle
from stabletoolbench_mirror.config_sections import StoreConfig as StoreConfig
from stabletoolbench_mirror.config_sections import read_mcp_servers
from stabletoolbench_mirror.config_upstream import UPSTREAM_CONFIG_FILE as UPSTREAM_CONFIG_FILE
from stabletoolbench_mirror.config_upstream import UPSTREAM_DEFAULT_API_BASE as UPSTREAM_DEFAULT_API_BASE
from stabletoolbench_mirror.core.secrets import url_secrets


class Settings(Section):
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
    archive_max_members: int = Field(default=100_000, gt=0)
    """The most members (files and folders) a snapshot archive may hold; one with more is refused before
    anything is unpacked."""
    archive_max_ratio: float = Field(default=100, gt=1)
    """The most bytes an archive may unpack to per byte of it, counted as it is unpacked (past 16 MiB); more
    is an archive bomb, refused before it is written."""
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
    mcp_servers: dict[str, McpServerConfig] | str = Field(default_factory=dict)
    """Live MCP servers whose tools ``/mcp`` serves, recorded and replayed (docs/live-mcp.md): the ``mcpServers``
    mapping of MCP clients, or the path of such a JSON file, read as it is."""
    llm: LLMConfig = Field(default_factory=LLMConfig)
    """Recorded model calls (``/v1/chat/completions``): upstreams, mode, run, budget."""
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

    def live_servers(self) -> dict[str, McpServerConfig]:
        """``mcp_servers``' servers (a JSON file read now); :class:`ConfigError` naming the key and the fix."""
        try:
            return read_mcp_servers(self.mcp_servers, self.resolve)
        except ValueError as exc:
            raise ConfigError(f"mcp_servers: {exc}") from None

    def with_servers_read(self) -> Settings:
        """These settings with ``mcp_servers`` given as its servers when it names a JSON file (a snapshot's manifest keeps
        what the run used, not a path the reader does not have); as they are when the file cannot be read."""
        if not isinstance(self.mcp_servers, str):
            return self
        try:
            return self.model_copy(update={"mcp_servers": self.live_servers()})
        except ConfigError:
            return self

    def _mcp_secrets(self) -> list[str]:
        """The ``env`` and ``headers`` values of ``mcp_servers`` named like a credential (``*KEY*``, ``*TOKEN*``,
        ``Authorization``, ...) and written as they are (a ``${VAR}`` reference is no secret; the bearer's scheme is kept)."""
        try:
            servers = self.live_servers()
        except ConfigError:
            return []
        named = [v for s in servers.values() for k, v in (*s.env.items(), *s.headers.items())
                 if re.search(r"key|token|secret|pass|auth|cookie|credential", k, re.IGNORECASE)]
        values = [v.split(" ", 1)[1] if v.lower().startswith(("bearer ", "basic ", "token ")) else v for v in named]
        return [v for v in values if v and not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", v)]

    def secrets(self) -> list[str]:
        """Every secret value configured, for redaction (see :mod:`stabletoolbench_mirror.core.secrets`): the
        keys and the token, and any user, password or query value of a configured URL (:func:`url_secrets`)."""
        found = [
            v.get_secret_value()
            for v in (self.auth_token, self.real.toolbench_key, self.real.rapidapi_key, self.simulator.api_key)
            if v is not None and v.get_secret_value()
        ]
        found += [key for key in (u.api_key() for u in self.llm.upstreams) if key]
        found += self._mcp_secrets()
        urls = [self.store.url, self.real.relay_url, self.real.rapidapi_base_url, *self.simulator.endpoints,
                *(u.base_url for u in self.llm.upstreams)]
        return found + [secret for u in urls if u for secret in url_secrets(u)]


# -- loading (see :mod:`.config_loading` and :mod:`.config_upstream`) ------------------------------


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Load settings: defaults < ``config_file`` < ``STM_*`` env vars < ``overrides`` (CLI flags).

    With ``config_file=None``, ``$STM_CONFIG`` or ``./server_config.yml`` is used when present, else
    StableToolBench's ``./config.yml`` when it holds only known keys (see :func:`.config_loading.discover_config_file`).
    The work is :mod:`.config_loading`'s.
    """
    return config_loading.load(Settings, get_args(SimulatorStyle), config_file, overrides=overrides, environ=environ)


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
