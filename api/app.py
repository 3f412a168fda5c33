"""The ASGI application: the routes, the gate (api.gate), JSON errors, health and the support page.

``create_app(factory)`` builds the app; ``factory`` makes the services when the app starts
(lifespan) and they are stopped when it stops: campaigns after their batch, the verdicts' reader,
the producer flushed, the store closed. ``create_app()`` alone serves the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import campaign_routes, notifications, outbox_routes, status_routes, unsubscribe, users, webhooks
from api.asgi import AsgiScope, Receive, Send
from api.errors import INVALID_TEXT, STORE_UNAVAILABLE, ApiError, invalid_body, problems
from api.gate import Gate
from api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from api.models import CampaignIn, Health
from api.scopes import ROUTE_SCOPES, check_routes, display_path
from api.services import Services
from ops import collector, gil
from senders.errors import StoreUnavailableError
from senders.store.db import Database

logger = logging.getLogger(__name__)

TITLE = "notify-dedup API"
#: the support page runs its own inline script, talks to this origin only, and is never framed
SUPPORT_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors"
               " 'none'; base-uri 'none'; form-action 'none'")
SUPPORT_HEADERS = {
    "Content-Security-Policy": SUPPORT_CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: OpenAPI links: where an answer's ids lead (schemathesis's stateful phase follows them)
LINKS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {
    ("/v1/notifications", "post", "202"): {
        "GetNotification": {"operationId": "get_notification", "parameters": {"notification_id": "$response.body#/id"}},
        "SupportNotification": {"operationId": "support_notification",
                                "parameters": {"notification_id": "$response.body#/id"}},
    },
    ("/v1/users/{user_id}/contacts", "put", "200"): {
        "GetUser": {"operationId": "get_user", "parameters": {"user_id": "$response.body#/user_id"}},
        "UserNotifications": {"operationId": "user_notifications",
                              "parameters": {"user_id": "$response.body#/user_id"}},
        "EraseUser": {"operationId": "delete_user", "parameters": {"user_id": "$response.body#/user_id"}},
    },
    ("/v1/users/{user_id}/preferences", "put", "200"): {
        "GetUser": {"operationId": "get_user", "parameters": {"user_id": "$response.body#/user_id"}},
        "PutContacts": {"operationId": "put_contacts", "parameters": {"user_id": "$response.body#/user_id"}},
    },
    ("/v1/campaigns", "post", "202"): {
        "GetCampaign": {"operationId": "get_campaign", "parameters": {"campaign_id": "$response.body#/campaign_id"}},
        "PauseCampaign": {"operationId": "pause_campaign",
                          "parameters": {"campaign_id": "$response.body#/campaign_id"}},
        "SupportCampaign": {"operationId": "support_campaign",
                            "parameters": {"campaign_id": "$response.body#/campaign_id"}},
        "SupportPause": {"operationId": "support_pause", "parameters": {"campaign_id": "$response.body#/campaign_id"}},
    },
    ("/v1/support/campaigns/{campaign_id}/pause", "post", "200"): {
        "SupportResume": {"operationId": "support_resume",
                          "parameters": {"campaign_id": "$response.body#/campaign_id"}},
    },
    ("/v1/campaigns/{campaign_id}/pause", "post", "200"): {
        "ResumeCampaign": {"operationId": "resume_campaign",
                           "parameters": {"campaign_id": "$response.body#/campaign_id"}},
    },
}
VERSION = "1.0.0"


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(invalid_body(problems(exc.errors())).body(), status_code=400)

    @app.exception_handler(UnicodeEncodeError)
    async def not_utf8(_: Request, exc: UnicodeEncodeError) -> JSONResponse:
        # a JSON string with a lone surrogate (\ud800) parses, but is no text: nothing can store it
        return JSONResponse(INVALID_TEXT.body(), status_code=400)

    @app.exception_handler(StoreUnavailableError)
    async def store_down(request: Request, exc: StoreUnavailableError) -> JSONResponse:
        logger.warning("the store did not answer: %s", exc)
        svc: Services | None = request.app.state.services
        if svc is not None:
            svc.metrics.unavailable.labels("store_unavailable").inc()
        return JSONResponse(STORE_UNAVAILABLE.body(), status_code=503, headers=STORE_UNAVAILABLE.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"error": code, "message": str(exc.detail)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the bearer scheme, and 400 (our invalid-request answer) in place
    of its generic 422 validation error, which this API never gives for that."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=TITLE, version=VERSION, routes=app.routes, description=__doc__ or "")
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    scope_of = {(m, display_path(p)): scope for (m, p), scope in ROUTE_SCOPES.items()}
    schemas = components.setdefault("schemas", {})
    body = CampaignIn.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, schema in body.pop("$defs", {}).items():
        schemas.setdefault(name, schema)
    schemas["CampaignIn"] = body
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.get("responses", {})
            for (p, m, code), links in LINKS.items():
                if (p, m) == (path, method) and code in responses:
                    responses[code]["links"] = links
            generic = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if generic.get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
            if path.startswith("/v1/"):
                operation["security"] = [{"bearer": []}]
                scope = scope_of.get((method.upper(), path))
                if scope is not None:
                    operation["x-scope"] = scope.value
                    operation["description"] = (f"Needs the scope `{scope.value}`. "
                                                + operation.get("description", "")).strip()
    for name in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(name, None)
    app.openapi_schema = doc
    return doc


def _ping(db: Database) -> None:
    with db.tx(write=False) as cur:
        db.exec(cur, "SELECT 1").fetchone()


class NotifyApp(FastAPI):
    """FastAPI with the gate (api.gate) in front of the framework rather than among its middleware:
    every HTTP request meets the gate first, and the hot route (``POST /v1/notifications``) is
    answered there, without passing FastAPI's and Starlette's layers (the error middleware, the
    native telemetry's per-request check of OpenTelemetry, the body limit: ~10% of the event
    loop's time per request). Every other request goes on into the framework as before."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._front = Gate(functools.partial(FastAPI.__call__, self))

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        await self._front(scope, receive, send)


def create_app(factory: Callable[[], Services] | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if factory is None:
            yield
            return
        svc = factory()
        app.state.services = svc
        svc.start()
        lag = asyncio.get_running_loop().create_task(svc.metrics.watch_loop(), name="api-loop-lag")
        # what start-up made lives as long as the process: out of the collector's sight, a full
        # collection no longer walks it (one took 80-180 ms of every thread's time, the loop's too);
        # the store writer gets the interpreter back from the loop within api.switch_interval_ms
        with collector.serving(young_threshold=None), gil.switch_interval(svc.cfg.api.switch_interval_ms):
            logger.info("the API is ready")
            try:
                yield
            finally:
                logger.info("the API is stopping: campaigns, verdicts, the producer (flush), the store")
                lag.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lag
                svc.stop()

    app = NotifyApp(title=TITLE, version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
                  generate_unique_id_function=lambda route: route.name)
    app.state.services = None
    _install_errors(app)
    routers = (notifications, status_routes, users, webhooks, campaign_routes, outbox_routes, unsubscribe)
    for module in routers:
        app.include_router(module.router)
    check_routes((method, route.path) for module in routers for route in module.router.routes
                 for method in getattr(route, "methods", None) or () if isinstance(getattr(route, "path", None), str))

    @app.get("/healthz", response_model=Health, summary="Liveness: the process answers")
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, responses={503: {"model": Health, "description": "not ready"}},
             summary="Readiness for a load balancer: started, Kafka and the store answer (which is missing)")
    async def readyz(request: Request) -> JSONResponse:
        svc: Services | None = request.app.state.services
        checks = {"started": "ok" if svc is not None and svc.ready else "no"}
        if svc is not None:
            down = svc.producer.unavailable()
            checks["kafka"] = "ok" if down is None else f"unreachable: {down}"
            try:
                await svc.pool.run(_ping)
                checks["store"] = "ok"
            except StoreUnavailableError:
                checks["store"] = "unavailable"
        ok = all(v == "ok" for v in checks.values())
        if not ok and svc is not None:
            svc.metrics.unavailable.labels("not_ready").inc()
        return JSONResponse(Health(status="ok" if ok else "unavailable", checks=checks).model_dump(),
                            status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        svc: Services | None = request.app.state.services
        if svc is None:
            return Response("the API has not started\n", status_code=503, media_type="text/plain")
        # several processes: the files of all of them are read and summed; off the loop
        text = await asyncio.to_thread(svc.metrics.render)
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    @app.get("/support", response_class=HTMLResponse, include_in_schema=False)
    async def support() -> HTMLResponse:
        page = resources.files("api").joinpath("support.html").read_text(encoding="utf-8")
        return HTMLResponse(page, headers=SUPPORT_HEADERS)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
