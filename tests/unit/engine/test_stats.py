"""The counters behind /stats and /metrics, in one process: each request counted once by its final outcome,
misses summed from their outcomes, the failure events, refusals and faults, and the bounded tables."""

from __future__ import annotations

import pytest

from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.engine import stats as stats_module
from stabletoolbench_mirror.engine.metrics import MULTIPROC_ENV, Counters
from stabletoolbench_mirror.engine.stats import COUNTER_NAMES, LocalEvents, Stats, event_section

API = "Data/t_for_Data/a"


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)


def outcome(kind: OutcomeKind, **fields: object) -> Outcome:
    return Outcome("{}", kind, **fields)  # type: ignore[arg-type]


def test_every_outcome_has_its_counter_and_they_add_up_to_the_requests() -> None:
    stats = Stats()
    for n, kind in enumerate(OutcomeKind, start=1):
        for _ in range(n):
            stats.count(outcome(kind))
    snap = stats.snapshot()
    assert set(COUNTER_NAMES) == set(OutcomeKind)
    assert {COUNTER_NAMES[kind]: snap[COUNTER_NAMES[kind]] for kind in OutcomeKind} == {
        COUNTER_NAMES[kind]: n for n, kind in enumerate(OutcomeKind, start=1)}
    assert snap["requests"] == sum(range(1, len(OutcomeKind) + 1))
    assert snap["misses"] == sum(n for n, kind in enumerate(OutcomeKind, start=1) if kind.is_miss)


def test_a_fresh_snapshot_counts_nothing() -> None:
    snap = Stats().snapshot()
    assert snap["requests"] == snap["hits"] == snap["misses"] == 0
    assert (snap["by_source"], snap["refusals"], snap["failures"], snap["faults"], snap["by_api"]) == ({}, {}, {}, {}, {})
    assert (snap["failure_records"], snap["failure_hits"], snap["retries"]) == (0, 0, 0)


def test_sources_and_the_per_api_table_with_its_misses() -> None:
    stats = Stats()
    for _ in range(3):  # the usual hit: its counters looked up once, then reused
        stats.count(outcome(OutcomeKind.HIT, source="frozen", api=API))
    stats.count(outcome(OutcomeKind.RECORDED, source="simulated", api=API))
    stats.count(outcome(OutcomeKind.UNANSWERED, api="Maps/m_for_Maps/b"))
    snap = stats.snapshot()
    assert snap["by_source"] == {"frozen": 3, "simulated": 1}
    assert snap["by_api"] == {API: {"hits": 3, "recorded": 1, "misses": 1}, "Maps/m_for_Maps/b": {"unanswered": 1, "misses": 1}}


def test_failure_events_refusals_problems_and_faults() -> None:
    stats = Stats()
    stats.count(outcome(OutcomeKind.FAILED, api=API, problems=("simulated: down", "real: HTTP 500"), new_failure_record=True, failure=True))
    stats.count(outcome(OutcomeKind.HIT, source="simulated", api=API, failure=True))
    stats.count(outcome(OutcomeKind.REPLACED, source="real", api=API, retried=True))
    stats.count(outcome(OutcomeKind.FAILED, api=API, retried=True, problems=("simulated: down",), failure=True))
    stats.count(outcome(OutcomeKind.REFUSED, status=503, limit="limits.max_queued"))
    stats.count(outcome(OutcomeKind.HIT, source="frozen", fault="timeout"))
    snap = stats.snapshot()
    assert (snap["failure_records"], snap["failure_hits"], snap["retries"]) == (1, 1, 2)
    assert snap["failures"] == {"simulated: down": 2, "real: HTTP 500": 1}
    assert list(snap["failures"]) == ["simulated: down", "real: HTTP 500"]  # most frequent first
    assert snap["refusals"] == {"limits.max_queued": 1} and snap["faults"] == {"timeout": 1}
    assert snap["requests"] == 6 and snap["failed"] == 2 and snap["hits"] == 2 and snap["misses"] == 3


def test_a_failed_request_served_from_a_failure_record_is_no_failure_hit_unless_it_was_a_hit() -> None:
    stats = Stats()
    stats.count(outcome(OutcomeKind.FAILED, failure=True))
    assert stats.snapshot()["failure_hits"] == 0


def test_the_per_api_table_is_bounded_by_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_module, "MAX_TRACKED_APIS", 2)
    stats = Stats()
    for name in ("A/a_for_A/1", "A/a_for_A/2", "A/a_for_A/3", "A/a_for_A/4", "A/a_for_A/1"):
        stats.count(outcome(OutcomeKind.HIT, source="frozen", api=name))
    assert stats.snapshot()["by_api"] == {"A/a_for_A/1": {"hits": 2}, "A/a_for_A/2": {"hits": 1}, "(other)": {"hits": 2}}


def test_the_per_api_table_is_bounded_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_module, "MAX_TRACKED_API_BYTES", 10)
    stats = Stats()
    stats.count(outcome(OutcomeKind.UNANSWERED, api="é" * 5))  # 10 bytes: fits
    stats.count(outcome(OutcomeKind.UNANSWERED, api="x"))  # one more byte: does not
    assert stats.snapshot()["by_api"] == {"é" * 5: {"unanswered": 1, "misses": 1}, "(other)": {"unanswered": 1, "misses": 1}}


def test_failure_reasons_are_cut_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_module, "MAX_TRACKED_FAILURES", 2)
    stats = Stats()
    long = "x" * 500
    stats.count(outcome(OutcomeKind.FAILED, problems=(long, long + "y", "b", "c", "d")))
    assert stats.snapshot()["failures"] == {"x" * stats_module.MAX_FAILURE_CHARS: 2, "b": 1, "(other)": 2}


def test_responder_events_are_counted_by_group() -> None:
    stats = Stats()
    for group, event in (("simulator", "parse_retries"), ("simulator", "parse_retries"), ("shadow", "shadow_recorded")):
        stats.count_event(group, event)
    assert stats.event_totals() == {"simulator": {"parse_retries": 2}, "shadow": {"shadow_recorded": 1}}
    assert event_section(stats, "simulator", ("parse_retries", "parse_retry_successes")) == {
        "simulator": {"parse_retries": 2, "parse_retry_successes": 0}}
    assert event_section(stats, "nobody", ("a",)) == {"nobody": {"a": 0}}


def test_local_events_count_as_the_servers_do() -> None:
    local = LocalEvents()
    local.count_event("simulator", "parse_retries")
    local.count_event("simulator", "parse_retries")
    assert local.event_totals() == {"simulator": {"parse_retries": 2}}
    assert event_section(local, "simulator", ("parse_retries", "x")) == {"simulator": {"parse_retries": 2, "x": 0}}


def test_the_exposition_names_the_counters_with_their_labels() -> None:
    stats = Stats()
    stats.count(outcome(OutcomeKind.HIT, source="frozen", api=API))
    stats.count(outcome(OutcomeKind.REFUSED, limit="limits.max_queued"))
    text = stats.exposition().decode()
    assert 'stm_requests_total{outcome="hit"} 1.0' in text and 'stm_requests_total{outcome="refused"} 1.0' in text
    assert f'stm_api_requests_total{{api="{API}",outcome="hit"}} 1.0' in text
    assert 'stm_refusals_total{setting="limits.max_queued"} 1.0' in text and "_created" not in text


def test_counters_of_two_instances_in_one_process_are_apart() -> None:
    a, b = Counters(), Counters()
    a.inc("requests", "hit", amount=3)
    bump = b.incrementer("requests", "hit")
    bump()
    bump()
    assert a.totals()["requests"] == {("hit",): 3.0} and b.totals()["requests"] == {("hit",): 2.0}
    assert a.shared_dir is None and b.totals()["faults"] == {}
