"""One deadline per send. Socket timeouts bound each read or write, not a whole exchange: a server
that answers a byte at a time keeps every read under the timeout for as long as it likes. A
watchdog thread shuts the socket down when the send's deadline passes, so the blocked call returns
at once, whatever the protocol is doing."""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Watchdog:
    """Runs each armed action at its time (``time.monotonic()``), unless disarmed first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._live: set[int] = set()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, at: float, action: Callable[[], None]) -> Callable[[], None]:
        with self._cond:
            n = next(self._ids)
            heapq.heappush(self._heap, (at, n, action))
            self._live.add(n)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="send-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

        def disarm() -> None:
            with self._cond:
                self._live.discard(n)

        return disarm

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                at, n, action = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                self._live.discard(n)
            try:
                action()
            except Exception:  # noqa: BLE001 - an action must not stop the watchdog
                pass


WATCHDOG = Watchdog()


def cut(sock: socket.socket | None) -> None:
    """Shut a socket down under a thread blocked on it (plain or TLS: the file descriptor's own
    shutdown, not the TLS layer's), so that its call fails at once."""
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class Deadline:
    """``passed``: the deadline came within the block; whatever was read after it (a reply cut
    short may even parse) is not to be trusted."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.cut = False

    @property
    def passed(self) -> bool:
        return self.cut or time.monotonic() >= self.at


@contextmanager
def deadline(timeout_s: float, sockets: Callable[[], socket.socket | None]) -> Iterator[Deadline]:
    """Within the block, the socket that ``sockets()`` names at the deadline is cut."""
    d = Deadline(time.monotonic() + timeout_s)

    def expire() -> None:
        d.cut = True
        cut(sockets())

    disarm = WATCHDOG.arm(d.at, expire)
    try:
        yield d
    finally:
        disarm()
