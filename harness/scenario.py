"""The demo's story (the design's own): three users, their profiles, and the requests that show
each rule, from the dedup job to the providers.

* u-bruno (en, Lisbon) has a phone with a push token; his SMS gateway is flaky. His order update
  is sent twice (the second is a duplicate): push is delivered at once (through FCM in the demo),
  the SMS is retried after 1 s and 2 s, then delivered. A campaign reaches his email; a second campaign the same day is
  rejected by the daily marketing limit.
* u-amina (bn) has quiet hours 22:00-08:00 in a time zone where it is night now (chosen at run
  time, ``night_zone``): the campaign is deferred to 08:00 there, on push and email.
* u-chen (en) opted out of marketing email and has no push token: the campaign has nothing to
  send, a success. His mailbox does not exist: a payment update is dead-lettered at the first
  attempt. A campaign whose request lacks its ``pct`` parameter is rejected, never sent as
  "Eid sale: % off".

Event times are minutes before the wall clock (``base_ms``), so the job accepts them and the
senders do not find them older than the status store remembers. The requests topic has two
partitions; the second campaign and the payment update wait (``barrier``) until the earlier
requests are on their channel topics, so the senders meet them in that order.
"""

from __future__ import annotations

import time
import zoneinfo
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from operators import codec
from operators.records import Category, Channel, NotificationRequest, Priority

SECOND = 1_000
MINUTE = 60 * SECOND
PUSH, SMS, EMAIL = Channel.PUSH, Channel.SMS, Channel.EMAIL

#: zones tried for the night (quiet hours 22:00-08:00): every hour of the day is night in one
NIGHT_ZONES = (
    "Pacific/Auckland", "Asia/Tokyo", "Asia/Dhaka", "Asia/Dubai", "Europe/Berlin", "Atlantic/Azores",
    "America/Sao_Paulo", "America/New_York", "America/Denver", "America/Los_Angeles", "Pacific/Honolulu",
)


def base_ms(now_ms: int | None = None) -> int:
    """The story's first event time: ten minutes ago, on the minute."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return now - now % MINUTE - 10 * MINUTE


def night_zone(now_ms: int | None = None) -> str:
    """A zone where it is between 23:00 and 06:00 now: well inside 22:00-08:00 for a while."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    for name in NIGHT_ZONES:
        hour = datetime.fromtimestamp(now / 1000, tz=zoneinfo.ZoneInfo(name)).hour
        if hour >= 23 or hour < 6:
            return name
    raise AssertionError("no zone of NIGHT_ZONES is at night")  # they cover the day


def profiles(zone: str) -> dict[str, dict[str, Any]]:
    """The three users' profile documents (as ``dedupctl users put`` takes them)."""
    return {
        "u-amina": {
            "locale": "bn", "tz": zone, "quiet_hours": {"from": "22:00", "to": "08:00"},
            "contacts": {"push": ["tok-amina-1"], "sms": ["+8801711000001"], "email": ["amina@example.com"]},
        },
        "u-bruno": {
            "locale": "en", "tz": "Europe/Lisbon",
            "contacts": {"push": ["tok-bruno-1"], "sms": ["+351912000002"], "email": ["bruno@example.com"]},
        },
        "u-chen": {
            "locale": "en", "tz": "Asia/Shanghai", "marketing": {"email": False},
            "contacts": {"sms": ["+8613800000003"], "email": ["chen@mailbox.invalid"]},
        },
    }


#: the outside world's answers per address: Bruno's SMS gateway fails twice, Chen's mailbox is gone
PROVIDER_SCRIPTS = {
    "sms": {"+351912000002": ["transient", "transient", "ok"]},
    "email": {"chen@mailbox.invalid": ["permanent"]},
}


@dataclass(frozen=True)
class Step:
    """One record to produce: a request, or raw bytes; ``note`` says what it shows."""

    note: str
    partition: int
    request: NotificationRequest | None = None
    raw: bytes | None = None
    #: wait until every earlier output is visible first
    barrier: bool = False

    def key(self) -> bytes | None:
        return self.request.user_id.encode() if self.request else None

    def value(self) -> bytes:
        if self.request is not None:
            return codec.encode_request(self.request)
        assert self.raw is not None
        return self.raw


def _req(nid: str, user: str, template: str, params: dict[str, str], channels: tuple[Channel, ...],
         t: int, **kw: Any) -> NotificationRequest:
    return NotificationRequest(
        notification_id=nid, user_id=user, template_id=template, params=params,
        channels=channels, event_time=t, **kw,
    )


def steps(base: int | None = None) -> list[Step]:
    t = base_ms() if base is None else base
    promo: dict[str, Any] = {"category": Category.MARKETING, "priority": Priority.LOW}
    return [
        Step("order update for u-bruno: push and sms", 0,
             _req("n-1", "u-bruno", "order_shipped", {"order": "1001"}, (PUSH, SMS), t)),
        Step("the same order update again (a producer retry): duplicate", 0,
             _req("n-2", "u-bruno", "order_shipped", {"order": "1001"}, (PUSH, SMS), t + 5 * SECOND)),
        Step("Eid campaign for u-amina, at night where she is", 1,
             _req("n-3", "u-amina", "eid_sale", {"pct": "20"}, (PUSH, EMAIL), t + 10 * SECOND, **promo)),
        Step("Eid campaign for u-chen (opted out of marketing email, no push token)", 0,
             _req("n-4", "u-chen", "eid_sale", {"pct": "20"}, (PUSH, EMAIL), t + 11 * SECOND, **promo)),
        Step("Eid campaign for u-bruno by email", 1,
             _req("n-6", "u-bruno", "eid_sale", {"pct": "20"}, (EMAIL,), t + 13 * SECOND, **promo)),
        Step("Eid campaign for u-chen by SMS, its pct parameter missing", 0,
             _req("n-8", "u-chen", "eid_sale", {}, (SMS,), t + 14 * SECOND, **promo)),
        Step("undecodable bytes: invalid", 1, raw=b"\x00\x01not-avro"),
        Step("a second campaign for u-bruno the same day (the weekly digest)", 1,
             _req("n-7", "u-bruno", "weekly_digest", {"count": "12"}, (EMAIL,), t + 20 * SECOND, **promo),
             barrier=True),
        Step("payment update for u-chen, whose mailbox does not exist", 0,
             _req("n-5", "u-chen", "payment_update", {"amount": "12.50"}, (EMAIL,), t + 21 * SECOND)),
    ]


#: the requests the job accepts, and the repeats it suppresses
ACCEPTED = ("n-1", "n-3", "n-4", "n-5", "n-6", "n-8", "n-7")
DUPLICATES = {"n-2": "n-1"}

#: how many records the story leaves in each output topic (Topics attribute -> count)
EXPECTED_COUNTS = {
    "push": 3,
    "sms": 2,
    "email": 5,
    "push_priority": 0,
    "sms_priority": 0,
    "email_priority": 0,
    "duplicates": 1,
    "late": 0,
    "invalid": 1,
}

#: the same before the barrier: the second campaign and the payment update (both on email) come
#: after it, so the senders meet them after the first campaign and after u-chen's campaign (whose
#: email address the bad mailbox's answer deactivates)
EXPECTED_BEFORE_BARRIER = {**EXPECTED_COUNTS, "email": EXPECTED_COUNTS["email"] - 2}

#: what becomes of each channel message: (notification id, channel) -> (status, reason)
OUTCOMES = {
    ("n-1", "push"): ("sent", None),
    ("n-1", "sms"): ("sent", None),
    ("n-3", "push"): ("deferred", "quiet_hours"),
    ("n-3", "email"): ("deferred", "quiet_hours"),
    ("n-4", "push"): ("skipped", "no_address"),
    ("n-4", "email"): ("skipped", "opted_out"),
    ("n-5", "email"): ("failed", None),
    ("n-6", "email"): ("sent", None),
    ("n-7", "email"): ("rejected", "marketing_limit"),
    ("n-8", "sms"): ("rejected", "missing_parameter: pct"),
}
