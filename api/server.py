"""``dedupctl api run``: the app on uvicorn, in the foreground. SIGTERM or SIGINT: no new
connections, requests in flight finish (up to ``api.shutdown_timeout_s``), then the services stop
(campaigns after their batch, the producer flushed)."""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from api.services import build_services
from settings import Settings

logger = logging.getLogger(__name__)


def run(cfg: Settings, host: str | None = None, port: int | None = None) -> None:
    app = create_app(lambda: build_services(cfg))
    config = uvicorn.Config(
        app,
        host=host or cfg.api.host,
        port=port or cfg.api.port,
        access_log=False,  # api.gate logs each request without its ids
        log_config=None,  # the process's logging (dedupctl's)
        timeout_graceful_shutdown=int(max(1, cfg.api.shutdown_timeout_s)),
        server_header=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    logger.info("the API listens on http://%s:%d", config.host, config.port)
    server.run()
