"""StableToolBench's own config files (its ``server/config.yml`` and the MirrorAPI servers' siblings).

Which of upstream's servers reads a file (:func:`upstream_server_for`), its keys translated onto this
package's settings where they mean the same (:func:`translate_legacy`), whether a file with unknown keys
is still clearly upstream's (:func:`clearly_upstream`), and the start-up note on how the simulator style
of such a file was chosen (:func:`style_note`).  Plain data in, plain data out: the settings model
itself is in :mod:`stabletoolbench_mirror.config`, which imports this module (never the other way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def translate_legacy(data: dict[str, Any], environ: Mapping[str, str] | None = None, path: Path | None = None) -> dict[str, Any]:
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


def clearly_upstream(loaded: Mapping[Any, Any], unknown: list[str]) -> bool:
    """Whether a file is StableToolBench's despite ``unknown`` keys: most of its keys are upstream's, one only upstream has among them."""
    upstream = [k for k in loaded if k in UPSTREAM_KEYS]
    return any(k in _LEGACY_KEYS for k in loaded) and len(upstream) > len(unknown)


def final_style_source(style: str, style_source: str) -> str:
    """The file's style note, or a note that the environment or command line set another ``style``."""
    inferred, why = style_source.split(": ", 1)
    if style != inferred:
        return f"{style}: set by the environment or command line (the file alone gives {inferred}: {why.split('; choose')[0]})"
    return style_source


def style_note(path: Path, loaded: Mapping[str, Any], styles: Sequence[str]) -> str:
    """``<style>: <why>; choose another with ...``: how a StableToolBench file's simulator style was chosen
    (``styles``: every simulator style, the others named in the note)."""
    server, why = upstream_server_for(path, loaded)
    others = ", ".join(s for s in styles if s != server.style)
    # run from upstream's server/ folder, the MirrorAPI configs lie beside config.yml
    beside = [s.config_file for s in UPSTREAM_SERVERS if s.style != server.style and (path.parent / s.config_file).is_file()]
    if server.style == "gpt-fewshot" and beside:
        why += f"; for MirrorAPI pass --config {' or '.join(beside)}"
    return (
        f"{server.style}: {why} ({server.prompt}); "
        f"choose another with STM_SIMULATOR__STYLE=<style> or 'simulator: {{style: <style>}}' in the file ({others})"
    )

