"""The status store: one row per message key, changed only through ``senders.policy.transitions``.

SQLite by default (WAL, one connection per worker, ``BEGIN IMMEDIATE`` for the conditional
transitions); PostgreSQL when ``senders.status_store`` is a ``postgresql://`` DSN (``SELECT ...
FOR UPDATE``; needs psycopg), the store to share between processes and hosts. Addresses are
stored only as hashes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
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
from senders.policy.verdict import RuleVerdict
from senders.records import TemplateRef
from senders.rules.limits import CounterState, LimitClaim
from senders.statuses import FINAL_STATUSES, ClaimAction, DeadLetterReason, DeliveryStatus, Lane
from senders.store.db import Database, open_database

#: the rules' verdict given the state of the counters they consult, and whether the key is new
#: to the store (never seen, or pruned)
Rules = Callable[[Mapping[str, CounterState], bool], RuleVerdict]

logger = logging.getLogger(__name__)

_COLUMNS = (
    "message_key, notification_id, channel, lane, status, attempts, provider, last_error, dead_letter,"
    " retry_at_ms, lease_until_ms, owner, unpublished, updated_ms, user_id, reason, not_before_ms,"
    " template, template_version, locale, provider_ref"
)

#: the published outcomes marked in one statement (``with_values``), (message key, attempt) each
_PUBLISHED = (("k", "TEXT"), ("attempts", "INTEGER"))
_PUBLISHED_CHUNK = 1_024


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
    user_id: str | None = None
    reason: str | None = None
    not_before_ms: int | None = None
    template: TemplateRef | None = None
    provider_ref: str | None = None

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
            user_id,
            reason,
            not_before,
            template,
            version,
            locale,
            provider_ref,
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
            user_id,
            reason,
            None if not_before is None else int(not_before),
            TemplateRef(template, None if version is None else int(version), locale) if template else None,
            provider_ref,
        )

    def state(self) -> StoredState:
        return StoredState(self.status, self.attempts, self.lease_until_ms, self.unpublished, self.not_before_ms or 0)


#: a dead letter's place: (topic, partition, offset)
LetterPosition = tuple[str, int, int]


class RedriveStep(StrEnum):
    PRODUCE = "produce"  # produce the payload back to its channel topic
    ALREADY = "already"  # this dead letter was redriven before
    NOT_FAILED = "not_failed"  # its message is no longer failed (sent, or redriven by another letter)


def erase_user_rows(
    db: Database, cur: Any, user_id: str, counter_prefixes: Iterable[str], owns: Callable[[str], bool]
) -> tuple[int, int]:
    """Inside a transaction: remove a user's status history, and the limit counters (and their
    units) that are the user's: of the keys under ``counter_prefixes``, exactly those ``owns``
    says are (``senders.rules.limits.is_users_counter`` and ``is_recipients_counter``: a prefix
    alone would take user ``a:b``'s counters with user ``a``'s). Returns (status rows, counters)
    removed."""
    n = db.exec(cur, "DELETE FROM delivery_status WHERE user_id = ?", (user_id,)).rowcount
    keys: set[str] = set()
    for prefix in dict.fromkeys(counter_prefixes):
        for table in ("limit_counter", "limit_unit"):
            found = db.exec(
                cur, f"SELECT DISTINCT counter_key FROM {table} WHERE substr(counter_key, 1, ?) = ?",
                (len(prefix), prefix),
            ).fetchall()
            keys.update(k for (k,) in found if owns(k))
    for table in ("limit_unit", "limit_counter"):
        cur.executemany(db.sql(f"DELETE FROM {table} WHERE counter_key = ?"), [(k,) for k in sorted(keys)])
    return int(n), len(keys)


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
        user_id: str | None = None,
        rules: Rules | None = None,
        limits: Sequence[LimitClaim] = (),
    ) -> tuple[ClaimDecision, StatusRow | None, RuleVerdict | None]:
        """queued -> sending for ``attempt``, if ``decide_claim`` allows it; else why not.

        When it does and ``rules`` are given, they decide in the same transaction, with the
        counters of ``limits`` locked and counted: a message to send records the units it
        consumes, and a skipped, deferred or rejected one takes that status at once (to publish).
        A limit is so counted exactly once per message, whatever is retried, replayed or crashes.
        """
        with self._db.tx() as cur:
            inserted = self._db.exec(
                cur,
                "INSERT INTO delivery_status (message_key, notification_id, channel, lane, status, attempts,"
                " created_ms, updated_ms, user_id) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?)"
                " ON CONFLICT (message_key) DO NOTHING",
                (
                    message_key,
                    notification_id,
                    channel.value,
                    lane.value,
                    DeliveryStatus.QUEUED.value,
                    now_ms,
                    now_ms,
                    user_id,
                ),
            ).rowcount
            found = self._db.exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key = ?{self._db.for_update}",
                (message_key,),
            ).fetchone()
            row = StatusRow.from_db(found)
            decision = decide_claim(row.state(), attempt, now_ms)
            if decision.action is not ClaimAction.CLAIM:
                return decision, row, None
            verdict = RuleVerdict() if rules is None else rules(self._counts(cur, limits, now_ms), inserted == 1)
            ref = verdict.template
            template = (ref.name, ref.version, ref.locale) if ref else (None, None, None)
            if verdict.send:
                check_transition(row.status, DeliveryStatus.SENDING)
                self._consume(cur, verdict.consume)
                self._db.exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, attempts = ?, lease_until_ms = ?, owner = ?,"
                    " unpublished = 0, updated_ms = ?, reason = NULL, not_before_ms = NULL,"
                    " template = ?, template_version = ?, locale = ? WHERE message_key = ?",
                    (DeliveryStatus.SENDING.value, attempt, now_ms + lease_ms, owner, now_ms, *template, message_key),
                )
            else:
                assert verdict.status is not None
                check_transition(row.status, verdict.status)
                self._db.exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, attempts = ?, lease_until_ms = 0, owner = ?,"
                    " unpublished = 1, updated_ms = ?, reason = ?, not_before_ms = ?, retry_at_ms = NULL,"
                    " template = ?, template_version = ?, locale = ? WHERE message_key = ?",
                    (
                        verdict.status.value,
                        attempt,
                        owner,
                        now_ms,
                        verdict.reason,
                        verdict.not_before_ms,
                        *template,
                        message_key,
                    ),
                )
            return decision, row, verdict

    def _counts(self, cur: Any, limits: Sequence[LimitClaim], now_ms: int) -> dict[str, CounterState]:
        """Each counter locked (its row, made if missing: two workers never count one at once)
        and its units counted."""
        counts: dict[str, CounterState] = {}
        for claim in sorted(limits, key=lambda c: c.key):  # one lock order: no deadlock
            self._db.exec(
                cur,
                "INSERT INTO limit_counter (counter_key, expires_ms) VALUES (?, ?)"
                " ON CONFLICT (counter_key) DO NOTHING",
                (claim.key, claim.expires_at_ms),
            )
            self._db.exec(
                cur, f"SELECT counter_key FROM limit_counter WHERE counter_key = ?{self._db.for_update}", (claim.key,)
            ).fetchone()
            used, mine = self._db.exec(
                cur,
                "SELECT COUNT(*), COALESCE(SUM(CASE WHEN unit = ? THEN 1 ELSE 0 END), 0) FROM limit_unit"
                " WHERE counter_key = ? AND expires_ms > ?",
                (claim.unit, claim.key, now_ms),
            ).fetchone()
            counts[claim.key] = CounterState(used=int(used), has_unit=bool(mine))
        return counts

    def _consume(self, cur: Any, claims: Sequence[LimitClaim]) -> None:
        for claim in claims:
            self._db.exec(
                cur,
                "INSERT INTO limit_unit (counter_key, unit, expires_ms) VALUES (?, ?, ?)"
                " ON CONFLICT (counter_key, unit) DO NOTHING",
                (claim.key, claim.unit, claim.expires_at_ms),
            )

    def limit_units(self, counter_key: str) -> list[str]:
        """The units recorded under a counter (tests, operators)."""
        with self._db.tx(write=False) as cur:
            rows = self._db.exec(
                cur, "SELECT unit FROM limit_unit WHERE counter_key = ? ORDER BY unit", (counter_key,)
            ).fetchall()
        return [r[0] for r in rows]

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
        provider_ref: str | None = None,
    ) -> bool:
        """sending -> the plan's status, if this worker still holds the claim. ``deactivate``
        (channel, address) is marked inactive in the same transaction; ``provider_ref`` is the
        provider's id of a sent message (its delivery receipts name it)."""
        check_transition(DeliveryStatus.SENDING, plan.status)
        with self._db.tx() as cur:
            done = (
                self._db.exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, provider = ?, last_error = ?, dead_letter = ?,"
                    " retry_at_ms = ?, lease_until_ms = 0, unpublished = 1, updated_ms = ?, provider_ref = ?"
                    " WHERE message_key = ? AND status = ? AND attempts = ? AND owner = ?",
                    (
                        plan.status.value,
                        provider,
                        error,
                        plan.dead_letter.value if plan.dead_letter else None,
                        plan.retry_at_ms,
                        now_ms,
                        provider_ref,
                        message_key,
                        DeliveryStatus.SENDING.value,
                        attempt,
                        owner,
                    ),
                ).rowcount
                == 1
            )
            if done and deactivate is not None:
                self._deactivate(cur, *deactivate, error, now_ms)
            return done

    def _deactivate(self, cur: Any, channel: Channel, address: str, reason: str | None, now_ms: int) -> bool:
        return bool(
            self._db.exec(
                cur,
                "INSERT INTO inactive_address (channel, address_hash, reason, since_ms)"
                " VALUES (?, ?, ?, ?)"
                " ON CONFLICT (channel, address_hash) DO NOTHING",
                (channel.value, address_hash(channel, address), (reason or "")[:200], now_ms),
            ).rowcount
        )

    def deactivate(self, channel: Channel, address: str, reason: str | None, now_ms: int) -> bool:
        """Mark an address inactive, as a provider's answer does (``finish``), for a provider's
        receipt that says it cannot take messages (a hard bounce, a complaint); False when it was
        inactive already."""
        with self._db.tx() as cur:
            return self._deactivate(cur, channel, address, reason, now_ms)

    def mark_published(self, published: Iterable[tuple[str, int]]) -> None:
        """The records of these (message key, attempt) outcomes are committed in Kafka."""
        items = sorted({(key, attempt) for key, attempt in published})
        if not items:
            return
        with self._db.tx() as cur:
            for i in range(0, len(items), _PUBLISHED_CHUNK):
                values, params = self._db.with_values(_PUBLISHED, items[i : i + _PUBLISHED_CHUNK])
                self._db.exec(
                    cur,
                    values + "UPDATE delivery_status SET unpublished = 0 FROM v WHERE delivery_status.message_key = v.k"
                    " AND delivery_status.attempts = v.attempts AND delivery_status.unpublished <> 0",
                    params,
                )

    def mark_delivered(self, message_key: str, now_ms: int) -> bool:
        """sent -> delivered, from a provider's delivery receipt."""
        with self._db.tx() as cur:
            return bool(
                self._db.exec(
                    cur,
                    "UPDATE delivery_status SET status = ?, updated_ms = ? WHERE message_key = ? AND status = ?",
                    (DeliveryStatus.DELIVERED.value, now_ms, message_key, DeliveryStatus.SENT.value),
                ).rowcount
                == 1
            )

    def apply_receipt(
        self, provider: str, reference: str, status: DeliveryStatus, reason: str | None, now_ms: int
    ) -> tuple[StatusRow | None, bool]:
        """A provider's delivery receipt: the message it sent as ``reference`` goes from sent to
        ``status`` (delivered, or failed for a bounce), once. Returns the row as it is now (None:
        no message of that provider has that id) and whether this receipt changed it; the same
        receipt again, or one for a message already delivered or failed, changes nothing."""
        if status not in (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED):
            raise ValueError(f"a receipt says delivered or failed, not {status}")
        with self._db.tx() as cur:
            found = self._db.exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE provider = ? AND provider_ref = ?{self._db.for_update}",
                (provider, reference),
            ).fetchone()
            if found is None:
                return None, False
            row = StatusRow.from_db(found)
            if row.status is not DeliveryStatus.SENT:
                return row, False
            check_transition(row.status, status)
            self._db.exec(
                cur,
                "UPDATE delivery_status SET status = ?, reason = ?, updated_ms = ?"
                " WHERE message_key = ? AND status = ?",
                (status.value, reason, now_ms, row.message_key, DeliveryStatus.SENT.value),
            )
        return replace(row, status=status, reason=reason, updated_ms=now_ms), True

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
                " lease_until_ms = 0, owner = NULL, unpublished = 0, updated_ms = ?, reason = NULL,"
                " not_before_ms = NULL WHERE message_key = ?",
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
                "UPDATE redriven_letter SET produced = 1 WHERE dlq_topic = ? AND dlq_partition = ? AND dlq_offset = ?",
                letter,
            )

    # -- retention --------------------------------------------------------------------

    def prune(self, now_ms: int, retention_ms: int, batch: int = 1000) -> int:
        """Drop what is older than the retention: finished rows (published) whose last change is,
        redrive bookkeeping of letters produced then, and expired limit units. Rows still in
        progress stay (queued, sending, deferred: their records are on their way). Batches of
        ``batch`` rows, each its own transaction, so no writer waits long. Returns the rows dropped."""
        cutoff = now_ms - retention_ms
        final = tuple(s.value for s in FINAL_STATUSES)
        marks = ", ".join("?" * len(final))
        statements = (
            (
                "DELETE FROM delivery_status WHERE message_key IN (SELECT message_key FROM delivery_status"
                f" WHERE updated_ms < ? AND unpublished = 0 AND status IN ({marks}) LIMIT ?)",
                (cutoff, *final, batch),
            ),
            (
                "DELETE FROM redriven_letter WHERE (dlq_topic, dlq_partition, dlq_offset) IN (SELECT dlq_topic,"
                " dlq_partition, dlq_offset FROM redriven_letter WHERE at_ms < ? AND produced = 1 LIMIT ?)",
                (cutoff, batch),
            ),
            (
                "DELETE FROM limit_unit WHERE (counter_key, unit) IN (SELECT counter_key, unit FROM limit_unit"
                " WHERE expires_ms <= ? LIMIT ?)",
                (now_ms, batch),
            ),
            (
                "DELETE FROM limit_counter WHERE counter_key IN (SELECT counter_key FROM limit_counter"
                " WHERE expires_ms <= ? LIMIT ?)",
                (now_ms, batch),
            ),
        )
        dropped = 0
        for text, params in statements:
            while True:
                with self._db.tx() as cur:
                    n = self._db.exec(cur, text, params).rowcount
                dropped += max(n, 0)
                if n < batch:
                    break
        return dropped

    # -- reads ------------------------------------------------------------------------------------

    def get(self, message_key: str) -> StatusRow | None:
        with self._db.tx(write=False) as cur:
            found = self._db.exec(
                cur, f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key = ?", (message_key,)
            ).fetchone()
        return StatusRow.from_db(found) if found else None

    def rows_of_notification(self, notification_id: str) -> list[StatusRow]:
        """The rows of one notification (one per channel and accepted occurrence)."""
        with self._db.tx(write=False) as cur:
            found = self._db.exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE notification_id = ? ORDER BY created_ms, message_key",
                (notification_id,),
            )
            return [StatusRow.from_db(r) for r in found.fetchall()]

    def rows_of_dedup_key(self, dedup_key: str, limit: int = 100) -> list[StatusRow]:
        """The rows whose message key is ``<dedup_key>:<channel>:<event time>``."""
        pattern = dedup_key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ":%"
        with self._db.tx(write=False) as cur:
            found = self._db.exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE message_key LIKE ? ESCAPE '\\'"
                " ORDER BY created_ms, message_key LIMIT ?",
                (pattern, limit * 3),
            )
            rows = [StatusRow.from_db(r) for r in found.fetchall()]
        return [r for r in rows if r.message_key.rsplit(":", 2)[0] == dedup_key][:limit]

    def rows_of_user(self, user_id: str, limit: int = 100) -> list[StatusRow]:
        """A user's most recent rows, newest first."""
        with self._db.tx(write=False) as cur:
            found = self._db.exec(
                cur,
                f"SELECT {_COLUMNS} FROM delivery_status WHERE user_id = ?"
                " ORDER BY created_ms DESC, message_key LIMIT ?",
                (user_id, limit),
            )
            return [StatusRow.from_db(r) for r in found.fetchall()]

    def rows(self) -> list[StatusRow]:
        with self._db.tx(write=False) as cur:
            found = self._db.exec(cur, f"SELECT {_COLUMNS} FROM delivery_status ORDER BY created_ms, message_key")
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
