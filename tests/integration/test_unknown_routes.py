"""A request to a route that does not exist gets a JSON error that names ``POST /virtual``.

StableToolBench's client posts to ``SERVICE_URL`` as given; a URL without ``/virtual`` must
say what is wrong instead of a bare 404.
"""

from __future__ import annotations

import pytest
import requests

CALL = {"category": "Data", "tool_name": "T", "api_name": "a", "tool_input": "{}", "strip": "", "toolbench_key": ""}


@pytest.fixture
def server(serve, settings_factory):
    return serve(settings_factory())


@pytest.mark.parametrize("method, path", [("POST", "/"), ("POST", "/virtual/"), ("POST", "/v1/virtual"), ("GET", "/"),
                                          ("GET", "/nope?x=1"), ("PUT", "/anything")])
def test_unknown_route_answers_json_naming_post_virtual(server, method: str, path: str) -> None:
    r = requests.request(method, server.url + path, json=CALL, timeout=10)
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/json")
    data = r.json()
    assert set(data) == {"error", "response"} and data["response"] == ""
    assert "POST /virtual" in data["error"] and "SERVICE_URL" in data["error"]
    assert f"{method} {path.split('?')[0]}" in data["error"]


def test_wrong_method_on_a_known_route_names_post_virtual(server) -> None:
    r = requests.post(server.url + "/health", json=CALL, timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert set(r.json()) == {"error", "response"} and "POST /virtual" in r.json()["error"]


def test_a_long_unknown_path_is_quoted_only_in_part(server) -> None:
    r = requests.get(server.url + "/" + "x" * 6000, timeout=10)
    assert r.status_code == 404 and len(r.content) < 600


def test_known_routes_are_unchanged(server) -> None:
    assert requests.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    assert "requests" in requests.get(server.url + "/stats", timeout=10).json()
    r = requests.post(server.url + "/virtual", json=CALL, timeout=10)
    assert r.status_code == 200 and r.json()["error"] == "API not working error..."
    wrong = requests.get(server.url + "/virtual", timeout=10)
    assert wrong.status_code == 405 and wrong.json() == {"error": "use POST /virtual", "response": ""}
