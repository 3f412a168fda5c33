"""A circuit breaker on the primary provider's recent failure rate (clock passed in, no threads)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from operators.errors import ConfigError
from senders.statuses import CircuitState


@dataclass(frozen=True, slots=True)
class BreakerOptions:
    """When traffic moves from a channel's primary provider to its secondary, and back.

    :param window: the primary's most recent outcomes the failure rate is computed over
    :param min_calls: no decision before this many outcomes are in the window
    :param failure_rate: the circuit opens when this fraction of the window failed
    :param open_ms: how long the secondary takes the traffic before the primary is probed again
    """

    window: int = 20
    min_calls: int = 5
    failure_rate: float = 0.5
    open_ms: int = 30_000

    def __post_init__(self) -> None:
        if not 1 <= self.min_calls <= self.window:
            raise ConfigError("breaker min_calls must be within [1, window]")
        if not 0.0 < self.failure_rate <= 1.0:
            raise ConfigError("breaker failure_rate must be within (0, 1]")
        if self.open_ms <= 0:
            raise ConfigError("breaker open_ms must be positive")


class CircuitBreaker:
    """Closed: the primary takes every call. Open: the secondary does, for ``open_ms``. Then
    half-open: one probe call goes to the primary; its success closes the circuit, its failure
    opens it again.

    Failures are transient ones and permanent ones that are not about the address (a wrong URL's
    404 for every message is the provider's fault); those count once per address in the window,
    so one address rejected again and again says nothing of the provider. An explicit "invalid
    recipient" is a success: the provider works. ``rejecting`` says the circuit opened on
    permanent failures that spanned at least ``min_calls`` addresses: an alert, since they were
    dead-lettered, not retried.
    """

    def __init__(self, options: BreakerOptions) -> None:
        self.options = options
        self._state = CircuitState.CLOSED
        # (success, the address key of a permanent failure not about the address)
        self._outcomes: deque[tuple[bool, str | None]] = deque(maxlen=options.window)
        self._opened_at = 0
        self._probing = False
        self.rejecting = False

    @property
    def state(self) -> CircuitState:
        return self._state

    def warming(self) -> int | None:
        """While closed with fewer than ``min_calls`` outcomes in the window (at the start, and
        after the circuit closed), how many more calls may be open to the primary beyond those
        whose outcomes are in (the caller counts its open calls against it): so a provider that
        rejects every message costs ``min_calls`` messages, not every call in flight. None: no
        limit."""
        if self._state is not CircuitState.CLOSED or len(self._outcomes) >= self.options.min_calls:
            return None
        return self.options.min_calls - len(self._outcomes)

    def use_primary(self, now_ms: int) -> bool:
        """Whether the next call goes to the primary (may start a half-open probe)."""
        if self._state is CircuitState.CLOSED:
            return True
        if self._state is CircuitState.OPEN and now_ms - self._opened_at >= self.options.open_ms:
            self._state = CircuitState.HALF_OPEN
            self._probing = False
        if self._state is CircuitState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def abandon_probe(self) -> None:
        """The probe ended without an outcome (its worker stopped): the next call probes."""
        self._probing = False

    def record(
        self,
        *,
        success: bool,
        now_ms: int,
        primary: bool = True,
        rejected: str | None = None,
        probe: bool | None = None,
    ) -> CircuitState | None:
        """The outcome of a call; ``rejected``: the key of the address whose message the provider
        rejected permanently, for a reason not about the address; ``probe``: whether this call was
        the half-open probe (False: a call to the primary that started before the circuit
        opened, whose outcome says nothing of the primary now; None: one call at a time, so any
        call in half-open is the probe). Returns the new state when it changed."""
        if not primary:
            return None
        if self._state is CircuitState.HALF_OPEN and probe is False:
            return None
        if self._state is CircuitState.HALF_OPEN:
            self._probing = False
            if success:
                self._state = CircuitState.CLOSED
                self._outcomes.clear()
                self.rejecting = False
            else:
                self._open(now_ms)
            return self._state
        if self._state is CircuitState.OPEN:
            return None  # a call that started before the circuit opened
        if rejected is not None and rejected in self._rejected():
            return None  # counted once per address
        self._outcomes.append((success, rejected))
        failures = sum(1 for ok, _ in self._outcomes if not ok)
        if len(self._outcomes) >= self.options.min_calls and failures >= self.options.failure_rate * len(
            self._outcomes
        ):
            self._open(now_ms)
            return self._state
        return None

    def _rejected(self) -> set[str]:
        return {key for _, key in self._outcomes if key is not None}

    def _open(self, now_ms: int) -> None:
        self.rejecting = self.rejecting or len(self._rejected()) >= self.options.min_calls
        self._state = CircuitState.OPEN
        self._opened_at = now_ms
        self._outcomes.clear()

    def failure_rate(self) -> float:
        return sum(1 for ok, _ in self._outcomes if not ok) / len(self._outcomes) if self._outcomes else 0.0
