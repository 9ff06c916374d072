"""The real API path through the ToolBench relay, against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.responders import real
from stabletoolbench_mirror.responders.real import build_real_responder
from stabletoolbench_mirror.serving.server import create_app
from tests.conftest import make_settings
from tests.helpers.api_host import ApiHost, HostReply, Received, relay_reply
from tests.helpers.live import UvicornThread
from tests.helpers.validity_rows import INVALID_ROWS, VALID_ROWS

# answers a relay gives at the HTTP level that upstream does not accept
HTTP_INVALID_ROWS: list[tuple[str, HostReply]] = [
    ("relay-http-500", HostReply(status=500, body={"detail": "Internal Server Error"})),
    ("relay-http-502-html", HostReply(status=502, body="<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html")),
    ("relay-http-404", HostReply(status=404, body={"detail": "Not Found"})),
    ("relay-200-not-json", HostReply(body="<html>maintenance</html>", content_type="text/html")),
    ("relay-dropped-connection", HostReply(close=True)),
]
ROWS: dict[str, HostReply] = {i: HostReply(body=a) for i, a, _ in INVALID_ROWS}
ROWS.update(HTTP_INVALID_ROWS)
ROWS.update({f"valid-{i}": HostReply(body=a) for i, a in VALID_ROWS})


def table_script(received: Received) -> HostReply:
    row = received.json()["tool_input"].get("row")
    return ROWS.get(row, relay_reply("", f"unscripted row {row!r}"))


def payload(tool_input: Any, **extra: Any) -> dict[str, Any]:
    body = {"category": "Data", "tool_name": "Keyword Analysis", "api_name": "QueryKeywords", "tool_input": json.dumps(tool_input), "strip": "", "toolbench_key": ""}
    body.update(extra)
    return body


def api_and_key(tool_input: Any) -> tuple[str, str]:
    call = ToolCall.of("Data", "Keyword Analysis", "QueryKeywords", tool_input)
    return call.api, call.key


class Mirror:
    def __init__(self, server: UvicornThread, layer: MirrorLayer, host: ApiHost) -> None:
        self.server, self.layer, self.host = server, layer, host

    def post(self, body: dict[str, Any]) -> requests.Response:
        return self.server.post(body)


def start_mirror(tmp: Path, host: ApiHost, **overrides: Any) -> Iterator[Mirror]:
    real = {"enabled": True, "backend": "relay", "relay_url": host.url + "/relay", "connect_timeout_s": 1, "read_timeout_s": 2}
    real.update(overrides.pop("real", {}))
    settings = make_settings(tmp, real=real, **overrides)
    layer = build_layer(settings)
    with UvicornThread(create_app(settings, layer)) as server:
        yield Mirror(server, layer, host)
    layer.close()


@pytest.fixture(scope="module")
def relay_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mirror]:
    with ApiHost(table_script) as host:
        yield from start_mirror(tmp_path_factory.mktemp("relay_only"), host)


@pytest.fixture(scope="module")
def relay_then_simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mirror, Any]]:
    pytest.importorskip("stabletoolbench_mirror.responders.simulator")
    from tests.helpers.openai_stub import OpenAIStub

    with ApiHost(table_script) as host, OpenAIStub() as stub:
        for mirror in start_mirror(tmp_path_factory.mktemp("relay_sim"), host, simulator={"enabled": True, "api_base": stub.api_base, "max_retries": 0}):
            yield mirror, stub


# -- valid answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("row", [f"valid-{i}" for i, _ in VALID_ROWS])
def test_valid_relay_answers_are_recorded_as_real_and_replayed(relay_only: Mirror, row: str) -> None:
    before = relay_only.host.count
    r = relay_only.post(payload({"row": row}))
    assert r.status_code == 200
    assert r.headers["X-STM-Outcome"] == "recorded" and r.headers["X-STM-Source"] == "real"
    assert r.json() == ROWS[row].body
    record = relay_only.layer.store.get(*api_and_key({"row": row}))
    assert record is not None and record.source == "real"
    assert record.origin == relay_only.host.url + "/relay"
    assert relay_only.host.count == before + 1
    again = relay_only.post(payload({"row": row}))
    assert again.headers["X-STM-Outcome"] == "hit" and again.content == r.content
    assert relay_only.host.count == before + 1  # served from the store


# -- invalid answers -------------------------------------------------------------------------------

INVALID_IDS = [i for i, _, _ in INVALID_ROWS] + [i for i, _ in HTTP_INVALID_ROWS]


@pytest.mark.parametrize("row", INVALID_IDS)
def test_invalid_relay_answers_give_the_miss_error_without_a_simulator(relay_only: Mirror, row: str) -> None:
    before = relay_only.host.count
    r = relay_only.post(payload({"row": row}))
    assert r.status_code == 200
    assert r.headers["X-STM-Outcome"] == "failed"
    answer = r.json()
    assert answer["error"] == protocol.MISS_ERROR
    assert "no recorded response" in answer["response"]
    assert relay_only.host.count == before + 1
    # recorded as a failure record (the served bytes), never as the real API's answer
    record = relay_only.layer.store.get(*api_and_key({"row": row}))
    assert record is not None and record.is_failure and record.body == r.text
    assert record.source == "real" and record.reason.startswith("real: ") and record.tried[0].startswith("real:")
    failures = requests.get(relay_only.server.url + "/stats", timeout=5).json()["failures"]
    assert any(k.startswith("real: ") for k in failures)


@pytest.mark.parametrize("row", INVALID_IDS)
def test_invalid_relay_answers_fall_through_to_the_simulator(relay_then_simulator: tuple[Mirror, Any], row: str) -> None:
    mirror, stub = relay_then_simulator
    before_relay, before_sim = mirror.host.count, stub.count
    r = mirror.post(payload({"row": row}))
    assert r.status_code == 200
    assert r.headers["X-STM-Outcome"] == "recorded" and r.headers["X-STM-Source"] == "simulated"
    assert mirror.host.count == before_relay + 1 and stub.count == before_sim + 1
    record = mirror.layer.store.get(*api_and_key({"row": row}))
    assert record is not None and record.source == "simulated"
    assert all(rec.source != "real" for rec in mirror.layer.store)


# -- the request upstream sends ---------------------------------------------------------------------


def test_relay_request_is_shaped_like_upstreams(tmp_path: Path, serve) -> None:
    with ApiHost(lambda r: relay_reply("", {"ok": True})) as host:
        settings = make_settings(tmp_path, real={"enabled": True, "relay_url": host.url + "/relay", "toolbench_key": "config-key-0001"})
        server = serve(settings)
        r = server.post(
            {"category": "Video/Images", "tool_name": "Keyword Analysis", "api_name": "Popular Sites (for query)",
             "tool_input": '{\n  "q": "birthday party ideas",\n  "n": 3\n}', "strip": "truncate", "toolbench_key": "request-key-0001"}
        )
        assert r.headers["X-STM-Source"] == "real"
        sent = host.last
        assert sent.method == "POST" and sent.path == "/relay"
        assert sent.json() == {
            "category": "Video_Images",
            "tool_name": "Keyword Analysis",
            "api_name": "popular_sites_for_query",
            "tool_input": {"q": "birthday party ideas", "n": 3},
            "strip": "",
            "toolbench_key": "request-key-0001",
        }
        assert sent.headers["toolbench_key"] == "request-key-0001"
        assert sent.headers["content-type"] == "application/json"
        # the configured key when the request has none; a tool name with its _for_ suffix is cut
        server.post({"category": "Data", "tool_name": "keyword_analysis_for_Data", "api_name": "is_id", "tool_input": "", "strip": "", "toolbench_key": ""})
        sent = host.last.json()
        assert sent["tool_name"] == "keyword_analysis" and sent["api_name"] == "is_id" and sent["tool_input"] == {}
        assert sent["toolbench_key"] == "config-key-0001" and host.last.headers["toolbench_key"] == "config-key-0001"


def test_allow_and_deny_lists_keep_calls_away_from_the_relay(tmp_path: Path, serve) -> None:
    with ApiHost(lambda r: relay_reply("", "fine")) as host:
        settings = make_settings(
            tmp_path,
            real={"enabled": True, "relay_url": host.url, "allow_categories": ["Data", "Video/Images"], "deny_tools": ["Secret Tool"]},
        )
        server = serve(settings)
        assert server.post(payload({"a": 1}, category="Finance")).headers["X-STM-Outcome"] == "failed"
        assert server.post(payload({"a": 2}, tool_name="secret_tool")).headers["X-STM-Outcome"] == "failed"
        assert host.count == 0
        assert server.post(payload({"a": 3}, category="Video_Images")).headers["X-STM-Source"] == "real"
        assert server.post(payload({"a": 4})).headers["X-STM-Source"] == "real"
        assert host.count == 2


# -- failing fast ----------------------------------------------------------------------------------


def test_a_hanging_relay_trips_the_breaker(tmp_path: Path, serve, monkeypatch) -> None:
    read_timeout, k = 0.6, 2
    monkeypatch.setattr(real, "BREAKER_FAILURES", k)
    monkeypatch.setattr(real, "BREAKER_RESET_S", 1.5)
    with ApiHost(lambda r: HostReply(hang=True)) as host:
        settings = make_settings(
            tmp_path,
            real={"enabled": True, "relay_url": host.url + "/relay", "connect_timeout_s": 0.5, "read_timeout_s": read_timeout},
        )
        server = serve(settings)
        timings = []
        for i in range(k + 2):
            start = time.monotonic()
            r = server.post(payload({"i": i}))
            timings.append(time.monotonic() - start)
            assert r.json()["error"] == protocol.MISS_ERROR
        assert all(t >= read_timeout for t in timings[:k]), timings
        assert all(t < read_timeout / 3 for t in timings[k:]), timings  # no wait for a timeout
        assert host.count == k  # the open breaker sent nothing
        failures = requests.get(server.url + "/stats", timeout=5).json()["failures"]
        assert any("circuit open" in f for f in failures)
        # after BREAKER_RESET_S one trial call goes through again
        time.sleep(1.5)
        start = time.monotonic()
        server.post(payload({"trial": 1}))
        assert time.monotonic() - start >= read_timeout
        assert host.count == k + 1
        print(f"timings before/after the breaker opened: {[round(t, 3) for t in timings]}")


def test_missing_relay_url_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="real.relay_url"):
        build_real_responder(make_settings(tmp_path, real={"enabled": True}))
    with pytest.raises(ConfigError, match="real.relay_url"):
        build_real_responder(make_settings(tmp_path, real={"enabled": True, "relay_url": "ftp://x"}))
