"""The write transactions of a process on a SQLite file, one at a time and in turn, the high lane
first.

SQLite lets one writer at a time have a file; the others wait in its busy handler, which sleeps
1, 2, 5, 10, 15, 20, 25 ... 100 ms between tries and does not know who came first. In one process
the writers can wait for each other instead: each write transaction first takes its file's turn
here (a condition variable: the next one starts as soon as the last commits), and a transaction
of the high lane (the senders' priority lane: one-time codes) goes before every normal one that
waits, so a code's claim waits for at most the transaction in progress, not for the campaign's
queue. Other processes that write the file still meet SQLite's own lock, and so does a
connection that has other files attached (a transaction of it locks them all: holding one file's
turn while SQLite makes it wait for another file would hold up this process's writers of the
first, which need nothing of the second).
"""

from __future__ import annotations

import heapq
import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: ``Database.write_priority`` of the transactions that go first
HIGH = 1
NORMAL = 0


class Turns:
    """One file's write turns in this process. A thread that holds the turn may take it again (a
    transaction it nests: SQLite's own lock decides, as it did without turns)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holder: int | None = None
        self._depth = 0
        self._waiting: list[tuple[int, int]] = []  # a heap of (-priority, arrival)
        self._arrivals = itertools.count()

    def take(self, priority: int, timeout_s: float) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._holder == me:
                self._depth += 1
                return
            mine = (-priority, next(self._arrivals))
            heapq.heappush(self._waiting, mine)
            deadline = time.monotonic() + timeout_s
            while self._holder is not None or self._waiting[0] != mine:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._waiting.remove(mine)
                    heapq.heapify(self._waiting)
                    self._cond.notify_all()
                    # as SQLite's busy timeout says it: the store's callers take it as transient
                    raise sqlite3.OperationalError(
                        f"database is locked: this process's other writers held it for {timeout_s:g} s")
                self._cond.wait(left)
            heapq.heappop(self._waiting)
            self._holder, self._depth = me, 1

    def give(self) -> None:
        with self._cond:
            if self._holder != threading.get_ident():
                raise RuntimeError("a write turn given back by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._holder = None
                self._cond.notify_all()


_TURNS: dict[str, Turns] = {}
_TURNS_LOCK = threading.Lock()


def turns_of(path: str) -> Turns:
    """The process's turns of the file at ``path`` (one object per file, however it is named)."""
    key = os.path.realpath(path)
    with _TURNS_LOCK:
        found = _TURNS.get(key)
        if found is None:
            found = _TURNS[key] = Turns()
        return found


@contextmanager
def in_turn(turns: Turns, priority: int, timeout_s: float) -> Iterator[None]:
    """Hold the file's turn for one write transaction."""
    turns.take(priority, timeout_s)
    try:
        yield
    finally:
        turns.give()
