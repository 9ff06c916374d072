"""The simulator as a miss responder over the in-memory transport: what each kind of completion becomes (an answer,
a failure record's fallback, no answer), finish reasons, parse retries with another seed, and key scrubbing."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from typing import Any

import pytest

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.responders import http_transport as ht
from stabletoolbench_mirror.responders.simulator import client as client_module
from stabletoolbench_mirror.responders.simulator.client import ChatClient
from stabletoolbench_mirror.responders.simulator.responder import COMPLETE_FINISH_REASONS, Simulator, incomplete, text_before_answer
from tests.helpers import memory_transport as mt

CALL = ToolCall.of("Data", "Weather", "Get Forecast", {"city": "Paris"})
ANSWER = json.dumps({"error": "", "response": "{'forecast': 'sunny'}"})
KEY = "sk-simulator-0123456789abcdef"


def completion(content: Any = ANSWER, finish_reason: Any = "stop", **extra: Any) -> ht.Reply:
    choice = {"message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}
    return ht.Reply(200, {}, json.dumps({"model": "served", "choices": [choice], **extra}).encode())


class Script:
    def __init__(self, *steps: ht.Reply | Exception) -> None:
        self.steps = list(steps)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: mt.Request) -> ht.Reply:
        self.bodies.append(json.loads(request.body))
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    slept: list[float] = []
    monkeypatch.setattr(client_module, "time", types.SimpleNamespace(sleep=slept.append))
    yield slept


def simulator(script: Script, *, seed: int | None = 11, api_key: str | None = None, **options: Any) -> Simulator:
    client = ChatClient("http://sim.test/v1", model="mirror-model", seed=seed, max_retries=1, api_key=api_key,
                        transport_factory=mt.MemoryTransport.factory(script))
    return Simulator(client, **options)


def test_a_parsed_valid_answer_is_an_answer_with_what_the_generation_knew() -> None:
    script = Script(completion(usage={"prompt_tokens": 9, "completion_tokens": 4}))
    attempt = simulator(script).respond(CALL, ())
    assert attempt.answer == {"error": "", "response": "{'forecast': 'sunny'}"}
    assert (attempt.origin, attempt.detail, attempt.fallback) == ("mirror-model", "", None)
    assert attempt.meta is not None
    assert {k: attempt.meta[k] for k in ("style", "model", "seed", "finish_reason", "prompt_tokens", "completion_tokens")} == {
        "style": "mirrorapi-sft", "model": "served", "seed": 11, "finish_reason": "stop", "prompt_tokens": 9, "completion_tokens": 4}
    assert len(attempt.meta["prompt_sha256"]) == 64 and "parse_retries" not in attempt.meta
    (body,) = script.bodies
    assert body["model"] == "mirror-model" and body["seed"] == 11 and body["messages"][0]["role"] == "system"


@pytest.mark.parametrize("finish_reason", sorted(COMPLETE_FINISH_REASONS))
def test_every_natural_end_is_complete(finish_reason: str) -> None:
    assert simulator(Script(completion(finish_reason=finish_reason))).respond(CALL, ()).answer is not None


@pytest.mark.parametrize(
    ("finish_reason", "detail"),
    [
        ("length", "simulator output incomplete (finish_reason length)"),
        ("content_filter", "simulator output incomplete (finish_reason content_filter)"),
        ("tool_calls", "simulator output incomplete (finish_reason tool_calls)"),
        ("abort", "simulator output incomplete (finish_reason abort)"),
        (None, "simulator output incomplete (no finish_reason)"),
        ("", "simulator output incomplete (no finish_reason)"),
    ],
)
def test_an_incomplete_completion_that_parses_is_still_a_failure_and_not_asked_again(finish_reason: str | None, detail: str) -> None:
    script = Script(completion(finish_reason=finish_reason), completion())
    attempt = simulator(script, parse_retries=2).respond(CALL, ())
    assert (attempt.answer, attempt.detail, attempt.fallback) == (None, detail, protocol.simulation_failed_answer())
    assert len(script.bodies) == 1


def test_incomplete_names_the_cause_briefly() -> None:
    # moved from tests/integration/test_incomplete_completions.py: a pure function
    assert incomplete("stop") is None
    assert incomplete("length") == "simulator output incomplete (finish_reason length)"
    assert incomplete(None) == incomplete("") == "simulator output incomplete (no finish_reason)"
    assert len(incomplete("x" * 500) or "") < 120  # a server's runaway value does not become a huge cause


@pytest.mark.parametrize("content", ["I cannot help with that.", "", None, "```json\n```"])
def test_output_that_does_not_parse_is_a_failure_with_upstreams_failed_answer(content: Any) -> None:
    attempt = simulator(Script(completion(content))).respond(CALL, ())
    assert (attempt.answer, attempt.detail, attempt.fallback) == (None, "simulator output not parsable", protocol.simulation_failed_answer())


def test_unparsable_output_is_asked_again_with_the_next_seeds_and_counted() -> None:
    script = Script(completion("no json"), completion("still none"), completion())
    sim = simulator(script, parse_retries=2)
    attempt = sim.respond(CALL, ())
    assert attempt.answer is not None and attempt.meta is not None and attempt.meta["parse_retries"] == 2
    assert [body["seed"] for body in script.bodies] == [11, 12, 13] and attempt.meta["seed"] == 13
    assert sim.stats() == {"simulator": {"parse_retries": 2, "parse_retry_successes": 1}}


def test_without_a_seed_a_retry_sends_none_and_retries_end_at_their_bound() -> None:
    script = Script(completion("no"), completion("no"))
    sim = simulator(script, seed=None, parse_retries=1)
    assert sim.respond(CALL, ()).detail == "simulator output not parsable"
    assert ["seed" in body for body in script.bodies] == [False, False]
    assert sim.stats() == {"simulator": {"parse_retries": 1, "parse_retry_successes": 0}}


@pytest.mark.parametrize(
    ("steps", "detail"),
    [
        ((ht.Reply(503, {}, b'{"error": {"message": "overloaded"}}'),) * 2, "simulator unavailable: HTTP 503: overloaded"),
        ((ht.Reply(400, {}, b'{"message": "bad"}'),), "simulator unavailable: HTTP 400: bad"),
        ((ht.ConnectFailed("refused"),) * 2, "simulator unavailable: connection failed: refused"),
        ((ht.AnswerTimedOut("slow"),), "simulator unavailable: no answer within 120 s (read timeout)"),
        ((ht.Reply(200, {}, b'{"choices": []}'),), "simulator unavailable: the answer is not a chat completion"),
    ],
)
def test_no_completion_is_no_answer_and_no_fallback(steps: tuple[ht.Reply | Exception, ...], detail: str) -> None:
    script = Script(*steps)
    attempt = simulator(script).respond(CALL, ())
    assert (attempt.answer, attempt.detail, attempt.fallback) == (None, detail, None)
    assert not script.steps  # retried as the client retries, then given up


@pytest.mark.parametrize(
    ("validity", "recorded"),
    [("strict", False), ("compatible", False), ("off", True)],
)
def test_an_answer_the_validity_rules_reject_is_served_as_written_but_not_an_answer(validity: str, recorded: bool) -> None:
    written = {"error": "Rate limit exceeded", "response": ""}
    attempt = simulator(Script(completion(json.dumps(written))), validity=validity).respond(CALL, ())
    if recorded:
        assert attempt.answer == written
    else:
        assert attempt.answer is None and attempt.fallback == written and attempt.detail.startswith("invalid simulated answer: ")


def test_an_echoed_key_never_reaches_the_answer_or_its_metadata() -> None:
    echoed = json.dumps({"error": "", "response": f"token {KEY} and call key tb-0123456789"})
    script = Script(completion(f"Thinking with {KEY}\n{echoed}"))
    sim = simulator(script, api_key=KEY, redactor=Redactor([KEY]))
    attempt = sim.respond(ToolCall.of("Data", "Weather", "Get Forecast", {"city": "Paris"}, toolbench_key="tb-0123456789"), ())
    text = json.dumps([attempt.answer, attempt.meta])
    assert attempt.answer is not None and KEY not in text and "tb-0123456789" not in text
    assert attempt.meta is not None and attempt.meta["text_before_answer"].startswith("Thinking with ")


def test_a_lone_surrogate_in_the_preamble_is_kept_storable() -> None:
    attempt = simulator(Script(completion("pre \ud800 amble " + ANSWER))).respond(CALL, ())
    assert attempt.meta is not None
    attempt.meta["text_before_answer"].encode("utf-8")  # storable as UTF-8


@pytest.mark.parametrize(
    ("content", "before"),
    [
        (ANSWER, ""),
        ("Let me think.\n" + ANSWER, "Let me think."),
        ("Reasoning\n```json\n" + ANSWER + "\n```", "Reasoning"),
        ("Only text", ""),
    ],
)
def test_text_before_the_answer(content: str, before: str) -> None:
    assert text_before_answer(content) == before


def test_the_origin_is_the_model_and_its_suffix_never_the_endpoint() -> None:
    sim = simulator(Script(), origin_suffix=" [no tool docs]")
    assert sim.origin == "mirror-model [no tool docs]" and not sim.wants_examples
    with pytest.raises(ValueError, match="unknown simulator style"):
        simulator(Script(), style="nope")
    with pytest.raises(ValueError, match="unknown simulator validity rules"):
        simulator(Script(), validity="lenient")


def test_close_closes_the_clients_transports() -> None:
    sim = simulator(Script())
    sim.close()
    with pytest.raises(client_module.ChatError, match="connection failed"):
        sim.client.complete([{"role": "user", "content": "x"}])
