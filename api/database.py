"""The API's connections to the store.

On PostgreSQL they are the store's own. On SQLite, the tables the API writes for every request
(``api.tables.REQUEST_TABLES``: its Idempotency-Key and its record, and its caller's rate budget)
are in a file of their own beside the store's (``requests_file``). Their writers (the store writer,
``api.writer``, and the rate budgets' leases, ``api.ratelimit``) take that file's lock alone, and
so never wait for the write lock of the store's file, which the senders take for their claims and
statuses: SQLite's busy handler sleeps 1, 2, 5 ... 100 ms between tries, and a sender holds the
lock while its own threads share one interpreter. The API's other connections attach the file as
``requests`` (``api.tables.REQUESTS``), so its SQL names the tables as before; a transaction of
theirs takes the write locks of both files.

Measured beside the whole pipeline (``python -m bench.slo --quick --accept-rates 1000``; see
bench/results/slo-2026-12-06-s36-summary.md): the API's reservations p99 90 -> 15-40 ms.

A transaction over both files (an erasure, the callers' migration) is atomic in each file: if the
process or the machine stops during its commit, one file may have the change and not the other;
an erasure run again finishes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from api.tables import REQUESTS
from senders.store.db import Database, is_postgres, open_database, sqlite_path
from settings import Settings


def requests_file(store: Path) -> Path:
    """The file of the request tables beside a SQLite store's (``status.db`` -> ``status-requests.db``)."""
    return store.with_name(f"{store.stem}-requests{store.suffix}")


@dataclass(frozen=True, slots=True)
class StoreAccess:
    """How the API opens the store: where, and its SQLite and PostgreSQL options."""

    location: str
    synchronous: str = "NORMAL"
    password: str | None = None
    busy_timeout_ms: int = 30_000

    @classmethod
    def of(cls, cfg: Settings) -> StoreAccess:
        from senders.runtime.pool import store_location

        secret = cfg.senders.status_store_password
        return cls(store_location(cfg), cfg.api.sqlite_synchronous, secret.get_secret_value() if secret else None,
                   cfg.senders.sqlite_busy_timeout_ms)

    def _open(self, location: str, attach: dict[str, Path] | None = None, store_tables: bool = True) -> Database:
        return open_database(location, synchronous=self.synchronous, password=self.password,
                             busy_timeout_ms=self.busy_timeout_ms, attach=attach, store_tables=store_tables)

    def open(self) -> Database:
        """The store as the API's routes, pool and elector use it (on SQLite, the requests file
        attached)."""
        if is_postgres(self.location):
            return self._open(self.location)
        return self._open(self.location, attach={REQUESTS: requests_file(sqlite_path(self.location))})

    def open_requests(self) -> Database:
        """The store writer's and the rate budgets' connections: on SQLite the requests file alone
        (its tables are made by ``api.tables.prepare`` on an ``open`` connection first)."""
        if is_postgres(self.location):
            return self._open(self.location)
        return self._open(str(requests_file(sqlite_path(self.location))), store_tables=False)

    def open_store(self) -> Database:
        """The store's own file alone (the writer's profile reads)."""
        return self._open(self.location)


def open_api_store(cfg: Settings) -> Database:
    """A connection as the API opens one, with the API's tables ready (``api.tables.prepare``):
    for the commands and tools that use them."""
    from api.tables import prepare

    db = StoreAccess.of(cfg).open()
    try:
        prepare(db)
    except BaseException:
        db.close()
        raise
    return db
