"""The scripted fake provider: outcomes per address, and a log of every call it received."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from operators.records import Channel
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers.base import Provider
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered


class Behaviour(StrEnum):
    OK = "ok"
    TRANSIENT = "transient"
    PERMANENT = "permanent"  # the address is invalid (deactivated)
    REJECTED = "rejected"  # permanent, not about the address (content, credentials, a wrong URL)
    SLOW = "slow"  # succeeds after ``slow_s``


@dataclass(frozen=True, slots=True)
class Received:
    """One call the fake received (whatever its outcome), with the rendered message it got."""

    provider: str
    message_key: str
    to: str = field(repr=False)
    channel: Channel
    behaviour: Behaviour
    at: float  # time.time()
    message: Rendered | None = None


class FakeProvider(Provider):
    """Answers each address from its script: the n-th call to an address gets the n-th outcome,
    the last one repeating (``["transient", "transient", "ok"]`` is a flaky gateway). Addresses
    without a script get ``default``. ``set_down(True)`` fails every call transiently (an outage).
    Each call takes ``latency_s`` (asynchronously: many are in flight at once); ``in_flight`` and
    ``peak_in_flight`` count the calls open at once.
    """

    protocol = "fake"

    def __init__(
        self,
        *,
        name: str = "fake",
        metrics: Metrics | None = None,
        script: Mapping[str, Sequence[Behaviour | str]] | None = None,
        default: Behaviour | str = Behaviour.OK,
        latency_s: float = 0.0,
        slow_s: float = 2.0,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        self._script = {addr: [Behaviour(b) for b in seq] for addr, seq in (script or {}).items()}
        self._default = Behaviour(default)
        self._latency_s = latency_s
        self._slow_s = slow_s
        self._calls: dict[str, int] = {}
        self._received: list[Received] = []
        self._lock = threading.Lock()
        self._down = False
        self._refs = itertools.count(1)
        self.in_flight = 0
        self.peak_in_flight = 0

    def set_down(self, down: bool) -> None:
        self._down = down

    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._answer(to, message_key, message)
        finally:
            self.in_flight -= 1

    async def _answer(self, to: str, message_key: str, message: Rendered) -> str | None:
        with self._lock:
            n = self._calls.get(to, 0)
            self._calls[to] = n + 1
            seq = self._script.get(to)
            behaviour = seq[min(n, len(seq) - 1)] if seq else self._default
            if self._down:
                behaviour = Behaviour.TRANSIENT
            self._received.append(
                Received(self.name, message_key, to, message.channel, behaviour, time.time(), message)
            )
            ref = f"{self.name}-{next(self._refs)}"
        if self._latency_s:
            await asyncio.sleep(self._latency_s)
        if behaviour is Behaviour.TRANSIENT:
            raise ProviderRetryableError(self.name, "scripted transient failure (503)", status_code=503)
        if behaviour is Behaviour.PERMANENT:
            raise ProviderPermanentError(
                self.name, "scripted permanent failure: recipient rejected", status_code=400
            )
        if behaviour is Behaviour.REJECTED:
            raise ProviderPermanentError(
                self.name, "scripted rejection (422): not the address", status_code=422, deactivate_address=False
            )
        if behaviour is Behaviour.SLOW:
            await asyncio.sleep(self._slow_s)
        return ref
