"""A profile's contacts as the store keeps them: one row per contact, the address encrypted and
hashed (``senders.profiles.crypto``), the flags in the clear. The preferences are stored as their
JSON document (``profile_document`` without ``contacts``); nothing in them is an address."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from operators.records import Channel
from senders.profiles.crypto import ContactCipher
from senders.profiles.model import (
    CHANNELS,
    Contacts,
    Preferences,
    Profile,
    ProfileError,
    parse_profile,
    problems_of,
    profile_document,
)


@dataclass(frozen=True, slots=True)
class SealedContact:
    """One stored contact.

    :param position: its place in the channel's list (the order the user gave)
    :param address_enc: the address, encrypted
    :param address_hash: the lookup hash of the address (index it for "who has this address")
    """

    channel: Channel
    position: int
    address_enc: str
    address_hash: str
    verified: bool
    active: bool
    platform: str | None = None


@dataclass(frozen=True, slots=True)
class ContactFlags:
    """A profile's contacts as their rows' flags say, no address opened: whether a channel has an
    active address and whether it is verified is all the API's accept path asks of them
    (``api.accept.Reach``), and these flags are stored in the clear. Read so, with no address
    decrypted nor validated, a round of 32 new users took 1.3-1.9 ms against 2.3-3.3 ms for the
    whole read (``python -m bench.writer_round --rounds 200 --batch 32 --profiles``)."""

    rows: tuple[SealedContact, ...] = ()

    def active(self, channel: Channel) -> tuple[SealedContact, ...]:
        return tuple(r for r in self.rows if r.active and r.channel is channel)


def seal_contacts(contacts: Contacts, cipher: ContactCipher) -> list[SealedContact]:
    """The rows of a profile's contacts, addresses encrypted with the newest key."""
    rows = []
    for channel in Channel:
        for position, contact in enumerate(contacts.of(channel)):
            rows.append(
                SealedContact(
                    channel=channel,
                    position=position,
                    address_enc=cipher.encrypt(contact.address),
                    address_hash=cipher.lookup_hash(channel, contact.address),
                    verified=contact.verified,
                    active=contact.active,
                    platform=getattr(contact, "platform", None),
                )
            )
    return rows


def open_contacts(
    rows: Iterable[SealedContact], cipher: ContactCipher, decrypt: Callable[[str], str] | None = None
) -> Contacts:
    """The contacts back from their rows; raises ContactDecryptError or ProfileError.
    ``decrypt``: in place of ``cipher.decrypt`` (one that remembers what it opened)."""
    opened = decrypt or cipher.decrypt
    by_channel: dict[str, list[dict[str, object]]] = {c.value: [] for c in CHANNELS}
    for row in sorted(rows, key=lambda r: (r.channel.value, r.position)):
        entry: dict[str, object] = {
            "address": opened(row.address_enc),
            "verified": row.verified,
            "active": row.active,
        }
        if row.channel is Channel.PUSH:
            entry["platform"] = row.platform
        by_channel[row.channel.value].append(entry)
    try:
        return Contacts.model_validate(by_channel)
    except ValidationError as exc:
        raise ProfileError(problems_of(exc)) from None


def preferences_document(profile: Preferences) -> dict[str, object]:
    """What is stored in the clear: the profile's document without its contacts."""
    document = profile_document(profile)
    document.pop("contacts", None)
    return document


def open_profile(preferences: dict[str, object], rows: Iterable[SealedContact], cipher: ContactCipher) -> Profile:
    """A profile from its stored preferences document and contact rows; raises ProfileError."""
    return parse_profile({**preferences, "contacts": open_contacts(rows, cipher)}, stored=True)
