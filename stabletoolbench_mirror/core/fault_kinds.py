"""The kinds of injected faults (``faults:``): their names, and the error texts StableToolBench's client maps.

Six kinds are StableToolBench's own error answers, served as ``{"error": <text>, "response": ""}``;
its client turns each text into a status code by exact comparison (see :mod:`.protocol`).  Four are
broken answers: ``empty`` (no response), ``truncated`` (the response text cut in half),
``malformed`` (the body itself cut, so it is not JSON: the client's status 12) and ``slow`` (the
right answer, after ``faults.slow_s`` seconds).  Stdlib only: the settings, the request path and
``faults profile`` all read these names.
"""

from __future__ import annotations

from stabletoolbench_mirror.core import protocol

#: the error-answer kinds: the ``error`` text served, in the client's status-code order (6 to 11)
ERROR_KINDS: dict[str, str] = {
    "api_not_working": protocol.API_NOT_WORKING,
    "unauthorized": protocol.UNAUTHORIZED,
    "unsubscribed": protocol.UNSUBSCRIBED,
    "too_many_requests": protocol.TOO_MANY_REQUESTS,
    "rate_limit_per_minute": protocol.RATE_LIMIT_PER_MINUTE,
    "message_error": protocol.MESSAGE_ERROR,
}
#: broken answers
BROKEN_KINDS: tuple[str, ...] = ("empty", "truncated", "malformed", "slow")
#: every kind, in the fixed order a fault's kind is drawn in (whatever order a config lists them)
KINDS: tuple[str, ...] = (*ERROR_KINDS, *BROKEN_KINDS)
#: the kind of each error text (``faults profile`` counts a cache's answers by it)
KIND_OF_ERROR: dict[str, str] = {text: kind for kind, text in ERROR_KINDS.items()}
