"""The simulator: MirrorAPI (or any chat model) behind an OpenAI-compatible API, e.g. ``vllm serve``."""

from __future__ import annotations

from typing import Sequence

from ..config import ConfigError, Settings
from ..tooldocs import ToolDocs, tool_docs_for
from .client import ChatClient, ChatError, Completion
from .parsing import Parsed, parse_output
from .prompts import load_system_prompt
from .responder import Simulator, judge_output

__all__ = [
    "ChatClient",
    "ChatError",
    "Completion",
    "Parsed",
    "Simulator",
    "build_chat_client",
    "build_simulator",
    "judge_output",
    "parse_output",
]


def build_chat_client(settings: Settings, *, api_base: str | Sequence[str] | None = None) -> ChatClient:
    """The chat client of ``settings.simulator``; ``api_base`` replaces the configured endpoints."""
    cfg = settings.simulator
    endpoints = cfg.endpoints if api_base is None else ([api_base] if isinstance(api_base, str) else list(api_base))
    try:
        return _chat_client(settings, endpoints)
    except ValueError as exc:
        raise ConfigError(f"simulator.api_base: {exc}") from None


def _chat_client(settings: Settings, endpoints: list[str]) -> ChatClient:
    cfg = settings.simulator
    return ChatClient(
        endpoints,
        model=cfg.model,
        api_key=cfg.api_key.get_secret_value() if cfg.api_key is not None else None,
        temperature=cfg.temperature,
        max_tokens=cfg.max_tokens,
        seed=cfg.seed,
        connect_timeout_s=cfg.connect_timeout_s,
        read_timeout_s=cfg.read_timeout_s,
        max_retries=cfg.max_retries,
        backoff_s=cfg.backoff_s,
        balance=cfg.balance,
        pool_size=cfg.max_concurrency,
    )


def build_simulator(
    settings: Settings, *, api_base: str | Sequence[str] | None = None, docs: ToolDocs | None = None
) -> Simulator:
    """The simulator responder ``settings.simulator`` describes.

    ``api_base`` overrides ``simulator.api_base`` (e.g. the port of a vLLM server this
    process started itself); ``docs`` is a tool-doc registry shared with other parts.
    """
    cfg = settings.simulator
    system_prompt = None
    if cfg.system_prompt_file:
        path = settings.resolve(cfg.system_prompt_file)
        try:
            system_prompt = load_system_prompt(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"simulator.system_prompt_file: cannot read {path}: {exc}") from exc
    return Simulator(
        build_chat_client(settings, api_base=api_base),
        style=cfg.style,
        system_prompt=system_prompt,
        docs=docs if docs is not None else tool_docs_for(settings),
        max_examples=cfg.max_examples,
        examples_budget_chars=cfg.examples_budget_chars,
        structured_output=cfg.structured_output,
        structured_max_chars=cfg.structured_max_chars,
        max_concurrency=cfg.max_concurrency,
        validity=cfg.validity,
    )
