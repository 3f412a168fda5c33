"""The store from async code: a few threads, each with its own connection to the status store's
database (SQLite allows one transaction per connection at a time; PostgreSQL serves several).
A call runs ``fn(db)`` on one of them; a store that does not answer raises
``StoreUnavailableError`` (the API answers 503)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from api.tables import prepare
from senders.store.db import Database, open_database

T = TypeVar("T")


class StorePool:
    def __init__(
        self,
        opener: Callable[[], Database],
        threads: int,
        observe: Callable[[float, float], None] | None = None,
        prepare_tables: bool = True,
    ) -> None:
        """``observe(queued_s, call_s)``: each call's wait for a thread and its own time;
        ``prepare_tables``: make and migrate the API's tables on the first connection (``False``
        for a pool on the requests file alone, ``api.database``, opened after one that did)."""
        self._opener = opener
        self._observe = observe
        self._local = threading.local()
        self._all: list[Database] = []
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="api-store")
        first = self.db()  # connects now: a wrong location is reported at start
        if prepare_tables:
            prepare(first)  # the API's tables, migrated from an earlier layout where needed

    @classmethod
    def open(
        cls, location: str, *, synchronous: str, password: str | None, busy_timeout_ms: int, threads: int
    ) -> StorePool:
        return cls(
            lambda: open_database(
                location, synchronous=synchronous, password=password, busy_timeout_ms=busy_timeout_ms
            ),
            threads,
        )

    def opener(self) -> Database:
        """A new connection of its own (for a thread outside the pool)."""
        return self._opener()

    def db(self) -> Database:
        """This thread's connection."""
        db: Database | None = getattr(self._local, "db", None)
        if db is None:
            db = self._opener()
            self._local.db = db
            with self._lock:
                self._all.append(db)
        return db

    async def run(self, fn: Callable[[Database], T]) -> T:
        loop = asyncio.get_running_loop()
        if self._observe is None:
            return await loop.run_in_executor(self._executor, lambda: fn(self.db()))
        observe = self._observe
        queued = time.perf_counter()

        def call() -> T:
            started = time.perf_counter()
            try:
                return fn(self.db())
            finally:
                observe(started - queued, time.perf_counter() - started)

        return await loop.run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        with self._lock:
            for db in self._all:
                db.close()
            self._all.clear()
