"""The rules table at send time, case by case: what is sent, skipped, deferred or rejected."""

from __future__ import annotations

from datetime import datetime

import pytest

from operators.records import Category, Channel
from senders.profiles.model import Contacts, Profile, parse_profile
from senders.profiles.updates import apply_preferences
from senders.rules.decision import Decision, RuleMessage, decide, limit_claims
from senders.rules.limits import CounterState, LimitClaim
from senders.rules.options import RuleOptions
from senders.rules.reasons import Outcome, Reason
from senders.templates.catalog import load_catalog
from senders.templates.options import TemplateOptions
from settings import REPO_ROOT

OPTS = RuleOptions()
CATALOG = load_catalog(TemplateOptions(), REPO_ROOT / "templates")


def at(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


NIGHT = at("2026-12-01T23:30:00+06:00")  # inside 22:00-08:00 in Dhaka
MORNING = at("2026-12-02T08:00:00+06:00")
DAY = at("2026-12-02T10:00:00+06:00")


def recipient(channel: Channel, address: str) -> str:
    return f"h({channel.value}:{address[-4:]})"


@pytest.fixture
def user() -> Profile:
    return parse_profile({
        "locale": "bn", "tz": "Asia/Dhaka", "quiet_hours": {"from": "22:00", "to": "08:00"},
        "marketing": {"push": True, "sms": True, "email": False},
        "contacts": {"sms": ["+8801711000001", {"address": "+8801711000002", "active": False}, "+8801711000003"],
                     "email": ["a@example.com"]},
    })


def msg(template: str, channel: Channel, *, n: str = "n1") -> RuleMessage:
    return RuleMessage.of(CATALOG.get(template), channel=channel, user_id="u1", notification_id=n, message_key=f"{n}:{channel.value}")


def run(m: RuleMessage, prefs: Profile | None, contacts: Contacts, now: int, counts: dict[str, CounterState] | None = None) -> Decision:
    return decide(m, prefs, contacts, counts or {}, now, OPTS, recipient)


def addresses(d: Decision) -> list[str]:
    return [c.address for c in d.addresses]


# -- transactional ---------------------------------------------------------------------------------


def test_transactional_goes_to_every_active_address(user: Profile) -> None:
    d = run(msg("order_shipped", Channel.SMS), user, user.contacts, DAY)
    assert (d.outcome, d.reason, addresses(d), d.consume, d.not_before_ms) == (Outcome.SEND, None, ["+8801711000001", "+8801711000003"], (), None)


def test_transactional_without_an_address_is_skipped(user: Profile) -> None:
    assert run(msg("order_shipped", Channel.PUSH), user, user.contacts, DAY) == Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)
    inactive = parse_profile({"contacts": {"push": [{"address": "tok", "active": False}]}})
    assert run(msg("order_shipped", Channel.PUSH), inactive, inactive.contacts, DAY) == Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)


def test_transactional_is_never_opted_out_nor_deferred(user: Profile) -> None:
    email_at_night = run(msg("payment_update", Channel.EMAIL), user, user.contacts, NIGHT)
    assert (email_at_night.outcome, addresses(email_at_night)) == (Outcome.SEND, ["a@example.com"])
    code_at_2am = run(msg("otp", Channel.SMS), user, user.contacts, at("2026-12-02T02:00:00+06:00"))
    assert code_at_2am.outcome is Outcome.SEND


def test_transactional_fails_open_when_the_preferences_cannot_be_read(user: Profile) -> None:
    d = run(msg("order_shipped", Channel.EMAIL), None, user.contacts, NIGHT)
    assert (d.outcome, addresses(d)) == (Outcome.SEND, ["a@example.com"])
    assert run(msg("order_shipped", Channel.PUSH), None, user.contacts, NIGHT) == Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)


def test_a_one_time_code_consumes_one_unit_per_recipient(user: Profile) -> None:
    m = msg("otp", Channel.SMS, n="login-7")
    slot = at("2026-12-02T04:00:00+00:00")  # 10:00 in Dhaka
    expected = tuple(
        LimitClaim(key=f"otp:h(sms:{tail}):{slot}", unit="login-7:sms", limit=5, reason=Reason.RECIPIENT_LIMIT, expires_at_ms=slot + 3_600_000)
        for tail in ("0001", "0003")
    )
    assert limit_claims(m, user, user.contacts, DAY, OPTS, recipient) == expected
    d = run(m, user, user.contacts, DAY)
    assert (d.outcome, d.consume) == (Outcome.SEND, expected)


def test_a_recipient_at_its_limit_rejects_the_code(user: Profile) -> None:
    m = msg("otp", Channel.SMS)
    key = limit_claims(m, user, user.contacts, DAY, OPTS, recipient)[1].key
    full = {key: CounterState(used=5)}
    assert run(m, user, user.contacts, DAY, full) == Decision(Outcome.REJECTED, Reason.RECIPIENT_LIMIT)
    assert run(m, user, user.contacts, DAY, {key: CounterState(used=5, has_unit=True)}).outcome is Outcome.SEND  # its retry
    assert run(m, user, user.contacts, DAY, {key: CounterState(used=4)}).outcome is Outcome.SEND
    assert run(m, None, user.contacts, DAY, full) == Decision(Outcome.REJECTED, Reason.RECIPIENT_LIMIT)


def test_other_transactional_messages_have_no_limit(user: Profile) -> None:
    m = msg("order_shipped", Channel.SMS)
    assert limit_claims(m, user, user.contacts, DAY, OPTS, recipient) == ()


# -- marketing -------------------------------------------------------------------------------------


def test_marketing_in_the_day_is_sent_and_consumes_the_daily_unit(user: Profile) -> None:
    d = run(msg("eid_sale", Channel.SMS, n="eid-1"), user, user.contacts, DAY)
    assert (d.outcome, addresses(d)) == (Outcome.SEND, ["+8801711000001", "+8801711000003"])
    assert d.consume == (LimitClaim(key="marketing:u1:2026-12-02", unit="eid-1", limit=1, reason=Reason.MARKETING_LIMIT,
                                    expires_at_ms=at("2026-12-04T00:00:00+06:00")),)


def test_marketing_to_an_opted_out_channel_is_skipped(user: Profile) -> None:
    assert run(msg("eid_sale", Channel.EMAIL), user, user.contacts, DAY) == Decision(Outcome.SKIPPED, Reason.OPTED_OUT)
    assert run(msg("weekly_digest", Channel.EMAIL), user, user.contacts, NIGHT) == Decision(Outcome.SKIPPED, Reason.OPTED_OUT)


def test_no_address_comes_before_everything(user: Profile) -> None:
    assert run(msg("eid_sale", Channel.PUSH), user, user.contacts, NIGHT) == Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)
    assert run(msg("eid_sale", Channel.PUSH), None, user.contacts, NIGHT) == Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)


def test_marketing_in_quiet_hours_waits_for_their_end_in_the_users_zone(user: Profile) -> None:
    d = run(msg("eid_sale", Channel.SMS), user, user.contacts, NIGHT, {"marketing:u1:2026-12-01": CounterState(used=1)})
    assert d == Decision(Outcome.DEFERRED, Reason.QUIET_HOURS, not_before_ms=MORNING)
    assert d.consume == () and d.addresses == ()


def test_marketing_fails_closed_when_the_preferences_cannot_be_read(user: Profile) -> None:
    d = run(msg("eid_sale", Channel.SMS), None, user.contacts, DAY)
    assert d == Decision(Outcome.DEFERRED, Reason.PREFERENCES_UNAVAILABLE, not_before_ms=DAY + 60_000)
    assert limit_claims(msg("eid_sale", Channel.SMS), None, user.contacts, DAY, OPTS, recipient) == ()


def test_a_second_campaign_the_same_local_day_is_rejected(user: Profile) -> None:
    first = run(msg("eid_sale", Channel.SMS, n="eid-1"), user, user.contacts, DAY)
    key = first.consume[0].key
    assert run(msg("eid_sale", Channel.SMS, n="eid-2"), user, user.contacts, DAY + 3_600_000, {key: CounterState(used=1)}) == Decision(
        Outcome.REJECTED, Reason.MARKETING_LIMIT)
    # the first campaign's other channels and retries are the same unit
    assert run(msg("eid_sale", Channel.SMS, n="eid-1"), user, user.contacts, DAY, {key: CounterState(used=1, has_unit=True)}).outcome is Outcome.SEND
    unlimited = decide(msg("eid_sale", Channel.SMS, n="eid-2"), user, user.contacts, {key: CounterState(used=9)}, DAY,
                       RuleOptions(marketing_per_day=0), recipient)
    assert (unlimited.outcome, unlimited.consume) == (Outcome.SEND, ())


def test_the_template_decides_the_kind() -> None:
    # a request may claim "transactional"; the rules never see it: eid_sale is marketing
    assert msg("eid_sale", Channel.SMS).kind is Category.MARKETING
    assert (msg("otp", Channel.SMS).kind, msg("otp", Channel.SMS).one_time_code) == (Category.TRANSACTIONAL, True)
    assert msg("order_shipped", Channel.SMS) == RuleMessage(Category.TRANSACTIONAL, False, Channel.SMS, "u1", "n1", "n1:sms")


def test_no_quiet_hours_or_an_empty_window(user: Profile) -> None:
    none = apply_preferences(user, {"quiet_hours": None})
    assert run(msg("eid_sale", Channel.SMS), none, none.contacts, NIGHT).outcome is Outcome.SEND
    empty = apply_preferences(user, {"quiet_hours": {"from": "22:00", "to": "22:00"}})
    assert run(msg("eid_sale", Channel.SMS), empty, empty.contacts, NIGHT).outcome is Outcome.SEND


# -- a deferred message decided again when due -----------------------------------------------------


def test_a_deferred_campaign_is_sent_when_due(user: Profile) -> None:
    m = msg("eid_sale", Channel.SMS)
    deferred = run(m, user, user.contacts, NIGHT)
    assert deferred.not_before_ms == MORNING
    due = run(m, user, user.contacts, MORNING)
    assert (due.outcome, due.consume[0].key) == (Outcome.SEND, "marketing:u1:2026-12-02")


def test_a_user_who_opted_out_while_the_campaign_waited_is_skipped(user: Profile) -> None:
    m = msg("eid_sale", Channel.SMS)
    assert run(m, user, user.contacts, NIGHT).outcome is Outcome.DEFERRED
    opted_out = apply_preferences(user, {"marketing": {"sms": False}})
    assert run(m, opted_out, opted_out.contacts, MORNING) == Decision(Outcome.SKIPPED, Reason.OPTED_OUT)


def test_quiet_hours_changed_while_waiting_are_honoured(user: Profile) -> None:
    m = msg("eid_sale", Channel.SMS)
    later = apply_preferences(user, {"quiet_hours": {"from": "22:00", "to": "09:30"}})
    assert run(m, later, later.contacts, MORNING) == Decision(Outcome.DEFERRED, Reason.QUIET_HOURS, not_before_ms=at("2026-12-02T09:30:00+06:00"))
    moved = apply_preferences(user, {"tz": "Europe/London"})  # 08:00 Dhaka is 02:00 in London: still night there
    assert run(m, moved, moved.contacts, MORNING) == Decision(Outcome.DEFERRED, Reason.QUIET_HOURS, not_before_ms=at("2026-12-02T08:00:00+00:00"))


def test_the_decision_does_not_show_addresses(user: Profile) -> None:
    d = run(msg("order_shipped", Channel.SMS), user, user.contacts, DAY)
    assert "+880" not in repr(d)
