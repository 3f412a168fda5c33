"""The two limits as counters the store keeps: which counters a message consumes, and whether
their counts still admit it.

A counter is a set of units under a key; its count is the number of distinct units. A message
names the unit it adds, so counting it again (a retry, a replay after a crash, a redelivered
record) finds its unit already there and changes nothing: the store records the units of an
admitted message in the transaction of its claim, and the count is exact once per message.

* Marketing: at most ``marketing_per_day`` marketing notifications per user per local day (the
  day in the user's time zone at send time). The unit is the notification id, so a campaign on
  push, SMS and email is one marketing notification, not three.
* One-time codes: at most ``one_time_codes_per_window`` codes per recipient (an address, named by
  its lookup hash, never by the address itself) per window of ``one_time_code_window_ms``,
  windows fixed since the epoch (a burst across a window's edge gets at most twice the limit).
  The unit is the message key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from senders.rules.options import RuleOptions
from senders.rules.reasons import Reason


@dataclass(frozen=True, slots=True)
class LimitClaim:
    """One counter a message consumes.

    :param key: the counter: ``marketing:<user_id>:<local date>`` or
        ``otp:<recipient hash>:<window start ms>``
    :param unit: what is counted once under the key (a notification id, a message key)
    :param limit: distinct units the counter admits
    :param reason: the rejection when it is full
    :param expires_at_ms: the counter is not consulted after this; the store may then drop it
    """

    key: str
    unit: str
    limit: int
    reason: Reason
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class CounterState:
    """What the store holds under a key.

    :param used: distinct units recorded
    :param has_unit: the message's own unit is one of them
    """

    used: int = 0
    has_unit: bool = False


MARKETING_PREFIX = "marketing:"
ONE_TIME_CODE_PREFIX = "otp:"
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DIGITS = re.compile(r"\d+")


def marketing_key(user_id: str, day: date) -> str:
    return f"{MARKETING_PREFIX}{user_id}:{day.isoformat()}"


def one_time_code_key(recipient: str, window_start_ms: int) -> str:
    return f"{ONE_TIME_CODE_PREFIX}{recipient}:{window_start_ms}"


def is_users_counter(key: str, user_id: str) -> bool:
    """Whether ``key`` is one of ``user_id``'s own marketing counters: exactly
    ``marketing:<user_id>:<date>`` (user ``a`` does not own ``marketing:a:b:<date>``)."""
    prefix = f"{MARKETING_PREFIX}{user_id}:"
    return key.startswith(prefix) and _DATE.fullmatch(key[len(prefix):]) is not None


def is_recipients_counter(key: str, recipient: str) -> bool:
    """Whether ``key`` is exactly a one-time-code counter of ``recipient`` (a lookup hash)."""
    prefix = f"{ONE_TIME_CODE_PREFIX}{recipient}:"
    return key.startswith(prefix) and _DIGITS.fullmatch(key[len(prefix):]) is not None


def local_day(zone: ZoneInfo, now_ms: int) -> date:
    """The user's calendar date at an instant."""
    return datetime.fromtimestamp(now_ms // 1000, tz=zone).date()


#: (zone, second) -> the local day and its counter's expiry (ms): the claims of a
#: batch are ruled at one instant, and most of its users share a few zones
_DAYS: dict[tuple[ZoneInfo, int], tuple[date, int]] = {}
_DAYS_MAX = 4096


def _marketing_day(zone: ZoneInfo, now_ms: int) -> tuple[date, int]:
    key = (zone, now_ms // 1000)
    found = _DAYS.get(key)
    if found is not None:
        return found
    day = local_day(zone, now_ms)
    # two local midnights on: past the end of this local day whatever the clocks do
    after = datetime.combine(day + timedelta(days=2), time(), tzinfo=zone)
    if len(_DAYS) >= _DAYS_MAX:
        _DAYS.clear()
    found = _DAYS[key] = (day, int(after.timestamp()) * 1000)
    return found


def marketing_claim(
    user_id: str, notification_id: str, zone: ZoneInfo, now_ms: int, options: RuleOptions
) -> LimitClaim | None:
    """The daily marketing counter a marketing message consumes (None: no limit)."""
    if options.marketing_per_day == 0:
        return None
    day, expires_ms = _marketing_day(zone, now_ms)
    return LimitClaim(
        key=marketing_key(user_id, day),
        unit=notification_id,
        limit=options.marketing_per_day,
        reason=Reason.MARKETING_LIMIT,
        expires_at_ms=expires_ms,
    )


def one_time_code_claims(
    recipients: Iterable[str], message_key: str, now_ms: int, options: RuleOptions
) -> tuple[LimitClaim, ...]:
    """The abuse counters a one-time code consumes, one per recipient (by its lookup hash)."""
    if options.one_time_codes_per_window == 0:
        return ()
    window = options.one_time_code_window_ms
    start = now_ms - now_ms % window
    return tuple(
        LimitClaim(
            key=one_time_code_key(recipient, start),
            unit=message_key,
            limit=options.one_time_codes_per_window,
            reason=Reason.RECIPIENT_LIMIT,
            expires_at_ms=start + window,
        )
        for recipient in dict.fromkeys(recipients)
    )


def check_limits(claims: Iterable[LimitClaim], counts: Mapping[str, CounterState]) -> Reason | None:
    """The first full counter's reason, or None when every counter admits the message.

    A counter admits a message whose unit it already holds, or one more unit while below its
    limit. A key missing from ``counts`` has no units yet.
    """
    for claim in claims:
        state = counts.get(claim.key, CounterState())
        if not state.has_unit and state.used >= claim.limit:
            return claim.reason
    return None
