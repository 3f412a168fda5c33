"""The API's errors: a status, a short machine code, a message fit for the caller (never a
param's value, an address or a secret), and the problems of an invalid body."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        problems: Sequence[str] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.problems = list(problems)
        self.headers = dict(headers or {})
        self.extra: dict[str, object] = {}

    def body(self) -> dict[str, object]:
        out: dict[str, object] = {"error": self.code, "message": self.message}
        if self.problems:
            out["problems"] = self.problems
        out.update(self.extra)
        return out


def bad_request(message: str, code: str = "invalid_request", problems: Sequence[str] = ()) -> ApiError:
    return ApiError(400, code, message, problems=problems)


def not_found(message: str, code: str = "not_found") -> ApiError:
    return ApiError(404, code, message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


UNAUTHORIZED = ApiError(
    401, "unauthorized", "a valid bearer token is required", headers={"WWW-Authenticate": 'Bearer realm="notify"'}
)
STORE_UNAVAILABLE = ApiError(503, "store_unavailable", "the status store did not answer; try again", headers={
    "Retry-After": "1"
})
INVALID_TEXT = ApiError(400, "invalid_text", "the request holds text that is not valid Unicode (a lone surrogate)")


def problems(errors: Iterable[Mapping[str, Any]]) -> list[str]:
    """``field.path: message`` per validation error (pydantic's), never the rejected input."""
    out = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
        where = ".".join(loc)
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        out.append(f"{where}: {message}" if where else message)
    return out[:20]


def invalid_body(found: list[str]) -> ApiError:
    """The answer to a body that is not the route's model."""
    return ApiError(400, "invalid_request", "the request is not valid: " + "; ".join(found[:3]), problems=found)
