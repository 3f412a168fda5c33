"""HTTP/2 calls spread over a few connections, each carrying at most ``streams`` calls at once.

httpx (httpcore) caps one HTTP/2 connection at ``min(server's SETTINGS_MAX_CONCURRENT_STREAMS,
100)`` streams and queues every further call inside its pool rather than open another
connection while the first is alive. That queue is also its costly path: with 400 calls waiting
on one connection, a bare httpx client made 64-93 calls/s here at 2.4 ms of CPU a call, against
165/s with 50 at once (``python -m bench.push_probe --protocol httpx``). So calls never queue in
httpx: each connection is a client of its own (one connection, ``streams`` calls at most), a call
takes a free stream on the least busy one, and another connection is opened when every open one
is full, up to ``ceil(calls / streams)``.

A call that finds every stream taken waits here for one. That wait counts within the provider's
deadline (``Provider.send``): the deadline is what ``lease_ms`` is checked against, so a wait
outside it could outlive the claim. The connections are sized so that the wait only happens when
more calls are open than the workers' ``max_in_flight`` allow for, or when the server advertises
fewer streams than ``streams``; a call cut while waiting was never sent (it is retried as any
transient failure, and a repeat of it is no duplicate at the provider).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Sequence

from senders.providers.endpoint import Transport
from senders.providers.http1 import HttpReply


class _Connection:
    __slots__ = ("busy", "transport")

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.busy = 0


class StreamPool:
    """A Transport over up to ``ceil(calls / streams)`` single-connection transports, each given at
    most ``streams`` calls at once; ``make()`` makes one (a client with one connection). Belongs to
    the event loop it is used on (``h2.LoopTransport`` makes one per loop)."""

    def __init__(self, make: Callable[[], Transport], *, calls: int, streams: int) -> None:
        if calls < 1 or streams < 1:
            raise ValueError("calls and streams must be at least 1")
        self._make = make
        self._streams = streams
        self.max_connections = math.ceil(calls / streams)
        self._open: list[_Connection] = []
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def connections(self) -> int:
        """The connections opened so far."""
        return len(self._open)

    def _free(self) -> _Connection | None:
        free = [c for c in self._open if c.busy < self._streams]
        if free:
            return min(free, key=lambda c: c.busy)
        if len(self._open) < self.max_connections:
            self._open.append(_Connection(self._make()))
            return self._open[-1]
        return None

    async def _take(self) -> _Connection:
        while (found := self._free()) is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cut: the stream it was woken for goes to the next
                raise
        found.busy += 1
        return found

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def post(self, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> HttpReply:
        connection = await self._take()
        try:
            return await connection.transport.post(target, headers, body)
        finally:
            connection.busy -= 1
            self._wake()

    async def aclose(self) -> None:
        open_, self._open = self._open, []
        for connection in open_:
            await connection.transport.aclose()
