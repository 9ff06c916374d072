"""The fault plan's pure parts: the decision, the scope, the faulted bodies, the settings (issue 23)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from stabletoolbench_mirror.config import ConfigError, FaultsConfig, load_settings
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.fault_kinds import ERROR_KINDS, KINDS
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.engine.faults import FaultPlan, faulted_body

CLEAN = encode_answer({"error": "", "response": {"city": "Paris", "temperature_c": 14.0}})


def plan(**faults: object) -> FaultPlan:
    return FaultPlan(FaultsConfig(**faults))  # type: ignore[arg-type]


def test_error_kinds_are_upstreams_exact_texts_in_the_clients_status_order() -> None:
    assert ERROR_KINDS == {
        "api_not_working": "API not working error...", "unauthorized": "Unauthorized error...",
        "unsubscribed": "Unsubscribed error...", "too_many_requests": "Too many requests error...",
        "rate_limit_per_minute": "Rate limit per minute error...", "message_error": "Message error...",
    }
    # in the order of the status codes StableToolBench's client (rapidapi.py _step) gives them, 6 to 11
    assert list(ERROR_KINDS) == ["api_not_working", "unauthorized", "unsubscribed", "too_many_requests", "rate_limit_per_minute",
                                 "message_error"]
    for kind, text in ERROR_KINDS.items():
        assert json.loads(faulted_body(CLEAN, kind)) == {"error": text, "response": ""}


def test_broken_bodies() -> None:
    assert json.loads(faulted_body(CLEAN, "empty")) == {"error": "", "response": ""}
    cut = json.loads(faulted_body(CLEAN, "truncated"))
    text = json.dumps({"city": "Paris", "temperature_c": 14.0}, ensure_ascii=False)
    assert cut == {"error": "", "response": text[: len(text) // 2]}
    assert json.loads(faulted_body(encode_answer({"error": "", "response": "abcdef"}), "truncated"))["response"] == "abc"
    malformed = faulted_body(CLEAN, "malformed")
    assert CLEAN.startswith(malformed) and len(malformed) == len(CLEAN) // 2
    with pytest.raises(ValueError):
        json.loads(malformed)
    assert faulted_body(CLEAN, "slow") == CLEAN
    with pytest.raises(ValueError, match="unknown fault kind"):
        faulted_body(CLEAN, "nope")


def test_rate_and_weights_are_met_and_the_draw_is_fixed() -> None:
    p = plan(seed=1, rate=0.3, kinds={"empty": 3, "slow": 1, "unauthorized": 0})
    assert p.kinds == ("empty", "slow")  # zero weights left out, KINDS order
    drawn = [p.kind_for("Cat/t_for_Cat/a", f"{{'n': {i}}}") for i in range(20_000)]
    assert drawn == [p.kind_for("Cat/t_for_Cat/a", f"{{'n': {i}}}") for i in range(20_000)]
    counts = Counter(drawn)
    assert 0.28 < (20_000 - counts[None]) / 20_000 < 0.32
    assert 2.6 < counts["empty"] / counts["slow"] < 3.4
    assert FaultPlan.from_config(FaultsConfig()) is None  # rate 0: no plan at all
    everything = plan(rate=1.0)
    assert {everything.kind_for("A/b_for_A/c", str(i)) for i in range(2000)} == set(KINDS)


def test_scope_matches_names_as_sent_or_standardised() -> None:
    call = ToolCall.of("Weather", "Demo Weather", "Current Weather", {"city": "Paris"})
    assert call.api == "Weather/demo_weather_for_Weather/current_weather"
    for scope in ({"categories": ["Weather"]}, {"tools": ["Demo Weather"]}, {"tools": ["demo_weather"]},
                  {"apis": ["current_weather"]}, {"apis": ["Current Weather"]}, {"apis": [call.api]},
                  {"apis": ["Weather/Demo Weather/Current Weather"]}, {"categories": ["Weather"], "tools": ["demo_weather"]}):
        assert plan(rate=1.0, **scope).in_scope(call), scope
    for scope in ({"categories": ["Data"]}, {"tools": ["other"]}, {"apis": ["forecast"]},
                  {"categories": ["Weather"], "tools": ["other"]}):
        assert not plan(rate=1.0, **scope).in_scope(call), scope
    outcome = Outcome(CLEAN, OutcomeKind.HIT, api=call.api)
    assert plan(rate=1.0, apis=["forecast"]).fault_for(call, outcome) is None
    assert plan(rate=1.0, apis=["current_weather"]).fault_for(call, outcome) is not None


def test_only_answers_to_tool_calls_are_faulted() -> None:
    call = ToolCall.of("Weather", "Demo Weather", "Current Weather", {"city": "Paris"})
    p = plan(rate=1.0)
    for kind in (OutcomeKind.HIT, OutcomeKind.RECORDED, OutcomeKind.SHARED, OutcomeKind.FAILED, OutcomeKind.REPLACED,
                 OutcomeKind.UNRECORDED, OutcomeKind.UNANSWERED):
        assert p.fault_for(call, Outcome(CLEAN, kind)) is not None, kind
    for kind in (OutcomeKind.LOCAL, OutcomeKind.REJECTED, OutcomeKind.REFUSED, OutcomeKind.STORE_ERROR, OutcomeKind.ERROR):
        assert p.fault_for(call, Outcome(CLEAN, kind)) is None, kind
    assert p.fault_for(call, Outcome(CLEAN, OutcomeKind.HIT, status=503)) is None
    # inside a session: the key the call was answered under, and none without one
    assert p.fault_for(call, Outcome(CLEAN, OutcomeKind.HIT), in_session=True) is None
    served = p.serve_blocking(call, Outcome(CLEAN, OutcomeKind.HIT))
    assert served.fault in KINDS and served.kind is OutcomeKind.HIT


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        ({"rate": 0.3, "kinds": ["slw"]}, "invalid value for 'faults.kinds': Value error, unknown fault kind 'slw' (did you mean 'slow'?)"),
        ({"rate": 0.3, "kinds": {"empty": -1}}, "invalid value for 'faults.kinds': Value error, the weight of 'empty' must be a number of 0 or more"),
        ({"rate": 0.3, "kinds": {"empty": 0}}, "needs at least one kind with a weight above 0"),
        ({"rate": 0.3, "kinds": []}, "needs at least one kind with a weight above 0"),
        ({"rate": 1.5}, "invalid value for 'faults.rate': Input should be less than or equal to 1: the share of calls served a fault: from 0 (faults off) to 1"),
        ({"rate": -0.1}, "invalid value for 'faults.rate'"),
        ({"rate": 0.3, "sed": 3}, "unknown key 'faults.sed' (did you mean 'faults.seed'?)"),
        ({"slow_s": 0}, "invalid value for 'faults.slow_s'"),
        ({"apis": "current_weather"}, "invalid value for 'faults.apis'"),
    ],
)
def test_a_bad_faults_value_names_the_key_and_the_fix(tmp_path: Path, faults: dict, message: str) -> None:
    config = tmp_path / "server_config.yml"
    config.write_text(json.dumps({"faults": faults}))
    with pytest.raises(ConfigError) as exc:
        load_settings(config, environ={})
    assert message in str(exc.value)


def test_faults_from_the_environment_and_a_list_of_kinds(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yml"
    empty.write_text("{}\n")
    settings = load_settings(empty, environ={"STM_FAULTS__RATE": "0.25", "STM_FAULTS__SEED": "9", "STM_FAULTS__KINDS": "[empty, slow]"})
    assert (settings.faults.rate, settings.faults.seed, settings.faults.kinds) == (0.25, 9, {"empty": 1.0, "slow": 1.0})
    assert load_settings(empty, environ={}).faults.kinds == {kind: 1.0 for kind in KINDS}
