"""``dedupctl api run [--processes N]``: the app on uvicorn, in the foreground.

One process, or N on one port: uvicorn's multi-process mode, where this process binds the
listening socket once and N processes (spawned, each with its own event loop, store writer,
producer and lifespan) accept from it. A shared socket rather than one socket per process with
SO_REUSEPORT: connections waiting to be accepted are in one queue, so a process that dies takes
none of them with it (each SO_REUSEPORT socket has its own queue, whose connections are reset
when it closes), and a bind error is reported once. The supervisor starts a new process for one
that dies. What runs once (campaigns, the verdicts' reader, pruning) runs in the process holding
the store's lease (``api.leader``).

SIGTERM or SIGINT: each process stops accepting, lets its requests in flight finish (up to
``api.shutdown_timeout_s``), then its services stop (campaigns after their batch, the producer
flushed, the lease given up). With several processes, ``/metrics`` of any one is the sum over all
of them (``PROMETHEUS_MULTIPROC_DIR``: a fresh directory of this run, unless one is set).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI
from prometheus_client import multiprocess as prom_multiprocess
from uvicorn.supervisors import Multiprocess

from api.app import create_app
from api.metrics import MULTIPROC_ENV
from api.services import build_services
from ops.stacks import dump_stacks_on_signal
from settings import Settings

logger = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: a process that does not answer the supervisor's ping for this long is killed and replaced (a
#: new one answers only once its imports are done: seconds, more on a loaded machine)
HEALTHCHECK_S = 30


def _config(cfg: Settings, app: object, host: str | None, port: int | None, **extra: object) -> uvicorn.Config:
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host or cfg.api.host,
        port=port or cfg.api.port,
        access_log=False,  # api.gate logs each request without its ids
        log_config=None,  # the process's logging (dedupctl's)
        timeout_graceful_shutdown=int(max(1, cfg.api.shutdown_timeout_s)),
        server_header=False,
        lifespan="on",
        **extra,  # type: ignore[arg-type]
    )


def process_app(cfg: Settings, log_level: int) -> FastAPI:
    """The app of one of several processes (called in the spawned process: its logging first)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=log_level, format=LOG_FORMAT)
    dump_stacks_on_signal()  # a spawned process has not inherited the handler
    return create_app(lambda: build_services(cfg))


class Supervisor(Multiprocess):
    """uvicorn's supervisor; a process that died also leaves the metrics' live gauges."""

    def keep_subprocess_alive(self) -> None:
        before = {p.pid for p in self.processes}
        super().keep_subprocess_alive()
        for pid in before - {p.pid for p in self.processes}:
            if pid is not None:
                prom_multiprocess.mark_process_dead(pid)


@contextlib.contextmanager
def metrics_dir() -> Iterator[str]:
    """The processes' metrics directory: the one set, emptied of an earlier run's files, or a
    new one, removed at the end."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        for name in os.listdir(given):
            if name.endswith(".db"):
                os.unlink(os.path.join(given, name))
        yield given
        return
    made = tempfile.mkdtemp(prefix="notify-api-metrics-")
    os.environ[MULTIPROC_ENV] = made
    try:
        yield made
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(made, ignore_errors=True)


def run(cfg: Settings, host: str | None = None, port: int | None = None, processes: int | None = None) -> None:
    count = processes or cfg.api.processes
    if count <= 1:
        config = _config(cfg, create_app(lambda: build_services(cfg)), host, port)
        logger.info("the API listens on http://%s:%d", config.host, config.port)
        uvicorn.Server(config).run()
        return
    with metrics_dir():
        app = functools.partial(process_app, cfg, logging.getLogger().getEffectiveLevel())
        config = _config(cfg, app, host, port, factory=True, workers=count, timeout_worker_healthcheck=HEALTHCHECK_S)
        listening: socket.socket = config.bind_socket()
        logger.info("the API listens on http://%s:%d with %d processes", config.host, config.port, count)
        try:
            Supervisor(config, sockets=[listening]).run()
        finally:
            listening.close()
