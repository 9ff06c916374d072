"""API-Bank tables: shared until a session writes one, then copied once; kept as JSON with their types."""

from __future__ import annotations

import datetime
import json

import pytest

from stabletoolbench_mirror.apibank.tables import DictView, ListView, TableRoot, decode, encode, json_default, stored


def shared() -> dict:
    return {"1": {"name": "a", "tags": ["x"]}, "2": {"name": "b", "tags": []}}


def test_reads_never_copy_and_return_views_of_nested_data() -> None:
    data = shared()
    root = TableRoot("T", data)
    view = root.view()
    assert isinstance(view, DictView) and isinstance(view["1"], DictView) and isinstance(view["1"]["tags"], ListView)
    assert view["1"]["name"] == "a" and "2" in view and len(view) == 2 and sorted(view) == ["1", "2"]
    assert view == shared() and view["1"]["tags"] == ["x"]
    assert [v["name"] for v in view.values()] == ["a", "b"]
    assert not root.owned and root.data is data


@pytest.mark.parametrize(
    "write",
    [
        lambda v: v.__setitem__("3", {"name": "c"}),
        lambda v: v.__delitem__("1"),
        lambda v: v["1"].__setitem__("name", "z"),
        lambda v: v["1"]["tags"].append("y"),
        lambda v: v["2"]["tags"].extend(["p", "q"]),
        lambda v: v.pop("2"),
        lambda v: v.setdefault("9", []),
        lambda v: v["1"]["tags"].pop(),
    ],
)
def test_a_write_at_any_depth_copies_the_table_once_and_leaves_the_shared_data_alone(write) -> None:
    data = shared()
    root = TableRoot("T", data)
    view = root.view()
    write(view)
    copied = root.data
    write_again = root.view()
    write_again["extra"] = 1
    assert data == shared(), "the shared table was changed"
    assert root.owned and copied is not data and root.data is copied  # copied at the first write, not again
    assert view["extra"] == 1  # every view of the table sees the copy


def test_a_view_stored_in_a_table_is_stored_as_plain_data() -> None:
    root = TableRoot("T", shared())
    view = root.view()
    view["3"] = view["1"]
    view["3"]["name"] = "changed"
    assert view["1"]["name"] == "a"
    assert type(root.data["3"]) is dict
    assert json.loads(json.dumps({"out": view["1"]}, default=json_default)) == {"out": {"name": "a", "tags": ["x"]}}
    assert stored({"v": view["1"]["tags"]}) == {"v": ["x"]}


def test_encode_keeps_what_json_cannot_say() -> None:
    value = {1: {"when": datetime.datetime(2023, 3, 1, 9, 30), "day": datetime.date(2023, 3, 1)}, "t": (1, 2), "s": {3}, "__stm__": "x"}
    text = json.dumps(encode(value))
    assert decode(json.loads(text)) == value
    assert type(next(iter(decode(json.loads(text))))) is int


def test_iterating_while_writing_behaves_as_a_dict_and_a_list_do() -> None:
    view = TableRoot("T", shared()).view()
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        for key in view:  # the first write copies the table: the change is still seen
            del view[key]
    for key in view:  # a break right after the write, as API-Bank's Delete* APIs do, is fine
        del view[key]
        break
    items = TableRoot("L", {"l": [1, 2]}).view()["l"]
    seen = []
    for value in items:
        seen.append(value)
        if value == 1:
            items.append(3)
    assert seen == [1, 2, 3]
