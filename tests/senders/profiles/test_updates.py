"""Merging the HTTP API's updates into a profile."""

from __future__ import annotations

import pytest

from operators.records import Channel
from senders.profiles.model import MAX_CONTACTS_PER_CHANNEL, Profile, ProfileError, parse_profile, profile_document
from senders.profiles.updates import add_device, apply_contacts, apply_preferences, deactivate_address


@pytest.fixture
def profile() -> Profile:
    return parse_profile({
        "locale": "en", "tz": "Europe/London", "quiet_hours": {"from": "21:00", "to": "07:00"},
        "marketing": {"sms": False},
        "contacts": {"push": [{"address": "tok-1", "platform": "ios"}],
                     "sms": [{"address": "+8801711000001", "verified": False, "active": False}],
                     "email": ["a@example.com"]},
    })


def test_the_api_preferences_example(profile: Profile) -> None:
    updated = apply_preferences(profile, {
        "marketing": {"email": False}, "quiet_hours": {"from": "22:00", "to": "08:00", "tz": "Asia/Dhaka"}, "locale": "bn",
    })
    doc = profile_document(updated)
    assert {k: doc[k] for k in ("locale", "tz", "quiet_hours", "marketing")} == {
        "locale": "bn", "tz": "Asia/Dhaka", "quiet_hours": {"from": "22:00", "to": "08:00"},
        "marketing": {"push": True, "sms": False, "email": False},
    }
    assert updated.contacts == profile.contacts


def test_fields_not_given_stay(profile: Profile) -> None:
    assert apply_preferences(profile, {}) == profile
    updated = apply_preferences(profile, {"marketing": {"sms": True}})
    assert updated == profile.model_copy(update={"marketing": profile.marketing.model_copy(update={"sms": True})})


def test_null_removes_quiet_hours_and_the_locale(profile: Profile) -> None:
    updated = apply_preferences(profile, {"quiet_hours": None, "locale": None, "tz": "UTC"})
    assert (updated.quiet_hours, updated.locale, updated.tz) == (None, None, "UTC")


def test_a_user_has_one_time_zone(profile: Profile) -> None:
    with pytest.raises(ProfileError) as info:
        apply_preferences(profile, {"tz": "Asia/Dhaka", "quiet_hours": {"from": "22:00", "to": "08:00", "tz": "UTC"}})
    assert info.value.problems == ("tz: quiet_hours.tz and tz name different time zones; a user has one",)
    same = apply_preferences(profile, {"tz": "Asia/Dhaka", "quiet_hours": {"from": "22:00", "to": "08:00", "tz": "Asia/Dhaka"}})
    assert same.tz == "Asia/Dhaka"


@pytest.mark.parametrize(("update", "expected"), [
    ({"tz": None}, ("tz: a time zone name is required (UTC for none)",)),
    ({"quiet_hours": {"from": "22:00"}}, ("quiet_hours.to: Field required",)),
    ({"marketing": {"fax": False}}, ("marketing.fax: Extra inputs are not permitted",)),
    ({"marketing": None}, ("marketing: Input should be a valid dictionary or instance of _MarketingUpdate",)),
    ({"contacts": {}}, ("contacts: Extra inputs are not permitted",)),
])
def test_bad_preference_updates(profile: Profile, update: dict[str, object], expected: tuple[str, ...]) -> None:
    with pytest.raises(ProfileError) as info:
        apply_preferences(profile, update)
    assert info.value.problems == expected


def test_contacts_replace_per_channel_and_known_addresses_keep_their_flags(profile: Profile) -> None:
    updated = apply_contacts(profile, {"sms": ["+8801711000001", "+8801711000002"], "email": []})
    assert profile_document(updated)["contacts"] == {
        "push": [{"address": "tok-1", "verified": True, "active": True, "platform": "ios"}],
        "sms": [{"address": "+8801711000001", "verified": False, "active": False},
                {"address": "+8801711000002", "verified": True, "active": True}],
        "email": [],
    }
    long_form = apply_contacts(profile, {"sms": [{"address": "+8801711000001", "verified": True}]})
    assert [(c.verified, c.active) for c in long_form.contacts.of(Channel.SMS)] == [(True, True)]


def test_bad_contact_updates(profile: Profile) -> None:
    with pytest.raises(ProfileError) as info:
        apply_contacts(profile, {"fax": ["1"], "pager": []})
    assert info.value.problems == ("contacts.fax: not a channel", "contacts.pager: not a channel")
    with pytest.raises(ProfileError) as info:
        apply_contacts(profile, {"sms": ["0171"]})
    assert info.value.problems == ("contacts.sms[0].address: a phone number must be in E.164 form: + and 7 to 15 digits, no spaces",)


def test_a_device_is_added_or_reactivated(profile: Profile) -> None:
    off = deactivate_address(profile, Channel.PUSH, "tok-1")
    assert off.contacts.active(Channel.PUSH) == ()
    again = add_device(off, "tok-1", "android")
    assert profile_document(again)["contacts"]["push"] == [{"address": "tok-1", "verified": True, "active": True, "platform": "android"}]
    more = add_device(again, "tok-2", "web")
    assert [(c.address, getattr(c, "platform", None)) for c in more.contacts.active(Channel.PUSH)] == [("tok-1", "android"), ("tok-2", "web")]


def test_devices_are_bounded_and_validated() -> None:
    p = parse_profile({"contacts": {"push": [f"tok-{i}" for i in range(MAX_CONTACTS_PER_CHANNEL)]}})
    with pytest.raises(ProfileError) as info:
        add_device(p, "tok-new", "ios")
    assert info.value.problems == ("contacts.push: at most 10 devices",)
    assert add_device(p, "tok-3", "ios").contacts.of(Channel.PUSH)[3].platform == "ios"  # type: ignore[union-attr]
    with pytest.raises(ProfileError) as info:
        add_device(parse_profile({}), "tok 1", "ios")
    assert info.value.problems == ("contacts.push[0].address: a device token is printable ASCII without spaces",)


def test_deactivating_an_unknown_address_changes_nothing(profile: Profile) -> None:
    assert deactivate_address(profile, Channel.EMAIL, "nobody@example.com") is profile
    off = deactivate_address(profile, Channel.EMAIL, " a@EXAMPLE.com")
    assert [c.active for c in off.contacts.of(Channel.EMAIL)] == [False]
