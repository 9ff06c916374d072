"""Two different calls never share a cache entry: NaN / Infinity against their string spellings.

``json.loads`` (and so StableToolBench's server) accepts ``NaN``, ``Infinity`` and ``-Infinity``;
upstream keys ``{"a": NaN}`` as ``{'a': nan}`` and ``{"a": "nan"}`` as ``{'a': 'nan'}``, two entries.
The canonical key keeps them apart too, and still ignores key order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.responders import KeyedResponder, expected_answer

NS = "Data/key_tool_for_Data/api"


def body(tool_input: str) -> dict[str, str]:
    return {"category": "Data", "tool_name": "Key Tool", "api_name": "api", "tool_input": tool_input, "strip": "", "toolbench_key": ""}


@pytest.fixture
def server(tmp_path: Path, serve, settings_factory):
    return serve(settings_factory(), MirrorLayer(DiskcacheStore(tmp_path / "store"), responders=[KeyedResponder()]))


@pytest.mark.parametrize(
    "number, number_key, text, text_key",
    [
        ('{"a": NaN, "b": 1}', "{'a': nan, 'b': 1}", '{"b": 1, "a": "nan"}', "{'b': 1, 'a': 'nan'}"),
        ('{"a": NaN, "b": 1}', "{'a': nan, 'b': 1}", '{"b": 1, "a": "NaN"}', "{'b': 1, 'a': 'NaN'}"),
        ('{"a": Infinity, "b": 1}', "{'a': inf, 'b': 1}", '{"b": 1, "a": "inf"}', "{'b': 1, 'a': 'inf'}"),
        ('{"a": Infinity, "b": 1}', "{'a': inf, 'b': 1}", '{"b": 1, "a": "Infinity"}', "{'b': 1, 'a': 'Infinity'}"),
        ('{"a": -Infinity, "b": 1}', "{'a': -inf, 'b': 1}", '{"b": 1, "a": "-inf"}', "{'b': 1, 'a': '-inf'}"),
    ],
)
def test_non_finite_numbers_and_their_spellings_are_different_calls(server, number, number_key, text, text_key) -> None:
    first = server.post(body(number))
    assert first.status_code == 200 and first.json() == expected_answer(NS, number_key)
    # the other key order of the same call still hits the recorded entry (canonical key)
    reordered = server.post(body('{"b": 1, "a": ' + number.split('"a": ')[1].split(",")[0] + "}"))
    assert reordered.json() == expected_answer(NS, number_key) and reordered.headers["x-stm-outcome"] == "hit"
    # the string spelling is another call: a miss answered for its own key, never the number's entry
    second = server.post(body(text))
    assert second.status_code == 200 and second.json() == expected_answer(NS, text_key)
    assert second.headers["x-stm-outcome"] == "recorded"


def test_an_overflowing_number_is_infinity_as_upstream_keys_it(server) -> None:
    first = server.post(body('{"a": Infinity}'))
    assert first.json() == expected_answer(NS, "{'a': inf}")
    same = server.post(body('{"a": 1e999}'))  # float("1e999") is inf: upstream's key is {'a': inf} too
    assert same.json() == expected_answer(NS, "{'a': inf}") and same.headers["x-stm-outcome"] == "hit"
