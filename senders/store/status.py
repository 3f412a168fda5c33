"""The status store: one row per message key, changed only through ``senders.policy.transitions``.

SQLite by default (WAL, one connection per worker, ``BEGIN IMMEDIATE`` for the conditional
transitions); PostgreSQL when ``senders.status_store`` is a ``postgresql://`` DSN (``SELECT ...
FOR UPDATE``; needs psycopg), the store to share between processes and hosts. Addresses are
stored only as hashes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from operators.records import Channel
from senders.policy.transitions import (
    ClaimDecision,
    OutcomePlan,
    StoredState,
    check_transition,
    decide_claim,
)
from senders.statuses import ClaimAction, DeadLetterReason, DeliveryStatus, Lane
from senders.store.db import Database, open_database

logger = logging.getLogger(__name__)

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


#: a dead letter's place: (topic, partition, offset)
LetterPosition = tuple[str, int, int]


class RedriveStep(StrEnum):
    PRODUCE = "produce"  # produce the payload back to its channel topic
    ALREADY = "already"  # this dead letter was redriven before
    NOT_FAILED = "not_failed"  # its message is no longer failed (sent, or redriven by another letter)


class StatusStore:
    """One connection; a worker opens its own. Every method is one database transaction."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @property
    def db(self) -> Database:
        return self._db

    @property
    def dialect(self) -> str:
        return self._db.dialect

    def close(self) -> None:
        self._db.close()

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
        with self._db.tx() as cur:
            self._db.exec(
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
            found = self._db.exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key = ?{self._db.for_update}",
                (message_key,),
            ).fetchone()
            row = StatusRow.from_db(found)
            decision = decide_claim(row.state(), attempt, now_ms)
            if decision.action is ClaimAction.CLAIM:
                check_transition(row.status, DeliveryStatus.SENDING)
                self._db.exec(
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
        with self._db.tx() as cur:
            done = (
                self._db.exec(
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
                self._db.exec(
                    cur,
                    "INSERT INTO inactive_address (channel, address_hash, reason, since_ms)"
                    " VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (channel, address_hash) DO NOTHING",
                    (channel.value, address_hash(channel, address), (error or "")[:200], now_ms),
                )
            return done

    def mark_published(self, published: Iterable[tuple[str, int]]) -> None:
        """The records of these (message key, attempt) outcomes are committed in Kafka."""
        items = [(key, attempt) for key, attempt in published]
        if not items:
            return
        with self._db.tx() as cur:
            cur.executemany(
                self._db.sql(
                    "UPDATE delivery_status SET unpublished = 0 WHERE message_key = ? AND attempts = ?"
                ),
                items,
            )

    def mark_delivered(self, message_key: str, now_ms: int) -> bool:
        """sent -> delivered, from a provider's delivery receipt."""
        with self._db.tx() as cur:
            return bool(
                self._db.exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, updated_ms = ?"
                    " WHERE message_key = ? AND status = ?",
                    (DeliveryStatus.DELIVERED.value, now_ms, message_key, DeliveryStatus.SENT.value),
                ).rowcount
                == 1
            )

    def inactive_since(self, channel: Channel, address: str) -> int | None:
        """When the address was deactivated (ms), or None while it is active."""
        with self._db.tx(write=False) as cur:
            found = self._db.exec(
                cur,
                "SELECT since_ms FROM inactive_address WHERE channel = ? AND address_hash = ?",
                (channel.value, address_hash(channel, address)),
            ).fetchone()
        return int(found[0]) if found else None

    def is_inactive(self, channel: Channel, address: str) -> bool:
        return self.inactive_since(channel, address) is not None

    def reactivate(self, channel: Channel, address: str) -> bool:
        """Make a deactivated address usable again; False when it was not inactive."""
        with self._db.tx() as cur:
            return bool(
                self._db.exec(
                    cur,
                    "DELETE FROM inactive_address WHERE channel = ? AND address_hash = ?",
                    (channel.value, address_hash(channel, address)),
                ).rowcount
            )

    # -- redrive ----------------------------------------------------------------------------------

    def begin_redrive(
        self, letter: LetterPosition, message_key: str, now_ms: int, *, apply: bool = True
    ) -> RedriveStep:
        """Whether this dead letter is to be produced back to its channel topic now.

        The first time, a ``failed`` row goes back to ``queued`` with no attempt made, so that the
        record produced next is claimed as a first attempt; the letter is remembered, so a second
        redrive of it does nothing. A letter remembered but not yet produced (the redrive stopped
        in between) is produced again. ``apply=False`` only tells (a dry run)."""
        with self._db.tx(write=apply) as cur:
            done = self._db.exec(
                cur,
                "SELECT produced FROM redriven_letter WHERE dlq_topic = ? AND dlq_partition = ?"
                f" AND dlq_offset = ?{self._db.for_update}",
                letter,
            ).fetchone()
            if done is not None:
                return RedriveStep.ALREADY if done[0] else RedriveStep.PRODUCE
            found = self._db.exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key = ?{self._db.for_update}",
                (message_key,),
            ).fetchone()
            if found is None or StatusRow.from_db(found).status is not DeliveryStatus.FAILED:
                return RedriveStep.NOT_FAILED
            if not apply:
                return RedriveStep.PRODUCE
            check_transition(DeliveryStatus.FAILED, DeliveryStatus.QUEUED)
            self._db.exec(
                cur,
                "UPDATE delivery_status SET status = ?, attempts = 0, dead_letter = NULL, retry_at_ms = NULL,"
                " lease_until_ms = 0, owner = NULL, unpublished = 0, updated_ms = ? WHERE message_key = ?",
                (DeliveryStatus.QUEUED.value, now_ms, message_key),
            )
            self._db.exec(
                cur,
                "INSERT INTO redriven_letter (dlq_topic, dlq_partition, dlq_offset, message_key, produced, at_ms)"
                " VALUES (?, ?, ?, ?, 0, ?)",
                (*letter, message_key, now_ms),
            )
            return RedriveStep.PRODUCE

    def finish_redrive(self, letter: LetterPosition) -> None:
        """The redriven record is committed in Kafka."""
        with self._db.tx() as cur:
            self._db.exec(
                cur,
                "UPDATE redriven_letter SET produced = 1 WHERE dlq_topic = ? AND dlq_partition = ?"
                " AND dlq_offset = ?",
                letter,
            )

    # -- reads ------------------------------------------------------------------------------------

    def get(self, message_key: str) -> StatusRow | None:
        with self._db.tx(write=False) as cur:
            found = self._db.exec(
                cur, f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key = ?", (message_key,)
            ).fetchone()
        return StatusRow.from_db(found) if found else None

    def rows(self) -> list[StatusRow]:
        with self._db.tx(write=False) as cur:
            found = self._db.exec(
                cur, f"SELECT {_COLUMNS} FROM delivery_status ORDER BY created_ms, message_key"
            )
            return [StatusRow.from_db(r) for r in found.fetchall()]


def open_store(
    location: str,
    *,
    synchronous: str = "FULL",
    password: str | None = None,
    busy_timeout_ms: int = 30_000,
) -> StatusStore:
    """A store at ``location``: a ``postgresql://`` DSN, ``sqlite:///path``, or a file path."""
    return StatusStore(
        open_database(location, synchronous=synchronous, password=password, busy_timeout_ms=busy_timeout_ms)
    )
