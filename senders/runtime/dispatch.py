"""One channel's way out: the circuit breaker picks primary or secondary, the provider's token
bucket paces the call. Shared by every worker (both lanes, retries included) of a process."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from operators.records import Channel
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
    """A token bucket behind a lock; ``acquire`` sleeps outside the lock, so callers queue fairly."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._bucket = TokenBucket(limit, clock())
        self._lock = threading.Lock()

    def acquire(self, max_wait_s: float = float("inf")) -> bool:
        """Take a token, waiting for it if it comes within ``max_wait_s``; False (nothing taken)
        when it would come later."""
        with self._lock:
            wait = self._bucket.reserve_within(self._clock(), max_wait_s)
        if wait is None:
            return False
        if wait > 0:
            time.sleep(wait)
        return True


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
    ) -> None:
        self.channel = channel
        self.primary = primary
        self.secondary = secondary
        self._limiters = {p.name: RateLimiter(limit) for p in (primary, secondary) if p is not None}
        # without a secondary the breaker moves no traffic, but still tells (the alert metric)
        self._breaker = CircuitBreaker(breaker)
        self._lock = threading.Lock()
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._publish_state(CircuitState.CLOSED, initial=True)

    @property
    def circuit(self) -> CircuitState:
        return self._breaker.state

    def send(
        self, delivery: Delivery, to: str, message: Rendered, budget_s: float = float("inf")
    ) -> AttemptResult:
        """One attempt, within ``budget_s`` (what is left of the claim's lease, less the time to
        record the outcome): no call starts that could outlive it, the rate limit's wait included.
        A half-open probe is a real message: when the probe fails, the message goes on to the
        secondary at once (time permitting), so probing costs no message an attempt."""
        deadline = time.monotonic() + budget_s
        with self._lock:
            before = self._breaker.state
            use_primary = self._breaker.use_primary(self._clock_ms())
            after = self._breaker.state
        probe = use_primary and after is CircuitState.HALF_OPEN
        if after is not before:
            self._publish_state(after)
        provider = self.primary if use_primary or self.secondary is None else self.secondary
        result = self._call(provider, delivery, to, message, deadline)
        if result.provider is None:
            return result  # no call was made: nothing to tell the breaker
        failed = _provider_failed(result)
        with self._lock:
            changed = self._breaker.record(
                success=not failed,
                now_ms=self._clock_ms(),
                primary=provider is self.primary,
                rejected=_address_key(to) if failed and result.outcome is AttemptOutcome.PERMANENT else None,
            )
        if changed is not None:
            self._publish_state(changed)
        if probe and failed and self.secondary is not None:
            failover = self._call(self.secondary, delivery, to, message, deadline)
            if failover.provider is not None:
                result = failover
        return result

    def _call(
        self, provider: Provider, delivery: Delivery, to: str, message: Rendered, deadline: float
    ) -> AttemptResult:
        spare = deadline - time.monotonic() - (provider.timeout_s or 0.0)
        if spare < 0 or not self._limiters[provider.name].acquire(spare):
            return AttemptResult(
                AttemptOutcome.TRANSIENT,
                f"no time left in the claim's lease for a call to {provider.name} (rate limit)",
            )
        try:
            receipt = provider.send(to=to, message_key=delivery.message_key, message=message)
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
