"""The event-time dedup rule, as pure functions over one dedup key's state.

A request with key k and event time t is a duplicate when the latest accepted request for k has
event time t0 with ``|t - t0| < W0`` (W0 the window of that accepted request; the bound is
exclusive, so ``t = t0 + W0`` is new). A request is late when ``t < watermark - allowed
lateness``; late requests never reach a channel, so late data cannot reopen a closed window
(``operators.dedup`` checks lateness before the rule). State for an accepted key is kept until
the watermark passes ``t0 + W0 + allowed lateness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

MIN_WINDOW_MS = 1_000
DAY_MS = 86_400_000
NO_WATERMARK = -(2**63)  # Flink's Long.MIN_VALUE: no watermark yet


class LatePolicy(StrEnum):
    #: late requests go to the late topic and nowhere else (the default)
    SIDE_OUTPUT = "side-output"
    #: late requests are deduplicated against what state remains, best effort
    BEST_EFFORT = "best-effort"


@dataclass(frozen=True, slots=True)
class WindowConfig:
    """Options of the dedup rule.

    :param default_window_ms: window of a request without ``dedup_ttl_sec`` (7 days)
    :param max_window_ms: upper clamp of ``dedup_ttl_sec`` (30 days)
    :param allowed_lateness_ms: how far behind the watermark a request may still be on time
    :param late_policy: what happens to late requests
    """

    default_window_ms: int = 7 * DAY_MS
    max_window_ms: int = 30 * DAY_MS
    allowed_lateness_ms: int = 0
    late_policy: LatePolicy = LatePolicy.SIDE_OUTPUT


class Accepted(NamedTuple):
    """What state keeps for a dedup key: its latest accepted request (a tuple, as it is stored)."""

    notification_id: str
    event_time: int
    window_ms: int
    occurrences: int = 1


def window_ms(dedup_ttl_sec: int | None, cfg: WindowConfig) -> int:
    """``dedup_ttl_sec`` clamped to [1 s, max], or the default window."""
    if dedup_ttl_sec is None:
        return cfg.default_window_ms
    return min(max(dedup_ttl_sec * 1000, MIN_WINDOW_MS), cfg.max_window_ms)


def is_late(event_time: int, watermark: int, cfg: WindowConfig) -> bool:
    if watermark == NO_WATERMARK:
        return False
    return event_time < watermark - cfg.allowed_lateness_ms


def expiry(entry: Accepted, cfg: WindowConfig) -> int:
    """Event time after which the watermark makes this entry irrelevant: evict it then. Read by
    position: keyed state gives back the plain tuple of Accepted's fields."""
    return entry[1] + entry[2] + cfg.allowed_lateness_ms  # t0 + W0 + lateness
