"""The status store's hot path in batches: the claims of many messages in one transaction (with
their rules, the limit counters locked and counted), their outcomes in one, the addresses'
deactivations read in one. The same transitions as ``StatusStore.claim`` / ``finish``, one
message at a time, decide each; the batch only shares the transaction and the statements.

Locks are taken in one order, status rows by message key, then limit counters by key: two
processes claiming overlapping batches (a rebalance) wait for each other, never deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from operators.records import Channel
from senders.policy.transitions import ClaimDecision, OutcomePlan, check_transition, decide_claim
from senders.policy.verdict import RuleVerdict
from senders.rules.limits import CounterState, LimitClaim
from senders.statuses import ClaimAction, DeliveryStatus, Lane
from senders.store.db import Database
from senders.store.status import _COLUMNS, Rules, StatusRow, address_hash

#: rows per multi-row statement (SQLite allows 32,766 parameters in one)
CHUNK = 500

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One message to claim: ``StatusStore.claim``'s arguments."""

    message_key: str
    notification_id: str
    channel: Channel
    lane: Lane
    attempt: int
    user_id: str | None = None
    rules: Rules | None = None
    limits: Sequence[LimitClaim] = ()


@dataclass(frozen=True, slots=True)
class FinishRequest:
    """One outcome to record: ``StatusStore.finish``'s arguments."""

    message_key: str
    attempt: int
    plan: OutcomePlan
    provider: str | None
    error: str | None
    now_ms: int
    deactivate: tuple[Channel, str] | None = None
    provider_ref: str | None = None


Claimed = tuple[ClaimDecision, StatusRow | None, RuleVerdict | None]

#: the rows a batch's statements change, one VALUES row each (``with_values``): k is the key
_SENDING = (("k", "TEXT"), ("attempts", "INTEGER"), ("template", "TEXT"), ("template_version", "INTEGER"),
            ("locale", "TEXT"))
_RULED = (("k", "TEXT"), ("status", "TEXT"), ("attempts", "INTEGER"), ("reason", "TEXT"),
          ("not_before_ms", "BIGINT"), ("template", "TEXT"), ("template_version", "INTEGER"), ("locale", "TEXT"))
#: a finished call's claim, still this owner's (``finish_many``: ``v`` its ``with_values`` rows)
_HELD = ("delivery_status.message_key = v.k AND delivery_status.status = ? AND delivery_status.attempts = v.attempts"
         " AND delivery_status.owner = ?")
_CONSUMED = (("c", "TEXT"), ("u", "TEXT"), ("e", "BIGINT"))
_FINISHED = (("k", "TEXT"), ("status", "TEXT"), ("provider", "TEXT"), ("last_error", "TEXT"),
             ("dead_letter", "TEXT"), ("retry_at_ms", "BIGINT"), ("updated_ms", "BIGINT"), ("provider_ref", "TEXT"),
             ("attempts", "INTEGER"))


@dataclass(slots=True)
class _Units:
    """The limit counters of a batch, locked: each counter's units, as the batch consumes them."""

    units: dict[str, set[str]] = field(default_factory=dict)

    def state(self, claim: LimitClaim) -> CounterState:
        held = self.units.get(claim.key, set())
        return CounterState(used=len(held), has_unit=claim.unit in held)


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def _rounds(items: Sequence[T], key: Callable[[T], str]) -> Iterator[list[T]]:
    """The items in rounds of distinct keys (one round, but for a key twice in the batch): a
    key's later item comes in a later round, decided after the earlier one's change."""
    pending = list(items)
    while pending:
        now: list[T] = []
        later: list[T] = []
        keys: set[str] = set()
        for item in pending:
            (later if key(item) in keys else now).append(item)
            keys.add(key(item))
        yield now
        pending = later


def _lock_counters(db: Database, cur: Any, limits: Iterable[LimitClaim], now_ms: int) -> _Units:
    """Every counter the batch consults, made if missing, locked (sorted), and its live units."""
    expires: dict[str, int] = {}
    for claim in limits:
        expires[claim.key] = max(expires.get(claim.key, 0), claim.expires_at_ms)
    keys = sorted(expires)
    out = _Units({k: set() for k in keys})
    for part in _chunks(keys):
        rows, params = db.many_rows([(k, expires[k]) for k in part], "(?, ?)")
        db.exec(
            cur,
            f"INSERT INTO limit_counter (counter_key, expires_ms) VALUES {rows} ON CONFLICT (counter_key) DO NOTHING",
            params,
        )
        marks, keys_in = db.in_list(part)
        if db.for_update:  # PostgreSQL: the counters' rows locked; a SQLite writer holds the file's lock
            db.exec(
                cur,
                f"SELECT counter_key FROM limit_counter WHERE counter_key IN ({marks}) ORDER BY counter_key"
                f"{db.for_update}",
                keys_in,
            ).fetchall()
        for key, unit in db.select_rows(
            cur, "counter_key, unit", f"FROM limit_unit WHERE counter_key IN ({marks}) AND expires_ms > ?",
            (*keys_in, now_ms),
        ):
            out.units[str(key)].add(str(unit))
    return out


def _rows(
    db: Database, cur: Any, requests: Sequence[ClaimRequest], now_ms: int
) -> tuple[dict[str, StatusRow], set[str]]:
    """The requests' rows, made queued where missing, locked in key order; and the keys made. The
    rows the insert made are locked by it and known without reading them back."""
    ordered = sorted(requests, key=lambda r: r.message_key)
    inserted: set[str] = set()
    rows: dict[str, StatusRow] = {}
    for part in _chunks(ordered):
        if db.dialect == "sqlite":
            # the transaction holds the file's write lock: a row not there now is this insert's to
            # make, so the rows there are read first and the insert returns none (each row a
            # result returns is a step, and a step in a busy process waits for the interpreter)
            there = _read_rows(db, cur, [r.message_key for r in part])
            rows.update(there)
            missing = [r for r in part if r.message_key not in there]
            if missing:
                db.exec(cur, *_insert_queued(db, missing, now_ms))
            made_now = {r.message_key for r in missing}
        else:  # another transaction may insert meanwhile: the insert says which rows it made
            text, values = _insert_queued(db, part, now_ms)
            made_now = {r[0] for r in db.exec(cur, text + " RETURNING message_key", values).fetchall()}
        inserted |= made_now
        for r in part:  # a row just made is as inserted (and locked by the insert): not read back
            if r.message_key in made_now:
                rows[r.message_key] = StatusRow(
                    message_key=r.message_key, notification_id=r.notification_id, channel=r.channel, lane=r.lane,
                    status=DeliveryStatus.QUEUED, attempts=0, provider=None, last_error=None, dead_letter=None,
                    retry_at_ms=None, lease_until_ms=0, owner=None, unpublished=False, updated_ms=now_ms,
                    user_id=r.user_id,
                )
        existing = [r.message_key for r in part if r.message_key not in made_now and r.message_key not in rows]
        if existing:
            rows.update(_read_rows(db, cur, existing))
    return rows, inserted


def _insert_queued(db: Database, part: Sequence[ClaimRequest], now_ms: int) -> tuple[str, list[Any]]:
    """The statement that makes these requests' rows queued where missing, and its parameters."""
    new, values = db.many_rows(
        [
            (r.message_key, r.notification_id, r.channel.value, r.lane.value, DeliveryStatus.QUEUED.value,
             now_ms, now_ms, r.user_id)
            for r in part
        ],
        "(?, ?, ?, ?, ?, 0, ?, ?, ?)",
    )
    return ("INSERT INTO delivery_status (message_key, notification_id, channel, lane, status, attempts,"
            f" created_ms, updated_ms, user_id) VALUES {new} ON CONFLICT (message_key) DO NOTHING", values)


def _read_rows(db: Database, cur: Any, keys: Sequence[str]) -> dict[str, StatusRow]:
    """These keys' rows (those there), locked in key order (PostgreSQL; on SQLite the writer
    holds the file)."""
    marks, params = db.in_list(sorted(keys))
    found = db.select_rows(cur, _COLUMNS, f"FROM delivery_status WHERE message_key IN ({marks})"
                           f" ORDER BY message_key{db.for_update}", params)
    return {row.message_key: row for row in map(StatusRow.from_db, found)}


def claim_many(
    db: Database, requests: Sequence[ClaimRequest], *, now_ms: int, lease_ms: int, owner: str
) -> list[Claimed]:
    """``StatusStore.claim`` for each request, in one transaction; results in the requests' order.
    Two requests of one key: the later one is decided after the earlier one's change."""
    out: list[Claimed | None] = [None] * len(requests)
    with db.tx() as cur:
        for now_round in _rounds(list(enumerate(requests)), lambda item: item[1].message_key):
            for i, claimed in _claim_round(db, cur, now_round, now_ms, lease_ms, owner):
                out[i] = claimed
    return [c for c in out if c is not None]


def _claim_round(
    db: Database, cur: Any, items: list[tuple[int, ClaimRequest]], now_ms: int, lease_ms: int, owner: str
) -> list[tuple[int, Claimed]]:
    rows, inserted = _rows(db, cur, [r for _, r in items], now_ms)
    decisions = {r.message_key: decide_claim(rows[r.message_key].state(), r.attempt, now_ms) for _, r in items}
    to_rule = [r for _, r in items if decisions[r.message_key].action is ClaimAction.CLAIM]
    units = _lock_counters(db, cur, (c for r in to_rule if r.rules is not None for c in r.limits), now_ms)
    sending: list[tuple[Any, ...]] = []
    ruled: list[tuple[Any, ...]] = []
    consumed: list[tuple[str, str, int]] = []
    results: list[tuple[int, Claimed]] = []
    for i, r in items:
        row, decision = rows[r.message_key], decisions[r.message_key]
        if decision.action is not ClaimAction.CLAIM:
            results.append((i, (decision, row, None)))
            continue
        counts = {c.key: units.state(c) for c in r.limits}
        verdict = RuleVerdict() if r.rules is None else r.rules(counts, r.message_key in inserted)
        ref = verdict.template
        template = (ref.name, ref.version, ref.locale) if ref else (None, None, None)
        if verdict.send:
            check_transition(row.status, DeliveryStatus.SENDING)
            for c in verdict.consume:
                units.units.setdefault(c.key, set()).add(c.unit)
                consumed.append((c.key, c.unit, c.expires_at_ms))
            sending.append((r.message_key, r.attempt, *template))
        else:
            assert verdict.status is not None
            check_transition(row.status, verdict.status)
            ruled.append(
                (r.message_key, verdict.status.value, r.attempt, verdict.reason, verdict.not_before_ms, *template)
            )
        results.append((i, (decision, row, verdict)))
    for part in _chunks(consumed):
        values, params = db.with_values(_CONSUMED, part)
        db.exec(
            cur,
            values + "INSERT INTO limit_unit (counter_key, unit, expires_ms) SELECT c, u, e FROM v WHERE c IS NOT NULL"
            " ON CONFLICT (counter_key, unit) DO NOTHING",
            params,
        )
    for part in _chunks(sending):
        values, params = db.with_values(_SENDING, part)
        db.exec(
            cur,
            values
            + "UPDATE delivery_status SET status = ?, attempts = v.attempts, lease_until_ms = ?, owner = ?,"
            " unpublished = 0, updated_ms = ?, reason = NULL, not_before_ms = NULL, template = v.template,"
            " template_version = v.template_version, locale = v.locale FROM v"
            " WHERE delivery_status.message_key = v.k",
            [*params, DeliveryStatus.SENDING.value, now_ms + lease_ms, owner, now_ms],
        )
    for part in _chunks(ruled):
        values, params = db.with_values(_RULED, part)
        db.exec(
            cur,
            values
            + "UPDATE delivery_status SET status = v.status, attempts = v.attempts, lease_until_ms = 0, owner = ?,"
            " unpublished = 1, updated_ms = ?, reason = v.reason, not_before_ms = v.not_before_ms,"
            " retry_at_ms = NULL, template = v.template, template_version = v.template_version, locale = v.locale"
            " FROM v WHERE delivery_status.message_key = v.k",
            [*params, owner, now_ms],
        )
    return results


def release_many(db: Database, claims: Sequence[tuple[str, int]], *, owner: str) -> int:
    """Give up claims no call was made for ((message key, attempt) pairs this owner claimed):
    their leases end now, so the next owner of their partition claims them at once instead of
    waiting out the lease. A claim this owner no longer holds is left alone. Returns how many
    were released."""
    if not claims:
        return 0
    with db.tx() as cur:
        released = 0
        for key, attempt in sorted(claims):
            released += db.exec(
                cur,
                "UPDATE delivery_status SET lease_until_ms = 0"
                " WHERE message_key = ? AND status = ? AND attempts = ? AND owner = ?",
                (key, DeliveryStatus.SENDING.value, attempt, owner),
            ).rowcount
    return released


def finish_many(db: Database, requests: Sequence[FinishRequest], *, owner: str) -> list[bool]:
    """``StatusStore.finish`` for each request, in one transaction: True where this owner still
    held the claim (the outcome is recorded), False where the claim was lost."""
    for r in requests:
        check_transition(DeliveryStatus.SENDING, r.plan.status)
    recorded = [False] * len(requests)
    with db.tx() as cur:
        for now_round in _rounds(range(len(requests)), lambda i: requests[i].message_key):
            for part in _chunks(sorted(now_round, key=lambda i: requests[i].message_key)):
                values, params = db.with_values(
                    _FINISHED,
                    [
                        (
                            r.message_key,
                            r.plan.status.value,
                            r.provider,
                            r.error,
                            r.plan.dead_letter.value if r.plan.dead_letter else None,
                            r.plan.retry_at_ms,
                            r.now_ms,
                            r.provider_ref,
                            r.attempt,
                        )
                        for r in (requests[i] for i in part)
                    ],
                )
                update = (
                    "UPDATE delivery_status SET status = v.status, provider = v.provider,"
                    " last_error = v.last_error, dead_letter = v.dead_letter, retry_at_ms = v.retry_at_ms,"
                    " lease_until_ms = 0, unpublished = 1, updated_ms = v.updated_ms,"
                    f" provider_ref = v.provider_ref FROM v WHERE {_HELD}"
                )
                params += [DeliveryStatus.SENDING.value, owner]
                if db.dialect == "sqlite":
                    # the claims still held, read as one row (the write lock is this transaction's:
                    # the update changes exactly those), then the update, which returns no rows
                    done = {str(k) for (k,) in db.select_rows(cur, "delivery_status.message_key",
                                                               f"FROM delivery_status, v WHERE {_HELD}", params,
                                                               with_=values)}
                    if done:
                        db.exec(cur, values + update, params)
                else:
                    returned = db.exec(cur, values + update + " RETURNING message_key", params).fetchall()
                    done = {row[0] for row in returned}
                for i in part:
                    recorded[i] = requests[i].message_key in done
        deactivations = [
            (r.deactivate[0].value, address_hash(*r.deactivate), (r.error or "")[:200], r.now_ms)
            for r, ok in zip(requests, recorded, strict=True)
            if ok and r.deactivate is not None
        ]
        if deactivations:
            cur.executemany(
                db.sql(
                    "INSERT INTO inactive_address (channel, address_hash, reason, since_ms) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (channel, address_hash) DO NOTHING"
                ),
                deactivations,
            )
    return recorded


def inactive_since_many(db: Database, channel: Channel, addresses: Iterable[str]) -> dict[str, int]:
    """Of these addresses, those a provider deactivated: address -> since (ms)."""
    by_hash = {address_hash(channel, a): a for a in addresses}
    out: dict[str, int] = {}
    if not by_hash:
        return out
    hashes = sorted(by_hash)
    with db.tx(write=False) as cur:
        for part in _chunks(hashes):
            marks, params = db.in_list(part)
            for digest, since in db.exec(
                cur,
                f"SELECT address_hash, since_ms FROM inactive_address WHERE channel = ? AND address_hash IN ({marks})",
                (channel.value, *params),
            ).fetchall():
                out[by_hash[digest]] = int(since)
    return out
