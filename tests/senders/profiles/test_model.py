"""The profile document: the issue's short form, the long form, strict validation without quoting
addresses, bounds."""

from __future__ import annotations

import json

import pytest

from operators.records import Channel
from senders.profiles.model import (
    MAX_CONTACTS_PER_CHANNEL,
    MAX_DOCUMENT_BYTES,
    Profile,
    ProfileError,
    parse_profile,
    profile_document,
    profile_from_json,
)

ISSUE_DOCUMENT = {
    "locale": "bn",
    "tz": "Asia/Dhaka",
    "quiet_hours": {"from": "22:00", "to": "08:00"},
    "marketing": {"push": True, "sms": True, "email": False},
    "contacts": {"push": ["tok-1"], "sms": ["+8801711000001"], "email": ["a@example.com"]},
}


def problems(data: object) -> tuple[str, ...]:
    with pytest.raises(ProfileError) as info:
        parse_profile(data)
    return info.value.problems


def test_the_issue_document_in_its_short_form() -> None:
    p = profile_from_json(json.dumps(ISSUE_DOCUMENT))
    assert (p.locale, p.tz, p.quiet_hours and (p.quiet_hours.start, p.quiet_hours.end)) == ("bn", "Asia/Dhaka", ("22:00", "08:00"))
    assert [p.marketing.allows(c) for c in Channel] == [True, True, False]
    assert [c.address for c in p.contacts.active(Channel.SMS)] == ["+8801711000001"]
    assert profile_document(p)["contacts"] == {
        "push": [{"address": "tok-1", "verified": True, "active": True, "platform": None}],
        "sms": [{"address": "+8801711000001", "verified": True, "active": True}],
        "email": [{"address": "a@example.com", "verified": True, "active": True}],
    }


def test_the_canonical_document_reads_back_to_the_same_profile() -> None:
    p = parse_profile(ISSUE_DOCUMENT)
    assert parse_profile(json.loads(json.dumps(profile_document(p)))) == p


def test_the_long_form_with_flags_and_platform() -> None:
    p = parse_profile({"contacts": {
        "push": [{"address": "tok-1", "platform": "ios", "active": False}, {"address": "tok-2", "platform": "android"}],
        "email": [{"address": "a@example.com", "verified": False}],
    }})
    assert [(c.address, c.active) for c in p.contacts.of(Channel.PUSH)] == [("tok-1", False), ("tok-2", True)]
    assert [c.address for c in p.contacts.active(Channel.PUSH)] == ["tok-2"]
    assert [c.verified for c in p.contacts.of(Channel.EMAIL)] == [False]


def test_defaults_of_an_empty_document() -> None:
    p = parse_profile({})
    assert (p.locale, p.tz, p.quiet_hours) == (None, "UTC", None)
    assert all(p.marketing.allows(c) for c in Channel)
    assert all(p.contacts.active(c) == () for c in Channel)


def test_normalized_forms() -> None:
    p = parse_profile({"locale": "EN-us", "contacts": {"email": [" Ann.Lee@Example.COM "], "sms": ["+8801711000001 "]}})
    assert p.locale == "en-US"
    assert [c.address for c in p.contacts.of(Channel.EMAIL)] == ["Ann.Lee@example.com"]
    assert [c.address for c in p.contacts.of(Channel.SMS)] == ["+8801711000001"]


def test_every_problem_is_listed_by_field() -> None:
    assert problems({
        "tz": "Mars/Olympus", "locale": "english", "colour": "red",
        "quiet_hours": {"from": "24:00", "to": "8:00"},
        "marketing": {"fax": True, "sms": "yes"},
        "contacts": {"pager": []},
    }) == (
        "locale: a locale must be a language tag such as bn, en or en-US",
        "tz: a time zone is UTC or an IANA Area/Location name such as Asia/Dhaka",
        "quiet_hours.from: a time must be HH:MM, 00:00 to 23:59",
        "quiet_hours.to: a time must be HH:MM, 00:00 to 23:59",
        "marketing.sms: Input should be a valid boolean",
        "marketing.fax: Extra inputs are not permitted",
        "contacts.pager: Extra inputs are not permitted",
        "colour: Extra inputs are not permitted",
    )


@pytest.mark.parametrize("zone", ["asia/dhaka", "Asia/Dhaka ", "", "../etc/passwd", "+06:00",
                                  # zoneinfo knows these, but they are no place's clock (issue 20)
                                  "localtime", "Factory", "posixrules", "EST5EDT", "CST6CDT", "EST", "GMT",
                                  "Etc/GMT+6", "Etc/UTC", "US/Eastern", "posix/Asia/Dhaka", "right/Asia/Dhaka"])
def test_time_zones_must_be_utc_or_iana_area_location_names(zone: str) -> None:
    assert problems({"tz": zone}) == ("tz: a time zone is UTC or an IANA Area/Location name such as Asia/Dhaka",)


@pytest.mark.parametrize("zone", ["UTC", "Asia/Dhaka", "America/Argentina/Salta", "Europe/London", "Pacific/Chatham"])
def test_area_location_names_and_utc_are_time_zones(zone: str) -> None:
    assert parse_profile({"tz": zone}).tz == zone


def test_a_stored_profile_with_a_zone_from_before_the_rule_still_reads() -> None:
    assert parse_profile({"tz": "EST5EDT"}, stored=True).tz == "EST5EDT"
    with pytest.raises(ProfileError):
        parse_profile({"tz": "Nowhere/Atlantis"}, stored=True)


@pytest.mark.parametrize("number", ["01711000001", "+0171100000", "+880 1711 000001", "+880-1711000001", "+12345", "+1234567890123456", "tel:+8801711000001"])
def test_phone_numbers_must_be_e164(number: str) -> None:
    assert problems({"contacts": {"sms": [number]}}) == (
        "contacts.sms[0].address: a phone number must be in E.164 form: + and 7 to 15 digits, no spaces",
    )


@pytest.mark.parametrize("address", ["a@example.com", "first.last+tag@mail.example.co.uk", "x@xn--bcher-kva.de", "u@bücher.de", "o'neil@example.org"])
def test_plausible_email_addresses(address: str) -> None:
    assert len(parse_profile({"contacts": {"email": [address]}}).contacts.of(Channel.EMAIL)) == 1


@pytest.mark.parametrize(("address", "part"), [
    ("plainaddress", "local part"), ("@example.com", "local part"), ("a b@example.com", "local part"),
    (".a@example.com", "local part"), ("a..b@example.com", "local part"), ("a@localhost", "domain"),
    ("a@-example.com", "domain"), ("a@example..com", "domain"), ("a@example.123", "domain"), ("a@exa_mple.com", "domain"),
])
def test_implausible_email_addresses(address: str, part: str) -> None:
    assert problems({"contacts": {"email": [address]}}) == (f"contacts.email[0].address: not a plausible email address ({part})",)


def test_device_tokens_and_platforms() -> None:
    assert problems({"contacts": {"push": ["tok 1", "x" * 4097, {"address": "t", "platform": "symbian"}]}}) == (
        "contacts.push[0].address: a device token is printable ASCII without spaces",
        "contacts.push[1].address: a device token has 1 to 4096 characters",
        "contacts.push[2].platform: Input should be 'ios', 'android' or 'web'",
    )


def test_flags_must_be_booleans_and_contacts_have_no_other_fields() -> None:
    assert problems({"contacts": {"sms": [{"address": "+8801711000001", "verified": "yes", "platform": "ios"}]}}) == (
        "contacts.sms[0].verified: Input should be a valid boolean",
        "contacts.sms[0].platform: Extra inputs are not permitted",
    )


def test_sizes_are_bounded() -> None:
    numbers = [f"+88017110000{i:02d}" for i in range(MAX_CONTACTS_PER_CHANNEL + 1)]
    assert problems({"contacts": {"sms": numbers}}) == ("contacts.sms: Tuple should have at most 10 items after validation, not 11",)
    assert parse_profile({"contacts": {"sms": numbers[:-1]}}).contacts.of(Channel.SMS)[-1].address == "+8801711000009"
    assert problems({"contacts": {"email": ["a" * 250 + "@example.com"]}}) == (
        "contacts.email[0].address: an email address has at most 254 characters",
    )
    with pytest.raises(ProfileError) as info:
        profile_from_json(json.dumps({"contacts": {"push": ["t" * 40_000, "u" * 40_000]}}))
    assert info.value.problems == (f"the document has 80032 bytes, more than {MAX_DOCUMENT_BYTES}",)


def test_an_address_given_twice_is_rejected() -> None:
    assert problems({"contacts": {"email": ["a@example.com", "a@EXAMPLE.com"]}}) == (
        "contacts: email: the same address is given twice",
    )


def test_not_json_and_not_an_object() -> None:
    with pytest.raises(ProfileError) as info:
        profile_from_json('{"tz": ')
    assert info.value.problems == ("not JSON: Expecting value",)
    assert problems(["tz"]) == ("Input should be a valid dictionary or instance of Profile",)


def test_addresses_never_appear_in_errors_or_reprs() -> None:
    secret_number, secret_mail = "+8801799999999", "hidden.person@example.com"
    with pytest.raises(ProfileError) as info:
        parse_profile({"contacts": {"sms": [secret_number, secret_number], "email": [secret_mail, "bad@" + secret_mail]}})
    text = str(info.value) + repr(info.value)
    assert secret_number not in text and "hidden.person" not in text
    p = parse_profile({"contacts": {"sms": [secret_number], "email": [secret_mail]}})
    assert secret_number not in repr(p) and "hidden.person" not in repr(p)
    assert isinstance(p, Profile)
