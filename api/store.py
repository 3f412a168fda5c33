"""The API's records in the store: the requests it wrote, the job's verdicts on them, delivery
receipts, and their pruning; each function is one transaction on one connection (``api.pool``).
The idempotency keys are in ``api.idempotency``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from senders.store.db import Database


@dataclass(frozen=True, slots=True)
class RequestRecord:
    notification_id: str
    dedup_key: str
    user_id: str
    template: str
    channels: tuple[str, ...]
    priority: str
    caller: str
    event_time_ms: int
    accepted_ms: int
    partition: int
    offset: int

    @classmethod
    def from_db(cls, row: Sequence[Any]) -> RequestRecord:
        return cls(row[0], row[1], row[2], row[3], tuple(row[4].split(",")), row[5], row[6], int(row[7]),
                   int(row[8]), int(row[9]), int(row[10]))


#: the request records' columns with their SQL types (``Database.with_values``)
_REQUEST_TYPES = (
    ("notification_id", "TEXT"), ("dedup_key", "TEXT"), ("user_id", "TEXT"), ("template", "TEXT"),
    ("channels", "TEXT"), ("priority", "TEXT"), ("caller", "TEXT"), ("event_time_ms", "BIGINT"),
    ("accepted_ms", "BIGINT"), ("kafka_partition", "INTEGER"), ("kafka_offset", "BIGINT"),
)
_REQUEST_COLUMNS = ", ".join(name for name, _ in _REQUEST_TYPES)


#: records per statement (SQLite pads them to a power of two: 512 rows of 11 parameters at most)
_CHUNK = 500


def insert_requests(db: Database, cur: Any, records: Sequence[RequestRecord]) -> None:
    """Inside a transaction: the records, one statement for up to 500 of them. A statement each
    was a round trip each on PostgreSQL (the API alone there had an accept p99 of 47-49 ms with
    it, 24-30 without: ``python -m bench.api --rate 1000 --seconds 15 --store postgresql``,
    README), and on SQLite a step each, each letting the interpreter's lock go with the file's
    write lock held (``api.idempotency._new_keys``)."""
    for start in range(0, len(records), _CHUNK):
        values, params = db.with_values(_REQUEST_TYPES, [
            (r.notification_id, r.dedup_key, r.user_id, r.template, ",".join(r.channels), r.priority, r.caller,
             r.event_time_ms, r.accepted_ms, r.partition, r.offset)
            for r in records[start : start + _CHUNK]
        ])
        db.exec(
            cur,
            values + f"INSERT INTO api_request ({_REQUEST_COLUMNS}) SELECT {_REQUEST_COLUMNS} FROM v"
            " WHERE notification_id IS NOT NULL ON CONFLICT (notification_id) DO NOTHING",
            params,
        )


def request_by_id(db: Database, notification_id: str) -> RequestRecord | None:
    with db.tx(write=False) as cur:
        row = db.exec(
            cur, f"SELECT {_REQUEST_COLUMNS} FROM api_request WHERE notification_id = ?", (notification_id,)
        ).fetchone()
    return RequestRecord.from_db(row) if row else None


def requests_by_key(db: Database, dedup_key: str, limit: int = 20, caller: str | None = None) -> list[RequestRecord]:
    """The requests written with this dedup key (of one caller, when given), the first first."""
    mine = " AND caller = ?" if caller is not None else ""
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur,
            f"SELECT {_REQUEST_COLUMNS} FROM api_request WHERE dedup_key = ?{mine}"
            " ORDER BY accepted_ms, notification_id LIMIT ?",
            (dedup_key, *((caller,) if caller is not None else ()), limit),
        ).fetchall()
    return [RequestRecord.from_db(r) for r in rows]


def requests_of_user(db: Database, user_id: str, limit: int, caller: str | None = None) -> list[RequestRecord]:
    """A user's requests (those of one caller, when given), newest first."""
    mine = " AND caller = ?" if caller is not None else ""
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur,
            f"SELECT {_REQUEST_COLUMNS} FROM api_request WHERE user_id = ?{mine} ORDER BY accepted_ms DESC LIMIT ?",
            (user_id, *((caller,) if caller is not None else ()), limit),
        ).fetchall()
    return [RequestRecord.from_db(r) for r in rows]


def request_at(db: Database, partition: int, offset: int) -> RequestRecord | None:
    with db.tx(write=False) as cur:
        row = db.exec(
            cur,
            f"SELECT {_REQUEST_COLUMNS} FROM api_request WHERE kafka_partition = ? AND kafka_offset = ?",
            (partition, offset),
        ).fetchone()
    return RequestRecord.from_db(row) if row else None


# -- the job's verdicts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """A verdict of the job other than accepted: duplicate, late or invalid."""

    notification_id: str
    verdict: str
    dedup_key: str | None = None
    user_id: str | None = None
    original_id: str | None = None
    occurrence: int | None = None
    watermark_ms: int | None = None
    reason: str | None = None
    at_ms: int = 0


_OUTCOME_COLUMNS = "notification_id, verdict, dedup_key, user_id, original_id, occurrence, watermark_ms, reason, at_ms"


def record_outcomes(db: Database, outcomes: Iterable[Outcome]) -> int:
    rows = [
        (o.notification_id, o.verdict, o.dedup_key, o.user_id, o.original_id, o.occurrence, o.watermark_ms,
         o.reason, o.at_ms)
        for o in outcomes
    ]
    if not rows:
        return 0
    with db.tx() as cur:
        cur.executemany(
            db.sql(
                f"INSERT INTO api_outcome ({_OUTCOME_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (notification_id, verdict) DO NOTHING"
            ),
            rows,
        )
    return len(rows)


def _outcome(row: Sequence[Any]) -> Outcome:
    return Outcome(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], int(row[8]))


def outcomes_of(db: Database, notification_id: str) -> list[Outcome]:
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur, f"SELECT {_OUTCOME_COLUMNS} FROM api_outcome WHERE notification_id = ? ORDER BY at_ms",
            (notification_id,),
        ).fetchall()
    return [_outcome(r) for r in rows]


def outcomes_by_key(db: Database, dedup_key: str, limit: int = 20) -> list[Outcome]:
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur, f"SELECT {_OUTCOME_COLUMNS} FROM api_outcome WHERE dedup_key = ? ORDER BY at_ms LIMIT ?",
            (dedup_key, limit),
        ).fetchall()
    return [_outcome(r) for r in rows]


# -- receipts --------------------------------------------------------------------------------------


def record_receipt(
    db: Database, provider: str, reference: str, status: str, message_key: str, reason: str | None, now_ms: int
) -> None:
    with db.tx() as cur:
        db.exec(
            cur,
            "INSERT INTO api_receipt (provider, provider_ref, status, message_key, reason, received_ms)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (provider, provider_ref, status) DO NOTHING",
            (provider, reference, status, message_key, reason, now_ms),
        )


def receipts_of(db: Database, message_keys: Sequence[str]) -> dict[str, list[tuple[str, str | None, int]]]:
    """message key -> its receipts (status, reason, received ms), oldest first."""
    if not message_keys:
        return {}
    marks = ", ".join("?" * len(message_keys))
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur,
            f"SELECT message_key, status, reason, received_ms FROM api_receipt WHERE message_key IN ({marks})"
            " ORDER BY received_ms",
            tuple(message_keys),
        ).fetchall()
    out: dict[str, list[tuple[str, str | None, int]]] = {}
    for key, status, reason, at in rows:
        out.setdefault(key, []).append((status, reason, int(at)))
    return out


# -- retention -------------------------------------------------------------------------------------


def prune(db: Database, now_ms: int, retention_ms: int, batch: int = 1000) -> int:
    """Drop idempotency keys past their time, requests, verdicts and receipts older than the
    status store's retention, and rate windows of more than a minute ago; batches, each its own
    transaction."""
    cutoff = now_ms - retention_ms
    statements = (
        ("DELETE FROM api_idempotency WHERE idem_key IN (SELECT idem_key FROM api_idempotency"
         " WHERE expires_ms <= ? LIMIT ?)", (now_ms, batch)),
        ("DELETE FROM api_request WHERE notification_id IN (SELECT notification_id FROM api_request"
         " WHERE accepted_ms < ? LIMIT ?)", (cutoff, batch)),
        ("DELETE FROM api_outcome WHERE (notification_id, verdict) IN (SELECT notification_id, verdict"
         " FROM api_outcome WHERE at_ms < ? LIMIT ?)", (cutoff, batch)),
        ("DELETE FROM api_receipt WHERE (provider, provider_ref, status) IN (SELECT provider, provider_ref,"
         " status FROM api_receipt WHERE received_ms < ? LIMIT ?)", (cutoff, batch)),
        # the callers' rate windows of more than a minute ago (api.ratelimit)
        ("DELETE FROM api_rate_budget WHERE (caller, bucket, window_ms) IN (SELECT caller, bucket, window_ms"
         " FROM api_rate_budget WHERE window_ms < ? LIMIT ?)", (now_ms - 60_000, batch)),
    )
    dropped = 0
    for text, params in statements:
        while True:
            with db.tx() as cur:
                n = max(0, int(db.exec(cur, text, params).rowcount))
            dropped += n
            if n < batch:
                break
    return dropped
