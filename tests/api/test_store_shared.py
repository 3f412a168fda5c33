"""What the API processes of one store share through it, on SQLite and on PostgreSQL: the
idempotency reservations of many requests in one transaction, a caller's rate budget leased in
chunks, and the lease of the process that runs what must run once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import lease
from api.database import StoreAccess
from api.idempotency import Reservation, Reserve, Terms, complete_key, reserve_key, write_batch
from api.ratelimit import CallerLimits, chunk, lease_budget, retry_after, window_of
from api.store import RequestRecord, request_by_id
from api.tables import prepare
from senders.store.db import Database


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        location = str(tmp_path / "s.sqlite3")
    else:
        location = request.getfixturevalue("postgres_dsn")
    store = StoreAccess(location).open()
    prepare(store)
    yield store
    store.close()


def _record(nid: str, key: str) -> RequestRecord:
    return RequestRecord(nid, key, "u1", "t", ("sms",), "normal", "shop", 1, 1, 0, 1)


# -- reservations in one transaction --------------------------------------------------------------


def test_a_batch_of_reservations_is_judged_as_one_at_a_time_would_be(db: Database) -> None:
    now = int(time.time() * 1000)
    terms = Terms(now, 60_000, 10_000)
    reserve_key(db, "done", "fp", "n-done", "u1", now - 1000, 60_000, 10_000)
    complete_key(db, "done", {"id": "n-done"}, _record("n-done", "done"))
    reserve_key(db, "pending", "fp", "n-pending", "u1", now - 1000, 60_000, 10_000)
    reserve_key(db, "expired", "fp", "n-old", "u1", now - 120_000, 60_000, 10_000)
    reserve_key(db, "abandoned", "fp", "n-gone", "u1", now - 30_000, 60_000, 10_000)
    batch = [
        Reserve("new", "fp", "n1", "u1"),
        Reserve("new", "fp", "n2", "u1"),  # the same request twice in one batch: the second waits
        Reserve("new", "other", "n3", "u1"),  # the same key, another body
        Reserve("done", "fp", "n4", "u1"),
        Reserve("done", "other", "n5", "u1"),
        Reserve("pending", "fp", "n6", "u1"),
        Reserve("expired", "fp2", "n7", "u1"),
        Reserve("abandoned", "fp", "n8", "u1"),
    ]
    got = write_batch(db, [], [], batch, terms)
    assert [r.outcome for r in got] == [
        Reservation.NEW, Reservation.IN_PROGRESS, Reservation.OTHER_BODY, Reservation.REPLAY,
        Reservation.OTHER_BODY, Reservation.IN_PROGRESS, Reservation.NEW, Reservation.NEW,
    ]
    assert got[3].answer == {"id": "n-done"}
    with db.tx(write=False) as cur:
        held = dict(db.exec(cur, "SELECT idem_key, notification_id FROM api_idempotency").fetchall())
    assert held == {"new": "n1", "done": "n-done", "pending": "n-pending", "expired": "n7", "abandoned": "n8"}


def test_a_completion_and_a_repeat_in_one_transaction_replay_and_a_release_frees_the_key(db: Database) -> None:
    now = int(time.time() * 1000)
    terms = Terms(now, 60_000, 10_000)
    assert write_batch(db, [], [], [Reserve("k", "fp", "n1", "u1"), Reserve("r", "fp", "n9", "u1")],
                       terms)[0].outcome is Reservation.NEW
    got = write_batch(db, [("k", {"id": "n1"}, _record("n1", "k"))], [("r", "n9")],
                      [Reserve("k", "fp", "n2", "u1"), Reserve("r", "fp", "n10", "u1")], terms)
    assert [(r.outcome, r.answer) for r in got] == [(Reservation.REPLAY, {"id": "n1"}), (Reservation.NEW, None)]


def test_completions_store_their_answers_and_records_and_leave_a_key_held_by_another_request(db: Database) -> None:
    """A round's completions are one statement for the answers and one for the records: each
    record read back whole, its types kept; a completion whose key another request holds now
    (its writer took too long and the key was taken again) changes nothing."""
    now = int(time.time() * 1000)
    terms = Terms(now, 60_000, 10_000)
    write_batch(db, [], [], [Reserve(f"k{i}", "fp", f"n{i}", "u1") for i in range(3)], terms)
    records = [RequestRecord(f"n{i}", f"k{i}", f"u{i}", "order_shipped", ("sms", "push"), "high", "shop",
                             1_700_000_000_000 + i, now + i, i, 2**40 + i) for i in range(3)]
    stale = RequestRecord("n-late", "k2", "u9", "t", ("sms",), "normal", "shop", 1, 1, 0, 1)
    write_batch(db, [(f"k{i}", {"id": f"n{i}", "i": i}, records[i]) for i in range(3)]
                + [("k2", {"id": "n-late"}, stale)], [], [], terms)
    assert [request_by_id(db, f"n{i}") for i in range(3)] == records
    got = write_batch(db, [], [], [Reserve(f"k{i}", "fp", f"m{i}", "u1") for i in range(3)], terms)
    assert [(r.outcome, r.answer) for r in got] == [(Reservation.REPLAY, {"id": f"n{i}", "i": i}) for i in range(3)]


def test_five_hundred_and_one_reservations_in_one_call(db: Database) -> None:
    now = int(time.time() * 1000)
    got = write_batch(db, [], [], [Reserve(f"k{i}", "fp", f"n{i}", "u1") for i in range(501)],
                      Terms(now, 60_000, 10_000))
    assert [r.outcome for r in got] == [Reservation.NEW] * 501


# -- a caller's rate across processes ---------------------------------------------------------------


def test_windows_chunks_and_retry_after() -> None:
    assert window_of(100, 12_345) == window_of(100, 12_000)
    assert (window_of(100, 12_345).start_ms, window_of(100, 12_345).budget) == (12_000, 100)
    assert (window_of(0.5, 3_000).length_ms, window_of(0.5, 3_000).budget) == (2_000, 1)
    assert window_of(2.5, 0).budget == 2  # never more than the rate: whole requests, rounded down
    assert chunk(100, 100, 0.1) == 10 and chunk(100, 20, 0.1) == 5 and chunk(100, 1, 0.1) == 1
    assert chunk(100, 0, 0.1) == 0 and chunk(1, 1, 0.1) == 1
    assert retry_after(window_of(100, 12_345), 12_345) == 1
    assert retry_after(window_of(0.1, 0), 1_000) == 9


def test_two_processes_share_one_budget_and_take_it_in_chunks(db: Database, tmp_path: Path) -> None:
    """Two limiters (two API processes) on one store, one caller at 100/s: 100 admitted in the
    window, between them, then 429 until the next window; a few store transactions, not one a
    request."""
    now = [1_000_000]
    leases: list[str] = []
    second = db if db.dialect == "postgresql" else StoreAccess(db.where).open()

    def runner(store: Database):  # type: ignore[no-untyped-def]
        async def run(fn):  # type: ignore[no-untyped-def]
            return fn(store)
        return run

    a = CallerLimits(runner(db), 0.1, clock_ms=lambda: now[0], on_lease=leases.append)
    b = CallerLimits(runner(second), 0.1, clock_ms=lambda: now[0], on_lease=leases.append)

    async def burst(n: int) -> list[int | None]:
        return [await (a if i % 2 else b).admit("shop", 100, "send") for i in range(n)]

    first = asyncio.run(burst(300))
    assert sum(w is None for w in first) == 100
    assert set(w for w in first if w is not None) == {1}
    assert len(leases) <= 30, len(leases)
    now[0] += 1000  # the next window
    assert sum(w is None for w in asyncio.run(burst(150))) == 100
    assert asyncio.run(a.admit("other", 100, "send")) is None  # each caller its own budget
    assert asyncio.run(a.admit("shop", 100, "calls")) is None  # and each budget of it
    with db.tx(write=False) as cur:
        rows = db.exec(cur, "SELECT window_ms, granted FROM api_rate_budget WHERE caller = 'shop' AND"
                            " bucket = 'send' ORDER BY window_ms").fetchall()
    assert [(int(w), int(g)) for w, g in rows] == [(1_000_000, 100), (1_001_000, 100)]
    if second is not db:
        second.close()


def test_a_busy_caller_s_chunks_are_leased_ahead_so_its_requests_do_not_wait_for_the_store(db: Database) -> None:
    """At 1,000/s (chunks of 100): the next chunk is leased while a quarter of one is left, and the
    next window's first chunk once the window is half over; the store grants no more than the
    budget either way. A caller of 10/s is leased on demand only."""
    now = [2_000_000]
    calls: list[int] = []

    async def run(fn):  # type: ignore[no-untyped-def]
        calls.append(now[0])
        await asyncio.sleep(0)  # a store thread's answer comes back later
        return fn(db)

    limits = CallerLimits(run, 0.1, clock_ms=lambda: now[0])

    async def scenario() -> None:
        assert await limits.admit("busy", 1000, "send") is None  # the first chunk: waited for
        assert len(calls) == 1
        for _ in range(73):
            assert await limits.admit("busy", 1000, "send") is None
        await asyncio.sleep(0.01)
        assert len(calls) == 1  # 26 of 100 left: not yet
        assert await limits.admit("busy", 1000, "send") is None
        await asyncio.sleep(0.01)
        assert len(calls) == 2  # a quarter left: the next chunk leased meanwhile
        now[0] += 500  # the window's second half
        assert await limits.admit("busy", 1000, "send") is None
        await asyncio.sleep(0.01)
        assert len(calls) == 3  # the next window's first chunk
        now[0] += 500  # the next window: its chunk is here already
        for _ in range(50):
            assert await limits.admit("busy", 1000, "send") is None
        assert len(calls) == 3
        for _ in range(3):  # 10/s: chunks of 1, each leased when it is needed
            assert await limits.admit("small", 10, "send") is None
        assert len(calls) == 6
        now[0] += 600  # the window's second half: still no lease ahead
        assert await limits.admit("small", 10, "send") is None
        await asyncio.sleep(0.01)
        assert len(calls) == 7

    asyncio.run(scenario())
    with db.tx(write=False) as cur:
        rows = db.exec(cur, "SELECT caller, window_ms, granted FROM api_rate_budget ORDER BY caller, window_ms").fetchall()
    assert [(c, int(w), int(g)) for c, w, g in rows] == [
        ("busy", 2_000_000, 200), ("busy", 2_001_000, 100), ("small", 2_001_000, 4)]


def test_a_budget_is_never_granted_twice(db: Database) -> None:
    window = window_of(7, 5_000)
    grants = [lease_budget(db, "c", "send", window, 0.5) for _ in range(10)]
    assert sum(grants) == 7 and grants[-1] == 0


# -- the lease ---------------------------------------------------------------------------------------


def test_a_lease_is_held_by_one_taken_over_when_it_expires_or_its_holder_is_gone(db: Database) -> None:
    args = dict(host="h1", ttl_ms=3_000)
    assert lease.take(db, "l", owner="a", pid=1, now_ms=0, **args)  # type: ignore[arg-type]
    assert not lease.take(db, "l", owner="b", pid=2, now_ms=1_000, **args)  # type: ignore[arg-type]
    assert lease.take(db, "l", owner="a", pid=1, now_ms=2_000, **args)  # type: ignore[arg-type]  # renewed
    assert not lease.take(db, "l", owner="b", pid=2, now_ms=4_000, **args)  # type: ignore[arg-type]
    holder = lease.holder(db, "l", 4_000)
    assert holder is not None and (holder.owner, holder.pid, holder.expires_ms) == ("a", 1, 5_000)
    assert lease.take(db, "l", owner="b", pid=2, now_ms=5_000, **args)  # type: ignore[arg-type]  # expired
    assert not lease.take(db, "l", owner="a", pid=1, now_ms=5_001, **args)  # type: ignore[arg-type]
    assert lease.take(db, "l", owner="c", pid=3, now_ms=5_002, gone=lambda host, pid: (host, pid) == ("h1", 2),
                      **args)  # type: ignore[arg-type]
    assert lease.release(db, "l", "c") and not lease.release(db, "l", "c" + "x")
    assert lease.holder(db, "l", 5_003) is None
    assert lease.take(db, "l", owner="a", pid=1, now_ms=5_003, **args)  # type: ignore[arg-type]
