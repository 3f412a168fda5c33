"""Plain ASGI helpers of the gate and the lean routes: the types, a raw header, a JSON error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from api import jsontext
from api.errors import ApiError

AsgiScope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[AsgiScope, Receive, Send], Awaitable[None]]


def raw_header(scope: AsgiScope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value)
    return None


def header(scope: AsgiScope, name: bytes) -> str | None:
    """A header's value as the server hands it over (latin-1, byte for byte)."""
    value = raw_header(scope, name)
    return None if value is None else value.decode("latin-1")


async def send_json(send: Send, status: int, content: Any, headers: dict[str, str] | None = None) -> None:
    """JSON as the app's JSONResponse writes it (UTF-8, compact)."""
    body = jsontext.dumps(content)
    raw = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def respond(send: Send, error: ApiError) -> None:
    await send_json(send, error.status, error.body(), error.headers)
