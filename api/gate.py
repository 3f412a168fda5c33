"""The door every request goes through (plain ASGI, before routing): the bearer token of /v1
calls (401), the caller's rate for new notifications (429 with Retry-After), a bounded body
(413), one access log line without ids, params or tokens (the route's template, the status, the
time), and a JSON 500 for anything unforeseen: nothing a request does brings the process down."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from api.errors import STORE_UNAVAILABLE, UNAUTHORIZED, ApiError
from api.tokens import Caller, lookup
from senders.errors import StoreUnavailableError

logger = logging.getLogger("api.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def respond(send: Send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class Gate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = [0]
        started = [False]

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                started[0] = True
            await send(message)

        try:
            await self._handle(scope, receive, watched)
        except Exception:  # noqa: BLE001 - the last guard: a JSON 500, the process goes on
            logger.exception("unhandled error in %s %s", scope.get("method"), _route(scope))
            if not started[0]:
                await respond(watched, ApiError(500, "internal", "internal error"))
        took = (time.monotonic() - start) * 1000
        level = logging.WARNING if status[0] >= 500 else logging.DEBUG
        logger.log(level, "%s %s %d %.1f ms", scope.get("method"), _route(scope), status[0], took)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        services = scope["app"].state.services
        if services is None:  # not started (the OpenAPI document alone)
            await self.app(scope, receive, send)
            return
        if path.startswith("/v1/"):
            try:
                caller = await self._caller(scope, services)
            except StoreUnavailableError:
                await respond(send, STORE_UNAVAILABLE)
                return
            if caller is None:
                await respond(send, UNAUTHORIZED)
                return
            scope.setdefault("state", {})["caller"] = caller
            if scope.get("method") == "POST" and path == "/v1/notifications":
                wait = services.callers.admit(caller.name, caller.rate_per_sec)
                if wait is not None:
                    await respond(send, ApiError(
                        429, "rate_limited", f"caller {caller.name} is over its rate; retry after {wait} s",
                        headers={"Retry-After": str(wait)},
                    ))
                    return
        api = services.cfg.api
        limit = api.max_campaign_body_bytes if path == "/v1/campaigns" else api.max_body_bytes
        body = await self._body(scope, receive, limit)
        if body is None:
            await respond(send, ApiError(413, "body_too_large", f"the body is over {limit} bytes"))
            return
        replayed = [False]

        async def replay() -> Message:
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _caller(self, scope: Scope, services: Any) -> Caller | None:
        header = _header(scope, b"authorization")
        if header is None or not header.startswith("Bearer "):
            return None
        token = header[len("Bearer "):].strip()
        caller: Caller | None = services.tokens.get(token)
        if caller is not None:
            return caller
        caller = await services.pool.run(lambda db: lookup(db, token))
        if caller is not None:
            services.tokens.put(token, caller)
        return caller

    @staticmethod
    async def _body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
        """The whole body, or None when it is over ``limit`` (read no further than that)."""
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "(no route)"
