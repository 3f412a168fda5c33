"""The limits as counters: keys per local day and per recipient window, checked against a model
that admits the first ``limit`` distinct units of each counter in arrival order."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.errors import ConfigError
from senders.rules.limits import (
    CounterState,
    LimitClaim,
    check_limits,
    local_day,
    marketing_claim,
    one_time_code_claims,
)
from senders.rules.options import RuleOptions
from senders.rules.reasons import Reason

HOUR = 3_600_000
DHAKA = ZoneInfo("Asia/Dhaka")


def at(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


class Store:
    """What the status store will do in the claim transaction: read the states, record the units."""

    def __init__(self) -> None:
        self.units: dict[str, set[str]] = defaultdict(set)

    def admit(self, claims: tuple[LimitClaim, ...]) -> bool:
        counts = {c.key: CounterState(used=len(self.units[c.key]), has_unit=c.unit in self.units[c.key]) for c in claims}
        if check_limits(claims, counts) is not None:
            return False
        for c in claims:
            self.units[c.key].add(c.unit)
        return True


def first_distinct(units: list[str], limit: int) -> set[str]:
    return set(list(dict.fromkeys(units))[:limit])


# -- the daily marketing limit ---------------------------------------------------------------------


def test_the_marketing_key_is_the_users_local_day() -> None:
    opts = RuleOptions()
    late = marketing_claim("u1", "n1", DHAKA, at("2026-03-01T23:30:00+06:00"), opts)
    after_midnight = marketing_claim("u1", "n2", DHAKA, at("2026-03-02T00:10:00+06:00"), opts)
    assert late == LimitClaim(key="marketing:u1:2026-03-01", unit="n1", limit=1, reason=Reason.MARKETING_LIMIT,
                              expires_at_ms=at("2026-03-03T00:00:00+06:00"))
    assert after_midnight is not None and after_midnight.key == "marketing:u1:2026-03-02"
    # the same instant is another day in UTC: 18:10Z on 03-01
    assert local_day(ZoneInfo("UTC"), at("2026-03-02T00:10:00+06:00")) == date(2026, 3, 1)
    assert marketing_claim("u1", "n1", DHAKA, 0, RuleOptions(marketing_per_day=0)) is None


def test_one_campaign_on_three_channels_counts_once_and_a_second_is_stopped() -> None:
    store, opts, now = Store(), RuleOptions(), at("2026-03-02T10:00:00+06:00")
    claim = marketing_claim("u1", "campaign-1", DHAKA, now, opts)
    second = marketing_claim("u1", "campaign-2", DHAKA, now + HOUR, opts)
    assert claim is not None and second is not None
    assert [store.admit((claim,)) for _channel in ("push", "sms", "email")] == [True, True, True]
    assert store.admit((second,)) is False
    assert check_limits((second,), {second.key: CounterState(used=1)}) is Reason.MARKETING_LIMIT
    assert store.admit((claim,)) is True  # a retry of the first is still admitted
    tomorrow = marketing_claim("u1", "campaign-2", DHAKA, at("2026-03-03T09:00:00+06:00"), opts)
    assert tomorrow is not None and store.admit((tomorrow,)) is True
    assert {k: len(v) for k, v in store.units.items()} == {"marketing:u1:2026-03-02": 1, "marketing:u1:2026-03-03": 1}


@given(
    zone=st.sampled_from(["Asia/Dhaka", "America/New_York", "Europe/Berlin", "Pacific/Kiritimati", "Pacific/Pago_Pago"]),
    limit=st.integers(1, 3),
    events=st.lists(st.tuples(st.sampled_from(["u1", "u2"]), st.integers(0, 5), st.integers(0, 4 * 24 * 60)), max_size=40),
)
@settings(max_examples=200, deadline=None)
def test_marketing_against_the_model(zone: str, limit: int, events: list[tuple[str, int, int]]) -> None:
    z, opts, store = ZoneInfo(zone), RuleOptions(marketing_per_day=limit), Store()
    start = at("2024-10-25T00:00:00+00:00")  # across Berlin's and New York's autumn changes
    seen: dict[tuple[str, date], list[str]] = defaultdict(list)
    for user, n, minute in events:
        now = start + minute * 60_000
        nid = f"{user}-n{n}"
        claim = marketing_claim(user, nid, z, now, opts)
        assert claim is not None
        day = datetime.fromtimestamp(now / 1000, z).date()
        seen[(user, day)].append(nid)
        assert claim.key == f"marketing:{user}:{day.isoformat()}"
        assert store.admit((claim,)) == (nid in first_distinct(seen[(user, day)], limit))
        assert local_day(z, claim.expires_at_ms) > day
    assert all(len(units) <= limit for units in store.units.values())


# -- the one-time-code limit -----------------------------------------------------------------------


def test_one_time_code_keys_per_recipient_and_window() -> None:
    opts = RuleOptions()
    now = at("2026-03-02T10:59:59.999+00:00")
    claims = one_time_code_claims(["hash-a", "hash-b", "hash-a"], "k1:sms", now, opts)
    slot = at("2026-03-02T10:00:00+00:00")
    assert claims == (
        LimitClaim(key=f"otp:hash-a:{slot}", unit="k1:sms", limit=5, reason=Reason.RECIPIENT_LIMIT, expires_at_ms=slot + HOUR),
        LimitClaim(key=f"otp:hash-b:{slot}", unit="k1:sms", limit=5, reason=Reason.RECIPIENT_LIMIT, expires_at_ms=slot + HOUR),
    )
    assert one_time_code_claims(["hash-a"], "k1:sms", now + 1, opts)[0].key == f"otp:hash-a:{slot + HOUR}"
    assert one_time_code_claims(["hash-a"], "k1:sms", now, RuleOptions(one_time_codes_per_window=0)) == ()


def test_five_codes_an_hour_then_the_sixth_is_rejected() -> None:
    store, opts, now = Store(), RuleOptions(), at("2026-03-02T10:00:00+00:00")
    admitted = [store.admit(one_time_code_claims(["h"], f"k{i}:sms", now + i * 60_000, opts)) for i in range(7)]
    assert admitted == [True] * 5 + [False, False]
    assert store.admit(one_time_code_claims(["h"], "k2:sms", now + 30 * 60_000, opts)) is True  # a retry
    assert store.admit(one_time_code_claims(["other"], "k9:sms", now, opts)) is True  # another recipient
    assert store.admit(one_time_code_claims(["h"], "k7:sms", now + HOUR, opts)) is True  # the next window


def test_every_counter_must_admit() -> None:
    a = LimitClaim("a", "u", 1, Reason.RECIPIENT_LIMIT, 0)
    b = LimitClaim("b", "u", 1, Reason.RECIPIENT_LIMIT, 0)
    assert check_limits((a, b), {"b": CounterState(used=1)}) is Reason.RECIPIENT_LIMIT
    assert check_limits((a, b), {"b": CounterState(used=1, has_unit=True)}) is None
    assert check_limits((a, b), {}) is None
    assert check_limits((), {}) is None


@given(
    limit=st.integers(1, 4),
    window_ms=st.sampled_from([60_000, HOUR]),
    events=st.lists(st.tuples(st.sampled_from(["h1", "h2", "h3"]), st.integers(0, 8), st.integers(0, 3 * HOUR)), max_size=50),
)
@settings(max_examples=200, deadline=None)
def test_one_time_codes_against_the_model(limit: int, window_ms: int, events: list[tuple[str, int, int]]) -> None:
    opts, store = RuleOptions(one_time_codes_per_window=limit, one_time_code_window_ms=window_ms), Store()
    seen: dict[tuple[str, int], list[str]] = defaultdict(list)
    for recipient, k, now in events:
        key = f"m{k}:sms"
        claims = one_time_code_claims([recipient], key, now, opts)
        seen[(recipient, now // window_ms)].append(key)
        assert store.admit(claims) == (key in first_distinct(seen[(recipient, now // window_ms)], limit))
    assert all(len(units) <= limit for units in store.units.values())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"marketing_per_day": -1}, "a limit must be 0 (none) or positive"),
    ({"one_time_code_window_ms": 0}, "one_time_code_window_ms must be positive"),
    ({"preferences_retry_ms": 0}, "preferences_retry_ms must be positive"),
])
def test_bad_options(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        RuleOptions(**kwargs)
    assert str(info.value) == message
