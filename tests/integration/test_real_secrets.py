"""Keys never reach the store, the logs, /stats or error answers, even when an API echoes them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import REPO, make_settings
from tests.helpers.api_host import ApiHost, HostReply, Received, relay_reply
from tests.helpers.files import files_containing
from tests.helpers.live import free_port

REQUEST_KEY = "TBKEY-REQUEST-7f3a9c1e"
CONFIG_KEY = "TBKEY-CONFIG-5b2d8e04"
RAPID_KEY = "RAPIDKEY-SECRET-91ac44d0"
KEYS = (REQUEST_KEY, CONFIG_KEY, RAPID_KEY)


def echo_relay(received: Received) -> HostReply:
    """Answers that quote the key the call came with: valid ones, and invalid ones."""
    body = received.json()
    key = body["toolbench_key"]
    kind = body["tool_input"].get("kind")
    if kind == "valid":
        return relay_reply("", {"you_sent": key, "also": [f"key={key}"], key: "as an object key"})
    if kind == "invalid":
        return relay_reply("", f"Invalid API key {key}: unauthorized")
    if kind == "error":
        return relay_reply(f"Function executing x error...\nbad key {key}", "")
    return HostReply(status=503, body={"detail": f"upstream refused {key}"})


def echo_rapid_host(received: Received) -> HostReply:
    return HostReply(body={"headers_seen": received.headers.get("x-rapidapi-key"), "path": received.path})


def payload(kind: str, key: str, n: int = 0) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Echo", "api_name": "Echo Key", "tool_input": json.dumps({"kind": kind, "n": n}), "strip": "", "toolbench_key": key}


def test_keys_stay_out_of_store_logs_stats_and_answers(tmp_path: Path, serve, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with ApiHost(echo_relay) as relay:
        settings = make_settings(
            tmp_path, real={"enabled": True, "relay_url": relay.url + "/relay", "toolbench_key": CONFIG_KEY}, log_level="debug"
        )
        server = serve(settings)
        served = []
        for n, kind in enumerate(["valid", "invalid", "error", "down"]):
            for key in (REQUEST_KEY, ""):
                r = server.post(payload(kind, key, n))
                served.append(r.text)
                assert r.status_code == 200
        # the keys really went to the relay, so their absence below means something
        sent = [rec.json()["toolbench_key"] for rec in relay.received]
        assert REQUEST_KEY in sent and CONFIG_KEY in sent
        stats = requests.get(server.url + "/stats", timeout=5).text
        health = requests.get(server.url + "/health", timeout=5).text
    assert json.loads(served[0])["response"]["you_sent"] == "***"  # the valid echo was recorded, scrubbed
    assert files_containing(tmp_path / "store", KEYS) == []
    for text in [caplog.text, stats, health, *served]:
        for key in KEYS:
            assert key not in text


def test_rapidapi_key_stays_out_of_store_and_logs(tmp_path: Path, serve, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    tools = tmp_path / "tools" / "Data"
    tools.mkdir(parents=True)
    doc = {"tool_name": "Echo", "host": "echo.p.rapidapi.com", "api_list": [{"name": "Echo Key", "url": "https://echo.p.rapidapi.com/echo/{kind}", "method": "GET", "required_parameters": [{"name": "kind", "type": "STRING"}], "optional_parameters": []}]}
    (tools / "echo.json").write_text(json.dumps(doc))
    with ApiHost(echo_rapid_host) as host:
        settings = make_settings(
            tmp_path,
            tools_folder=str(tmp_path / "tools"),
            real={"enabled": True, "backend": "rapidapi", "rapidapi_key": RAPID_KEY, "rapidapi_base_url": host.url},
        )
        server = serve(settings)
        r = server.post(payload("valid", REQUEST_KEY))
        assert host.last.headers["x-rapidapi-key"] == RAPID_KEY
        assert r.headers["X-STM-Source"] == "real" and r.json()["response"]["headers_seen"] == "***"
        stats = requests.get(server.url + "/stats", timeout=5).text
    assert files_containing(tmp_path / "store", KEYS) == []
    for key in KEYS:
        assert key not in caplog.text and key not in stats and key not in r.text


def test_server_process_log_and_store_hold_no_keys(tmp_path: Path) -> None:
    """The CLI server at debug log level, keys from the environment and from requests."""
    port = free_port()
    with ApiHost(echo_relay) as relay:
        config = tmp_path / "server_config.yml"
        config.write_text(
            f"port: {port}\nlog_level: debug\nstore: {{path: {tmp_path / 'store'}}}\n"
            f"real: {{enabled: true, relay_url: '{relay.url}/relay'}}\n"
        )
        env = {**os.environ, "STM_REAL__TOOLBENCH_KEY": CONFIG_KEY, "PYTHONPATH": str(REPO)}
        log_path = tmp_path / "server.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stabletoolbench_mirror", "serve", "-c", str(config)],
                stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
            )
            try:
                url = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if requests.get(url + "/health", timeout=1).status_code == 200:
                            break
                    except requests.ConnectionError:
                        pass
                    assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.05)
                for n, kind in enumerate(["valid", "invalid", "error", "down"]):
                    for key in (REQUEST_KEY, ""):
                        assert requests.post(url + "/virtual", json=payload(kind, key, n), timeout=10).status_code == 200
                stats = requests.get(url + "/stats", timeout=5).text
            finally:
                proc.terminate()
                proc.wait(timeout=20)
        calls = [rec for rec in relay.received if rec.method == "POST"]
        assert {rec.json()["toolbench_key"] for rec in calls} == {REQUEST_KEY, CONFIG_KEY}
        # the start-up reachability probe of the relay carries no key
        probes = [rec for rec in relay.received if rec.method != "POST"]
        assert probes and not [p for p in probes for key in KEYS if key in f"{p.headers} {p.raw_query} {p.body!r}"]
    log_text = log_path.read_text()
    assert "POST /virtual" in log_text and "real call" in log_text  # the log really is at debug level
    assert files_containing(tmp_path, KEYS) == []  # store, config and the log
    for key in KEYS:
        assert key not in stats
