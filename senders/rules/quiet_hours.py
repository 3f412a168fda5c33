"""Quiet hours: a daily window of local wall-clock time in the user's time zone.

An instant is inside the window when its local time of day (in ``zone``, by ``zoneinfo``) is at
or after ``start`` and before ``end``; ``start`` after ``end`` spans midnight (22:00 to 08:00),
``start`` equal to ``end`` is no window at all. Instants are UTC epoch milliseconds.

``ends_at`` is the first instant after ``now`` that is not inside: where the local time reaches
``end``, or where a clock change moves it out of the window. So it is one well-defined instant
whatever the clocks do that night: an ``end`` that does not exist that day (skipped by a spring
change) gives the instant of the change; an ``end`` that happens twice (an autumn change) gives
the first one, unless ``now`` is already in the repeated hour; a change that jumps back into
the window extends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

DAY_MS = 86_400_000
_MS = timedelta(milliseconds=1)
_SAMPLE_MS = 30 * 60_000  # clock changes are found by sampling the offset at this step
_MAX_SEGMENTS = 16


def _ms_of_day(t: time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1000 + t.microsecond // 1000


def utc_offset_ms(zone: ZoneInfo, instant_ms: int) -> int:
    """The zone's offset from UTC at an instant."""
    offset = datetime.fromtimestamp(instant_ms // 1000, tz=zone).utcoffset()
    return 0 if offset is None else offset // _MS


def local_ms_of_day(zone: ZoneInfo, instant_ms: int) -> int:
    """Milliseconds since local midnight at an instant."""
    return (instant_ms + utc_offset_ms(zone, instant_ms)) % DAY_MS


def _next_change(zone: ZoneInfo, after_ms: int, until_ms: int) -> int | None:
    """The first instant in (after_ms, until_ms] with another offset than at after_ms."""
    offset = utc_offset_ms(zone, after_ms)
    lo = after_ms
    while lo < until_ms:
        hi = min(lo + _SAMPLE_MS, until_ms)
        if utc_offset_ms(zone, hi) != offset:
            while hi - lo > 1:  # offset(lo) is the old one, offset(hi) a new one
                mid = (lo + hi) // 2
                if utc_offset_ms(zone, mid) == offset:
                    lo = mid
                else:
                    hi = mid
            return hi
        lo = hi
    return None


@dataclass(frozen=True, slots=True)
class QuietWindow:
    """Quiet hours from ``start`` to ``end`` local time in ``zone``."""

    start: time
    end: time
    zone: ZoneInfo

    @property
    def empty(self) -> bool:
        return self.start == self.end

    def contains(self, now_ms: int) -> bool:
        """Whether the instant is inside the window."""
        if self.empty:
            return False
        start, end, tod = _ms_of_day(self.start), _ms_of_day(self.end), local_ms_of_day(self.zone, now_ms)
        return start <= tod < end if start < end else (tod >= start or tod < end)

    def ends_at(self, now_ms: int) -> int | None:
        """The first instant after ``now_ms`` outside the window; None when ``now_ms`` is outside."""
        if not self.contains(now_ms):
            return None
        end = _ms_of_day(self.end)
        t = now_ms
        for _ in range(_MAX_SEGMENTS):
            # while the offset stays, the local time runs with UTC and leaves the window at ``end``
            candidate = t + (end - local_ms_of_day(self.zone, t)) % DAY_MS
            change = _next_change(self.zone, t, candidate)
            if change is None:
                return candidate
            t = change
            if not self.contains(t):
                return t
        raise AssertionError("quiet hours do not end: more clock changes than a day can hold")
