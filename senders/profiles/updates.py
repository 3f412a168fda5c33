"""Changes to a profile, as the HTTP API makes them. Each returns a new, validated profile.

* ``PUT /v1/users/{id}/preferences`` -> ``apply_preferences``: the fields given replace the
  profile's, the others stay; ``marketing`` merges per channel (``{"email": false}`` opts out of
  email only); ``quiet_hours`` replaces the window, ``null`` removes it. A user has one time zone:
  ``quiet_hours.tz`` sets it like ``tz`` does (both given and different is an error), and the
  daily marketing limit counts in it too.
* ``PUT /v1/users/{id}/contacts`` -> ``apply_contacts``: each channel given replaces that
  channel's list, the channels not given stay. An address given in the short form that the
  profile already holds keeps its verified/active flags and platform, so re-sending a list does
  not mark an address verified or bring back one a provider rejected.
* ``POST /v1/devices {"user_id", "token", "platform"}`` -> ``add_device``: adds the token, or
  reactivates it with the new platform.
* A provider that rejects an address for good -> ``deactivate_address``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, StrictBool, ValidationError

from operators.records import Channel
from senders.profiles.model import (
    MAX_CONTACTS_PER_CHANNEL,
    Locale,
    Marketing,
    Platform,
    Profile,
    ProfileError,
    QuietHours,
    StrictModel,
    TimeZoneName,
    normalize_address,
    parse_profile,
    problems_of,
)


class _QuietHoursUpdate(QuietHours):
    tz: TimeZoneName | None = None


class _MarketingUpdate(StrictModel):
    push: StrictBool | None = None
    sms: StrictBool | None = None
    email: StrictBool | None = None


class _PreferencesUpdate(StrictModel):
    locale: Locale | None = None
    tz: TimeZoneName | None = None
    quiet_hours: _QuietHoursUpdate | None = None
    marketing: _MarketingUpdate = Field(default_factory=_MarketingUpdate)


#: the body of ``PUT /v1/users/{id}/preferences`` (the API documents it with this model)
PreferencesUpdate = _PreferencesUpdate


def _validated(model: type[StrictModel], update: object) -> Any:
    try:
        return model.model_validate(update)
    except ValidationError as exc:
        raise ProfileError(problems_of(exc)) from None


def apply_preferences(profile: Profile, update: Mapping[str, Any]) -> Profile:
    """The profile with a preferences update merged in; raises ProfileError."""
    upd: _PreferencesUpdate = _validated(_PreferencesUpdate, update)
    changes: dict[str, Any] = {}
    if "tz" in upd.model_fields_set and upd.tz is None:
        raise ProfileError(["tz: a time zone name is required (UTC for none)"])
    if "locale" in upd.model_fields_set:
        changes["locale"] = upd.locale
    zones = {z for z in (upd.tz, upd.quiet_hours.tz if upd.quiet_hours else None) if z is not None}
    if len(zones) > 1:
        raise ProfileError(["tz: quiet_hours.tz and tz name different time zones; a user has one"])
    if zones:
        changes["tz"] = zones.pop()
    if "quiet_hours" in upd.model_fields_set:
        qh = upd.quiet_hours
        changes["quiet_hours"] = None if qh is None else QuietHours.model_validate(qh.model_dump(exclude={"tz"}))
    given = {name: value for name, value in upd.marketing.model_dump().items() if value is not None}
    if given:
        changes["marketing"] = Marketing.model_validate({**profile.marketing.model_dump(), **given})
    return profile.model_copy(update=changes)


def apply_contacts(profile: Profile, update: Mapping[str, Any]) -> Profile:
    """The profile with the channels of a contacts update replaced; raises ProfileError."""
    if not isinstance(update, Mapping):
        raise ProfileError(["contacts: expected an object of channel -> list of contacts"])
    unknown = sorted(set(update) - {c.value for c in Channel})
    if unknown:
        raise ProfileError([f"contacts.{name}: not a channel" for name in unknown])
    document = profile.model_dump(mode="json", by_alias=True)
    for name, entries in update.items():
        channel = Channel(name)
        known = {c.address: c for c in profile.contacts.of(channel)}
        if isinstance(entries, list):
            entries = [
                known[normalize_address(channel, e)].model_dump(mode="json")
                if isinstance(e, str) and normalize_address(channel, e) in known
                else e
                for e in entries
            ]
        document["contacts"][name] = entries
    return parse_profile(document, stored=True)  # the preferences are the stored ones


def add_device(profile: Profile, token: str, platform: Platform) -> Profile:
    """The profile with a push token added, or reactivated with ``platform``; raises ProfileError."""
    document = profile.model_dump(mode="json", by_alias=True)
    push: list[dict[str, Any]] = document["contacts"]["push"]
    key = normalize_address(Channel.PUSH, token)
    for contact in push:
        if contact["address"] == key:
            contact.update(platform=platform, active=True)
            break
    else:
        if len(push) >= MAX_CONTACTS_PER_CHANNEL:
            raise ProfileError([f"contacts.push: at most {MAX_CONTACTS_PER_CHANNEL} devices"])
        push.append({"address": token, "platform": platform})
    return parse_profile(document, stored=True)


def deactivate_address(profile: Profile, channel: Channel, address: str) -> Profile:
    """The profile with one address marked inactive (unchanged when it does not hold it)."""
    key = normalize_address(channel, address)
    contacts = profile.contacts.of(channel)
    if key not in {c.address for c in contacts}:
        return profile
    replaced = tuple(c.model_copy(update={"active": False}) if c.address == key else c for c in contacts)
    return profile.model_copy(update={"contacts": profile.contacts.model_copy(update={channel.value: replaced})})

