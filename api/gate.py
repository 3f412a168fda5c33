"""The door every request goes through (plain ASGI, before routing): on ``/v1`` the bearer token
(401), the scope the route needs (403 naming it: ``api.scopes``), the caller's rate (429 with
Retry-After: one bucket for new notifications, one for every other call); a bounded body (413);
``X-Content-Type-Options: nosniff`` on every answer; one access log line without ids, params
or tokens (the route's template, the status, the time), and a JSON 500 for anything unforeseen:
nothing a request does brings the process down."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from api import notifications
from api.asgi import ASGIApp, AsgiScope, Message, Receive, Send, header, respond
from api.errors import STORE_UNAVAILABLE, UNAUTHORIZED, ApiError
from api.metrics import method_label
from api.scopes import ROUTE_SCOPES, Scope, display_path, route_of
from api.tokens import Found, TokenCache, lookup, well_formed
from senders.errors import StoreUnavailableError

logger = logging.getLogger("api.access")

NOSNIFF = (b"x-content-type-options", b"nosniff")


def forbidden_scope(caller: str, scope: Scope) -> ApiError:
    error = ApiError(403, "forbidden", f"caller {caller} lacks the scope {scope.value}, which this route needs")
    error.extra["scope"] = scope.value
    return error


class Gate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._lookups: dict[str, asyncio.Future[Found | None]] = {}  # by token: one store read at a time

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        """An HTTP request (the app, ``api.app.NotifyApp``, sends it nothing else)."""
        start = time.monotonic()
        status = [0]
        started = [False]

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                started[0] = True
                headers = list(message.get("headers", ()))
                if all(bytes(k).lower() != NOSNIFF[0] for k, _ in headers):
                    message["headers"] = [*headers, NOSNIFF]
            await send(message)

        try:
            await self._handle(scope, receive, watched)
        except Exception:  # noqa: BLE001 - the last guard: a JSON 500, the process goes on
            logger.exception("unhandled error in %s %s", scope.get("method"), _route(scope))
            if not started[0]:
                await respond(watched, ApiError(500, "internal", "internal error"))
        took = time.monotonic() - start
        route = _route(scope)
        services = scope["app"].state.services
        if services is not None:
            method = method_label(scope.get("method"))
            services.metrics.requests.labels(method, route, str(status[0])).inc()
            if route == ACCEPT_ROUTE and method == "POST":
                services.metrics.accept.labels(str(status[0])).observe(took)
        level = logging.WARNING if status[0] >= 500 else logging.DEBUG
        logger.log(level, "%s %s %d %.1f ms", scope.get("method"), route, status[0], took * 1000)

    async def _handle(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        services = scope["app"].state.services
        if services is None:  # not started (the OpenAPI document alone)
            await self.app(scope, receive, send)
            return
        if path.startswith("/v1/"):
            refused = await self._admit(scope, services)
            if refused is not None:
                await respond(send, refused)
                return
        api = services.cfg.api
        limit = api.max_campaign_body_bytes if path == "/v1/campaigns" else api.max_body_bytes
        body = await self._body(scope, receive, limit)
        if body is None:
            await respond(send, ApiError(413, "body_too_large", f"the body is over {limit} bytes"))
            return
        if scope.get("notify.route") == notifications.ROUTE and scope.get("method") == "POST":
            # the hot route, served without the framework's routing and dependency machinery
            # (about half of the event loop's time per request: bench/README.md)
            await notifications.serve(scope, body, send, services)
            return
        replayed = [False]

        async def replay() -> Message:
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _admit(self, scope: AsgiScope, services: Any) -> ApiError | None:
        """The caller, its scope for the route and its rate; the refusal, or None (admitted)."""
        route = route_of(str(scope.get("method")), str(scope.get("path", "")))
        if route is not None:
            scope["notify.route"] = display_path(route[1])
        try:
            found = await self._caller(scope, services)
        except StoreUnavailableError:
            services.metrics.unavailable.labels("store_unavailable").inc()
            return STORE_UNAVAILABLE
        if found is None:
            return UNAUTHORIZED
        caller = found.caller
        if route is None:  # no such route or method: the router answers 404 or 405
            return None
        needed = ROUTE_SCOPES[route]
        if not caller.may(needed):
            return forbidden_scope(caller.name, needed)
        scope.setdefault("state", {})["caller"] = caller
        api = services.cfg.api
        if route == ("POST", "/v1/notifications"):
            bucket, rate, what = "send", caller.rate(api.default_rate_per_sec), "its rate of notifications"
        else:
            bucket, rate, what = "calls", api.calls_rate_per_sec, "api.calls_rate_per_sec"
        try:
            wait = await services.callers.admit(caller.name, rate, bucket)
        except StoreUnavailableError:
            services.metrics.unavailable.labels("store_unavailable").inc()
            return STORE_UNAVAILABLE
        if wait is not None:
            services.metrics.rate_limited.labels(caller.name, bucket).inc()
            return ApiError(429, "rate_limited", f"caller {caller.name} is over {what}; retry after {wait} s",
                            headers={"Retry-After": str(wait)})
        return None

    async def _caller(self, scope: AsgiScope, services: Any) -> Any:
        given = header(scope, b"authorization")
        if given is None or not given.startswith("Bearer "):
            return None
        token = given[len("Bearer "):].strip()
        if not well_formed(token):
            return None
        cache: TokenCache = services.tokens
        cached, refresh_due = cache.read(token)
        if cached is TokenCache.REFUSED:
            return None
        if cached is not None:
            if refresh_due and token not in self._lookups:
                self._lookup(token, services).add_done_callback(lambda f: f.cancelled() or f.exception())
            return cached
        return await asyncio.shield(self._lookup(token, services))

    def _lookup(self, token: str, services: Any) -> asyncio.Future[Found | None]:
        """The token read from the store and cached: one read at a time, which every request with
        the token meanwhile waits for (when the cache's time runs out, hundreds arrive at once)."""
        pending = self._lookups.get(token)
        if pending is None or pending.get_loop() is not asyncio.get_running_loop():  # (a test's earlier loop)
            pending = self._lookups[token] = asyncio.ensure_future(self._read_token(token, services))
        return pending

    async def _read_token(self, token: str, services: Any) -> Found | None:
        try:
            now = int(time.time() * 1000)
            found: Found | None = await services.pool.run(lambda db: lookup(db, token, now))
            services.tokens.put(token, found)
            return found
        finally:
            self._lookups.pop(token, None)

    @staticmethod
    async def _body(scope: AsgiScope, receive: Receive, limit: int) -> bytes | None:
        """The whole body, or None when it is over ``limit`` (read no further than that)."""
        length = header(scope, b"content-length")
        if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
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


ACCEPT_ROUTE = notifications.ROUTE


def _route(scope: AsgiScope) -> str:
    """The template of the route that answered (or, refused before routing, the one the gate
    matched); ``unmatched`` for a path of no route: never the path itself."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path:
        return display_path(str(path))
    return str(scope.get("notify.route", "unmatched"))
