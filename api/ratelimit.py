"""Each caller's rates, held across all the API processes of one store: one budget for new
notifications (its ``--rate``, or ``api.default_rate_per_sec``) and one for every other ``/v1``
call (``api.calls_rate_per_sec``). Past one: 429 with Retry-After.

A budget is a number of requests per window of time (a second, or ``1/rate`` seconds for a rate
under one a second), counted in a store row per caller, budget and window. A process does not
ask the store for every request: it leases a chunk of the window's budget (one transaction) and
spends it locally; when the chunk is gone it leases another, and when the store has nothing left
for the window, the caller gets 429 until the next one. A chunk is a tenth of the budget
(``api.rate_lease_fraction``) and at most a quarter of what is left, so chunks shrink as the
window's budget runs out.

A busy caller's requests do not wait for those transactions: for a budget of at least
``LEASE_AHEAD_BUDGET`` a window, a process leases its next chunk while it still spends the one
it has (when a quarter of it is left), and in a window's second half it leases its first chunk of
the next window. Only a process that runs out before its lease is back, or a caller's first
request in a window no chunk was leased ahead for, waits for the store. A lease is one write
transaction, on a thread of its own (``Services.budgets``); on SQLite the budgets are in the
requests file (``api.database``), whose writers are the API's processes alone. In the store's own
file a lease waited for the senders' write lock: beside the whole pipeline at 2,000 requests/s
the API's store calls (the leases among them) took p99 95-903 ms, and a window's first lease
taken ahead, when it was not back within the half window it has, held up the process's requests;
with the budgets in the requests file 8.5-115 ms in 19 runs and 185 in one
(bench/results/slo-2026-12-06-s39-*).

The bound: across all processes a caller is never admitted more than its budget in a window (the
store grants no more); it may be admitted less when a process holds an unspent chunk at the
window's end: at most one chunk per process (a quarter of what was left when it was leased; a
chunk leased ahead for a window the caller then sends nothing more to this process in is one).
Windows start on the wall clock's whole seconds: processes on several hosts need clocks that
agree to well within a second. Fixed windows allow a burst of up to twice the budget across a
window's boundary, as a token bucket whose size is the rate does.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from senders.store.db import Database


@dataclass(frozen=True, slots=True)
class Window:
    start_ms: int
    length_ms: int
    budget: int


def window_of(rate: float, now_ms: int) -> Window:
    """The window ``now_ms`` falls in, for ``rate`` requests per second."""
    length = 1000 if rate >= 1 else math.ceil(1000 / rate)
    return Window(now_ms - now_ms % length, length, max(1, math.floor(rate * length / 1000)))


def chunk(budget: int, left: int, fraction: float) -> int:
    """How much of what is ``left`` of a window's ``budget`` one lease takes."""
    if left <= 0:
        return 0
    return max(1, min(math.ceil(budget * fraction), math.ceil(left / 4), left))


def retry_after(window: Window, now_ms: int) -> int:
    """Seconds until the next window (at least 1)."""
    return max(1, math.ceil((window.start_ms + window.length_ms - now_ms) / 1000))


def lease_budget(db: Database, caller: str, bucket: str, window: Window, fraction: float) -> int:
    """Take a chunk of the window's budget from the store (one transaction); 0: none left."""
    with db.tx() as cur:
        db.exec(
            cur,
            "INSERT INTO api_rate_budget (caller, bucket, window_ms, granted) VALUES (?, ?, ?, 0)"
            " ON CONFLICT (caller, bucket, window_ms) DO NOTHING",
            (caller, bucket, window.start_ms),
        )
        granted = int(db.exec(
            cur,
            f"SELECT granted FROM api_rate_budget WHERE caller = ? AND bucket = ? AND window_ms = ?{db.for_update}",
            (caller, bucket, window.start_ms),
        ).fetchone()[0])
        grant = chunk(window.budget, window.budget - granted, fraction)
        if grant:
            db.exec(
                cur,
                "UPDATE api_rate_budget SET granted = granted + ? WHERE caller = ? AND bucket = ? AND window_ms = ?",
                (grant, caller, bucket, window.start_ms),
            )
        return grant


@dataclass(slots=True)
class _Held:
    """What this process holds of a caller's budget in one window."""

    window: Window
    left: int = 0
    exhausted: bool = False
    leasing: asyncio.Future[None] | None = None
    low_water: int = 0  # a lease ahead starts when no more than this is left
    ahead: _Held | None = None  # the next window's, leased ahead


StoreRun = Callable[[Callable[[Database], int]], Awaitable[int]]

#: the least budget a window whose chunks are leased ahead (a smaller one is a chunk or a few, and
#: a chunk leased ahead there would be much of the window's budget held by one process)
LEASE_AHEAD_BUDGET = 100


class CallerLimits:
    """:param run: runs a store call in a store thread (``StorePool.run``)
    :param fraction: a chunk's share of a window's budget
    :param on_lease: told the bucket of each lease taken from the store
    """

    def __init__(
        self,
        run: StoreRun,
        fraction: float = 0.1,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        on_lease: Callable[[str], None] | None = None,
    ) -> None:
        self._run = run
        self._fraction = fraction
        self._clock_ms = clock_ms
        self._on_lease = on_lease
        self._held: dict[tuple[str, str], _Held] = {}

    async def admit(self, caller: str, rate: float, bucket: str) -> int | None:
        """None: admitted (one request of the caller's budget spent); else the seconds to wait
        (Retry-After). Raises what the store raised when a chunk could not be leased."""
        key = (caller, bucket)
        while True:
            now = self._clock_ms()
            window = window_of(rate, now)
            held = self._held.get(key)
            if held is None or held.window != window:
                ahead = held.ahead if held is not None else None
                held = self._held[key] = ahead if ahead is not None and ahead.window == window else _Held(window)
            if held.left > 0:
                held.left -= 1
                if window.budget >= LEASE_AHEAD_BUDGET:
                    self._lease_ahead(held, caller, rate, bucket, now)
                return None
            if held.exhausted:
                return retry_after(window, now)
            if held.leasing is None:
                held.leasing = asyncio.ensure_future(self._lease(held, caller, bucket))
            await asyncio.shield(held.leasing)

    def _lease_ahead(self, held: _Held, caller: str, rate: float, bucket: str, now: int) -> None:
        """Lease in the background: the window's next chunk when little is left of this one, and
        the next window's first chunk once this window is half over."""
        if held.leasing is None and not held.exhausted and held.left <= held.low_water:
            held.leasing = _background(self._lease(held, caller, bucket))
        window = held.window
        if held.ahead is None and now >= window.start_ms + window.length_ms // 2:
            held.ahead = _Held(window_of(rate, window.start_ms + window.length_ms))
            held.ahead.leasing = _background(self._lease(held.ahead, caller, bucket))

    async def _lease(self, held: _Held, caller: str, bucket: str) -> None:
        window, fraction = held.window, self._fraction
        try:
            granted = await self._run(lambda db: lease_budget(db, caller, bucket, window, fraction))
        finally:
            held.leasing = None
        if self._on_lease is not None:
            self._on_lease(bucket)
        held.left += granted
        held.low_water = granted // 4
        held.exhausted = granted == 0


def _background(lease: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
    """A lease nobody waits for yet: a failure is the next waiter's, or dropped (and taken again
    when a request needs it)."""
    task = asyncio.ensure_future(lease)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task
