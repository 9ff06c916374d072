"""The report's counts: model calls (either endpoint, any model name) apart from tool answers."""

from __future__ import annotations

from stabletoolbench_mirror.core.model_calls import model_endpoint
from stabletoolbench_mirror.reporting.tally import ModelTally, tool_sources

DIGEST_A, DIGEST_B = "a" * 64, "b" * 64


def test_a_model_api_is_its_model_and_endpoint_and_a_tool_api_is_none() -> None:
    assert model_endpoint("@model/gpt-4o-mini/chat_completions") == ("gpt-4o-mini", "chat_completions")
    assert model_endpoint("@model/ToolBench/ToolLLaMA-2-7b-v2/completions") == ("ToolBench/ToolLLaMA-2-7b-v2", "completions")
    assert model_endpoint("Weather/demo_weather_for_Weather/current_weather") is None
    assert model_endpoint("@model/") is None and model_endpoint("@modelx/m/chat_completions") is None


def test_model_calls_count_occurrences_distinct_requests_and_each_completions_usage() -> None:
    tally = ModelTally()
    for key, tokens in ((f"{DIGEST_A}#1", (10, 2)), (f"{DIGEST_A}#2", (10, 3)), (f"{DIGEST_B}#1", (7, 1))):
        tally.add("judge", "chat_completions", key, {"choices": [], "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]}})
    tally.add("ToolLLaMA", "completions", f"{DIGEST_A}#1", {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 5, "completion_tokens": 4}})
    tally.add("ToolLLaMA", "completions", f"{DIGEST_B}#1", {"choices": [{"text": "y"}]})  # no usage: no tokens
    part = tally.to_json()
    assert part is not None
    assert [(r["model"], r["endpoint"], r["calls"], r["distinct_requests"], r["prompt_tokens"], r["completion_tokens"])
            for r in part["models"]] == [("judge", "chat_completions", 3, 2, 27, 6), ("ToolLLaMA", "completions", 2, 2, 5, 4)]
    assert (part["calls"], part["prompt_tokens"], part["completion_tokens"]) == (5, 32, 10)
    assert ModelTally().to_json() is None


def test_a_manifests_sources_less_its_model_calls_are_the_tool_answers_sources() -> None:
    assert tool_sources({"simulated": 3, "model": 30, "imported": 5}, 30) == {"imported": 5, "simulated": 3}
    # model calls brought in by `cache import` are counted under imported
    assert tool_sources({"simulated": 3, "imported": 35}, 30) == {"imported": 5, "simulated": 3}
