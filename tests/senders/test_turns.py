"""A process's writers of one SQLite file take turns (senders.store.turns): the next write
transaction starts when the last commits, the high lane before the normal ones waiting, a turn
not given in time fails as a locked store does; and each transaction's wait and hold are told."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from senders.errors import StoreUnavailableError
from senders.store.db import Database, open_database
from senders.store.turns import HIGH, NORMAL, Turns, turns_of


def _db(path: Path, busy_timeout_ms: int = 30_000) -> Database:
    db = open_database(str(path), synchronous="NORMAL", busy_timeout_ms=busy_timeout_ms, store_tables=False)
    with db.tx() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS t (who TEXT, at REAL)")
    return db


def _waiting(turns: Turns) -> int:
    with turns._cond:
        return len(turns._waiting)


def _until(check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_high_lane_writes_before_the_normal_ones_that_wait(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    holder, normal, high = _db(path), _db(path), _db(path)
    high.write_priority = HIGH
    assert normal.write_priority == NORMAL
    turns = turns_of(str(path))
    release = threading.Event()
    order: list[str] = []

    def hold() -> None:
        with holder.tx() as cur:
            cur.execute("INSERT INTO t VALUES ('holder', 0)")
            release.wait(10)

    def write(db: Database, who: str) -> None:
        with db.tx() as cur:
            order.append(who)
            cur.execute("INSERT INTO t VALUES (?, 0)", (who,))

    threads = [threading.Thread(target=hold)]
    threads[0].start()
    _until(lambda: turns._holder is not None)
    threads.append(threading.Thread(target=write, args=(normal, "normal")))
    threads[-1].start()
    _until(lambda: _waiting(turns) == 1)
    threads.append(threading.Thread(target=write, args=(high, "high")))
    threads[-1].start()
    _until(lambda: _waiting(turns) == 2)
    assert order == []
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["high", "normal"]
    with holder.tx(write=False) as cur:
        assert sorted(r[0] for r in cur.execute("SELECT who FROM t").fetchall()) == ["high", "holder", "normal"]
    assert turns._holder is None and _waiting(turns) == 0


def test_a_turn_not_given_in_time_fails_as_a_locked_store_and_leaves_the_turns_free(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    holder, late = _db(path), _db(path, busy_timeout_ms=200)
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        with holder.tx():
            started.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    started.wait(10)
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="other writers held it for 0.2 s"), late.tx() as cur:
        cur.execute("INSERT INTO t VALUES ('late', 0)")
    assert 0.19 <= time.monotonic() - began < 5
    release.set()
    t.join(10)
    with late.tx() as cur:  # its turn comes at once now
        cur.execute("INSERT INTO t VALUES ('again', 0)")
    with late.tx(write=False) as cur:
        assert [r[0] for r in cur.execute("SELECT who FROM t").fetchall()] == ["again"]
    assert _waiting(turns_of(str(path))) == 0


def test_each_write_transaction_tells_its_wait_for_the_lock_and_how_long_it_held_it(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    first, second = _db(path), _db(path)
    waits: list[float] = []
    held: list[float] = []
    second.on_lock_wait, second.on_lock_held = waits.append, held.append
    first_in = threading.Event()

    def hold() -> None:
        with first.tx():
            first_in.set()
            time.sleep(0.2)

    t = threading.Thread(target=hold)
    t.start()
    first_in.wait(10)
    with second.tx() as cur:
        cur.execute("INSERT INTO t VALUES ('second', 0)")
        time.sleep(0.05)
    t.join(10)
    with second.tx(write=False) as cur:  # a read takes no write lock: nothing told
        cur.execute("SELECT count(*) FROM t").fetchall()
    assert len(waits) == 1 and 0.1 < waits[0] < 5, waits
    assert len(held) == 1 and 0.05 <= held[0] < 5, held


def test_one_object_per_file_and_a_turn_given_back_only_by_its_holder(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert turns_of(str(tmp_path / "a" / ".." / "f.db")) is turns_of(str(tmp_path / "f.db"))
    assert turns_of(str(tmp_path / "g.db")) is not turns_of(str(tmp_path / "f.db"))
    turns = Turns()
    turns.take(NORMAL, 1.0)
    turns.take(HIGH, 1.0)  # the holder again: a nested transaction of its own
    turns.give()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            turns.give()
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert len(errors) == 1 and "does not hold it" in str(errors[0])
    turns.give()
    assert turns._holder is None


def test_a_connection_with_another_file_attached_holds_up_no_writer_of_that_file(tmp_path: Path) -> None:
    """It takes no turns (its transaction locks both files): while SQLite makes it wait for one
    file, held by another process, this process's writers of the other go on."""
    import sqlite3

    store, requests = tmp_path / "store.db", tmp_path / "requests.db"
    _db(store).close()
    alone = _db(requests)
    both = open_database(str(store), synchronous="NORMAL", busy_timeout_ms=10_000, attach={"r": requests},
                         store_tables=False)
    other = sqlite3.connect(str(store), isolation_level=None, timeout=0)  # as another process would
    other.execute("BEGIN IMMEDIATE")
    waited = threading.Event()

    def write_both() -> None:
        with both.tx() as cur:
            cur.execute("INSERT INTO main.t VALUES ('both', 0)")
        waited.set()

    t = threading.Thread(target=write_both)
    t.start()
    try:
        time.sleep(0.2)  # in SQLite's busy handler by now
        began = time.monotonic()
        with alone.tx() as cur:
            cur.execute("INSERT INTO t VALUES ('alone', 0)")
        assert time.monotonic() - began < 1.0
        assert not waited.is_set()
    finally:
        other.execute("ROLLBACK")
        other.close()
        t.join(15)
    assert waited.is_set()
