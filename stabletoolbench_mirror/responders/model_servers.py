"""The OpenAI-compatible servers that answer model calls not recorded yet (``llm.upstreams``).

Each upstream is reached through a :class:`~stabletoolbench_mirror.responders.http_transport.Transport`
(httpcore by default: kept-alive pooling, interim answers skipped, proxies from the environment, an
overall deadline), so the agent's and the judge's calls get the same client as the simulator's.
The upstream is always asked for the whole completion (``stream`` off) at the endpoint's route under
its base URL (``<base_url>/chat/completions`` or ``<base_url>/completions``): a streamed request is
served as events built from it.  Which upstream answers a model: the first whose ``models``
patterns (``fnmatch``) match it.  Its key: the upstream's ``api_key_env`` variable, else the
client's own ``Authorization``; never kept beyond the request.
"""

from __future__ import annotations

import fnmatch
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from stabletoolbench_mirror.config import LLMConfig, ModelServerConfig
from stabletoolbench_mirror.core.model_calls import CHAT, Endpoint, json_bytes
from stabletoolbench_mirror.core.secrets import public_url
from stabletoolbench_mirror.engine.model_calls import ModelServerAnswer, ModelServerFailed
from stabletoolbench_mirror.responders.http_transport import (
    AnswerTimedOut,
    BrokenAnswer,
    ConnectFailed,
    HttpcoreTransport,
    SendFailed,
    Transport,
    TransportError,
    TransportFactory,
    TransportOptions,
)

CONNECT_TIMEOUT_S = 5.0  # an upstream's TCP and TLS connection (its answers are bounded by http_transport.MAX_ANSWER_BYTES)


class ModelServer:
    """One configured upstream and its transport."""

    def __init__(self, config: ModelServerConfig, options: TransportOptions, factory: TransportFactory | None = None) -> None:
        self.config = config
        self.patterns = tuple(config.models)
        self.url = public_url(config.base_url)
        """The base URL without credentials (what a record's provenance names)."""
        parsed = urllib.parse.urlsplit(config.base_url)
        self._prefix = parsed.path.rstrip("/")
        self._query = f"?{parsed.query}" if parsed.query else ""
        base = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, "", "", ""))
        self.transport: Transport = (factory or HttpcoreTransport)(base, options)

    def answers(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.patterns)

    def key(self, client_authorization: str | None) -> str | None:
        """The key sent upstream: ``api_key_env``'s, else the client's (``None``: none)."""
        configured = self.config.api_key()
        if configured:
            return configured
        if client_authorization:
            scheme, _, given = client_authorization.partition(" ")
            return given.strip() if scheme.lower() == "bearer" and given.strip() else None
        return None

    def complete(self, body: Mapping[str, Any], key: str | None, timeout_s: float, endpoint: Endpoint = CHAT, *,
                 large: bool = False) -> ModelServerAnswer:
        """POST the request (``stream`` off) to ``endpoint``'s route and return the answer, whatever its status;
        :class:`ModelServerFailed` when none came.  ``large``: written in pieces (:func:`~stabletoolbench_mirror.core.model_calls.json_bytes`)."""
        sent = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        headers = {"content-type": "application/json", "accept": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        started = time.monotonic()
        try:
            answer = self.transport.post(self._prefix + endpoint.path + self._query, json_bytes(sent, large), headers,
                                         answer_timeout_s=timeout_s)
        except AnswerTimedOut as exc:
            raise ModelServerFailed(504, f"the upstream {self.url} sent no complete answer within {timeout_s:g} s (llm.timeout_s)") from exc
        except (ConnectFailed, SendFailed) as exc:
            raise ModelServerFailed(502, f"cannot reach the upstream {self.url}: {exc}") from exc
        except BrokenAnswer as exc:
            raise ModelServerFailed(502, f"the upstream {self.url} sent a broken answer: {exc}") from exc
        except TransportError as exc:  # pragma: no cover - the four kinds above are all there are
            raise ModelServerFailed(502, f"the upstream {self.url} failed: {exc}") from exc
        return ModelServerAnswer(answer.status, answer.body, time.monotonic() - started,
                              answer.headers.get("content-type", "application/json"))

    def close(self) -> None:
        self.transport.close()


class ModelServers:
    """The configured upstreams, in order."""

    def __init__(self, config: LLMConfig, factory: TransportFactory | None = None) -> None:
        options = TransportOptions(pool_size=64, connect_timeout_s=CONNECT_TIMEOUT_S, answer_timeout_s=config.timeout_s)
        self.items: Sequence[ModelServer] = tuple(ModelServer(u, options, factory) for u in config.upstreams)

    def for_model(self, model: str) -> ModelServer | None:
        return next((u for u in self.items if u.answers(model)), None)

    def close(self) -> None:
        for upstream in self.items:
            upstream.close()
