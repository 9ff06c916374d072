"""The simulator: MirrorAPI (or any chat model) behind an OpenAI-compatible API, e.g. ``vllm serve``."""

from __future__ import annotations

from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.core.secrets import redactor_for
from stabletoolbench_mirror.responders.simulator.client import ChatClient
from stabletoolbench_mirror.responders.simulator.parsing import parse_output
from stabletoolbench_mirror.responders.simulator.prompt_files import PromptFileError, SystemPrompt, resolve_system_prompt
from stabletoolbench_mirror.responders.simulator.prompts import MIRRORAPI_STYLES
from stabletoolbench_mirror.responders.simulator.responder import Simulator
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs, tool_docs_for, tools_folder_problem

__all__ = [
    "ChatClient",
    "Simulator",
    "SystemPrompt",
    "build_chat_client",
    "build_simulator",
    "parse_output",
    "prompt_warning",
    "system_prompt_for",
]

BACKOFF_S = 0.5  # the simulator's first wait before a retry, doubled for each next one (at most client.MAX_BACKOFF_S)


def build_chat_client(settings: Settings) -> ChatClient:
    """The chat client of ``settings.simulator``."""
    cfg = settings.simulator
    try:
        return ChatClient(
            cfg.endpoints,
            model=cfg.model,
            api_key=cfg.api_key.get_secret_value() if cfg.api_key is not None else None,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            seed=cfg.seed,
            connect_timeout_s=cfg.connect_timeout_s,
            read_timeout_s=cfg.read_timeout_s,
            max_retries=cfg.max_retries,
            backoff_s=BACKOFF_S,
            balance=cfg.balance,
            pool_size=cfg.max_concurrency,
        )
    except ValueError as exc:
        raise ConfigError(f"simulator.api_base: {exc}") from None


NO_DOCS_MARK = " [no tool docs]"
"""Ends the origin of answers simulated without any tool doc (``simulator.allow_without_docs``)."""


def simulates_without_docs(settings: Settings) -> bool:
    """Whether the simulator works with no tool docs at all (then its records are marked)."""
    return settings.simulator.enabled and tools_folder_problem(settings) is not None


def build_simulator(settings: Settings, *, docs: ToolDocs | None = None) -> Simulator:
    """The simulator responder ``settings.simulator`` describes; ``docs`` is a tool-doc registry shared with other parts."""
    cfg = settings.simulator
    # allowed only with simulator.allow_without_docs (the start-up checks refuse it otherwise)
    origin_suffix = NO_DOCS_MARK if cfg.allow_without_docs and simulates_without_docs(settings) else ""
    return Simulator(
        build_chat_client(settings),
        style=cfg.style,
        system_prompt=system_prompt_for(settings),
        docs=docs if docs is not None else tool_docs_for(settings),
        max_examples=cfg.max_examples,
        structured_output=cfg.structured_output,
        structured_max_chars=cfg.structured_max_chars,
        max_concurrency=cfg.max_concurrency,
        parse_retries=parse_retries_for(settings),
        redactor=redactor_for(settings),
        origin_suffix=origin_suffix,
        validity=cfg.validity,
    )


def system_prompt_for(settings: Settings, style: str | None = None) -> SystemPrompt:
    """The system prompt of ``style`` (default: ``simulator.style``) under ``simulator.system_prompt_file``."""
    cfg = settings.simulator
    path = settings.resolve(cfg.system_prompt_file) if cfg.system_prompt_file else None
    try:
        return resolve_system_prompt(style or cfg.style, path)
    except PromptFileError as exc:
        raise ConfigError(f"simulator.system_prompt_file: {exc}") from None


def parse_retries_for(settings: Settings) -> int:
    cfg = settings.simulator
    if cfg.parse_retries is not None:
        return cfg.parse_retries
    return 0 if cfg.style in MIRRORAPI_STYLES else 3


def prompt_warning(settings: Settings) -> str | None:
    """The start-up warning for a MirrorAPI style running on the built-in prompt, else ``None``."""
    cfg = settings.simulator
    if cfg.style not in MIRRORAPI_STYLES or cfg.system_prompt_file:
        return None
    if not (cfg.enabled or settings.real.shadow_simulate) or settings.mode == "replay":  # a replay never asks it
        return None
    return (
        f"simulator.style {cfg.style!r} runs on this project's built-in system prompt, but the MirrorAPI models "
        "were trained on StableToolBench's SFT_SYSTEM / COT_SYSTEM: set simulator.system_prompt_file to "
        "StableToolBench's server/system_prompts.py (or the folder of a StableToolBench checkout) for the "
        "prompt the model expects"
    )
