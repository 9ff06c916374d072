"""Record keys (the string kind mark, parsing a key back, session keys) and the secret helpers that keep keys
out of inputs, settings and origins."""

from __future__ import annotations

import pytest

from stabletoolbench_mirror.core import keys
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.secrets import (
    MASK,
    is_secret_name,
    mask_fields,
    may_name_a_secret_field,
    public_url,
    url_secrets,
    without_secret_fields,
)

HISTORY = "ab" * 32


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ({"a": 1}, "{'a': 1}"),
        ("plain text", "plain text"),
        ("{'a': 1}", "{'a': 1}" + keys.STRING_MARK),  # a string that reads like an object's key
        ("[1]", "[1]" + keys.STRING_MARK),
        ("5", "5" + keys.STRING_MARK),
        ("-1.5e3", "-1.5e3" + keys.STRING_MARK),
        ("nan", "nan" + keys.STRING_MARK),
        ("True", "True" + keys.STRING_MARK),
        ("None", "None" + keys.STRING_MARK),
        ("true", "true"),  # str(True) is "True": no other kind spells "true"
        ("x" + keys.STRING_MARK, "x" + keys.STRING_MARK + keys.STRING_MARK),
        ("k" + keys.SESSION_KEY_MARK + "0" * 32, "k" + keys.SESSION_KEY_MARK + "0" * 32 + keys.STRING_MARK),
        ("k" + keys.SESSION_KEY_MARK + "0" * 31, "k" + keys.SESSION_KEY_MARK + "0" * 31),
        (5, "5"),
        (None, "None"),
    ],
)
def test_record_key_marks_a_string_that_spells_another_kind_and_parses_back(value: object, key: str) -> None:
    assert keys.record_key(value) == key
    if isinstance(value, str) and key != value:
        assert keys.value_from_upstream_key(key) == value  # the mark gives back the string
    assert keys.record_key(value, upstream=keys.upstream_key(value)) == key


def test_a_string_and_the_object_it_spells_are_different_calls() -> None:
    as_object = ToolCall.of("Data", "t", "a", {"q": 1})
    as_text = ToolCall.of("Data", "t", "a", "{'q': 1}")
    assert as_object.upstream == as_text.upstream == "{'q': 1}"  # upstream keys them alike
    assert as_object.key != as_text.key and as_object.canonical != as_text.canonical


@pytest.mark.parametrize(
    ("key", "value"),
    [("{'a': (1, 2)}", {"a": (1, 2)}), ("[1, 'b', None]", [1, "b", None]), ("'text'", "text"), ("{1, 2}", {1, 2})],
)
def test_an_upstream_key_parses_back_to_its_value(key: str, value: object) -> None:
    assert keys.value_from_upstream_key(key) == value


@pytest.mark.parametrize("key", ["not a literal", "{'a': f(1)}", "__import__('os')", "{'a': 1"])
def test_a_key_that_is_no_literal_is_refused_and_has_no_canonical_key(key: str) -> None:
    with pytest.raises(ValueError, match="not a Python literal"):
        keys.value_from_upstream_key(key)
    assert keys.canonical_from_upstream_key(key) is None


def test_a_huge_key_is_not_parsed() -> None:
    with pytest.raises(ValueError, match="too long"):
        keys.value_from_upstream_key("[" + "1," * keys.MAX_LITERAL_KEY_CHARS + "]")


@pytest.mark.parametrize(
    ("key", "canonical"),
    [
        ("{'b': 1, 'a': 2}", '{"a":2,"b":1}'),
        ("{'t': (1, 2), 's': {3}}", '{"s":[3],"t":[1,2]}'),
        ("{'s': {'f', 'e', 'd', 'c', 'b', 'a'}}", '{"s":["a","b","c","d","e","f"]}'),  # a set in one order, whatever its hash order
        ("{'b': b'x', 1: 'n'}", '{"1":"n","b":"b\'x\'"}'),
        ("{'c': 1j}", '{"c":"1j"}'),
        ("{'x': float('nan')}", None),  # a call, not a literal
    ],
)
def test_a_literal_keys_canonical_key_maps_python_only_values_onto_json(key: str, canonical: str | None) -> None:
    assert keys.canonical_from_upstream_key(key) == canonical


def test_session_keys_carry_the_history_and_come_off_again() -> None:
    start = keys.history_start("book a flight")
    assert len(start) == 64 and start == keys.history_start("book a flight") != keys.history_start("book a train")
    after = keys.history_next(start, "Travel/f_for_Travel/search", '{"to":"Oslo"}', '{"error":"","response":"ok"}')
    assert after != start and after != keys.history_next(start, "Travel/f_for_Travel/search", '{"to":"Oslo"}', '{"error":"","response":"no"}')
    key = keys.session_key("{'to': 'Oslo'}", after)
    assert key == "{'to': 'Oslo'}" + keys.SESSION_KEY_MARK + after[: keys.HISTORY_HASH_CHARS]
    assert keys.plain_key(key) == "{'to': 'Oslo'}" and keys.plain_key("{'to': 'Oslo'}") == "{'to': 'Oslo'}"
    assert keys.plain_key("k" + keys.SESSION_KEY_MARK + "short") == "k" + keys.SESSION_KEY_MARK + "short"


def test_a_call_in_a_session_has_session_keys() -> None:
    from stabletoolbench_mirror.core.call import SessionContext

    call = ToolCall.of("Data", "t", "a", {"q": 1})
    inside = call.in_session(HISTORY, SessionContext("task", ()))
    assert inside.key == keys.session_key(call.key, HISTORY) == inside.upstream
    assert inside.canonical == keys.session_key(call.canonical, HISTORY) and inside.session is not None


@pytest.mark.parametrize(
    ("name", "secret"),
    [("toolbench_key", True), ("RapidAPI_Key", True), ("Authorization", True), ("x-api-key", True), ("auth_token", True),
     ("api_key", True), ("key", False), ("token", False), ("monkey", False)],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_secret_fields_of_an_input_are_taken_out_at_any_depth_and_nothing_else() -> None:
    plain = {"q": "x", "items": [{"n": 1}], "api_key": "kept: a field of the API"}
    assert without_secret_fields(plain) is plain  # the same value: nothing to take out
    nested = {"q": "x", "ToolBench_Key": "s1", "inner": [{"rapidapi_key": "s2", "n": 1}, "text"], "deep": {"auth_token": "s3"}}
    assert without_secret_fields(nested) == {"q": "x", "inner": [{"n": 1}, "text"], "deep": {}}
    assert nested["ToolBench_Key"] == "s1"  # the caller's value is left alone
    assert without_secret_fields("toolbench_key") == "toolbench_key" and without_secret_fields([1, 2]) == [1, 2]


def test_a_call_never_keeps_a_secret_field_of_its_input() -> None:
    call = ToolCall.of("Data", "t", "a", {"q": 1, "toolbench_key": "leaked"})
    assert call.tool_input == {"q": 1} and "leaked" not in call.key + call.canonical + call.upstream


@pytest.mark.parametrize(("text", "may"), [("{'toolbench_key': 1}", True), ("{'MY_TOKEN': 1}", True), ("{'q': 'key'}", False), ("", False)])
def test_the_cheap_test_before_the_walk(text: str, may: bool) -> None:
    assert may_name_a_secret_field(text) is may


def test_mask_fields_masks_secret_values_at_any_depth() -> None:
    settings = {"real": {"toolbench_key": "s", "rapidapi_key": None, "relay_url": "http://x"}, "list": [{"Authorization": "Bearer s"}],
                "simulator": {"api_key": ""}}
    assert mask_fields(settings) == {"real": {"toolbench_key": MASK, "rapidapi_key": None, "relay_url": "http://x"},
                                     "list": [{"Authorization": MASK}], "simulator": {"api_key": ""}}


@pytest.mark.parametrize(
    ("url", "public", "origin"),
    [
        ("https://user:pw@relay.test:8443/virtual?key=s#frag", "https://relay.test:8443/virtual", "https://relay.test:8443"),
        ("http://[::1]:9000/v1", "http://[::1]:9000/v1", "http://[::1]:9000"),
        ("http://h.test", "http://h.test", "http://h.test"),
        ("http://h.test:99999/", "<invalid URL>", "<invalid URL>"),
    ],
)
def test_public_url_keeps_no_user_info_query_or_fragment(url: str, public: str, origin: str) -> None:
    assert public_url(url) == public and public_url(url, keep_path=False) == origin


@pytest.mark.parametrize(("url", "secrets"), [
    ("redis://:pw@h:6379/0", ["pw"]),
    ("redis://u@h", ["u"]),  # a user without a password is a token sent as the user
    ("https://u:p%40ss@h/v1?api-key=K1&model=m&sig=S2", ["p%40ss", "p@ss", "K1", "S2"]),
    ("http://h/v1", []),
    ("http://[bad", []),
])
def test_url_secrets_are_the_password_or_user_and_keyed_query_values(url: str, secrets: list[str]) -> None:
    assert url_secrets(url) == secrets
