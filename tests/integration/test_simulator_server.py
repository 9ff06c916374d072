"""The simulator through the real HTTP server against a real OpenAI-compatible stub on 127.0.0.1.

For each way the model server can answer (valid JSON, JSON-like text, CoT, slow, 500, 429,
refused connection, hung socket): what ``/virtual`` answers, what is recorded and what
``/stats`` says, and that a recorded miss is served from the cache the second time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.responders import simulator as simulator_module
from stabletoolbench_mirror.responders.simulator import prompts
from stabletoolbench_mirror.responders.simulator.prompts import COT_SYSTEM_PROMPT, SFT_SYSTEM_PROMPT
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.live import free_port
from tests.helpers.openai_stub import OpenAIStub, Reply

API = "Data/keyword_analysis_for_Data/popularsitesforquery"
MODEL = "mirror-test-model"
API_KEY = "sk-simulator-secret-123"
TOOLBENCH_KEY = "tb-user-secret-456"


def payload(q: str = "birthday party ideas", **extra: Any) -> dict[str, Any]:
    body = {
        "category": "Data",
        "tool_name": "Keyword Analysis",
        "api_name": "PopularSitesForQuery",
        "tool_input": json.dumps({"q": q}),
        "strip": "truncate",
        "toolbench_key": TOOLBENCH_KEY,
    }
    body.update(extra)
    return body


def script(*replies: Reply) -> Callable[[dict[str, Any]], Reply]:
    """Replies in order; the last one repeats."""
    lock = threading.Lock()
    queue = list(replies)

    def responder(body: dict[str, Any]) -> Reply:
        with lock:
            return queue.pop(0) if len(queue) > 1 else queue[0]

    return responder


@pytest.fixture
def tools_folder(tmp_path: Path) -> Path:
    root = tmp_path / "tools"
    (root / "Data").mkdir(parents=True)
    (root / "Data" / "keyword_analysis.json").write_text(
        json.dumps(
            {
                "tool_name": "Keyword Analysis",
                "tool_description": "Find the sites that rank for a query.",
                "api_list": [
                    {
                        "name": "PopularSitesForQuery",
                        "description": "Popular sites for a search query.",
                        "method": "GET",
                        "required_parameters": [{"name": "q", "type": "STRING", "description": "query", "default": "cats"}],
                        "optional_parameters": [],
                    }
                ],
            }
        )
    )
    return root


@pytest.fixture
def mirror(serve, settings_factory, tools_folder: Path, tmp_path: Path, monkeypatch) -> Iterator[Callable[..., Any]]:
    """Start a mirror server whose simulator talks to ``api_base``; returns (server, layer)."""
    layers: list[MirrorLayer] = []
    monkeypatch.setattr(simulator_module, "BACKOFF_S", 0.01)

    def start(api_base: str | list[str], frozen_caches: Sequence[str] = (), **simulator: Any):
        cfg = {
            "enabled": True,
            "api_base": api_base,
            "model": MODEL,
            "api_key": API_KEY,
            "max_retries": 2,
            "read_timeout_s": 5.0,
            "connect_timeout_s": 1.0,
        }
        cfg.update(simulator)
        settings = settings_factory(simulator=cfg, tools_folder=str(tools_folder), frozen_caches=list(frozen_caches))
        layer = build_layer(settings)
        layers.append(layer)
        return serve(settings, layer), layer

    yield start
    for layer in layers:
        layer.close()


def stats(server) -> dict[str, Any]:
    return requests.get(server.url + "/stats", timeout=10).json()


def records(layer: MirrorLayer) -> list[Record]:
    return list(layer.store)


def usable(layer: MirrorLayer) -> list[Record]:
    """The usable answers in the store (failure records left out)."""
    return [r for r in layer.store if not r.is_failure]


def only_failure(layer: MirrorLayer, served: str) -> Record:
    """The store's one record, a failure record of exactly the served body."""
    (record,) = records(layer)
    assert record.is_failure and record.body == served
    return record


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        assert API_KEY not in text
        assert TOOLBENCH_KEY not in text


# -- answers that are recorded -----------------------------------------------------------------


def test_valid_json_answer_is_recorded_and_replayed(mirror) -> None:
    content = json.dumps({"error": "", "response": '[{"name":"pinterest.com","score":0.087}]'})
    with OpenAIStub(script(Reply(content=content))) as stub:
        server, layer = mirror(stub.api_base)
        first = server.post(payload())
        assert first.status_code == 200
        assert first.json() == {"error": "", "response": '[{"name":"pinterest.com","score":0.087}]'}
        assert first.headers["X-STM-Outcome"] == "recorded"
        assert first.headers["X-STM-Source"] == "simulated"
        (record,) = records(layer)
        assert (record.api, record.key) == (API, "{'q': 'birthday party ideas'}")
        assert (record.source, record.origin) == ("simulated", MODEL)
        assert record.body == first.text

        second = server.post(payload())
        assert second.content == first.content
        assert second.headers["X-STM-Outcome"] == "hit"
        assert stub.count == 1

        s = stats(server)
        assert (s["misses"], s["recorded"], s["hits"], s["failed"]) == (1, 1, 1, 0)
        assert s["by_source"] == {"simulated": 2}
        assert s["by_api"][API] == {"misses": 1, "recorded": 1, "hits": 1}

        # the request the model server got: the model, the key as a bearer token, the defaults
        sent = stub.requests[0]
        assert sent["model"] == MODEL and sent["temperature"] == 0.0 and sent["seed"] == 42
        assert sent["max_tokens"] == 2048 and "response_format" not in sent
        assert stub.headers[0]["authorization"] == f"Bearer {API_KEY}"
        assert sent["messages"][0] == {"role": "system", "content": SFT_SYSTEM_PROMPT}
        assert TOOLBENCH_KEY not in json.dumps(sent)
        assert_no_secrets(record.to_json(), json.dumps(s))


def test_json_like_answer_with_unescaped_quotes_is_recorded(mirror) -> None:
    content = '{\n    "error": "",\n    "response": "{"status":0,"msg":"Success","sites":["a.com","b.org"]}"\n}\nI hope this helps.'
    with OpenAIStub(script(Reply(content=content))) as stub:
        server, layer = mirror(stub.api_base)
        r = server.post(payload())
        assert r.json() == {"error": "", "response": '{"status":0,"msg":"Success","sites":["a.com","b.org"]}'}
        (record,) = records(layer)
        assert record.source == "simulated" and record.answer == r.json()
        assert server.post(payload()).content == r.content
        assert stub.count == 1
        assert stats(server)["recorded"] == 1


def test_cot_answer_keeps_error_and_response_only(mirror) -> None:
    content = (
        '```json\n{\n  "mechanism_of_the_api": "The "PopularSitesForQuery" API ranks sites, "error": none.",\n'
        '  "error": "",\n  "response": "{"sites": ["x.com"]}"\n}\n```'
    )
    with OpenAIStub(script(Reply(content=content))) as stub:
        server, layer = mirror(stub.api_base, style="mirrorapi-cot")
        r = server.post(payload())
        assert r.json() == {"error": "", "response": '{"sites": ["x.com"]}'}
        assert list(r.json()) == ["error", "response"]
        assert stub.requests[0]["messages"][0]["content"] == COT_SYSTEM_PROMPT
        assert records(layer)[0].answer == r.json()


@pytest.mark.parametrize(
    "answer",
    [{"error": "Invalid query", "response": ""}, {"error": "Rate limit exceeded", "response": ""},
     {"error": "", "response": "Unauthorized error..."}, {"error": "", "response": {"error": "quota exceeded"}}],
)
def test_simulated_error_answer_is_served_and_recorded_as_a_failure(mirror, answer: dict) -> None:
    """The real path's validity rules apply to simulated answers (simulator.validity, default strict)."""
    with OpenAIStub(script(Reply(content=json.dumps(answer)))) as stub:
        server, layer = mirror(stub.api_base)
        r = server.post(payload(q=""))
        assert r.json() == answer and r.headers["X-STM-Outcome"] == "failed" and r.headers["X-STM-Failure"] == "true"
        record = only_failure(layer, r.text)
        assert record.source == "simulated" and record.reason.startswith("simulated: invalid simulated answer: ")
        # tried again in record mode
        server.post(payload(q=""))
        assert stub.count == 2 and stats(server)["retries"] == 1


def test_simulated_error_answer_is_recorded_with_validity_off(mirror) -> None:
    content = json.dumps({"error": "Invalid query", "response": ""})
    with OpenAIStub(script(Reply(content=content))) as stub:
        server, layer = mirror(stub.api_base, validity="off")
        r = server.post(payload(q=""))
        assert r.json() == {"error": "Invalid query", "response": ""}
        (record,) = records(layer)
        assert record.source == "simulated" and not record.is_failure


def test_compatible_validity_uses_upstreams_substring_rules(mirror) -> None:
    content = json.dumps({"error": "", "response": "price: $1500"})
    with OpenAIStub(script(Reply(content=content))) as stub:
        server, layer = mirror(stub.api_base, validity="compatible")
        # "500" inside the price, as upstream's substring rules see it
        assert server.post(payload()).headers["X-STM-Outcome"] == "failed"
    with OpenAIStub(script(Reply(content=content))) as stub:
        server, layer = mirror(stub.api_base, validity="strict")
        assert server.post(payload(q="other")).headers["X-STM-Outcome"] == "recorded"


def test_slow_answer_within_the_timeout(mirror) -> None:
    with OpenAIStub(script(Reply(content='{"error": "", "response": "slow but fine"}', delay_s=0.6))) as stub:
        server, layer = mirror(stub.api_base, read_timeout_s=5.0)
        start = time.monotonic()
        r = server.post(payload())
        assert time.monotonic() - start >= 0.6
        assert r.json() == {"error": "", "response": "slow but fine"}
        assert len(records(layer)) == 1 and stats(server)["recorded"] == 1


# -- answers that are served but not recorded --------------------------------------------------


def test_unparsable_answer_is_served_as_failure_and_recorded_as_a_failure_record(mirror) -> None:
    with OpenAIStub(script(Reply(content="Sure! Here are some popular sites: pinterest, etsy."))) as stub:
        server, layer = mirror(stub.api_base)
        r = server.post(payload())
        assert r.status_code == 200
        assert r.json() == protocol.simulation_failed_answer()
        assert r.headers["X-STM-Outcome"] == "failed"
        record = only_failure(layer, r.text)
        assert record.reason == "simulated: simulator output not parsable" and record.tried == (f"simulated:{MODEL}",)
        s = stats(server)
        assert (s["misses"], s["recorded"], s["failed"], s["failure_records"]) == (1, 0, 1, 1)
        assert s["failures"] == {"simulated: simulator output not parsable": 1}
        assert s["by_source"] == {}
        # a failure record: the next identical call asks the model again (record.retry_failures)
        assert server.post(payload()).content == r.content  # failed again: the recorded failure, unchanged
        assert stub.count == 2 and stats(server)["retries"] == 1


def test_parse_failure_then_success_records_the_later_answer(mirror) -> None:
    with OpenAIStub(script(Reply(content="not json at all"), Reply(content='{"error": "", "response": "second try"}'))) as stub:
        server, layer = mirror(stub.api_base)
        assert server.post(payload()).json() == protocol.simulation_failed_answer()
        assert server.post(payload()).json() == {"error": "", "response": "second try"}
        assert server.post(payload()).headers["X-STM-Outcome"] == "hit"
        assert stub.count == 2 and len(records(layer)) == 1


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_errors_are_retried(mirror, status: int) -> None:
    ok = Reply(content='{"error": "", "response": "after retries"}')
    with OpenAIStub(script(Reply(status=status), Reply(status=status), ok)) as stub:
        server, layer = mirror(stub.api_base, max_retries=2)
        r = server.post(payload())
        assert r.json() == {"error": "", "response": "after retries"}
        assert stub.count == 3
        assert records(layer)[0].origin == MODEL
        s = stats(server)
        assert (s["recorded"], s["failed"]) == (1, 0)


@pytest.mark.parametrize("status", [500, 429])
def test_persistent_errors_give_the_miss_answer(mirror, status: int) -> None:
    with OpenAIStub(script(Reply(status=status))) as stub:
        server, layer = mirror(stub.api_base, max_retries=2)
        r = server.post(payload())
        assert r.status_code == 200
        assert r.json()["error"] == protocol.API_NOT_WORKING
        assert stub.count == 3  # one try plus two retries
        only_failure(layer, r.text)
        s = stats(server)
        assert (s["misses"], s["recorded"], s["failed"]) == (1, 0, 1)
        (failure,) = s["failures"]
        assert failure.startswith(f"simulated: simulator unavailable: HTTP {status}")
        assert_no_secrets(r.text, json.dumps(s))


def test_client_errors_are_not_retried(mirror) -> None:
    with OpenAIStub(script(Reply(status=400))) as stub:
        server, layer = mirror(stub.api_base, max_retries=3)
        assert server.post(payload()).json()["error"] == protocol.API_NOT_WORKING
        assert stub.count == 1


def test_retry_after_of_a_429_is_honoured(mirror) -> None:
    ok = Reply(content='{"error": "", "response": "waited"}')
    with OpenAIStub(script(Reply(status=429, headers=(("Retry-After", "0.5"),)), ok)) as stub:
        server, _layer = mirror(stub.api_base, max_retries=1)  # a backoff of 0.01 s: the wait is the Retry-After
        start = time.monotonic()
        assert server.post(payload()).json()["response"] == "waited"
        assert time.monotonic() - start >= 0.5


def test_connection_refused(mirror) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    server, layer = mirror(dead, max_retries=2)
    start = time.monotonic()
    r = server.post(payload())
    assert time.monotonic() - start < 5
    assert r.status_code == 200 and r.json()["error"] == protocol.API_NOT_WORKING
    assert "connection failed" in only_failure(layer, r.text).reason
    s = stats(server)
    (failure,) = s["failures"]
    assert failure.startswith("simulated: simulator unavailable: connection failed")
    assert (s["failed"], s["recorded"]) == (1, 0)


def test_hung_socket_times_out_without_retrying(mirror) -> None:
    with OpenAIStub(script(Reply(hang=True))) as stub:
        server, layer = mirror(stub.api_base, read_timeout_s=0.5, max_retries=3)
        start = time.monotonic()
        r = server.post(payload())
        elapsed = time.monotonic() - start
        assert 0.5 <= elapsed < 3
        assert r.json()["error"] == protocol.API_NOT_WORKING
        assert stub.count == 1  # a read timeout is not retried
        only_failure(layer, r.text)
        (failure,) = stats(server)["failures"]
        assert "read timeout" in failure


def test_dropped_connection_is_retried(mirror) -> None:
    ok = Reply(content='{"error": "", "response": "after a dropped answer"}')
    with OpenAIStub(script(Reply(close=True), ok)) as stub:
        server, layer = mirror(stub.api_base, max_retries=1)
        assert server.post(payload()).json()["response"] == "after a dropped answer"
        assert stub.count == 2 and len(records(layer)) == 1


# -- single flight, several endpoints, request fields ------------------------------------------


def test_32_concurrent_identical_misses_make_one_simulator_call(mirror) -> None:
    with OpenAIStub(script(Reply(content='{"error": "", "response": "only once"}', delay_s=0.5))) as stub:
        server, layer = mirror(stub.api_base)
        barrier = threading.Barrier(32)

        def call(_: int) -> bytes:
            barrier.wait()
            return server.post(payload()).content

        with ThreadPoolExecutor(32) as pool:
            bodies = list(pool.map(call, range(32)))
        assert stub.count == 1
        assert set(bodies) == {b'{"error":"","response":"only once"}'}
        assert len(records(layer)) == 1
        s = stats(server)
        assert s["requests"] == 32 and s["recorded"] == 1


def test_endpoints_round_robin(mirror) -> None:
    with OpenAIStub() as a, OpenAIStub() as b:
        server, _layer = mirror([a.api_base, b.api_base], balance="round_robin")
        for i in range(6):
            assert server.post(payload(q=f"query {i}")).headers["X-STM-Outcome"] == "recorded"
        assert (a.count, b.count) == (3, 3)


def test_least_busy_endpoint_takes_the_load(mirror) -> None:
    slow = script(Reply(content='{"error": "", "response": "slow"}', delay_s=1.0))
    with OpenAIStub(slow) as a, OpenAIStub() as b:
        server, _layer = mirror([a.api_base, b.api_base], balance="least_busy")
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(server.post, payload(q="slow one"))
            deadline = time.monotonic() + 5
            while a.count + b.count == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            for i in range(4):
                server.post(payload(q=f"fast {i}"))
            pending.result()
        # while the first endpoint was busy, every other call went to the second
        assert a.count + b.count == 5
        assert max(a.count, b.count) == 4


def test_a_failing_endpoint_is_skipped_on_retry(mirror) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with OpenAIStub() as good:
        server, layer = mirror([dead, good.api_base], balance="round_robin", max_retries=1)
        for i in range(4):
            assert server.post(payload(q=f"q{i}")).headers["X-STM-Outcome"] == "recorded"
        assert good.count == 4 and len(records(layer)) == 4


def test_structured_output_request_fields(mirror) -> None:
    with OpenAIStub() as stub:
        server, _ = mirror(stub.api_base, structured_output=True, structured_max_chars=200, style="mirrorapi-cot")
        server.post(payload())
        fmt = stub.requests[0]["response_format"]
        assert fmt["type"] == "json_schema"
        schema = fmt["json_schema"]["schema"]
        assert list(schema["properties"]) == ["mechanism_of_the_api", "error", "response"]
        assert schema["required"] == ["mechanism_of_the_api", "error", "response"]
        assert all(p == {"type": "string", "maxLength": 200} for p in schema["properties"].values())


def test_system_prompt_file_is_sent_verbatim(mirror, tmp_path: Path) -> None:
    text = "  My exact training prompt.\r\nSecond line with \"quotes\" and {braces}\n\n\ttabbed\n"
    path = tmp_path / "prompt.txt"
    path.write_bytes(text.encode("utf-8"))
    with OpenAIStub() as stub:
        server, _ = mirror(stub.api_base, system_prompt_file=str(path))
        server.post(payload())
        assert stub.requests[0]["messages"][0] == {"role": "system", "content": text}


def test_missing_tool_doc_still_simulates(mirror) -> None:
    with OpenAIStub() as stub:
        server, layer = mirror(stub.api_base)
        body = payload(category="Nowhere", tool_name="Unknown Tool", api_name="Mystery API")
        r = server.post(body)
        assert r.headers["X-STM-Outcome"] == "recorded"
        user = stub.requests[0]["messages"][1]["content"]
        assert "'api_name': 'Mystery API'" in user
        assert "'tool_name': 'Unknown Tool'" in user and "'tool_category': 'Nowhere'" in user


def test_toolbench_key_inside_tool_input_is_not_sent(mirror) -> None:
    with OpenAIStub() as stub:
        server, layer = mirror(stub.api_base)
        body = payload()
        body["tool_input"] = json.dumps({"q": "cats", "toolbench_key": TOOLBENCH_KEY})
        server.post(body)
        user = stub.requests[0]["messages"][1]["content"]
        assert user.endswith("Request:\n{'q': 'cats'}")
        assert TOOLBENCH_KEY not in json.dumps(stub.requests[0])


# -- gpt-fewshot -------------------------------------------------------------------------------


def test_gpt_fewshot_uses_the_most_similar_cached_examples(mirror, tmp_path: Path) -> None:
    with OpenAIStub() as stub:
        server, layer = mirror(stub.api_base, style="gpt-fewshot", max_examples=2)
        store: DiskcacheStore = layer.store  # type: ignore[assignment]
        for q, answer in [
            ("birthday party ideas for kids", "kids-party.com"),
            ("birthday party ideas", "exact-but-other-key.com"),
            ("cheap flights to rome", "flights.com"),
            ("birthday cake recipes", "cakes.com"),
        ]:
            store.add(Record.from_answer(API, str({"q": q}), {"error": "", "response": answer}, "real", "test"), None)
        other = "Data/other_for_Data/api"
        store.add(Record.from_answer(other, str({"q": "birthday party ideas!"}), {"error": "", "response": "other-api.com"}, "real"), None)

        server.post(payload(q="birthday party ideas!"))
        messages = stub.requests[0]["messages"]
        user = messages[1]["content"]
        assert "JSON object" in messages[0]["content"]
        assert "birthday party ideas for kids" in user and "exact-but-other-key.com" in user
        assert "flights.com" not in user and "cakes.com" not in user  # only the 2 most similar
        assert "other-api.com" not in user  # another API's answers are never examples
        assert user.index("exact-but-other-key.com") < user.index("kids-party.com")  # most similar first
        assert user.rstrip().endswith("{'q': 'birthday party ideas!'}")


def test_gpt_fewshot_respects_the_character_budget(mirror, monkeypatch) -> None:
    monkeypatch.setattr(prompts, "EXAMPLES_BUDGET_CHARS", 300)
    with OpenAIStub() as stub:
        server, layer = mirror(stub.api_base, style="gpt-fewshot", max_examples=5)
        for i in range(5):
            layer.store.add(
                Record.from_answer(API, str({"q": f"query {i}"}), {"error": "", "response": f"answer-{i}-" + "x" * 100}, "real"),
                None,
            )
        server.post(payload(q="query 9"))
        user = stub.requests[0]["messages"][1]["content"]
        shown = [i for i in range(5) if f"answer-{i}-" in user]
        assert 1 <= len(shown) <= 2


def test_gpt_fewshot_draws_examples_from_frozen_caches(mirror, tmp_path: Path) -> None:
    frozen = tmp_path / "frozen" / "Data" / "keyword_analysis_for_Data"
    frozen.mkdir(parents=True)
    (frozen / "popularsitesforquery.json").write_text(
        json.dumps({str({"q": "birthday ideas"}): {"error": "", "response": "from-the-frozen-cache.com"}})
    )
    with OpenAIStub() as stub:
        server, layer = mirror(stub.api_base, style="gpt-fewshot", frozen_caches=[str(tmp_path / "frozen")])
        server.post(payload(q="birthday party ideas"))
        assert "from-the-frozen-cache.com" in stub.requests[0]["messages"][1]["content"]


def test_mirrorapi_styles_send_no_examples(mirror) -> None:
    with OpenAIStub() as stub:
        server, layer = mirror(stub.api_base)
        layer.store.add(Record.from_answer(API, str({"q": "other"}), {"error": "", "response": "cached-example"}, "real"), None)
        server.post(payload())
        assert "cached-example" not in json.dumps(stub.requests[0])


def test_bad_api_base_is_a_config_error(settings_factory) -> None:
    from stabletoolbench_mirror.config import ConfigError
    from stabletoolbench_mirror.responders.simulator import build_simulator

    with pytest.raises(ConfigError, match="simulator.api_base"):
        build_simulator(settings_factory(simulator={"enabled": True, "api_base": "ftp://127.0.0.1/v1"}))
    with pytest.raises(ConfigError, match="system_prompt_file"):
        build_simulator(settings_factory(simulator={"enabled": True, "system_prompt_file": "/nonexistent/prompt.txt"}))
    sim = build_simulator(settings_factory(simulator={"enabled": True, "api_base": "http://127.0.0.1:9/v1"}))
    assert sim.client.endpoints == ["http://127.0.0.1:9/v1"] and sim.source == "simulated"
    sim.close()


def test_an_error_body_echoing_the_key_is_redacted(mirror, caplog: pytest.LogCaptureFixture) -> None:
    echo = Reply(status=401, message=f"Incorrect API key provided: {API_KEY}.")
    with OpenAIStub(script(echo)) as stub, caplog.at_level("DEBUG"):
        server, layer = mirror(stub.api_base)
        r = server.post(payload())
        s = stats(server)
        (failure,) = s["failures"]
        assert "Incorrect API key provided: ***" in failure
        assert_no_secrets(r.text, json.dumps(s), caplog.text)


def test_credentials_in_the_api_base_are_refused(settings_factory) -> None:
    from stabletoolbench_mirror.config import ConfigError
    from stabletoolbench_mirror.responders.simulator import build_simulator

    with pytest.raises(ConfigError) as info:
        build_simulator(settings_factory(simulator={"enabled": True, "api_base": "http://user:hunter22@127.0.0.1:9/v1?key=abc"}))
    assert "hunter22" not in str(info.value) and "key=abc" not in str(info.value)
