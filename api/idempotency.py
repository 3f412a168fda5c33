"""Idempotency keys in the store: reserved for a request before it is written, completed with its
answer once Kafka has it, released when it was not written. Batched: ``write_batch`` does the
completions, releases and reservations of many concurrent requests in one transaction (the
API's store writer, ``api.writer``, calls it); ``reserve_key``, ``complete_key`` and
``release_key`` are the same for one request.

A key is taken when it is new, expired, or held by a request that died before it was written
(pending for longer than ``stale_ms``). Otherwise: the same fingerprint and done is a replay of
the first answer; the same fingerprint and pending is in progress; another fingerprint is
another body.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from api import jsontext
from api.store import RequestRecord, insert_requests
from senders.store.db import Database


class Reservation(StrEnum):
    NEW = "new"  # the key is ours: write the request
    REPLAY = "replay"  # the same request was answered before: give that answer
    OTHER_BODY = "other_body"  # the key was used with another request
    IN_PROGRESS = "in_progress"  # the same request is being written right now


@dataclass(frozen=True, slots=True)
class Reserved:
    outcome: Reservation
    answer: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Reserve:
    """One request's reservation: its key, its body's fingerprint, the id it would have."""

    key: str
    fingerprint: str
    notification_id: str
    user_id: str


@dataclass(frozen=True, slots=True)
class Terms:
    """What every reservation of a batch is judged by: the time, how long a key is kept, when a
    pending key counts as abandoned."""

    now_ms: int
    ttl_ms: int
    stale_ms: int


Completion = tuple[str, dict[str, Any], RequestRecord]
#: a key to release: (key, the notification id that holds it)
Release = tuple[str, str]

#: rows per multi-row INSERT (7 parameters each: well under SQLite's 32,766 variables)
_CHUNK = 500


def _marks(n: int, width: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return ", ".join([row] * n)


def _reserve(db: Database, cur: Any, items: Sequence[Reserve], terms: Terms) -> list[Reserved]:
    """Inside a transaction: every item's outcome, in order."""
    inserted: set[tuple[str, str]] = set()
    for start in range(0, len(items), _CHUNK):
        chunk = items[start : start + _CHUNK]
        params: list[Any] = []
        for r in chunk:
            params += [r.key, r.fingerprint, "pending", r.notification_id, r.user_id, terms.now_ms,
                       terms.now_ms + terms.ttl_ms]
        rows = db.exec(
            cur,
            "INSERT INTO api_idempotency (idem_key, fingerprint, state, notification_id, user_id, created_ms,"
            f" expires_ms) VALUES {_marks(len(chunk), 7)} ON CONFLICT (idem_key) DO NOTHING"
            " RETURNING idem_key, notification_id",
            params,
        ).fetchall()
        inserted.update((str(k), str(n)) for k, n in rows)
    out: list[Reserved | None] = [
        Reserved(Reservation.NEW) if (r.key, r.notification_id) in inserted else None for r in items
    ]
    taken = {r.key for r, o in zip(items, out, strict=True) if o is not None}
    for i, r in enumerate(items):
        if out[i] is not None:
            continue
        row = db.exec(
            cur,
            "SELECT fingerprint, state, answer, created_ms, expires_ms FROM api_idempotency WHERE idem_key = ?"
            f"{db.for_update}",
            (r.key,),
        ).fetchone()
        held, state, answer, created, expires = row
        abandoned = state == "pending" and int(created) + terms.stale_ms <= terms.now_ms and r.key not in taken
        live = int(expires) > terms.now_ms and not abandoned
        if live and held != r.fingerprint:
            out[i] = Reserved(Reservation.OTHER_BODY)
        elif live and state == "done":
            out[i] = Reserved(Reservation.REPLAY, json.loads(answer))
        elif live:
            out[i] = Reserved(Reservation.IN_PROGRESS)
        else:
            db.exec(
                cur,
                "UPDATE api_idempotency SET fingerprint = ?, state = 'pending', notification_id = ?, user_id = ?,"
                " answer = NULL, created_ms = ?, expires_ms = ? WHERE idem_key = ?",
                (r.fingerprint, r.notification_id, r.user_id, terms.now_ms, terms.now_ms + terms.ttl_ms, r.key),
            )
            taken.add(r.key)
            out[i] = Reserved(Reservation.NEW)
    return [o for o in out if o is not None]


def _complete(db: Database, cur: Any, done: Sequence[Completion]) -> None:
    cur.executemany(
        db.sql("UPDATE api_idempotency SET state = 'done', answer = ? WHERE idem_key = ? AND notification_id = ?"),
        [(jsontext.dumps(answer, sort_keys=True).decode("utf-8"), key, record.notification_id)
         for key, answer, record in done],
    )
    insert_requests(db, cur, [record for _, _, record in done])


def _release(db: Database, cur: Any, releases: Sequence[Release]) -> None:
    cur.executemany(
        db.sql("DELETE FROM api_idempotency WHERE idem_key = ? AND notification_id = ? AND state = 'pending'"),
        list(releases),
    )


def write_batch(
    db: Database,
    completions: Sequence[Completion],
    releases: Sequence[Release],
    reservations: Sequence[Reserve],
    terms: Terms,
) -> list[Reserved]:
    """One transaction: the completions (their answers and request records), the releases, then
    the reservations (so a key completed in the same batch is already a replay); returns the
    reservations' outcomes in order."""
    with db.tx() as cur:
        if completions:
            _complete(db, cur, completions)
        if releases:
            _release(db, cur, releases)
        return _reserve(db, cur, reservations, terms) if reservations else []


def reserve_key(
    db: Database, key: str, fingerprint: str, notification_id: str, user_id: str, now_ms: int, ttl_ms: int,
    stale_ms: int,
) -> Reserved:
    """Take an Idempotency-Key for one request, or say why not (one transaction)."""
    return write_batch(db, (), (), [Reserve(key, fingerprint, notification_id, user_id)],
                       Terms(now_ms, ttl_ms, stale_ms))[0]


def complete_keys(db: Database, done: Sequence[Completion]) -> None:
    """Several requests in Kafka: their answers kept for their keys, their records for status."""
    write_batch(db, done, (), (), Terms(0, 0, 0))


def complete_key(db: Database, key: str, answer: dict[str, Any], record: RequestRecord) -> None:
    complete_keys(db, [(key, answer, record)])


def release_key(db: Database, key: str, notification_id: str) -> None:
    """The request was not written: the key is free for the caller's retry."""
    write_batch(db, (), [(key, notification_id)], (), Terms(0, 0, 0))
