"""One channel's way out: the circuit breaker picks primary or secondary, the provider's token
bucket paces the calls' starts. Shared by every worker (both lanes, retries included) of a
process, on its event loop: many calls are in flight at once, so the bucket paces starts (a
call waits for its token, no burst beyond the bucket), the breaker takes each outcome as it
comes, and a half-open probe is exactly one call. A provider with a ``capacity`` (an SMTP
relay's sessions) is promised no more messages than it can carry at once, so none waits for a
session inside its deadline; the priority lane gets the next free one."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from operators.records import Channel
from operators.tracing import (
    ATTEMPT,
    CHANNEL,
    LANE,
    MESSAGE_KEY,
    NOTIFICATION_ID,
    OFF,
    OUTCOME,
    PROVIDER,
    AttributeValue,
    Tracing,
)
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy.breaker import BreakerOptions, CircuitBreaker
from senders.policy.bucket import RateLimit, TokenBucket
from senders.policy.retry import retry_after_ms
from senders.policy.transitions import AttemptResult
from senders.providers.base import Provider
from senders.records import Delivery
from senders.runtime.metrics import Metrics
from senders.statuses import AttemptOutcome, CircuitState
from senders.templates.render import Rendered

logger = logging.getLogger(__name__)

#: how long the priority lane's unmet claim for a provider's seats holds seats back from the
#: normal lane (its claimer asks again every few milliseconds while it waits)
FIRST_CLAIM_S = 0.1

_CIRCUIT_GAUGE = {CircuitState.CLOSED: 0.0, CircuitState.HALF_OPEN: 1.0, CircuitState.OPEN: 2.0}


def _provider_failed(result: AttemptResult) -> bool:
    """A failure of the provider, not of the address: transient, or permanent but not an
    explicit "invalid recipient"."""
    if result.outcome is AttemptOutcome.TRANSIENT:
        return True
    return result.outcome is AttemptOutcome.PERMANENT and not result.deactivate_address


def _address_key(address: str) -> str:
    """Tells addresses apart in the breaker's window without keeping them."""
    return hashlib.sha256(address.encode()).hexdigest()[:16]


class RateLimiter:
    """A token bucket on the event loop: ``acquire`` reserves the next token and sleeps until it
    is due, so calls start in turn however many wait."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._limit = limit
        self._bucket = TokenBucket(limit, clock())

    def reserve(self, max_wait_s: float = float("inf")) -> float | None:
        """Take a token now if it comes within ``max_wait_s``: the seconds until it is due, or
        None (nothing taken) when it would come later."""
        return self._bucket.reserve_within(self._clock(), max_wait_s)

    async def acquire(self, max_wait_s: float = float("inf")) -> bool:
        """Take a token, waiting for it if it comes within ``max_wait_s``; False (nothing taken)
        when it would come later."""
        wait = self.reserve(max_wait_s)
        if wait is None:
            return False
        if wait > 0:
            await asyncio.sleep(wait)
        return True

    def startable(self, within_s: float) -> int:
        """How many more calls could start within ``within_s`` (the reserved ones taken)."""
        tokens = self._bucket.available(self._clock()) + self._limit.per_second * max(0.0, within_s)
        return max(0, math.floor(tokens))


class Dispatcher:
    """Sends a delivery through the primary, or the secondary while the primary's circuit is open."""

    def __init__(
        self,
        *,
        channel: Channel,
        primary: Provider,
        secondary: Provider | None,
        limit: RateLimit,
        breaker: BreakerOptions,
        metrics: Metrics,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        tracing: Tracing = OFF,
    ) -> None:
        self.channel = channel
        self._tracing = tracing
        self.primary = primary
        self.secondary = secondary
        self._limiters = {p.name: RateLimiter(limit) for p in (primary, secondary) if p is not None}
        # without a secondary the breaker moves no traffic, but still tells (the alert metric)
        self._breaker = CircuitBreaker(breaker)
        self._waiters: list[asyncio.Future[None]] = []  # waiting for the primary's next outcome
        self._primary_open = 0  # calls open to the primary
        self._promised = 0  # messages claimed to be sent that have not reserved their token yet
        self._seated = 0  # messages promised a call that has not ended yet (``capacity``)
        self._first_wants = 0  # seats the priority lane asked for and did not get ...
        self._first_asked = 0.0  # ... as of then (monotonic)
        self._seat_freed = asyncio.Event()
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._publish_state(CircuitState.CLOSED, initial=True)

    @property
    def circuit(self) -> CircuitState:
        return self._breaker.state

    def _next_provider(self) -> Provider:
        """Where a call would go now (without starting a probe)."""
        if self._breaker.state is CircuitState.CLOSED or self.secondary is None:
            return self.primary
        return self.secondary

    def promise(self, n: int, within_s: float, *, first: bool = False) -> int:
        """Promise up to ``n`` calls that can start within ``within_s`` (a worker claims that
        many messages) and that the provider can carry at once (its ``capacity``, counting the
        calls promised before whose ``send`` has not returned); returns how many. Each
        ``send(promised=True)`` keeps one promise, and ``release`` gives back those not kept
        (messages the rules did not send). ``first``: the priority lane, whose claims are not
        held back by the normal lane's promises, and whose unmet claim for seats keeps the next
        free ones from the normal lane."""
        provider = self._next_provider()
        limiter = self._limiters[provider.name]
        # ``first`` (the priority lane): others' promises do not hold it back
        granted = max(0, min(n, limiter.startable(within_s) - (0 if first else self._promised)))
        if provider.capacity is not None:
            now = time.monotonic()
            held = 0 if first or now - self._first_asked > FIRST_CLAIM_S else self._first_wants
            seats = max(0, provider.capacity - self._seated - held)
            if first:
                self._first_wants, self._first_asked = max(0, min(n, granted) - seats), now
            granted = min(granted, seats)
        self._promised += granted
        self._seated += granted
        return granted

    def release(self, n: int) -> None:
        """Gives back ``n`` promises that no ``send`` will keep."""
        self._promised = max(0, self._promised - n)
        self._free_seats(n)

    def _free_seats(self, n: int) -> None:
        if n > 0:
            self._seated = max(0, self._seated - n)
            self._seat_freed.set()

    async def room(self, within_s: float) -> None:
        """What a claimer that was promised nothing waits for before it asks again: while the
        provider's seats are all taken, until a promised call ends (at most ``within_s``);
        otherwise (the bucket is empty) ``within_s``."""
        capacity = self._next_provider().capacity
        if capacity is None or self._seated < capacity:
            await asyncio.sleep(within_s)
            return
        self._seat_freed.clear()
        try:
            await asyncio.wait_for(self._seat_freed.wait(), within_s)
        except TimeoutError:
            pass

    async def send(
        self,
        delivery: Delivery,
        to: str,
        message: Rendered,
        budget_s: float = float("inf"),
        *,
        promised: bool = False,
    ) -> AttemptResult:
        """One attempt (see ``_seated_send``); with traces on and a message that carries a trace context,
        in a span of the message's trace (its provider calls are its children)."""
        if not self._tracing.follows(delivery.traceparent):  # off, untraced, or a trace not kept
            return await self._seated_send(delivery, to, message, budget_s, promised=promised)
        attributes: dict[str, AttributeValue] = {
            MESSAGE_KEY: delivery.message_key, NOTIFICATION_ID: delivery.notification_id,
            CHANNEL: self.channel.value, LANE: delivery.lane.value, ATTEMPT: delivery.attempt,
        }
        with self._tracing.span(f"send {self.channel.value}", parent=delivery.traceparent,
                                attributes=attributes) as span:
            assert span is not None
            result = await self._seated_send(delivery, to, message, budget_s, promised=promised)
            span.set_attribute(OUTCOME, result.outcome.value)
            if result.provider is not None:
                span.set_attribute(PROVIDER, result.provider)
            return result

    async def _seated_send(
        self,
        delivery: Delivery,
        to: str,
        message: Rendered,
        budget_s: float = float("inf"),
        *,
        promised: bool = False,
    ) -> AttemptResult:
        """One attempt, within ``budget_s`` (what is left of the claim's lease, less the time to
        record the outcome): no call starts that could outlive it, the rate limit's wait included.
        A half-open probe is a real message, and the only call to the primary until its outcome:
        others go to the secondary, or wait for the probe when there is none. When the probe
        fails, its message goes on to the secondary at once (time permitting), so probing costs
        no message an attempt. Until the breaker has ``min_calls`` outcomes of the primary (at
        the start, after the circuit closed), no more calls than that are open to it.
        A promised call's seat (``capacity``) is free again once it returns."""
        try:
            return await self._attempt(delivery, to, message, budget_s, promised=promised)
        finally:
            if promised:
                self._free_seats(1)

    async def _attempt(
        self, delivery: Delivery, to: str, message: Rendered, budget_s: float, *, promised: bool
    ) -> AttemptResult:
        deadline = time.monotonic() + budget_s
        while True:
            before = self._breaker.state
            use_primary = self._breaker.use_primary(self._clock_ms())
            after = self._breaker.state
            if after is not before:
                self._publish_state(after)
            probing_elsewhere = not use_primary and self.secondary is None and after is CircuitState.HALF_OPEN
            warming = self._breaker.warming() if use_primary else None
            if not probing_elsewhere and (warming is None or self._primary_open < warming):
                break
            # the probe is out (and no secondary), or the breaker waits for its first outcomes
            if not await self._await_outcome(deadline - time.monotonic()):
                if promised:
                    self._promised = max(0, self._promised - 1)  # no token will be taken
                return AttemptResult(
                    AttemptOutcome.TRANSIENT,
                    f"no time left in the claim's lease for a call to {self.primary.name} (its circuit breaker)",
                )
        probe = use_primary and after is CircuitState.HALF_OPEN
        provider = self.primary if use_primary or self.secondary is None else self.secondary
        to_primary = provider is self.primary
        self._primary_open += to_primary
        try:
            result = await self._call(provider, delivery, to, message, deadline, promised=promised)
        except BaseException:  # cancelled (its worker stops): the next call probes
            if probe:
                self._breaker.abandon_probe()
            raise
        finally:
            self._primary_open -= to_primary
            if to_primary:
                self._wake_waiters()
        if result.provider is None:
            if probe:
                self._breaker.abandon_probe()
            return result  # no call was made: nothing to tell the breaker
        failed = _provider_failed(result)
        changed = self._breaker.record(
            success=not failed,
            now_ms=self._clock_ms(),
            primary=provider is self.primary,
            rejected=_address_key(to) if failed and result.outcome is AttemptOutcome.PERMANENT else None,
            probe=probe,
        )
        if changed is not None:
            self._publish_state(changed)
        if to_primary:
            self._wake_waiters()
        if probe and failed and self.secondary is not None:
            failover = await self._call(self.secondary, delivery, to, message, deadline)
            if failover.provider is not None:
                result = failover
        return result

    async def _await_outcome(self, within_s: float) -> bool:
        """Wait for the primary's next outcome; False when it does not come within ``within_s``."""
        if within_s <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), within_s)
            return True
        except TimeoutError:
            return False
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _call(
        self,
        provider: Provider,
        delivery: Delivery,
        to: str,
        message: Rendered,
        deadline: float,
        *,
        promised: bool = False,
    ) -> AttemptResult:
        """``promised``: the call keeps a promise (``promise``), kept once it has its token (or
        has none to wait for)."""
        spare = deadline - time.monotonic() - (provider.timeout_s or 0.0)
        wait = self._limiters[provider.name].reserve(spare) if spare >= 0 else None
        if promised:
            self._promised = max(0, self._promised - 1)  # its token is reserved, or none will come in time
        if wait is not None and wait > 0:
            await asyncio.sleep(wait)
        if wait is None:
            return AttemptResult(
                AttemptOutcome.TRANSIENT,
                f"no time left in the claim's lease for a call to {provider.name} (rate limit)",
            )
        if not self._tracing.follows(delivery.traceparent):
            return await self._provider_call(provider, delivery, to, message)
        attributes: dict[str, AttributeValue] = {
            MESSAGE_KEY: delivery.message_key, PROVIDER: provider.name, CHANNEL: self.channel.value,
        }
        with self._tracing.child(f"{provider.name} call", kind="client", attributes=attributes) as span:
            assert span is not None
            result = await self._provider_call(provider, delivery, to, message)
            span.set_attribute(OUTCOME, result.outcome.value)
            return result

    async def _provider_call(self, provider: Provider, delivery: Delivery, to: str, message: Rendered) -> AttemptResult:
        """One call of ``provider``: its outcome as an AttemptResult."""
        try:
            receipt = await provider.send(to=to, message_key=delivery.message_key, message=message)
            return AttemptResult(AttemptOutcome.SENT, provider=provider.name, reference=receipt.reference)
        except ProviderRetryableError as exc:
            return AttemptResult(
                AttemptOutcome.TRANSIENT, exc.reason, retry_after_ms(exc.retry_after_s), provider=provider.name
            )
        except ProviderPermanentError as exc:
            return AttemptResult(
                AttemptOutcome.PERMANENT,
                exc.reason,
                deactivate_address=exc.deactivate_address,
                provider=provider.name,
            )

    async def aclose(self) -> None:
        for provider in (self.primary, self.secondary):
            if provider is not None:
                await provider.aclose()

    def _publish_state(self, state: CircuitState, *, initial: bool = False) -> None:
        labels: dict[str, Any] = {"channel": self.channel.value, "provider": self.primary.name}
        self._metrics.set("sender_circuit_state", _CIRCUIT_GAUGE[state], **labels)
        self._metrics.set("sender_provider_rejecting", 1.0 if self._breaker.rejecting else 0.0, **labels)
        if initial:
            return
        if self.secondary is None:
            target = f"{self.primary.name} (no secondary)"
        else:
            target = self.secondary.name if state is CircuitState.OPEN else self.primary.name
        why = " (it rejects messages to many addresses: check its URL and credentials)"
        logger.warning(
            "%s circuit of %s is %s%s: traffic goes to %s",
            self.channel,
            self.primary.name,
            state,
            why if self._breaker.rejecting else "",
            target,
            extra={"provider": self.primary.name},
        )
        self._metrics.inc("sender_circuit_changes_total", to=state.value, **labels)
