"""Counters shared by every worker of a server, in the Prometheus text format (``GET /metrics``).

The counters live in prometheus-client metrics.  With ``serve --workers N`` the master makes an
empty folder and names it in ``PROMETHEUS_MULTIPROC_DIR`` before the workers start; each worker
then keeps its counts in a memory-mapped file there (prometheus-client's multiprocess mode), and
any worker reads the sum over all of them (dead workers' files included: their requests happened).
So ``/metrics`` and ``/stats`` give the same totals whichever worker answers.  In a single
process the counters are ordinary in-process metrics with their own registry.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
PREFIX = "stm"

# ``*_created`` samples would double every series and mean nothing across workers
prometheus_client.disable_created_metrics()


@dataclass(frozen=True)
class Family:
    name: str
    help: str
    labels: tuple[str, ...]


#: every counter family, by short name
FAMILIES = {
    "requests": Family("requests", "/virtual requests by final outcome", ("outcome",)),
    "sources": Family("answers_by_source", "served cache hits and recorded answers by source", ("source",)),
    "apis": Family("api_requests", "/virtual requests by API and outcome (bounded: rare APIs are counted as '(other)')", ("api", "outcome")),
    "failures": Family("responder_failures", "real API and simulator attempts that gave no usable answer, by reason", ("reason",)),
    "refusals": Family("refusals", "requests turned away by a server limit, by the setting to raise", ("setting",)),
    "events": Family("responder_events", "responders' own events (simulator parse retries, shadow simulations)", ("group", "event")),
    "records": Family(
        "failure_events",
        "failure records: written (failure_records), served from the cache (failure_hits), tried again (retries)",
        ("event",),
    ),
    "faults": Family("faults_served", "answers replaced by an injected fault (faults:), by kind", ("kind",)),
    "model_requests": Family("model_requests", "/v1/chat/completions requests by model and outcome (bounded: rare models are counted as '(other)')",
                             ("model", "outcome")),
    "model_upstream": Family("model_upstream_calls", "model calls sent to an upstream, by model", ("model",)),
    "model_tokens": Family("model_tokens", "tokens of upstream answers (prompt, completion), by model", ("model", "kind")),
}


def multiprocess_dir() -> str | None:
    """The folder the workers share counts through, when this process is a worker of ``--workers N``."""
    return os.environ.get(MULTIPROC_ENV) or None


class SharedCountsFolder:
    """The master's side: a fresh folder for the workers' counts, named in the environment, removed at the end."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="stm-metrics-")

    def __enter__(self) -> SharedCountsFolder:
        os.environ[MULTIPROC_ENV] = self.path
        return self

    def __exit__(self, *exc: object) -> None:
        if os.environ.get(MULTIPROC_ENV) == self.path:
            del os.environ[MULTIPROC_ENV]
        shutil.rmtree(self.path, ignore_errors=True)


class Counters:
    """Labelled counters; shared across worker processes when :func:`multiprocess_dir` is set."""

    def __init__(self) -> None:
        self.shared_dir = multiprocess_dir()
        # each instance has its own registry: several apps in one process (tests) never collide
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, Counter] = {}
        for key, family in FAMILIES.items():
            self._metrics[key] = Counter(
                family.name, family.help, family.labels, namespace=PREFIX,
                registry=None if self.shared_dir else self.registry,
            )
        self._children: dict[tuple[str, tuple[str, ...]], object] = {}

    def inc(self, family: str, *labels: str, amount: float = 1) -> None:
        self._child(family, labels).inc(amount)  # type: ignore[attr-defined]

    def _child(self, family: str, labels: tuple[str, ...]) -> object:
        key = (family, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, self._metrics[family].labels(*labels))
        return child

    def incrementer(self, family: str, *labels: str) -> Callable[[], None]:
        """A function that adds 1 to one counter (for callers that add to the same counters again and again)."""
        child = self._child(family, labels)
        value = getattr(child, "_value", None)  # prometheus-client's value of the child (its own lock, its own mmap file)
        if value is not None and callable(getattr(value, "inc", None)):
            # Counter.inc's checks (observable, amount >= 0, exemplar) hold once for all: straight to the value
            return functools.partial(value.inc, 1)
        return child.inc  # type: ignore[attr-defined]

    def _collect(self) -> Iterator[prometheus_client.Metric]:
        if self.shared_dir:
            return iter(MultiProcessCollector(None, self.shared_dir).collect())
        return iter(self.registry.collect())

    def totals(self) -> dict[str, dict[tuple[str, ...], float]]:
        """Every family's counts by label values, summed over all workers."""
        by_name = {f"{PREFIX}_{family.name}": key for key, family in FAMILIES.items()}
        out: dict[str, dict[tuple[str, ...], float]] = {key: {} for key in FAMILIES}
        for metric in self._collect():
            key = by_name.get(metric.name)
            if key is None:
                continue
            labels = FAMILIES[key].labels
            for sample in metric.samples:
                if not sample.name.endswith("_total"):
                    continue
                values = tuple(sample.labels.get(label, "") for label in labels)
                out[key][values] = out[key].get(values, 0.0) + sample.value
        return out

    def exposition(self) -> bytes:
        """The Prometheus text format of every counter (all workers summed)."""
        if self.shared_dir:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, self.shared_dir)
            return generate_latest(registry)
        return generate_latest(self.registry)
