"""Real-world answers for StableToolBench's validity rules: one invalid row per upstream rule, and valid ones.

Shared by the pure classification tests and the tests that serve these answers from
a real relay on 127.0.0.1.
"""

from __future__ import annotations

from typing import Any

# (id, answer, the marker or rule the reason names)
INVALID_ROWS: list[tuple[str, Any, str]] = [
    # the error field: the relay's own classifications and anything else non-empty
    ("relay-api-not-working", {"error": "API not working error...", "response": ""}, "API not working error..."),
    ("relay-unauthorized", {"error": "Unauthorized error...", "response": ""}, "Unauthorized error..."),
    ("relay-unsubscribed", {"error": "Unsubscribed error...", "response": ""}, "Unsubscribed error..."),
    ("relay-too-many", {"error": "Too many requests error...", "response": ""}, "Too many requests error..."),
    ("relay-rate-limit", {"error": "Rate limit error...", "response": ""}, "Rate limit error..."),
    ("relay-per-minute", {"error": "Rate limit per minute error...", "response": ""}, "Rate limit per minute error..."),
    ("relay-message", {"error": "Message error...", "response": '{"message": "Something went wrong"}'}, "Message error..."),
    ("relay-gateway", {"error": "Gateway error...", "response": ""}, "Gateway error..."),
    ("relay-blocked", {"error": "Blocked error...", "response": ""}, "Blocked error..."),
    (
        "relay-function-crash",
        {"error": "Function executing from my_tools.Data.x.api import y error...\nHTTPSConnectionPool: Max retries exceeded", "response": ""},
        "Function executing",
    ),
    ("other-error-text", {"error": "something broke", "response": "data"}, "'error' field is not empty"),
    ("no-error-field", {"response": "data"}, "no 'error' field"),
    ("no-response-field", {"error": ""}, "no 'response' field"),
    ("not-an-object", ["error", "response"], "not a JSON object"),
    # the response text
    ("rate-limit", {"error": "", "response": {"message": "You have exceeded the rate limit per minute for your plan, BASIC, by the API provider"}}, "rate limit"),
    ("time-out", {"error": "", "response": "Connection time out while contacting the upstream server"}, "time out"),
    (
        "timed-out",
        {"error": "", "response": {"messages": "The request to the API has timed out. Please try again later, or if the issue persists, please contact the API provider", "info": "Your Client (working) ---> Gateway (working) ---> API (took too long to respond)"}},
        "timed out",
    ),
    ("does-not-exist", {"error": "", "response": {"detail": "Player with id 99 does not exist"}}, "does not exist"),
    ("404", {"error": "", "response": "<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>"}, "404"),
    ("504", {"error": "", "response": "<html><body><h1>504 Gateway Time-out</h1>The server didn't respond in time.</body></html>"}, "504"),
    ("500", {"error": "", "response": {"statusCode": 500, "error": "Internal Server Error"}}, "500"),
    ("internal-error", {"error": "", "response": {"code": "INTERNAL", "msg": "An internal error occurred, try again"}}, "internal error"),
    ("api-doesnt-exist", {"error": "", "response": {"message": "API doesn't exists"}}, "API doesn't exists"),
    ("service-not-found", {"error": "", "response": {"message": "Service Not Found"}}, "Service Not Found"),
    ("authoriz", {"error": "", "response": {"error": "You are not authorized to access this resource"}}, "authoriz"),
    ("authenticat", {"error": "", "response": {"message": "Authentication failed: missing token"}}, "authenticat"),
    # "unauthorized" and "unauthenticated" always contain an earlier marker; these rows show they are caught
    ("unauthorized", {"error": "", "response": "Unauthorized"}, "authoriz"),
    ("unauthenticated", {"error": "", "response": {"status": "UNAUTHENTICATED"}}, "authenticat"),
    ("blocked-user", {"error": "", "response": {"message": "Blocked User. Please contact your API provider."}}, "blocked user"),
    ("unsubscribe", {"error": "", "response": "This user has unsubscribed from the plan"}, "unsubscribe"),
    ("blocked", {"error": "", "response": {"message": "Your IP address has been blocked"}}, "blocked"),
    ("401", {"error": "", "response": {"status": 401, "title": "Invalid token"}}, "401"),
    ("403", {"error": "", "response": "HTTP Error 403: Forbidden"}, "403"),
    ("credential", {"error": "", "response": {"error": "Invalid credentials supplied"}}, "credential"),
    ("disabled-for-subscription", {"error": "", "response": {"message": "This endpoint is disabled for your subscription"}}, "disabled for your subscription"),
    ("access-denied", {"error": "", "response": {"code": "ACCESS_DENIED", "reason": "ip not whitelisted"}}, "ACCESS_DENIED"),
    ("invalid-consumer-key", {"error": "", "response": {"fault": {"faultstring": "Invalid Consumer Key"}}}, "invalid consumer key"),
    ("parameter", {"error": "", "response": {"message": "Missing required parameter: city"}}, "parameter"),
    ("parse", {"error": "", "response": "Could not parse the date '2023-13-45'"}, "parse"),
    ("is-not-defined", {"error": "", "response": "NameError: name 'requests' is not defined"}, "is not defined"),
    ("empty", {"error": "", "response": ""}, "empty response"),
    ("status-code-50x", {"error": "", "response": "request invalid, data error. status_code=503"}, "status_code=50"),
    ("status-code-429", {"error": "", "response": "request invalid, data error. status_code=429"}, "status_code=429"),
]

VALID_ROWS: list[tuple[str, Any]] = [
    ("plain-text", {"error": "", "response": "Lionel Messi is an Argentine professional footballer."}),
    ("json-object", {"error": "", "response": {"results": [{"name": "pinterest.com", "score": 0.087}]}}),
    ("empty-list", {"error": "", "response": {"results": []}}),
    ("number", {"error": "", "response": 42}),
    # upstream's rule: a crash about an unknown argument is recorded, whatever else the text says
    ("unexpected-keyword", {"error": "", "response": "TypeError: search() got an unexpected keyword argument 'parameter'"}),
    ("unexpected-keyword-case", {"error": "", "response": "Got An Unexpected Keyword Argument 'page' (status_code=500)"}),
]
