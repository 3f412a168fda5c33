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

#: rows per statement: SQLite pads a statement's rows to a power of two (``statement_rows``), so
#: at most 512 rows of 4 parameters, well under its 32,766 variables
_CHUNK = 500

#: the columns of the rows a batch writes, one ``with_values`` row each
_RESERVING = (("k", "TEXT"), ("f", "TEXT"), ("n", "TEXT"), ("u", "TEXT"))
_DONE = (("k", "TEXT"), ("n", "TEXT"), ("a", "TEXT"))

#: a key's row as a transaction sees it: fingerprint, state, answer, created_ms, expires_ms
_Row = tuple[str, str, str | None, int, int]


def _read_rows(db: Database, cur: Any, keys: set[str], rows: dict[str, _Row]) -> None:
    """Inside a transaction: the rows of those of ``keys`` in the table into ``rows`` (on PostgreSQL
    locked, in the keys' order)."""
    marks, params = db.in_list(sorted(keys))
    for key, *row in db.select_rows(
        cur, "idem_key, fingerprint, state, answer, created_ms, expires_ms",
        f"FROM api_idempotency WHERE idem_key IN ({marks}) ORDER BY idem_key{db.for_update}", params,
    ):
        rows[str(key)] = (str(row[0]), str(row[1]), row[2], int(row[3]), int(row[4]))


def _new_keys(db: Database, cur: Any, chunk: Sequence[Reserve], terms: Terms, rows: dict[str, _Row]) -> dict[str, str]:
    """Inside a transaction: the chunk's keys not in the table inserted pending (a key twice: for
    its first request); ``rows`` given every key's row, those the insert made and those there
    before. Returns the keys inserted, each with the notification id of the request it is for.

    A batch is a few statements, not one per request, and SQLite's returns no row it need not:
    ``sqlite3`` lets the interpreter's lock go around each step (each row of a result is one), and
    in a busy process each step waits to take it back while the file's write lock is held
    (``ops.gil``; ``python -m bench.writer_round --busy``)."""
    first: dict[str, Reserve] = {}
    if db.dialect == "sqlite":
        # the transaction holds the file's write lock: a key not there now is this one's to insert
        _read_rows(db, cur, {r.key for r in chunk}, rows)
    for r in chunk:
        if r.key not in rows:
            first.setdefault(r.key, r)
    if not first:
        return {}
    values, params = db.with_values(_RESERVING, [(r.key, r.fingerprint, r.notification_id, r.user_id)
                                                 for r in first.values()])
    text = (values + "INSERT INTO api_idempotency (idem_key, fingerprint, state, notification_id, user_id, created_ms,"
            " expires_ms) SELECT k, f, 'pending', n, u, ?, ? FROM v WHERE k IS NOT NULL"
            " ON CONFLICT (idem_key) DO NOTHING")
    params += [terms.now_ms, terms.now_ms + terms.ttl_ms]
    if db.dialect == "sqlite":
        db.exec(cur, text, params)
        made = set(first)
    else:  # another transaction may have inserted a key meanwhile: the insert says which it made
        made = {str(k) for (k,) in db.exec(cur, text + " RETURNING idem_key", params).fetchall()}
        rest = {r.key for r in chunk if r.key not in made and r.key not in rows}
        if rest:
            _read_rows(db, cur, rest, rows)
    for key in made:
        r = first[key]
        rows[key] = (r.fingerprint, "pending", None, terms.now_ms, terms.now_ms + terms.ttl_ms)
    return {key: first[key].notification_id for key in made}


def _reserve(db: Database, cur: Any, items: Sequence[Reserve], terms: Terms) -> list[Reserved]:
    """Inside a transaction: every item's outcome, in order."""
    rows: dict[str, _Row] = {}
    inserted: set[tuple[str, str]] = set()
    for start in range(0, len(items), _CHUNK):
        chunk = items[start : start + _CHUNK]
        inserted.update(_new_keys(db, cur, chunk, terms, rows).items())
    out: list[Reserved | None] = [
        Reserved(Reservation.NEW) if (r.key, r.notification_id) in inserted else None for r in items
    ]
    taken = {r.key for r, o in zip(items, out, strict=True) if o is not None}
    for i, r in enumerate(items):
        if out[i] is not None:
            continue
        held, state, answer, created, expires = rows[r.key]
        abandoned = state == "pending" and created + terms.stale_ms <= terms.now_ms and r.key not in taken
        live = expires > terms.now_ms and not abandoned
        if live and held != r.fingerprint:
            out[i] = Reserved(Reservation.OTHER_BODY)
        elif live and state == "done":
            out[i] = Reserved(Reservation.REPLAY, json.loads(str(answer)))
        elif live:
            out[i] = Reserved(Reservation.IN_PROGRESS)
        else:
            db.exec(
                cur,
                "UPDATE api_idempotency SET fingerprint = ?, state = 'pending', notification_id = ?, user_id = ?,"
                " answer = NULL, created_ms = ?, expires_ms = ? WHERE idem_key = ?",
                (r.fingerprint, r.notification_id, r.user_id, terms.now_ms, terms.now_ms + terms.ttl_ms, r.key),
            )
            rows[r.key] = (r.fingerprint, "pending", None, terms.now_ms, terms.now_ms + terms.ttl_ms)
            taken.add(r.key)
            out[i] = Reserved(Reservation.NEW)
    return [o for o in out if o is not None]


def _complete(db: Database, cur: Any, done: Sequence[Completion]) -> None:
    for start in range(0, len(done), _CHUNK):
        part = done[start : start + _CHUNK]
        values, params = db.with_values(_DONE, [
            (key, record.notification_id, jsontext.dumps(answer, sort_keys=True).decode("utf-8"))
            for key, answer, record in part
        ])
        db.exec(
            cur,
            values + "UPDATE api_idempotency SET state = 'done', answer = v.a FROM v"
            " WHERE api_idempotency.idem_key = v.k AND api_idempotency.notification_id = v.n",
            params,
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
