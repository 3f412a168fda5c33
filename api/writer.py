"""The API's store writer: one thread with one connection, which writes the idempotency records of
all the requests in flight together: each round is one transaction with the answers of the
requests Kafka acknowledged (and their request records), the keys of requests that were not
written, and the reservations of the requests that came meanwhile (``api.idempotency.write_batch``).
Then it reads the profiles of the new requests' users that are not cached, together (one read
transaction), and answers them all with one hand-over to the event loop.

A round starts at least ``round_s`` after the one before (``api.writer_round_ms``), as a group
commit does: under load a round takes the requests of that time together, so each costs less CPU
(a transaction, a profile read and a hand-over shared by more of them), and the thread takes the
interpreter's lock fewer times; an idle writer starts its next round at once. Measured with
``python -m bench.api --rate 2000 --seconds 20 --processes 2`` (the API alone): 0 ms (a round as
soon as one ended) 0.509 ms of CPU a request, 3 ms 0.473, 6 ms 0.425, 10 ms 0.363, 15 ms 0.335;
the accept p99 stayed 22-27 ms, its p50 rose from 7.1 to 9.1 ms at 10 ms.

So the store sees one write transaction per round, not one per request, and in a process there
is one writer of these tables: on SQLite, in a file of their own (``api.database``), so the writer
waits in the busy handler (it sleeps 1, 2, 5, 10 ms... between tries) neither for another
connection of the process nor for the senders. A round that fails
(the store does not answer) fails its reservations at once (the API answers 503) and keeps the
completions, retried after a pause that doubles up to 2 s.

Until its round is stored, a request's answer is held here (``answer_of``), so the same key again
in this process gets it, and a read of the store waits for the rounds holding the answers given
before it (``caught_up``): a status read after a 202 from this process finds the request. A
process that dies before then leaves those keys pending: after the stale time a retry writes the
request again, and the dedup job suppresses the repeat.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.accept import Reach
from api.idempotency import Completion, Release, Reservation, Reserve, Reserved, Terms, write_batch
from api.store import RequestRecord
from senders.store.db import Database

logger = logging.getLogger(__name__)

#: a new request's outcome, and for a NEW one what its user's profile says of the channels
Reply = tuple[Reserved, Reach | None]


@dataclass(slots=True)
class _Waiting:
    item: Reserve
    future: asyncio.Future[Reply]
    loop: asyncio.AbstractEventLoop


class StoreWriter:
    """:param opener: the writer's own connection (on SQLite to the requests file alone: ``api.database``)
    :param terms: the reservations' terms now (the time, the keys' TTL, the stale time)
    :param read_profiles: what the users' profiles say (from the cache or the store, the rest in one
        read), in the writer's thread: a user's Reach, or the error that kept it from being read
    :param max_batch: the most reservations, and the most completions, in one round
    :param round_s: the least time from a round's start to the next one's
    :param observe_batch: told the reservations of each round
    :param observe_wait: told each reservation's time, from ``reserve`` to its answer (seconds)
    """

    def __init__(
        self,
        opener: Callable[[], Database],
        terms: Callable[[], Terms],
        read_profiles: Callable[[Sequence[str]], Mapping[str, Reach | Exception]],
        max_batch: int = 256,
        round_s: float = 0.0,
        observe_batch: Callable[[int], None] | None = None,
        observe_wait: Callable[[float], None] | None = None,
    ) -> None:
        self._opener = opener
        self._terms = terms
        self._read_profiles = read_profiles
        self._max_batch = max_batch
        self._round_s = round_s
        self._observe_batch = observe_batch
        self._observe_wait = observe_wait
        self._waiting: list[_Waiting] = []
        self._pending: dict[str, Completion] = {}
        self._order: list[str] = []
        self._seq = 0  # completions handed in so far
        self._seq_of: dict[str, int] = {}  # a held completion's place in that count
        self._catching_up: list[tuple[int, asyncio.Future[None], asyncio.AbstractEventLoop]] = []
        self._releases: list[Release] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._retry_at = 0.0
        self._thread = threading.Thread(target=self._run, name="api-store-writer", daemon=True)
        self._thread.start()

    # -- from the event loop -----------------------------------------------------------------------

    async def reserve(self, item: Reserve) -> Reply:
        """Reserve a key in the next round: its outcome, and for a new one what the user's profile says (a
        user without a profile: the key is released again). Raises what the store raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        started = time.monotonic()
        with self._cond:
            self._waiting.append(_Waiting(item, future, loop))
            self._cond.notify()
        try:
            return await future
        finally:
            if self._observe_wait is not None:
                self._observe_wait(time.monotonic() - started)

    def complete(self, key: str, answer: dict[str, Any], record: RequestRecord) -> None:
        with self._cond:
            self._pending[key] = (key, answer, record)
            self._seq += 1
            self._seq_of[key] = self._seq
            self._order.append(key)
            self._cond.notify()

    def release(self, key: str, notification_id: str) -> None:
        with self._cond:
            self._releases.append((key, notification_id))
            self._cond.notify()

    def answer_of(self, key: str, notification_id: str | None = None) -> dict[str, Any] | None:
        with self._cond:
            found = self._pending.get(key)
        if found is None or (notification_id is not None and found[2].notification_id != notification_id):
            return None
        return found[1]

    async def caught_up(self, timeout_s: float) -> None:
        """Return once the answers completed before this call are stored, or after ``timeout_s``
        (the store not answering: the read then sees what is stored)."""
        loop = asyncio.get_running_loop()
        with self._cond:
            if not self._pending:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._catching_up.append((self._seq, future, loop))
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            with self._cond:
                self._catching_up = [w for w in self._catching_up if w[1] is not future]

    # -- the writer's thread -----------------------------------------------------------------------

    def _take(self) -> tuple[list[_Waiting], list[Completion], list[Release]] | None:
        """The next round's work, waiting for some; None when stopping with nothing left."""
        with self._cond:
            while True:
                held = bool(self._order or self._releases)
                due = time.monotonic() >= self._retry_at
                if self._waiting or (held and (due or self._stopping)):
                    break
                if self._stopping and not held:
                    return None
                self._cond.wait(max(0.01, self._retry_at - time.monotonic()) if held else 0.5)
            waiting = self._waiting[: self._max_batch]
            del self._waiting[: len(waiting)]
            keys = self._order[: self._max_batch]
            completions = [self._pending[k] for k in dict.fromkeys(keys) if k in self._pending]
            releases, self._releases = self._releases, []
            return waiting, completions, releases

    def _stored(self, completions: list[Completion]) -> None:
        with self._cond:
            for key, _, record in completions:
                held = self._pending.get(key)
                if held is not None and held[2].notification_id == record.notification_id:
                    del self._pending[key]
                    del self._seq_of[key]
            taken = {k for k, _, _ in completions}
            self._order = [k for k in self._order if k not in taken or k in self._pending]
            done: list[tuple[int, asyncio.Future[None], asyncio.AbstractEventLoop]] = []
            if self._catching_up:
                floor = min(self._seq_of.values(), default=self._seq + 1)
                done = [w for w in self._catching_up if w[0] < floor]
                self._catching_up = [w for w in self._catching_up if w[0] >= floor]
        for _, future, loop in done:
            try:
                loop.call_soon_threadsafe(_settle_none, future)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _failed(self, releases: list[Release], pause: float) -> None:
        with self._cond:
            self._releases[:0] = releases
            self._retry_at = time.monotonic() + pause

    def _run(self) -> None:
        db: Database | None = None
        pause = 0.05
        started = 0.0
        while True:
            early = started + self._round_s - time.monotonic()
            if early > 0:
                time.sleep(early)  # what comes meanwhile joins this round
            if (work := self._take()) is None:
                break
            started = time.monotonic()
            waiting, completions, releases = work
            try:
                db = db or self._opener()
                outcomes = write_batch(db, completions, releases, [w.item for w in waiting], self._terms())
            except Exception as exc:  # noqa: BLE001 - the store's failure: the requests get it, the writer goes on
                if completions or releases:
                    logger.warning("storing %d written requests failed (%s): again in %.2f s", len(completions),
                                   type(exc).__name__, pause)
                self._failed(releases, pause)
                pause = min(pause * 2, 2.0)
                _answer([(w, exc) for w in waiting])
                if self._stopping and pause >= 2.0:
                    logger.error("%d written requests were not recorded before the shutdown", len(self._order))
                    break
                continue
            pause = 0.05
            self._stored(completions)
            if waiting and self._observe_batch is not None:
                self._observe_batch(len(waiting))
            _answer(self._with_profiles(waiting, outcomes))
        if db is not None:
            db.close()

    def _with_profiles(self, waiting: list[_Waiting], outcomes: list[Reserved]
                       ) -> list[tuple[_Waiting, Reply | BaseException]]:
        """Each reservation's reply: a NEW one with what its user's profile says (a user without a
        profile, or whose profile could not be read: its key is released again)."""
        users = [w.item.user_id for w, r in zip(waiting, outcomes, strict=True) if r.outcome is Reservation.NEW]
        try:
            reaches: Mapping[str, Reach | Exception] = self._read_profiles(users) if users else {}
        except Exception as exc:  # noqa: BLE001 - the requests get the store's failure
            reaches = {user: exc for user in users}
        replies: list[tuple[_Waiting, Reply | BaseException]] = []
        for w, reserved in zip(waiting, outcomes, strict=True):
            if reserved.outcome is not Reservation.NEW:
                replies.append((w, (reserved, None)))
                continue
            reach = reaches.get(w.item.user_id) or LookupError("the user's profile was not read")
            if isinstance(reach, Exception) or not reach.exists:
                self.release(w.item.key, w.item.notification_id)
            replies.append((w, reach if isinstance(reach, Exception) else (reserved, reach)))
        return replies

    def stop(self, timeout_s: float) -> None:
        """Store what is held (up to ``timeout_s``), then stop."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)


def _settle_none(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _answer(results: list[tuple[_Waiting, Reply | BaseException]]) -> None:
    """Settle the futures, one hand-over per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Waiting, Reply | BaseException]]] = {}
    for w, result in results:
        by_loop.setdefault(w.loop, []).append((w, result))

    def settle(batch: list[tuple[_Waiting, Reply | BaseException]]) -> None:
        for w, result in batch:
            if w.future.done():
                continue
            if isinstance(result, BaseException):
                w.future.set_exception(result)
            else:
                w.future.set_result(result)

    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(settle, batch)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass
