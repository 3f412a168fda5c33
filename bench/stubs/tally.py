"""What a provider stub saw on one channel: calls, distinct message keys, repeated keys, calls in
flight (now and at the peak), calls per second, and each key's arrival time. Pure: the servers
call :meth:`Tally.arrive` when a call has arrived and :meth:`Tally.answered` once it is answered.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tally:
    """:param first: counting key -> its first arrival (epoch seconds)
    :param alias: counting key -> the message key it stands for, where they differ (SMTP counts
        the Message-ID, and the message key comes in a header of its own)
    :param repeats: (key, arrival) of every call whose key had been seen before
    :param per_second: calls that arrived in each whole second (epoch)
    :param in_flight_series: (time, calls in flight) sampled by the server every 0.1 s"""

    calls: int = 0
    no_key: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    first: dict[str, float] = field(default_factory=dict)
    alias: dict[str, str] = field(default_factory=dict)
    repeats: list[tuple[str, float]] = field(default_factory=list)
    per_second: Counter[int] = field(default_factory=Counter)
    in_flight_series: list[tuple[float, int]] = field(default_factory=list)

    def arrive(self, key: str | None, now: float, message_key: str | None = None) -> None:
        self.calls += 1
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        self.per_second[int(now)] += 1
        if not key:
            self.no_key += 1
            return
        if key in self.first:
            self.repeats.append((key, now))
            return
        self.first[key] = now
        if message_key and message_key != key:
            self.alias[key] = message_key

    def answered(self) -> None:
        self.in_flight -= 1

    def sample(self, now: float) -> None:
        if self.calls:
            self.in_flight_series.append((now, self.in_flight))

    @property
    def distinct(self) -> int:
        return len(self.first)

    def arrivals(self) -> dict[str, float]:
        """Message key -> first arrival."""
        return {self.alias.get(k, k): t for k, t in self.first.items()}

    def summary(self) -> dict[str, Any]:
        seconds = sorted(self.per_second)
        full = [self.per_second[s] for s in seconds[1:-1]]  # the first and last seconds are partial
        return {
            "calls": self.calls,
            "distinct_keys": self.distinct,
            "repeated_key_calls": len(self.repeats),
            "calls_without_key": self.no_key,
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "peak_calls_per_s": max(full or [self.per_second[s] for s in seconds] or [0]),
        }

    def dump(self) -> dict[str, Any]:
        return {"arrivals": self.arrivals(), "repeats": [(self.alias.get(k, k), t) for k, t in self.repeats],
                "in_flight_series": list(self.in_flight_series), **self.summary()}
