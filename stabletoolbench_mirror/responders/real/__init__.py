"""The real API path: the ToolBench relay or direct RapidAPI calls, with StableToolBench's validity rules.

``build_real_responder(settings)`` gives the responder the layer asks before the
simulator.  Modules: :mod:`.validity` (which answers count), :mod:`.relay` and
:mod:`.rapidapi` (the two backends), :mod:`.transport` (pooled HTTP, timeouts),
:mod:`.breaker` (per-host circuit breakers), :mod:`.policy` (allow/deny lists).
"""

from __future__ import annotations

from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.responders.real.breaker import BreakerBoard
from stabletoolbench_mirror.responders.real.policy import CallPolicy
from stabletoolbench_mirror.responders.real.responder import RealResponder
from stabletoolbench_mirror.responders.real.transport import Transport
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs, tool_docs_for

__all__ = ["RealResponder", "build_real_responder"]

BREAKER_FAILURES = 5  # consecutive failures of one host that open its circuit breaker
BREAKER_RESET_S = 60.0  # how long an open breaker skips real calls to its host


def build_real_responder(settings: Settings, *, docs: ToolDocs | None = None) -> RealResponder:
    """The real-API responder that ``settings.real`` describes (``ConfigError`` when it is incomplete).

    ``docs`` is a tool-doc registry shared with other parts (built from ``tools_folder`` when not given).
    """
    cfg = settings.real
    transport = Transport(
        connect_timeout_s=cfg.connect_timeout_s,
        read_timeout_s=cfg.read_timeout_s,
        breakers=BreakerBoard(BREAKER_FAILURES, BREAKER_RESET_S),
        pool_size=max(16, min(256, settings.limits.max_pending_misses)),
    )
    backend: object
    if cfg.backend == "relay":
        from stabletoolbench_mirror.responders.real.relay import RelayBackend

        if not cfg.relay_url:
            raise ConfigError("real.relay_url: required when real.enabled is true and real.backend is 'relay'")
        _check_http_url("real.relay_url", cfg.relay_url)
        key = cfg.toolbench_key.get_secret_value() if cfg.toolbench_key else ""
        backend = RelayBackend(transport, cfg.relay_url, key)
    else:
        from stabletoolbench_mirror.responders.real.rapidapi import RapidAPIBackend, exact_doc_finder

        if not settings.tools_folder:
            raise ConfigError("tools_folder: required when real.backend is 'rapidapi' (the tool docs give the URLs)")
        if cfg.rapidapi_base_url:
            _check_http_url("real.rapidapi_base_url", cfg.rapidapi_base_url)
        key = cfg.rapidapi_key.get_secret_value() if cfg.rapidapi_key else ""
        registry = docs if docs is not None else tool_docs_for(settings)
        assert registry is not None
        backend = RapidAPIBackend(transport, exact_doc_finder(registry), key, cfg.rapidapi_base_url)
    policy = CallPolicy.of(cfg.allow_categories, cfg.deny_categories, cfg.allow_tools, cfg.deny_tools)
    return RealResponder(
        backend,
        transport,
        policy=policy,
        strict_validity=cfg.strict_validity,
        secrets=settings.secrets(),
    )


def _check_http_url(key: str, url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: not an http(s) URL")
