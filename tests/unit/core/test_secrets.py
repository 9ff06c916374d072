"""The one home for secrets: which values are secret and how they are kept out of text and data."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from stabletoolbench_mirror.core.logs import RedactSecrets
from stabletoolbench_mirror.core.secrets import MASK, Redactor, mask_fields, public_settings, public_url
from tests.conftest import make_settings


def test_every_configured_secret_is_known_and_kept_out_of_the_public_settings(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        auth_token="tok-AAAA1111",
        store={"kind": "redis", "url": "redis://:pw-redis-BBBB@127.0.0.1:6379/0"},
        real={"relay_url": "http://user:pw-relay-CCCC@relay.local/virtual?key=q-DDDD", "toolbench_key": "tbk-EEEE", "rapidapi_key": "rk-FFFF"},
        simulator={"api_base": ["http://a:pw-sim-GGGG@s1/v1", "http://s2/v1"], "api_key": "sk-HHHH"},
    )
    secrets = set(settings.secrets())
    assert secrets == {"tok-AAAA1111", "pw-redis-BBBB", "pw-relay-CCCC", "tbk-EEEE", "rk-FFFF", "pw-sim-GGGG", "sk-HHHH"}
    text = json.dumps(public_settings(settings))
    for needle in [*secrets, "q-DDDD", "user:"]:
        assert needle not in text
    assert public_settings(settings)["real"]["rapidapi_key"] == MASK
    assert public_settings(settings)["simulator"]["api_base"] == ["http://s1/v1", "http://s2/v1"]


def test_redaction_of_text_data_and_named_fields() -> None:
    redactor = Redactor(["abcd", "abcdefgh", "xy"])  # too short to search for: "xy"
    assert redactor.text("key abcdefgh and abcd") == "key *** and ***"  # the longer key goes whole
    assert redactor.text("xy stays") == "xy stays"
    data = {"abcd": ["Bearer abcdefgh", {"n": 1, "deep": "abcd"}], "ok": None}
    assert redactor.data(data) == {MASK: ["Bearer ***", {"n": 1, "deep": MASK}], "ok": None}
    assert redactor.plus("REQUEST-KEY-1").text("REQUEST-KEY-1 abcd") == "*** ***"
    assert redactor.text("REQUEST-KEY-1") == "REQUEST-KEY-1"  # plus() leaves the original alone
    headers = {"Authorization": "Bearer x", "X-RapidAPI-Key": "k", "Accept": "json", "nested": {"api_key": "s", "toolbench_key": ""}}
    assert mask_fields(headers) == {"Authorization": MASK, "X-RapidAPI-Key": MASK, "Accept": "json", "nested": {"api_key": MASK, "toolbench_key": ""}}
    assert public_url("https://u:p@[::1]:8443/v1/x?key=1#f") == "https://[::1]:8443/v1/x"
    assert public_url("https://u:p@h:8443/v1", keep_path=False) == "https://h:8443"
    assert public_url("http://[bad") == "<invalid URL>"


def test_log_lines_and_tracebacks_are_redacted() -> None:
    redact = RedactSecrets()
    redact.add(["sk-LOG-SECRET-1"])
    try:
        raise RuntimeError("upstream said: Incorrect API key provided: sk-LOG-SECRET-1")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "calling with %s", ("sk-LOG-SECRET-1",), __import__("sys").exc_info())
    redact.filter(record)
    formatted = logging.Formatter().format(record)
    assert "sk-LOG-SECRET-1" not in formatted and "calling with ***" in formatted and "provided: ***" in formatted


def test_a_secret_is_found_json_escaped_percent_encoded_and_in_base64() -> None:
    import base64
    from urllib.parse import quote

    key = "sk-A/B+c9e77d1a2"
    redactor = Redactor([key])
    escaped = "".join(f"\\u{ord(c):04x}" if i % 2 else c for i, c in enumerate(key))
    assert redactor.text(f"x {escaped} y") == "x *** y"
    assert redactor.text(json.dumps(json.dumps({"k": escaped}))) == json.dumps(json.dumps({"k": MASK}))  # JSON in JSON: \\\\u
    assert redactor.text(key.replace("/", "\\/")) == MASK
    assert redactor.text("".join(f"\\u{ord(c):04X}" for c in key)) == MASK
    assert redactor.text("?k=" + quote(key, safe="")) == "?k=***"
    assert redactor.text("?k=" + quote(key, safe="").replace("%2F", "%2f")) == "?k=***"
    for prefix in ("", "u", "us", "user:"):  # each offset of the key inside a longer base64 text
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(f"{prefix}{key}!tail".encode()).decode()
            assert MASK in redactor.text(encoded) and encoded not in redactor.text(encoded)
    assert redactor.text("plain base64 aGVsbG8gd29ybGQ= and \\u0041 and %41") == "plain base64 aGVsbG8gd29ybGQ= and \\u0041 and %41"


def test_log_lines_show_control_characters_escaped() -> None:
    """A name from a file or a store holding ESC sequences never reaches the terminal a log is written to as such."""
    from stabletoolbench_mirror.core.logs import printable

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "skipping %s", ("tree/evil\x1b[2J\x9b31m\u202e.json\tok",), None)
    RedactSecrets().filter(record)
    assert record.getMessage() == "skipping tree/evil\\u001b[2J\\u009b31m\\u202e.json\tok"
    # JSON stays exact: what json.dumps leaves raw becomes an escape JSON reads back as the same character
    text = json.dumps({"k": "a\x7f\x9b\u2066\r\n"}, ensure_ascii=False)
    assert json.loads(printable(text)) == {"k": "a\x7f\x9b\u2066\r\n"} and printable("a\rb", keep_cr=True) == "a\rb"
