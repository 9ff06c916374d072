"""What a model call asks and what it is answered (:mod:`.model_calls`): the request parsed and checked, the answer.

:func:`prepare` parses a ``/v1`` body, checks it against its endpoint and computes its digest (the key of its
records, :mod:`stabletoolbench_mirror.core.model_calls`); :class:`ModelAnswer` is how a call ended, what to
send and what to count; :func:`error_answer` is this server's own error in OpenAI's shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from stabletoolbench_mirror.core import model_calls as mc
from stabletoolbench_mirror.core.model_calls import Endpoint
from stabletoolbench_mirror.core.protocol import encode_answer

#: the largest body parsed and hashed on the event loop (about a quarter of a millisecond); larger ones in a thread
ON_LOOP_BYTES = 64 * 1024
#: the most ``{``, ``[`` and ``,`` bytes a body may hold (its objects, arrays and items, those inside strings too):
#: ``json.loads`` is one C call that holds the GIL, in a worker thread too, for about 0.1 us a value (180 ms for
#: 480,000 small messages, 1 s for 5 million ``[]``); this bounds it to about 6 ms, some 16,000 messages
MAX_BODY_VALUES = 50_000


@dataclass(frozen=True)
class ModelAnswer:
    """How one model call ended: what to send, and what to count."""

    status: int
    body: bytes
    outcome: str
    """``hit``, ``recorded``, ``replaced`` (refresh), ``unanswered`` (not recorded, nobody to ask),
    ``refused`` (budget, a server limit), ``error`` (the upstream gave no completion, the store failed) or
    ``rejected`` (a bad request)."""
    source: str
    """``model`` (or the record's source: ``imported``, ``frozen``) for an answer; ``upstream`` for an upstream's
    error; ``mirror`` for this server's own error."""
    model: str = ""
    key: str | None = None
    """``<digest>#<occurrence>``."""
    run: str = ""
    retry: bool = True
    """Whether the client may send the same request again and get another answer (``False``: a bad request, a
    spent budget, a call not recorded in replay; sent as ``X-Should-Retry: false``, which the ``openai`` SDK obeys)."""
    stream: bool | None = None
    """For a request that asked ``stream: true``: whether it asked ``stream_options.include_usage`` (``None``: not streamed)."""


#: the outcomes that served a completion
ANSWERED = frozenset({"hit", "recorded", "replaced"})


@dataclass(slots=True)
class ModelRequest:
    """A parsed request of one endpoint, with what its key and budget need (:func:`prepare`)."""

    body: dict[str, Any]
    endpoint: Endpoint
    model: str
    digest: str
    size: int
    """Its canonical JSON's size in bytes (its prompt's part of :func:`~stabletoolbench_mirror.core.model_calls.token_estimate`)."""
    large: bool = False
    """Over :data:`ON_LOOP_BYTES`: written in pieces for the upstream too (:func:`~stabletoolbench_mirror.core.model_calls.json_bytes`)."""


def prepare(raw: bytes, endpoint: Endpoint) -> ModelRequest | ModelAnswer:
    """The request in ``raw``, or the HTTP 400 answer to a body that is not one: not JSON, not UTF-8, not valid
    Unicode (a lone surrogate), nested past Python's recursion limit, or not a request of ``endpoint``; the HTTP 413
    answer to one of more than :data:`MAX_BODY_VALUES` values (counted before it is parsed)."""
    large = len(raw) > ON_LOOP_BYTES
    if large and (values := raw.count(b",") + raw.count(b"{") + raw.count(b"[")) > MAX_BODY_VALUES:
        return error_answer(413, f"the request body holds {values:,} JSON values (its ',', '{{' and '[' bytes, those inside strings "
                                 f"too); at most {MAX_BODY_VALUES:,} are read, about 16,000 messages: more than a model's "
                                 f"context holds", "invalid_request_error", "rejected", retry=False)
    try:
        body = mc.parse_request(raw)
        problem = endpoint.request_problem(body)
        if problem is not None:
            return error_answer(400, problem, "invalid_request_error", "rejected", param="model" if "model" in problem else None,
                                retry=False)
        if large:  # in pieces: the event loop runs between them (this is a worker thread)
            digest, size = mc.canonical_digest(body)
        else:
            canonical = mc.canonical_request(body).encode("utf-8")
            digest, size = hashlib.sha256(canonical).hexdigest(), len(canonical)
    except RecursionError:
        return error_answer(400, "the request body nests JSON too deep (about 1,000 levels is the most read)",
                            "invalid_request_error", "rejected", retry=False)
    except UnicodeEncodeError:
        return error_answer(400, "the request body holds a lone UTF-16 surrogate (\\ud800-\\udfff without its pair): not valid "
                                 "Unicode", "invalid_request_error", "rejected", retry=False)
    except (ValueError, UnicodeDecodeError) as exc:
        return error_answer(400, f"the request body is not JSON: {exc}", "invalid_request_error", "rejected", retry=False)
    return ModelRequest(body, endpoint, body["model"], digest, size, large)


def error_answer(status: int, message: str, type_: str, outcome: str, model: str = "", *, code: str | None = None,
                 param: str | None = None, retry: bool = True) -> ModelAnswer:
    """This server's own error answer, in OpenAI's shape (``source: mirror``)."""
    body = encode_answer(mc.error_body(message, type_, code, param)).encode("utf-8")
    return ModelAnswer(status, body, outcome, "mirror", model, retry=retry)
