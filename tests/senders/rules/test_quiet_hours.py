"""Quiet hours in the user's time zone, checked against a minute-by-minute model: any IANA zone,
windows across midnight, and instants and window ends right at clock changes."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, time
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from senders.rules.quiet_hours import QuietWindow

MINUTE = 60_000
ZONES = sorted(zoneinfo.available_timezones())


def at(text: str) -> int:
    """An ISO instant with its offset, as epoch ms."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def local(ms: int, zone: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).isoformat()


def window(start: str, end: str, zone: str) -> QuietWindow:
    return QuietWindow(time.fromisoformat(start), time.fromisoformat(end), ZoneInfo(zone))


# -- the model: local wall time from datetime's own fields, scanned minute by minute -------------


def model_inside(w: QuietWindow, ms: int) -> bool:
    wall = datetime.fromtimestamp(ms // 1000, w.zone).time().replace(microsecond=(ms % 1000) * 1000)
    if w.start == w.end:
        return False
    return w.start <= wall < w.end if w.start < w.end else (wall >= w.start or wall < w.end)


def model_end(w: QuietWindow, now: int) -> int:
    """The first whole UTC minute after ``now`` that is outside the window."""
    t = (now // MINUTE + 1) * MINUTE
    for _ in range(3 * 1440):
        if not model_inside(w, t):
            return t
        t += MINUTE
    raise AssertionError("the model found no end")


def check_against_model(w: QuietWindow, now: int) -> None:
    inside = model_inside(w, now)
    assert w.contains(now) is inside
    end = w.ends_at(now)
    if not inside:
        assert end is None
        return
    assert end is not None and end > now
    assert not w.contains(end) and not model_inside(w, end)
    assert end == model_end(w, now)


# -- examples --------------------------------------------------------------------------------------


def test_the_demo_user_in_dhaka() -> None:
    w = window("22:00", "08:00", "Asia/Dhaka")
    night = at("2026-03-01T23:30:00+06:00")
    assert w.contains(night)
    assert w.ends_at(night) == at("2026-03-02T08:00:00+06:00")
    early = at("2026-03-02T07:59:59.999+06:00")
    assert w.ends_at(early) == at("2026-03-02T08:00:00+06:00")
    assert not w.contains(at("2026-03-02T08:00:00+06:00")) and w.ends_at(at("2026-03-02T08:00:00+06:00")) is None
    assert w.contains(at("2026-03-01T22:00:00+06:00"))
    assert not w.contains(at("2026-03-01T21:59:59.999+06:00"))


def test_a_window_within_one_day() -> None:
    w = window("09:00", "17:30", "America/New_York")
    assert w.ends_at(at("2026-07-01T12:00:00-04:00")) == at("2026-07-01T17:30:00-04:00")
    assert not w.contains(at("2026-07-01T08:59:00-04:00")) and not w.contains(at("2026-07-01T17:30:00-04:00"))


def test_from_equal_to_is_no_window() -> None:
    w = window("08:00", "08:00", "UTC")
    assert w.empty
    assert not any(w.contains(at("2026-01-01T00:00:00+00:00") + m * MINUTE) for m in range(0, 1440, 7))
    assert w.ends_at(at("2026-01-01T08:00:00+00:00")) is None


def test_an_end_skipped_by_the_spring_change_is_the_change() -> None:
    w = window("22:00", "02:30", "Europe/Berlin")  # 2024-03-31 02:00 CET -> 03:00 CEST
    end = w.ends_at(at("2024-03-30T23:00:00+01:00"))
    assert end == at("2024-03-31T03:00:00+02:00") and local(end, "Europe/Berlin") == "2024-03-31T03:00:00+02:00"


def test_an_end_repeated_by_the_autumn_change_is_the_first_unless_now_is_in_the_repeat() -> None:
    w = window("22:00", "02:30", "Europe/Berlin")  # 2024-10-27 03:00 CEST -> 02:00 CET
    assert w.ends_at(at("2024-10-26T23:00:00+02:00")) == at("2024-10-27T02:30:00+02:00")
    assert not w.contains(at("2024-10-27T02:45:00+02:00"))
    assert w.contains(at("2024-10-27T02:10:00+01:00"))  # the repeated hour is inside again
    assert w.ends_at(at("2024-10-27T02:10:00+01:00")) == at("2024-10-27T02:30:00+01:00")


def test_the_autumn_change_can_end_a_window_by_turning_the_clock_back() -> None:
    w = window("02:30", "03:00", "Europe/Berlin")
    assert w.ends_at(at("2024-10-27T02:40:00+02:00")) == at("2024-10-27T02:00:00+01:00")


def test_a_half_hour_change_and_a_skipped_day() -> None:
    lord_howe = window("01:00", "02:15", "Australia/Lord_Howe")  # 2024-10-06 02:00 +10:30 -> 02:30 +11:00
    assert lord_howe.ends_at(at("2024-10-06T01:30:00+10:30")) == at("2024-10-06T02:30:00+11:00")
    apia = window("22:00", "08:00", "Pacific/Apia")  # 2011-12-30 never happened there
    assert apia.ends_at(at("2011-12-29T23:00:00-10:00")) == at("2011-12-31T08:00:00+14:00")


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Tehran"])
def test_every_minute_of_a_year_with_clock_changes(zone: str) -> None:
    w = window("23:00", "02:30", zone)
    start = at("2022-01-01T00:00:00+00:00")
    for now in range(start, start + 365 * 1440 * MINUTE, 97 * MINUTE + 13_001):
        check_against_model(w, now)


# -- properties ------------------------------------------------------------------------------------

hhmm = st.builds(time, st.integers(0, 23), st.integers(0, 59))
instants = st.integers(at("1980-01-01T00:00:00+00:00"), at("2060-01-01T00:00:00+00:00"))


@given(zone=st.sampled_from(ZONES), start=hhmm, end=hhmm, now=instants)
@settings(max_examples=300, deadline=None)
def test_any_zone_any_window(zone: str, start: time, end: time, now: int) -> None:
    check_against_model(QuietWindow(start, end, ZoneInfo(zone)), now)


@given(zone=st.sampled_from(ZONES), start=hhmm, end=hhmm, now=instants)
@settings(max_examples=200, deadline=None)
def test_a_deferred_message_checked_again_when_due_is_outside(zone: str, start: time, end: time, now: int) -> None:
    w = QuietWindow(start, end, ZoneInfo(zone))
    due = w.ends_at(now)
    if due is not None:
        assert not w.contains(due) and w.ends_at(due) is None


def _offset(zone: ZoneInfo, ms: int) -> int:
    offset = datetime.fromtimestamp(ms // 1000, zone).utcoffset()
    assert offset is not None
    return int(offset.total_seconds())


@cache
def clock_changes(zone_name: str, year: int) -> tuple[int, ...]:
    """The zone's clock changes in a year (to the minute), found by the test's own scan."""
    zone = ZoneInfo(zone_name)
    t = at(f"{year}-01-01T00:00:00+00:00")
    stop = at(f"{year + 1}-01-01T00:00:00+00:00")
    found = []
    while t < stop:
        step = t + 6 * 3_600_000
        if _offset(zone, step) != _offset(zone, t):
            lo, hi = t, step
            while hi - lo > MINUTE:
                mid = lo + (hi - lo) // 2 // MINUTE * MINUTE
                lo, hi = (mid, hi) if _offset(zone, mid) == _offset(zone, lo) else (lo, mid)
            found.append(hi)
        t = step
    return tuple(found)


ZONES_WITH_CHANGES = sorted(z for z in ZONES if clock_changes(z, 2024) or clock_changes(z, 1995))


@st.composite
def near_a_clock_change(draw: st.DrawFn) -> tuple[QuietWindow, int]:
    zone = draw(st.sampled_from(ZONES_WITH_CHANGES))
    changes = clock_changes(zone, draw(st.sampled_from([1995, 2024, 2031])))
    if not changes:
        changes = clock_changes(zone, 2024) or clock_changes(zone, 1995)
    change = draw(st.sampled_from(changes))
    z = ZoneInfo(zone)
    # a window ending near the change's wall times (before, at, inside the gap or fold, after)
    wall = datetime.fromtimestamp((change + draw(st.integers(-90, 90)) * MINUTE) // 1000, z)
    end = time(wall.hour, wall.minute)
    start = draw(st.one_of(hhmm, st.just(time((end.hour + 20) % 24, end.minute))))
    now = change + draw(st.integers(-26 * 60, 3 * 60)) * MINUTE + draw(st.integers(0, MINUTE - 1))
    return QuietWindow(start, end, z), now


@given(case=near_a_clock_change())
@settings(max_examples=400, deadline=None)
def test_windows_ending_at_clock_changes(case: tuple[QuietWindow, int]) -> None:
    check_against_model(*case)


def test_the_test_scan_finds_the_known_changes() -> None:
    assert clock_changes("Europe/Berlin", 2024) == (at("2024-03-31T01:00:00+00:00"), at("2024-10-27T01:00:00+00:00"))
    assert clock_changes("Asia/Dhaka", 2024) == ()
    assert datetime.fromtimestamp(clock_changes("Europe/Berlin", 2024)[0] / 1000, UTC).hour == 1
