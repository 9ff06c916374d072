"""A running server's report: its ``GET /stats`` and ``GET /health``, read under one deadline and a size bound.

Both are fetched with ``requests`` (the package's blocking HTTP client), streamed: the body is read in
chunks and refused past ``max_bytes`` (a ``Content-Length`` over it is refused before any byte is read),
so a huge answer costs at most that much memory.  ``requests``' ``timeout`` bounds each socket
operation, not the whole answer (a server that trickles a byte a second never trips it), so the fetch
runs in a daemon thread and the caller waits for it until ``timeout_s`` after the start, whatever the
server does: that is the one deadline of the whole fetch (both URLs).  A thread left behind ends by its
own socket timeouts, which never exceed what was left of the deadline.

What the server answered is checked against the shape of ``/stats`` (:class:`Stats`, pydantic): a field
of the wrong type is a :class:`~.tally.ReportError` naming the field, never a traceback.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from typing import Annotated, Any

import requests
from pydantic import BaseModel, Field, ValidationError

from stabletoolbench_mirror.reporting.tally import ReportError, category_of, model_row, models_part, nested, sorted_counts, tool_of

#: the most ``/stats`` (or ``/health``) may be, MiB, by default: a server's ``/stats`` tracks at most
#: 10,000 APIs in 4 MiB of names (engine/stats.py), well under 16 MiB with their counters
MAX_MB = 64.0
_CHUNK = 64 * 1024
#: how a request of ``/stats`` ended, by the section of the page it is shown in
NOT_SERVED = ("rejected", "refused", "store_errors", "errors")
NEW_ANSWERS = ("recorded", "shared", "replaced", "unrecorded")
OUTCOMES = ("hits", "recorded", "shared", "failed", "replaced", "unrecorded", "unanswered", "local", *NOT_SERVED)

Count = Annotated[int, Field(ge=0, strict=True)]


class Stats(BaseModel):
    """The parts of ``/stats`` a report reads (see docs/monitoring.md); other keys are ignored."""

    requests: Count
    misses: Count = 0
    hits: Count = 0
    recorded: Count = 0
    shared: Count = 0
    failed: Count = 0
    replaced: Count = 0
    unrecorded: Count = 0
    unanswered: Count = 0
    local: Count = 0
    rejected: Count = 0
    refused: Count = 0
    store_errors: Count = 0
    errors: Count = 0
    failure_records: Count = 0
    failure_hits: Count = 0
    retries: Count = 0
    by_source: dict[str, Count] = Field(default_factory=dict)
    by_api: dict[str, dict[str, Count]]
    failures: dict[str, Count] = Field(default_factory=dict)
    faults: dict[str, Count] = Field(default_factory=dict)
    refusals: dict[str, Count] = Field(default_factory=dict)
    model_calls: dict[str, dict[str, Count]] = Field(default_factory=dict)


class Health(BaseModel):
    """The parts of ``/health`` a report reads."""

    responders: list[str] = Field(default_factory=list)
    simulator_prompt: dict[str, Any] | None = None
    mode: str | None = None
    version: str | None = None


# -- fetching -----------------------------------------------------------------------------------------


class _Fetch:
    """The answers of ``urls``, read one after the other in a daemon thread (see the module docstring)."""

    def __init__(self, urls: list[str], deadline: float, max_bytes: int) -> None:
        self.urls, self.deadline, self.max_bytes = urls, deadline, max_bytes
        self.bodies: list[Any] = []
        self.error: BaseException | None = None
        self.current = urls[0]
        self.done = threading.Event()

    def run(self) -> None:
        try:
            with requests.Session() as session:
                for url in self.urls:
                    self.current = url
                    self.bodies.append(self._read(session, url))
        except BaseException as exc:  # handed to the waiting caller, which raises it there
            self.error = exc
        finally:
            self.done.set()

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Late()
        return left

    def _read(self, session: requests.Session, url: str) -> Any:
        left = self._left()
        with session.get(url, stream=True, timeout=(left, left), headers={"Accept": "application/json",
                                                                          "Accept-Encoding": "identity"}) as response:
            if response.status_code != 200:
                hint = " (the server wants a token: the report reads /stats without one)" if response.status_code == 401 else ""
                raise ReportError(f"{url}: HTTP {response.status_code}{hint}")
            length = response.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > self.max_bytes:
                raise self._too_large(url, int(length))
            body = bytearray()
            for chunk in response.iter_content(_CHUNK):
                body += chunk
                if len(body) > self.max_bytes:
                    raise self._too_large(url, len(body))
                self._left()
        try:
            return json.loads(bytes(body))
        except (ValueError, RecursionError) as exc:
            raise ReportError(f"{url}: not JSON ({str(exc)[:200]}): is `stabletoolbench-mirror serve` running there?") from None

    def _too_large(self, url: str, size: int) -> ReportError:
        return ReportError(f"{url}: the answer is over {self.max_bytes / 2**20:g} MiB ({size / 2**20:,.1f} MiB read or announced): "
                           "not a stabletoolbench-mirror /stats, or raise --max-mb")


class _Late(Exception):
    """The deadline passed (inside the fetching thread)."""


def fetch_json(urls: list[str], timeout_s: float, max_bytes: int) -> list[Any]:
    """The JSON answer of each of ``urls``, all of them read within ``timeout_s`` in all (:class:`ReportError` else)."""
    fetch = _Fetch(urls, time.monotonic() + timeout_s, max_bytes)
    threading.Thread(target=fetch.run, name="report-fetch", daemon=True).start()
    finished = fetch.done.wait(timeout_s)
    if not finished or isinstance(fetch.error, (_Late, requests.Timeout)):
        raise ReportError(f"{fetch.current}: no whole answer within --timeout {timeout_s:g} s (the deadline of the whole "
                          "fetch): is the server overloaded? raise --timeout")
    if isinstance(fetch.error, ReportError):
        raise fetch.error
    if isinstance(fetch.error, requests.RequestException):
        raise ReportError(f"{fetch.current}: cannot be read ({fetch.error}): is `stabletoolbench-mirror serve` running there?")
    if fetch.error is not None:
        raise fetch.error
    return fetch.bodies


def _checked(url: str, data: Any, shape: type[BaseModel]) -> dict[str, Any]:
    try:
        return shape.model_validate(data).model_dump()
    except ValidationError as exc:
        first = exc.errors()[:3]
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(the whole answer)'}: {e['msg']}" for e in first)
        more = f" (and {exc.error_count() - len(first)} more)" if exc.error_count() > len(first) else ""
        raise ReportError(f"{url}: not a stabletoolbench-mirror {shape.__name__.lower()} answer: {where}{more}") from None


def read_server(base: str, timeout_s: float, max_bytes: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(stats, health)`` of the server at ``base``, checked (:class:`Stats`, :class:`Health`)."""
    stats_url, health_url = base + "/stats", base + "/health"
    stats, health = fetch_json([stats_url, health_url], timeout_s, max_bytes)
    return _checked(stats_url, stats, Stats), _checked(health_url, health, Health)


# -- the figures ----------------------------------------------------------------------------------------


def server_requests(stats: dict[str, Any], health: dict[str, Any]) -> dict[str, Any]:
    """The report's counts of a running server's ``/stats`` (each ``/virtual`` request once)."""
    by_source = stats["by_source"]
    outcomes = {name: stats[name] for name in OUTCOMES}
    by_category: dict[str, Counter[str]] = defaultdict(Counter)
    by_tool: dict[str, Counter[str]] = defaultdict(Counter)
    for api, counts in stats["by_api"].items():
        for name, n in counts.items():
            if name in OUTCOMES:
                by_category[category_of(api)][name] += n
                by_tool[tool_of(api)][name] += n
    requests_ = stats["requests"]
    simulated = by_source.get("simulated", 0)
    return {
        "requests": requests_,
        "outcomes": outcomes,
        "misses": stats["misses"],
        "answered": answered(outcomes, by_source, health["responders"]),
        "by_source": dict(sorted(by_source.items())),
        "failure_records": stats["failure_records"],
        "failure_hits": stats["failure_hits"],
        "retries": stats["retries"],
        "failures": sorted_counts(stats["failures"]),
        "faults": sorted_counts(stats["faults"]),
        "refusals": sorted_counts(stats["refusals"]),
        "by_category": nested(by_category),
        "by_tool": nested(by_tool),
        "simulated_share": round(simulated / requests_, 6) if requests_ else 0.0,
        "simulator_prompt": health["simulator_prompt"],
        "mode": health["mode"],
        "version": health["version"],
    }


def server_models(stats: dict[str, Any]) -> dict[str, Any] | None:
    """``models`` of ``/stats``'s ``model_calls``: per model, the calls served, their outcomes, the tokens spent upstream."""
    rows = []
    for model, counts in stats["model_calls"].items():
        outcomes = {k: v for k, v in counts.items() if k not in ("requests", "prompt_tokens", "completion_tokens")}
        rows.append(model_row(model, None, calls=counts.get("requests", 0), distinct_requests=None,
                              prompt_tokens=counts.get("prompt_tokens", 0), completion_tokens=counts.get("completion_tokens", 0),
                              outcomes=dict(sorted(outcomes.items()))))
    rows.sort(key=lambda row: (-row["calls"], row["model"]))
    return models_part(rows) if rows else None


def answered(outcomes: dict[str, int], by_source: dict[str, int], responders: list[str]) -> dict[str, int]:
    """Each request once, by what answered it: the frozen cache, the store, a responder, ...

    ``/stats`` counts the source of a store hit and of a new answer alike, so new answers are
    ``real`` or ``simulated`` only when one of them is configured (``/health``'s ``responders``);
    with both they are counted as ``real_or_simulated``.
    """
    frozen = by_source.get("frozen", 0)
    new = sum(outcomes[name] for name in NEW_ANSWERS)
    out = {"frozen_cache": frozen, "store": max(outcomes["hits"] - frozen, 0)}
    named = [r for r in responders if r in ("real", "simulated")]
    if len(set(named)) == 1:
        out[named[0]] = new
    elif new:
        out["real_or_simulated"] = new
    out["local"] = outcomes["local"]
    out["failure"] = outcomes["failed"] + outcomes["unanswered"]
    out["not_served"] = sum(outcomes[name] for name in NOT_SERVED)
    return out
