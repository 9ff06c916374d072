"""Which real API answers count as working: StableToolBench's rules, and a stricter option.

StableToolBench records a real answer only when it passes a list of crude
substring checks on ``str(answer["response"])``.  :func:`classify` reproduces those
rules (the compatible default).  ``strict=True`` applies the same classes of rule
more precisely (whole words, HTTP codes only where they read as a status) and in
addition rejects error-shaped answers that the substring rules let through
(blank/null answers, JSON error envelopes, HTML error pages).

Both are pure functions of the answer.  A reason never quotes the answer itself
(which may echo a key); it names the rule that matched.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple


class Validity(NamedTuple):
    valid: bool
    reason: str
    """Empty for a valid answer; otherwise the rule that rejected it."""


VALID = Validity(True, "")

#: a response text with this is valid whatever else it says (upstream rule, checked first)
UNEXPECTED_KEYWORD = "got an unexpected keyword argument"

#: upstream's case-insensitive markers, in upstream's order
INVALID_MARKERS: tuple[str, ...] = (
    "rate limit",
    "time out",
    "timed out",
    "does not exist",
    "404",
    "504",
    "500",
    "internal error",
    # upstream lower-cases the text before this test, so only its exact-message special case ever
    # matched; the issue lists the class as invalid, so it is applied case-insensitively here
    "API doesn't exists",
    "authoriz",
    "authenticat",
    "unauthorized",
    "blocked user",
    "unsubscribe",
    "blocked",
    "401",
    "403",
    "credential",
    "unauthenticated",
    "disabled for your subscription",
    "invalid consumer key",
    "parameter",
    "parse",
    "is not defined",
)
#: upstream's case-sensitive markers
INVALID_MARKERS_EXACT_CASE: tuple[str, ...] = ("Service Not Found", "ACCESS_DENIED", "status_code=50", "status_code=429")

#: the relay's own error texts (ToolBench's RapidAPI server), named in reasons
RELAY_ERRORS: frozenset[str] = frozenset(
    {
        "API not working error...",
        "API temporarily not working error...",
        "Unauthorized error...",
        "Unsubscribed error...",
        "Too many requests error...",
        "Rate limit error...",
        "Rate limit per minute error...",
        "Gateway error...",
        "Blocked error...",
        "Message error...",
    }
)


def classify(answer: Any, *, strict: bool = False) -> Validity:
    """Whether a real ``{"error", "response"}`` answer may be recorded, and if not, why."""
    shape = _check_shape(answer)
    if shape is not None:
        return shape
    text = str(answer["response"])
    if UNEXPECTED_KEYWORD in text.lower():
        return VALID
    return _classify_strict(answer["response"], text) if strict else _classify_compatible(text)


def _check_shape(answer: Any) -> Validity | None:
    if not isinstance(answer, dict):
        return Validity(False, "the answer is not a JSON object")
    if "error" not in answer:
        return Validity(False, "the answer has no 'error' field")
    error = answer["error"]
    if error != "":
        if isinstance(error, str) and error in RELAY_ERRORS:
            return Validity(False, f"error {error!r}")
        if isinstance(error, str) and error.startswith("Function executing "):
            return Validity(False, "error 'Function executing ... error'")
        return Validity(False, "the 'error' field is not empty")
    if "response" not in answer:
        return Validity(False, "the answer has no 'response' field")
    return None


def _classify_compatible(text: str) -> Validity:
    lowered = text.lower()
    for marker in INVALID_MARKERS:
        if marker.lower() in lowered:
            return Validity(False, f"response contains {marker!r}")
    for marker in INVALID_MARKERS_EXACT_CASE:
        if marker in text:
            return Validity(False, f"response contains {marker!r}")
    if not text:
        return Validity(False, "empty response")
    return VALID


# -- strict ------------------------------------------------------------------------------------

_CODES = r"(?:401|403|404|429|500|502|503|504)"
_STRICT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, flags))
    for name, pattern, flags in (
        ("rate limit", r"\brate[ -]?limit", re.I),
        ("time out", r"\btime[ -]?out\b|\btimed[ -]?out\b", re.I),
        ("does not exist", r"\bdoes ?n[o']t exists?\b", re.I),
        ("internal error", r"\binternal (?:server )?error\b", re.I),
        ("Service Not Found", r"\bService Not Found\b", 0),
        (
            "authoriz",
            r"\bunauthori[sz]ed\b|\bnot authori[sz]ed\b|\b(?:invalid|missing) authori[sz]ation\b"
            r"|\bauthori[sz]ation (?:failed|required|error|denied|header)",
            re.I,
        ),
        (
            "authenticat",
            r"\bunauthenticated\b|\bnot authenticated\b|\bfailed to authenticate\b"
            r"|\bauthentication (?:failed|required|error|denied)",
            re.I,
        ),
        ("blocked", r"\bblocked\b", re.I),
        ("unsubscribe", r"\bunsubscribed?\b|\bnot subscribed\b", re.I),
        ("credential", r"\bcredentials?\b", re.I),
        ("disabled for your subscription", r"\bdisabled for your subscription\b", re.I),
        ("ACCESS_DENIED", r"\bACCESS_DENIED\b|\baccess denied\b", re.I),
        ("invalid consumer key", r"\binvalid (?:consumer |api[ -]?)key\b", re.I),
        ("parameter", r"\b(?:missing|invalid|required|unknown|bad) (?:query )?param(?:eter)?s?\b|\bparam(?:eter)?s? (?:is |are )?(?:missing|invalid|required)\b", re.I),
        ("parse", r"\b(?:parse|parsing) error\b|\bcould not parse\b|\bfailed to parse\b|\bunable to parse\b", re.I),
        ("is not defined", r"\bis not defined\b", re.I),
        # an HTTP status code only where it reads as one: "HTTP 500", "status code 404", "'status': 503",
        # "error 401", "status_code=502", "404 Not Found"
        ("HTTP error status", r"(?:\bstatus|\bcode|\berror|\bhttp)\w*[\s'\":=_-]{0,6}" + _CODES + r"(?!\d)", re.I),
        (
            "HTTP error status",
            r"(?<![\d.])" + _CODES + r"\s*[-:]?\s*(?:not found|forbidden|unauthori[sz]ed|internal server error|bad gateway|"
            r"service unavailable|gateway time-?out|too many requests)",
            re.I,
        ),
    )
)
_ERROR_ENVELOPE_KEYS = frozenset({"error", "errors", "message", "messages", "msg", "detail", "status", "statuscode", "status_code", "code", "success", "info"})
_HTML_ERROR = re.compile(r"^\s*(?:<!doctype html|<html)[\s\S]{0,2000}?<title>[^<]*(?:error|" + _CODES + r"|not found|forbidden|unavailable)", re.I)


def _classify_strict(response: Any, text: str) -> Validity:
    if response is None or (isinstance(response, str) and not response.strip()):
        return Validity(False, "empty response")
    for name, pattern in _STRICT_RULES:
        if pattern.search(text):
            return Validity(False, f"response matches {name!r}")
    if isinstance(response, str) and _HTML_ERROR.search(response):
        return Validity(False, "response is an HTML error page")
    if isinstance(response, dict):
        envelope = _error_envelope(response)
        if envelope:
            return Validity(False, envelope)
    return VALID


def _error_envelope(response: dict[Any, Any]) -> str:
    """A reason when a JSON object answer is only an error report, else ``""``."""
    keys = {str(k).lower() for k in response}
    if not keys or not keys <= _ERROR_ENVELOPE_KEYS:
        return ""
    lowered = {str(k).lower(): v for k, v in response.items()}
    if lowered.get("error") or lowered.get("errors"):
        return "response is an error object"
    if lowered.get("success") is False:
        return "response is an error object ('success': false)"
    status = lowered.get("status")
    if isinstance(status, str) and status.lower() in ("error", "fail", "failed", "failure"):
        return "response is an error object ('status')"
    return ""
