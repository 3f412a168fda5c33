"""The deadlines of a provider's calls on one timer: ``asyncio.timeout``'s meaning (the call's task
is cancelled at its deadline and the caller sees ``TimeoutError``), without a timer armed and
cancelled per call. With a thousand calls open, ``asyncio.timeout`` cost ~4 us a call on uvloop
(its ``Timeout`` object, ``loop.call_at``, the cancel); here a call's deadline is an entry in a
heap and one timer waits for the soonest. A call's deadlines are of one length (the provider's
``timeout_s``), so the soonest is the oldest call's, and entries of finished calls are dropped
from the front as new ones come.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from types import TracebackType


class _Deadline:
    __slots__ = ("at", "cancelling", "done", "expired", "task")

    def __init__(self, at: float, task: asyncio.Task[object]) -> None:
        self.at = at
        self.task = task
        self.cancelling = task.cancelling()
        self.expired = False
        self.done = False

    async def __aenter__(self) -> _Deadline:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.done = True
        # as asyncio.timeout: our cancel is taken back, and reported as TimeoutError unless the
        # task was also cancelled from outside
        if self.expired and self.task.uncancel() <= self.cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


class Deadlines:
    """``within(seconds)``: an async context manager cutting the current task at that deadline."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def within(self, seconds: float) -> _Deadline:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a task")
        if loop is not self._loop:  # a new loop (a test's): the old one's entries are gone with it
            self._heap, self._loop, self._timer, self._timer_at = [], loop, None, float("inf")
        heap = self._heap
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        entry = _Deadline(loop.time() + seconds, task)
        heapq.heappush(heap, (entry.at, next(self._seq), entry))
        if entry.at < self._timer_at:
            self._arm(loop, entry.at)
        return entry

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(at, self._fire), at

    def _fire(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        loop, heap = self._loop, self._heap
        assert loop is not None
        now = loop.time()
        while heap:
            at, _, entry = heap[0]
            if entry.done:
                heapq.heappop(heap)
            elif at <= now:
                heapq.heappop(heap)
                entry.expired = True
                entry.task.cancel()
            else:
                self._arm(loop, at)
                return
