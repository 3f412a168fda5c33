"""The documented answers of each route, for the OpenAPI document (what schemathesis holds the
running API to)."""

from __future__ import annotations

from typing import Any

from api.models import ErrorBody

DESCRIPTIONS = {
    400: "invalid: the reason, and the problems by field",
    401: "no valid bearer token (or, for a receipt, no valid signature)",
    403: "the caller may not do this: the scope the route needs (named in `scope`), a template or category",
    404: "not found",
    409: "in conflict with the current state",
    413: "the body is too large",
    422: "the Idempotency-Key was used with another request",
    429: "over the caller's rate (notifications, or other calls): Retry-After says when to try again",
    503: "Kafka or the store did not answer in time: retry (with the same Idempotency-Key)",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody, "description": DESCRIPTIONS[code]} for code in codes
    }
    if 429 in codes:
        out[429]["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
    if 503 in codes:
        out[503]["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
    return out


#: what every authenticated route may answer besides its own (403: a scope it lacks; 429: its rate)
V1 = (400, 401, 403, 413, 429, 503)
