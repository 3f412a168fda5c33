"""The status store: one row per message key, changed only through ``senders.policy.transitions``.

SQLite by default (WAL, one connection per worker, ``BEGIN IMMEDIATE`` for the conditional
transitions); PostgreSQL when ``senders.status_store`` is a ``postgresql://`` DSN (``SELECT ...
FOR UPDATE``; needs psycopg). Addresses are stored only as hashes.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from operators.records import Channel
from senders.errors import StatusStoreError
from senders.policy.transitions import (
    ClaimDecision,
    OutcomePlan,
    StoredState,
    check_transition,
    decide_claim,
)
from senders.statuses import ClaimAction, DeadLetterReason, DeliveryStatus, Lane

logger = logging.getLogger(__name__)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS delivery_status (
        message_key TEXT PRIMARY KEY,
        notification_id TEXT NOT NULL,
        channel TEXT NOT NULL,
        lane TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        provider TEXT,
        last_error TEXT,
        dead_letter TEXT,
        retry_at_ms BIGINT,
        lease_until_ms BIGINT NOT NULL DEFAULT 0,
        owner TEXT,
        unpublished INTEGER NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS inactive_address (
        channel TEXT NOT NULL,
        address_hash TEXT NOT NULL,
        reason TEXT NOT NULL,
        since_ms BIGINT NOT NULL,
        PRIMARY KEY (channel, address_hash)
    )""",
)

_COLUMNS = (
    "message_key, notification_id, channel, lane, status, attempts, provider, last_error, dead_letter,"
    " retry_at_ms, lease_until_ms, owner, unpublished, updated_ms"
)


def address_hash(channel: Channel, address: str) -> str:
    return hashlib.sha256(f"{channel.value}:{address}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class StatusRow:
    message_key: str
    notification_id: str
    channel: Channel
    lane: Lane
    status: DeliveryStatus
    attempts: int
    provider: str | None
    last_error: str | None
    dead_letter: DeadLetterReason | None
    retry_at_ms: int | None
    lease_until_ms: int
    owner: str | None
    unpublished: bool
    updated_ms: int

    @classmethod
    def from_db(cls, row: tuple[Any, ...]) -> StatusRow:
        (
            key,
            nid,
            channel,
            lane,
            status,
            attempts,
            provider,
            error,
            dead,
            retry_at,
            lease,
            owner,
            unpub,
            updated,
        ) = row
        return cls(
            key,
            nid,
            Channel(channel),
            Lane(lane),
            DeliveryStatus(status),
            int(attempts),
            provider,
            error,
            DeadLetterReason(dead) if dead else None,
            retry_at,
            int(lease),
            owner,
            bool(unpub),
            int(updated),
        )

    def state(self) -> StoredState:
        return StoredState(self.status, self.attempts, self.lease_until_ms, self.unpublished)


class StatusStore:
    """One connection; a worker opens its own. Every method is one database transaction."""

    def __init__(self, conn: Any, *, dialect: str) -> None:
        self._conn = conn
        self._dialect = dialect
        self._lock_suffix = " FOR UPDATE" if dialect == "postgresql" else ""
        with self._tx() as cur:
            for ddl in _SCHEMA:
                cur.execute(ddl)

    # -- plumbing ---------------------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self._dialect == "postgresql" else text

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Any]:
        cur = self._conn.cursor()
        try:
            if self._dialect == "sqlite":
                # a writer takes the write lock first, so what it reads cannot change under it
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            yield cur
            self._conn.commit() if self._dialect == "postgresql" else cur.execute("COMMIT")
        except BaseException:
            self._conn.rollback()
            raise
        finally:
            cur.close()

    def _exec(self, cur: Any, text: str, params: Iterable[Any] = ()) -> Any:
        cur.execute(self._sql(text), tuple(params))
        return cur

    def close(self) -> None:
        self._conn.close()

    # -- transitions ------------------------------------------------------------------------------

    def claim(
        self,
        *,
        message_key: str,
        notification_id: str,
        channel: Channel,
        lane: Lane,
        attempt: int,
        now_ms: int,
        lease_ms: int,
        owner: str,
    ) -> tuple[ClaimDecision, StatusRow | None]:
        """queued -> sending for ``attempt``, if ``decide_claim`` allows it; else why not."""
        with self._tx() as cur:
            self._exec(
                cur,
                "INSERT INTO delivery_status (message_key, notification_id, channel, lane, status, attempts,"
                " created_ms, updated_ms) VALUES (?, ?, ?, ?, ?, 0, ?, ?)"
                " ON CONFLICT (message_key) DO NOTHING",
                (
                    message_key,
                    notification_id,
                    channel.value,
                    lane.value,
                    DeliveryStatus.QUEUED.value,
                    now_ms,
                    now_ms,
                ),
            )
            found = self._exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key = ?{self._lock_suffix}",
                (message_key,),
            ).fetchone()
            row = StatusRow.from_db(found)
            decision = decide_claim(row.state(), attempt, now_ms)
            if decision.action is ClaimAction.CLAIM:
                check_transition(row.status, DeliveryStatus.SENDING)
                self._exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, attempts = ?, lease_until_ms = ?, owner = ?,"
                    " unpublished = 0, updated_ms = ? WHERE message_key = ?",
                    (DeliveryStatus.SENDING.value, attempt, now_ms + lease_ms, owner, now_ms, message_key),
                )
            return decision, row

    def finish(
        self,
        *,
        message_key: str,
        attempt: int,
        owner: str,
        plan: OutcomePlan,
        provider: str | None,
        error: str | None,
        now_ms: int,
        deactivate: tuple[Channel, str] | None = None,
    ) -> bool:
        """sending -> the plan's status, if this worker still holds the claim. ``deactivate``
        (channel, address) is marked inactive in the same transaction."""
        check_transition(DeliveryStatus.SENDING, plan.status)
        with self._tx() as cur:
            done = (
                self._exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, provider = ?, last_error = ?, dead_letter = ?,"
                    " retry_at_ms = ?, lease_until_ms = 0, unpublished = 1, updated_ms = ?"
                    " WHERE message_key = ? AND status = ? AND attempts = ? AND owner = ?",
                    (
                        plan.status.value,
                        provider,
                        error,
                        plan.dead_letter.value if plan.dead_letter else None,
                        plan.retry_at_ms,
                        now_ms,
                        message_key,
                        DeliveryStatus.SENDING.value,
                        attempt,
                        owner,
                    ),
                ).rowcount
                == 1
            )
            if done and deactivate is not None:
                channel, address = deactivate
                self._exec(
                    cur,
                    "INSERT INTO inactive_address (channel, address_hash, reason, since_ms)"
                    " VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (channel, address_hash) DO NOTHING",
                    (channel.value, address_hash(channel, address), error or "", now_ms),
                )
            return done

    def mark_published(self, published: Iterable[tuple[str, int]]) -> None:
        """The records of these (message key, attempt) outcomes are committed in Kafka."""
        items = [(key, attempt) for key, attempt in published]
        if not items:
            return
        with self._tx() as cur:
            cur.executemany(
                self._sql(
                    "UPDATE delivery_status SET unpublished = 0 WHERE message_key = ? AND attempts = ?"
                ),
                items,
            )

    def mark_delivered(self, message_key: str, now_ms: int) -> bool:
        """sent -> delivered, from a provider's delivery receipt."""
        with self._tx() as cur:
            return bool(
                self._exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, updated_ms = ?"
                    " WHERE message_key = ? AND status = ?",
                    (DeliveryStatus.DELIVERED.value, now_ms, message_key, DeliveryStatus.SENT.value),
                ).rowcount
                == 1
            )

    # -- addresses and reads ----------------------------------------------------------------------

    def is_inactive(self, channel: Channel, address: str) -> bool:
        with self._tx(write=False) as cur:
            return (
                self._exec(
                    cur,
                    "SELECT 1 FROM inactive_address WHERE channel = ? AND address_hash = ?",
                    (channel.value, address_hash(channel, address)),
                ).fetchone()
                is not None
            )

    def get(self, message_key: str) -> StatusRow | None:
        with self._tx(write=False) as cur:
            found = self._exec(
                cur, f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key = ?", (message_key,)
            ).fetchone()
        return StatusRow.from_db(found) if found else None

    def rows(self) -> list[StatusRow]:
        with self._tx(write=False) as cur:
            found = self._exec(
                cur, f"SELECT {_COLUMNS} FROM delivery_status ORDER BY created_ms, message_key"
            )
            return [StatusRow.from_db(r) for r in found.fetchall()]


def open_store(location: str, *, synchronous: str = "FULL", password: str | None = None) -> StatusStore:
    """A store at ``location``: a ``postgresql://`` DSN, ``sqlite:///path``, or a file path."""
    if location.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg
        except ImportError:
            raise StatusStoreError(
                "a postgresql:// status store needs psycopg (pip install psycopg)"
            ) from None
        try:
            conn = psycopg.connect(location, password=password) if password else psycopg.connect(location)
        except psycopg.Error as exc:
            raise StatusStoreError(f"cannot connect to the status store: {exc}") from None
        return StatusStore(conn, dialect="postgresql")
    # sqlite:///relative.db or sqlite:////absolute/path.db, as SQLAlchemy spells them
    path = Path(location[len("sqlite:///") :] if location.startswith("sqlite:///") else location)
    if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise StatusStoreError(f"unknown sqlite synchronous mode {synchronous!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    except sqlite3.Error as exc:
        raise StatusStoreError(f"cannot open the status store {path}: {exc}") from None
    return StatusStore(conn, dialect="sqlite")
