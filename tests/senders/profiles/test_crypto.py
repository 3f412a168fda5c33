"""Contacts at rest: encryption with rotation, the lookup hash, the stored rows."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr

from operators.errors import ConfigError
from operators.records import Channel
from senders.profiles.crypto import ContactCipher, ContactDecryptError, ContactKeyOptions, generate_key
from senders.profiles.model import parse_profile
from senders.profiles.sealed import open_contacts, open_profile, preferences_document, seal_contacts

OLD, NEW, LOOKUP, LOOKUP_NEW = (Fernet.generate_key().decode() for _ in range(4))


def test_encrypt_with_the_newest_decrypt_with_any() -> None:
    old = ContactCipher([OLD], [LOOKUP])
    stored = old.encrypt("+8801711000001")
    assert "+8801711000001" not in stored and "8801711000001" not in stored
    both = ContactCipher([NEW, OLD], [LOOKUP])
    assert both.decrypt(stored) == "+8801711000001"
    assert not both.is_current(stored)
    rotated = both.rotate(stored)
    assert both.is_current(rotated) and both.decrypt(rotated) == "+8801711000001"
    assert ContactCipher([NEW], [LOOKUP]).decrypt(rotated) == "+8801711000001"
    with pytest.raises(ContactDecryptError) as info:
        ContactCipher([NEW], [LOOKUP]).decrypt(stored)
    assert str(info.value) == "invalid profile: a stored contact cannot be decrypted with any configured key"


def test_tampered_or_garbage_values_do_not_decrypt() -> None:
    cipher = ContactCipher([NEW], [LOOKUP])
    token = cipher.encrypt("a@example.com")
    with pytest.raises(ContactDecryptError):
        cipher.decrypt(token[:-4] + ("AAAA" if token[-4:] != "AAAA" else "BBBB"))
    for garbage in ("", "not a token", "é"):
        with pytest.raises(ContactDecryptError):
            cipher.rotate(garbage)
        assert not cipher.is_current(garbage)


def test_the_lookup_hash_is_keyed_and_normalized() -> None:
    cipher = ContactCipher([NEW], [LOOKUP])
    h = cipher.lookup_hash(Channel.EMAIL, "Ann@Example.com")
    assert len(h) == 64 and h == cipher.lookup_hash(Channel.EMAIL, " ann@example.COM ")
    assert h != cipher.lookup_hash(Channel.SMS, "Ann@Example.com")
    assert h != ContactCipher([NEW], [LOOKUP_NEW]).lookup_hash(Channel.EMAIL, "ann@example.com")
    assert cipher.lookup_hash(Channel.SMS, "+8801711000001") != cipher.lookup_hash(Channel.SMS, "+8801711000002")
    rotating = ContactCipher([NEW], [LOOKUP_NEW, LOOKUP])
    assert rotating.lookup_hashes(Channel.EMAIL, "ann@example.com") == (
        ContactCipher([NEW], [LOOKUP_NEW]).lookup_hash(Channel.EMAIL, "ann@example.com"), h,
    )


def test_keys_come_from_secrets_and_never_show() -> None:
    opts = ContactKeyOptions(encryption_keys=SecretStr(f"{NEW}, {OLD}"), lookup_keys=SecretStr(LOOKUP))
    cipher = ContactCipher.from_options(opts)
    token = cipher.encrypt("x")
    assert ContactCipher([NEW], [LOOKUP]).decrypt(token) == "x"
    with pytest.raises(ContactDecryptError):
        ContactCipher([OLD], [LOOKUP]).decrypt(token)
    assert cipher.lookup_hash(Channel.SMS, "x") == ContactCipher([NEW], [LOOKUP]).lookup_hash(Channel.SMS, "x")
    for text in (repr(opts), str(opts), repr(cipher)):
        assert NEW not in text and OLD not in text and LOOKUP not in text
    assert repr(cipher) == "ContactCipher(2 encryption key(s), 1 lookup key(s))"


@pytest.mark.parametrize(("opts", "message"), [
    (ContactKeyOptions(), "no encryption keys configured for the contacts at rest"),
    (ContactKeyOptions(encryption_keys=SecretStr(" , ")), "no encryption keys configured for the contacts at rest"),
    (ContactKeyOptions(encryption_keys=SecretStr(NEW)), "no lookup keys configured for the contacts at rest"),
    (ContactKeyOptions(encryption_keys=SecretStr(f"{NEW},short"), lookup_keys=SecretStr(LOOKUP)),
     "encryption key 2 is not 32 url-safe base64-encoded bytes (see generate_key)"),
    (ContactKeyOptions(encryption_keys=SecretStr(NEW), lookup_keys=SecretStr("pässword")),
     "lookup key 1 is not 32 url-safe base64-encoded bytes (see generate_key)"),
])
def test_missing_or_malformed_keys(opts: ContactKeyOptions, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ContactCipher.from_options(opts)
    assert str(info.value) == message
    assert "short" not in message and "pässword" not in str(info.value)


def test_generated_keys_are_usable() -> None:
    a, b = generate_key(), generate_key()
    assert a != b
    assert ContactCipher([a], [b]).decrypt(ContactCipher([a], [b]).encrypt("tok")) == "tok"


def test_contacts_sealed_as_rows_and_opened_again() -> None:
    cipher = ContactCipher([NEW], [LOOKUP])
    profile = parse_profile({
        "locale": "bn", "tz": "Asia/Dhaka",
        "contacts": {"push": [{"address": "tok-1", "platform": "android", "active": False}],
                     "sms": ["+8801711000001", "+8801711000002"], "email": [{"address": "a@example.com", "verified": False}]},
    })
    rows = seal_contacts(profile.contacts, cipher)
    assert [(r.channel, r.position, r.verified, r.active, r.platform) for r in rows] == [
        (Channel.PUSH, 0, True, False, "android"), (Channel.SMS, 0, True, True, None),
        (Channel.SMS, 1, True, True, None), (Channel.EMAIL, 0, False, True, None),
    ]
    assert rows[1].address_hash == cipher.lookup_hash(Channel.SMS, "+8801711000001")
    assert all("+880" not in r.address_enc and "+880" not in repr(r) for r in rows)
    prefs = preferences_document(profile)
    assert prefs == {"locale": "bn", "tz": "Asia/Dhaka", "quiet_hours": None,
                     "marketing": {"push": True, "sms": True, "email": True}}
    assert open_profile(prefs, reversed(rows), cipher) == profile
    assert open_contacts([], cipher) == parse_profile({}).contacts


def test_rotating_stored_rows_then_dropping_the_old_key() -> None:
    contacts = parse_profile({"contacts": {"sms": ["+8801711000001"], "email": ["a@example.com"]}}).contacts
    rows = seal_contacts(contacts, ContactCipher([OLD], [LOOKUP]))
    with pytest.raises(ContactDecryptError):
        open_contacts(rows, ContactCipher([NEW], [LOOKUP]))
    during = ContactCipher([NEW, OLD], [LOOKUP])
    assert [during.is_current(r.address_enc) for r in rows] == [False, False]
    rotated = [dataclasses.replace(r, address_enc=during.rotate(r.address_enc)) for r in rows]
    assert [during.is_current(r.address_enc) for r in rotated] == [True, True]
    assert open_contacts(rotated, ContactCipher([NEW], [LOOKUP])) == contacts
