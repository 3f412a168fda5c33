"""When a failed worker starts again, and when repeated fencing means another live process."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from operators.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """:param initial_ms: wait after a first failure; doubles with each further one in a row
    :param max_ms: upper bound of the wait; a run at least this long resets the doubling
    :param fences: this many fences of one producer ...
    :param fence_window_ms: ... within this span mean another live process uses its id"""

    initial_ms: int = 1_000
    max_ms: int = 30_000
    fences: int = 3
    fence_window_ms: int = 300_000

    def __post_init__(self) -> None:
        if self.initial_ms <= 0 or self.max_ms < self.initial_ms:
            raise ConfigError("restart backoff: need 0 < restart_backoff_ms <= restart_backoff_max_ms")

    def delay_ms(self, failures_in_a_row: int) -> int:
        """The wait before the next run, after ``failures_in_a_row`` (>= 1) failures."""
        exponent = min(max(failures_in_a_row, 1) - 1, 30)
        return min(self.max_ms, self.initial_ms * (1 << exponent))

    def failures_after(self, failures_in_a_row: int, ran_ms: float) -> int:
        """The count of failures in a row once a run that lasted ``ran_ms`` failed."""
        return 1 if ran_ms >= self.max_ms else failures_in_a_row + 1


class FenceWatch:
    """A producer fenced now and then is fenced by a zombie of its own process (it then fences
    it back, once). Fenced ``fences`` times within ``fence_window_ms``, it is in a fencing loop
    with another live process that uses the same transactional id."""

    def __init__(self, policy: RestartPolicy) -> None:
        self._policy = policy
        self._times: deque[float] = deque(maxlen=policy.fences)

    def fenced(self, now_ms: float) -> bool:
        """Record a fence; True when it closes a loop."""
        self._times.append(now_ms)
        return len(self._times) == self._policy.fences and now_ms - self._times[0] <= self._policy.fence_window_ms
