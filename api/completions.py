"""The records of written requests (their idempotency answer and their request record), stored
in batches by one thread: one transaction for many requests, off the request's path.

Until its batch is stored, a request's answer is held here, so the same key again in this
process still gets it (``answer_of``). A process that dies before a batch is stored leaves those
keys pending: after the stale time a retry writes the request again, and the dedup job
suppresses the repeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from api.store import RequestRecord, complete_keys
from senders.errors import StatusStoreError
from senders.store.db import Database

logger = logging.getLogger(__name__)

Completion = tuple[str, dict[str, Any], RequestRecord]


class CompletionWriter:
    def __init__(self, opener: Callable[[], Database], max_batch: int = 500) -> None:
        self._opener = opener
        self._max_batch = max_batch
        self._pending: dict[str, Completion] = {}
        self._order: list[str] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="api-completions", daemon=True)
        self._thread.start()

    def put(self, key: str, answer: dict[str, Any], record: RequestRecord) -> None:
        with self._cond:
            self._pending[key] = (key, answer, record)
            self._order.append(key)
            self._cond.notify()

    def answer_of(self, key: str, notification_id: str | None = None) -> dict[str, Any] | None:
        with self._cond:
            found = self._pending.get(key)
        if found is None or (notification_id is not None and found[2].notification_id != notification_id):
            return None
        return found[1]

    def _take(self) -> list[Completion]:
        with self._cond:
            while not self._order and not self._stopping:
                self._cond.wait(0.5)
            keys = self._order[: self._max_batch]
            return [self._pending[k] for k in dict.fromkeys(keys) if k in self._pending]

    def _done(self, batch: list[Completion]) -> None:
        with self._cond:
            for key, _, record in batch:
                held = self._pending.get(key)
                if held is not None and held[2].notification_id == record.notification_id:
                    del self._pending[key]
            taken = {k for k, _, _ in batch}
            self._order = [k for k in self._order if k not in taken or k in self._pending]

    def _run(self) -> None:
        db: Database | None = None
        pause = 0.05
        while True:
            batch = self._take()
            if not batch:
                if self._stopping:
                    break
                continue
            try:
                db = db or self._opener()
                complete_keys(db, batch)
                self._done(batch)
                pause = 0.05
            except StatusStoreError as exc:
                logger.warning("storing %d written requests failed (%s): again in %.2f s", len(batch),
                               type(exc).__name__, pause)
                if self._stopping and pause > 1.0:
                    logger.error("%d written requests were not recorded before the shutdown", len(batch))
                    break
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
        if db is not None:
            db.close()

    def stop(self, timeout_s: float) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)
