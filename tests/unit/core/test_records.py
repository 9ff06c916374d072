"""Records: their JSON round trips (versions 1 and 2, failures, replaced failures, metadata), what is compared,
what an origin is counted under; and what an outcome is."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import pytest

from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.records import ANSWER, FAILURE, RECORD_VERSION, Record, origin_key

API = "Data/t_for_Data/a"


def test_an_answer_is_kept_in_its_served_encoding_and_round_trips() -> None:
    record = replace(Record.from_answer(API, "{'q': 'é'}", {"error": "", "response": {"b": 1, "a": "é"}}, "simulated", "m"), created_at=1.5)
    assert record.body == '{"error":"","response":{"b":1,"a":"é"}}' and record.answer == {"error": "", "response": {"b": 1, "a": "é"}}
    data = json.loads(record.to_json())
    assert data == {"v": RECORD_VERSION, "api": API, "key": "{'q': 'é'}", "body": record.body, "source": "simulated",
                    "origin": "m", "created_at": 1.5}
    assert "é" in record.to_json()  # not escaped
    again = Record.from_json(record.to_json())
    assert again == record and (again.outcome, again.reason, again.tried, again.replaced, again.meta) == (ANSWER, "", (), None, None)
    assert Record.from_json(record.to_json().encode()) == record


def test_record_json_round_trip_and_old_records() -> None:
    # moved from tests/integration/test_generation_meta.py: no server involved
    record = Record.from_answer(API, "{}", {"error": "", "response": "r"}, "simulated", "m", {"seed": 1})
    assert Record.from_json(record.to_json()).meta == {"seed": 1}
    plain = Record.from_answer(API, "{}", {"error": "", "response": "r"}, "real", "relay")
    assert "meta" not in json.loads(plain.to_json())  # records without metadata are written as before
    assert Record.from_json(plain.to_json()).meta is None


def test_a_failure_record_keeps_its_reason_cut_and_what_was_tried() -> None:
    failure = Record.failure(API, "k", {"error": "e", "response": ""}, "simulated", "m", reason="x" * 600, tried=["real:relay", "simulated:m"])  # type: ignore[arg-type]
    assert failure.is_failure and failure.outcome == FAILURE and len(failure.reason) == 500 and failure.tried == ("real:relay", "simulated:m")
    data = json.loads(failure.to_json())
    assert (data["outcome"], data["tried"]) == ("failure", ["real:relay", "simulated:m"])
    assert Record.from_json(failure.to_json()) == failure


def test_an_answer_that_replaced_a_failure_keeps_its_provenance() -> None:
    failure = replace(Record.failure(API, "k", {"error": "e", "response": ""}, "simulated", "m", reason="r", tried=("simulated:m",)),
                      created_at=7.0)
    provenance = failure.provenance()
    assert provenance == {"body": failure.body, "source": "simulated", "origin": "m", "created_at": 7.0, "reason": "r",
                          "tried": ["simulated:m"]}
    answer = replace(Record.from_answer(API, "k", {"error": "", "response": "ok"}, "real", "relay"), replaced=provenance)
    again = Record.from_json(answer.to_json())
    assert again.replaced == provenance and not again.is_failure


def test_version_1_records_named_the_api_namespace_and_other_versions_are_refused() -> None:
    old = json.dumps({"v": 1, "namespace": API, "key": "k", "body": "{}", "source": "real"})
    record = Record.from_json(old)
    assert (record.api, record.origin, record.created_at, record.outcome) == (API, "", 0.0, ANSWER)
    for version in (None, 0, 3, "2"):
        with pytest.raises(ValueError, match="unsupported record version"):
            Record.from_json(json.dumps({"v": version, "api": API, "key": "k", "body": "{}", "source": "real"}))


@pytest.mark.parametrize(
    ("extra", "outcome", "meta", "replaced", "tried"),
    [
        ({"outcome": "something else"}, ANSWER, None, None, ()),
        ({"meta": "not an object", "replaced": [1]}, ANSWER, None, None, ()),
        ({"meta": {"seed": 2}, "replaced": {"body": "{}"}}, ANSWER, {"seed": 2}, {"body": "{}"}, ()),
        ({"outcome": "failure", "tried": [1, "b"]}, FAILURE, None, None, ("1", "b")),
        ({"outcome": "failure", "tried": None}, FAILURE, None, None, ()),
    ],
)
def test_optional_fields_are_read_leniently(extra: dict, outcome: str, meta: object, replaced: object, tried: tuple[str, ...]) -> None:
    data = {"v": 2, "api": API, "key": "k", "body": "{}", "source": "real", **extra}
    record = Record.from_json(json.dumps(data))
    assert (record.outcome, record.meta, record.replaced, record.tried) == (outcome, meta, replaced, tried)


def test_meta_and_replaced_do_not_take_part_in_equality() -> None:
    a = replace(Record.from_answer(API, "k", {"response": 1}, "simulated", "m", {"seed": 1}), created_at=1.0)
    assert a == replace(a, meta={"seed": 2}) == replace(a, replaced={"body": "{}"})
    assert a != replace(a, body='{"response":2}') and a != replace(a, origin="other") and a != replace(a, created_at=2.0)


def test_kept_json_travels_with_a_pickled_record_and_is_the_same_text() -> None:
    # moved from tests/integration/test_generation_meta.py: cache import's readers encode records in their process
    record = Record.failure("Data/x_for_Data/y", "{'q': 1}", {"error": "e", "response": ""}, "imported", "import:t",
                            reason="r", tried=("simulated:m",))
    fresh = record.to_json()
    travelled = pickle.loads(pickle.dumps(record.keep_json()))
    assert travelled.__dict__.get("_json") == fresh and travelled.to_json() == fresh and travelled == record
    changed = replace(travelled, body='{"error":"","response":"other"}')
    assert changed.to_json() != fresh and Record.from_json(changed.to_json()).body == changed.body  # a copy never reuses it


@pytest.mark.parametrize(
    ("source", "origin", "key"),
    [
        ("imported", "tree/Data/t.json", "imported:tree"),
        ("imported", "plain", "imported:plain"),
        ("simulated", "org/model-7b", "simulated:org/model-7b"),  # a model name keeps its slash
        ("real", "http://relay.test/virtual", "real:http://relay.test/virtual"),
        ("local", "", "local:"),
    ],
)
def test_origin_key(source: str, origin: str, key: str) -> None:
    assert origin_key(Record.from_answer(API, "k", {}, source, origin)) == key  # type: ignore[arg-type]


def test_misses_are_the_outcomes_that_went_past_the_cache() -> None:
    misses = {kind for kind in OutcomeKind if kind.is_miss}
    assert misses == {OutcomeKind.RECORDED, OutcomeKind.SHARED, OutcomeKind.FAILED, OutcomeKind.UNANSWERED,
                      OutcomeKind.REPLACED, OutcomeKind.UNRECORDED}
    assert str(OutcomeKind.STORE_ERROR) == "store_error" and OutcomeKind("hit") is OutcomeKind.HIT


def test_an_error_outcome_is_upstreams_answer_shape() -> None:
    outcome = Outcome.error(503, "busy", OutcomeKind.REFUSED, limit="limits.max_pending_misses")
    assert (outcome.status, outcome.kind, outcome.limit, outcome.answer) == (503, OutcomeKind.REFUSED, "limits.max_pending_misses",
                                                                              {"error": "busy", "response": ""})
    assert Outcome.error(400, "bad").kind is OutcomeKind.REJECTED
