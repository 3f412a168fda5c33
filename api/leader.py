"""One API process of a store runs what must run once (``api.singletons``): elected through a
lease in the store (``api.lease``, the row ``api-singletons``).

Every process tries to take the lease every third of ``api.lease_ttl_ms``; the holder renews it.
The holder that dies is replaced once its lease expires, or at once when it was a process of
this host that no longer runs (a restart of one process does not wait for its own lease). A
holder that cannot reach the store keeps its part only as long as its lease lasts by its own
clock, then stops it, since another process may have taken over by then; a holder that finds
the lease taken stops at once. On a graceful stop the holder stops its part, then gives the
lease up, so that another process takes over at its next try.

Two holders at once (clocks far apart, a process paused for longer than the lease) are safe if
wasteful: a campaign's runner fences the one before it (Kafka's transactional id), two readers of
the verdicts share one consumer group, pruning twice prunes nothing more.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from api import lease
from senders.store.db import Database

logger = logging.getLogger(__name__)

LEASE = "api-singletons"


def _now_ms() -> int:
    return int(time.time() * 1000)


def gone_here(host: str, pid: int) -> bool:
    """Whether ``pid`` of ``host`` is a process of this host that no longer runs."""
    if host != socket.gethostname() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


class Elector:
    """:param opener: the elector's own connection
    :param ttl_ms: how long a taken lease lasts (renewed every third of it)
    :param on_elected: called (in the elector's thread) when this process takes the lease
    :param on_deposed: called when it no longer holds it, and before it gives it up on stop
    """

    def __init__(
        self,
        opener: Callable[[], Database],
        *,
        ttl_ms: int,
        on_elected: Callable[[], None],
        on_deposed: Callable[[], None],
        gone: Callable[[str, int], bool] = gone_here,
    ) -> None:
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self._opener = opener
        self._ttl_ms = ttl_ms
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._gone = gone
        self._leading = False
        self._valid_until_ms = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-elector", daemon=True)

    @property
    def leading(self) -> bool:
        return self._leading

    def start(self) -> Elector:
        self._thread.start()
        return self

    def _try(self, db: Database) -> bool:
        now = _now_ms()
        held = lease.take(db, LEASE, owner=self.owner, host=self.host, pid=self.pid, now_ms=now,
                          ttl_ms=self._ttl_ms, gone=self._gone)
        if held:
            self._valid_until_ms = now + self._ttl_ms
        return held

    def _run(self) -> None:
        db: Database | None = None
        interval = self._ttl_ms / 3000
        while True:
            try:
                db = db or self._opener()
                held = self._try(db)
            except Exception as exc:  # noqa: BLE001 - the store is away: judged by the lease's own time
                logger.warning("the lease %s could not be renewed (%s)", LEASE, type(exc).__name__)
                held = self._leading and _now_ms() < self._valid_until_ms - interval * 1000
            if held != self._leading:
                self._change(held)
            if self._stop.wait(interval):
                break
        if self._leading:
            self._change(False)
            try:
                db = db or self._opener()
                lease.release(db, LEASE, self.owner)
            except Exception:  # noqa: BLE001 - it expires on its own
                logger.warning("the lease %s was not given up: it lapses after api.lease_ttl_ms", LEASE)
        if db is not None:
            db.close()

    def _change(self, leading: bool) -> None:
        self._leading = leading
        logger.info("this API process %s the campaigns, the verdicts' reader and pruning",
                    "now runs" if leading else "no longer runs")
        try:
            (self._on_elected if leading else self._on_deposed)()
        except Exception:  # noqa: BLE001 - keep electing; the part retries on its own
            logger.exception("starting or stopping what runs once failed")

    def stop(self, timeout_s: float) -> None:
        """Stop what this process runs once (if it does), give the lease up, and stop trying."""
        self._stop.set()
        self._thread.join(timeout_s)
