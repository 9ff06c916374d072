"""Loading the settings: the config file found, read and translated, ``STM_*`` variables and flags merged
over it, and the errors that name the key at fault.

Precedence (later wins): built-in defaults < the YAML file < ``STM_*`` environment variables <
command-line flags (see :mod:`stabletoolbench_mirror.config`).  StableToolBench's own files are read
through :mod:`.config_upstream`.  The settings model is handed in (``model``):
:mod:`stabletoolbench_mirror.config` defines it and imports this module, never the other way, and
re-exports the names other modules read here (``ConfigError``, ``NO_CONFIG_FILE``, ...) from its own path.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from stabletoolbench_mirror.config_upstream import (
    UPSTREAM_CONFIG_FILE,
    UPSTREAM_KEYS,
    clearly_upstream,
    final_style_source,
    style_note,
    translate_legacy,
)

if TYPE_CHECKING:  # the model is handed in: config imports this module
    from stabletoolbench_mirror.config import Settings

ENV_PREFIX = "STM_"
DEFAULT_CONFIG_FILE = "server_config.yml"
#: ``STM_*`` variables that are not settings keys: the config file's path, the serve master's
#: hand-over to its workers, and the tooling's own (``STM_VLLM_*`` for the vLLM tier, ``STM_CI_*``)
NOT_SETTINGS_ENV = frozenset({"STM_CONFIG", "STM_SERVE_SETTINGS_FILE", "STM_REDIS_URL"})
NOT_SETTINGS_ENV_PREFIXES = ("STM_VLLM_", "STM_CI_")

#: what a bounded key is for, added to the error of a value past its bound
BOUND_HINTS = {
    "limits.queue_timeout_s": "the longest a request waits for a slot or a miss turn, in seconds: minutes, at most a day",
    "simulator.read_timeout_s": "how long one completion may take, in seconds: minutes for a slow model, at most an hour",
    "real.read_timeout_s": "how long one real API call may take, in seconds: at most an hour",
    "faults.rate": "the share of calls served a fault: from 0 (faults off) to 1 (every call)",
    "workers": f"uvicorn worker processes: about one per CPU core (this machine has {os.cpu_count() or 1})",
}


#: keys that are no longer settings -> the value each is fixed at (CHANGELOG.md names each constant, under the release that made it one)
REMOVED_KEYS = {
    "limits.header_timeout_s": "10 s", "limits.keep_alive_timeout_s": "5 s", "limits.max_queued_requests": "100,000 requests",
    "store.lock_ttl_s": "15 s", "real.breaker_failures": "5 failures", "real.breaker_reset_s": "60 s",
    "simulator.backoff_s": "0.5 s, doubled for each next retry", "simulator.examples_budget_chars": "2,048 characters",
    "sessions.max_state_bytes": "1 MiB", "sessions.max_task_chars": "20,000 characters", "mcp.session_idle_timeout_s": "1,800 s",
    "llm.connect_timeout_s": "5 s", "llm.max_answer_bytes": "16 MiB", "download_min_kb_per_s": "10 KB/s", "download_low_speed_s": "60 s",
}


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


def _upstream_file_problem(path: Path, model: type[BaseModel]) -> str | None:
    """Why ``path`` (a ``config.yml`` found in the working folder) is not used, or ``None`` to use it
    (``model``: the settings, whose keys it may hold too)."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read it: {exc}"
    except yaml.YAMLError as exc:
        return f"not valid YAML: {str(exc).splitlines()[0]}"
    if not isinstance(loaded, dict):
        return "its top level is not a mapping of keys"
    unknown = sorted(str(k) for k in loaded if k not in UPSTREAM_KEYS and k not in model.model_fields)
    if unknown and not clearly_upstream(loaded, unknown):
        known = [*UPSTREAM_KEYS, *(n for n, f in model.model_fields.items() if not f.exclude)]
        shown = [k + (f" (did you mean '{near}'?)" if (near := nearest_key(k, known)) else "") for k in unknown[:5]]
        return f"unknown keys {', '.join(shown)}: not StableToolBench's server config"
    # used; an unknown key of a file that is clearly upstream's is then an error naming it (a typo
    # such as ``is_sav`` must not start the server on the defaults)
    return None


#: the start-up summary's words for a start that found no config file (``config: defaults (no ... in DIR: ...)``)
NO_CONFIG_FILE = f"no {DEFAULT_CONFIG_FILE} or {UPSTREAM_CONFIG_FILE}"


def demo_config_file() -> Path | None:
    """The repository's own ``server_config.yml`` (the demo caches of its ``cache/`` folder) when the package runs
    from a checkout (``pip install -e .``); ``None`` for an installed wheel, which ships no demo."""
    path = Path(__file__).resolve().parent.parent / DEFAULT_CONFIG_FILE
    return path if path.is_file() else None


def discover_config_file(environ: Mapping[str, str], model: type[BaseModel]) -> tuple[str | None, str]:
    """The config file to use when none is given, and a note on how it was chosen (or why none was)."""
    if environ.get("STM_CONFIG"):
        return environ["STM_CONFIG"], ""
    if Path(DEFAULT_CONFIG_FILE).is_file():
        return DEFAULT_CONFIG_FILE, ""
    upstream = Path(UPSTREAM_CONFIG_FILE)
    if not upstream.is_file():
        return None, f"{NO_CONFIG_FILE} in {Path.cwd()}: the built-in defaults, relative paths resolved against that folder"
    problem = _upstream_file_problem(upstream, model)
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


def _config_key(loc: tuple[Any, ...], model: Any) -> str:
    """The settings key an error is about: ``simulator.api_base``, ``frozen_caches[1]``.

    pydantic adds the members of a union to the location (``api_base.str``, ``api_base.list[str]``):
    below a field that is not a section, only list indexes are kept.
    """
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


def _keys_at(loc: tuple[Any, ...], settings: type[BaseModel]) -> list[str]:
    """The keys accepted in the section ``loc`` is in (upstream's too at the top level of ``settings``)."""
    model: Any = settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    known = [name for name, field in model.model_fields.items() if not field.exclude]
    return known + list(UPSTREAM_KEYS) if model is settings else known


def nearest_key(name: str, known: list[str]) -> str | None:
    """The known key ``name`` is most likely a typo of (difflib), or ``None`` when none is close."""
    found = difflib.get_close_matches(name, known, n=1, cutoff=0.75) or difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.75)
    if found:
        return found[0]
    # a key cut short or run on (``relay`` for ``relay_url``)
    cut = [k for k in known if len(name) >= 4 and (k.startswith(name.lower()) or name.lower().startswith(k))]
    return min(cut, key=lambda k: abs(len(k) - len(name))) if cut else None


def _did_you_mean(loc: tuple[Any, ...], key: str, model: type[BaseModel]) -> str:
    """`` (did you mean 'simulator.temperature'?)`` for the unknown key ``key`` at ``loc``, or nothing."""
    found = nearest_key(str(loc[-1]), _keys_at(loc, model)) if loc else None
    if found is None:
        return ""
    parent = key[: len(key) - len(str(loc[-1]))]
    return f" (did you mean '{parent}{found}'?)"


def format_error(exc: ValidationError, source: str, model: type[BaseModel]) -> str:
    """One line per key of ``model`` (the settings): ``unknown key``, a key that ``is no longer a setting`` (:data:`REMOVED_KEYS`),
    or ``invalid value`` with every reason given (a union gives several)."""
    lines: dict[tuple[str, str], list[str]] = {}
    for err in exc.errors():
        key = _config_key(tuple(err["loc"]), model)
        if err["type"] == "extra_forbidden":
            fixed = REMOVED_KEYS.get(key)
            lines.setdefault((key, ""), []).append(f"'{key}' is no longer a setting (fixed at {fixed}); remove it" if fixed
                                                   else f"unknown key '{key}'{_did_you_mean(tuple(err['loc']), key, model)}")
            continue
        got = "an empty value" if err.get("input") is None else repr(err.get("input"))
        reasons = lines.setdefault((key, got), [])
        msg = err["msg"]
        if err["type"] in ("less_than_equal", "less_than"):
            msg += f": {BOUND_HINTS.get(key, 'a value this large cannot work')}"
        if msg not in reasons:
            reasons.append(msg)
    return "\n".join(
        f"{source}: invalid value for '{key}': {', or '.join(reasons)} (got {got})" if got else f"{source}: {reasons[0]}"
        for (key, got), reasons in lines.items()
    )


def load(
    model: type[Settings],
    styles: Sequence[str],
    config_file: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """:func:`stabletoolbench_mirror.config.load_settings` of the settings ``model`` (``styles``: its simulator styles)."""
    environ = os.environ if environ is None else environ
    note = style_source = ""
    if config_file is None:
        config_file, note = discover_config_file(environ, model)
    data: dict[str, Any] = {}
    source = "defaults"
    base_dir = Path.cwd()
    if config_file is not None:
        path = Path(config_file)
        source = str(path)
        data, style_source = _read_config_file(path, environ, styles)
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
        settings = model(**data)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, source, model)) from None
    settings.base_dir = str(base_dir)
    settings.config_source = f"{source} ({note})" if note else source
    if style_source:
        settings.style_source = final_style_source(settings.simulator.style, style_source)
    return settings


def _read_config_file(path: Path, environ: Mapping[str, str], styles: Sequence[str]) -> tuple[dict[str, Any], str]:
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
    data = translate_legacy(loaded, environ, path)
    style_source = ""
    if data is not loaded and isinstance(data.get("simulator"), dict) and "style" not in (loaded.get("simulator") or {}):
        style_source = style_note(path, loaded, styles)
    return data, style_source

