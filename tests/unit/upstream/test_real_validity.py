"""StableToolBench's validity rules for real answers, one row per upstream rule, with real-world bodies."""

from __future__ import annotations

from typing import Any

import pytest

from stabletoolbench_mirror.upstream.validity import classify
from tests.helpers.validity_rows import INVALID_ROWS, VALID_ROWS


@pytest.mark.parametrize("answer,marker", [pytest.param(a, m, id=i) for i, a, m in INVALID_ROWS])
def test_invalid_answers_are_rejected_with_the_rule_named(answer: Any, marker: str) -> None:
    verdict = classify(answer)
    assert verdict.valid is False
    assert marker in verdict.reason


@pytest.mark.parametrize("answer", [pytest.param(a, id=i) for i, a in VALID_ROWS])
def test_valid_answers_pass(answer: Any) -> None:
    assert classify(answer) == (True, "")


def test_case_sensitive_markers_are_case_sensitive() -> None:
    # upstream compares these without lower-casing
    assert classify({"error": "", "response": "service not found in this region list"}).valid
    assert classify({"error": "", "response": "access_denied_count: 0"}).valid
    assert not classify({"error": "", "response": "ACCESS_DENIED"}).valid


def test_unexpected_keyword_does_not_rescue_an_error_field() -> None:
    answer = {"error": "Message error...", "response": "f() got an unexpected keyword argument 'x'"}
    assert not classify(answer).valid


def test_upstream_checks_the_python_text_of_a_structured_response() -> None:
    # str() of a dict: a 500 anywhere inside counts (the crude upstream rule)
    assert not classify({"error": "", "response": {"price": "$1500"}}).valid


def test_reason_never_quotes_the_response() -> None:
    verdict = classify({"error": "", "response": "Invalid credentials for key SECRET-abcdef"})
    assert not verdict.valid and "SECRET" not in verdict.reason
    verdict = classify({"error": "Function executing x error...\nkey SECRET-abcdef", "response": ""})
    assert "SECRET" not in verdict.reason


# -- strict ------------------------------------------------------------------------------------

STRICT_FALSE_INVALIDS = [
    ("price-with-500", {"error": "", "response": {"product": "Laptop", "price": "$1500.00", "stock": 404}}),
    ("sparse", {"error": "", "response": "The matrix is sparse; parsed 3 rows"}),
    ("parameters-in-a-description", {"error": "", "response": "The function takes two parameters and returns their sum."}),
    ("author-field", {"error": "", "response": {"authorized_dealers": ["A", "B"]}}),
]
STRICT_EXTRA_INVALIDS = [
    ("whitespace", {"error": "", "response": "   \n"}),
    ("null", {"error": "", "response": None}),
    ("error-envelope", {"error": "", "response": {"error": {"code": "E42", "message": "Something went wrong"}}}),
    ("success-false", {"error": "", "response": {"success": False, "message": "Something went wrong"}}),
    ("status-error", {"error": "", "response": {"status": "error", "message": "Could not complete"}}),
    ("html-error-page", {"error": "", "response": "<!DOCTYPE html><html><head><title>Application Error</title></head></html>"}),
]
STRICT_STILL_INVALID = [
    ("rate-limit", {"error": "", "response": {"message": "You have exceeded the rate limit per minute"}}),
    ("status-code", {"error": "", "response": {"statusCode": 404, "message": "Resource missing"}}),
    ("http-500", {"error": "", "response": "HTTP 500"}),
    ("not-found-page", {"error": "", "response": "404 Not Found"}),
    ("status_code=503", {"error": "", "response": "request invalid, data error. status_code=503"}),
    ("missing-parameter", {"error": "", "response": {"message": "Missing required parameter: city"}}),
    ("unsubscribed", {"error": "", "response": {"message": "You are not subscribed to this API."}}),
    ("relay-error", {"error": "Unauthorized error...", "response": ""}),
]


@pytest.mark.parametrize("answer", [pytest.param(a, id=i) for i, a in STRICT_FALSE_INVALIDS])
def test_strict_mode_does_not_reject_incidental_substrings(answer: Any) -> None:
    assert not classify(answer).valid  # the compatible default does
    assert classify(answer, strict=True).valid


@pytest.mark.parametrize("answer", [pytest.param(a, id=i) for i, a in STRICT_EXTRA_INVALIDS])
def test_strict_mode_rejects_error_shaped_answers(answer: Any) -> None:
    assert not classify(answer, strict=True).valid


@pytest.mark.parametrize("answer", [pytest.param(a, id=i) for i, a in STRICT_STILL_INVALID])
def test_strict_mode_keeps_real_errors_invalid(answer: Any) -> None:
    assert not classify(answer, strict=True).valid
