"""Building direct RapidAPI requests from a tool doc (no network)."""

from __future__ import annotations

import pytest

from stabletoolbench_mirror.responders.real.rapidapi import RequestBuildError, build_request, map_arguments

GET_DOC = {
    "name": "Get Order",
    "url": "https://demo-orders.p.rapidapi.com/v1/orders/{id}",
    "method": "GET",
    "required_parameters": [{"name": "id", "type": "STRING", "description": "", "default": ""}],
    "optional_parameters": [
        {"name": "Page-Size", "type": "NUMBER", "description": "", "default": "10"},
        {"name": "include_items", "type": "BOOLEAN", "description": "", "default": ""},
    ],
}
POST_DOC = {
    "name": "Create Order",
    "url": "https://demo-orders.p.rapidapi.com/v1/orders",
    "method": "POST",
    "host": "orders-api.p.rapidapi.com",
    "required_parameters": [{"name": "from", "type": "STRING"}, {"name": "item", "type": "STRING"}],
    "optional_parameters": [{"name": "Gift-Wrap", "type": "BOOLEAN"}],
}


def test_standardised_names_map_back_to_the_doc() -> None:
    assert map_arguments(GET_DOC, {"is_id": "7", "page_size": 5, "extra": 1}) == {"id": "7", "Page-Size": 5, "extra": 1}
    # the doc's own spelling is accepted too and wins over an alias
    assert map_arguments(GET_DOC, {"Page-Size": 3, "page_size": 9}) == {"Page-Size": 3}
    assert map_arguments(GET_DOC, {"page_size": 9, "Page-Size": 3}) == {"Page-Size": 3}


def test_get_fills_the_path_and_puts_the_rest_in_the_query() -> None:
    req = build_request(GET_DOC, {"is_id": "A/42 b", "page_size": 5, "include_items": True, "skip": None})
    assert req.method == "GET"
    assert req.url == "https://demo-orders.p.rapidapi.com/v1/orders/A%2F42%20b"
    assert req.query == {"Page-Size": "5", "include_items": "true"}
    assert req.body is None
    assert req.rapidapi_host == "demo-orders.p.rapidapi.com"
    assert req.origin == "https://demo-orders.p.rapidapi.com"
    assert req.headers("K") == {"X-RapidAPI-Host": "demo-orders.p.rapidapi.com", "accept": "application/json", "X-RapidAPI-Key": "K"}


def test_post_sends_a_json_body_and_the_doc_host() -> None:
    req = build_request(POST_DOC, {"is_from": "Paris", "item": "book", "gift_wrap": False})
    assert req.method == "POST"
    assert req.url == "https://demo-orders.p.rapidapi.com/v1/orders"
    assert req.body == {"from": "Paris", "item": "book", "Gift-Wrap": False}
    assert req.query == {}
    assert req.rapidapi_host == "orders-api.p.rapidapi.com"


def test_base_url_override_keeps_path_and_host_header() -> None:
    req = build_request(GET_DOC, {"is_id": 7}, base_url="http://127.0.0.1:9999/prefix/")
    assert req.url == "http://127.0.0.1:9999/prefix/v1/orders/7"
    assert req.rapidapi_host == "demo-orders.p.rapidapi.com"
    assert req.origin == "http://127.0.0.1:9999"


@pytest.mark.parametrize(
    "doc,args,message",
    [
        (GET_DOC, {"page_size": 1}, "missing path parameter 'id'"),
        (GET_DOC, ["not", "a", "dict"], "not a JSON object"),
        ({**GET_DOC, "url": ""}, {"is_id": 1}, "no url"),
        ({**GET_DOC, "url": "file:///etc/passwd"}, {"is_id": 1}, "not an http(s) URL"),
        ({**GET_DOC, "method": "TRACE"}, {"is_id": 1}, "unsupported method"),
    ],
)
def test_bad_docs_and_inputs_give_clear_errors(doc, args, message) -> None:
    with pytest.raises(RequestBuildError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_request(doc, args)


def test_origins_drop_credentials_query_and_fragment() -> None:
    from stabletoolbench_mirror.core.secrets import public_url
    from stabletoolbench_mirror.responders.real.transport import host_key

    url = "https://user:secret-pw@Relay.Example:8443/api/virtual?key=SECRET#frag"
    assert public_url(url) == "https://relay.example:8443/api/virtual"
    assert public_url(url, keep_path=False) == "https://relay.example:8443"
    assert host_key(url) == "relay.example:8443"
    assert "secret" not in build_request(GET_DOC, {"is_id": 1}, base_url="http://u:secret@127.0.0.1:9/").origin
